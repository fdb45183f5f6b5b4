//! What the controller, its API and its telemetry ask of consensus, in gpuplane's own types:
//! a status, a read index, initialisation, membership changes and compaction. openraft's
//! metrics and error types stay here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, ForwardToLeader, InitializeError, LinearizableReadError, RaftError};
use openraft::vote::RaftLeaderId;

use super::{ChangeMembers, Node, NodeId, Raft, TypeConfig};

/// This node's view of consensus now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RaftStatus {
    pub term: u64,
    pub leader: Option<NodeId>,
    /// Leader, Follower, Candidate or Learner.
    pub role: String,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    /// Every member, voters and learners, with its address.
    pub members: BTreeMap<NodeId, String>,
    /// The members that have a peer address of their own (`Member::peer_addr`), with it.
    pub peer_addrs: BTreeMap<NodeId, String>,
    pub voters: BTreeSet<NodeId>,
    /// On the leader: the log index each member has matched, `None` until it has
    /// acknowledged an entry. Empty on the others.
    pub matched: BTreeMap<NodeId, Option<u64>>,
}

impl RaftStatus {
    /// The leader's id and address, if one is known.
    pub fn leader_with_addr(&self) -> Option<(NodeId, String)> {
        let id = self.leader?;
        Some((id, self.members.get(&id)?.clone()))
    }
}

/// Why consensus could not do what was asked.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConsensusError {
    #[error("not the leader")]
    NotLeader { leader: Option<(NodeId, String)> },
    #[error("the cluster is already initialized")]
    AlreadyInitialized,
    /// A membership change consensus refused (e.g. one already in progress).
    #[error("{0}")]
    Refused(String),
    /// An initial membership consensus cannot start from.
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unavailable(String),
}

fn not_leader(f: ForwardToLeader<TypeConfig>) -> ConsensusError {
    ConsensusError::NotLeader { leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)) }
}

/// openraft's full metrics now (for tests and the simulation's checks).
pub fn metrics(raft: &Raft) -> super::RaftMetrics {
    raft.metrics().borrow_watched().clone()
}

pub fn status(raft: &Raft) -> RaftStatus {
    let m = raft.metrics().borrow_watched().clone();
    let membership = m.membership_config.membership();
    RaftStatus {
        term: m.current_term,
        leader: m.current_leader,
        role: format!("{:?}", m.state),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        snapshot_index: m.snapshot.map_or(0, |l| l.index),
        purged_index: m.purged.map_or(0, |l| l.index),
        members: membership.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
        peer_addrs: membership.nodes().filter_map(|(id, n)| Some((*id, n.peer_addr.clone()?))).collect(),
        voters: membership.voter_ids().collect(),
        matched: m.replication.as_ref().map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect()).unwrap_or_default(),
    }
}

// Who leads in which term is read from openraft's server metrics, as `LeadershipWatch`
// follows them: openraft updates them before the full metrics, so a task woken by a
// leadership change and then reading the full metrics could see the old leader. It did: a
// new leader's watch-end relay, woken as it took over, sent its own agents' stream ends to
// the old leader, which refused them, and 35 of 100 hosts killed at a handover were marked
// only at the report timeout, 25 s later (1 of 4 fleet-bench runs at 10,000 hosts).

pub fn term(raft: &Raft) -> u64 {
    raft.server_metrics().borrow_watched().vote.leader_id().term()
}

pub fn leader(raft: &Raft) -> Option<NodeId> {
    raft.server_metrics().borrow_watched().current_leader
}

/// Whether controller `id` is a member (voter or learner) of the membership this node
/// knows, from the server metrics (no lock held); `None` while it knows none (a node not yet
/// initialised or not yet reached by the leader).
pub fn is_member(raft: &Raft, id: NodeId) -> Option<bool> {
    let metrics = raft.server_metrics();
    let m = metrics.borrow_watched();
    let membership = m.membership_config.membership();
    membership.nodes().next()?;
    Some(membership.get_node(&id).is_some())
}

/// The leader, if known, and its address.
pub fn leader_with_addr(raft: &Raft) -> Option<(NodeId, String)> {
    let metrics = raft.server_metrics();
    let m = metrics.borrow_watched();
    let id = m.current_leader?;
    Some((id, m.membership_config.membership().get_node(&id)?.addr.clone()))
}

/// Waits until this node has applied everything committed before the call, after
/// confirming leadership with a quorum (read index).
pub async fn read_index(raft: &Raft) -> Result<(), ConsensusError> {
    match raft.ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex).await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => Err(not_leader(f)),
        Err(e) => Err(ConsensusError::Unavailable(format!("cannot confirm leadership: {e}"))),
    }
}

pub async fn initialize(raft: &Raft, members: BTreeMap<NodeId, Node>) -> Result<(), ConsensusError> {
    raft.initialize(members).await.map_err(|e| match e {
        RaftError::APIError(InitializeError::NotAllowed(_)) => ConsensusError::AlreadyInitialized,
        other => ConsensusError::Invalid(other.to_string()),
    })
}

fn membership_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ConsensusError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_leader(f),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => ConsensusError::Refused(c.to_string()),
        other => ConsensusError::Unavailable(other.to_string()),
    }
}

/// Adds node `id` at `member`'s addresses as a learner (it receives the log but does not vote).
pub async fn add_learner(raft: &Raft, id: NodeId, member: Node) -> Result<(), ConsensusError> {
    raft.add_learner(id, member, false).await.map(|_| ()).map_err(membership_error)
}

/// Makes learner `id` a voter.
pub async fn promote(raft: &Raft, id: NodeId) -> Result<(), ConsensusError> {
    raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false).await.map(|_| ()).map_err(membership_error)
}

/// Removes member `id`, voter or learner.
pub async fn remove(raft: &Raft, id: NodeId) -> Result<(), ConsensusError> {
    let voter = raft.metrics().borrow_watched().membership_config.membership().voter_ids().any(|v| v == id);
    let change = if voter { ChangeMembers::RemoveVoters([id].into()) } else { ChangeMembers::RemoveNodes([id].into()) };
    raft.change_membership(change, false).await.map(|_| ()).map_err(membership_error)
}

/// Builds snapshots until one covers log index `target`, within `timeout`; its index.
pub async fn snapshot_covering(raft: &Raft, target: u64, timeout: Duration) -> Result<u64, ConsensusError> {
    let started = std::time::Instant::now();
    let unavailable = |e: &dyn std::fmt::Display| ConsensusError::Unavailable(format!("compacting the log: {e}"));
    let snapshot_index = |m: &super::RaftMetrics| m.snapshot.map_or(0, |l| l.index);
    // A build the policy started earlier may end below `target`; openraft ignores a trigger
    // while one runs, so trigger again until a snapshot covers `target`.
    let mut snapshot = snapshot_index(&raft.metrics().borrow_watched());
    while snapshot < target {
        raft.trigger().snapshot().await.map_err(|e| unavailable(&e))?;
        let left = timeout.saturating_sub(started.elapsed());
        let before = snapshot;
        let m = raft.wait(Some(left)).metrics(|m| snapshot_index(m) > before, "a new snapshot").await.map_err(|e| unavailable(&e))?;
        snapshot = snapshot_index(&m);
    }
    Ok(snapshot)
}

/// Purges this node's log up to `index` (covered by a snapshot), within `timeout`; the
/// purged index.
pub async fn purge_to(raft: &Raft, index: u64, timeout: Duration) -> Result<u64, ConsensusError> {
    let unavailable = |e: &dyn std::fmt::Display| ConsensusError::Unavailable(format!("compacting the log: {e}"));
    raft.trigger().purge_log(index).await.map_err(|e| unavailable(&e))?;
    let m = raft
        .wait(Some(timeout))
        .metrics(|m| m.purged.is_some_and(|p| p.index >= index), "the log purged up to the snapshot")
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(m.purged.map_or(0, |l| l.index))
}

/// Follows who leads in which term.
///
/// Watches openraft's server metrics (vote, role, leader, membership), not the full
/// `RaftMetrics`: those change at every append, flush, commit and apply, so each watcher
/// was woken several times per write for nothing (with three such watchers, about a dozen
/// thread wake-ups per write on an idle leader).
pub struct LeadershipWatch(openraft::type_config::alias::WatchReceiverOf<TypeConfig, openraft::metrics::RaftServerMetrics<TypeConfig>>);

impl LeadershipWatch {
    pub fn new(raft: &Raft) -> Self {
        LeadershipWatch(raft.server_metrics())
    }

    /// The term and its leader, if known, now.
    pub fn current(&mut self) -> (u64, Option<NodeId>) {
        let m = self.0.borrow_and_update();
        (m.vote.leader_id().term(), m.current_leader)
    }

    /// Waits for consensus to change in any way (then read [`Self::current`]); `false` once
    /// Raft has stopped.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

/// Node `id` as the membership records it, once it does; `None` if Raft stops first.
pub async fn member_once_known(raft: &Raft, id: NodeId) -> Option<Node> {
    let mut server = raft.server_metrics();
    loop {
        if let Some(node) = server.borrow_and_update().membership_config.membership().get_node(&id) {
            return Some(node.clone());
        }
        server.changed().await.ok()?;
    }
}

/// Resolves with a message when Raft stops, on a fatal error (e.g. a storage fault) or not.
///
/// Waits for openraft's server-metrics channel to close, which it does when the Raft core
/// ends (its sender is the core's), not for every change of the full metrics (several per
/// write); the core stores its fatal error in the full metrics before it ends.
pub async fn stopped(raft: &Raft) -> String {
    let mut server = raft.server_metrics();
    while server.changed().await.is_ok() {}
    match &raft.metrics().borrow_watched().running_state {
        Err(fatal) => format!("raft stopped: {fatal}"),
        Ok(()) => "raft stopped".into(),
    }
}

/// Hands leadership from this leader to `to` with openraft's transfer (the Raft thesis,
/// Sec. 3.10): the leader stops taking writes (they are sent on to `to`) and its heartbeats,
/// tells every voter, and `to`, once its log holds the leader's last entry, stands at once
/// in an election the others vote in without waiting out the leader's lease. Returns the
/// new leader (another than `to` if `to` could not stand and the others elected one after
/// their election timeout), or `Unavailable` when none is known within `within`.
pub async fn transfer_leadership(raft: &Raft, own_id: NodeId, to: NodeId, within: Duration) -> Result<NodeId, ConsensusError> {
    let mut server = raft.server_metrics();
    raft.trigger().transfer_leader(to).await.map_err(|e| ConsensusError::Unavailable(e.to_string()))?;
    let handed_over = server.wait_until(|m| m.current_leader.is_some_and(|l| l != own_id));
    match tokio::time::timeout(within, handed_over).await {
        Ok(Ok(m)) => Ok(m.current_leader.unwrap_or(to)),
        Ok(Err(_)) => Err(ConsensusError::Unavailable(stopped(raft).await)),
        Err(_) => Err(ConsensusError::Unavailable(format!("node {to} did not take over leadership within {within:?}"))),
    }
}
