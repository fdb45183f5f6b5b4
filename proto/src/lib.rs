//! gRPC definitions shared by the controllers, the node agents and gpuctl.

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("gpuplane.v1");
}

pub use v1::*;

/// gRPC metadata keys used by the controller's error answers.
pub mod meta {
    /// On `Unavailable` / `FailedPrecondition` "not leader": the leader's node id, if known.
    pub const LEADER_ID: &str = "x-gpuplane-leader-id";
    /// On "not leader": the leader's gRPC address, if known.
    pub const LEADER_ADDR: &str = "x-gpuplane-leader-addr";
    /// On validation errors: the path of the offending field, e.g. `spec.slo.latency_ms`.
    pub const FIELD: &str = "x-gpuplane-field";
    /// Set on a request one controller forwards to the leader, so it is never forwarded twice.
    pub const FORWARDED: &str = "x-gpuplane-forwarded";
}
