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

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|data| Response::new(RaftPayload { data, ..Default::default() }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftService for RaftPeerService {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
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
