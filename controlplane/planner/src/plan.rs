//! The planner's output: a desired state per GPU plus predictions and refusals.

use crate::mig::{MigProfile, Placement};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A MIG instance of a GPU's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub profile: MigProfile,
    pub start: u8,
}

impl MigInstance {
    pub fn placement(&self) -> Placement {
        Placement::new(self.profile, self.start)
    }
}

/// How a GPU is shared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Sharing {
    /// MIG enabled with this layout (MPS may run inside each instance).
    Mig { instances: Vec<MigInstance> },
    /// MIG disabled; the whole GPU is shared with MPS.
    MpsOnly,
}

/// One inference workload (a set of identical server processes) on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub service: String,
    /// Index into the GPU's MIG instances, if MIG is enabled.
    pub mig_instance: Option<usize>,
    /// MPS active-thread percentage of *each* process, relative to its GPU or MIG instance.
    pub mps_percent: f64,
    pub batch_size: u32,
    pub processes: u32,
    /// Extra MPS percentage the warm shadow process gets when activated (iGniter: min(10%,
    /// free)); 0 where the strategy relies on spare GPUs instead.
    pub shadow_percent: f64,
    /// Predicted throughput of all processes together, req/s.
    pub predicted_throughput: f64,
    pub predicted_latency_ms: f64,
}

/// The desired state of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPlan {
    /// Stable identity of this GPU within the plan; minimal re-planning keeps the slot of
    /// every GPU it does not remove, so the controller can map slots to physical GPUs.
    pub slot: u32,
    pub gpu_type: String,
    pub sharing: Sharing,
    pub workloads: Vec<Workload>,
}

impl GpuPlan {
    pub fn gpcs_used(&self) -> u32 {
        match &self.sharing {
            Sharing::Mig { instances } => instances.iter().map(|i| u32::from(i.profile.compute())).sum(),
            Sharing::MpsOnly => 0,
        }
    }
    /// The share of this GPU `w` occupies, in GPUs (1.0 is the whole GPU): its MIG
    /// instance's GPCs / 7 times the share of the instance its processes and shadow take, or
    /// on an MPS-only GPU that share of the whole GPU. What a tenant's quota counts.
    pub fn occupancy(&self, w: &Workload) -> f64 {
        let gpcs = match (&self.sharing, w.mig_instance) {
            (Sharing::Mig { instances }, Some(k)) => Some(instances.get(k).map_or(0, |i| u32::from(i.profile.compute()))),
            _ => None,
        };
        occupied_share(gpcs, w.mps_percent, w.processes, w.shadow_percent)
    }

    /// Sum of MPS percentages (with shadows' reserve) on an MPS-only GPU.
    pub fn mps_used(&self) -> f64 {
        self.workloads.iter().filter(|w| w.mig_instance.is_none()).map(|w| w.mps_percent * f64::from(w.processes) + w.shadow_percent).sum()
    }
}

/// The share of a GPU a workload occupies (1.0 is the whole GPU): what its processes and
/// shadow take (`processes × mps_percent + shadow_percent`, at most 100%) of its MIG
/// instance's `instance_gpcs` / 7, or of the whole GPU without MIG. The one measure of
/// [`GpuPlan::occupancy`] and of the controller's metering of a stored plan.
pub fn occupied_share(instance_gpcs: Option<u32>, mps_percent: f64, processes: u32, shadow_percent: f64) -> f64 {
    let share = ((mps_percent * f64::from(processes) + shadow_percent) / 100.0).clamp(0.0, 1.0);
    match instance_gpcs {
        Some(gpcs) => f64::from(gpcs) / f64::from(crate::mig::COMPUTE_SLICES) * share,
        None => share,
    }
}

/// Predicted service level of one service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServicePrediction {
    pub service: String,
    pub request_rate: f64,
    pub slo_ms: f64,
    /// Sum of the predicted throughput of all its workloads, req/s.
    pub capacity_rps: f64,
    /// Worst predicted batch latency over its workloads, ms.
    pub latency_ms: f64,
}

/// Why a service could not be planned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum InfeasibleReason {
    /// No profile data for the model on any usable GPU type.
    NoProfile { model: String },
    /// No usable GPU type (e.g. no MIG GPU for a MIG strategy).
    NoGpuType { needed: String },
    /// Not even the fastest profiled configuration meets half the SLO.
    SloTooTight { slo_ms: f64, best_latency_ms: f64 },
    /// The request rate cannot be reached within one GPU's resources.
    TooLarge { detail: String },
    /// Invalid demand (non-positive rate or SLO).
    InvalidDemand { detail: String },
    /// The strategy failed on this service (a defect some input reaches); the other
    /// services were planned without it.
    PlannerFailure { detail: String },
    /// Planned, it would take its tenant past a quota (the detail names it).
    OverQuota { detail: String },
    /// The fleet cannot grow and its tenant's weighted fair share of it is used.
    FleetFull { detail: String },
}

impl fmt::Display for InfeasibleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InfeasibleReason::NoProfile { model } => write!(f, "no profile for model `{model}`"),
            InfeasibleReason::NoGpuType { needed } => write!(f, "no GPU type offers {needed}"),
            InfeasibleReason::SloTooTight { slo_ms, best_latency_ms } => {
                write!(f, "SLO {slo_ms} ms too tight: best profiled batch latency {best_latency_ms:.3} ms exceeds the budget")
            }
            InfeasibleReason::TooLarge { detail } => write!(f, "too large: {detail}"),
            InfeasibleReason::InvalidDemand { detail } => write!(f, "invalid demand: {detail}"),
            InfeasibleReason::PlannerFailure { detail } => write!(f, "the planner failed on this service: {detail}"),
            InfeasibleReason::OverQuota { detail } => write!(f, "over quota: {detail}"),
            InfeasibleReason::FleetFull { detail } => write!(f, "fleet full: {detail}"),
        }
    }
}

/// A service the strategy could not place, with the reason (never dropped silently).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Infeasible {
    pub service: String,
    pub reason: InfeasibleReason,
}

/// A complete provisioning plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub strategy: String,
    pub gpus: Vec<GpuPlan>,
    pub predictions: Vec<ServicePrediction>,
    pub infeasible: Vec<Infeasible>,
}

impl Plan {
    pub fn gpus_used(&self) -> usize {
        self.gpus.len()
    }
    pub fn gpcs_used(&self) -> u32 {
        self.gpus.iter().map(GpuPlan::gpcs_used).sum()
    }
    /// Total MPS share over MPS-only GPUs, in GPUs (100% = 1.0).
    pub fn mps_gpus_used(&self) -> f64 {
        self.gpus.iter().map(GpuPlan::mps_used).sum::<f64>() / 100.0
    }
    /// Cost per hour given each type's price.
    pub fn cost_per_hour(&self, types: &[crate::input::GpuType]) -> f64 {
        self.gpus.iter().map(|g| types.iter().find(|t| t.name == g.gpu_type).map_or(0.0, |t| t.price_per_hour)).sum()
    }
    pub fn prediction(&self, service: &str) -> Option<&ServicePrediction> {
        self.predictions.iter().find(|p| p.service == service)
    }
}

/// Builds the per-service predictions from the workloads of a plan.
pub(crate) fn predictions_from_gpus(gpus: &[GpuPlan], services: &[crate::input::ServiceDemand]) -> Vec<ServicePrediction> {
    let by_name: std::collections::HashMap<&str, &crate::input::ServiceDemand> = services.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut index = std::collections::HashMap::new();
    let mut out: Vec<ServicePrediction> = Vec::new();
    for g in gpus {
        for w in &g.workloads {
            let i = *index.entry(w.service.clone()).or_insert_with(|| {
                let s = by_name.get(w.service.as_str());
                out.push(ServicePrediction {
                    service: w.service.clone(),
                    request_rate: s.map_or(0.0, |s| s.request_rate),
                    slo_ms: s.map_or(0.0, |s| s.slo_ms),
                    capacity_rps: 0.0,
                    latency_ms: 0.0,
                });
                out.len() - 1
            });
            out[i].capacity_rps += w.predicted_throughput;
            out[i].latency_ms = out[i].latency_ms.max(w.predicted_latency_ms);
        }
    }
    out
}
