//! The Raft log in segment files of our own, written on the caller's thread and made
//! durable with `fdatasync`.
//!
//! Why not sled (where the log was until format version 6): sled 0.34 hands every flush to
//! its I/O thread pool and wakes all of the pool's idle threads for it, and keeps the log in
//! its tree and page cache besides. With a single client that was a third of the CPU of each
//! write (0.92 of 2.6 ms, `perf sched`, README "Consensus"), on a write path that needs one
//! `pwrite` and one `fdatasync`. sled's flush is also weaker (`sync_file_range`: neither the
//! file's size nor the drive's cache) than the `fdatasync` used here. No maintained crate
//! offers an append-only log with truncation at its end, purging at its start and
//! checksummed records on our storage trait, so this is ours: a Raft log is appended at its
//! end, cut at its end (a new leader's entries replace a follower's) and purged from its
//! start (after a snapshot), and that is all this supports.
//!
//! Layout, in one directory:
//! - `<index>.seg` (the index in 20 digits): a segment, whose first record is that index.
//!   A segment is a run of records `[payload length: u32 LE][CRC-32 of the index and the
//!   payload: u32 LE][index: u64 LE][payload]` with increasing indexes, and each segment
//!   continues the one before it. Appends go to the newest; a new one starts once it holds
//!   [`SEGMENT_BYTES`]. (Raft's indexes are consecutive; that a log has no hole is the log
//!   store's check at start, `raft::LogStore::open`, as for any backend.)
//! - A segment is allocated ahead of its appends, [`ALLOCATION_STEP`] at a time up to
//!   [`SEGMENT_BYTES`] (`fallocate`, reading as zeros), and its records end at the first
//!   header of zeros (no record's is: its CRC-32 is not 0) or at the file's end. Why: an
//!   append then changes neither the file's size nor its allocation, so the `fdatasync` on
//!   every follower's answer writes the data alone and not the inode through ext4's journal
//!   too (a 450-byte append and its flush: median 0.08-0.11 against 0.11-0.17 ms, mean
//!   0.10-0.15 against 0.20-0.24 ms, on this project's 2-core test VM); etcd's WAL
//!   allocates its segments ahead for the same reason. In steps, not whole: a small disk
//!   still takes a segment, and a full one still stops the node within a step of log.
//! - `START`: the first index not purged (absent: none purged). Records below it are
//!   purged; a segment that holds only such records is removed.
//!
//! At open every record is read and checked. The one damage a crash can cause is a torn
//! write at the end of the newest segment (cut short by the crash, never acknowledged,
//! since an append is acknowledged only after its `fdatasync`): a last record that the
//! file's end cuts short, or a record whose checksum does not match and one of whose disk
//! sectors ([`SECTOR`] bytes at its offset in the file) is still all zeros, as allocated.
//! That record and everything after it are cut off, with a warning (etcd's WAL has the same
//! rule for a torn record). Anything else (a checksum that does not match with every
//! sector written, a length beyond [`MAX_RECORD_BYTES`], indexes out of order, records that
//! end early in a segment that is not the newest) is an error naming the file and the
//! offset, and the node refuses to start; so is a log that lost what it had reported
//! durable (`watermark`), whatever the rule took for torn. At open, the newest segment is
//! cut at the end of its records (its next append allocates it ahead again), so that no byte of an interrupted
//! write stays past them, where a later, shorter append could leave it to be read as a
//! record.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::backend::{KvPair, KvPairs};
use super::{BackendError, Tree};

/// A segment takes no more appends once it holds this many bytes (one append may take it
/// over). Purging removes whole segments, so this is also how much purged log a node keeps
/// on disk at most.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Largest payload of one record: an entry reaches a follower in one peer message
/// (`raft::network::MAX_PEER_MESSAGE`), so a larger length is damage, and nothing larger is
/// ever allocated for one while reading.
pub const MAX_RECORD_BYTES: usize = crate::raft::MAX_PEER_MESSAGE;

const HEADER: usize = 16;
/// The unit a disk writes whole, and so what a torn write leaves unwritten: a record with
/// such a run of zeros at a multiple of it in the file was cut short.
const SECTOR: u64 = 512;
const SUFFIX: &str = ".seg";
const START: &str = "START";

fn record_crc(index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// How far ahead of its appends a segment is allocated at a time: one flush in this many
/// bytes of log writes the inode.
pub const ALLOCATION_STEP: u64 = 1024 * 1024;

/// What allocating ahead came to.
enum Allocated {
    /// The file is this long now.
    To(u64),
    /// No room for the step (the write itself may still fit: it decides).
    NoRoom,
    /// The file system has no `fallocate`: appends grow the file, as they would anyway.
    Unsupported,
}

/// Allocates `file` to `bytes` (it never shrinks), reading as zeros where nothing was written.
fn allocate(file: &File, bytes: u64) -> std::io::Result<Allocated> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, bytes) {
        Ok(()) => Ok(Allocated::To(bytes)),
        Err(rustix::io::Errno::NOSPC) => Ok(Allocated::NoRoom),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(Allocated::Unsupported),
        Err(e) => Err(e.into()),
    }
}

/// Whether a record that fails its check (its bytes from the header on, at `offset` in
/// the file, as far as the file goes) is a torn write: one of the disk sectors it covers is
/// all zeros over the part it covers. A whole record is never zero there in a sector: a
/// header holds a non-zero CRC and the payloads, JSON, hold no zero byte.
fn torn(offset: u64, record: &[u8]) -> bool {
    let mut at = 0usize;
    while at < record.len() {
        let sector_end = ((offset + at as u64) / SECTOR + 1) * SECTOR - offset;
        let end = (sector_end as usize).min(record.len());
        if record[at..end].iter().all(|&b| b == 0) {
            return true;
        }
        at = end;
    }
    false
}

/// Why a segment's records end before its file does.
enum End {
    /// At a header of zeros: the rest was allocated and never written.
    Zeros,
    /// At a torn write (named), which is cut off with what follows it.
    Torn(&'static str),
}

/// Where one record's payload is.
#[derive(Clone, Copy)]
struct Slot {
    /// The segment's first index (its name).
    segment: u64,
    /// Offset of the payload in it.
    offset: u64,
    len: u32,
}

struct Segment {
    file: Arc<File>,
    /// Bytes of whole records in it.
    len: u64,
    /// The file's size: what was allocated ahead, or written.
    size: u64,
}

#[derive(Default)]
struct State {
    /// By first index.
    segments: BTreeMap<u64, Segment>,
    /// Every live record, by index.
    slots: BTreeMap<u64, Slot>,
    /// The first index not purged, as in `START` (0: none purged).
    start: u64,
    /// Segments written since the last sync.
    unsynced: Vec<u64>,
    /// A segment was created since the last sync: its directory entry must be made durable.
    created: bool,
    /// The file system has no `fallocate`: not tried again.
    no_fallocate: bool,
}

impl State {
    fn first(&self) -> Option<u64> {
        self.slots.first_key_value().map(|(&i, _)| i)
    }

    fn last(&self) -> Option<u64> {
        self.slots.last_key_value().map(|(&i, _)| i)
    }
}

pub struct LogFiles {
    dir: PathBuf,
    segment_bytes: u64,
    state: Mutex<State>,
    /// Held through a whole [`LogFiles::sync`]: a sync that finds nothing left to sync
    /// because another took it must still return only once that other's `fdatasync` did
    /// (the log store's append and its background purge both sync).
    syncing: Mutex<()>,
}

fn decode_index(key: &[u8], op: &'static str) -> Result<u64, BackendError> {
    let bytes: [u8; 8] =
        key.try_into().map_err(|_| BackendError::new(op, Tree::Logs, format!("a log key is an 8-byte index; got {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

/// The keys `[from, to)` (`to` `None`: to the end) as map bounds; `None` when empty (a
/// `BTreeMap` range whose start is past its end panics).
fn key_range(from: u64, to: Option<u64>) -> Option<(Bound<u64>, Bound<u64>)> {
    match to {
        Some(t) if t <= from => None,
        Some(t) => Some((Bound::Included(from), Bound::Excluded(t))),
        None => Some((Bound::Included(from), Bound::Unbounded)),
    }
}

fn segment_name(first: u64) -> String {
    format!("{first:020}{SUFFIX}")
}

impl LogFiles {
    /// Opens (creating) the log in `dir`, reading and checking every record.
    pub fn open(dir: &Path) -> Result<Self, BackendError> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    /// As [`LogFiles::open`], with segments of `segment_bytes` (tests use small ones).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<Self, BackendError> {
        let log = LogFiles { dir: dir.to_path_buf(), segment_bytes, state: Mutex::new(State::default()), syncing: Mutex::new(()) };
        fs::create_dir_all(dir).map_err(|e| log.error("open", e))?;
        let start = log.read_start()?;
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| log.error("open", e))? {
            let name = entry.map_err(|e| log.error("open", e))?.file_name().to_string_lossy().into_owned();
            if name == START {
                continue;
            }
            if name == format!("{START}.tmp") {
                fs::remove_file(dir.join(&name)).map_err(|e| log.error("open", e))?;
                continue;
            }
            match name.strip_suffix(SUFFIX).and_then(|n| n.parse::<u64>().ok()) {
                Some(first) if segment_name(first) == name => names.push(first),
                _ => return Err(log.error("open", format!("unexpected file {name:?}"))),
            }
        }
        names.sort_unstable();
        let mut state = State { start, ..State::default() };
        let mut previous = None;
        for (n, &first) in names.iter().enumerate() {
            let newest = n + 1 == names.len();
            previous = log.load_segment(&mut state, first, previous, newest)?.or(previous);
        }
        // Segments that hold only purged records (a crash came before their removal): those
        // before the first live record's, or all when none is live.
        let first_live = state.slots.first_key_value().map(|(_, s)| s.segment);
        let stale: Vec<u64> = state.segments.keys().copied().filter(|&s| first_live.is_none_or(|f| s < f)).collect();
        for s in stale {
            state.segments.remove(&s);
            fs::remove_file(dir.join(segment_name(s))).map_err(|e| log.error("open", e))?;
        }
        *log.state.lock().expect("log files lock") = state;
        Ok(log)
    }

    fn error(&self, op: &'static str, what: impl std::fmt::Display) -> BackendError {
        BackendError::new(op, Tree::Logs, format!("{}: {what}", self.dir.display()))
    }

    fn read_start(&self) -> Result<u64, BackendError> {
        let path = self.dir.join(START);
        match fs::read_to_string(&path) {
            Ok(text) => text.trim().parse::<u64>().map_err(|_| self.error("open", format!("{START} is damaged: {text:?}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(self.error("open", format!("{START}: {e}"))),
        }
    }

    /// Reads segment `first`'s records into `state`, checking each and that they follow
    /// `previous` (the index of the record before them). In the `newest` segment a torn last
    /// write is cut off, and the file is cut at the end of its records (module doc); the
    /// next append allocates it ahead again. Returns the index of its last record.
    fn load_segment(&self, state: &mut State, first: u64, mut previous: Option<u64>, newest: bool) -> Result<Option<u64>, BackendError> {
        let path = self.dir.join(segment_name(first));
        let damaged = |offset: u64, what: String| self.error("open", format!("{} is damaged at offset {offset}: {what}", path.display()));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| self.error("open", format!("{}: {e}", path.display())))?;
        let size = file.metadata().map_err(|e| self.error("open", e))?.len();
        let mut reader = BufReader::with_capacity(1 << 20, &file);
        let mut offset = 0u64;
        let mut last = None;
        let mut payload = Vec::new();
        let mut end = None;
        while offset < size {
            let remaining = size - offset;
            if remaining < HEADER as u64 {
                let mut rest = vec![0u8; remaining as usize];
                reader.read_exact(&mut rest).map_err(|e| damaged(offset, e.to_string()))?;
                end = Some(if rest.iter().all(|&b| b == 0) { End::Zeros } else { End::Torn("an incomplete last record") });
                break;
            }
            let mut header = [0u8; HEADER];
            reader.read_exact(&mut header).map_err(|e| damaged(offset, e.to_string()))?;
            if header == [0; HEADER] {
                end = Some(End::Zeros);
                break;
            }
            let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
            if len as usize > MAX_RECORD_BYTES {
                return Err(damaged(offset, format!("a record of {len} bytes, over the bound of {MAX_RECORD_BYTES}")));
            }
            if remaining < (HEADER + len as usize) as u64 {
                end = Some(End::Torn("an incomplete last record"));
                break;
            }
            let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
            let index = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
            payload.resize(len as usize, 0);
            reader.read_exact(&mut payload).map_err(|e| damaged(offset, e.to_string()))?;
            if record_crc(index, &payload) != crc {
                if newest && torn(offset, &[&header[..], &payload].concat()) {
                    end = Some(End::Torn("a record with a sector never written"));
                    break;
                }
                return Err(damaged(offset, format!("the checksum of the record of index {index} does not match")));
            }
            if last.is_none() && index != first {
                return Err(damaged(offset, format!("the first record is of index {index}, not of the index the file is named after")));
            }
            if let Some(p) = previous.filter(|&p| index <= p) {
                return Err(damaged(offset, format!("a record of index {index} follows one of index {p}")));
            }
            if index >= state.start {
                state.slots.insert(index, Slot { segment: first, offset: offset + HEADER as u64, len });
            }
            offset += (HEADER + len as usize) as u64;
            previous = Some(index);
            last = Some(index);
        }
        match end {
            Some(End::Torn(what)) if !newest => {
                return Err(damaged(offset, format!("{what} in a segment that is not the newest")));
            }
            // A segment is full before the next one starts (it takes appends until it holds
            // `segment_bytes`, and a cut makes it the newest), so it has no zeros left.
            Some(End::Zeros) if !newest => {
                return Err(damaged(offset, format!("its records end at {offset} of {size} bytes in a segment that is not the newest")));
            }
            Some(End::Torn(what)) => {
                tracing::warn!(file = %path.display(), offset, bytes = size - offset, "cutting off {what} at the end of the Raft log (a write a crash interrupted)");
            }
            _ => {}
        }
        if newest && end.is_some() {
            file.set_len(offset)
                .and_then(|_| file.sync_all())
                .map_err(|e| damaged(offset, format!("cutting it at the end of its records: {e}")))?;
        }
        let size = if end.is_some() && newest { offset } else { size };
        state.segments.insert(first, Segment { file: Arc::new(file), len: offset, size });
        Ok(last)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        let index = decode_index(key, "get")?;
        let state = self.state.lock().expect("log files lock");
        state.slots.get(&index).map(|&slot| self.read(&state, slot)).transpose()
    }

    fn read(&self, state: &State, slot: Slot) -> Result<Vec<u8>, BackendError> {
        let segment = state.segments.get(&slot.segment).ok_or_else(|| self.error("read", format!("segment {} is gone", slot.segment)))?;
        let mut buf = vec![0u8; slot.len as usize];
        segment
            .file
            .read_exact_at(&mut buf, slot.offset)
            .map_err(|e| self.error("read", format!("{}: {e}", segment_name(slot.segment))))?;
        Ok(buf)
    }

    /// Appends `items`, whose keys must be increasing indexes after the last. Durable after
    /// [`Self::sync`] (an append to an empty log below the purge point moves that point
    /// down at once).
    pub fn insert_batch(&self, items: KvPairs) -> Result<(), BackendError> {
        let mut state = self.state.lock().expect("log files lock");
        let mut last = state.last();
        let mut buf = Vec::new();
        let mut slots = Vec::with_capacity(items.len());
        for (key, value) in &items {
            let index = decode_index(key, "insert")?;
            if let Some(l) = last.filter(|&l| index <= l) {
                return Err(self.error("insert", format!("index {index} is not after the last index {l} (a log is appended at its end)")));
            }
            if value.len() > MAX_RECORD_BYTES {
                return Err(
                    self.error("insert", format!("log entry {index} is {} bytes, over the bound of {MAX_RECORD_BYTES}", value.len()))
                );
            }
            buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
            buf.extend_from_slice(&record_crc(index, value).to_le_bytes());
            buf.extend_from_slice(&index.to_le_bytes());
            let payload_at = buf.len() as u64;
            buf.extend_from_slice(value);
            slots.push((index, payload_at, value.len() as u32));
            last = Some(index);
        }
        let Some(&(first_index, _, _)) = slots.first() else { return Ok(()) };
        if state.slots.is_empty() && !state.segments.is_empty() {
            // The segments hold only purged records (a purge or a cut emptied the log): they
            // go, so that no purged record can come back, or sit above the new ones.
            self.remove_segments(&mut state, |_| true)?;
            self.sync_dir("insert")?;
        }
        if first_index < state.start {
            // Into an empty log: the records must not be hidden as purged when the log is
            // opened again.
            self.write_start(&mut state, first_index)?;
        }
        // An empty newest segment (a crash came between its creation and its first write)
        // takes this batch only if it is named after the batch's first index.
        if let Some((&name, newest)) = state.segments.last_key_value() {
            if newest.len == 0 && name != first_index {
                self.remove_segments(&mut state, |s| s == name)?;
            }
        }
        let roll = state.segments.last_key_value().is_none_or(|(_, newest)| newest.len >= self.segment_bytes);
        if roll {
            let path = self.dir.join(segment_name(first_index));
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| self.error("insert", format!("{}: {e}", path.display())))?;
            state.segments.insert(first_index, Segment { file: Arc::new(file), len: 0, size: 0 });
            state.created = true;
        }
        self.allocate_ahead(&mut state, buf.len() as u64)?;
        let (&name, segment) = state.segments.last_key_value().expect("a segment");
        let at = segment.len;
        if let Err(e) = segment.file.write_all_at(&buf, at) {
            // Leave no partial record behind the last whole one.
            let _ = segment.file.set_len(at);
            state.segments.get_mut(&name).expect("the newest segment").size = at;
            return Err(self.error("insert", format!("{}: {e}", segment_name(name))));
        }
        let segment = state.segments.get_mut(&name).expect("the newest segment");
        segment.len += buf.len() as u64;
        segment.size = segment.size.max(segment.len);
        state.slots.extend(slots.into_iter().map(|(index, payload_at, len)| (index, Slot { segment: name, offset: at + payload_at, len })));
        if !state.unsynced.contains(&name) {
            state.unsynced.push(name);
        }
        Ok(())
    }

    /// Allocates the newest segment ahead of a write of `bytes` at its end, if the write goes
    /// past what is allocated and the segment is not full (module doc).
    fn allocate_ahead(&self, state: &mut State, bytes: u64) -> Result<(), BackendError> {
        let no_fallocate = state.no_fallocate;
        let (&name, segment) = state.segments.iter_mut().next_back().expect("a segment");
        let end = segment.len + bytes;
        let to = end.next_multiple_of(ALLOCATION_STEP).min(self.segment_bytes);
        if no_fallocate || end <= segment.size || end > to {
            return Ok(());
        }
        match allocate(&segment.file, to).map_err(|e| self.error("insert", format!("allocating {}: {e}", segment_name(name))))? {
            Allocated::To(size) => segment.size = size,
            Allocated::NoRoom => {}
            Allocated::Unsupported => state.no_fallocate = true,
        }
        Ok(())
    }

    /// Makes every earlier write durable: `fdatasync` of each segment written since the last
    /// sync (outside the lock, so readers never wait for the disk), and of the directory when
    /// a segment was created.
    pub fn sync(&self) -> Result<(), BackendError> {
        let _one_at_a_time = self.syncing.lock().expect("log files sync lock");
        let (files, created) = {
            let mut state = self.state.lock().expect("log files lock");
            let names = std::mem::take(&mut state.unsynced);
            let files: Vec<(u64, Arc<File>)> =
                names.into_iter().filter_map(|n| state.segments.get(&n).map(|s| (n, s.file.clone()))).collect();
            (files, std::mem::take(&mut state.created))
        };
        for (name, file) in files {
            file.sync_data().map_err(|e| self.error("flush", format!("{}: {e}", segment_name(name))))?;
        }
        if created {
            self.sync_dir("flush")?;
        }
        Ok(())
    }

    fn sync_dir(&self, op: &'static str) -> Result<(), BackendError> {
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| self.error(op, e))
    }

    /// Removes keys in `[from, to)`: a suffix (every key from `from` on), a prefix (every
    /// key below `to`), or both; a range with stored keys on both sides is refused. A removed
    /// suffix is durable when this returns (it may remove records the node acknowledged,
    /// which must not come back); a removed prefix is recorded in `START` first, so its
    /// records never come back either.
    pub fn remove_range(&self, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError> {
        let from = decode_index(from, "remove")?;
        let to = to.map(|t| decode_index(t, "remove")).transpose()?;
        let mut state = self.state.lock().expect("log files lock");
        if to.is_some_and(|t| t <= from) {
            return Ok(());
        }
        let (Some(first), Some(last)) = (state.first(), state.last()) else {
            // Nothing stored: only a purge point to move.
            return match to {
                Some(to) if to > state.start => self.write_start(&mut state, to),
                _ => Ok(()),
            };
        };
        let suffix = to.is_none_or(|t| t > last);
        let prefix = from <= first;
        match (prefix, suffix, to) {
            (true, _, Some(to)) => self.purge_to(&mut state, to),
            (_, true, _) => match state.slots.range(from..).next().map(|(&i, _)| i) {
                Some(cut) => self.cut_from(&mut state, cut),
                None => Ok(()),
            },
            _ if key_range(from, to).is_none_or(|keys| state.slots.range(keys).next().is_none()) => Ok(()),
            _ => Err(self
                .error("remove", format!("only a prefix or a suffix of the log is removed; [{from}, {to:?}) is inside [{first}, {last}]"))),
        }
    }

    /// Removes index `from` and everything after it: later segments first, then the rest
    /// of the segment that holds it, so that a crash in between leaves a log that ends
    /// early and still has no hole.
    fn cut_from(&self, state: &mut State, from: u64) -> Result<(), BackendError> {
        let slot = state.slots[&from];
        let cut_at = slot.offset - HEADER as u64;
        // A segment cut at its first record goes too: a segment is named after its first.
        let from_segment = if cut_at == 0 { slot.segment } else { slot.segment + 1 };
        if state.segments.range(from_segment..).next().is_some() {
            self.remove_segments(state, |s| s >= from_segment)?;
            self.sync_dir("remove")?;
        }
        if let Some(segment) = state.segments.get_mut(&slot.segment) {
            segment
                .file
                .set_len(cut_at)
                .and_then(|_| segment.file.sync_data())
                .map_err(|e| self.error("remove", format!("{}: {e}", segment_name(slot.segment))))?;
            segment.len = cut_at;
            segment.size = cut_at;
        }
        state.slots.split_off(&from);
        Ok(())
    }

    /// Purges every index below `to`: records the purge point, then removes the segments
    /// that hold nothing else (their removal need not be durable: `START` hides them).
    fn purge_to(&self, state: &mut State, to: u64) -> Result<(), BackendError> {
        // Never down: records below the old point may still be on disk.
        if to > state.start {
            self.write_start(state, to)?;
        }
        state.slots = state.slots.split_off(&to);
        let keep_from = state.slots.first_key_value().map(|(_, s)| s.segment);
        self.remove_segments(state, |s| keep_from.is_none_or(|k| s < k))
    }

    /// Removes the segments whose names `which` picks.
    fn remove_segments(&self, state: &mut State, which: impl Fn(u64) -> bool) -> Result<(), BackendError> {
        let gone: Vec<u64> = state.segments.keys().copied().filter(|&s| which(s)).collect();
        for s in gone {
            state.segments.remove(&s);
            state.unsynced.retain(|&u| u != s);
            fs::remove_file(self.dir.join(segment_name(s))).map_err(|e| self.error("remove", format!("{}: {e}", segment_name(s))))?;
        }
        Ok(())
    }

    fn write_start(&self, state: &mut State, start: u64) -> Result<(), BackendError> {
        let tmp = self.dir.join(format!("{START}.tmp"));
        let write = || -> std::io::Result<()> {
            fs::write(&tmp, format!("{start}\n"))?;
            File::open(&tmp)?.sync_all()?;
            fs::rename(&tmp, self.dir.join(START))
        };
        write().map_err(|e| self.error("remove", format!("{START}: {e}")))?;
        self.sync_dir("remove")?;
        state.start = start;
        Ok(())
    }

    /// Pairs with keys in `[from, to)` in order, at most `limit`.
    pub fn range(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError> {
        let from = decode_index(from, "scan")?;
        let to = to.map(|t| decode_index(t, "scan")).transpose()?;
        let state = self.state.lock().expect("log files lock");
        let mut out = Vec::new();
        let Some(keys) = key_range(from, to) else { return Ok(out) };
        for (&index, &slot) in state.slots.range(keys).take(limit) {
            out.push((index.to_be_bytes().to_vec(), self.read(&state, slot)?));
        }
        Ok(out)
    }

    /// The keys of [`LogFiles::range`], from the index kept in memory: no file is read.
    pub fn keys(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<Vec<Vec<u8>>, BackendError> {
        let from = decode_index(from, "scan")?;
        let to = to.map(|t| decode_index(t, "scan")).transpose()?;
        let state = self.state.lock().expect("log files lock");
        let Some(keys) = key_range(from, to) else { return Ok(Vec::new()) };
        Ok(state.slots.range(keys).take(limit).map(|(index, _)| index.to_be_bytes().to_vec()).collect())
    }

    pub fn last(&self) -> Result<Option<KvPair>, BackendError> {
        let state = self.state.lock().expect("log files lock");
        let Some((&last, &slot)) = state.slots.last_key_value() else { return Ok(None) };
        Ok(Some((last.to_be_bytes().to_vec(), self.read(&state, slot)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{KvBackend, MemBackend};

    fn k(i: u64) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    fn entries(range: std::ops::RangeInclusive<u64>, bytes: usize) -> KvPairs {
        range.map(|i| (k(i), vec![(i % 251) as u8; bytes])).collect()
    }

    fn segments(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(SUFFIX))
            .collect();
        names.sort();
        names
    }

    /// Everything the log holds equals what the reference holds.
    fn assert_same(log: &LogFiles, reference: &MemBackend, what: &str) {
        assert_eq!(log.range(&k(0), None, usize::MAX).unwrap(), reference.range(Tree::Logs, &k(0), None, usize::MAX).unwrap(), "{what}");
        assert_eq!(log.last().unwrap(), reference.last(Tree::Logs).unwrap(), "{what}");
        assert_eq!(log.keys(&k(0), None, usize::MAX).unwrap(), reference.keys(Tree::Logs, &k(0), None, usize::MAX).unwrap(), "{what}");
    }

    /// Appends, cuts at the end and purges at the start in a random order, over several
    /// segments, reopening after each sync: the files read back as the in-memory reference
    /// does, at every step and after every reopen.
    #[test]
    fn appends_cuts_and_purges_read_back_as_the_reference_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let reference = MemBackend::new();
        let mut log = LogFiles::open_with(dir.path(), 4096).unwrap();
        let mut seed = 11u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let (mut first, mut last) = (1u64, 0u64);
        for step in 0..600 {
            match next(10) {
                0..=5 => {
                    let batch = entries(last + 1..=last + 1 + next(8), next(900) as usize);
                    last += batch.len() as u64;
                    log.insert_batch(batch.clone()).unwrap();
                    reference.insert_batch(Tree::Logs, batch).unwrap();
                }
                6 if last >= first => {
                    let from = first + next(last - first + 1);
                    log.remove_range(&k(from), None).unwrap();
                    reference.remove_range(Tree::Logs, &k(from), None).unwrap();
                    last = from - 1;
                }
                7 if last >= first => {
                    // Sometimes below the first index: it must not bring purged records back.
                    let to = (first + next(last - first + 2)).saturating_sub(next(3) * 3);
                    log.remove_range(&k(0), Some(&k(to))).unwrap();
                    reference.remove_range(Tree::Logs, &k(0), Some(&k(to))).unwrap();
                    first = first.max(to);
                }
                _ => {
                    log.sync().unwrap();
                    drop(log);
                    log = LogFiles::open_with(dir.path(), 4096).unwrap();
                }
            }
            assert_same(&log, &reference, &format!("step {step}"));
            let (a, b) = (next(last + 3), next(last + 3));
            assert_eq!(
                log.keys(&k(a.min(b)), Some(&k(a.max(b))), 3).unwrap(),
                reference.keys(Tree::Logs, &k(a.min(b)), Some(&k(a.max(b))), 3).unwrap(),
                "step {step}"
            );
            assert_eq!(
                log.range(&k(a.min(b)), Some(&k(a.max(b))), 3).unwrap(),
                reference.range(Tree::Logs, &k(a.min(b)), Some(&k(a.max(b))), 3).unwrap(),
                "step {step}"
            );
            assert_eq!(log.get(&k(a)).unwrap(), reference.get(Tree::Logs, &k(a)).unwrap(), "step {step}");
        }
        assert!(segments(dir.path()).len() > 1, "the run must cross segments: {:?}", segments(dir.path()));
    }

    #[test]
    fn a_purge_removes_whole_segments_and_its_records_do_not_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFiles::open_with(dir.path(), 1000).unwrap();
        for i in 0..10 {
            log.insert_batch(entries(i * 10 + 1..=i * 10 + 10, 100)).unwrap();
        }
        log.sync().unwrap();
        assert_eq!(segments(dir.path()).len(), 10);
        log.remove_range(&k(0), Some(&k(35))).unwrap();
        // Segments 1-10, 11-20, 21-30 go; 31-40 stays for 35-40.
        assert_eq!(segments(dir.path()).first().map(String::as_str), Some("00000000000000000031.seg"));
        drop(log);
        let log = LogFiles::open_with(dir.path(), 1000).unwrap();
        assert_eq!(log.range(&k(0), None, 1).unwrap()[0].0, k(35));
        assert_eq!(log.get(&k(34)).unwrap(), None);
        // Purging past the end empties it; what is appended next reads back after a reopen,
        // even below the purge point (the purge point moves down for it).
        log.remove_range(&k(0), Some(&k(500))).unwrap();
        assert!(segments(dir.path()).is_empty());
        log.insert_batch(entries(400..=401, 1)).unwrap();
        log.sync().unwrap();
        drop(log);
        let log = LogFiles::open_with(dir.path(), 1000).unwrap();
        assert_eq!(log.range(&k(0), None, 10).unwrap().iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), vec![k(400), k(401)]);
    }

    #[test]
    fn only_appends_at_the_end_and_removals_at_either_end_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFiles::open(dir.path()).unwrap();
        log.insert_batch(entries(5..=10, 10)).unwrap();
        for (bad, needle) in [
            (entries(10..=10, 1), "index 10 is not after the last index 10"),
            (entries(7..=7, 1), "index 7 is not after the last index 10"),
            (vec![(b"short".to_vec(), vec![])], "a log key is an 8-byte index; got 5 bytes"),
        ] {
            let err = log.insert_batch(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        // An entry at the bound is taken; one byte more is refused, naming the bound.
        log.insert_batch(vec![(k(11), vec![0; MAX_RECORD_BYTES])]).unwrap();
        let err = log.insert_batch(vec![(k(12), vec![0; MAX_RECORD_BYTES + 1])]).unwrap_err().to_string();
        assert!(err.contains(&format!("over the bound of {MAX_RECORD_BYTES}")), "{err}");
        log.remove_range(&k(11), None).unwrap();
        let err = log.remove_range(&k(6), Some(&k(8))).unwrap_err().to_string();
        assert!(err.contains("only a prefix or a suffix"), "{err}");
        assert_eq!(log.range(&k(0), None, 100).unwrap().len(), 6, "refused writes change nothing");
    }

    fn write_three_segments(dir: &Path) {
        let log = LogFiles::open_with(dir, 2000).unwrap();
        for i in 0..3 {
            log.insert_batch(entries(i * 10 + 1..=i * 10 + 10, 200)).unwrap();
        }
        log.sync().unwrap();
    }

    fn flip(path: &Path, at: u64) {
        let mut bytes = fs::read(path).unwrap();
        bytes[at as usize] ^= 0xFF;
        fs::write(path, bytes).unwrap();
    }

    /// A missing segment reads as the hole it is, never renumbered or hidden: the log
    /// store's check at start refuses it (`a_log_with_a_hole_is_refused_at_start`).
    #[test]
    fn a_missing_segment_reads_as_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        write_three_segments(dir.path());
        fs::remove_file(dir.path().join(segment_name(11))).unwrap();
        let log = LogFiles::open_with(dir.path(), 2000).unwrap();
        let keys: Vec<u64> =
            log.range(&k(0), None, 100).unwrap().iter().map(|(k, _)| u64::from_be_bytes(k[..].try_into().unwrap())).collect();
        assert_eq!(keys, (1..=10).chain(21..=30).collect::<Vec<_>>());
        // The keys alone (what the check at start reads) show the same hole.
        assert_eq!(log.keys(&k(0), None, 100).unwrap(), keys.iter().map(|i| k(*i)).collect::<Vec<_>>());
    }

    #[test]
    fn an_incomplete_last_record_is_cut_off_and_the_rest_opens() {
        let dir = tempfile::tempdir().unwrap();
        write_three_segments(dir.path());
        let newest = dir.path().join(segment_name(21));
        let len = fs::metadata(&newest).unwrap().len();
        fs::OpenOptions::new().write(true).open(&newest).unwrap().set_len(len - 50).unwrap();
        let log = LogFiles::open_with(dir.path(), 2000).unwrap();
        assert_eq!(log.last().unwrap().unwrap().0, k(29));
        // The cut is on disk, and the log takes the lost index again.
        log.insert_batch(entries(30..=30, 3)).unwrap();
        log.sync().unwrap();
        drop(log);
        assert_eq!(LogFiles::open_with(dir.path(), 2000).unwrap().last().unwrap(), Some((k(30), vec![30; 3])));
    }

    /// Overwrites `len` bytes at `at` with zeros, as a write the disk never made leaves them.
    fn zero(path: &Path, at: u64, len: usize) {
        fs::OpenOptions::new().write(true).open(path).unwrap().write_all_at(&vec![0; len], at).unwrap();
    }

    /// Records 1-6 of 700 bytes in one segment of 16 KiB, synced: the file is allocated
    /// ahead to the segment's size (under a step) and the records end at its zeros.
    fn write_six_records(dir: &Path) -> PathBuf {
        let log = LogFiles::open_with(dir, 16384).unwrap();
        log.insert_batch(entries(1..=6, 700 - HEADER)).unwrap();
        log.sync().unwrap();
        let path = dir.join(segment_name(1));
        assert_eq!(fs::metadata(&path).unwrap().len(), 16384, "allocated ahead to the segment's size");
        path
    }

    #[test]
    fn records_end_at_the_allocated_zeros_and_appends_continue_there() {
        let dir = tempfile::tempdir().unwrap();
        write_six_records(dir.path());
        let path = dir.path().join(segment_name(1));
        let log = LogFiles::open_with(dir.path(), 16384).unwrap();
        assert_eq!(log.keys(&k(0), None, 100).unwrap(), (1..=6).map(k).collect::<Vec<_>>());
        assert_eq!(fs::metadata(&path).unwrap().len(), 4200, "cut at the end of its records at open");
        log.insert_batch(entries(7..=8, 10)).unwrap();
        log.sync().unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 16384, "allocated ahead again by the next append");
        drop(log);
        let log = LogFiles::open_with(dir.path(), 16384).unwrap();
        assert_eq!(log.range(&k(7), None, 100).unwrap(), entries(7..=8, 10));
    }

    /// A segment is allocated one step ahead of its appends, never past its size; the
    /// write that fills it goes past, and the next one starts a segment. (No room for a step
    /// leaves it to the writes: `chaos real`'s full disk, a 32 MiB tmpfs.)
    #[test]
    fn allocation_is_ahead_in_steps_up_to_the_segment_size() {
        let dir = tempfile::tempdir().unwrap();
        let segment = 3 * ALLOCATION_STEP;
        let log = LogFiles::open_with(dir.path(), segment).unwrap();
        let path = dir.path().join(segment_name(1));
        log.insert_batch(entries(1..=1, 100)).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), ALLOCATION_STEP);
        // A write across the step allocates the next; none goes past the segment's size.
        log.insert_batch(entries(2..=2, ALLOCATION_STEP as usize)).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * ALLOCATION_STEP);
        log.insert_batch(entries(3..=3, 2 * ALLOCATION_STEP as usize)).unwrap();
        let len = fs::metadata(&path).unwrap().len();
        assert!(len > segment, "the write that fills the segment goes past it: {len}");
        log.insert_batch(entries(4..=4, 10)).unwrap();
        assert_eq!(segments(dir.path()).len(), 2, "the full segment takes no more appends");
        log.sync().unwrap();
        drop(log);
        assert_eq!(LogFiles::open_with(dir.path(), segment).unwrap().keys(&k(0), None, 10).unwrap(), (1..=4).map(k).collect::<Vec<_>>());
    }

    /// A crash that wrote records 5 and 6 but not a sector of record 4: 4 is cut off with
    /// what follows it, and the file is cleared past the cut, so that a record 4 written
    /// again at the same length does not bring the old 5 and 6 back behind it.
    #[test]
    fn a_torn_write_is_cut_off_with_what_follows_and_never_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_six_records(dir.path());
        // Record 4 spans bytes 2100-2800: the sector at 2560 is inside it.
        zero(&path, 2560, SECTOR as usize);
        let log = LogFiles::open_with(dir.path(), 16384).unwrap();
        assert_eq!(log.last().unwrap().map(|(key, _)| key), Some(k(3)));
        let again = vec![(k(4), vec![b'x'; 700 - HEADER])];
        log.insert_batch(again.clone()).unwrap();
        log.sync().unwrap();
        drop(log);
        let log = LogFiles::open_with(dir.path(), 16384).unwrap();
        assert_eq!(log.range(&k(4), None, 100).unwrap(), again, "the old records 5 and 6 stay gone");
        // The same for a header never written, with the records after it written.
        drop(log);
        let dir = tempfile::tempdir().unwrap();
        let path = write_six_records(dir.path());
        zero(&path, 1400, HEADER);
        let log = LogFiles::open_with(dir.path(), 16384).unwrap();
        assert_eq!(log.last().unwrap().map(|(key, _)| key), Some(k(2)));
        log.insert_batch(entries(3..=3, 700 - HEADER)).unwrap();
        log.sync().unwrap();
        drop(log);
        assert_eq!(LogFiles::open_with(dir.path(), 16384).unwrap().last().unwrap().map(|(key, _)| key), Some(k(3)));
    }

    #[test]
    fn the_torn_write_rule_takes_a_record_with_a_zero_sector_only() {
        let record = vec![7u8; 1500];
        assert!(!torn(100, &record));
        let mut with_hole = record.clone();
        with_hole[412..924].fill(0); // file offsets 512-1024: a whole sector
        assert!(torn(100, &with_hole));
        let mut short_run = record.clone();
        short_run[500..900].fill(0); // 400 zeros across two sectors, neither all zero
        assert!(!torn(100, &short_run));
        let mut tail = record;
        tail[1436..].fill(0); // the record's part of the sector at 1536
        assert!(torn(100, &tail));
    }

    #[test]
    fn damage_is_refused_naming_the_file_and_offset_and_nothing_is_changed() {
        type Damage = fn(&Path);
        let cases: [(&str, Damage, &str); 7] = [
            ("a flipped payload byte", |d| flip(&d.join(segment_name(11)), 500), "checksum of the record of index 13 does not match"),
            (
                "a flipped payload byte in the newest segment, every sector written",
                |d| flip(&d.join(segment_name(21)), 500),
                "checksum of the record of index 23 does not match",
            ),
            (
                "a sector of zeros in a segment that is not the newest",
                |d| zero(&d.join(segment_name(11)), 512, SECTOR as usize),
                "checksum of the record of index 13 does not match",
            ),
            (
                "a header of zeros in a segment that is not the newest",
                |d| zero(&d.join(segment_name(11)), 216, HEADER),
                "its records end at 216 of 2160 bytes in a segment that is not the newest",
            ),
            ("a flipped length", |d| flip(&d.join(segment_name(21)), 3), "over the bound"),
            (
                "an older segment cut short",
                |d| {
                    let p = d.join(segment_name(11));
                    let len = fs::metadata(&p).unwrap().len();
                    fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len - 10).unwrap();
                },
                "incomplete",
            ),
            (
                "a segment under another name",
                |d| fs::rename(d.join(segment_name(21)), d.join(segment_name(5))).unwrap(),
                "the first record is of index 21",
            ),
        ];
        for (what, damage, needle) in cases {
            let dir = tempfile::tempdir().unwrap();
            write_three_segments(dir.path());
            damage(dir.path());
            let before: Vec<Vec<u8>> = segments(dir.path()).iter().map(|n| fs::read(dir.path().join(n)).unwrap()).collect();
            let err = LogFiles::open_with(dir.path(), 2000).err().unwrap_or_else(|| panic!("{what}: must refuse")).to_string();
            assert!(err.contains(needle) && err.contains("damaged at offset"), "{what}: {err}");
            let after: Vec<Vec<u8>> = segments(dir.path()).iter().map(|n| fs::read(dir.path().join(n)).unwrap()).collect();
            assert_eq!(before, after, "{what}: a refusal changes no file");
        }
    }
}
