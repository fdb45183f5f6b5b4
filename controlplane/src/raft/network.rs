use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft_legacy::network_v1::{Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork};
use proto::raft_service_client::RaftServiceClient;
use proto::RaftPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::append_stream::PeerNetwork;
use super::types::*;
use super::VoteReplies;

/// Largest gRPC message between peers (log batches, JSON-encoded, and snapshot chunks).
pub const MAX_PEER_MESSAGE: usize = 64 * 1024 * 1024;

/// gRPC channels to peers, one per address, created lazily and reused (a tonic channel
/// reconnects by itself after a peer restarts). Ordered, so that they close in the same order
/// every run (the deterministic simulation replays a seed message for message).
#[derive(Clone, Default)]
pub struct PeerChannels {
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    /// mTLS to every address (the controller's or the client's certificate); plaintext when none.
    tls: Option<ClientTlsConfig>,
    /// Opens the channel of an endpoint instead of tonic's TCP connector (the deterministic
    /// simulation connects through its simulated network).
    connector: Option<ChannelConnector>,
    /// Where the channels' connection tasks run (`RaftSettings::own_runtime`); else on the
    /// runtime that first asks for the channel.
    spawn_on: Option<super::own_runtime::SpawnOn>,
}

/// Builds a lazily connecting channel for an endpoint (see [`PeerChannels::with_connector`]).
pub type ChannelConnector = Arc<dyn Fn(Endpoint) -> Channel + Send + Sync>;

impl PeerChannels {
    pub fn with_tls(tls: Option<ClientTlsConfig>) -> Self {
        Self { channels: Arc::default(), tls, connector: None, spawn_on: None }
    }

    /// Channels opened by `connector` rather than over the host's TCP stack.
    pub fn with_connector(connector: ChannelConnector) -> Self {
        Self { channels: Arc::default(), tls: None, connector: Some(connector), spawn_on: None }
    }

    /// These channels with their connection tasks on `runtime`. Set before the first
    /// channel is made (channels already made stay where they are).
    pub fn spawning_on(self, runtime: tokio::runtime::Handle) -> Self {
        Self { spawn_on: Some(super::own_runtime::SpawnOn(runtime)), ..self }
    }

    pub fn get(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap();
        if let Some(ch) = channels.get(addr) {
            return Ok(ch.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| format!("bad peer address {addr:?}: {e}"))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| format!("TLS settings for {addr:?}: {e}"))?;
        }
        if let Some(spawn_on) = &self.spawn_on {
            endpoint = endpoint.executor(spawn_on.clone());
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            // Also while idle: a black-holed connection (a partition that drops packets
            // silently) is found and replaced before the next call needs it; the simulation
            // showed a stuck peer link outliving its partition by more than 30 s otherwise.
            .keep_alive_while_idle(true)
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = match &self.connector {
            Some(connect) => connect(endpoint),
            None => endpoint.connect_lazy(),
        };
        channels.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}

pub struct Network {
    channels: PeerChannels,
    vote_replies: Arc<VoteReplies>,
}

impl Network {
    /// Peers reached over `channels`; what vote requests hear back is noted in `vote_replies`
    /// (for `election_gate`).
    pub fn new(channels: PeerChannels, vote_replies: Arc<VoteReplies>) -> Self {
        Self { channels, vote_replies }
    }
}

/// Peers speak openraft 0.9's protocol (`RaftNetwork` v1, adapted): its chunked snapshot
/// transfer keeps each message far below the gRPC limit, and controllers of either version
/// understand each other's requests. `PeerNetwork` streams AppendEntries to the peer
/// (`append_stream`).
impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        PeerNetwork::new(Adapter::new(PeerClient {
            target,
            addr: node.raft_addr().to_string(),
            channels: self.channels.clone(),
            vote_replies: self.vote_replies.clone(),
        }))
    }
}

pub struct PeerClient {
    target: NodeId,
    addr: String,
    channels: PeerChannels,
    vote_replies: Arc<VoteReplies>,
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
    TransferLeader,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

/// A failed call to `peer` as openraft's error: unreachable (openraft waits before it tries
/// again) or a network error (it tries again at once).
pub(super) fn status_error<E: std::error::Error>(peer: &str, status: &tonic::Status) -> RPCError<TypeConfig, E> {
    let err = Message(format!("{peer}: {}", status.message()));
    match status.code() {
        tonic::Code::Unavailable => RPCError::Unreachable(Unreachable::new(&err)),
        _ => RPCError::Network(NetworkError::new(&err)),
    }
}

impl PeerClient {
    /// The peer, as errors name it.
    pub(super) fn name(&self) -> String {
        format!("peer {} at {}", self.target, self.addr)
    }

    /// A gRPC client of the peer's Raft service (an address that makes no channel is the
    /// peer being unavailable).
    fn client(&self) -> Result<RaftServiceClient<Channel>, tonic::Status> {
        let channel = self.channels.get(&self.addr).map_err(tonic::Status::unavailable)?;
        Ok(RaftServiceClient::new(channel).max_decoding_message_size(MAX_PEER_MESSAGE).max_encoding_message_size(MAX_PEER_MESSAGE))
    }

    /// Opens the AppendEntries stream (`RaftService::append_entries_stream`) carrying
    /// `requests`; its answers, once the peer has taken the stream.
    pub(super) async fn open_append_stream(
        &self,
        requests: impl futures::Stream<Item = RaftPayload> + Send + 'static,
    ) -> Result<tonic::Streaming<RaftPayload>, tonic::Status> {
        self.client()?.append_entries_stream(requests).await.map(tonic::Response::into_inner)
    }

    /// One unary call within `ttl`: the answer's JSON.
    async fn send<E: std::error::Error>(
        &mut self,
        rpc: Rpc,
        payload: RaftPayload,
        ttl: Duration,
    ) -> Result<Vec<u8>, RPCError<TypeConfig, E>> {
        let mut client = self.client().map_err(|status| status_error(&self.name(), &status))?;
        let mut request = tonic::Request::new(payload);
        request.set_timeout(ttl);
        let result = match rpc {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::Snapshot => client.install_snapshot(request).await,
            Rpc::TransferLeader => client.transfer_leader(request).await,
        };
        let payload = result.map_err(|status| status_error(&self.name(), &status))?;
        Ok(payload.into_inner().data)
    }

    async fn call<Resp, E>(&mut self, rpc: Rpc, payload: RaftPayload, ttl: Duration) -> Result<Resp, RPCError<TypeConfig, RaftError<E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let data = self.send(rpc, payload, ttl).await?;
        let decoded: Result<Resp, RaftError<E>> = serde_json::from_slice(&data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// A request as a payload: JSON.
fn json_payload<Req: Serialize, E: std::error::Error>(req: &Req) -> Result<RaftPayload, RPCError<TypeConfig, RaftError<E>>> {
    serde_json::to_vec(req).map(|data| RaftPayload { data, ..Default::default() }).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

/// An InstallSnapshot request as a payload: the request without its chunk as JSON, the
/// chunk raw beside it (see `RaftPayload`).
pub(crate) fn snapshot_payload(mut req: InstallSnapshotRequest<TypeConfig>) -> Result<RaftPayload, serde_json::Error> {
    let chunk = std::mem::take(&mut req.data);
    Ok(RaftPayload { data: Vec::new(), snapshot_request: serde_json::to_vec(&req)?, snapshot_chunk: chunk })
}

/// The InstallSnapshot request in `payload`, in either form.
pub(crate) fn snapshot_request(payload: RaftPayload) -> Result<InstallSnapshotRequest<TypeConfig>, serde_json::Error> {
    if payload.snapshot_request.is_empty() {
        return serde_json::from_slice(&payload.data);
    }
    let mut request: InstallSnapshotRequest<TypeConfig> = serde_json::from_slice(&payload.snapshot_request)?;
    request.data = payload.snapshot_chunk;
    Ok(request)
}

/// How long openraft waits before it sends to a peer again after the peer was unreachable
/// (openraft's default, made ours to name it: a restarted controller waits at least this
/// long to hear from the leader, see `raft::start`).
pub const PEER_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl RaftNetwork<TypeConfig> for PeerClient {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(PEER_RETRY))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig, RaftError>> {
        self.call(Rpc::Append, json_payload(&rpc)?, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<TypeConfig>, RPCError<TypeConfig, RaftError<InstallSnapshotError>>> {
        let payload = snapshot_payload(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.call(Rpc::Snapshot, payload, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig, RaftError>> {
        let reply: VoteResponse<TypeConfig> = self.call(Rpc::Vote, json_payload(&rpc)?, option.hard_ttl()).await?;
        self.vote_replies.note(&rpc, &reply);
        Ok(reply)
    }

    /// openraft's leader transfer (`api::admin_service`'s `transfer_leader`). A peer whose
    /// Raft has stopped is unreachable, as in the AppendEntries stream.
    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let network_error = |e: serde_json::Error| RPCError::Network(NetworkError::new(&e));
        let payload = RaftPayload { data: serde_json::to_vec(&rpc).map_err(network_error)?, ..Default::default() };
        let data = self.send(Rpc::TransferLeader, payload, option.hard_ttl()).await?;
        let answer: Result<TransferLeaderResponse<TypeConfig>, openraft::error::Fatal<TypeConfig>> =
            serde_json::from_slice(&data).map_err(network_error)?;
        answer.map_err(|fatal| RPCError::Unreachable(Unreachable::new(&fatal)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk() -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: Vote::new_committed(3, 1),
            meta: openraft_legacy::network_v1::SnapshotMeta {
                last_log_id: Some(log_id(3, 42)),
                last_membership: Default::default(),
                snapshot_id: "s-42".into(),
            },
            offset: 1 << 20,
            data: (0..=255u8).cycle().take(4096).collect(),
            done: false,
        }
    }

    #[test]
    fn a_snapshot_chunk_travels_raw_beside_its_request_and_arrives_whole() {
        let payload = snapshot_payload(chunk()).unwrap();
        assert!(payload.data.is_empty(), "an older controller must refuse it, not read a chunk without bytes");
        assert_eq!(payload.snapshot_chunk.len(), 4096, "raw: one byte per byte");
        assert!(payload.snapshot_request.len() < 1024, "the request's JSON carries no chunk");
        assert_eq!(snapshot_request(payload).unwrap(), chunk());
        // A chunk from an older controller (all of it JSON) is still read.
        let old = RaftPayload { data: serde_json::to_vec(&chunk()).unwrap(), ..Default::default() };
        assert_eq!(snapshot_request(old).unwrap(), chunk());
    }
}
