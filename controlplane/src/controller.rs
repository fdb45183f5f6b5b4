//! One controller node: the Raft handle plus what the API needs from it (leader lookup,
//! proposing a checked command, linearizable read barriers, status).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proto::admin_client::AdminClient;
use tracing::Instrument;

use crate::agents::AgentReports;
use crate::api::ApiError;
use crate::raft::{consensus, ConsensusError, Node, NodeId, PeerChannels, ProposeError, Proposer, Raft, SmData, SmShared};
use crate::resources::{ErrorCode, FieldError};
use crate::state::{CommandOutcome, CommandResult, Request};
use crate::telemetry::ControllerMetrics;

/// How long a node being added has to answer the Admin `ClusterStatus` call.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// A learner whose matched log index is this close to the leader's last one is caught up.
pub const CATCH_UP_LAG: u64 = 100;
/// How long a new learner has to catch up before it would be promoted to voter.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `compact` waits for the snapshot and then for the purge. A snapshot of 10,000
/// hosts (about 90 MB) takes seconds to build; a purge waits for replication to move past
/// the entries it removes.
pub const COMPACT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone)]
pub struct Controller {
    pub id: NodeId,
    /// Address other controllers and clients reach this node at.
    pub advertise_addr: String,
    pub raft: Raft,
    pub sm: Arc<SmShared>,
    pub committed: Arc<AtomicU64>,
    /// Bytes appended to this node's Raft log since it started.
    pub log_bytes: Arc<AtomicU64>,
    /// Shared with the Raft network: also used to forward client requests to the leader.
    pub channels: PeerChannels,
    /// Latest agent reports; meaningful on the leader only.
    pub reports: AgentReports,
    /// Ends of the agents' desired-state streams this controller served, for the leader's
    /// failure detector.
    pub watch_ends: crate::agents::WatchEnds,
    /// SLO windows the leader counted from reports since its last Tenant status write
    /// (`loops::metering`).
    pub slo_tally: crate::metering::SloTally,
    /// Reports this controller answered as a follower, for the leader.
    pub report_relay: crate::agents::report_relay::ReportRelay,
    /// Writes the agents' observed state to their Nodes (leader only).
    pub status_writer: crate::agents::StatusWriter,
    /// What the provisioner's latest plan needs, for the autoscaler (leader only).
    pub planned_demand: crate::provision::PlannedDemand,
    /// How often agents are told to report, by fleet size.
    pub report_pace: crate::agents::ReportPace,
    /// This node's Prometheus series (`/metrics`).
    pub telemetry: ControllerMetrics,
    /// Proposes this node's writes, several to an entry when they arrive together.
    pub proposer: Proposer,
    /// When this node may stand for election.
    pub elections: crate::raft::ElectionGate,
}

/// Why a request meant for the leader cannot be sent to it from this controller.
#[derive(Debug)]
pub enum NoLeaderChannel {
    /// No leader is known (an election is under way).
    Unknown,
    /// This controller leads.
    ThisNode,
    /// The leader's address gives no channel.
    Channel(String),
}

impl Controller {
    /// A channel to `leader` (as [`Controller::leader`] gave it) when it is another
    /// controller: what forwarding and the relays to the leader send through.
    pub fn leader_channel(&self, leader: Option<(NodeId, String)>) -> Result<(NodeId, tonic::transport::Channel), NoLeaderChannel> {
        let (id, addr) = leader.ok_or(NoLeaderChannel::Unknown)?;
        if id == self.id {
            return Err(NoLeaderChannel::ThisNode);
        }
        self.channels.get(&addr).map(|ch| (id, ch)).map_err(NoLeaderChannel::Channel)
    }

    /// The current leader's id and address, if one is known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        consensus::leader_with_addr(&self.raft)
    }

    pub fn term(&self) -> u64 {
        consensus::term(&self.raft)
    }

    pub fn is_leader(&self) -> bool {
        consensus::leader(&self.raft) == Some(self.id)
    }

    /// This node's view of consensus now, with the applied index readers see: the state machine's own. openraft
    /// 0.10 reports an apply in its metrics only after the entry's writers were answered, so
    /// its figure could trail a write its client already saw.
    pub fn raft_status(&self) -> crate::raft::RaftStatus {
        let applied_index = self.read(|d| d.last_applied.map_or(0, |l| l.index));
        crate::raft::RaftStatus { applied_index, ..consensus::status(&self.raft) }
    }

    /// Reads the applied state.
    pub fn read<T>(&self, f: impl FnOnce(&SmData) -> T) -> T {
        f(&self.sm.data.load())
    }

    /// Proposes `request` through Raft if this node leads; the command is first checked
    /// against the applied state so that refused input never reaches the log. Concurrent
    /// writes share Raft entries (`raft::Proposer`).
    pub async fn write(&self, request: Request) -> Result<CommandOutcome, ApiError> {
        if !self.is_leader() {
            return Err(ApiError::NotLeader { leader: self.leader() });
        }
        if let Some(previous) = self.read(|d| d.cluster.applied_outcome(&request.request_id).cloned()) {
            return previous.map_err(ApiError::Field).map(|mut o| {
                o.deduplicated = true;
                o
            });
        }
        self.read(|d| d.cluster.check(&request))?;
        let started = std::time::Instant::now();
        let mut request = request;
        let span = proposal_span(&mut request);
        let answer = self.proposer.propose(request).instrument(span).await;
        self.outcome(started, answer)
    }

    /// Proposes `requests` in this order without waiting for each to commit before sending
    /// the next (at most `window` uncommitted at once): for a chain of compare-and-set writes
    /// where each expects the version the one before leaves (a plan in parts), which would
    /// otherwise cost one commit round trip per part. Only the first is checked before it
    /// is proposed (the others expect versions that do not exist yet; the state machine
    /// checks every one as it applies). Stops at the first refusal: the rest, chained to it,
    /// are refused too. Returns the outcome of the last.
    pub async fn write_chain(&self, requests: Vec<Request>, window: usize) -> Result<CommandOutcome, ApiError> {
        if !self.is_leader() {
            return Err(ApiError::NotLeader { leader: self.leader() });
        }
        if let Some(first) = requests.first() {
            self.read(|d| d.cluster.check(first))?;
        }
        let mut in_flight = std::collections::VecDeque::with_capacity(window);
        let mut last = None;
        for mut request in requests {
            if in_flight.len() >= window.max(1) {
                let (started, span, answer) = in_flight.pop_front().expect("non-empty");
                last = Some(self.answered(started, span, answer).await?);
            }
            let started = std::time::Instant::now();
            let span = proposal_span(&mut request);
            match self.proposer.submit(request).instrument(span.clone()).await {
                Ok(answer) => in_flight.push_back((started, span, answer)),
                Err(e) => return self.outcome(started, Err(e)),
            }
        }
        for (started, span, answer) in in_flight {
            last = Some(self.answered(started, span, answer).await?);
        }
        last.ok_or_else(|| ApiError::Internal("an empty chain of writes".into()))
    }

    /// The outcome of a proposal once the proposer answers, in the proposal's span.
    async fn answered(
        &self,
        started: std::time::Instant,
        span: tracing::Span,
        answer: impl std::future::Future<Output = Result<CommandResult, ProposeError>>,
    ) -> Result<CommandOutcome, ApiError> {
        self.outcome(started, answer.instrument(span).await)
    }

    /// The outcome of a proposal from what the proposer answered, counted in the proposal
    /// metrics.
    fn outcome(&self, started: std::time::Instant, answer: Result<CommandResult, ProposeError>) -> Result<CommandOutcome, ApiError> {
        let result = match &answer {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "refused",
            Err(_) => "failed",
        };
        self.telemetry.observe_proposal(started.elapsed(), result);
        match answer {
            Ok(result) => result.map_err(ApiError::Field),
            Err(ProposeError::NotLeader(leader)) => Err(ApiError::NotLeader { leader }),
            Err(ProposeError::Unavailable(reason)) => Err(ApiError::Unavailable(reason)),
        }
    }

    /// Waits until this node has applied everything committed before the call, after
    /// confirming leadership with a quorum (read index). Only the leader can do this.
    pub async fn read_barrier(&self) -> Result<(), ApiError> {
        consensus::read_index(&self.raft).await.map_err(|e| api_error(e, "request"))
    }

    /// The voter this leader would hand over to: `to` when it is another voter (0: the other
    /// voter that has matched the most of the log); `None` when there is no such voter.
    pub fn transfer_target(&self, to: NodeId) -> Option<NodeId> {
        let m = self.raft_status();
        let mut others = m.voters.iter().copied().filter(|v| *v != self.id);
        if to != 0 {
            return others.find(|v| *v == to);
        }
        others.max_by_key(|v| m.matched.get(v).copied().flatten())
    }

    /// Hands this leader's leadership to voter `to` (`consensus::transfer_leadership`),
    /// waiting up to ten election timeouts: the target stands at once, or the others elect
    /// after one. The new leader's id.
    pub async fn transfer_leadership(&self, to: NodeId) -> Result<NodeId, ApiError> {
        let within = Duration::from_millis(self.raft.config().election_timeout_max) * 10;
        consensus::transfer_leadership(&self.raft, self.id, to, within).await.map_err(|e| api_error(e, "to_node_id"))
    }

    pub fn status(&self) -> proto::ClusterStatusResponse {
        let m = self.raft_status();
        let leader = m.leader_with_addr();
        let members = m
            .members
            .iter()
            .map(|(id, addr)| proto::Member {
                node_id: *id,
                address: addr.clone(),
                voter: m.voters.contains(id),
                matched_index: m.matched.get(id).copied().flatten().unwrap_or(0),
                peer_address: m.peer_addrs.get(id).cloned().unwrap_or_default(),
            })
            .collect();
        proto::ClusterStatusResponse {
            node_id: self.id,
            leader_id: leader.as_ref().map_or(0, |l| l.0),
            leader_address: leader.map(|l| l.1).unwrap_or_default(),
            term: m.term,
            commit_index: self.committed.load(Ordering::Relaxed),
            applied_index: m.applied_index,
            last_log_index: m.last_log_index,
            state: m.role,
            members,
            snapshot_index: m.snapshot_index,
            purged_index: m.purged_index,
            log_appended_bytes: self.log_bytes.load(Ordering::Relaxed),
        }
    }

    /// Builds a snapshot of everything applied here when called and purges this node's log
    /// up to it (README, "gpuctl", `cluster compact`). The snapshot policy does both by
    /// itself; this is for operators (a log to shrink now) and for benchmarking the path a
    /// new member catches up by when the log behind it is gone.
    pub async fn compact(&self) -> Result<proto::CompactResponse, ApiError> {
        let started = std::time::Instant::now();
        let target = self.raft_status().applied_index;
        let snapshot = consensus::snapshot_covering(&self.raft, target, COMPACT_TIMEOUT).await.map_err(|e| api_error(e, "request"))?;
        let build_seconds = started.elapsed().as_secs_f64();
        let purged_index = consensus::purge_to(&self.raft, snapshot, COMPACT_TIMEOUT).await.map_err(|e| api_error(e, "request"))?;
        tracing::info!(snapshot, build_seconds, "log compacted on request");
        Ok(proto::CompactResponse {
            node_id: self.id,
            snapshot_index: snapshot,
            snapshot_bytes: self.sm.snapshot_bytes.load(Ordering::Relaxed),
            build_seconds,
            purged_index,
        })
    }

    pub async fn initialize(&self, members: BTreeMap<NodeId, Node>) -> Result<(), ApiError> {
        consensus::initialize(&self.raft, members).await.map_err(|e| api_error(e, "members"))
    }

    /// Adds node `id` at `member`'s addresses (README, "gpuctl", `cluster add`): refuses id 0,
    /// an id that is a member at other addresses and an address another member uses; then
    /// checks that the API address answers the Admin `ClusterStatus` call as node `id`. The
    /// node joins as a learner; with `promote` it becomes a voter once caught up (within
    /// `CATCH_UP_LAG` entries of the leader's log, in `CATCH_UP_TIMEOUT`), else it stays a
    /// learner and this fails. Adding a member again at its own addresses only does what is
    /// still missing.
    pub async fn add_member(&self, id: NodeId, member: Node, promote: bool) -> Result<(), ApiError> {
        if id == 0 {
            return Err(field_error(ErrorCode::InvalidArgument, "node_id", "0 is not a node id (node ids start at 1)"));
        }
        if !self.is_leader() {
            return Err(ApiError::NotLeader { leader: self.leader() });
        }
        let status = self.raft_status();
        let voters: &BTreeSet<NodeId> = &status.voters;
        let role = |n: &NodeId| if voters.contains(n) { "voter" } else { "learner" };
        let mut existing = None;
        for (other, other_addr) in &status.members {
            let other_member = Node::with_peer_addr(other_addr.clone(), status.peer_addrs.get(other).cloned());
            if *other == id && other_member != member {
                return Err(field_error(
                    ErrorCode::AlreadyExists,
                    "node_id",
                    format!("node {id} is already a member ({}) at {other_member}; remove it before adding it at {member}", role(other)),
                ));
            }
            if *other != id && *other_addr == member.addr {
                return Err(field_error(
                    ErrorCode::AlreadyExists,
                    "address",
                    format!("{other_addr} is already the address of node {other} ({})", role(other)),
                ));
            }
            if let Some(peer) = member.peer_addr.as_ref().filter(|p| *other != id && other_member.peer_addr.as_ref() == Some(p)) {
                return Err(field_error(
                    ErrorCode::AlreadyExists,
                    "peer_address",
                    format!("{peer} is already the peer address of node {other} ({})", role(other)),
                ));
            }
            if *other == id {
                existing = Some(voters.contains(other));
            }
        }
        let addr = member.addr.clone();
        match existing {
            Some(true) if promote => return Ok(()),
            Some(true) => {
                return Err(field_error(
                    ErrorCode::FailedPrecondition,
                    "node_id",
                    format!("node {id} is already a voter at {addr}; a voter cannot be made a learner again"),
                ))
            }
            // A learner to promote must still answer: its matched index may be old.
            Some(false) => self.probe_member(id, &addr).await?,
            None => {
                self.probe_member(id, &addr).await?;
                consensus::add_learner(&self.raft, id, member).await.map_err(|e| api_error(e, "node_id"))?;
            }
        }
        if promote {
            self.wait_caught_up(id, &addr).await?;
            consensus::promote(&self.raft, id).await.map_err(|e| api_error(e, "node_id"))?;
        }
        Ok(())
    }

    /// Checks that `addr` answers the Admin `ClusterStatus` call, as node `id`.
    async fn probe_member(&self, id: NodeId, addr: &str) -> Result<(), ApiError> {
        let no_answer = |why: &str| {
            field_error(
                ErrorCode::FailedPrecondition,
                "address",
                format!("{addr} did not answer (Admin.ClusterStatus within {}s): {why}; nothing was changed", PROBE_TIMEOUT.as_secs()),
            )
        };
        let channel = self.channels.get(addr).map_err(|e| no_answer(&e))?;
        // A node that is still starting refuses connections: try again until the deadline.
        let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
        let status = loop {
            let mut request = tonic::Request::new(proto::ClusterStatusRequest {});
            request.set_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
            let why = match tokio::time::timeout_at(deadline, AdminClient::new(channel.clone()).cluster_status(request)).await {
                Err(_) => "timed out".to_string(),
                Ok(Ok(r)) => break r.into_inner(),
                Ok(Err(e)) => {
                    let why = format!("{:?}: {}", e.code(), e.message());
                    if !worth_probing_again(e.code()) {
                        return Err(no_answer(&why));
                    }
                    why
                }
            };
            if tokio::time::Instant::now() + Duration::from_millis(200) >= deadline {
                return Err(no_answer(&why));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if status.node_id != id {
            return Err(field_error(
                ErrorCode::InvalidArgument,
                "node_id",
                format!("the node at {addr} says it is node {}, not node {id}; nothing was changed", status.node_id),
            ));
        }
        Ok(())
    }

    /// Waits until learner `id` has matched the leader's log up to `CATCH_UP_LAG` entries.
    async fn wait_caught_up(&self, id: NodeId, addr: &str) -> Result<(), ApiError> {
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        loop {
            let (leading, matched, last) = {
                let m = self.raft_status();
                // None until the learner has acknowledged an entry: one that never answered
                // again after the probe is not caught up, however short the log.
                (m.leader == Some(self.id), m.matched.get(&id).copied().flatten(), m.last_log_index)
            };
            if !leading {
                return Err(ApiError::Unavailable(format!(
                    "this controller lost leadership while node {id} was catching up; it stays a learner, retry to promote it"
                )));
            }
            if matched.is_some_and(|m| m + CATCH_UP_LAG >= last) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(field_error(
                    ErrorCode::FailedPrecondition,
                    "node_id",
                    format!(
                        "node {id} at {addr} did not catch up within {}s (matched log index {}, the leader's last is {last}); \
                         it stays a learner: check the node, then add it again to promote it",
                        CATCH_UP_TIMEOUT.as_secs(),
                        matched.unwrap_or(0)
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        consensus::remove(&self.raft, id).await.map_err(|e| api_error(e, "node_id"))
    }
}

fn field_error(code: ErrorCode, field: &str, reason: impl Into<String>) -> ApiError {
    ApiError::Field(FieldError::new(code, field, reason))
}

/// A consensus refusal as the API says it; `field` is the request field it is about.
fn api_error(e: ConsensusError, field: &str) -> ApiError {
    match e {
        ConsensusError::NotLeader { leader } => ApiError::NotLeader { leader },
        ConsensusError::AlreadyInitialized => field_error(ErrorCode::FailedPrecondition, field, "the cluster is already initialized"),
        ConsensusError::Refused(reason) => field_error(ErrorCode::FailedPrecondition, field, reason),
        ConsensusError::Invalid(reason) => ApiError::Field(FieldError::invalid(field, reason)),
        ConsensusError::Unavailable(reason) => ApiError::Unavailable(reason),
    }
}

/// Whether a probe's error may pass before `PROBE_TIMEOUT`: a node still starting refuses
/// connections (`Unavailable`), and a node restarted at the same address fails the first
/// call on the connection cached to the process before it (`Unknown`, "transport error":
/// the chaos test's replaced controller hit it). Any other code is the node's answer.
fn worth_probing_again(code: tonic::Code) -> bool {
    matches!(code, tonic::Code::Unavailable | tonic::Code::Unknown)
}

/// The span of proposing `request`, whose trace the entry carries (`Request::trace_parent`)
/// so that every controller's `raft.apply`, and the agents applying a plan, continue it.
fn proposal_span(request: &mut Request) -> tracing::Span {
    let span = tracing::info_span!("raft.proposal", request_id = %request.request_id);
    request.trace_parent = span.in_scope(telemetry_otlp::current_traceparent);
    span
}

#[cfg(test)]
mod tests {
    use super::worth_probing_again;
    use tonic::Code;

    #[test]
    fn a_probe_tries_again_only_while_the_node_may_still_be_coming_up() {
        // Starting (connection refused) or restarted behind a cached connection.
        assert!(worth_probing_again(Code::Unavailable) && worth_probing_again(Code::Unknown));
        // An answer: not a controller's Admin service (a peer listener answers Unimplemented),
        // or one that refuses this cluster's certificate.
        for code in [Code::Unimplemented, Code::PermissionDenied, Code::Unauthenticated, Code::InvalidArgument] {
            assert!(!worth_probing_again(code), "{code:?}");
        }
    }
}
