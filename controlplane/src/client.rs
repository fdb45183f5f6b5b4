//! A client for the controller API that follows leader hints and retries safely: every
//! write carries a request id chosen once, so a retry after a timeout or a leader change
//! applies at most once.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use proto::admin_client::AdminClient;
use proto::control_plane_client::ControlPlaneClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::raft::PeerChannels;
use crate::security::ClientCredentials;

#[derive(Clone, Debug)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff: Duration,
    /// Deadline of one attempt.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { attempts: 40, backoff: Duration::from_millis(100), timeout: Duration::from_secs(5) }
    }
}

/// Largest answer to a Get or List this client reads, and a follower forwarding one to the
/// leader. One resource can exceed gRPC's default 4 MiB: the Plan of a 10,000-host fleet
/// (80,000 GPUs) encodes to about 50 MB. Per node, `watch_desired` reads a node's share of it.
pub const MAX_READ_MESSAGE: usize = 256 * 1024 * 1024;

pub struct Client {
    endpoints: Vec<String>,
    preferred: Mutex<Option<String>>,
    next: Mutex<usize>,
    channels: PeerChannels,
    /// `authorization` value sent with every request (a tenant's or admin's token).
    bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    pub retry: RetryPolicy,
}

/// Errors worth retrying elsewhere: the node is not the leader, unreachable, or timed out.
fn retryable(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled)
        || (status.code() == Code::Unknown && status.message().contains("transport"))
}

impl Client {
    /// A plaintext client without credentials (for `--insecure` controllers).
    pub fn new(endpoints: Vec<String>) -> Self {
        Self::with_credentials(endpoints, ClientCredentials::default()).expect("no token to check")
    }

    /// A client over mTLS (when `credentials.tls` is set) sending `credentials.token`.
    pub fn with_credentials(endpoints: Vec<String>, credentials: ClientCredentials) -> Result<Self, String> {
        assert!(!endpoints.is_empty(), "at least one controller endpoint is required");
        let bearer = match &credentials.token {
            Some(token) => Some(format!("Bearer {token}").parse().map_err(|_| "token: not printable ASCII".to_string())?),
            None => None,
        };
        Ok(Self {
            endpoints,
            preferred: Mutex::new(None),
            next: Mutex::new(0),
            channels: PeerChannels::with_tls(credentials.tls.as_ref().map(|t| t.client_config())),
            bearer,
            retry: RetryPolicy::default(),
        })
    }

    /// A request carrying this client's token and the deadline `timeout` (if any).
    fn request<T>(&self, message: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(t) = timeout {
            r.set_timeout(t);
        }
        if let Some(bearer) = &self.bearer {
            r.metadata_mut().insert(proto::meta::AUTHORIZATION, bearer.clone());
        }
        r
    }

    /// Opens its channels through `channels` (e.g. one built with a custom connector).
    pub fn with_channels(mut self, channels: PeerChannels) -> Self {
        self.channels = channels;
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    fn pick(&self) -> String {
        if let Some(p) = self.preferred.lock().unwrap().clone() {
            return p;
        }
        let mut next = self.next.lock().unwrap();
        let e = self.endpoints[*next % self.endpoints.len()].clone();
        *next += 1;
        e
    }

    /// Runs `f` against a controller, following leader hints and rotating on failures.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut last = Status::unavailable("no attempt made");
        for attempt in 0..self.retry.attempts.max(1) {
            let target = self.pick();
            let channel = self.channels.get(&target).map_err(Status::invalid_argument)?;
            match f(channel, self.retry.timeout).await {
                Ok(v) => {
                    *self.preferred.lock().unwrap() = Some(target);
                    return Ok(v);
                }
                Err(status) if retryable(&status) => {
                    let hint = status.metadata().get(proto::meta::LEADER_ADDR).and_then(|v| v.to_str().ok()).map(str::to_string);
                    let hinted = hint.is_some();
                    *self.preferred.lock().unwrap() = hint.filter(|h| *h != target);
                    last = status;
                    if !hinted || attempt > 0 {
                        tokio::time::sleep(self.retry.backoff).await;
                    }
                }
                Err(status) => return Err(status),
            }
        }
        Err(last)
    }

    pub async fn put(&self, resource: proto::Resource, mode: proto::WriteMode) -> Result<proto::PutResponse, Status> {
        let request_id = uuid::Uuid::new_v4().to_string();
        self.put_with_id(resource, mode, &request_id).await
    }

    pub async fn put_with_id(
        &self,
        resource: proto::Resource,
        mode: proto::WriteMode,
        request_id: &str,
    ) -> Result<proto::PutResponse, Status> {
        let req = proto::PutRequest { resource: Some(resource), mode: mode as i32, request_id: request_id.to_string(), status_only: false };
        self.call(|ch, t| {
            let mut r = self.request(req.clone(), Some(t));
            crate::telemetry::tracing::inject(r.metadata_mut());
            async move { ControlPlaneClient::new(ch).put(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Puts `resources` as one write: all of them or none (see `PutManyRequest`). Within
    /// the batch bounds; [`batches`] splits a longer list.
    pub async fn put_many(&self, resources: Vec<proto::Resource>, mode: proto::WriteMode) -> Result<proto::PutManyResponse, Status> {
        let req = proto::PutManyRequest { resources, mode: mode as i32, request_id: uuid::Uuid::new_v4().to_string() };
        self.call(|ch, t| {
            let mut r = self.request(req.clone(), Some(t));
            crate::telemetry::tracing::inject(r.metadata_mut());
            async move { ControlPlaneClient::new(ch).put_many(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Puts one of [`batches`]: a lone resource with `Put` (a Plan, an oversized spec), the
    /// rest with `PutMany`. Each resource as written, and whether the write was a retry's
    /// recorded outcome; refused: the status, and which resource of the batch it names.
    pub async fn put_batch(&self, batch: &[proto::Resource]) -> Result<(Vec<proto::Written>, bool), BatchRefused> {
        let refused = |status: Status| {
            let which = status
                .message()
                .strip_prefix("puts[")
                .and_then(|m| m.split(']').next())
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|&i| i < batch.len())
                .or((batch.len() == 1).then_some(0));
            BatchRefused { status, which }
        };
        match batch {
            [one] => {
                let out = self.put(one.clone(), proto::WriteMode::Unspecified).await.map_err(refused)?;
                let (version, created) = out.resource.map_or((0, false), |r| (r.resource_version, r.create_revision == r.mod_revision));
                let written = proto::Written { kind: one.kind.clone(), name: one.name.clone(), resource_version: version, created };
                Ok((vec![written], out.deduplicated))
            }
            _ => {
                let out = self.put_many(batch.to_vec(), proto::WriteMode::Unspecified).await.map_err(refused)?;
                Ok((out.written, out.deduplicated))
            }
        }
    }

    pub async fn put_status(
        &self,
        kind: &str,
        name: &str,
        status_json: String,
        expected_version: u64,
    ) -> Result<proto::PutResponse, Status> {
        let resource =
            proto::Resource { kind: kind.into(), name: name.into(), status_json, resource_version: expected_version, ..Default::default() };
        let req = proto::PutRequest { resource: Some(resource), mode: 0, request_id: uuid::Uuid::new_v4().to_string(), status_only: true };
        self.call(|ch, t| {
            let r = self.request(req.clone(), Some(t));
            async move { ControlPlaneClient::new(ch).put(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    pub async fn get(&self, kind: &str, name: &str, stale: bool) -> Result<proto::Resource, Status> {
        let req = proto::GetRequest { kind: kind.into(), name: name.into(), stale };
        self.call(|ch, t| {
            let r = self.request(req.clone(), Some(t));
            async move { ControlPlaneClient::new(ch).max_decoding_message_size(MAX_READ_MESSAGE).get(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Every resource of `kind` (of `tenant`, if not empty), following the pages of the
    /// server's default size. The revision is the first page's: a Watch from it sees every
    /// change made while the pages were read (pages are not a snapshot).
    pub async fn list(&self, kind: &str, tenant: &str, stale: bool) -> Result<proto::ListResponse, Status> {
        self.list_in_pages(kind, tenant, stale, 0).await
    }

    /// As `list`, reading pages of at most `page_size` resources (0 = the server default).
    pub async fn list_in_pages(&self, kind: &str, tenant: &str, stale: bool, page_size: u32) -> Result<proto::ListResponse, Status> {
        let mut all = self.list_page(kind, tenant, stale, page_size, "").await?;
        let mut token = std::mem::take(&mut all.continue_token);
        while !token.is_empty() {
            let page = self.list_page(kind, tenant, stale, page_size, &token).await?;
            if page.continue_token == token {
                return Err(Status::internal(format!("continue_token: the server returned the same token {token:?} again")));
            }
            all.resources.extend(page.resources);
            token = page.continue_token;
        }
        Ok(all)
    }

    /// One page of a listing: at most `limit` resources (0 = the server default) after the
    /// position of `continue_token` (empty = from the start). The response's token, when not
    /// empty, reads the next page.
    pub async fn list_page(
        &self,
        kind: &str,
        tenant: &str,
        stale: bool,
        limit: u32,
        continue_token: &str,
    ) -> Result<proto::ListResponse, Status> {
        let req = proto::ListRequest { kind: kind.into(), tenant: tenant.into(), stale, limit, continue_token: continue_token.into() };
        self.call(|ch, t| {
            let r = self.request(req.clone(), Some(t));
            async move { ControlPlaneClient::new(ch).max_decoding_message_size(MAX_READ_MESSAGE).list(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    pub async fn delete(&self, kind: &str, name: &str, expected_version: u64) -> Result<proto::DeleteResponse, Status> {
        let req =
            proto::DeleteRequest { kind: kind.into(), name: name.into(), expected_version, request_id: uuid::Uuid::new_v4().to_string() };
        self.call(|ch, t| {
            let r = self.request(req.clone(), Some(t));
            async move { ControlPlaneClient::new(ch).delete(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    pub async fn watch(&self, kind: &str, from_revision: u64) -> Result<tonic::Streaming<proto::WatchEvent>, Status> {
        let req = proto::WatchRequest { kind: kind.into(), name: String::new(), from_revision };
        self.call(|ch, _| {
            let r = self.request(req.clone(), None);
            async move { ControlPlaneClient::new(ch).watch(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    pub async fn cluster_status(&self) -> Result<proto::ClusterStatusResponse, Status> {
        self.call(|ch, t| {
            let r = self.request(proto::ClusterStatusRequest {}, Some(t));
            async move { AdminClient::new(ch).cluster_status(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// A node agent's report (agents send theirs over their own connection; this is for
    /// tools and tests that speak as a node).
    pub async fn report(&self, report: proto::ReportRequest) -> Result<proto::ReportResponse, Status> {
        self.call(|ch, t| {
            let r = self.request(report.clone(), Some(t));
            async move { proto::agent_client::AgentClient::new(ch).report(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// A node's desired state, then each change to it (what its agent watches). An agent
    /// names each stream it opens by a new nonzero `session` (see `WatchDesiredRequest`);
    /// tools pass 0.
    pub async fn watch_desired(
        &self,
        node: &str,
        from_version: u64,
        session: u64,
    ) -> Result<tonic::Streaming<proto::DesiredState>, Status> {
        self.call(|ch, _| {
            let r = self.request(proto::WatchDesiredRequest { node: node.to_string(), from_version, session }, None);
            async move { proto::agent_client::AgentClient::new(ch).watch_desired(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// The version of `node`'s desired state: the index of the last change to what it is to
    /// run (0: never had any). An agent has converged when it reports this version applied.
    pub async fn desired_version(&self, node: &str) -> Result<u64, Status> {
        let mut stream = self.watch_desired(node, 0, 0).await?;
        match stream.message().await? {
            Some(desired) => Ok(desired.version),
            None => Err(Status::unavailable("the desired-state watch ended before its first message")),
        }
    }

    /// Status as one specific node sees it (no retries elsewhere).
    pub async fn node_status(&self, addr: &str) -> Result<proto::ClusterStatusResponse, Status> {
        let ch = self.channels.get(addr).map_err(Status::invalid_argument)?;
        let r = self.request(proto::ClusterStatusRequest {}, Some(Duration::from_secs(2)));
        AdminClient::new(ch).cluster_status(r).await.map(|r| r.into_inner())
    }

    /// Adds a member that serves its peers at its API address.
    pub async fn add_member(&self, node_id: u64, address: &str, promote: bool) -> Result<proto::MembershipResponse, Status> {
        self.add_member_with_peer_address(node_id, address, None, promote).await
    }

    /// Adds a member whose peers reach it at `peer_address` (its `peer_listen`), if given.
    pub async fn add_member_with_peer_address(
        &self,
        node_id: u64,
        address: &str,
        peer_address: Option<&str>,
        promote: bool,
    ) -> Result<proto::MembershipResponse, Status> {
        let req =
            proto::AddMemberRequest { node_id, address: address.into(), promote, peer_address: peer_address.unwrap_or_default().into() };
        self.call(|ch, _| {
            let r = self.request(req.clone(), Some(Duration::from_secs(60)));
            async move { AdminClient::new(ch).add_member(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    pub async fn remove_member(&self, node_id: u64) -> Result<proto::MembershipResponse, Status> {
        let req = proto::RemoveMemberRequest { node_id };
        self.call(|ch, t| {
            let r = self.request(req, Some(t));
            async move { AdminClient::new(ch).remove_member(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Compacts the log of the controller at `addr` (once: a retry elsewhere would compact
    /// another controller).
    pub async fn compact(&self, addr: &str) -> Result<proto::CompactResponse, Status> {
        let ch = self.channels.get(addr).map_err(Status::invalid_argument)?;
        let r = self.request(proto::CompactRequest {}, Some(crate::controller::COMPACT_TIMEOUT * 2 + Duration::from_secs(10)));
        AdminClient::new(ch).compact(r).await.map(|r| r.into_inner())
    }

    pub async fn transfer_leader(&self, to_node_id: u64) -> Result<proto::MembershipResponse, Status> {
        let req = proto::TransferLeaderRequest { to_node_id };
        self.call(|ch, _| {
            let r = self.request(req, Some(Duration::from_secs(15)));
            async move { AdminClient::new(ch).transfer_leader(r).await.map(|r| r.into_inner()) }
        })
        .await
    }
}

/// A batch refused: nothing of it was applied. `which`: the resource the refusal names.
#[derive(Debug)]
pub struct BatchRefused {
    pub status: Status,
    pub which: Option<usize>,
}

/// `resources` in order, as batches for [`Client::put_many`]: each within
/// [`MAX_BATCH_PUTS`] resources and [`MAX_BATCH_BYTES`] of specs. A resource that cannot
/// share a batch (a Plan, or a spec larger than a batch holds) is a batch of its own, for a
/// single put.
pub fn batches(resources: Vec<proto::Resource>) -> Vec<Vec<proto::Resource>> {
    use crate::resources::limits::{MAX_BATCH_BYTES, MAX_BATCH_PUTS};
    let alone = |r: &proto::Resource| r.kind == "Plan" || r.spec_json.len() > MAX_BATCH_BYTES;
    let mut out: Vec<Vec<proto::Resource>> = Vec::new();
    let mut bytes = 0;
    for r in resources {
        let fits =
            out.last().is_some_and(|b| !b.iter().any(alone) && b.len() < MAX_BATCH_PUTS && bytes + r.spec_json.len() <= MAX_BATCH_BYTES);
        if !fits || alone(&r) {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += r.spec_json.len();
        out.last_mut().expect("pushed above").push(r);
    }
    out
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::resources::limits::{MAX_BATCH_BYTES, MAX_BATCH_PUTS};

    fn resource(kind: &str, name: usize, bytes: usize) -> proto::Resource {
        proto::Resource { kind: kind.into(), name: format!("r{name}"), spec_json: "x".repeat(bytes), ..Default::default() }
    }

    #[test]
    fn batches_keep_the_order_and_stay_within_both_bounds() {
        let many: Vec<_> = (0..MAX_BATCH_PUTS * 2 + 1).map(|i| resource("Service", i, 10)).collect();
        let sizes: Vec<usize> = batches(many.clone()).iter().map(Vec::len).collect();
        assert_eq!(sizes, [MAX_BATCH_PUTS, MAX_BATCH_PUTS, 1]);
        assert_eq!(batches(many.clone()).concat(), many, "order kept, nothing lost");
        let big: Vec<_> = (0..5).map(|i| resource("Service", i, MAX_BATCH_BYTES / 2)).collect();
        assert_eq!(batches(big).iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[test]
    fn plans_and_oversized_specs_go_alone() {
        let list = vec![
            resource("Service", 0, 10),
            resource("Plan", 1, 10),
            resource("Service", 2, 10),
            resource("Service", 3, MAX_BATCH_BYTES + 1),
            resource("Service", 4, 10),
        ];
        let names: Vec<Vec<String>> = batches(list).iter().map(|b| b.iter().map(|r| r.name.clone()).collect()).collect();
        assert_eq!(names, [vec!["r0"], vec!["r1"], vec!["r2"], vec!["r3"], vec!["r4"]]);
    }
}
