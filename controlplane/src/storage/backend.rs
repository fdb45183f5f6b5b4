/// Key-value pairs in key order.
pub type KvPairs = Vec<(Vec<u8>, Vec<u8>)>;
/// One key-value pair.
pub type KvPair = (Vec<u8>, Vec<u8>);

/// The separate keyspaces the controller keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tree {
    /// Raft log entries, keyed by big-endian log index: appended at the end, removed only
    /// from either end (what a Raft log does; the production backend takes nothing else).
    Logs,
    /// Committed log id, format version, node id: what may be lost in a crash or is
    /// checked at start.
    Meta,
    /// Raft's state that must never be lost or silently go back, written rarely: the vote
    /// and the purge point. Every write is durable when it returns.
    HardState,
    /// The latest state-machine snapshot.
    Snapshot,
}

impl Tree {
    pub const ALL: [Tree; 4] = [Tree::Logs, Tree::Meta, Tree::HardState, Tree::Snapshot];

    pub fn name(self) -> &'static str {
        match self {
            Tree::Logs => "logs",
            Tree::Meta => "meta",
            Tree::HardState => "hard_state",
            Tree::Snapshot => "snapshot",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("storage {op} on tree {tree}: {message}")]
pub struct BackendError {
    pub op: &'static str,
    pub tree: &'static str,
    pub message: String,
}

impl BackendError {
    pub fn new(op: &'static str, tree: Tree, message: impl ToString) -> Self {
        Self { op, tree: tree.name(), message: message.to_string() }
    }
}

/// The keys of `pairs`, in their order.
pub fn keys_of(pairs: KvPairs) -> Vec<Vec<u8>> {
    pairs.into_iter().map(|(k, _)| k).collect()
}

/// An ordered key-value store with explicit durability. Writes may sit in memory until
/// `flush` returns; callers flush before acknowledging anything that Raft requires to be
/// durable (a vote, an appended entry).
pub trait KvBackend: Send + Sync + 'static {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError>;
    /// Inserts all pairs atomically.
    fn insert_batch(&self, tree: Tree, items: KvPairs) -> Result<(), BackendError>;
    /// Removes keys in `[from, to)`; `to = None` means to the end.
    fn remove_range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError>;
    /// Pairs with keys in `[from, to)` in key order, at most `limit`.
    fn range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError>;
    fn last(&self, tree: Tree) -> Result<Option<KvPair>, BackendError>;
    /// The keys of [`KvBackend::range`], without their values: what the log store's check
    /// at start reads (every index of the log, whose values it does not need). A backend
    /// that holds its keys apart from its values answers without reading the values.
    fn keys(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<Vec<Vec<u8>>, BackendError> {
        Ok(keys_of(self.range(tree, from, to, limit)?))
    }
    /// Makes every earlier write durable.
    fn flush(&self) -> Result<(), BackendError>;
    /// Makes every earlier write to `tree` durable (and may do more). The Raft log flushes
    /// only its entries on each append, not the committed index it writes between them.
    fn flush_tree(&self, tree: Tree) -> Result<(), BackendError> {
        let _ = tree;
        self.flush()
    }
    /// True when no tree holds any key.
    fn is_empty(&self) -> Result<bool, BackendError> {
        for tree in Tree::ALL {
            if self.last(tree)?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn insert(&self, tree: Tree, key: &[u8], value: Vec<u8>) -> Result<(), BackendError> {
        self.insert_batch(tree, vec![(key.to_vec(), value)])
    }

    /// Extra time a durable write takes, waited for on the async runtime's clock before the
    /// Raft log writes a vote or entries. `None` for real disks; the deterministic
    /// simulation returns its simulated disk's latency here (a slow disk).
    fn write_delay(&self) -> Option<std::time::Duration> {
        None
    }
}
