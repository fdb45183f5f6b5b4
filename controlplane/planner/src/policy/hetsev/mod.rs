//! HetSev (Mo, Zhu, Shi, Tan, Wang: "HetSev: Exploiting Heterogeneity-Aware Autoscaling and
//! Resource-Efficient Scheduling for Cost-Effective Machine-Learning Model Serving",
//! Electronics 12(1):240, 2023; `hetsev.txt`).
//!
//! * [`autoscale`]: the heterogeneity-aware scaling controller of Sec. 4.1 — the 80%
//!   throughput-saturation trigger held "for a period of time", the instance selection policy
//!   that minimises the ILP objective `Σ_i C_i (X_i + λ O_i^launch max(X_i, 0))` under
//!   Constraints (1)–(4), and scale-in after a cool-down.
//! * [`rate`]: the same controller for a service whose capacity is a provisioned rate (how
//!   gpuplane's autoscaler sizes services; instances follow from the plan, priced with
//!   [`launch_objective`]).
//!
//! Both are pure: time comes in as `now_s`.
//!
//! HetSev's scheduler (Algorithm 1 of Sec. 4.2: k-means queues, weighted-fairness picking,
//! worst-fit) is not here: gpuplane places work with its own node assignment
//! (`controlplane/src/provision/assign.rs`), which keeps placed work where it is so that a
//! change costs in proportion to what moved; Algorithm 1 re-places every pending replica.

pub mod autoscale;
pub mod rate;

pub use autoscale::{
    decide, decide_with, launch_objective, AutoscaleConfig, CapacityModel, HoldReason, InstanceType, LoadSample, ModelProfile,
    ProfiledCapacity, RunningInstance, ScaleDecision, ScaleInput, TypeRejection,
};
pub use rate::{decide_rate, record_sample, RateDecision, RateRange, MAX_SAMPLES};

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
