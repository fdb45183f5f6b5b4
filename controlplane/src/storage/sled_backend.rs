use std::path::Path;

use super::backend::{KvPair, KvPairs};
use super::file_tree::FileTree;
use super::log_files::LogFiles;
use super::part_keys;
use super::{BackendError, KvBackend, Tree};

/// The production backend: the Raft log in segment files of our own (`LogFiles`), made
/// durable with `fdatasync`; the vote and purge point, and the snapshot, in synced files of
/// our own (`FileTree`); the rest of the metadata in sled. sled acknowledges writes before they reach
/// the disk, so nothing here is durable until `flush`; the Raft log store flushes before it
/// acknowledges a vote or an append.
///
/// Every value is stored in parts of at most [`PART_BYTES`] (`part_keys`), so that no item
/// sled writes is ever one of the files its flush does not sync: see [`SEGMENT_BYTES`].
/// Writers of one key do not race (the log store is a single writer): a write removes the
/// parts a longer old value had, found just before it.
/// Where [`SledBackend`] keeps each part.
pub struct BackendDirs {
    /// sled's database: `Tree::Meta`.
    pub sled: std::path::PathBuf,
    /// `Tree::Logs` (`LogFiles`).
    pub logs: std::path::PathBuf,
    /// `Tree::HardState` (`FileTree`).
    pub hard_state: std::path::PathBuf,
    /// `Tree::Snapshot` (`FileTree`).
    pub snapshot: std::path::PathBuf,
}

impl BackendDirs {
    /// The layout of a data dir: one subdirectory each.
    pub fn in_dir(dir: &Path) -> Self {
        BackendDirs {
            sled: dir.join("sled"),
            logs: dir.join("raft-log"),
            hard_state: dir.join("raft-state"),
            snapshot: dir.join("snapshot"),
        }
    }
}

pub struct SledBackend {
    db: sled::Db,
    meta: sled::Tree,
    logs: LogFiles,
    hard_state: FileTree,
    snapshot: FileTree,
}

impl SledBackend {
    /// Opens the database in `dirs.sled` and the files of the others.
    pub fn open(dirs: &BackendDirs) -> Result<Self, BackendError> {
        let path = &dirs.sled;
        let db = Self::open_db(path).map_err(|e| BackendError::new("open", Tree::Meta, format!("{}: {e}", path.display())))?;
        let meta = db.open_tree(Tree::Meta.name()).map_err(|e| BackendError::new("open", Tree::Meta, e))?;
        let logs = LogFiles::open(&dirs.logs)?;
        let hard_state = FileTree::open(&dirs.hard_state, Tree::HardState)?;
        let snapshot = FileTree::open(&dirs.snapshot, Tree::Snapshot)?;
        Ok(Self { db, meta, logs, hard_state, snapshot })
    }

    /// Opens the database, waiting up to [`LOCK_WAIT`] for its file lock: after a `Db` is
    /// dropped, sled's flusher thread keeps the lock until it notices (up to its flush
    /// interval), so a node restarted in the same process would otherwise fail at random.
    /// A lock held longer belongs to another live process and is refused.
    fn open_db(path: &Path) -> sled::Result<sled::Db> {
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match Self::open_once(path) {
                // sled reports the lock failure as ErrorKind::Other with this text.
                Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// sled panics on some damaged files while it recovers (e.g. "tried to serialize
    /// Uninitialized" after a truncated or overwritten segment); that becomes an error here,
    /// so the node refuses to start with a message naming the data dir instead of crashing.
    fn open_once(path: &Path) -> sled::Result<sled::Db> {
        let open = || {
            sled::Config::new()
                .path(path)
                .mode(sled::Mode::HighThroughput)
                .cache_capacity(SLED_CACHE_BYTES)
                .segment_size(SEGMENT_BYTES)
                .open()
        };
        std::panic::catch_unwind(open).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(sled::Error::Io(std::io::Error::other(format!("the database is damaged (sled failed while recovering it: {what})"))))
        })
    }

    /// The one tree kept in sled: `Tree::Meta` (the others are routed to their files first).
    fn tree(&self, tree: Tree) -> &sled::Tree {
        debug_assert_eq!(tree, Tree::Meta);
        &self.meta
    }

    /// The value at `key` from its parts (`None` if it has none).
    fn get_parts(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        let mut value: Option<Vec<u8>> = None;
        for (n, item) in self.tree(tree).scan_prefix(part_keys::prefix(key)).enumerate() {
            let (stored, part) = item.map_err(|e| BackendError::new("get", tree, e))?;
            // `prefix(key)` starts the parts of `key` alone (`part_keys`).
            let (_, found) = part_keys::decode(&stored).map_err(|e| BackendError::new("get", tree, e))?;
            check_part(tree, key, n, found)?;
            value.get_or_insert_with(Vec::new).extend_from_slice(&part);
        }
        Ok(value)
    }
}

/// Most bytes of a value in one sled item. A tree page (a leaf holds up to 17 items before
/// sled splits it) then stays well under a quarter of [`SEGMENT_BYTES`].
pub(crate) const PART_BYTES: usize = 64 * 1024;

/// That the part numbered `found` of `key` is its `n`-th: a value's parts are numbered from
/// 0 without gaps.
fn check_part(tree: Tree, key: &[u8], n: usize, found: u32) -> Result<(), BackendError> {
    if found as usize != n {
        return Err(BackendError::new("get", tree, format!("the database is damaged: value {key:?} lacks part {n} (found part {found})")));
    }
    Ok(())
}

/// Whole values from the parts `stored` yields in order, up to `limit` values.
fn assemble(
    tree: Tree,
    stored: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    limit: usize,
) -> Result<KvPairs, BackendError> {
    let mut out: KvPairs = Vec::new();
    let mut parts = 0;
    for item in stored {
        let (stored, part) = item.map_err(|e| BackendError::new("scan", tree, e))?;
        let (key, n) = part_keys::decode(&stored).map_err(|e| BackendError::new("scan", tree, e))?;
        if let Some((_, value)) = out.last_mut().filter(|(last, _)| *last == key) {
            check_part(tree, &key, parts, n)?;
            value.extend_from_slice(&part);
            parts += 1;
        } else if out.len() == limit {
            break;
        } else {
            check_part(tree, &key, 0, n)?;
            out.push((key, part.to_vec()));
            parts = 1;
        }
    }
    Ok(out)
}

/// sled's page cache (its default is 1 GiB). sled holds only the metadata (the vote, the
/// committed index, the purge point, the format and node id: a few hundred bytes), so a
/// large cache would only let RSS grow with what sled writes (655 MiB at 1,000 hosts in
/// fleet-bench with the default, when the log was in sled too).
const SLED_CACHE_BYTES: u64 = 8 * 1024 * 1024;

/// sled's segment (its IO buffer): 8 MiB, where its default is 512 KiB. sled writes an item
/// larger than a quarter of a segment to a file of its own ("blob"), which its `flush` never
/// syncs, and reads a damaged one back as absent. An item is a tree page: a leaf holds up to
/// 17 values, so with whole log entries of a few hundred KB (when the log was in sled) most
/// leaves of the log were such files and those entries were acknowledged before they were
/// on disk. Values are therefore stored in parts of [`PART_BYTES`], so every leaf stays in
/// the log, which `flush` syncs; the metadata sled holds now is far smaller, and this
/// stays the bound on any value it is given.
pub(crate) const SEGMENT_BYTES: usize = 8 * 1024 * 1024;

/// How long opening waits for a lock that a just-dropped handle of this process may hold.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl KvBackend for SledBackend {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        match tree {
            Tree::Snapshot => self.snapshot.get(key),
            Tree::HardState => self.hard_state.get(key),
            Tree::Logs => self.logs.get(key),
            Tree::Meta => self.get_parts(tree, key),
        }
    }

    fn insert_batch(&self, tree: Tree, items: KvPairs) -> Result<(), BackendError> {
        match tree {
            Tree::Snapshot => return self.snapshot.insert_batch(items),
            Tree::HardState => return self.hard_state.insert_batch(items),
            Tree::Logs => return self.logs.insert_batch(items),
            Tree::Meta => {}
        }
        let t = self.tree(tree);
        // One batch: sled applies it atomically, the removals first (a later write to a key
        // in a batch replaces an earlier one).
        let mut batch = sled::Batch::default();
        // A key written twice in one batch: the last value, as for any write after another.
        let items: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = items.into_iter().collect();
        for (k, v) in items {
            // Parts are numbered without gaps, so an old value has parts beyond the new one's
            // only if it has the first of them: one point lookup, as a new log entry has none.
            let parts = v.len().div_ceil(PART_BYTES).max(1) as u32;
            if t.contains_key(part_keys::part(&k, parts)).map_err(|e| BackendError::new("get", tree, e))? {
                for old in t.range(part_keys::part(&k, parts)..part_keys::prefix_end(&k)).keys() {
                    batch.remove(old.map_err(|e| BackendError::new("scan", tree, e))?);
                }
            }
            if v.is_empty() {
                batch.insert(part_keys::part(&k, 0), Vec::new());
            }
            for (n, part) in v.chunks(PART_BYTES).enumerate() {
                batch.insert(part_keys::part(&k, n as u32), part);
            }
        }
        t.apply_batch(batch).map_err(|e| BackendError::new("insert", tree, e))
    }

    fn remove_range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError> {
        match tree {
            Tree::Snapshot => return self.snapshot.remove_range(from, to),
            Tree::HardState => return self.hard_state.remove_range(from, to),
            Tree::Logs => return self.logs.remove_range(from, to),
            Tree::Meta => {}
        }
        let t = self.tree(tree);
        let mut batch = sled::Batch::default();
        let (from, to) = (part_keys::prefix(from), to.map(part_keys::prefix));
        let iter = match to {
            Some(to) => t.range(from..to),
            None => t.range(from..),
        };
        for item in iter.keys() {
            batch.remove(item.map_err(|e| BackendError::new("scan", tree, e))?);
        }
        t.apply_batch(batch).map_err(|e| BackendError::new("remove", tree, e))
    }

    fn range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError> {
        match tree {
            Tree::Snapshot => return self.snapshot.range(from, to, limit),
            Tree::HardState => return self.hard_state.range(from, to, limit),
            Tree::Logs => return self.logs.range(from, to, limit),
            Tree::Meta => {}
        }
        let t = self.tree(tree);
        let (from, to) = (part_keys::prefix(from), to.map(part_keys::prefix));
        match to {
            Some(to) => assemble(tree, t.range(from..to), limit),
            None => assemble(tree, t.range(from..), limit),
        }
    }

    fn keys(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<Vec<Vec<u8>>, BackendError> {
        match tree {
            // The log's index is in memory: no segment file is read.
            Tree::Logs => self.logs.keys(from, to, limit),
            _ => Ok(super::backend::keys_of(self.range(tree, from, to, limit)?)),
        }
    }

    fn last(&self, tree: Tree) -> Result<Option<KvPair>, BackendError> {
        match tree {
            Tree::Snapshot => return self.snapshot.last(),
            Tree::HardState => return self.hard_state.last(),
            Tree::Logs => return self.logs.last(),
            Tree::Meta => {}
        }
        let Some((stored, _)) = self.tree(tree).last().map_err(|e| BackendError::new("last", tree, e))? else { return Ok(None) };
        let (key, _) = part_keys::decode(&stored).map_err(|e| BackendError::new("last", tree, e))?;
        Ok(self.get_parts(tree, &key)?.map(|v| (key, v)))
    }

    /// The hard state's and the snapshot's files are synced as they are written; this syncs
    /// the log's files and flushes sled.
    fn flush(&self) -> Result<(), BackendError> {
        self.logs.sync()?;
        self.flush_tree(Tree::Meta)
    }

    fn flush_tree(&self, tree: Tree) -> Result<(), BackendError> {
        match tree {
            Tree::Logs => self.logs.sync(),
            Tree::Snapshot | Tree::HardState => Ok(()),
            Tree::Meta => self.db.flush().map(|_| ()).map_err(|e| BackendError::new("flush", Tree::Meta, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemBackend;

    fn open_in(dir: &Path) -> SledBackend {
        SledBackend::open(&BackendDirs::in_dir(dir)).unwrap()
    }

    /// A value missing a part is damage, named, never a shorter value.
    #[test]
    fn a_value_with_a_part_missing_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let sled = open_in(dir.path());
        sled.insert(Tree::Meta, &7u64.to_be_bytes(), vec![1; 3 * PART_BYTES]).unwrap();
        sled.tree(Tree::Meta).remove(part_keys::part(&7u64.to_be_bytes(), 1)).unwrap();
        for e in [
            sled.get(Tree::Meta, &7u64.to_be_bytes()).unwrap_err(),
            sled.range(Tree::Meta, &[], None, 10).unwrap_err(),
            sled.last(Tree::Meta).unwrap_err(),
        ] {
            assert!(e.to_string().contains("lacks part 1"), "{e}");
        }
    }

    /// Random writes and reads on sled (values in parts) and the snapshot's files, and on the
    /// in-memory backend (the reference), give the same answers (the log's files, which take
    /// only what a log does, have a test of their own in `log_files`): keys with zero bytes and keys that are prefixes of
    /// others, values of zero, one, around one and several parts, values that shrink.
    #[test]
    fn values_in_parts_read_as_the_reference_backend_reads() {
        let dir = tempfile::tempdir().unwrap();
        let sled = open_in(dir.path());
        let reference = MemBackend::new();
        let keys: [&[u8]; 8] = [b"", &[0], &[0, 0], &[0, 1], &[1], &[1, 0], b"vote", &[0xFF, 0]];
        let sizes = [0, 1, PART_BYTES - 1, PART_BYTES, PART_BYTES + 1, 3 * PART_BYTES + 7];
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for (tree, steps) in [(Tree::Meta, 400), (Tree::HardState, 60), (Tree::Snapshot, 60)] {
            for step in 0..steps {
                let (a, b) = (keys[next(keys.len())], keys[next(keys.len())]);
                let (from, to) = if a <= b { (a, b) } else { (b, a) };
                let to = (next(3) > 0).then_some(to);
                match next(4) {
                    0 | 1 => {
                        let items: KvPairs = (0..1 + next(3))
                            .map(|i| (keys[next(keys.len())].to_vec(), vec![(step + i) as u8; sizes[next(sizes.len())]]))
                            .collect();
                        sled.insert_batch(tree, items.clone()).unwrap();
                        reference.insert_batch(tree, items).unwrap();
                    }
                    2 => {
                        sled.remove_range(tree, from, to).unwrap();
                        reference.remove_range(tree, from, to).unwrap();
                    }
                    _ => {
                        let limit = next(4);
                        assert_eq!(
                            sled.range(tree, from, to, limit).unwrap(),
                            reference.range(tree, from, to, limit).unwrap(),
                            "{tree:?} step {step}"
                        );
                        assert_eq!(
                            sled.keys(tree, from, to, limit).unwrap(),
                            reference.keys(tree, from, to, limit).unwrap(),
                            "{tree:?} step {step}"
                        );
                    }
                }
                assert_eq!(sled.last(tree).unwrap(), reference.last(tree).unwrap(), "{tree:?} step {step}");
                for k in keys {
                    assert_eq!(sled.get(tree, k).unwrap(), reference.get(tree, k).unwrap(), "{tree:?} step {step} key {k:?}");
                }
            }
        }
    }
}
