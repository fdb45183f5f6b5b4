use std::path::Path;

use super::backend::{KvPair, KvPairs};
use super::{BackendError, KvBackend, Tree};

/// sled-backed storage. sled acknowledges writes before they reach the disk, so nothing
/// here is durable until `flush`; the Raft log store flushes before it acknowledges a vote
/// or an append.
pub struct SledBackend {
    db: sled::Db,
    trees: [sled::Tree; 3],
}

impl SledBackend {
    pub fn open(path: &Path) -> Result<Self, BackendError> {
        let db = Self::open_db(path).map_err(|e| BackendError::new("open", Tree::Meta, format!("{}: {e}", path.display())))?;
        let open = |t: Tree| db.open_tree(t.name()).map_err(|e| BackendError::new("open", t, e));
        let trees = [open(Tree::Logs)?, open(Tree::Meta)?, open(Tree::Snapshot)?];
        Ok(Self { db, trees })
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

    fn tree(&self, tree: Tree) -> &sled::Tree {
        match tree {
            Tree::Logs => &self.trees[0],
            Tree::Meta => &self.trees[1],
            Tree::Snapshot => &self.trees[2],
        }
    }
}

/// How long opening waits for a lock that a just-dropped handle of this process may hold.
/// sled's page cache (its default is 1 GiB). The controller reads sled only to replicate
/// to a lagging follower, to rebuild its state at start and to send a snapshot; everything
/// else is served from memory, so a large cache only makes every controller's RSS grow with
/// the bytes written (655 MiB at 1,000 hosts in fleet-bench with the default).
const SLED_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// sled's segment (its IO buffer): 8 MiB, where its default is 512 KiB. sled writes an item
/// larger than a quarter of a segment (a tree page holding one of our values) to a file of
/// its own, which its `flush` never syncs: with the default, every log entry over ~128 KiB
/// (a plan patch of 256 GPUs, 64 nodes' statuses) was acknowledged before it was on disk,
/// and creating those files was 9% of a follower's samples in a fleet-wide re-plan at 10,000
/// hosts (perf). With 8 MiB segments an entry up to ~2 MiB is in the log and flushed with it.
/// A snapshot is still such a file: see `raft::open_stores` and README, "sled's own files".
pub(crate) const SEGMENT_BYTES: usize = 8 * 1024 * 1024;

const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl KvBackend for SledBackend {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        self.tree(tree).get(key).map(|v| v.map(|v| v.to_vec())).map_err(|e| BackendError::new("get", tree, e))
    }

    fn insert_batch(&self, tree: Tree, items: KvPairs) -> Result<(), BackendError> {
        let mut batch = sled::Batch::default();
        for (k, v) in items {
            batch.insert(k, v);
        }
        self.tree(tree).apply_batch(batch).map_err(|e| BackendError::new("insert", tree, e))
    }

    fn remove_range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError> {
        let t = self.tree(tree);
        let mut batch = sled::Batch::default();
        let iter = match to {
            Some(to) => t.range(from..to),
            None => t.range(from..),
        };
        for item in iter {
            let (k, _) = item.map_err(|e| BackendError::new("scan", tree, e))?;
            batch.remove(k);
        }
        t.apply_batch(batch).map_err(|e| BackendError::new("remove", tree, e))
    }

    fn range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError> {
        let t = self.tree(tree);
        let iter = match to {
            Some(to) => t.range(from..to),
            None => t.range(from..),
        };
        iter.take(limit).map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(|e| BackendError::new("scan", tree, e))).collect()
    }

    fn last(&self, tree: Tree) -> Result<Option<KvPair>, BackendError> {
        self.tree(tree).last().map(|o| o.map(|(k, v)| (k.to_vec(), v.to_vec()))).map_err(|e| BackendError::new("last", tree, e))
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.db.flush().map(|_| ()).map_err(|e| BackendError::new("flush", Tree::Meta, e))
    }
}
