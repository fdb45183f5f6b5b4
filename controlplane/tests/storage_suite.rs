//! openraft's storage conformance suite, run against every backend, plus the
//! damaged-database checks that sit on top of the log store.

use std::sync::Arc;

use controlplane::raft::{LogStore, StateMachineStore, TypeConfig};
use controlplane::storage::{open_data_dir, KvBackend, MemBackend, SledBackend, Watermark};
use openraft::testing::log::{StoreBuilder, Suite};

type StorageError = openraft::StorageError<TypeConfig>;

struct MemBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemBackend>, StateMachineStore, ()> for MemBuilder {
    async fn build(&self) -> Result<((), LogStore<MemBackend>, StateMachineStore), StorageError> {
        let backend = Arc::new(MemBackend::new());
        Ok(((), LogStore::open(backend.clone(), Watermark::disabled()).unwrap(), StateMachineStore::open(backend, true).unwrap()))
    }
}

/// The data dir's backend, with entries flushed inline by `append` (as in the deterministic
/// simulation) or on the flusher thread (as in production).
struct SledBuilder {
    background_io: bool,
}

impl StoreBuilder<TypeConfig, LogStore<SledBackend>, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore<SledBackend>, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(open_data_dir(dir.path(), 1).unwrap());
        let log = LogStore::open(backend.clone(), Watermark::in_dir(dir.path())).unwrap().with_background_io(self.background_io).unwrap();
        Ok((dir, log, StateMachineStore::open(backend, true).unwrap()))
    }
}

#[tokio::test]
async fn openraft_suite_memory() {
    Suite::test_all(MemBuilder).await.unwrap();
}

#[tokio::test]
async fn openraft_suite_sled() {
    Suite::test_all(SledBuilder { background_io: false }).await.unwrap();
}

#[tokio::test]
async fn openraft_suite_sled_flushing_in_the_background() {
    Suite::test_all(SledBuilder { background_io: true }).await.unwrap();
}

#[tokio::test]
async fn log_shorter_than_watermark_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let backend = Arc::new(open_data_dir(dir.path(), 1).unwrap());
        let log = LogStore::open(backend.clone(), Watermark::in_dir(dir.path())).unwrap();
        let entries: Vec<_> = (1..=50u64)
            .map(|i| controlplane::raft::Entry { log_id: controlplane::raft::log_id(1, i), payload: openraft::EntryPayload::Blank })
            .collect();
        log.append_durably(entries).unwrap();
        // Simulate the database losing its tail: remove entries behind the store's back.
        backend.remove_range(controlplane::storage::Tree::Logs, &20u64.to_be_bytes(), None).unwrap();
        backend.flush().unwrap();
    }
    let backend = Arc::new(open_data_dir(dir.path(), 1).unwrap());
    let err = LogStore::open(backend, Watermark::in_dir(dir.path())).err().expect("must refuse a shortened log");
    let msg = err.to_string();
    assert!(msg.contains("ends at index 19 but entries up to 50 were made durable"), "{msg}");
}

#[tokio::test]
async fn failing_disk_surfaces_as_storage_error() {
    use openraft::storage::RaftLogStorage;
    let backend = Arc::new(MemBackend::new());
    let mut log = LogStore::open(backend.clone(), Watermark::disabled()).unwrap();
    backend.fail_writes();
    let err = log.save_vote(&controlplane::raft::Vote::new(1, 1)).await.unwrap_err();
    assert!(err.to_string().contains("no space left on device"), "{err}");
}
