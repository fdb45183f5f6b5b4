//! The pure core of gpuplane: MIG geometry, performance models and the provisioning,
//! scaling and scheduling algorithms. No IO, no clocks, no async: inputs in, decisions out.

pub mod bounds;
pub mod input;
pub mod invariants;
pub mod isolation;
pub mod mig;
pub mod perf;
pub mod plan;
pub mod policy;
pub mod strategy;
