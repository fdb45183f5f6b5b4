use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::backend::{KvPair, KvPairs};
use super::{BackendError, KvBackend, Tree};

type Keyspace = BTreeMap<Vec<u8>, Vec<u8>>;

/// In-memory backend for tests and deterministic simulation. `fail_writes` injects a disk
/// fault: every later write and flush fails.
#[derive(Default)]
pub struct MemBackend {
    trees: Mutex<BTreeMap<Tree, Keyspace>>,
    failing: AtomicBool,
}

impl MemBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on every write fails, as on a full or broken disk.
    pub fn fail_writes(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }

    fn check_writable(&self, op: &'static str, tree: Tree) -> Result<(), BackendError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(BackendError::new(op, tree, "injected write failure (no space left on device)"));
        }
        Ok(())
    }
}

fn bounds<'a>(from: &'a [u8], to: Option<&'a [u8]>) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    (Bound::Included(from), to.map_or(Bound::Unbounded, Bound::Excluded))
}

impl KvBackend for MemBackend {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.trees.lock().unwrap().get(&tree).and_then(|t| t.get(key).cloned()))
    }

    fn insert_batch(&self, tree: Tree, items: KvPairs) -> Result<(), BackendError> {
        self.check_writable("insert", tree)?;
        self.trees.lock().unwrap().entry(tree).or_default().extend(items);
        Ok(())
    }

    fn remove_range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError> {
        self.check_writable("remove", tree)?;
        let mut trees = self.trees.lock().unwrap();
        let t = trees.entry(tree).or_default();
        let keys: Vec<Vec<u8>> = t.range::<[u8], _>(bounds(from, to)).map(|(k, _)| k.clone()).collect();
        for k in keys {
            t.remove(&k);
        }
        Ok(())
    }

    fn range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError> {
        let trees = self.trees.lock().unwrap();
        Ok(trees
            .get(&tree)
            .map(|t| t.range::<[u8], _>(bounds(from, to)).take(limit).map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default())
    }

    fn last(&self, tree: Tree) -> Result<Option<KvPair>, BackendError> {
        let trees = self.trees.lock().unwrap();
        Ok(trees.get(&tree).and_then(|t| t.iter().next_back().map(|(k, v)| (k.clone(), v.clone()))))
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.check_writable("flush", Tree::Meta)
    }
}
