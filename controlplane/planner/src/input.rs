//! Planning inputs: GPU types with prices, services with their SLOs, and the performance
//! profiles of their models. All serde-serialisable so the controller can store them.

use crate::mig::GpuModel;
use crate::perf::igniter::{HardwareCoeffs, WorkloadCoeffs};
use crate::perf::table::ProfileTable;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A kind of GPU the planner may provision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuType {
    /// Unique name, e.g. `a100-80gb` or `v100`.
    pub name: String,
    pub model: GpuModel,
    /// Price per GPU-hour (any currency, used only for comparisons).
    pub price_per_hour: f64,
    /// Whether MPS may be used on this GPU (or inside its MIG instances).
    pub mps: bool,
    /// iGniter hardware coefficients, needed by the MPS strategy on this type.
    #[serde(default)]
    pub igniter: Option<HardwareCoeffs>,
}

impl GpuType {
    pub fn mig(&self) -> bool {
        self.model != GpuModel::NoMig
    }
}

/// What a tenant asked for: model M, latency under X ms at Y req/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceDemand {
    pub name: String,
    pub model: String,
    /// End-to-end latency SLO (ms). Batch execution must stay within half of it (queueing
    /// and batching take the other half; iGniter Eq. 14, ParvaGPU Sec. IV).
    pub slo_ms: f64,
    pub request_rate: f64,
}

/// Performance data per GPU type name, then per model name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Profiles {
    /// ParvaGPU-style MIG × batch × process tables.
    #[serde(default)]
    pub tables: BTreeMap<String, BTreeMap<String, ProfileTable>>,
    /// iGniter workload coefficients.
    #[serde(default)]
    pub igniter: BTreeMap<String, BTreeMap<String, WorkloadCoeffs>>,
}

impl Profiles {
    pub fn table(&self, gpu_type: &str, model: &str) -> Option<&ProfileTable> {
        self.tables.get(gpu_type)?.get(model)
    }
    pub fn coeffs(&self, gpu_type: &str, model: &str) -> Option<&WorkloadCoeffs> {
        self.igniter.get(gpu_type)?.get(model)
    }
}

/// Everything a provisioning strategy needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanningInput {
    pub gpu_types: Vec<GpuType>,
    pub services: Vec<ServiceDemand>,
    pub profiles: Profiles,
}
