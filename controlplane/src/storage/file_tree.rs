//! A small tree kept as files of our own, each synced before a write returns: the snapshot,
//! and Raft's hard state (the vote and the purge point).
//! sled writes an item larger than a quarter of its segment (a snapshot is ~100 MB at 10,000
//! hosts) to a file of its own that its flush never syncs, and reads a damaged one back as
//! absent without an error; storing the snapshot in small items of sled's log instead puts
//! its whole size through the log that every Raft append's flush waits on.
//!
//! Layout: `gen-<n>/` holds the tree as of its `n`-th write, one file per key (`k` and the
//! key in hex), each a CRC-32 of the value and the value. A write builds `tmp-<n>/` (hard links for
//! the keys it leaves alone), syncs its files and the directory, and renames it into place,
//! so a crash leaves the old generation or the new one, never a mix; the highest complete
//! generation is the tree. A file whose checksum does not match is an error, never absent.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::backend::{KvPair, KvPairs};
use super::{BackendError, Tree};

pub struct FileTree {
    dir: PathBuf,
    tree: Tree,
    /// The current generation and its keys.
    current: Mutex<(u64, Vec<Vec<u8>>)>,
}

const GEN: &str = "gen-";
const TMP: &str = "tmp-";

impl FileTree {
    /// Opens (creating) the tree in `dir`: the highest complete generation; unfinished
    /// writes and older generations are removed.
    pub fn open(dir: &Path, tree: Tree) -> Result<Self, BackendError> {
        let err = |op, e: std::io::Error| BackendError::new(op, tree, format!("{}: {e}", dir.display()));
        fs::create_dir_all(dir).map_err(|e| err("open", e))?;
        let mut generations = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| err("open", e))? {
            let entry = entry.map_err(|e| err("open", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP) {
                fs::remove_dir_all(entry.path()).map_err(|e| err("open", e))?;
            } else if let Some(n) = name.strip_prefix(GEN).and_then(|n| n.parse::<u64>().ok()) {
                generations.push(n);
            } else {
                return Err(BackendError::new("open", tree, format!("{}: unexpected file {name:?}", dir.display())));
            }
        }
        generations.sort_unstable();
        let newest = generations.last().copied().unwrap_or(0);
        for old in generations.iter().filter(|&&g| g != newest) {
            fs::remove_dir_all(dir.join(format!("{GEN}{old}"))).map_err(|e| err("open", e))?;
        }
        let keys = if generations.is_empty() { Vec::new() } else { list_keys(&dir.join(format!("{GEN}{newest}")), tree)? };
        Ok(Self { dir: dir.to_path_buf(), tree, current: Mutex::new((newest, keys)) })
    }

    fn error(&self, op: &'static str, what: impl std::fmt::Display) -> BackendError {
        BackendError::new(op, self.tree, format!("{}: {what}", self.dir.display()))
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        let current = self.current.lock().unwrap();
        if !current.1.iter().any(|k| k == key) {
            return Ok(None);
        }
        self.read(current.0, key).map(Some)
    }

    fn read(&self, generation: u64, key: &[u8]) -> Result<Vec<u8>, BackendError> {
        let path = self.dir.join(format!("{GEN}{generation}")).join(hex(key));
        let mut bytes = fs::read(&path).map_err(|e| self.error("get", format!("{}: {e}", path.display())))?;
        if bytes.len() < 4 {
            return Err(self.error("get", format!("{} is damaged: {} bytes, shorter than its checksum", path.display(), bytes.len())));
        }
        let value = bytes.split_off(4);
        let stored = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
        let actual = crc32fast::hash(&value);
        if stored != actual {
            return Err(self.error(
                "get",
                format!("{} is damaged: checksum {actual:08x} of its {} bytes, {stored:08x} written", path.display(), value.len()),
            ));
        }
        Ok(value)
    }

    /// Writes a new generation: the current one with `changes` (a value, or `None` to remove
    /// the key) applied.
    fn write(&self, op: &'static str, changes: BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> Result<(), BackendError> {
        let mut current = self.current.lock().unwrap();
        let next = current.0 + 1;
        let (old_dir, tmp, done) =
            (self.dir.join(format!("{GEN}{}", current.0)), self.dir.join(format!("{TMP}{next}")), self.dir.join(format!("{GEN}{next}")));
        let io = |what: &Path, e: std::io::Error| self.error(op, format!("{}: {e}", what.display()));
        fs::create_dir(&tmp).map_err(|e| io(&tmp, e))?;
        let mut keys = Vec::new();
        for key in &current.1 {
            if !changes.contains_key(key) {
                // Unchanged, and already synced in its generation: a link is enough.
                fs::hard_link(old_dir.join(hex(key)), tmp.join(hex(key))).map_err(|e| io(&tmp, e))?;
                keys.push(key.clone());
            }
        }
        for (key, value) in &changes {
            let Some(value) = value else { continue };
            let path = tmp.join(hex(key));
            let mut f = fs::File::create(&path).map_err(|e| io(&path, e))?;
            f.write_all(&crc32fast::hash(value).to_le_bytes())
                .and_then(|_| f.write_all(value))
                .and_then(|_| f.sync_all())
                .map_err(|e| io(&path, e))?;
            keys.push(key.clone());
        }
        sync_dir(&tmp).map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &done).map_err(|e| io(&done, e))?;
        sync_dir(&self.dir).map_err(|e| io(&self.dir, e))?;
        keys.sort();
        let old = std::mem::replace(&mut *current, (next, keys));
        drop(current);
        // The new generation is in place; the old one is garbage (also removed at open).
        let _ = fs::remove_dir_all(self.dir.join(format!("{GEN}{}", old.0)));
        Ok(())
    }

    pub fn insert_batch(&self, items: KvPairs) -> Result<(), BackendError> {
        self.write("insert", items.into_iter().map(|(k, v)| (k, Some(v))).collect())
    }

    pub fn remove_range(&self, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError> {
        let removed: BTreeMap<Vec<u8>, Option<Vec<u8>>> = {
            let current = self.current.lock().unwrap();
            keys_in(&current.1, from, to).map(|k| (k.clone(), None)).collect()
        };
        if removed.is_empty() {
            return Ok(());
        }
        self.write("remove", removed)
    }

    /// Reads under the lock: a write removes the generation it replaces.
    pub fn range(&self, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError> {
        let current = self.current.lock().unwrap();
        keys_in(&current.1, from, to).take(limit).map(|k| self.read(current.0, k).map(|v| (k.clone(), v))).collect()
    }

    pub fn last(&self) -> Result<Option<KvPair>, BackendError> {
        let current = self.current.lock().unwrap();
        current.1.last().map(|k| self.read(current.0, k).map(|v| (k.clone(), v))).transpose()
    }
}

fn keys_in<'a>(keys: &'a [Vec<u8>], from: &'a [u8], to: Option<&'a [u8]>) -> impl Iterator<Item = &'a Vec<u8>> + 'a {
    keys.iter().filter(move |k| k.as_slice() >= from && to.is_none_or(|to| k.as_slice() < to))
}

/// A key's file name: `k` and the key in hex (an empty key is a name too).
fn hex(key: &[u8]) -> String {
    std::iter::once("k".to_string()).chain(key.iter().map(|b| format!("{b:02x}"))).collect()
}

fn list_keys(dir: &Path, tree: Tree) -> Result<Vec<Vec<u8>>, BackendError> {
    let bad = |what: String| BackendError::new("open", tree, format!("{}: {what}", dir.display()));
    let mut keys = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| bad(e.to_string()))? {
        let name = entry.map_err(|e| bad(e.to_string()))?.file_name().to_string_lossy().into_owned();
        let key = name
            .strip_prefix('k')
            .filter(|h| h.len() % 2 == 0)
            .and_then(|h| {
                (0..h.len()).step_by(2).map(|i| h.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect::<Option<Vec<u8>>>()
            })
            .ok_or_else(|| bad(format!("unexpected file {name:?}")))?;
        keys.push(key);
    }
    keys.sort();
    Ok(keys)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&[u8], &[u8])]) -> KvPairs {
        items.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    }

    #[test]
    fn writes_replace_whole_generations_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let t = FileTree::open(dir.path(), Tree::Snapshot).unwrap();
        assert_eq!(t.last().unwrap(), None);
        t.insert_batch(pairs(&[(b"data", b"one"), (b"meta", b"m1")])).unwrap();
        t.insert_batch(pairs(&[(b"meta", b"m2"), (b"", b"empty key")])).unwrap();
        let t = FileTree::open(dir.path(), Tree::Snapshot).unwrap();
        assert_eq!(t.get(b"data").unwrap().as_deref(), Some(&b"one"[..]), "a key the write left alone is kept");
        assert_eq!(t.get(b"meta").unwrap().as_deref(), Some(&b"m2"[..]));
        assert_eq!(t.range(b"", None, 10).unwrap(), pairs(&[(b"", b"empty key"), (b"data", b"one"), (b"meta", b"m2")]));
        t.remove_range(b"d", Some(b"m")).unwrap();
        assert_eq!(t.last().unwrap(), Some((b"meta".to_vec(), b"m2".to_vec())));
        assert_eq!(t.get(b"data").unwrap(), None);
        let generations: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(generations.len(), 1, "older generations are removed: {generations:?}");
    }

    #[test]
    fn an_unfinished_write_is_dropped_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        FileTree::open(dir.path(), Tree::Snapshot).unwrap().insert_batch(pairs(&[(b"data", b"0123456789")])).unwrap();
        // A crash while the next generation was being written.
        fs::create_dir(dir.path().join("tmp-2")).unwrap();
        fs::write(dir.path().join("tmp-2").join(hex(b"data")), b"partial").unwrap();
        let t = FileTree::open(dir.path(), Tree::Snapshot).unwrap();
        assert_eq!(t.get(b"data").unwrap().as_deref(), Some(&b"0123456789"[..]));
        assert!(!dir.path().join("tmp-2").exists());
        // What a disk can leave of a file: the same length, other bytes.
        let file = dir.path().join("gen-1").join(hex(b"data"));
        let mut bytes = fs::read(&file).unwrap();
        bytes[6] ^= 1;
        fs::write(&file, bytes).unwrap();
        let e = FileTree::open(dir.path(), Tree::Snapshot).unwrap().get(b"data").unwrap_err().to_string();
        assert!(e.contains("is damaged: checksum"), "{e}");
        fs::write(&file, b"ab").unwrap();
        let e = FileTree::open(dir.path(), Tree::Snapshot).unwrap().get(b"data").unwrap_err().to_string();
        assert!(e.contains("shorter than its checksum"), "{e}");
    }
}
