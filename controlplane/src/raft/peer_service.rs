use openraft_legacy::network_v1::ChunkedSnapshotReceiver;
use proto::raft_service_server::RaftService;
use proto::RaftPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::types::*;

/// Serves the Raft peer RPCs of one node. Never rate-limited: throttling consensus
/// traffic would only cause elections.
pub struct RaftPeerService {
    raft: Raft,
}

impl RaftPeerService {
    pub fn new(raft: Raft) -> Self {
        Self { raft }
    }
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&req.into_inner().data).map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))
}

/// Payloads at least this large are decoded on the blocking pool. Raft's requests arrive
/// through the server that also serves the agents, so they are decoded on its workers: at
/// 10,000 hosts a follower's entries of agents' statuses (up to 64 statuses, hundreds of
/// KB of JSON each) were 8.5% of the controllers' CPU (perf), in bursts that kept a worker
/// from the reports for milliseconds at a time. Heartbeats and single writes stay inline:
/// a hand-off to another thread would cost them more than decoding.
const DECODE_OFF_WORKERS_BYTES: usize = 64 * 1024;

/// [`decode`], off the runtime's workers when the payload is large.
async fn decode_off_workers<T: DeserializeOwned + Send + 'static>(req: Request<RaftPayload>) -> Result<T, Status> {
    if req.get_ref().data.len() < DECODE_OFF_WORKERS_BYTES {
        return decode(req);
    }
    tokio::task::spawn_blocking(move || decode(req)).await.map_err(|e| Status::internal(format!("decoding a raft payload: {e}")))?
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|data| Response::new(RaftPayload { data, ..Default::default() }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftService for RaftPeerService {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode_off_workers(request).await?;
        encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = super::network::snapshot_request(request.into_inner())
            .map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))?;
        encode(&self.raft.install_snapshot(rpc).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(data: Vec<u8>) -> Request<RaftPayload> {
        Request::new(RaftPayload { data, ..Default::default() })
    }

    #[tokio::test]
    async fn large_payloads_decode_off_the_workers_as_small_ones_do_inline() {
        for len in [10, DECODE_OFF_WORKERS_BYTES * 2] {
            let value: Vec<String> = vec!["x".repeat(len)];
            let got: Vec<String> = decode_off_workers(payload(serde_json::to_vec(&value).unwrap())).await.unwrap();
            assert_eq!(got, value, "{len} bytes");
            let mut malformed = serde_json::to_vec(&value).unwrap();
            malformed.truncate(malformed.len() - 2);
            let err = decode_off_workers::<Vec<String>>(payload(malformed)).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{len} bytes: {err}");
        }
    }
}
