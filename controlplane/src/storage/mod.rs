//! Durable storage behind small traits: a key-value backend (`KvBackend`) with an
//! implementation for production (the Raft log and the snapshot in files of our own, the
//! metadata in sled) and an in-memory one for tests and simulation, plus the
//! data-directory format check. openraft's storage traits are implemented once, on top of
//! `KvBackend`, in `crate::raft`.

mod backend;
mod data_dir;
mod file_tree;
mod log_files;
mod memory;
mod part_keys;
mod sled_backend;
mod watermark;

pub use backend::{BackendError, KvBackend, KvPair, KvPairs, Tree};
pub use data_dir::{open_data_dir, DataDirError, FORMAT_VERSION};
pub use memory::MemBackend;
pub use sled_backend::{BackendDirs, SledBackend};
pub use watermark::Watermark;
