use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::io;

use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use super::log_flusher::LogFlusher;
use super::types::*;
use crate::storage::{KvBackend, Tree, Watermark};

// In `Tree::HardState`, which every write makes durable at once.
const VOTE: &[u8] = b"vote";
const LAST_PURGED: &[u8] = b"last_purged";
// In `Tree::Meta`: losing it in a crash is safe (see `save_committed`).
const COMMITTED: &[u8] = b"committed";

/// openraft's log storage over any `KvBackend`. Votes are flushed before `save_vote`
/// returns; appended entries are flushed before their `IOFlushed` callback runs, inline or
/// on the flusher thread (see [`LogStore::with_background_io`]).
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
    /// Flushes appended entries after `append` returns; none: `append` flushes them itself.
    flusher: Option<LogFlusher>,
    /// This node, and whether it leads (as its last vote saved says): with both, only a
    /// leader's appends go to the flusher (see [`LogStore::flushing_in_background_only_while_leading`]).
    only_while_leading: Option<(NodeId, Arc<std::sync::atomic::AtomicBool>)>,
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
            flusher: self.flusher.clone(),
            only_while_leading: self.only_while_leading.clone(),
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

fn io_err(e: impl ToString) -> io::Error {
    io::Error::other(e.to_string())
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
            flusher: None,
            only_while_leading: None,
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

    /// This log, when `background`, flushing appended entries on a thread of its own
    /// ([`LogFlusher`]) and removing purged ones on another (see [`LogStore::purge`]). Not in
    /// the deterministic simulation, whose replay needs every step on its own scheduler:
    /// there `append` flushes before it returns, which is correct but gives up the leader's
    /// flush overlapping replication.
    pub fn with_background_io(self, background: bool) -> anyhow::Result<Self> {
        let flusher = if background {
            let (backend, watermark) = (self.backend.clone(), self.watermark.clone());
            let flush = Box::new(move |upto: u64| {
                if let Some(delay) = backend.write_delay() {
                    std::thread::sleep(delay);
                }
                make_durable(backend.as_ref(), &watermark, Some(upto)).map_err(|e| e.to_string())
            });
            Some(LogFlusher::start(flush).map_err(|e| anyhow::anyhow!("cannot start the log flusher thread: {e}"))?)
        } else {
            None
        };
        Ok(Self { purge_in_background: background, flusher, ..self })
    }

    /// This log, with a flusher, flushing in the background only while `node` leads; as a
    /// follower it flushes in `append`. Only the leader's flush can overlap anything (the
    /// round trip to the followers); a follower answers its leader once its flush is done,
    /// and a hand-off to the flusher thread and back only adds two thread wake-ups to that.
    pub fn flushing_in_background_only_while_leading(self, node: NodeId) -> Self {
        Self { only_while_leading: Some((node, Arc::default())), ..self }
    }

    /// The flusher that takes this append, if any (see `only_while_leading`).
    fn flusher_now(&self) -> Option<&LogFlusher> {
        match &self.only_while_leading {
            Some((_, leads)) if !leads.load(Ordering::Acquire) => None,
            _ => self.flusher.as_ref(),
        }
    }

    /// Waits until every appended entry is durable: openraft requires the log's writes to
    /// complete in order, so a vote, a truncation or a purge must not overtake an append.
    fn wait_flushed(&self) -> io::Result<()> {
        match &self.flusher {
            Some(flusher) => flusher.wait_idle().map_err(|e| io_err(format!("flushing the Raft log failed earlier: {e}"))),
            None => Ok(()),
        }
    }

    /// The fault of an earlier background removal, if one failed.
    fn removal_fault(&self) -> io::Result<()> {
        match self.removal_failed.get() {
            Some(fault) => Err(io_err(format!("removing purged log entries failed earlier: {fault}"))),
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
    pub fn append_durably(&self, entries: impl IntoIterator<Item = Entry>) -> io::Result<()> {
        let last = self.write_entries(entries)?;
        make_durable(self.backend.as_ref(), &self.watermark, last)
    }

    /// Writes `entries` (readable at once, not yet durable) and returns the last one's index.
    fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> io::Result<Option<u64>> {
        let mut batch = Vec::new();
        let mut decoded = Vec::new();
        let mut last = None;
        let mut bytes = 0;
        for entry in entries {
            let index = entry.log_id.index;
            let encoded = serde_json::to_vec(&entry).map_err(io_err)?;
            bytes += encoded.len() as u64;
            decoded.push((Arc::new(entry), encoded.len()));
            batch.push((key(index).to_vec(), encoded));
            last = Some(index);
        }
        self.appended_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.backend.insert_batch(Tree::Logs, batch).map_err(io_err)?;
        self.recent.lock().expect("recent entries lock").push(decoded);
        Ok(last)
    }

    /// Waits out the backend's simulated write latency, if any.
    async fn slow_disk(&self) {
        if let Some(delay) = self.backend.write_delay() {
            tokio::time::sleep(delay).await;
        }
    }

    fn read_json<T: serde::de::DeserializeOwned>(&self, tree: Tree, k: &[u8]) -> io::Result<Option<T>> {
        match self.backend.get(tree, k).map_err(io_err)? {
            None => Ok(None),
            Some(bytes) => {
                serde_json::from_slice(&bytes).map(Some).map_err(|e| io_err(format!("decoding {}: {e}", String::from_utf8_lossy(k))))
            }
        }
    }

    fn write_hard_state<T: serde::Serialize>(&self, k: &[u8], value: &T) -> io::Result<()> {
        let bytes = serde_json::to_vec(value).map_err(io_err)?;
        self.backend.insert(Tree::HardState, k, bytes).map_err(io_err)?;
        self.backend.flush_tree(Tree::HardState).map_err(io_err)
    }

    fn last_purged(&self) -> io::Result<Option<LogId>> {
        self.read_json(Tree::HardState, LAST_PURGED)
    }

    /// The index up to which the log was purged (0: never), as stored.
    pub fn purged_index(&self) -> anyhow::Result<u64> {
        Ok(self.last_purged().map_err(|e| anyhow::anyhow!("reading the Raft log: {e}"))?.map_or(0, |l| l.index))
    }

    fn last_index(&self) -> io::Result<u64> {
        let from_logs = self.backend.last(Tree::Logs).map_err(io_err)?.map(|(k, _)| decode_key(&k)).transpose()?;
        let purged = self.last_purged()?.map(|l| l.index);
        Ok(from_logs.or(purged).unwrap_or(0))
    }
}

/// Flushes the log and records entries up to `last` as durable.
fn make_durable<B: KvBackend>(backend: &B, watermark: &Watermark, last: Option<u64>) -> io::Result<()> {
    backend.flush_tree(Tree::Logs).map_err(io_err)?;
    if let Some(last) = last {
        watermark.advance(last).map_err(|e| io_err(format!("writing the log watermark: {e}")))?;
    }
    Ok(())
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

fn decode_key(k: &[u8]) -> io::Result<u64> {
    let bytes: [u8; 8] = k.try_into().map_err(|_| io_err(format!("log key of {} bytes", k.len())))?;
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
    fn read_rows(&self, start: u64, end: Option<u64>, max_bytes: usize) -> io::Result<crate::storage::KvPairs> {
        let end_key = end.map(key);
        let mut rows = Vec::new();
        let mut total = 0usize;
        let mut from = key(start);
        loop {
            let chunk = self.backend.range(Tree::Logs, &from, end_key.as_ref().map(|k| k.as_slice()), READ_CHUNK).map_err(io_err)?;
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
    fn read_entries(&self, start: u64, end: Option<u64>, max_bytes: usize) -> io::Result<Vec<Entry>> {
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
                check_follows(previous, index).map_err(io_err)?;
                previous = Some(index);
                serde_json::from_slice::<Entry>(&v).map_err(|e| io_err(format!("decoding log entry {index}: {e}")))
            })
            .collect()
    }
}

impl<B: KvBackend> RaftLogReader<TypeConfig> for LogStore<B> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(&mut self, range: RB) -> io::Result<Vec<Entry>> {
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

    /// The stored vote, as stored. A leader that restarts is not a leader again at once:
    /// openraft's `enable_leader_restore` is off (`RaftSettings::openraft_config`), so its
    /// committed vote is demoted in memory and it waits for an election, as in the Raft
    /// paper and etcd. (With the restore, a restarted leader served linearizable reads from
    /// its stored commit index, which is not durable: `save_committed`.)
    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        self.read_json::<Vote>(Tree::HardState, VOTE)
    }

    /// What replication sends: bounded by [`MAX_APPEND_BYTES`].
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
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

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let last_purged_log_id = self.last_purged()?;
        let last = match self.backend.last(Tree::Logs).map_err(io_err)? {
            Some((_, v)) => Some(serde_json::from_slice::<Entry>(&v).map_err(io_err)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.wait_flushed()?;
        self.slow_disk().await;
        let bytes = serde_json::to_vec(vote).map_err(io_err)?;
        self.backend
            .insert(Tree::HardState, VOTE, bytes)
            .and_then(|_| self.backend.flush_tree(Tree::HardState))
            .map_err(|e| io_err(format!("saving the vote: {e}")))?;
        if let Some((node, leads)) = &self.only_while_leading {
            // The flusher is idle (`wait_flushed` above), so appends may change path here.
            use openraft::vote::RaftLeaderId;
            leads.store(vote.is_committed() && vote.leader_id().node_id() == node, Ordering::Release);
        }
        Ok(())
    }

    /// Stored only every [`COMMITTED_SAVE_EVERY`] entries, and not flushed on its own: a
    /// committed index that is older or lost in a crash only makes the restarted node wait
    /// for the leader before re-applying the rest, which is safe. Stored at every commit,
    /// it was a sled write (and sled's I/O threads' `sync_file_range`) per Raft write.
    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let index = committed.map_or(0, |c| c.index);
        let previous = self.committed.swap(index, Ordering::Relaxed);
        let saved = self.committed_saved.load(Ordering::Relaxed);
        if previous != 0 && index < saved.saturating_add(COMMITTED_SAVE_EVERY) {
            return Ok(());
        }
        self.committed_saved.store(index, Ordering::Relaxed);
        let bytes = serde_json::to_vec(&committed).map_err(io_err)?;
        self.backend.insert(Tree::Meta, COMMITTED, bytes).map_err(io_err)
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.read_json::<Option<LogId>>(Tree::Meta, COMMITTED)?.flatten())
    }

    /// Returns once the entries are written and readable; `callback` runs once they are
    /// durable: here, or on the flusher thread when there is one.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        if let Err(e) = self.removal_fault() {
            callback.io_completed(Err(io_err(&e)));
            return Err(e);
        }
        let flusher = self.flusher_now();
        let written = match flusher {
            Some(_) => self.write_entries(entries),
            None => {
                self.slow_disk().await;
                self.append_durably(entries).map(|()| None)
            }
        };
        match (written, flusher) {
            // Even an append of nothing waits its turn: openraft takes its callback as
            // "everything appended so far is durable" (index 0 leaves the watermark alone).
            (Ok(last), Some(flusher)) => flusher.queue(last.unwrap_or(0), callback).map_err(io_err),
            (Ok(_), _) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            (Err(e), _) => {
                callback.io_completed(Err(io_err(&e)));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> io::Result<()> {
        self.wait_flushed()?;
        let from = last.map_or(0, |l| l.index + 1);
        self.recent.lock().expect("recent entries lock").truncate(from);
        self.backend.remove_range(Tree::Logs, &key(from), None).and_then(|_| self.backend.flush_tree(Tree::Logs)).map_err(io_err)?;
        self.watermark.reset_to(from.saturating_sub(1)).map_err(io_err)
    }

    /// openraft awaits this inside its core, which meanwhile sends no heartbeat: removing
    /// a 10,000-host log's 1,167 entries (about 150 MB) there took 400 ms, and a follower
    /// elected itself. So only the purge point is recorded here; with
    /// `with_background_io` the entries are removed on a thread of their own. Entries
    /// at or below the purge point are never read again, and a crash before they are gone
    /// leaves them behind the recorded point, where the next purge removes them.
    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.removal_fault()?;
        self.wait_flushed()?;
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
        std::thread::Builder::new().name("log-purge".into()).spawn(remove).map(drop).map_err(io_err)
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
                let entry = Entry { log_id: log_id(1, i), payload: EntryPayload::Normal(crate::state::Proposal::one(request).unwrap()) };
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
        store.purge(log_id(1, 9)).await.unwrap();
        assert!(store.limited_get_log_entries(0, 15).await.unwrap().is_empty());
        // Other readers get what exists of a range that starts before the log.
        assert_eq!(store.try_get_log_entries(5..15).await.unwrap().first().map(|e| e.log_id.index), Some(10));
        let kept = store.limited_get_log_entries(10, 15).await.unwrap();
        assert_eq!(kept.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (10..15).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn purged_entries_are_removed_in_the_background_and_a_failed_removal_stops_the_next_write() {
        let mut store = log_of_sized_entries(20, 16).with_background_io(true).unwrap();
        let upto = log_id(1, 9);
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
        let later = log_id(1, 12);
        let err = store.purge(later).await.unwrap_err().to_string();
        assert!(err.contains("removing purged log entries failed earlier: injected"), "{err}");
        assert_eq!(store.get_log_state().await.unwrap().last_purged_log_id, Some(upto), "a purge after a fault records nothing");
    }

    /// The vote reads back as stored (openraft demotes a restarted leader: `read_vote`).
    #[tokio::test]
    async fn a_vote_reads_back_as_stored() {
        let mut store = LogStore::open(Arc::new(MemBackend::new()), Watermark::disabled()).unwrap();
        store.save_vote(&Vote::new_committed(7, 2)).await.unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new_committed(7, 2)));
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
        Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(crate::state::Proposal::one(request).unwrap()) }
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
        store.truncate_after(Some(log_id(1, 34))).await.unwrap();
        store.append_durably((35..=38).map(|i| sized_entry(2, i, 100))).unwrap();
        assert_reads_agree(&store);

        store.purge(log_id(2, 36)).await.unwrap();
        assert_reads_agree(&store);
        assert_eq!(store.recent.lock().unwrap().first_index(), Some(37));
    }

    /// A backend whose flushes wait while `held` is set (for at most 10 s: a test that
    /// flushes where it must not then sees the flush done, and fails rather than hangs), and
    /// fail once `fail` is set.
    #[derive(Default)]
    struct HeldFlushes {
        inner: MemBackend,
        held: std::sync::atomic::AtomicBool,
        fail: std::sync::atomic::AtomicBool,
    }

    impl KvBackend for HeldFlushes {
        fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, crate::storage::BackendError> {
            self.inner.get(tree, key)
        }
        fn insert_batch(&self, tree: Tree, items: crate::storage::KvPairs) -> Result<(), crate::storage::BackendError> {
            self.inner.insert_batch(tree, items)
        }
        fn remove_range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>) -> Result<(), crate::storage::BackendError> {
            self.inner.remove_range(tree, from, to)
        }
        fn range(
            &self,
            tree: Tree,
            from: &[u8],
            to: Option<&[u8]>,
            limit: usize,
        ) -> Result<crate::storage::KvPairs, crate::storage::BackendError> {
            self.inner.range(tree, from, to, limit)
        }
        fn last(&self, tree: Tree) -> Result<Option<crate::storage::KvPair>, crate::storage::BackendError> {
            self.inner.last(tree)
        }
        fn flush(&self) -> Result<(), crate::storage::BackendError> {
            for _ in 0..10_000 {
                if !self.held.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(crate::storage::BackendError::new("flush", Tree::Logs, "injected: no space left on device"));
            }
            self.inner.flush()
        }
    }

    fn flushed() -> (IOFlushed<TypeConfig>, tokio::sync::oneshot::Receiver<io::Result<()>>) {
        use openraft::type_config::TypeConfigExt;
        let (tx, rx) = TypeConfig::oneshot();
        (IOFlushed::signal(tx), rx)
    }

    /// With the flusher, `append` returns with its entries readable and not yet durable;
    /// the callback runs once they are, and a vote waits for them (the log's writes
    /// complete in order).
    #[tokio::test]
    async fn appended_entries_are_readable_at_once_and_durable_before_the_callback_and_the_next_vote() {
        let backend = Arc::new(HeldFlushes::default());
        let mut store = LogStore::open(backend.clone(), Watermark::disabled()).unwrap().with_background_io(true).unwrap();
        backend.held.store(true, Ordering::SeqCst);
        let (callback, mut done) = flushed();
        store.append((1..=3).map(|i| sized_entry(1, i, 10)), callback).await.unwrap();
        assert_eq!(store.try_get_log_entries(1..=3).await.unwrap().len(), 3, "readable when append returns");
        assert!(done.try_recv().is_err(), "the append flushed before it returned");
        backend.held.store(false, Ordering::SeqCst);
        store.save_vote(&Vote::new(2, 1)).await.unwrap();
        assert!(done.try_recv().expect("the vote overtook the append's flush").is_ok());

        // An append of nothing is not durable before the appends queued ahead of it.
        backend.held.store(true, Ordering::SeqCst);
        let (callback, mut first) = flushed();
        store.append([sized_entry(1, 4, 10)], callback).await.unwrap();
        let (callback, mut nothing) = flushed();
        store.append(std::iter::empty(), callback).await.unwrap();
        assert!(nothing.try_recv().is_err(), "an empty append completed ahead of a queued one");
        backend.held.store(false, Ordering::SeqCst);
        store.save_vote(&Vote::new(3, 1)).await.unwrap();
        assert!(first.try_recv().unwrap().is_ok() && nothing.try_recv().unwrap().is_ok());
    }

    /// With `flushing_in_background_only_while_leading`, a follower's `append` flushes
    /// before it returns; once the node saves a granted vote of its own (it leads), the
    /// flusher takes its appends; a vote for another node makes it flush in place again.
    #[tokio::test]
    async fn only_the_leaders_appends_go_to_the_flusher() {
        let backend = Arc::new(HeldFlushes::default());
        let mut store = LogStore::open(backend.clone(), Watermark::disabled())
            .unwrap()
            .with_background_io(true)
            .unwrap()
            .flushing_in_background_only_while_leading(1);
        let mut index = 0;
        let mut append = async |store: &mut LogStore<HeldFlushes>| {
            index += 1;
            let (callback, mut done) = flushed();
            store.append([sized_entry(1, index, 10)], callback).await.unwrap();
            done.try_recv().is_ok()
        };
        assert!(append(&mut store).await, "a follower (it has no vote yet) flushes in place");
        store.save_vote(&Vote::new(2, 1)).await.unwrap();
        assert!(append(&mut store).await, "a candidate flushes in place");
        store.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        backend.held.store(true, Ordering::SeqCst);
        assert!(!append(&mut store).await, "the leader's append returns before its flush");
        backend.held.store(false, Ordering::SeqCst);
        store.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        assert!(append(&mut store).await, "following node 2, it flushes in place again");
    }

    /// A flush that fails fails the append's callback and every later write of the log.
    #[tokio::test]
    async fn a_failed_background_flush_fails_the_callback_and_the_writes_after_it() {
        let backend = Arc::new(HeldFlushes::default());
        let mut store = LogStore::open(backend.clone(), Watermark::disabled()).unwrap().with_background_io(true).unwrap();
        backend.fail.store(true, Ordering::SeqCst);
        let (callback, done) = flushed();
        store.append([sized_entry(1, 1, 10)], callback).await.unwrap();
        let err = done.await.unwrap().unwrap_err().to_string();
        assert!(err.contains("no space left on device"), "{err}");
        let (callback, done) = flushed();
        assert!(store.append([sized_entry(1, 2, 10)], callback).await.is_err());
        assert!(done.await.unwrap().is_err());
        let err = store.save_vote(&Vote::new(2, 1)).await.unwrap_err().to_string();
        assert!(err.contains("flushing the Raft log failed earlier"), "{err}");
    }
}
