//! gpuplane controller: the replicated cluster state (openraft over sled), its gRPC API,
//! the client library, and the `controlplane` binary.

// openraft's StorageError and tonic's Status are large by design; we return them the way
// those libraries do rather than boxing at every boundary.
#![allow(clippy::result_large_err)]

pub mod agents;
pub mod api;
pub mod client;
pub mod cloud;
pub mod config;
pub mod controller;
pub mod loops;
pub mod manifest;
pub mod metering;
pub mod os_limits;
pub mod provision;
pub mod raft;
pub mod scrape;
/// The domain model (its own crate, `model`, so that the agent and tools build the same types).
pub use model as resources;
pub mod security;
pub mod server;
pub mod state;
pub mod storage;
pub mod telemetry;
pub mod tuning;
