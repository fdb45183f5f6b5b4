use futures::{Stream, StreamExt};
use openraft_legacy::network_v1::ChunkedSnapshotReceiver;
use proto::raft_service_server::RaftService;
use proto::RaftPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status, Streaming};

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

fn decode<T: DeserializeOwned>(payload: RaftPayload) -> Result<T, Status> {
    serde_json::from_slice(&payload.data).map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))
}

/// Payloads at least this large are decoded on the blocking pool. Raft's requests arrive
/// through the server that also serves the agents, so they are decoded on its workers: at
/// 10,000 hosts a follower's entries of agents' statuses (up to 64 statuses, hundreds of
/// KB of JSON each) were 8.5% of the controllers' CPU (perf), in bursts that kept a worker
/// from the reports for milliseconds at a time. Heartbeats and single writes stay inline:
/// a hand-off to another thread would cost them more than decoding.
const DECODE_OFF_WORKERS_BYTES: usize = 64 * 1024;

/// [`decode`], off the runtime's workers when the payload is large.
async fn decode_off_workers<T: DeserializeOwned + Send + 'static>(payload: RaftPayload) -> Result<T, Status> {
    if payload.data.len() < DECODE_OFF_WORKERS_BYTES {
        return decode(payload);
    }
    tokio::task::spawn_blocking(move || decode(payload)).await.map_err(|e| Status::internal(format!("decoding a raft payload: {e}")))?
}

fn encode_payload<T: Serialize>(value: &T) -> Result<RaftPayload, Status> {
    serde_json::to_vec(value).map(|data| RaftPayload { data, ..Default::default() }).map_err(|e| Status::internal(e.to_string()))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    encode_payload(value).map(Response::new)
}

/// Answers of [`RaftService::append_entries_stream`].
type Answers = std::pin::Pin<Box<dyn Stream<Item = Result<RaftPayload, Status>> + Send>>;

/// Each request of `requests` handed to `handle` after the one before it was answered, and
/// its answer; the stream ends after the first error (a malformed request or a broken
/// stream). At most one request is held here at a time: HTTP/2's flow control keeps the
/// rest with the sender.
fn answer_in_order<S, H, F>(requests: S, handle: H) -> Answers
where
    S: Stream<Item = Result<RaftPayload, Status>> + Send + Unpin + 'static,
    H: Fn(RaftPayload) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<RaftPayload, Status>> + Send,
{
    Box::pin(futures::stream::unfold(Some((requests, handle)), |state| async move {
        let (mut requests, handle) = state?;
        let answer = match requests.next().await? {
            Ok(payload) => handle(payload).await,
            Err(status) => Err(status),
        };
        let next = answer.is_ok().then_some((requests, handle));
        Some((answer, next))
    }))
}

#[tonic::async_trait]
impl RaftService for RaftPeerService {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode_off_workers(request.into_inner()).await?;
        encode(&self.raft.append_entries(rpc).await)
    }

    type AppendEntriesStreamStream = Answers;

    async fn append_entries_stream(&self, request: Request<Streaming<RaftPayload>>) -> Result<Response<Answers>, Status> {
        let raft = self.raft.clone();
        Ok(Response::new(answer_in_order(request.into_inner(), move |payload| {
            let raft = raft.clone();
            async move {
                let rpc = decode_off_workers(payload).await?;
                encode_payload(&raft.append_entries(rpc).await)
            }
        })))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request.into_inner())?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = super::network::snapshot_request(request.into_inner())
            .map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))?;
        encode(&self.raft.install_snapshot(rpc).await)
    }

    async fn transfer_leader(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request.into_inner())?;
        encode(&self.raft.handle_transfer_leader(rpc).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(data: Vec<u8>) -> RaftPayload {
        RaftPayload { data, ..Default::default() }
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

    #[tokio::test(start_paused = true)]
    async fn a_stream_is_answered_in_order_and_ends_at_its_first_error() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        for data in ["30", "10", "bad", "20"] {
            tx.unbounded_send(Ok(payload(data.as_bytes().to_vec()))).unwrap();
        }
        let handled = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = handled.clone();
        // Each request takes as many milliseconds as it says: a later, quicker one must
        // still be answered after it.
        let answers: Vec<_> = answer_in_order(rx, move |p: RaftPayload| {
            let seen = seen.clone();
            async move {
                let text = String::from_utf8(p.data).unwrap();
                seen.lock().unwrap().push(text.clone());
                let ms: u64 = text.parse().map_err(|_| Status::invalid_argument(format!("malformed: {text}")))?;
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                Ok(payload(format!("answer {ms}").into_bytes()))
            }
        })
        .collect()
        .await;
        let answers: Vec<_> = answers.into_iter().map(|a| a.map(|p| String::from_utf8(p.data).unwrap()).map_err(|s| s.code())).collect();
        assert_eq!(answers, [Ok("answer 30".into()), Ok("answer 10".into()), Err(tonic::Code::InvalidArgument)]);
        assert_eq!(*handled.lock().unwrap(), ["30", "10", "bad"], "nothing after the error is handled");
    }
}
