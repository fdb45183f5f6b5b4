//! Everything that touches openraft lives in this module, so an openraft upgrade changes
//! only these files: the type config, the storage adapters over `KvBackend`, the tonic
//! network and the Raft peer service.

mod append_stream;
pub mod consensus;
mod election_gate;
mod log_flusher;
mod log_store;
mod member;
mod network;
mod node_wakers;
mod own_runtime;
mod peer_service;
mod proposer;
mod snapshot_policy;
mod state_machine;
mod types;

pub use consensus::{ConsensusError, RaftStatus};
pub use election_gate::{ElectionGate, Hold, VoteReplies};
pub use log_store::LogStore;
pub use member::{check_host_port, Member, MAX_ADDRESS_LEN};
pub use network::{ChannelConnector, Network, PeerChannels, MAX_PEER_MESSAGE};
pub use own_runtime::RaftRuntime;
pub use peer_service::RaftPeerService;
pub use proposer::{ProposeError, Proposer};
pub use state_machine::{SmData, SmShared, StateMachineStore, WatchSignal};
pub use types::*;

use std::sync::Arc;

use crate::storage::{KvBackend, Watermark};

/// Raft timing and compaction settings.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after at least this many applied entries (and as many log bytes as
    /// the last snapshot held: `snapshot_policy`).
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot, for slow followers (a follower further behind
    /// is sent the whole snapshot: tens of MB at fleet scale, so keep a roll-out's worth).
    pub keep_logs_after_snapshot: u64,
    /// Encode and save snapshots, and remove purged log entries, on threads of their own
    /// (true everywhere but the deterministic simulation, whose replay needs every step on
    /// its own scheduler). A snapshot of a 10,000-host fleet is tens of MB of JSON: seconds
    /// of CPU that must not run on a worker thread Raft's heartbeats need; removing the log
    /// it replaces took 400 ms inside the Raft core (`LogStore::purge`).
    pub snapshot_off_runtime: bool,
    /// Run the Raft core, its replication and its peer connections on a runtime of their
    /// own (one thread, `own_runtime.rs` says why), not on the workers that serve clients
    /// and agents (true everywhere but the deterministic simulation). At 10,000 hosts the
    /// agents' requests keep those workers busy for seconds at a time; queued behind them,
    /// heartbeats went out late and followers started elections.
    pub own_runtime: bool,
    /// Hold a starting node's elections for a while (`hold_elections_after_restart`; true
    /// everywhere but the deterministic simulation, where with the hold seed 7 replayed
    /// differently in 1 of 3 runs of its test binary and without it in none of 4; the cause
    /// is not found yet).
    pub hold_elections_on_start: bool,
    /// A candidate whose round has not ended stands again after a time drawn anew, off
    /// openraft's ticks (`election_gate`: written for openraft 0.9, which drew the timeout
    /// once per process, so two candidates whose ticks coincided split the vote round after
    /// round; 0.10 draws it for every election, and the breaker stays until failover is
    /// measured without it). Off in
    /// the deterministic simulation, which pins distinct timeouts from its seed instead and
    /// whose replay would not hold a random draw.
    pub break_split_votes: bool,
    /// Where openraft's random draws (election timeouts, each tick loop's first wait) come
    /// from: a sequence from this seed, or from the OS's randomness when `None`. Set in the
    /// deterministic simulation only, whose replay needs every draw from its seed.
    pub random_seed: Option<u64>,
}

/// The defaults give a leader failover of about 0.4 s. openraft lets a follower that has
/// heard from its leader elect only after the leader's lease (`election_timeout_max`) plus
/// its own randomised timeout, checked on ticks of about a fifth of a heartbeat (0.10; 1.5
/// heartbeats in 0.9): 320-400 ms of silence, three to four missed heartbeats
/// (`raft-bench --kills 50`: median 380-385 ms). The heartbeat stays at 100 ms because openraft
/// gives each AppendEntries one heartbeat interval to complete (`log_store::MAX_APPEND_BYTES`);
/// at 10,000 hosts (fleet-bench) these settings saw no leader change.
impl Default for RaftSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 120,
            election_timeout_max_ms: 200,
            snapshot_every: 10_000,
            keep_logs_after_snapshot: 10_000,
            snapshot_off_runtime: true,
            own_runtime: true,
            hold_elections_on_start: true,
            break_split_votes: true,
            random_seed: None,
        }
    }
}

impl RaftSettings {
    fn openraft_config(&self) -> Result<openraft::Config, String> {
        let config = openraft::Config {
            cluster_name: "gpuplane".into(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            install_snapshot_timeout: 10_000,
            // `snapshot_policy::run` triggers snapshots (by entries and by bytes).
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: self.keep_logs_after_snapshot,
            // Snapshot chunks travel as JSON inside one gRPC message; keep them well below
            // the message size limit.
            snapshot_max_chunk_size: 1024 * 1024,
            // A leader that restarts waits for an election, as in the Raft paper and etcd:
            // restored at once, it served linearizable reads from its stored commit index,
            // which is not durable (`LogStore::save_committed`; a full restart in
            // `tests/cluster.rs` listed no Services at all).
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        config.validate().map_err(|e| e.to_string())
    }
}

/// A started Raft node and its state machine handle.
pub struct RaftHandle {
    pub raft: Raft,
    pub state: Arc<state_machine::SmShared>,
    pub committed: Arc<std::sync::atomic::AtomicU64>,
    pub appended_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Where this node's writes are proposed (group commit).
    pub proposer: Proposer,
    /// When this node may stand for election.
    pub elections: ElectionGate,
}

/// The state is rebuilt from the snapshot and the log after it, so a log purged past the
/// snapshot cannot rebuild it. Until data-dir format 5 sled kept the snapshot in a file it
/// never synced (README, "sled's own files") and read it back as absent after a power
/// loss; the snapshot is in synced files now (`storage::file_tree`), and this check stays
/// as a defence: starting then would serve a state without everything the purged entries
/// wrote.
fn check_rebuildable(purged_index: u64, snapshot_index: u64) -> anyhow::Result<()> {
    if purged_index > snapshot_index {
        anyhow::bail!(
            "the Raft log was purged up to index {purged_index} but the stored snapshot {}: the \
             snapshot is lost or damaged (a power loss soon after it was taken?), so this \
             controller's state cannot be rebuilt; refusing to start (files left untouched). \
             Replace this controller: remove it from the cluster, wipe its data dir and add it back",
            if snapshot_index == 0 { "is missing".to_string() } else { format!("ends at index {snapshot_index}") }
        );
    }
    Ok(())
}

/// The log and the state machine of `backend`, checked to rebuild the state together.
fn open_stores<B: KvBackend>(
    backend: Arc<B>,
    watermark: Watermark,
    snapshot_off_runtime: bool,
) -> anyhow::Result<(LogStore<B>, StateMachineStore)> {
    let log_store = LogStore::open(backend.clone(), watermark)?;
    let sm = StateMachineStore::open(backend, snapshot_off_runtime)?;
    let snapshot_index = sm.shared().data.load().last_applied.map_or(0, |l| l.index);
    check_rebuildable(log_store.purged_index()?, snapshot_index)?;
    Ok((log_store, sm))
}

/// Keeps a node that just started from electing for the leader's lease and one retry of a
/// leader's sends ([`network::PEER_RETRY`]), so that it hears from the leader first if
/// there is one. A restarted node does not restore itself as leader
/// (`enable_leader_restore` is off), and openraft lets such a node elect after its
/// randomised timeout alone (120-200 ms), without the lease; the leader, which had found it
/// unreachable, sent to it again only up to 500 ms later. Without this hold a leader
/// restarted by `raft-bench` stood for election before it heard from the new leader, and
/// the next failover's median went from 454 to 844 ms (25 kills; about openraft's
/// `smaller_log_timeout`, 400 ms, which it adds to a node's election timeout once that node
/// has seen a longer log than its own). The hold ends as soon as a leader is heard from:
/// from then on openraft's leader lease keeps the node from standing while that leader
/// lives, and a node that restarted just before the leader died may stand at once (with a
/// fixed 0.7 s hold such a node, holding the longest log, could not, and one failover of
/// 50 took 1.5 s). Elections start after the hold even if no leader is heard from (a whole
/// cluster restarted: about 0.7 s more).
fn hold_elections_after_restart(elections: &ElectionGate, settings: &RaftSettings) {
    elections.hold_until_leader_heard(std::time::Duration::from_millis(settings.election_timeout_max_ms) + network::PEER_RETRY);
}

/// Starts the Raft node `id` over `backend`. Fails (without touching the data) when the
/// stored log is shorter than the watermark says it was.
pub async fn start<B: KvBackend>(
    id: NodeId,
    backend: Arc<B>,
    watermark: Watermark,
    settings: &RaftSettings,
    channels: PeerChannels,
) -> anyhow::Result<RaftHandle> {
    let config = Arc::new(settings.openraft_config().map_err(|e| anyhow::anyhow!("raft settings: {e}"))?);
    let (log_store, sm) = open_stores(backend, watermark, settings.snapshot_off_runtime)?;
    let log_store = log_store.with_background_io(settings.snapshot_off_runtime)?.flushing_in_background_only_while_leading(id);
    let committed = log_store.committed_index();
    let appended_bytes = log_store.appended_bytes();
    let state = sm.shared();
    let vote_replies = Arc::new(VoteReplies::default());
    // Every task openraft spawns inherits the seed's sequence from this scope (its random
    // draws all happen in those tasks).
    let seed = settings.random_seed.unwrap_or_else(rand::random);
    let network = Network::new(channels, vote_replies.clone());
    let raft = SeededRuntime::scope(seed, Raft::new(id, config, network, log_store, sm)).await?;
    let elections = ElectionGate::new(raft.clone(), vote_replies);
    if settings.hold_elections_on_start {
        hold_elections_after_restart(&elections, settings);
    }
    if settings.break_split_votes {
        elections.spawn_split_vote_breaker();
    }
    tokio::spawn(snapshot_policy::run(id, raft.clone(), appended_bytes.clone(), state.snapshot_bytes.clone(), settings.snapshot_every));
    let proposer = Proposer::start(raft.clone());
    Ok(RaftHandle { raft, state, committed, appended_bytes, proposer, elections })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::open_data_dir;
    use openraft::async_runtime::WatchReceiver;
    use openraft::storage::RaftLogStorage;

    #[tokio::test]
    async fn a_log_purged_past_its_snapshot_refuses_the_start_and_names_why() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(open_data_dir(dir.path(), 1).unwrap());
        {
            let (mut log, _) = open_stores(backend.clone(), Watermark::disabled(), false).unwrap();
            let id = |i| log_id(1, i);
            log.append_durably((1..=10).map(|i| Entry { log_id: id(i), payload: openraft::EntryPayload::Blank })).unwrap();
            // Purged up to 5 with no snapshot left to cover it: what a lost snapshot file
            // leaves (see the state machine's test).
            log.purge(id(5)).await.unwrap();
        }
        let err = open_stores(backend, Watermark::disabled(), false).err().expect("must refuse").to_string();
        assert!(err.contains("purged up to index 5 but the stored snapshot is missing"), "{err}");
        assert!(err.contains("Replace this controller"), "{err}");
        assert!(check_rebuildable(5, 5).is_ok() && check_rebuildable(0, 0).is_ok());
        assert!(check_rebuildable(6, 5).unwrap_err().to_string().contains("the stored snapshot ends at index 5"));
    }

    /// A one-member cluster over `backend`, once it leads.
    async fn single_leader(backend: Arc<crate::storage::MemBackend>) -> RaftHandle {
        let settings = RaftSettings { hold_elections_on_start: false, break_split_votes: false, ..RaftSettings::default() };
        let handle = start(1, backend, Watermark::disabled(), &settings, PeerChannels::with_tls(None)).await.unwrap();
        handle.raft.initialize(std::collections::BTreeMap::from([(1, Node::new("127.0.0.1:1"))])).await.unwrap();
        handle.raft.wait(Some(std::time::Duration::from_secs(10))).current_leader(1, "leader").await.unwrap();
        handle
    }

    /// Writes do not wake what follows leadership: it watches openraft's server metrics,
    /// which writes leave alone (the full metrics change several times per write, and with
    /// three such watchers each write woke about a dozen threads for nothing).
    #[tokio::test]
    async fn writes_do_not_wake_the_leadership_watch() {
        let handle = single_leader(Arc::new(crate::storage::MemBackend::new())).await;
        let raft = handle.raft.clone();
        let mut watch = consensus::LeadershipWatch::new(&raft);
        assert_eq!(watch.current(), (consensus::term(&raft), Some(1)));
        // openraft 0.10 may publish the server metrics once more, unchanged, as the election
        // settles (1 run in 25): wait for 200 ms without one before writing.
        while tokio::time::timeout(std::time::Duration::from_millis(200), watch.changed()).await.is_ok() {
            assert_eq!(watch.current(), (consensus::term(&raft), Some(1)));
        }
        let full = raft.metrics();
        let before = full.borrow_watched().clone();
        for i in 0..20 {
            let command =
                crate::state::Command::Delete { kind: crate::resources::Kind::Service, name: format!("s{i}"), expected_version: 0 };
            let request = crate::state::Request { request_id: format!("r{i}"), command, trace_parent: None };
            // Applied (the proposal went through Raft) and refused: no such Service.
            let outcome = handle.proposer.propose(request).await.unwrap();
            assert!(outcome.is_err_and(|e| e.code == crate::resources::ErrorCode::NotFound));
        }
        // The full metrics did change (the check can fail); the leadership watch did not.
        assert_ne!(*full.borrow_watched(), before);
        let woken = tokio::time::timeout(std::time::Duration::from_millis(200), watch.changed()).await;
        assert!(woken.is_err(), "20 writes woke the leadership watch");
        assert_eq!(watch.current(), (consensus::term(&raft), Some(1)));
    }

    /// `consensus::stopped` (what the controller process waits on to exit) resolves when a
    /// storage fault stops the Raft core, naming the fault, and not while the node works
    /// (it now waits for the server metrics' channel to close, not for a fatal state in
    /// every update of the full metrics).
    #[tokio::test]
    async fn a_storage_fault_stops_raft_and_stopped_names_it() {
        let backend = Arc::new(crate::storage::MemBackend::new());
        let handle = single_leader(backend.clone()).await;
        let raft = handle.raft.clone();
        let stopped = tokio::spawn(async move { consensus::stopped(&raft).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!stopped.is_finished(), "resolved while Raft runs");
        backend.fail_writes();
        // A membership entry to append: the write fails and the core stops.
        let _ = handle.raft.add_learner(2, Node::new("127.0.0.1:2"), false).await;
        let message = tokio::time::timeout(std::time::Duration::from_secs(10), stopped).await.expect("Raft stopped").unwrap();
        assert!(message.starts_with("raft stopped: "), "{message}");
        assert!(message.contains("no space left on device"), "{message}");
    }
}
