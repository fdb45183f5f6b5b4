//! One controller node: the Raft handle plus what the API needs from it (leader lookup,
//! proposing a checked command, linearizable read barriers, status).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::error::{ClientWriteError as CWE, RaftError as RE};
use tracing::Instrument;

use crate::agents::AgentReports;
use crate::api::ApiError;
use crate::raft::{ChangeMembers, Node, NodeId, PeerChannels, Raft, SmData, SmShared};
use crate::state::{CommandOutcome, Request};
use crate::telemetry::ControllerMetrics;

#[derive(Clone)]
pub struct Controller {
    pub id: NodeId,
    /// Address other controllers and clients reach this node at.
    pub advertise_addr: String,
    pub raft: Raft,
    pub sm: Arc<SmShared>,
    pub committed: Arc<AtomicU64>,
    /// Shared with the Raft network: also used to forward client requests to the leader.
    pub channels: PeerChannels,
    /// Latest agent reports; meaningful on the leader only.
    pub reports: AgentReports,
    /// This node's Prometheus series (`/metrics`).
    pub telemetry: ControllerMetrics,
}

impl Controller {
    /// The current leader's id and address, if one is known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let addr = metrics.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())?;
        Some((leader, addr))
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// Reads the applied state.
    pub fn read<T>(&self, f: impl FnOnce(&SmData) -> T) -> T {
        f(&self.sm.data.read().unwrap())
    }

    /// Proposes `request` through Raft if this node leads; the command is first checked
    /// against the applied state so that refused input never reaches the log.
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
        let span = tracing::info_span!("raft.proposal", request_id = %request.request_id);
        let mut request = request;
        request.trace_parent = span.in_scope(telemetry_otlp::current_traceparent);
        let written = self.raft.client_write(request).instrument(span).await;
        let result = match &written {
            Ok(resp) if matches!(resp.data, Some(Ok(_))) => "ok",
            Ok(_) => "refused",
            Err(_) => "failed",
        };
        self.telemetry.observe_proposal(started.elapsed(), result);
        match written {
            Ok(resp) => match resp.data {
                Some(result) => result.map_err(ApiError::Field),
                None => Err(ApiError::Internal("a command entry produced no result".into())),
            },
            Err(RE::APIError(CWE::ForwardToLeader(f))) => {
                Err(ApiError::NotLeader { leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)) })
            }
            Err(e) => Err(ApiError::Unavailable(format!("proposal failed: {e}"))),
        }
    }

    /// Waits until this node has applied everything committed before the call, after
    /// confirming leadership with a quorum (read index). Only the leader can do this.
    pub async fn read_barrier(&self) -> Result<(), ApiError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RE::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ApiError::NotLeader { leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)) })
            }
            Err(e) => Err(ApiError::Unavailable(format!("cannot confirm leadership: {e}"))),
        }
    }

    pub fn status(&self) -> proto::ClusterStatusResponse {
        let m = self.raft.metrics().borrow().clone();
        let leader = self.leader();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let matched: BTreeMap<NodeId, u64> =
            m.replication.as_ref().map(|r| r.iter().map(|(id, log)| (*id, log.map_or(0, |l| l.index))).collect()).unwrap_or_default();
        let members = membership
            .nodes()
            .map(|(id, node)| proto::Member {
                node_id: *id,
                address: node.addr.clone(),
                voter: voters.contains(id),
                matched_index: matched.get(id).copied().unwrap_or(0),
            })
            .collect();
        proto::ClusterStatusResponse {
            node_id: self.id,
            leader_id: leader.as_ref().map_or(0, |l| l.0),
            leader_address: leader.map(|l| l.1).unwrap_or_default(),
            term: m.current_term,
            commit_index: self.committed.load(Ordering::Relaxed),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            state: format!("{:?}", m.state),
            members,
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
        }
    }

    pub async fn initialize(&self, members: BTreeMap<NodeId, Node>) -> Result<(), ApiError> {
        self.raft.initialize(members).await.map_err(|e| match e {
            RE::APIError(openraft::error::InitializeError::NotAllowed(_)) => ApiError::Field(crate::resources::FieldError::new(
                crate::resources::ErrorCode::FailedPrecondition,
                "members",
                "the cluster is already initialized",
            )),
            other => ApiError::Field(crate::resources::FieldError::invalid("members", other.to_string())),
        })
    }

    /// Adds a node as learner (waiting until it has caught up), then optionally promotes it.
    pub async fn add_member(&self, id: NodeId, addr: String, promote: bool) -> Result<(), ApiError> {
        self.raft.add_learner(id, Node::new(addr), true).await.map_err(membership_error)?;
        if promote {
            self.raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false).await.map_err(membership_error)?;
        }
        Ok(())
    }

    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        let voters: Vec<NodeId> = self.raft.metrics().borrow().membership_config.membership().voter_ids().collect();
        let change = if voters.contains(&id) { ChangeMembers::RemoveVoters([id].into()) } else { ChangeMembers::RemoveNodes([id].into()) };
        self.raft.change_membership(change, false).await.map_err(membership_error)?;
        Ok(())
    }
}

fn membership_error(e: RE<NodeId, crate::raft::ClientWriteError>) -> ApiError {
    match e {
        RE::APIError(CWE::ForwardToLeader(f)) => ApiError::NotLeader { leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)) },
        RE::APIError(CWE::ChangeMembershipError(c)) => {
            ApiError::Field(crate::resources::FieldError::new(crate::resources::ErrorCode::FailedPrecondition, "node_id", c.to_string()))
        }
        other => ApiError::Unavailable(other.to_string()),
    }
}
