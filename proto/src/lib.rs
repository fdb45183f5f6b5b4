//! gRPC definitions shared by the controllers, the node agents and gpuctl.

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("gpuplane.v1");
}

pub use v1::*;

/// The Open Inference Protocol (KServe v2) over gRPC: the data plane's one protocol.
#[allow(clippy::all, clippy::pedantic)]
pub mod oip {
    tonic::include_proto!("inference");
}

pub mod fixture_models;
pub mod observed;
pub mod open_inference;
pub mod report_pace;

pub use observed::{leave_out_unchanged, observed_digest, ChangeOnlyReports};

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
    /// On a forwarded request: the principal of the original caller (e.g. `tenant:acme`).
    /// Trusted only when the sender authenticated as a controller.
    pub const PRINCIPAL: &str = "x-gpuplane-principal";
    /// On `ResourceExhausted`: milliseconds until the caller's rate limit admits a request.
    pub const RETRY_AFTER_MS: &str = "retry-after-ms";
    /// Bearer tokens of tenants and admins: `authorization: Bearer <token>`.
    pub const AUTHORIZATION: &str = "authorization";

    /// The token of an `authorization` value, `Bearer <token>`; `None` for another scheme or
    /// a value that is not text. The one parser of the controllers' and the routers'.
    pub fn bearer_token(value: &tonic::metadata::MetadataValue<tonic::metadata::Ascii>) -> Option<&str> {
        value.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
    }
}
