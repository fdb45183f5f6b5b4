//! The domain model kept in the replicated state: resource kinds, their typed specs and
//! statuses, their bounds, and field-level validation. Pure data, no IO: the controller,
//! the agent, gpuctl and chaos build and parse these types.

mod kind;
pub mod limits;
mod plan_patch;
mod specs;
mod status;
mod status_json;
mod validate;
mod validate_runtime;

pub use kind::Kind;
#[cfg(any(test, feature = "test-fixtures"))]
pub use plan_patch::test_gpu;
pub use plan_patch::{PlanPatch, MAX_PATCH_CHANGES};
pub use specs::*;
pub use status::{Health, NodeStatus, ObservedGpu, ObservedWorkload, ServiceStatus, SloCount, StatusFields, TenantStatus};
pub use status_json::StatusJson;
pub use validate::{bounded_list, bounded_text, host_of, named, non_negative};
pub use validate::{validate_name, validate_plan_patch, validate_spec};

use serde::{Deserialize, Serialize};

/// Error codes of a refused command; they map one to one onto gRPC codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    InvalidArgument,
    FailedPrecondition,
    AlreadyExists,
    NotFound,
    /// A quota (e.g. a tenant's `max_services`) is used up.
    ResourceExhausted,
}

/// Why a command was refused: the field path (e.g. `spec.slo.latency_ms`) and the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    pub code: ErrorCode,
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, field, reason)
    }
    pub fn new(code: ErrorCode, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { code, field: field.into(), reason: reason.into() }
    }

    /// The same error, for `field`: hot paths validate with a placeholder field and name it
    /// only on failure, where formatting every value's path up front would cost an
    /// allocation per checked value (agents' reports, thousands a second).
    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }
}

/// A resource as stored in the state machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredResource {
    pub name: String,
    /// Empty for cluster-scoped kinds.
    pub tenant: String,
    pub resource_version: u64,
    pub spec: Spec,
    /// Observed state reported by loops and agents; free-form JSON, never validated
    /// against the spec so that a status report cannot be refused for a spec reason.
    /// Kept as text and shared, not copied (see [`StatusJson`]).
    pub status: StatusJson,
    pub create_revision: u64,
    pub mod_revision: u64,
}

impl StoredResource {
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }
}
