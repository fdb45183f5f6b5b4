use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId, StorageIOError};

use super::types::*;
use crate::storage::{KvBackend, Tree, Watermark};

// In `Tree::HardState`, which every write makes durable at once.
const VOTE: &[u8] = b"vote";
const LAST_PURGED: &[u8] = b"last_purged";
// In `Tree::Meta`: losing it in a crash is safe (see `save_committed`).
const COMMITTED: &[u8] = b"committed";

/// openraft's log storage over any `KvBackend`. Votes and appended entries are flushed
/// before they are acknowledged.
pub struct LogStore<B> {
    backend: Arc<B>,
    watermark: Arc<Watermark>,
    /// Latest committed index openraft reported, for status pages.
    committed: Arc<AtomicU64>,
    /// The committed index last stored (see `save_committed`).
    committed_saved: Arc<AtomicU64>,
    appended_bytes: Arc<AtomicU64>,
    /// The newest entries, shared by the writer and the readers (see [`RecentEntries`]).
    recent: Arc<Mutex<RecentEntries>>,
    /// Remove purged entries on a thread of their own (see [`LogStore::purge`]).
    purge_in_background: bool,
    /// Held while purged entries are removed: one removal at a time.
    removal: Arc<Mutex<()>>,
    /// The fault of a removal that failed, which the next append or purge returns
    /// (stopping the node). Apart from `removal`, so that a write never waits for one.
    removal_failed: Arc<std::sync::OnceLock<String>>,
}

impl<B> Clone for LogStore<B> {
    fn clone(&self) -> Self {
        Self {
            backend: self.backend.clone(),
            watermark: self.watermark.clone(),
            committed: self.committed.clone(),
            committed_saved: self.committed_saved.clone(),
            appended_bytes: self.appended_bytes.clone(),
            recent: self.recent.clone(),
            purge_in_background: self.purge_in_background,
            removal: self.removal.clone(),
            removal_failed: self.removal_failed.clone(),
        }
    }
}

/// Committed entries between two stores of the committed index (`save_committed`).
const COMMITTED_SAVE_EVERY: u64 = 256;

/// Encoded bytes of the newest entries kept decoded in memory.
const RECENT_BYTES: usize = 16 * 1024 * 1024;

/// The newest entries appended, decoded: a contiguous tail of the log of at most
/// [`RECENT_BYTES`] encoded. Every entry is read back soon after it is appended, to be
/// applied and, on the leader, to be replicated to each follower; decoding each from JSON
/// again was a tenth of a 10,000-host leader's CPU during a roll-out (perf). Older entries
/// (a follower far behind, a restart) are read from the backend.
struct RecentEntries {
    /// Entries in index order, each with its encoded size.
    entries: VecDeque<(Arc<Entry>, usize)>,
    bytes: usize,
    /// Most encoded bytes kept (more only for one larger entry).
    cap: usize,
}

impl Default for RecentEntries {
    fn default() -> Self {
        RecentEntries { entries: VecDeque::new(), bytes: 0, cap: RECENT_BYTES }
    }
}

impl RecentEntries {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    /// Adds entries appended after the tail (`entries` in index order); entries that do not
    /// follow it start a new tail.
    fn push(&mut self, entries: Vec<(Arc<Entry>, usize)>) {
        for (entry, size) in entries {
            if self.entries.back().is_some_and(|(last, _)| last.log_id.index + 1 != entry.log_id.index) {
                self.clear();
            }
            self.bytes += size;
            self.entries.push_back((entry, size));
        }
        while self.bytes > self.cap && self.entries.len() > 1 {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Forgets entries from `index` on (the log was truncated there).
    fn truncate(&mut self, index: u64) {
        while self.entries.back().is_some_and(|(e, _)| e.log_id.index >= index) {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets entries up to `index` (purged).
    fn purge(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            self.pop_front();
        }
    }

    /// Entries `[start, end)` if the tail holds `start`, as for `read_entries`. The tail is
    /// the end of the log, so whatever of the range it lacks past its end does not exist.
    fn read(&self, start: u64, end: Option<u64>, max_bytes: usize) -> Option<Vec<Arc<Entry>>> {
        let first = self.first_index()?;
        if start < first {
            return None;
        }
        let mut total = 0usize;
        let mut out = Vec::new();
        for (entry, size) in self.entries.iter().skip((start - first) as usize) {
            if end.is_some_and(|end| entry.log_id.index >= end) {
                break;
            }
            total = total.saturating_add(*size);
            if !out.is_empty() && total > max_bytes {
                break;
            }
            out.push(entry.clone());
        }
        Some(out)
    }
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn io_read(e: impl ToString) -> StorageError {
    StorageIOError::read_logs(anyerror::AnyError::error(e.to_string())).into()
}
fn io_write(e: impl ToString) -> StorageError {
    StorageIOError::write_logs(anyerror::AnyError::error(e.to_string())).into()
}

/// Rows read from the backend at a time by [`LogStore::read_rows`].
const READ_CHUNK: usize = 16;

impl<B: KvBackend> LogStore<B> {
    /// Opens the log; refuses a log that ends before the recorded durable watermark.
    pub fn open(backend: Arc<B>, watermark: Watermark) -> anyhow::Result<Self> {
        let store = Self {
            backend,
            watermark: Arc::new(watermark),
            committed: Arc::default(),
            committed_saved: Arc::default(),
            appended_bytes: Arc::default(),
            recent: Arc::default(),
            purge_in_background: false,
            removal: Arc::default(),
            removal_failed: Arc::default(),
        };
        let recorded = store.watermark.read().map_err(|e| anyhow::anyhow!(e))?;
        let last = store.last_index().map_err(|e| anyhow::anyhow!("reading the Raft log: {e}"))?;
        if last < recorded {
            anyhow::bail!(
                "the Raft log ends at index {last} but entries up to {recorded} were made durable: \
                 the database is damaged or truncated; refusing to start (files left untouched)"
            );
        }
        store.check_contiguous().map_err(|e| anyhow::anyhow!("{e}; refusing to start (files left untouched)"))?;
        Ok(store)
    }

    /// Checks that the stored log has no hole: a backend may lose entries in the middle
    /// (sled, where the log was until data-dir format 6, recovered a damaged file without
    /// an error and without some of them; a segment file of `log_files` may go missing),
    /// which the watermark cannot see: the last index is intact. Reads the log's keys, in
    /// batches, not its entries (`log_files` read and checked every record as they opened).
    fn check_contiguous(&self) -> Result<(), String> {
        const BATCH: usize = 4096;
        let mut previous: Option<u64> = None;
        let mut from = key(0).to_vec();
        loop {
            let rows = self.backend.keys(Tree::Logs, &from, None, BATCH).map_err(|e| format!("reading the Raft log: {e}"))?;
            for k in &rows {
                let index = decode_key(k).map_err(|e| e.to_string())?;
                check_follows(previous, index)?;
                previous = Some(index);
            }
            match previous {
                Some(last) if rows.len() == BATCH => from = key(last + 1).to_vec(),
                _ => return Ok(()),
            }
        }
    }

    /// This log, removing purged entries on a thread of its own when `background` (see
    /// [`LogStore::purge`]; not in the deterministic simulation, whose replay needs every
    /// step on its own scheduler).
    pub fn purging_in_background(self, background: bool) -> Self {
        Self { purge_in_background: background, ..self }
    }

    /// The fault of an earlier background removal, if one failed.
    fn removal_fault(&self) -> Result<(), StorageError> {
        match self.removal_failed.get() {
            Some(fault) => Err(io_write(format!("removing purged log entries failed earlier: {fault}"))),
            None => Ok(()),
        }
    }

    /// The committed index as last reported by openraft (0 before any).
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// Bytes of log entries appended to this node's log since it started (Raft's own traffic
    /// is of the same order: each entry goes to each follower once).
    pub fn appended_bytes(&self) -> Arc<AtomicU64> {
        self.appended_bytes.clone()
    }

    /// Writes `entries` and returns once they are durable (flushed, watermark advanced).
    pub fn append_durably(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StorageError> {
        let mut batch = Vec::new();
        let mut decoded = Vec::new();
        let mut last = None;
        let mut bytes = 0;
        for entry in entries {
            let index = entry.log_id.index;
            let encoded = serde_json::to_vec(&entry).map_err(io_write)?;
            bytes += encoded.len() as u64;
            decoded.push((Arc::new(entry), encoded.len()));
            batch.push((key(index).to_vec(), encoded));
            last = Some(index);
        }
        self.appended_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.backend.insert_batch(Tree::Logs, batch).and_then(|_| self.backend.flush_tree(Tree::Logs)).map_err(io_write)?;
        if let Some(last) = last {
            self.watermark.advance(last).map_err(|e| io_write(format!("writing the log watermark: {e}")))?;
        }
        self.recent.lock().expect("recent entries lock").push(decoded);
        Ok(())
    }

    /// Waits out the backend's simulated write latency, if any.
    async fn slow_disk(&self) {
        if let Some(delay) = self.backend.write_delay() {
            tokio::time::sleep(delay).await;
        }
    }

    fn read_json<T: serde::de::DeserializeOwned>(&self, tree: Tree, k: &[u8]) -> Result<Option<T>, StorageError> {
        match self.backend.get(tree, k).map_err(io_read)? {
            None => Ok(None),
            Some(bytes) => {
                serde_json::from_slice(&bytes).map(Some).map_err(|e| io_read(format!("decoding {}: {e}", String::from_utf8_lossy(k))))
            }
        }
    }

    fn write_hard_state<T: serde::Serialize>(&self, k: &[u8], value: &T) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec(value).map_err(io_write)?;
        self.backend.insert(Tree::HardState, k, bytes).map_err(io_write)?;
        self.backend.flush_tree(Tree::HardState).map_err(io_write)
    }

    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.read_json(Tree::HardState, LAST_PURGED)
    }

    /// The index up to which the log was purged (0: never), as stored.
    pub fn purged_index(&self) -> anyhow::Result<u64> {
        Ok(self.last_purged().map_err(|e| anyhow::anyhow!("reading the Raft log: {e}"))?.map_or(0, |l| l.index))
    }

    fn last_index(&self) -> Result<u64, StorageError> {
        let from_logs = self.backend.last(Tree::Logs).map_err(io_read)?.map(|(k, _)| decode_key(&k)).transpose()?;
        let purged = self.last_purged()?.map(|l| l.index);
        Ok(from_logs.or(purged).unwrap_or(0))
    }
}

/// A log read in index order must find `index` right after `previous`.
fn check_follows(previous: Option<u64>, index: u64) -> Result<(), String> {
    match previous {
        Some(p) if index != p + 1 => Err(format!(
            "the Raft log has a hole: entry {index} follows entry {p}, entries {}..={} are missing; the database is damaged",
            p + 1,
            index.saturating_sub(1)
        )),
        _ => Ok(()),
    }
}

fn decode_key(k: &[u8]) -> Result<u64, StorageError> {
    let bytes: [u8; 8] = k.try_into().map_err(|_| io_read(format!("log key of {} bytes", k.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Encoded bytes of log entries in one AppendEntries message (at least one entry is always
/// sent). openraft gives an AppendEntries RPC one heartbeat interval to complete and retries
/// a timed-out one unchanged, so a batch must be small enough to encode, send, decode and
/// flush well within it on a loaded machine; a fleet-wide re-plan once filled 300-entry
/// batches of tens of MB that never completed, and followers starved into elections.
pub const MAX_APPEND_BYTES: usize = 512 * 1024;

impl<B: KvBackend> LogStore<B> {
    /// The rows of entries `[start, end)`, stopping before the one that would take their
    /// total over `max_bytes` (never before the first). Read [`READ_CHUNK`] rows at a
    /// time: replication asks for everything the follower lacks (after a re-plan, MBs of
    /// entries) to send 512 KiB of it, and reading it all first was a third of a 10,000-host
    /// leader's CPU.
    fn read_rows(&self, start: u64, end: Option<u64>, max_bytes: usize) -> Result<crate::storage::KvPairs, StorageError> {
        let end_key = end.map(key);
        let mut rows = Vec::new();
        let mut total = 0usize;
        let mut from = key(start);
        loop {
            let chunk = self.backend.range(Tree::Logs, &from, end_key.as_ref().map(|k| k.as_slice()), READ_CHUNK).map_err(io_read)?;
            let complete = chunk.len() < READ_CHUNK;
            for (k, v) in chunk {
                total = total.saturating_add(v.len());
                if !rows.is_empty() && total > max_bytes {
                    return Ok(rows);
                }
                from = key(decode_key(&k)?.saturating_add(1));
                rows.push((k, v));
            }
            if complete {
                return Ok(rows);
            }
        }
    }

    /// Entries `[start, end)` (end `None`: to the last), stopping before the one that would
    /// take the encoded total over `max_bytes` (never before the first).
    fn read_entries(&self, start: u64, end: Option<u64>, max_bytes: usize) -> Result<Vec<Entry>, StorageError> {
        // The shared entries are copied outside the lock, so that the writer never waits
        // on a reader's copy.
        let recent = self.recent.lock().expect("recent entries lock").read(start, end, max_bytes);
        if let Some(recent) = recent {
            return Ok(recent.iter().map(|e| Entry::clone(e)).collect());
        }
        let rows = self.read_rows(start, end, max_bytes)?;
        // A hole means damage (see `check_contiguous`): a storage error stops the node
        // rather than handing openraft a log with entries missing.
        let mut previous = None;
        rows.into_iter()
            .map(|(k, v)| {
                let index = decode_key(&k)?;
                check_follows(previous, index).map_err(io_read)?;
                previous = Some(index);
                serde_json::from_slice::<Entry>(&v).map_err(|e| io_read(format!("decoding log entry {index}: {e}")))
            })
            .collect()
    }
}

impl<B: KvBackend> RaftLogReader<TypeConfig> for LogStore<B> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Some(e + 1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => None,
        };
        self.read_entries(start, end, usize::MAX)
    }

    /// What replication sends: bounded by [`MAX_APPEND_BYTES`].
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError> {
        let entries = self.read_entries(start, Some(end), MAX_APPEND_BYTES)?;
        // The range's start was purged (a snapshot was taken since openraft chose to send
        // it): nothing, not the entries after the purge point. openraft treats an empty
        // answer as a heartbeat and decides again; entries that do not start at `start` would
        // go out as an AppendEntries whose entries do not follow its `prev_log_id`. (Other
        // readers may ask for a range that starts before the log does, and get what exists.)
        if entries.first().is_some_and(|e| e.log_id.index != start) {
            return Ok(Vec::new());
        }
        Ok(entries)
    }
}

impl<B: KvBackend> RaftLogStorage<TypeConfig> for LogStore<B> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.last_purged()?;
        let last = match self.backend.last(Tree::Logs).map_err(io_read)? {
            Some((_, v)) => Some(*serde_json::from_slice::<Entry>(&v).map_err(io_read)?.get_log_id()),
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.slow_disk().await;
        let bytes = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(anyerror::AnyError::new(&e)))?;
        self.backend
            .insert(Tree::HardState, VOTE, bytes)
            .and_then(|_| self.backend.flush_tree(Tree::HardState))
            .map_err(|e| StorageIOError::write_vote(anyerror::AnyError::error(e.to_string())).into())
    }

    /// The stored vote, as not yet granted by a quorum. openraft 0.9 restarts a node whose
    /// stored vote is committed and its own as the leader of the same term at once, with the
    /// commit index it finds stored; that index is not durable (`save_committed`), so such a
    /// leader answered linearizable reads from a state that lacked acknowledged writes (a
    /// full restart in `tests/cluster.rs` listed no Services at all). Read back uncommitted,
    /// a restarted node is a follower, as in the Raft paper and etcd: a leader it was runs a
    /// new election, and its first entry in the new term is committed before it serves a
    /// read. The vote still binds the node: it grants no other candidate of its term.
    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.read_json::<Vote>(Tree::HardState, VOTE)?.map(|v| Vote { committed: false, ..v }))
    }

    /// Stored only every [`COMMITTED_SAVE_EVERY`] entries, and not flushed on its own: a
    /// committed index that is older or lost in a crash only makes the restarted node wait
    /// for the leader before re-applying the rest, which is safe. Stored at every commit,
    /// it was a sled write (and sled's I/O threads' `sync_file_range`) per Raft write.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let index = committed.map_or(0, |c| c.index);
        let previous = self.committed.swap(index, Ordering::Relaxed);
        let saved = self.committed_saved.load(Ordering::Relaxed);
        if previous != 0 && index < saved.saturating_add(COMMITTED_SAVE_EVERY) {
            return Ok(());
        }
        self.committed_saved.store(index, Ordering::Relaxed);
        let bytes = serde_json::to_vec(&committed).map_err(io_write)?;
        self.backend.insert(Tree::Meta, COMMITTED, bytes).map_err(io_write)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_json::<Option<LogId>>(Tree::Meta, COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.slow_disk().await;
        self.removal_fault()?;
        match self.append_durably(entries) {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent.lock().expect("recent entries lock").truncate(log_id.index);
        self.backend
            .remove_range(Tree::Logs, &key(log_id.index), None)
            .and_then(|_| self.backend.flush_tree(Tree::Logs))
            .map_err(io_write)?;
        self.watermark.reset_to(log_id.index.saturating_sub(1)).map_err(io_write)
    }

    /// openraft awaits this inside its core, which meanwhile sends no heartbeat: removing
    /// a 10,000-host log's 1,167 entries (about 150 MB) there took 400 ms, and a follower
    /// elected itself. So only the purge point is recorded here; with
    /// `purging_in_background` the entries are removed on a thread of their own. Entries
    /// at or below the purge point are never read again, and a crash before they are gone
    /// leaves them behind the recorded point, where the next purge removes them.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.removal_fault()?;
        // Record the purge point first, so a crash in between never leaves a hole.
        self.write_hard_state(LAST_PURGED, &log_id)?;
        self.recent.lock().expect("recent entries lock").purge(log_id.index);
        let (backend, removal, failed) = (self.backend.clone(), self.removal.clone(), self.removal_failed.clone());
        let upto = key(log_id.index + 1);
        let remove = move || {
            let _one_at_a_time = removal.lock().expect("removal lock");
            if failed.get().is_none() {
                if let Err(e) = backend.remove_range(Tree::Logs, &key(0), Some(&upto)).and_then(|_| backend.flush_tree(Tree::Logs)) {
                    tracing::error!(error = %e, "removing purged log entries failed; the node stops at its next log write");
                    let _ = failed.set(e.to_string());
                }
            }
        };
        if !self.purge_in_background {
            remove();
            return self.removal_fault();
        }
        std::thread::Builder::new().name("log-purge".into()).spawn(remove).map(drop).map_err(io_write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemBackend;

    fn log_with(indexes: impl Iterator<Item = u64>) -> Arc<MemBackend> {
        let backend = Arc::new(MemBackend::new());
        backend.insert_batch(Tree::Logs, indexes.map(|i| (key(i).to_vec(), b"{}".to_vec())).collect()).unwrap();
        backend
    }

    #[test]
    fn a_log_with_a_hole_is_refused_at_start() {
        // Past the first read batch, so the hole is found across batches too.
        let backend = log_with((1..=5000).filter(|i| !(4500..=4502).contains(i)));
        let err = LogStore::open(backend, Watermark::disabled()).err().expect("a hole must be refused").to_string();
        assert!(err.contains("entry 4503 follows entry 4499, entries 4500..=4502 are missing"), "{err}");
        assert!(err.contains("refusing to start"), "{err}");
    }

    /// Entries 1..=n, each a Node status of about `bytes` bytes.
    fn log_of_sized_entries(n: u64, bytes: usize) -> LogStore<MemBackend> {
        let backend = Arc::new(MemBackend::new());
        let rows = (1..=n)
            .map(|i| {
                let command = crate::state::Command::PutStatus {
                    kind: crate::resources::Kind::Node,
                    name: format!("n{i}"),
                    status: serde_json::Value::String("x".repeat(bytes)).into(),
                    expected_version: 0,
                };
                let request = crate::state::Request { request_id: String::new(), command, trace_parent: None };
                let entry = Entry {
                    log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), i),
                    payload: EntryPayload::Normal(crate::state::Proposal::one(request).unwrap()),
                };
                (key(i).to_vec(), serde_json::to_vec(&entry).unwrap())
            })
            .collect();
        backend.insert_batch(Tree::Logs, rows).unwrap();
        LogStore::open(backend, Watermark::disabled()).unwrap()
    }

    #[tokio::test]
    async fn replication_reads_a_bounded_batch_but_never_nothing() {
        let mut store = log_of_sized_entries(40, 100 * 1024);
        let batch = store.limited_get_log_entries(1, 41).await.unwrap();
        // 100 KiB entries in a 512 KiB budget: the first 5 (the 6th would pass it).
        assert_eq!(batch.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (1..=5).collect::<Vec<_>>());
        let from_middle = store.limited_get_log_entries(30, 41).await.unwrap();
        assert_eq!(from_middle.first().map(|e| e.log_id.index), Some(30));
        // Everything, when asked for everything (compaction, a follower's own reads).
        assert_eq!(store.try_get_log_entries(1..41).await.unwrap().len(), 40);

        // One entry over the budget on its own still goes, alone.
        let mut huge = log_of_sized_entries(3, MAX_APPEND_BYTES + 1);
        assert_eq!(huge.limited_get_log_entries(1, 4).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn replication_from_before_the_purge_point_gets_nothing_not_the_entries_after_it() {
        let mut store = log_of_sized_entries(20, 16);
        store.purge(LogId::new(openraft::CommittedLeaderId::new(1, 1), 9)).await.unwrap();
        assert!(store.limited_get_log_entries(0, 15).await.unwrap().is_empty());
        // Other readers get what exists of a range that starts before the log.
        assert_eq!(store.try_get_log_entries(5..15).await.unwrap().first().map(|e| e.log_id.index), Some(10));
        let kept = store.limited_get_log_entries(10, 15).await.unwrap();
        assert_eq!(kept.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (10..15).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn purged_entries_are_removed_in_the_background_and_a_failed_removal_stops_the_next_write() {
        let mut store = log_of_sized_entries(20, 16).purging_in_background(true);
        let upto = LogId::new(openraft::CommittedLeaderId::new(1, 1), 9);
        store.purge(upto).await.unwrap();
        // Recorded at once; the entries go soon after.
        assert_eq!(store.get_log_state().await.unwrap().last_purged_log_id, Some(upto));
        let first =
            |s: &LogStore<MemBackend>| s.backend.range(Tree::Logs, &key(0), None, 1).unwrap().first().map(|(k, _)| decode_key(k).unwrap());
        for _ in 0..500 {
            if first(&store) == Some(10) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(first(&store), Some(10));
        assert_eq!(store.try_get_log_entries(10..=20).await.unwrap().len(), 11);

        store.removal_failed.set("injected: no space left on device".into()).unwrap();
        let later = LogId::new(openraft::CommittedLeaderId::new(1, 1), 12);
        let err = store.purge(later).await.unwrap_err().to_string();
        assert!(err.contains("removing purged log entries failed earlier: injected"), "{err}");
        assert_eq!(store.get_log_state().await.unwrap().last_purged_log_id, Some(upto), "a purge after a fault records nothing");
    }

    /// A leader that restarts is a follower until it wins a new election (see `read_vote`).
    #[tokio::test]
    async fn a_vote_reads_back_as_not_yet_granted_and_still_for_its_term_and_node() {
        let mut store = LogStore::open(Arc::new(MemBackend::new()), Watermark::disabled()).unwrap();
        store.save_vote(&Vote::new_committed(7, 2)).await.unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(7, 2)));
    }

    #[test]
    fn a_contiguous_log_opens() {
        assert!(LogStore::open(log_with(1..=5000), Watermark::disabled()).is_ok());
        assert!(LogStore::open(log_with(std::iter::empty()), Watermark::disabled()).is_ok());
    }

    fn sized_entry(term: u64, index: u64, bytes: usize) -> Entry {
        let command = crate::state::Command::PutStatus {
            kind: crate::resources::Kind::Node,
            name: format!("n{index}"),
            status: serde_json::Value::String(format!("{term}").repeat(bytes)).into(),
            expected_version: 0,
        };
        let request = crate::state::Request { request_id: String::new(), command, trace_parent: None };
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(crate::state::Proposal::one(request).unwrap()),
        }
    }

    /// What `warm` (which appended the entries and keeps the newest decoded) reads equals
    /// what a store opened cold on the same backend reads from disk, for every range.
    fn assert_reads_agree(warm: &LogStore<MemBackend>) {
        let cold = LogStore::open(warm.backend.clone(), Watermark::disabled()).unwrap();
        let last = cold.last_index().unwrap();
        let ids = |v: Vec<Entry>| v.into_iter().map(|e| (e.log_id, serde_json::to_vec(&e.payload).unwrap())).collect::<Vec<_>>();
        for start in 0..=last + 2 {
            for end in [None, Some(start + 1), Some(start + 3), Some(last + 5)] {
                for max in [1, 5000, usize::MAX] {
                    let (w, c) = (warm.read_entries(start, end, max).unwrap(), cold.read_entries(start, end, max).unwrap());
                    assert_eq!(ids(w), ids(c), "start {start}, end {end:?}, max {max}");
                }
            }
        }
    }

    #[tokio::test]
    async fn the_newest_entries_read_from_memory_as_they_would_from_disk_through_truncation_and_purge() {
        let mut store = LogStore::open(Arc::new(MemBackend::new()), Watermark::disabled()).unwrap();
        // 40 entries of 1 KiB: the memory holds only the newest 16 KiB of them.
        store.recent.lock().unwrap().cap = 16 * 1024;
        store.append_durably((1..=40).map(|i| sized_entry(1, i, 1024))).unwrap();
        let kept = store.recent.lock().unwrap().entries.len();
        assert!((1..40).contains(&kept), "{kept} of 40 entries kept in memory");
        assert_reads_agree(&store);

        // A new leader overwrites the end of the log.
        store.truncate(LogId::new(openraft::CommittedLeaderId::new(1, 1), 35)).await.unwrap();
        store.append_durably((35..=38).map(|i| sized_entry(2, i, 100))).unwrap();
        assert_reads_agree(&store);

        store.purge(LogId::new(openraft::CommittedLeaderId::new(2, 1), 36)).await.unwrap();
        assert_reads_agree(&store);
        assert_eq!(store.recent.lock().unwrap().first_index(), Some(37));
    }
}
