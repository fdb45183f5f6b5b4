//! openraft's storage conformance suite, run against every backend, plus the
//! damaged-database checks that sit on top of the log store.

use std::sync::Arc;

use controlplane::raft::{LogStore, StateMachineStore, TypeConfig};
use controlplane::storage::{open_data_dir, KvBackend, MemBackend, SledBackend, Watermark};
use openraft::testing::{StoreBuilder, Suite};

struct MemBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemBackend>, StateMachineStore<MemBackend>, ()> for MemBuilder {
    async fn build(&self) -> Result<((), LogStore<MemBackend>, StateMachineStore<MemBackend>), openraft::StorageError<u64>> {
        let backend = Arc::new(MemBackend::new());
        Ok(((), LogStore::open(backend.clone(), Watermark::disabled()).unwrap(), StateMachineStore::open(backend, true).unwrap()))
    }
}

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore<SledBackend>, StateMachineStore<SledBackend>, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore<SledBackend>, StateMachineStore<SledBackend>), openraft::StorageError<u64>> {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(open_data_dir(dir.path(), 1).unwrap());
        let log = LogStore::open(backend.clone(), Watermark::in_dir(dir.path())).unwrap();
        Ok((dir, log, StateMachineStore::open(backend, true).unwrap()))
    }
}

#[test]
fn openraft_suite_memory() {
    Suite::test_all(MemBuilder).unwrap();
}

#[test]
fn openraft_suite_sled() {
    Suite::test_all(SledBuilder).unwrap();
}

#[tokio::test]
async fn log_shorter_than_watermark_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let backend = Arc::new(open_data_dir(dir.path(), 1).unwrap());
        let log = LogStore::open(backend.clone(), Watermark::in_dir(dir.path())).unwrap();
        let entries: Vec<_> = (1..=50u64)
            .map(|i| openraft::Entry::<TypeConfig> {
                log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), i),
                payload: openraft::EntryPayload::Blank,
            })
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
    let err = log.save_vote(&openraft::Vote::new(1, 1)).await.unwrap_err();
    assert!(err.to_string().contains("no space left on device"), "{err}");
}
