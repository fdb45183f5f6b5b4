//! gpuplane controller: the replicated cluster state (openraft over sled), its gRPC API,
//! and the `controlplane` and `gpuctl` binaries.

pub mod resources;
pub mod state;
pub mod storage;
pub mod raft;
pub mod api;
pub mod controller;
pub mod server;
pub mod client;
