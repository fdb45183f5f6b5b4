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
    /// PARIS: GPU compute utilisation per (MIG partition size, batch), per GPU type name,
    /// then per model name (the [GPU utilisation vs. batch] curve of PARIS Fig. 4(a)).
    #[serde(default)]
    pub utilisation: BTreeMap<String, BTreeMap<String, Vec<UtilPoint>>>,
    /// PARIS: the observed query-size (batch-size) distribution per *service* name. PARIS
    /// Sec. IV-B builds it by counting the batch sizes served over a period, i.e. it is a
    /// profile of the traffic; services without one use the strategy's configured default.
    #[serde(default)]
    pub batch_distributions: BTreeMap<String, BatchDistribution>,
}

/// One point of a partition's utilisation curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UtilPoint {
    /// MIG partition size in GPCs (1, 2, 3, 4 or 7).
    pub gpcs: u8,
    pub batch: u32,
    /// GPU compute utilisation in [0, 1].
    pub utilisation: f64,
}

/// The distribution of query sizes. Under PARIS a request is a query of `b` inputs that
/// is executed as one batch of size `b`, so this is the batch-size distribution and a
/// service's `request_rate` counts queries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BatchDistribution {
    /// `ln b ~ N(mu, sigma²)` (PARIS Sec. II-A / V: log-normal query sizes), discretised to
    /// integer batches by `b = ceil(x)` and truncated to `1..=max_batch` (renormalised).
    LogNormal { mu: f64, sigma: f64, max_batch: u32 },
    /// A measured histogram: (batch size, weight); weights are normalised.
    Empirical { weights: Vec<(u32, f64)> },
}

impl Profiles {
    pub fn table(&self, gpu_type: &str, model: &str) -> Option<&ProfileTable> {
        self.tables.get(gpu_type)?.get(model)
    }
    pub fn coeffs(&self, gpu_type: &str, model: &str) -> Option<&WorkloadCoeffs> {
        self.igniter.get(gpu_type)?.get(model)
    }
    pub fn utilisation_curve(&self, gpu_type: &str, model: &str) -> Option<&[UtilPoint]> {
        self.utilisation.get(gpu_type)?.get(model).map(Vec::as_slice)
    }
}

/// Everything a provisioning strategy needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanningInput {
    pub gpu_types: Vec<GpuType>,
    pub services: Vec<ServiceDemand>,
    pub profiles: Profiles,
}
