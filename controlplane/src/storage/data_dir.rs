//! The controller's data directory: a `FORMAT` marker file, the sled database (metadata),
//! the Raft log's files and the snapshot's files. A directory that is not ours, of another format version, of another
//! node, or damaged is refused with a message that says which; it is never reset or rewritten.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{BackendDirs, KvBackend, SledBackend, Tree};

/// Version of the on-disk layout. Bump it on any incompatible change of keys or encodings.
/// 2: openraft's `single-term-leader` ids (one leader per term); the votes and log ids of
/// version 1 were leader ids of another order. 3: a log entry holds a list of requests
/// (group commit, `state::Proposal`), where it held one. 4: sled's segments are 8 MiB
/// (`sled_backend::SEGMENT_BYTES`), which sled cannot open with another size. 5: values are
/// stored in parts (`sled_backend::PART_BYTES`) and the snapshot in files of our own
/// (`file_tree`), so that nothing acknowledged is in a file sled never syncs. 6: the Raft log
/// is in segment files of our own (`log_files`), and the vote and purge point in synced files
/// (`file_tree`), not in sled. 7: the log's segments are allocated ahead of their appends
/// and their records end at the first header of zeros (`log_files`), where version 6's
/// ended at the file's end and would read those zeros as damage.
pub const FORMAT_VERSION: u32 = 7;
/// The older format this binary upgrades in place at start. Version 6's files read the same
/// under version 7's rules (its log segments end at the file's end, where 7's records may
/// also end), so the upgrade rewrites the version marks alone: the database's key first, the
/// `FORMAT` file last, each durably, so that a crash in between leaves a dir that the next
/// start upgrades again. From then on appends allocate ahead, which version 6 cannot read: a
/// binary of format 6 refuses the dir by its version rather than misreading it.
pub const UPGRADES_FROM: u32 = 6;
const MARKER: &str = "gpuplane-controller-data";
const FORMAT_FILE: &str = "FORMAT";
pub(crate) const META_FORMAT_KEY: &[u8] = b"format_version";
pub(crate) const META_NODE_KEY: &[u8] = b"node_id";

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data dir {dir}: {reason}; refusing to start (files left untouched)")]
    Refused { dir: PathBuf, reason: String },
    #[error("data dir {dir}: {source}")]
    Io { dir: PathBuf, source: std::io::Error },
}

fn refused(dir: &Path, reason: impl Into<String>) -> DataDirError {
    DataDirError::Refused { dir: dir.to_path_buf(), reason: reason.into() }
}

/// Opens (or, when absent or empty, creates) the data dir of controller `node_id`.
pub fn open_data_dir(dir: &Path, node_id: u64) -> Result<SledBackend, DataDirError> {
    let io = |source| DataDirError::Io { dir: dir.to_path_buf(), source };
    let fresh = match fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(io(e)),
    };
    if fresh {
        fs::create_dir_all(dir).map_err(io)?;
        let backend = SledBackend::open(&BackendDirs::in_dir(dir)).map_err(|e| refused(dir, e.to_string()))?;
        backend
            .insert_batch(
                Tree::Meta,
                vec![
                    (META_FORMAT_KEY.to_vec(), FORMAT_VERSION.to_be_bytes().to_vec()),
                    (META_NODE_KEY.to_vec(), node_id.to_be_bytes().to_vec()),
                ],
            )
            .and_then(|_| backend.flush())
            .map_err(|e| refused(dir, e.to_string()))?;
        // The marker is written last: a crash before this leaves a dir that is refused as
        // incomplete rather than one that looks initialised.
        write_marker(dir, node_id).map_err(io)?;
        return Ok(backend);
    }

    let marker = match fs::read_to_string(dir.join(FORMAT_FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(refused(
                dir,
                format!("not empty and has no {FORMAT_FILE} file: not a gpuplane controller data dir (or an interrupted initialisation)"),
            ));
        }
        Err(e) => return Err(io(e)),
    };
    let (version, marker_node) = parse_marker(&marker).map_err(|reason| refused(dir, format!("{FORMAT_FILE}: {reason}")))?;
    if version > FORMAT_VERSION {
        return Err(refused(
            dir,
            format!(
                "format version {version} is newer than this binary's {FORMAT_VERSION}: a newer gpuplane wrote it and must open it (a data dir is never downgraded)"
            ),
        ));
    }
    let upgrading = version != FORMAT_VERSION;
    if upgrading && version != UPGRADES_FROM {
        return Err(refused(
            dir,
            format!(
                "format version {version}, this binary reads version {FORMAT_VERSION} and upgrades version {UPGRADES_FROM} only: no release upgrades format {version}: remove this member and add it again with an empty data dir (`gpuctl cluster remove`, then `gpuctl cluster add`)"
            ),
        ));
    }
    if marker_node != node_id {
        return Err(refused(dir, format!("belongs to node {marker_node}, this is node {node_id}")));
    }
    let dirs = BackendDirs::in_dir(dir);
    if !dirs.sled.join("db").is_file() || !dirs.sled.join("conf").is_file() {
        return Err(refused(dir, "database files are missing"));
    }
    for part in [&dirs.logs, &dirs.hard_state, &dirs.snapshot] {
        if !part.is_dir() {
            return Err(refused(dir, format!("{} is missing", part.display())));
        }
    }
    let backend = SledBackend::open(&dirs).map_err(|e| refused(dir, format!("database cannot be opened: {e}")))?;
    let stored = |key: &[u8]| -> Result<Option<Vec<u8>>, DataDirError> {
        backend.get(Tree::Meta, key).map_err(|e| refused(dir, format!("database unreadable: {e}")))
    };
    match stored(META_FORMAT_KEY)? {
        Some(v) if v == FORMAT_VERSION.to_be_bytes() => {}
        // Not upgraded yet. (A crash after the key was upgraded and before the marker was
        // leaves the current version's key: the arm above.)
        Some(v) if upgrading && v == version.to_be_bytes() => {}
        Some(v) => return Err(refused(dir, format!("database format key is {v:?}, expected version {FORMAT_VERSION}"))),
        None => return Err(refused(dir, "database lacks its format version key: damaged or truncated")),
    }
    match stored(META_NODE_KEY)? {
        Some(v) if v == node_id.to_be_bytes() => {}
        _ => return Err(refused(dir, "database node id does not match FORMAT: damaged or mixed-up data dir")),
    }
    if upgrading {
        backend
            .insert_batch(Tree::Meta, vec![(META_FORMAT_KEY.to_vec(), FORMAT_VERSION.to_be_bytes().to_vec())])
            .and_then(|()| backend.flush())
            .map_err(|e| refused(dir, format!("upgrading from format {version}: database not written: {e}")))?;
        write_marker(dir, node_id).map_err(io)?;
        tracing::warn!(dir = %dir.display(), from = version, to = FORMAT_VERSION, "data dir upgraded in place; binaries of format {version} refuse it from now on");
    }
    Ok(backend)
}

fn write_marker(dir: &Path, node_id: u64) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    let mut f = fs::File::create(&tmp)?;
    writeln!(f, "{MARKER}\nformat_version={FORMAT_VERSION}\nnode_id={node_id}")?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(FORMAT_FILE))?;
    fs::File::open(dir)?.sync_all()
}

fn parse_marker(text: &str) -> Result<(u32, u64), String> {
    let mut lines = text.lines();
    if lines.next() != Some(MARKER) {
        return Err(format!("first line is not {MARKER:?}: not a gpuplane controller data dir"));
    }
    let mut version = None;
    let mut node = None;
    for line in lines {
        match line.split_once('=') {
            Some(("format_version", v)) => version = Some(v.parse::<u32>().map_err(|_| format!("bad format_version {v:?}"))?),
            Some(("node_id", v)) => node = Some(v.parse::<u64>().map_err(|_| format!("bad node_id {v:?}"))?),
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
    match (version, node) {
        (Some(v), Some(n)) => Ok((v, n)),
        _ => Err("truncated: format_version or node_id missing".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::KvPairs;

    fn snapshot_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = vec![];
        for entry in walk(dir) {
            out.push((entry.clone(), fs::read(&entry).unwrap()));
        }
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut files = vec![];
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files.extend(walk(&p));
            } else {
                files.push(p);
            }
        }
        files
    }

    fn assert_refused(dir: &Path, node: u64, needle: &str) {
        let before = snapshot_files(dir);
        let err = open_data_dir(dir, node).err().expect("must refuse");
        let msg = err.to_string();
        assert!(msg.contains(needle), "{msg}");
        assert!(msg.contains("refusing to start"), "{msg}");
        assert_eq!(before, snapshot_files(dir), "refusal must leave files untouched");
    }

    #[test]
    fn fresh_dir_is_initialised_and_reopens() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("n1");
        {
            let b = open_data_dir(&dir, 1).unwrap();
            b.insert(Tree::Logs, &1u64.to_be_bytes(), b"v".to_vec()).unwrap();
            b.flush().unwrap();
        }
        let b = open_data_dir(&dir, 1).unwrap();
        assert_eq!(b.get(Tree::Logs, &1u64.to_be_bytes()).unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn foreign_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("notes.txt"), "hello").unwrap();
        assert_refused(tmp.path(), 1, "not a gpuplane controller data dir");
    }

    #[test]
    fn wrong_version_node_or_truncated_marker_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        drop(open_data_dir(tmp.path(), 1).unwrap());
        let marker = tmp.path().join(FORMAT_FILE);
        // Data dirs of versions 1 (leader ids before single-term-leader), 2 (one request
        // per log entry), 3 (sled's default segments), 4 (whole values in sled, the
        // snapshot in it too) and 5 (the Raft log in sled) name both versions; 6 (log
        // segments that end at the file's end) is upgraded in place (below).
        for old in [1, 2, 3, 4, 5] {
            fs::write(&marker, format!("{MARKER}\nformat_version={old}\nnode_id=1\n")).unwrap();
            assert_refused(tmp.path(), 1, &format!("format version {old}, this binary reads version 7 and upgrades version 6 only"));
        }
        fs::write(&marker, format!("{MARKER}\nformat_version={}\nnode_id=1\n", FORMAT_VERSION + 1)).unwrap();
        assert_refused(tmp.path(), 1, &format!("format version {} is newer than this binary's {FORMAT_VERSION}", FORMAT_VERSION + 1));
        fs::write(&marker, format!("{MARKER}\nformat_version={FORMAT_VERSION}\nnode_id=1\n")).unwrap();
        assert_refused(tmp.path(), 3, "belongs to node 1");
        fs::write(&marker, format!("{MARKER}\nformat_ver")).unwrap();
        assert_refused(tmp.path(), 1, "FORMAT");
    }

    /// Marks `dir` as version 6 wrote it: its `FORMAT` file and its database's key.
    fn mark_as_format_6(dir: &Path, marker: bool, key: bool) {
        if key {
            let b = open_data_dir(dir, 1).unwrap();
            b.insert(Tree::Meta, META_FORMAT_KEY, 6u32.to_be_bytes().to_vec()).unwrap();
            b.flush().unwrap();
        }
        if marker {
            fs::write(dir.join(FORMAT_FILE), format!("{MARKER}\nformat_version=6\nnode_id=1\n")).unwrap();
        }
    }

    #[test]
    fn a_format_6_dir_is_upgraded_in_place_and_a_crash_midway_upgrades_it_at_the_next_start() {
        let tmp = tempfile::tempdir().unwrap();
        data_dir_with_entries(tmp.path());
        let before = start_and_read(tmp.path()).unwrap();
        // As version 6 left it; then as a crash after the key and before the marker would.
        for (key, stage) in [(true, "as version 6 wrote it"), (false, "the key upgraded, the marker not yet")] {
            mark_as_format_6(tmp.path(), true, key);
            assert_eq!(start_and_read(tmp.path()).unwrap(), before, "{stage}: the vote and every entry read the same");
            let marker = fs::read_to_string(tmp.path().join(FORMAT_FILE)).unwrap();
            assert_eq!(parse_marker(&marker).unwrap(), (FORMAT_VERSION, 1), "{stage}");
            let b = open_data_dir(tmp.path(), 1).unwrap();
            assert_eq!(b.get(Tree::Meta, META_FORMAT_KEY).unwrap(), Some(FORMAT_VERSION.to_be_bytes().to_vec()), "{stage}");
        }
        // A key of another version than the marker's is damage, not an upgrade.
        mark_as_format_6(tmp.path(), false, true);
        let refused = open_data_dir(tmp.path(), 1).err().expect("a key of version 6 under a marker of 7").to_string();
        assert!(refused.contains("database format key"), "{refused}");
    }

    const ENTRIES: u64 = 2000;

    fn vote() -> crate::raft::Vote {
        crate::raft::Vote::new_committed(7, 2)
    }

    /// A data dir with `ENTRIES` log entries of 900 bytes of `x`, a vote, the watermark the
    /// log store would have recorded, and as many values of sled's metadata (so that sled's
    /// file has something to damage).
    fn data_dir_with_entries(dir: &Path) {
        use crate::raft::LogStore;
        use crate::storage::Watermark;
        use openraft::storage::RaftLogStorage;
        let b = std::sync::Arc::new(open_data_dir(dir, 1).unwrap());
        for batch in 0..ENTRIES / 50 {
            let items: KvPairs = (0..50u64).map(|i| ((batch * 50 + i).to_be_bytes().to_vec(), vec![b'x'; 900])).collect();
            b.insert_batch(Tree::Logs, items.clone()).unwrap();
            b.insert_batch(Tree::Meta, items.into_iter().map(|(k, v)| ([b"filler-".as_slice(), &k].concat(), v)).collect()).unwrap();
            b.flush().unwrap();
        }
        let mut log = LogStore::open(b, Watermark::disabled()).unwrap();
        futures::executor::block_on(log.save_vote(&vote())).unwrap();
        Watermark::in_dir(dir).advance(ENTRIES - 1).unwrap();
    }

    /// Inverts 4 KiB in the middle of the file's written part (a log segment is allocated
    /// ahead: zeros past its records).
    fn invert_middle(path: &Path) {
        let mut bytes = fs::read(path).unwrap();
        let written = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let middle = written / 2;
        let end = (middle + 4096).min(bytes.len());
        bytes[middle..end].iter_mut().for_each(|b| *b = !*b);
        fs::write(path, bytes).unwrap();
    }

    /// Starts a node on `dir` as the controller does: the data dir, then the Raft log
    /// against its watermark; then reads its vote and every log entry back.
    /// What a node that started holds: its vote and each log entry.
    type Started = (Option<crate::raft::Vote>, Vec<Option<Vec<u8>>>);

    fn start_and_read(dir: &Path) -> Result<Started, String> {
        use crate::raft::LogStore;
        use crate::storage::Watermark;
        use openraft::storage::RaftLogReader;
        let backend = std::sync::Arc::new(open_data_dir(dir, 1).map_err(|e| e.to_string())?);
        let mut log = LogStore::open(backend.clone(), Watermark::in_dir(dir)).map_err(|e| e.to_string())?;
        let vote = futures::executor::block_on(log.read_vote()).map_err(|e| e.to_string())?;
        Ok((vote, (0..ENTRIES).map(|i| backend.get(Tree::Logs, &i.to_be_bytes()).ok().flatten()).collect()))
    }

    /// The Raft log's files check every record: 4 KiB inverted in the middle of the log
    /// (what `chaos real` does to a stopped follower) is always a refusal naming the file.
    #[test]
    fn a_log_damaged_in_the_middle_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("n1");
        data_dir_with_entries(&dir);
        let segments: Vec<PathBuf> = fs::read_dir(BackendDirs::in_dir(&dir).logs).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(segments.len(), 1, "{segments:?}");
        invert_middle(&segments[0]);
        let refusal = start_and_read(&dir).expect_err("a damaged log must be refused");
        assert!(refusal.contains("refusing to start") && refusal.contains("is damaged at offset"), "{refusal}");
    }

    /// sled panics while recovering some damaged files ("tried to serialize
    /// Uninitialized"); the node must refuse with a message instead (found by `chaos real`).
    /// sled may also recover such a file to an earlier consistent point without an error,
    /// or read past the damage, losing values silently: so sled holds nothing whose loss
    /// is unsafe. What start-up must never do is panic, or come up with its vote or any log
    /// entry lost or changed: it refuses, or they read back intact.
    #[test]
    fn a_damaged_database_is_refused_or_costs_neither_the_vote_nor_the_log_and_never_panics() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("n1");
        data_dir_with_entries(&dir);
        invert_middle(&BackendDirs::in_dir(&dir).sled.join("db"));
        let start = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start_and_read(&dir)));
        match start.expect("start-up must not panic") {
            Err(refusal) => assert!(refusal.contains("refusing to start"), "{refusal}"),
            Ok((stored_vote, entries)) => {
                assert_eq!(stored_vote, Some(vote()), "the vote must survive");
                let damaged: Vec<String> = entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.as_deref() != Some(&[b'x'; 900][..]))
                    .map(|(i, e)| format!("{i}: {:?}", e.as_ref().map(|v| (v.len(), v.iter().filter(|&&b| b != b'x').count()))))
                    .collect();
                assert!(damaged.is_empty(), "started with entries lost or changed: {damaged:?}");
            }
        }
    }
}
