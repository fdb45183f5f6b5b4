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
    /// The model is profiled, but not with what the strategy needs (the detail says what).
    ProfileIncomplete { detail: String },
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
            InfeasibleReason::ProfileIncomplete { detail } => write!(f, "incomplete profile: {detail}"),
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

    /// This plan without `service`: its workloads, the MIG instances they alone used and the
    /// GPUs left empty go; every other workload stays where it is, in its instance and with
    /// its share (a GPU keeps its slot). What minimal re-planning starts from when a service
    /// leaves a pool. A layout that loses instances stays valid (fewer slices are used).
    pub fn without_service(&self, service: &str) -> Plan {
        let mut gpus = Vec::with_capacity(self.gpus.len());
        for g in &self.gpus {
            if g.workloads.iter().all(|w| w.service != service) {
                gpus.push(g.clone());
                continue;
            }
            let workloads: Vec<Workload> = g.workloads.iter().filter(|w| w.service != service).cloned().collect();
            if workloads.is_empty() {
                continue;
            }
            let sharing = match &g.sharing {
                Sharing::MpsOnly => Sharing::MpsOnly,
                Sharing::Mig { instances } => {
                    // An instance stays when a remaining workload uses it or no workload of
                    // `service` did (the plan had it free).
                    let used = |k: usize| workloads.iter().any(|w| w.mig_instance == Some(k));
                    let left_by = |k: usize| g.workloads.iter().any(|w| w.service == service && w.mig_instance == Some(k));
                    let kept: Vec<usize> = (0..instances.len()).filter(|&k| used(k) || !left_by(k)).collect();
                    let mut workloads = workloads;
                    for w in &mut workloads {
                        w.mig_instance = w.mig_instance.and_then(|k| kept.iter().position(|&x| x == k));
                    }
                    gpus.push(GpuPlan {
                        slot: g.slot,
                        gpu_type: g.gpu_type.clone(),
                        sharing: Sharing::Mig { instances: kept.iter().map(|&k| instances[k]).collect() },
                        workloads,
                    });
                    continue;
                }
            };
            gpus.push(GpuPlan { slot: g.slot, gpu_type: g.gpu_type.clone(), sharing, workloads });
        }
        Plan {
            strategy: self.strategy.clone(),
            gpus,
            predictions: self.predictions.iter().filter(|p| p.service != service).cloned().collect(),
            infeasible: self.infeasible.iter().filter(|f| f.service != service).cloned().collect(),
        }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mig::MigProfile::*;

    /// A workload of `service` (half the share, batch 4, 10 req/s in 5 ms), for tests.
    pub(crate) fn workload(service: &str, mig_instance: Option<usize>) -> Workload {
        Workload {
            service: service.into(),
            mig_instance,
            mps_percent: 50.0,
            batch_size: 4,
            processes: 1,
            shadow_percent: 0.0,
            predicted_throughput: 10.0,
            predicted_latency_ms: 5.0,
        }
    }

    fn prediction(service: &str) -> ServicePrediction {
        ServicePrediction { service: service.into(), request_rate: 1.0, slo_ms: 50.0, capacity_rps: 100.0, latency_ms: 10.0 }
    }

    #[test]
    fn a_service_leaving_takes_its_instances_and_emptied_gpus_and_nothing_else() {
        let mig = |instances: &[(crate::mig::MigProfile, u8)]| Sharing::Mig {
            instances: instances.iter().map(|&(profile, start)| MigInstance { profile, start }).collect(),
        };
        let plan = Plan {
            strategy: "t".into(),
            gpus: vec![
                // "a" on 4g@0, "b" on 2g@4, "a" again on 1g@6.
                GpuPlan {
                    slot: 3,
                    gpu_type: "A100".into(),
                    sharing: mig(&[(G4, 0), (G2, 4), (G1, 6)]),
                    workloads: vec![workload("a", Some(0)), workload("b", Some(1)), workload("a", Some(2))],
                },
                GpuPlan { slot: 5, gpu_type: "A100".into(), sharing: mig(&[(G7, 0)]), workloads: vec![workload("a", Some(0))] },
                GpuPlan {
                    slot: 6,
                    gpu_type: "T4".into(),
                    sharing: Sharing::MpsOnly,
                    workloads: vec![workload("a", None), workload("c", None)],
                },
            ],
            predictions: vec![prediction("a"), prediction("b"), prediction("c")],
            infeasible: vec![],
        };
        let left = plan.without_service("a");
        assert_eq!(left.gpus.len(), 2, "the GPU only \"a\" used goes");
        assert_eq!(left.gpus[0].slot, 3);
        assert_eq!(left.gpus[0].sharing, mig(&[(G2, 4)]));
        assert_eq!(left.gpus[0].workloads, vec![workload("b", Some(0))]);
        assert_eq!((left.gpus[1].slot, &left.gpus[1].workloads), (6, &vec![workload("c", None)]));
        assert_eq!(left.predictions, vec![prediction("b"), prediction("c")]);
        assert_eq!(plan.without_service("nobody"), plan);
    }
}
