use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use std::io;

use futures::StreamExt;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::OptionalSend;
use openraft_legacy::network_v1::SnapshotReceiverFactory;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::node_wakers::NodeWakers;
use super::types::*;
use crate::resources::Spec;
use crate::state::{ChangeEvent, ClusterState, Command};
use crate::storage::{KvBackend, Tree};

const SNAPSHOT_META: &[u8] = b"meta";
const SNAPSHOT_DATA: &[u8] = b"data";
/// Changes kept in memory so a watcher can resume from a recent revision (an older one
/// gets the full state again). Bounded by count, so by the size of the largest events: a
/// Node's status with its GPUs and workloads is ~20 KB in memory, and at 10,000 events the
/// history alone held ~180 MiB of a 1,000-host fleet's leader (fleet-bench); at that rate
/// 2,000 events are a few seconds of a busy fleet's changes, and minutes of a small one's.
pub const WATCH_HISTORY: usize = 2_000;

/// What watchers are told after each apply.
#[derive(Clone, Debug)]
pub enum WatchSignal {
    /// Shared by every subscriber: a plan's event is not deep-copied per watcher.
    Change(Arc<ChangeEvent>),
    /// The whole state was replaced (snapshot installed): watchers must resync.
    Reset { revision: u64 },
}

/// The applied state, shared between the Raft state machine and the API readers. A copy is
/// O(1): every map and the watch history are persistent.
#[derive(Clone, Default)]
pub struct SmData {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub cluster: ClusterState,
    /// Recent changes, oldest first, for watch resumption.
    pub history: imbl::Vector<Arc<ChangeEvent>>,
    /// Watchers can resume from any revision >= this one without a resync.
    pub history_floor: u64,
}

pub struct SmShared {
    /// The applied state: readers take the current copy without a lock (`load`), and
    /// `apply` replaces it whole, so neither ever waits for the other. With a lock, an entry
    /// of a plan's parts or of statuses held it 25-100 ms at 10,000 hosts (fleet-bench), and
    /// every reader (a report, a watcher's projection) blocked a runtime worker that long.
    pub data: ArcSwap<SmData>,
    pub signals: broadcast::Sender<WatchSignal>,
    /// The agents' desired-state watchers, woken per node.
    pub node_wakers: NodeWakers,
    /// Makes snapshot ids unique even for two snapshots at the same log id.
    snapshot_seq: AtomicU64,
    /// Encoded size of the latest snapshot, built or installed (`snapshot_policy`).
    pub snapshot_bytes: Arc<AtomicU64>,
}

impl SmShared {
    pub fn subscribe(&self) -> broadcast::Receiver<WatchSignal> {
        self.signals.subscribe()
    }
}

#[derive(Deserialize)]
struct SnapshotPayload {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    cluster: ClusterState,
}

/// A [`SnapshotPayload`] as written: the state's persistent copy, taken in O(1).
#[derive(Serialize)]
struct SnapshotCopy {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    cluster: crate::state::PersistedCopy,
}

/// openraft's state machine: the pure `ClusterState` held in memory, rebuilt on start from
/// the persisted snapshot plus the committed log (openraft re-applies from the snapshot's
/// index up to the saved committed index). Over any backend, behind a trait object: the
/// Raft type names its state machine, and one type keeps `Raft` one type.
pub struct StateMachineStore {
    shared: Arc<SmShared>,
    backend: Arc<dyn KvBackend>,
    /// See `RaftSettings::snapshot_off_runtime`.
    snapshot_off_runtime: bool,
}

fn sm_err(e: impl ToString) -> io::Error {
    io::Error::other(format!("reading the state machine: {}", e.to_string()))
}
fn snap_err(e: impl ToString) -> io::Error {
    io::Error::other(format!("writing the snapshot: {}", e.to_string()))
}

impl StateMachineStore {
    pub fn open(backend: Arc<dyn KvBackend>, snapshot_off_runtime: bool) -> anyhow::Result<Self> {
        let (signals, _) = broadcast::channel(4096);
        let mut data = SmData::default();
        let snapshot_bytes = Arc::new(AtomicU64::new(0));
        if let Some((meta, bytes)) = load_snapshot(backend.as_ref()).map_err(|e| anyhow::anyhow!("reading the snapshot: {e}"))? {
            snapshot_bytes.store(bytes.len() as u64, Ordering::Relaxed);
            let payload: SnapshotPayload = serde_json::from_slice(&bytes).map_err(|e| {
                anyhow::anyhow!("the stored snapshot (up to {:?}) is corrupt: {e}; refusing to start", meta.last_log_id.map(|l| l.index))
            })?;
            data.last_applied = payload.last_applied;
            data.membership = payload.membership;
            data.cluster = payload.cluster;
            data.history_floor = data.cluster.revision();
        }
        let shared = SmShared {
            data: ArcSwap::from_pointee(data),
            signals,
            node_wakers: NodeWakers::default(),
            snapshot_seq: AtomicU64::new(0),
            snapshot_bytes,
        };
        Ok(Self { shared: Arc::new(shared), backend, snapshot_off_runtime })
    }

    pub fn shared(&self) -> Arc<SmShared> {
        self.shared.clone()
    }
}

fn load_snapshot(backend: &dyn KvBackend) -> Result<Option<(SnapshotMeta, Vec<u8>)>, String> {
    // One read of the tree, not one per key: a snapshot saved between two reads would pair
    // one snapshot's metadata with another's data.
    let mut rows = backend.range(Tree::Snapshot, &[], None, usize::MAX).map_err(|e| e.to_string())?;
    let mut take = |key: &[u8]| rows.iter().position(|(k, _)| k == key).map(|i| rows.swap_remove(i).1);
    let (meta, data) = (take(SNAPSHOT_META), take(SNAPSHOT_DATA));
    match (meta, data) {
        (None, None) => Ok(None),
        (Some(meta), Some(data)) => {
            let meta: SnapshotMeta = serde_json::from_slice(&meta).map_err(|e| format!("snapshot metadata is corrupt: {e}"))?;
            Ok(Some((meta, data)))
        }
        _ => Err("snapshot metadata and data are inconsistent (one is missing)".into()),
    }
}

fn save_snapshot(backend: &dyn KvBackend, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
    let meta_bytes = serde_json::to_vec(meta).map_err(snap_err)?;
    backend
        .insert_batch(Tree::Snapshot, vec![(SNAPSHOT_META.to_vec(), meta_bytes), (SNAPSHOT_DATA.to_vec(), data.to_vec())])
        .and_then(|_| backend.flush())
        .map_err(snap_err)
}

/// Runs `work` (encoding or decoding a snapshot: seconds of CPU at fleet scale) on a thread
/// of its own at a lower CPU priority, so that on a busy machine the scheduler prefers the
/// threads that answer heartbeats and reports: three controllers encoding 85 MB snapshots
/// at once on two cores timed out the leader's heartbeats.
async fn in_background<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("snapshot".into())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(work());
        })
        .map_err(|e| format!("cannot start the snapshot thread: {e}"))?;
    rx.await.map_err(|_| "the snapshot thread panicked".to_string())
}

/// Nice 10 for the calling thread (on Linux a nice value is per thread; elsewhere a no-op).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority reads no memory of ours; `who = 0` is the calling thread on Linux.
    // Failure (not permitted) leaves the priority as it was, which is only slower.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let started = std::time::Instant::now();
        // Only an O(1) copy of the state is taken; encoding and saving, seconds at fleet
        // scale, happen off the async workers.
        let payload = {
            let data = self.shared.data.load();
            SnapshotCopy { last_applied: data.last_applied, membership: data.membership.clone(), cluster: data.cluster.persisted() }
        };
        let copied = started.elapsed();
        let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed) + 1;
        // For the logs only (openraft 0.10's snapshots carry no id).
        let snapshot_id = match payload.last_applied {
            Some(l) => format!("{}-{}-{seq}", l.leader_id, l.index),
            None => format!("empty-{seq}"),
        };
        let meta = SnapshotMeta { last_log_id: payload.last_applied, last_membership: payload.membership.clone() };
        let backend = self.backend.clone();
        let saved_meta = meta.clone();
        let encode_and_save = move || -> io::Result<Vec<u8>> {
            let bytes = serde_json::to_vec(&payload).map_err(sm_err)?;
            save_snapshot(backend.as_ref(), &saved_meta, &bytes)?;
            Ok(bytes)
        };
        let bytes = if self.snapshot_off_runtime { in_background(encode_and_save).await.map_err(snap_err)?? } else { encode_and_save()? };
        self.shared.snapshot_bytes.store(bytes.len() as u64, Ordering::Relaxed);
        tracing::info!(
            bytes = bytes.len(),
            copy_seconds = copied.as_secs_f64(),
            seconds = started.elapsed().as_secs_f64(),
            snapshot = %snapshot_id,
            "snapshot built"
        );
        Ok(Snapshot { meta, snapshot: Cursor::new(bytes) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let data = self.shared.data.load();
        Ok((data.last_applied, data.membership.clone()))
    }

    /// Applies what the stream holds now and answers each entry's writer once the state
    /// holding it is what readers see (read-your-writes through the API).
    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: futures::Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let mut batch = Vec::new();
        while let Some(item) = entries.next().await {
            batch.push(item?);
        }
        let (batch, responders): (Vec<Entry>, Vec<_>) = batch.into_iter().unzip();
        let responses = self.apply_entries(batch.into_iter());
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Self { shared: self.shared.clone(), backend: self.backend.clone(), snapshot_off_runtime: self.snapshot_off_runtime }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotData) -> io::Result<()> {
        self.install(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let loaded = load_snapshot(self.backend.as_ref()).map_err(sm_err)?;
        Ok(loaded.map(|(meta, data)| Snapshot { meta, snapshot: Cursor::new(data) }))
    }
}

/// Snapshots arrive in chunks (openraft 0.9's transfer, kept on the wire: `network`).
impl SnapshotReceiverFactory<TypeConfig> for StateMachineStore {
    type SnapshotReceiver = SnapshotData;

    async fn begin_receiving_snapshot(&mut self) -> io::Result<SnapshotData> {
        Ok(Cursor::new(Vec::new()))
    }
}

impl StateMachineStore {
    /// Applies `entries` in order and returns each one's results.
    fn apply_entries(&mut self, entries: impl Iterator<Item = Entry>) -> Vec<Vec<crate::state::CommandResult>> {
        let mut responses = Vec::new();
        let mut events = Vec::new();
        // Applied to a copy (O(1): persistent maps), which then replaces the state. This
        // task is the only writer, so nothing is lost between the copy and the store.
        let mut data = SmData::clone(&self.shared.data.load());
        for entry in entries {
            let log_id = entry.log_id;
            data.last_applied = Some(log_id);
            match entry.payload {
                EntryPayload::Blank => {
                    data.cluster.note_index(log_id.index);
                    responses.push(Vec::new());
                }
                EntryPayload::Membership(m) => {
                    data.membership = StoredMembership::new(Some(log_id), m);
                    data.cluster.note_index(log_id.index);
                    responses.push(Vec::new());
                }
                EntryPayload::Normal(proposal) => {
                    if let Err(e) = proposal.check() {
                        data.cluster.note_index(log_id.index);
                        responses.push(proposal.requests().iter().map(|_| Err(e.clone())).collect());
                        continue;
                    }
                    let mut written = crate::state::EntryWrites::default();
                    let mut results = Vec::with_capacity(proposal.requests().len());
                    for mut request in proposal.into_requests() {
                        // A Plan remembers the trace of the write that committed it, for
                        // the agents that apply it (the same on every controller: it is in
                        // the entry).
                        match &mut request.command {
                            Command::Put { spec: Spec::Plan(plan), .. } => {
                                plan.trace_parent = request.trace_parent.clone().unwrap_or_default()
                            }
                            Command::PatchPlan { patch, .. } => patch.trace_parent = request.trace_parent.clone().unwrap_or_default(),
                            _ => {}
                        }
                        // Continues the proposer's trace on every controller.
                        let span = tracing::info_span!("raft.apply", index = log_id.index, request_id = %request.request_id);
                        telemetry_otlp::continue_trace(&span, request.trace_parent.as_deref().unwrap_or_default());
                        let _entered = span.enter();
                        let (result, changes) = data.cluster.apply_in_entry(log_id.index, &request, &mut written);
                        for mut event in changes {
                            event.trace_parent = telemetry_otlp::current_traceparent();
                            let event = Arc::new(event);
                            data.history.push_back(event.clone());
                            if data.history.len() > WATCH_HISTORY {
                                if let Some(evicted) = data.history.pop_front() {
                                    data.history_floor = evicted.revision;
                                }
                            }
                            events.push(event);
                        }
                        results.push(result);
                    }
                    responses.push(results);
                }
            }
        }
        let touched = data.cluster.take_touched_nodes();
        self.shared.data.store(Arc::new(data));
        self.shared.node_wakers.wake(&touched);
        for event in events {
            // No receiver is fine: nobody is watching.
            let _ = self.shared.signals.send(WatchSignal::Change(event));
        }
        responses
    }

    async fn install(&mut self, meta: &SnapshotMeta, snapshot: SnapshotData) -> io::Result<()> {
        let bytes = snapshot.into_inner();
        let (started, size) = (std::time::Instant::now(), bytes.len());
        self.shared.snapshot_bytes.store(bytes.len() as u64, Ordering::Relaxed);
        // Decoded and saved off the async workers, like a snapshot built here (seconds at
        // fleet scale).
        let (backend, saved_meta) = (self.backend.clone(), meta.clone());
        let decode_and_save = move || -> io::Result<SnapshotPayload> {
            let payload: SnapshotPayload = serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::other(format!("decoding the snapshot up to {:?}: {e}", saved_meta.last_log_id.map(|l| l.index))))?;
            save_snapshot(backend.as_ref(), &saved_meta, &bytes)?;
            Ok(payload)
        };
        let payload = if self.snapshot_off_runtime { in_background(decode_and_save).await.map_err(snap_err)?? } else { decode_and_save()? };
        let revision = {
            let data = SmData {
                last_applied: meta.last_log_id,
                membership: meta.last_membership.clone(),
                history_floor: payload.cluster.revision(),
                cluster: payload.cluster,
                history: Default::default(),
            };
            let revision = data.cluster.revision();
            self.shared.data.store(Arc::new(data));
            revision
        };
        self.shared.node_wakers.wake_all();
        let _ = self.shared.signals.send(WatchSignal::Reset { revision });
        tracing::info!(bytes = size, seconds = started.elapsed().as_secs_f64(), last_index = ?meta.last_log_id.map(|l| l.index), "snapshot installed");
        Ok(())
    }
}

#[cfg(test)]
#[path = "golden_formats.rs"]
mod golden_formats;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::open_data_dir;

    /// Files sled wrote beside its log for items too large for it (README, "sled's own
    /// files"), with their sizes: files its flush never syncs.
    fn blobs(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
        let Ok(entries) = std::fs::read_dir(dir.join("sled").join("blobs")) else { return Vec::new() };
        entries.map(|e| e.unwrap().path()).map(|p| (p.clone(), p.metadata().unwrap().len())).filter(|(_, len)| *len > 0).collect()
    }

    /// A leaf of sled's tree holds up to 17 values; stored whole, 40 entries of 300 KB made
    /// 7 leaves of 2.4-3 MB, each a file sled never syncs. Nor may the snapshot be one.
    #[test]
    fn no_entry_or_snapshot_is_in_a_file_sled_never_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SnapshotMeta { last_log_id: Some(log_id(1, 7)), ..Default::default() };
        let entry = |i: u64| (0..300 << 10).map(|b: u64| (b * 31 + i) as u8).collect::<Vec<u8>>();
        {
            let backend = open_data_dir(dir.path(), 1).unwrap();
            for i in 1..=40u64 {
                backend.insert(Tree::Logs, &i.to_be_bytes(), entry(i)).unwrap();
                backend.flush().unwrap();
            }
            save_snapshot(&backend, &meta, &vec![b' '; 3 << 20]).unwrap();
        }
        let files = blobs(dir.path());
        assert!(files.is_empty(), "{} of sled's unsynced files: {files:?}", files.len());
        let backend = open_data_dir(dir.path(), 1).unwrap();
        for i in 1..=40u64 {
            assert!(backend.get(Tree::Logs, &i.to_be_bytes()).unwrap() == Some(entry(i)), "entry {i}");
        }
        assert_eq!(load_snapshot(&backend).unwrap().map(|(m, d)| (m.last_log_id, d.len())), Some((Some(log_id(1, 7)), 3 << 20)));
    }

    /// A reader holds a consistent copy of the state: an apply replaces the state and never
    /// changes that copy, so neither waits for the other (with a lock, holding a reader's
    /// guard across an apply would not return).
    #[tokio::test]
    async fn an_apply_replaces_the_state_and_leaves_what_a_reader_holds() {
        use crate::resources::Kind;
        let dir = tempfile::tempdir().unwrap();
        let mut sm = StateMachineStore::open(Arc::new(open_data_dir(dir.path(), 1).unwrap()), false).unwrap();
        let held = sm.shared.data.load_full();
        let spec = crate::state::tests::gpu_model();
        let command = crate::state::Command::Put {
            name: "A100-80GB".into(),
            tenant: String::new(),
            spec,
            mode: crate::state::WriteMode::Create,
            expected_version: 0,
        };
        let request = crate::state::Request { request_id: "r1".into(), command, trace_parent: None };
        let entry = Entry { log_id: log_id(1, 1), payload: EntryPayload::Normal(crate::state::Proposal::one(request).unwrap()) };
        let outcome = sm.apply_entries([entry].into_iter());
        assert!(outcome[0][0].is_ok(), "{outcome:?}");
        assert_eq!(held.last_applied, None, "the reader's copy is as it was");
        assert!(held.cluster.get(Kind::GpuModel, "A100-80GB").is_none());
        let now = sm.shared.data.load();
        assert_eq!(now.last_applied.map(|l| l.index), Some(1));
        assert!(now.cluster.get(Kind::GpuModel, "A100-80GB").is_some());
        assert_eq!(now.history.len(), 1, "the change is in the watch history");
    }

    /// Where sled read a damaged snapshot back as none, the node now stops with a message.
    #[test]
    fn a_damaged_snapshot_is_an_error_not_an_absent_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SnapshotMeta::default();
        save_snapshot(&open_data_dir(dir.path(), 1).unwrap(), &meta, &vec![b' '; 1 << 20]).unwrap();
        let generation = std::fs::read_dir(dir.path().join("snapshot")).unwrap().next().unwrap().unwrap().path();
        for file in std::fs::read_dir(generation).unwrap() {
            // What a power loss can leave of a file that was never synced.
            std::fs::OpenOptions::new().write(true).open(file.unwrap().path()).unwrap().set_len(0).unwrap();
        }
        let e = load_snapshot(&open_data_dir(dir.path(), 1).unwrap()).unwrap_err();
        assert!(e.contains("is damaged"), "{e}");
    }
}
