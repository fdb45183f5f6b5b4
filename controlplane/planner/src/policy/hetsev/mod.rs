//! HetSev (Mo, Zhu, Shi, Tan, Wang: "HetSev: Exploiting Heterogeneity-Aware Autoscaling and
//! Resource-Efficient Scheduling for Cost-Effective Machine-Learning Model Serving",
//! Electronics 12(1):240, 2023; `hetsev.txt`).
//!
//! * [`autoscale`]: the heterogeneity-aware scaling controller of Sec. 4.1 — the 80%
//!   throughput-saturation trigger held "for a period of time", the instance selection policy
//!   that minimises the ILP objective `Σ_i C_i (X_i + λ O_i^launch max(X_i, 0))` under
//!   Constraints (1)–(4), and scale-in after a cool-down.
//! * [`scheduler`]: Algorithm 1 of Sec. 4.2 — k-means queues over (GPU memory, model)
//!   features with the L1 distance ([`kmeans`]), weighted-fairness picking of β instances,
//!   the resource capacity check, anti-affinity of identical models (Sec. 3.2) and worst-fit.
//!
//! Both are pure: time comes in as `now_s`, and nothing is random (k-means uses a
//! deterministic farthest-first initialisation).

pub mod autoscale;
pub mod kmeans;
pub mod scheduler;

pub use autoscale::{
    decide, decide_with, launch_objective, AutoscaleConfig, CapacityModel, HoldReason, InstanceType, LoadSample, ModelProfile,
    ProfiledCapacity, RunningInstance, ScaleDecision, ScaleInput, TypeRejection,
};
pub use scheduler::{
    cluster_pending, schedule, GpuState, InstanceState, Placement, ReplicaRequest, ScheduleOutcome, SchedulerConfig, Unplaced,
    UnplacedReason,
};

/// A bad parameter, naming the offending field (with its index path) and why it was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HetSevError {
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    #[error("`{field}` names unknown instance type `{name}`")]
    UnknownInstanceType { field: String, name: String },
}

impl HetSevError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        HetSevError::Invalid { field: field.into(), reason: reason.into() }
    }

    /// The field the error is about.
    pub fn field(&self) -> &str {
        match self {
            HetSevError::Invalid { field, .. } | HetSevError::UnknownInstanceType { field, .. } => field,
        }
    }
}

/// `v` must be finite and `>= 0`.
pub(crate) fn non_negative(field: impl FnOnce() -> String, v: f64) -> Result<(), HetSevError> {
    if v.is_nan() {
        Err(HetSevError::invalid(field(), "is NaN"))
    } else if !v.is_finite() {
        Err(HetSevError::invalid(field(), format!("must be finite, got {v}")))
    } else if v < 0.0 {
        Err(HetSevError::invalid(field(), format!("must be >= 0, got {v}")))
    } else {
        Ok(())
    }
}

/// `v` must be finite and `> 0`.
pub(crate) fn positive(field: impl FnOnce() -> String, v: f64) -> Result<(), HetSevError> {
    if v.is_nan() {
        Err(HetSevError::invalid(field(), "is NaN"))
    } else if !v.is_finite() {
        Err(HetSevError::invalid(field(), format!("must be finite, got {v}")))
    } else if v <= 0.0 {
        Err(HetSevError::invalid(field(), format!("must be > 0, got {v}")))
    } else {
        Ok(())
    }
}

/// `v` must be finite (any sign): timestamps.
pub(crate) fn finite(field: impl FnOnce() -> String, v: f64) -> Result<(), HetSevError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(HetSevError::invalid(field(), format!("must be finite, got {v}")))
    }
}
