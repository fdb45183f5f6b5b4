//! GSLICE self-tuning of the MPS shares in the committed Plan (`gslice.txt`, Sec. 3.2.2,
//! Algorithm 1 "GPU Resource Tuning Algorithm", with the 10 s hold-down of Sec. 3.2.1), as a
//! pure function: the leader's tuner loop (`crate::loops`) passes the committed plan, the
//! services' SLOs, the routers' latest windows and the time, and gets back the plan with new
//! shares (or `None`) and every decision taken. No IO, no clocks.
//!
//! Rules, and where they come from:
//! * Only workloads on MPS-only GPUs (an empty `mig_layout`: V100/T4-style GPUs, where the
//!   shares are what iGniter or GSLICE set) are tuned. Shares inside a MIG instance belong
//!   to the ParvaGPU segment that sized the instance and stay as planned.
//! * Algorithm 1 runs per workload on [`planner::policy::gslice::GpuTuner`]: increase on a
//!   latency or throughput deficit, decrease when both residuals exceed 5%, hold otherwise;
//!   at most one change per hold-down.
//! * A GPU's shares plus shadow shares (`Σ mps_percent × processes + shadow_mps_percent`,
//!   the sum the plan validation and the agents bound) never exceed 100. Decreases are
//!   applied first so that what they free is there for increases in the same pass;
//!   increases then go in plan order and are clipped to the free share (the decision says
//!   so).
//! * A decrease is made only when an increase on the same GPU in the same pass needs the
//!   share it frees, and only as many as that needs (plan order). A share is fixed when its
//!   process creates its CUDA context, so every move restarts the process: a decrease that
//!   frees share no one here asks for gains nothing until the next re-plan, which sizes the
//!   GPU afresh anyway, and costs a restart (issue 59: a move must pay for its restart).
//!   GSLICE decreases to make room for other functions it then places; gpuplane places
//!   only by re-planning. GSLICE Sec. 3.2.3 would instead re-divide the whole GPU by weighted max-min fair
//!   share; taking share from other services' workloads is left to a re-plan.
//! * Shares never go below the GSLICE floor ([`TunerConfig::min_gpu_pct`]; Algorithm 1's
//!   lower bound) and are whole percents: the agent rounds `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
//!   to one, so a fractional change would restart a process for nothing.
//! * Batch sizes stay as planned. SLAB (Sec. 3.3.1) re-derives the batch from the latency of
//!   each executed batch (`b · SLO / L`); the reports carry the router's per-second p99 of
//!   requests, queueing included, which is not that signal, and driving the batch from the
//!   same p99 as the share would make two controllers answer one deficit.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use planner::policy::gslice::{GpuTuner, GsliceError, TunerConfig, TuningAction, TuningDecision};
use planner::policy::InvalidField;

use crate::resources::{GpuAssignment, PlanSpec};

/// The fraction of the SLO the tuner aims at by default: the SLO itself. The margin a
/// service needs below its SLO (the windows' p99 is noisy around its mean) is the
/// autoscaler's to size (`planner::policy::slo_headroom`, from the service's own windows);
/// a tuner aiming at 0.8 of the SLO answered the same noise a second time, with a restart
/// for every share it moved: in fleet-sim (seed 1, default settings) it made 580 restarts a
/// day at 0.8 and 298 at 1.0, for 99.938% and 99.936% of windows met.
pub const DEFAULT_SLO_FRACTION: f64 = 1.0;

/// How the tuner runs Algorithm 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TuningSettings {
    slo_fraction: f64,
    gslice: TunerConfig,
}

impl TuningSettings {
    /// `slo_fraction` in `(0, 1]`: the latency target is this fraction of the SLO.
    pub fn new(slo_fraction: f64, gslice: TunerConfig) -> Result<Self, InvalidField> {
        if !(slo_fraction > 0.0 && slo_fraction <= 1.0) {
            return Err(InvalidField::new("slo_fraction", format!("must be in (0, 1], got {slo_fraction}")));
        }
        // GpuTuner::new is where Algorithm 1's parameters are checked.
        GpuTuner::new(1.0, gslice).map_err(|GsliceError::Invalid(field)| field)?;
        Ok(TuningSettings { slo_fraction, gslice })
    }

    pub fn slo_fraction(&self) -> f64 {
        self.slo_fraction
    }

    pub fn gslice(&self) -> &TunerConfig {
        &self.gslice
    }
}

impl Default for TuningSettings {
    fn default() -> Self {
        TuningSettings { slo_fraction: DEFAULT_SLO_FRACTION, gslice: TunerConfig::default() }
    }
}

/// A router's latest window for one service on one node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// p99 latency of the requests completed in the window, ms; 0 when none completed.
    pub p99_ms: f64,
    pub throughput_rps: f64,
    pub arrival_rps: f64,
}

/// Measurements keyed by (node, service): the router measures a service per node.
pub type Measurements = BTreeMap<(String, String), Measurement>;

/// A tuned workload: one service on one physical GPU.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub node: String,
    pub gpu_uuid: String,
    pub service: String,
}

impl fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.node, self.gpu_uuid, self.service)
    }
}

#[derive(Clone, Debug)]
struct WorkloadTuner {
    /// The latency target the tuner was built for; a changed SLO builds a new tuner.
    target_ms: f64,
    gslice: GpuTuner,
}

/// The tuners of the workloads being tuned (EWMAs and hold-downs). Soft state of the
/// leader, like the reports it is fed from: a new leader starts afresh.
#[derive(Clone, Debug, Default)]
pub struct TunerState {
    tuners: BTreeMap<WorkloadKey, WorkloadTuner>,
}

impl TunerState {
    /// Whether `key` has a tuner (it has been measured and is still in the plan).
    pub fn tracks(&self, key: &WorkloadKey) -> bool {
        self.tuners.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.tuners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tuners.is_empty()
    }
}

/// What happened to one workload's share in a pass.
#[derive(Clone, Debug, PartialEq)]
pub enum ShareOutcome {
    /// Algorithm 1's change, applied (rounded to a whole percent).
    Changed { from_pct: f64, to_pct: f64 },
    /// An increase cut to the GPU's free share: shares plus shadows stay within 100%.
    Clipped { from_pct: f64, wanted_pct: f64, to_pct: f64 },
    /// An increase with less than a whole percent free on the GPU. Algorithm 1 took the
    /// decision, so its hold-down runs: a full GPU is not asked again on every pass.
    NoFreeShare { from_pct: f64, wanted_pct: f64 },
    /// A decrease no increase on the GPU needs in this pass: not worth its restart. As with
    /// [`ShareOutcome::NoFreeShare`], its hold-down runs.
    NotNeeded { from_pct: f64, wanted_pct: f64 },
    /// A change smaller than the whole percent the share is set in.
    RoundsToCurrent { from_pct: f64, wanted_pct: f64 },
    /// Algorithm 1 holds; the reason is in the decision.
    Held,
    /// No request completed in the window: no latency to tune on (idle or stalled; a
    /// stalled process is the agent's failover to handle).
    NoSample,
    /// The measurement or the SLO was refused by Algorithm 1 (named field and reason).
    BadSample { error: String },
    /// A second workload of the same service on the same GPU: the router's measurement
    /// cannot tell them apart, so only the first is tuned.
    Duplicate,
}

impl ShareOutcome {
    /// Whether the share in the plan changed.
    pub fn changes_share(&self) -> bool {
        matches!(self, ShareOutcome::Changed { .. } | ShareOutcome::Clipped { .. })
    }
}

/// One workload's decision in a pass.
#[derive(Clone, Debug, PartialEq)]
pub struct ShareDecision {
    pub workload: WorkloadKey,
    /// Algorithm 1's decision (with its residuals); `None` when it did not run.
    pub gslice: Option<TuningDecision>,
    pub outcome: ShareOutcome,
}

/// The result of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct TuningPass {
    /// The plan with the new shares; `None` when no share changed.
    pub plan: Option<PlanSpec>,
    /// In plan order; workloads without a measurement have none.
    pub decisions: Vec<ShareDecision>,
}

/// One tuning pass over `plan` at `now_s` (seconds on any clock that never goes back, the
/// same for every pass on `state`).
///
/// `slos_ms` maps each existing service to its latency SLO; a workload whose service is not
/// in it (deleted, awaiting a re-plan) is not tuned. `measured` holds the routers' latest
/// windows by (node, service): every workload of the service on that node is fed the
/// node's window whole. Algorithm 1 sees throughput and arrival rate only through
/// `residualT / avgT` and `residualT / arrivalRate`, which do not change when both are split
/// by the same fraction, so no split among the workloads is needed.
///
/// `state` keeps one tuner per (node, GPU, service); tuners of workloads no longer tuned in
/// `plan` (service gone, GPU gone or partitioned with MIG) are dropped, and a changed SLO
/// starts its workload's tuner afresh. The returned plan differs from `plan` only in
/// `mps_percent`s.
pub fn tune_shares(
    plan: &PlanSpec,
    slos_ms: &BTreeMap<String, f64>,
    measured: &Measurements,
    now_s: f64,
    settings: &TuningSettings,
    state: &mut TunerState,
) -> TuningPass {
    // The plan is a persistent vector: only the GPUs whose shares change are written into
    // the copy (a mutable pass over all of them copied the whole plan, 80,000 GPUs at
    // 10,000 hosts, on every tuning pass).
    let mut tuned = plan.clone();
    let mut decisions = Vec::new();
    let mut tunable = BTreeSet::new();
    for (i, gpu) in plan.gpus.iter().enumerate().filter(|(_, g)| g.mig_layout.is_empty()) {
        let proposals = observe_gpu(gpu, slos_ms, measured, now_s, settings, state, &mut tunable);
        if proposals.is_empty() {
            continue;
        }
        let mut changed = gpu.clone();
        decisions.extend(apply_to_gpu(&mut changed, proposals, settings));
        if changed != *gpu {
            tuned.gpus.set(i, changed);
        }
    }
    state.tuners.retain(|key, _| tunable.contains(key));
    let changed = decisions.iter().any(|d| d.outcome.changes_share());
    TuningPass { plan: changed.then_some(tuned), decisions }
}

/// Algorithm 1's view of one workload before its GPU's shares are divided.
enum Proposal {
    /// Decided: a change (or hold) of workload `index`.
    Decided { index: usize, decision: ShareDecision },
    /// Algorithm 1 wants workload `index` moved to `to_pct`.
    Move { index: usize, workload: WorkloadKey, decision: TuningDecision, to_pct: f64 },
}

/// Feeds every measured workload of `gpu` to its tuner.
fn observe_gpu(
    gpu: &GpuAssignment,
    slos_ms: &BTreeMap<String, f64>,
    measured: &Measurements,
    now_s: f64,
    settings: &TuningSettings,
    state: &mut TunerState,
    tunable: &mut BTreeSet<WorkloadKey>,
) -> Vec<Proposal> {
    let mut proposals = Vec::new();
    let mut seen = BTreeSet::new();
    for (index, w) in gpu.workloads.iter().enumerate() {
        let Some(&slo_ms) = slos_ms.get(&w.service) else { continue };
        let workload = WorkloadKey { node: gpu.node.clone(), gpu_uuid: gpu.gpu_uuid.clone(), service: w.service.clone() };
        let decided =
            |workload: WorkloadKey, gslice, outcome| Proposal::Decided { index, decision: ShareDecision { workload, gslice, outcome } };
        if !seen.insert(workload.clone()) {
            if measured.contains_key(&(gpu.node.clone(), w.service.clone())) {
                proposals.push(decided(workload, None, ShareOutcome::Duplicate));
            }
            continue;
        }
        tunable.insert(workload.clone());
        let Some(m) = measured.get(&(gpu.node.clone(), w.service.clone())) else { continue };
        if m.p99_ms == 0.0 {
            proposals.push(decided(workload, None, ShareOutcome::NoSample));
            continue;
        }
        let target_ms = slo_ms * settings.slo_fraction;
        if state.tuners.get(&workload).is_none_or(|t| t.target_ms != target_ms) {
            match GpuTuner::new(target_ms, settings.gslice) {
                Ok(gslice) => {
                    state.tuners.insert(workload.clone(), WorkloadTuner { target_ms, gslice });
                }
                Err(e) => {
                    state.tuners.remove(&workload);
                    proposals.push(decided(workload, None, ShareOutcome::BadSample { error: e.to_string() }));
                    continue;
                }
            }
        }
        let tuner = state.tuners.get_mut(&workload).expect("a tuner for every measured workload, made above");
        match tuner.gslice.observe(now_s, m.p99_ms, m.throughput_rps, m.arrival_rps, w.mps_percent) {
            Err(e) => proposals.push(decided(workload, None, ShareOutcome::BadSample { error: e.to_string() })),
            Ok(decision) => match decision.action {
                TuningAction::Increase { to_pct, .. } | TuningAction::Decrease { to_pct, .. } => {
                    proposals.push(Proposal::Move { index, workload, decision, to_pct })
                }
                TuningAction::Hold { .. } => proposals.push(decided(workload, Some(decision), ShareOutcome::Held)),
            },
        }
    }
    proposals
}

/// Applies the moves to `gpu`: the decreases the increases need first (in plan order, as
/// far as they need them), then the increases within the free share. Returns the decisions
/// in plan order.
fn apply_to_gpu(gpu: &mut GpuAssignment, proposals: Vec<Proposal>, settings: &TuningSettings) -> Vec<ShareDecision> {
    let floor_pct = settings.gslice.min_gpu_pct.ceil();
    // Retiring workloads (`provision::handover`) hold their shares until they go.
    let mut used: f64 =
        gpu.workloads.iter().chain(&gpu.retiring).map(|w| w.mps_percent * f64::from(w.processes) + w.shadow_mps_percent).sum();
    let mut decisions: Vec<(usize, ShareDecision)> = Vec::new();
    let (mut increases, mut decreases) = (Vec::new(), Vec::new());
    for proposal in proposals {
        match proposal {
            Proposal::Decided { index, decision } => decisions.push((index, decision)),
            Proposal::Move { index, workload, decision, to_pct } if to_pct > gpu.workloads[index].mps_percent => {
                increases.push((index, workload, decision, to_pct))
            }
            Proposal::Move { index, workload, decision, to_pct } => decreases.push((index, workload, decision, to_pct)),
        }
    }
    // What the increases ask beyond the GPU's free share, in whole percents.
    let mut short: f64 = increases
        .iter()
        .map(|(index, _, _, to_pct)| {
            let w = &gpu.workloads[*index];
            (to_pct.round().min(100.0) - w.mps_percent).max(0.0) * f64::from(w.processes)
        })
        .sum::<f64>()
        - (100.0 - used).max(0.0);
    for (index, workload, decision, to_pct) in decreases {
        let w = &mut gpu.workloads[index];
        let from_pct = w.mps_percent;
        let wanted_pct = to_pct.round().max(floor_pct);
        let outcome = if wanted_pct >= from_pct {
            ShareOutcome::RoundsToCurrent { from_pct, wanted_pct }
        } else if short <= 0.0 {
            ShareOutcome::NotNeeded { from_pct, wanted_pct }
        } else {
            w.mps_percent = wanted_pct;
            let freed = (from_pct - wanted_pct) * f64::from(w.processes);
            used -= freed;
            short -= freed;
            ShareOutcome::Changed { from_pct, to_pct: wanted_pct }
        };
        decisions.push((index, ShareDecision { workload, gslice: Some(decision), outcome }));
    }
    for (index, workload, decision, to_pct) in increases {
        let w = &mut gpu.workloads[index];
        let from_pct = w.mps_percent;
        let wanted_pct = to_pct.round().min(100.0);
        let processes = f64::from(w.processes);
        // The most this workload can have: its share plus the GPU's free share, split over
        // its processes, in whole percents (the epsilon absorbs the sum's rounding error).
        let room_pct = (from_pct + (100.0 - used).max(0.0) / processes + 1e-9).floor();
        let outcome = if wanted_pct <= from_pct {
            ShareOutcome::RoundsToCurrent { from_pct, wanted_pct }
        } else if wanted_pct <= room_pct {
            ShareOutcome::Changed { from_pct, to_pct: wanted_pct }
        } else if room_pct > from_pct {
            ShareOutcome::Clipped { from_pct, wanted_pct, to_pct: room_pct }
        } else {
            ShareOutcome::NoFreeShare { from_pct, wanted_pct }
        };
        if let ShareOutcome::Changed { to_pct, .. } | ShareOutcome::Clipped { to_pct, .. } = outcome {
            w.mps_percent = to_pct;
            used += (to_pct - from_pct) * processes;
        }
        decisions.push((index, ShareDecision { workload, gslice: Some(decision), outcome }));
    }
    decisions.sort_by_key(|(index, _)| *index);
    decisions.into_iter().map(|(_, d)| d).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{validate_spec, MigPlacement, ServicePrediction, Spec, WorkloadAssignment};
    use planner::policy::gslice::{Deficit, HoldReason};

    fn wl(service: &str, pct: f64, shadow: f64) -> WorkloadAssignment {
        WorkloadAssignment {
            service: service.into(),
            mig_instance: None,
            mps_percent: pct,
            batch: 8,
            processes: 1,
            shadow_mps_percent: shadow,
            tenant: String::new(),
            isolation: crate::resources::Isolation::default(),
            batch_ms: 0.0,
        }
    }

    fn gpu(node: &str, uuid: &str, workloads: Vec<WorkloadAssignment>) -> GpuAssignment {
        GpuAssignment { node: node.into(), gpu_uuid: uuid.into(), mig_layout: vec![], workloads, retiring: vec![] }
    }

    fn plan(gpus: Vec<GpuAssignment>) -> PlanSpec {
        PlanSpec {
            strategy: "igniter".into(),
            gpus: gpus.into(),
            services: vec![ServicePrediction { service: "web".into(), capacity_rps: 100.0, latency_ms: 30.0, infeasible_reason: None }]
                .into(),
            inputs_digest: "fnv1a64:0123456789abcdef".into(),
            trace_parent: String::new(),
        }
    }

    fn slos(list: &[(&str, f64)]) -> BTreeMap<String, f64> {
        list.iter().map(|&(s, ms)| (s.to_string(), ms)).collect()
    }

    fn measured(list: &[(&str, &str, f64, f64, f64)]) -> Measurements {
        list.iter()
            .map(|&(node, service, p99_ms, throughput_rps, arrival_rps)| {
                ((node.to_string(), service.to_string()), Measurement { p99_ms, throughput_rps, arrival_rps })
            })
            .collect()
    }

    fn key(node: &str, gpu: &str, service: &str) -> WorkloadKey {
        WorkloadKey { node: node.into(), gpu_uuid: gpu.into(), service: service.into() }
    }

    /// EWMA weight 1 (each window replaces the averages), so the arithmetic is by hand.
    fn instant() -> TuningSettings {
        // The cases below were worked by hand at a target of 0.8 of the SLO.
        TuningSettings::new(0.8, TunerConfig { ewma_weight: 1.0, ..TunerConfig::default() }).unwrap()
    }

    fn outcomes(pass: &TuningPass) -> Vec<ShareOutcome> {
        pass.decisions.iter().map(|d| d.outcome.clone()).collect()
    }

    fn total(gpu: &GpuAssignment) -> f64 {
        gpu.workloads.iter().map(|w| w.mps_percent * f64::from(w.processes) + w.shadow_mps_percent).sum()
    }

    #[test]
    fn a_latency_deficit_raises_the_share_and_nothing_else_changes() {
        let before = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0)])]);
        let mut state = TunerState::default();
        // Target 0.8 × 50 = 40 ms; p99 80: changeFactor = 40 / 80 = 0.5, so 30 → 45.
        let pass =
            tune_shares(&before, &slos(&[("web", 50.0)]), &measured(&[("n1", "web", 80.0, 100.0, 100.0)]), 0.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Changed { from_pct: 30.0, to_pct: 45.0 }]);
        let d = &pass.decisions[0];
        assert_eq!(d.workload, key("n1", "GPU-0", "web"));
        assert!(matches!(d.gslice.unwrap().action, TuningAction::Increase { cause: Deficit::Latency, .. }), "{d:?}");
        let mut expected = before.clone();
        expected.gpus[0].workloads[0].mps_percent = 45.0;
        assert_eq!(pass.plan, Some(expected), "only the share moves; digest, batch, shadow and predictions stay");
        assert!(state.tracks(&key("n1", "GPU-0", "web")));
    }

    #[test]
    fn the_latency_target_is_a_fraction_of_the_slo() {
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0)])]);
        let m = measured(&[("n1", "web", 45.0, 100.0, 100.0)]);
        // 45 ms is within a 50 ms SLO but over the 40 ms target: 30 × (1 + 5/45) = 33.3 → 33.
        let pass = tune_shares(&p, &slos(&[("web", 50.0)]), &m, 0.0, &instant(), &mut TunerState::default());
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Changed { from_pct: 30.0, to_pct: 33.0 }]);
        // Aiming at the SLO itself, the same window is within the threshold.
        let at_slo = TuningSettings::new(1.0, *instant().gslice()).unwrap();
        let pass = tune_shares(&p, &slos(&[("web", 50.0)]), &m, 0.0, &at_slo, &mut TunerState::default());
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Held]);
        assert_eq!(pass.decisions[0].gslice.unwrap().action, TuningAction::Hold { reason: HoldReason::WithinThreshold });
        assert_eq!(pass.plan, None);
    }

    #[test]
    fn headroom_in_both_residuals_lowers_the_share_only_for_a_neighbour_that_needs_it() {
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 60.0, 10.0)])]);
        // residualL = 40 − 36 = 4 (10%), residualT = 110 − 100 = 10 (10%): changeFactor =
        // max(4/36, 10/110) = 1/9, so 60 − 6.67 = 53.3 → 53. No one on the GPU needs the
        // 7 points: not worth a restart.
        let headroom = measured(&[("n1", "web", 36.0, 110.0, 100.0)]);
        let pass = tune_shares(&p, &slos(&[("web", 50.0)]), &headroom, 0.0, &instant(), &mut TunerState::default());
        assert_eq!(outcomes(&pass), vec![ShareOutcome::NotNeeded { from_pct: 60.0, wanted_pct: 53.0 }]);
        assert!(matches!(pass.decisions[0].gslice.unwrap().action, TuningAction::Decrease { .. }));
        assert_eq!(pass.plan, None);
        // A full GPU whose other workload misses its target: the decrease makes room for it.
        let full = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 60.0, 10.0), wl("ocr", 30.0, 0.0)])]);
        let m = measured(&[("n1", "web", 36.0, 110.0, 100.0), ("n1", "ocr", 80.0, 100.0, 100.0)]);
        let pass = tune_shares(&full, &slos(&[("web", 50.0), ("ocr", 50.0)]), &m, 0.0, &instant(), &mut TunerState::default());
        assert_eq!(
            outcomes(&pass),
            vec![
                ShareOutcome::Changed { from_pct: 60.0, to_pct: 53.0 },
                ShareOutcome::Clipped { from_pct: 30.0, wanted_pct: 45.0, to_pct: 37.0 }
            ]
        );
        assert_eq!(total(&pass.plan.unwrap().gpus[0]), 100.0);
        // Latency headroom alone (throughput only 2% over the arrivals) holds.
        let pass = tune_shares(
            &p,
            &slos(&[("web", 50.0)]),
            &measured(&[("n1", "web", 36.0, 102.0, 100.0)]),
            0.0,
            &instant(),
            &mut TunerState::default(),
        );
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Held]);
        assert_eq!(pass.plan, None);
    }

    #[test]
    fn only_the_decreases_an_increase_needs_are_made() {
        // A full GPU: "a" and "b" have headroom, "c" misses its target (40 ms).
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("a", 40.0, 0.0), wl("b", 40.0, 0.0), wl("c", 20.0, 0.0)])]);
        let m = measured(&[("n1", "a", 36.0, 110.0, 100.0), ("n1", "b", 36.0, 110.0, 100.0), ("n1", "c", 44.0, 100.0, 100.0)]);
        let pass = tune_shares(&p, &slos(&[("a", 50.0), ("b", 50.0), ("c", 50.0)]), &m, 0.0, &instant(), &mut TunerState::default());
        // c: 40 − 44 = −4, changeFactor 4/44: 20 → 21.8 → 22, 2 points short. a's decrease
        // (40 → 36) covers them; b's is not needed.
        assert_eq!(
            outcomes(&pass),
            vec![
                ShareOutcome::Changed { from_pct: 40.0, to_pct: 36.0 },
                ShareOutcome::NotNeeded { from_pct: 40.0, wanted_pct: 36.0 },
                ShareOutcome::Changed { from_pct: 20.0, to_pct: 22.0 },
            ]
        );
        assert_eq!(total(&pass.plan.unwrap().gpus[0]), 98.0);
    }

    #[test]
    fn a_second_change_waits_for_the_hold_down() {
        let slo = slos(&[("web", 50.0)]);
        let deficit = measured(&[("n1", "web", 80.0, 100.0, 100.0)]);
        let mut state = TunerState::default();
        let p0 = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0)])]);
        let p1 = tune_shares(&p0, &slo, &deficit, 0.0, &instant(), &mut state).plan.expect("first change");
        assert_eq!(p1.gpus[0].workloads[0].mps_percent, 45.0);
        // 5 s later the deficit persists, but the hold-down (10 s) holds the change.
        let pass = tune_shares(&p1, &slo, &deficit, 5.0, &instant(), &mut state);
        assert_eq!(pass.plan, None);
        assert!(matches!(
            pass.decisions[0].gslice.unwrap().action,
            TuningAction::Hold { reason: HoldReason::HoldDown { until_s: 10.0, .. } }
        ));
        // At 10 s: 45 × 1.5 = 67.5 → 68.
        let pass = tune_shares(&p1, &slo, &deficit, 10.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Changed { from_pct: 45.0, to_pct: 68.0 }]);
    }

    #[test]
    fn increases_are_clipped_so_shares_and_shadows_stay_within_100() {
        let slo = slos(&[("web", 50.0)]);
        let deficit = measured(&[("n1", "web", 80.0, 100.0, 100.0)]);
        let mut state = TunerState::default();
        // 30 + 10 (shadow) + 50 = 90: 10 free, so web gets 40 of the 45 it asks for.
        let p0 = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0), wl("batch", 50.0, 0.0)])]);
        let pass = tune_shares(&p0, &slo, &deficit, 0.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Clipped { from_pct: 30.0, wanted_pct: 45.0, to_pct: 40.0 }]);
        let p1 = pass.plan.unwrap();
        assert_eq!(total(&p1.gpus[0]), 100.0);
        assert_eq!(p1.gpus[0].workloads[1].mps_percent, 50.0, "another service's share is not taken");
        validate_spec(&Spec::Plan(p1.clone())).unwrap();
        // Full: the next increase has nowhere to go.
        let pass = tune_shares(&p1, &slo, &deficit, 10.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::NoFreeShare { from_pct: 40.0, wanted_pct: 60.0 }]);
        assert_eq!(pass.plan, None);
    }

    #[test]
    fn the_free_share_is_divided_over_a_workloads_processes() {
        // 2 × 20 + 10 + 40 = 90: 10 free is 5 more per process, so 20 → 25 (of 30 asked).
        let mut two = wl("web", 20.0, 10.0);
        two.processes = 2;
        let p = plan(vec![gpu("n1", "GPU-0", vec![two, wl("batch", 40.0, 0.0)])]);
        let pass = tune_shares(
            &p,
            &slos(&[("web", 50.0)]),
            &measured(&[("n1", "web", 80.0, 100.0, 100.0)]),
            0.0,
            &instant(),
            &mut TunerState::default(),
        );
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Clipped { from_pct: 20.0, wanted_pct: 30.0, to_pct: 25.0 }]);
        assert_eq!(total(&pass.plan.unwrap().gpus[0]), 100.0);
    }

    #[test]
    fn a_decrease_frees_share_for_an_increase_in_the_same_pass_whatever_the_order() {
        // Full GPU: b (first in the plan) misses its target, a has headroom.
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("b", 40.0, 5.0), wl("a", 50.0, 5.0)])]);
        let m = measured(&[("n1", "b", 80.0, 100.0, 100.0), ("n1", "a", 36.0, 110.0, 100.0)]);
        let pass = tune_shares(&p, &slos(&[("a", 50.0), ("b", 50.0)]), &m, 0.0, &instant(), &mut TunerState::default());
        // a: 50 − 50/9 = 44.4 → 44 frees 6; b asks for 60 and gets 46.
        assert_eq!(
            outcomes(&pass),
            vec![
                ShareOutcome::Clipped { from_pct: 40.0, wanted_pct: 60.0, to_pct: 46.0 },
                ShareOutcome::Changed { from_pct: 50.0, to_pct: 44.0 },
            ]
        );
        assert_eq!(total(&pass.plan.unwrap().gpus[0]), 100.0);
    }

    #[test]
    fn shares_never_go_below_the_gslice_floor() {
        let slo = slos(&[("web", 50.0), ("hungry", 50.0)]);
        // "web" idles on a full GPU next to "hungry", which misses its target badly.
        let m = measured(&[("n1", "web", 1.0, 1000.0, 100.0), ("n1", "hungry", 400.0, 100.0, 100.0)]);
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 20.0, 10.0), wl("hungry", 70.0, 0.0)])]);
        let pass = tune_shares(&p, &slo, &m, 0.0, &instant(), &mut TunerState::default());
        assert_eq!(outcomes(&pass)[0], ShareOutcome::Changed { from_pct: 20.0, to_pct: 5.0 });
        // At the floor: held there.
        let pass = tune_shares(&pass.plan.unwrap(), &slo, &m, 0.0, &instant(), &mut TunerState::default());
        assert_eq!(pass.decisions[0].gslice.unwrap().action, TuningAction::Hold { reason: HoldReason::AtBound { bound_pct: 5.0 } });
        // A fractional floor is rounded up, never down.
        let floor = TuningSettings::new(0.8, TunerConfig { ewma_weight: 1.0, min_gpu_pct: 7.5, ..TunerConfig::default() }).unwrap();
        let pass = tune_shares(&p, &slo, &m, 0.0, &floor, &mut TunerState::default());
        assert_eq!(outcomes(&pass)[0], ShareOutcome::Changed { from_pct: 20.0, to_pct: 8.0 });
    }

    #[test]
    fn a_change_below_a_whole_percent_leaves_the_share() {
        // 5% share, p99 42.45 ms: changeFactor ≈ 0.058 ≥ 5%, but 5.29 rounds to 5.
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 5.0, 10.0)])]);
        let pass = tune_shares(
            &p,
            &slos(&[("web", 50.0)]),
            &measured(&[("n1", "web", 42.45, 100.0, 100.0)]),
            0.0,
            &instant(),
            &mut TunerState::default(),
        );
        assert!(matches!(outcomes(&pass)[..], [ShareOutcome::RoundsToCurrent { from_pct: 5.0, wanted_pct: 5.0 }]), "{pass:?}");
        assert_eq!(pass.plan, None);
    }

    #[test]
    fn workloads_on_mig_gpus_are_not_tuned() {
        let mut mig = gpu("n1", "GPU-0", vec![WorkloadAssignment { mig_instance: Some(0), ..wl("web", 50.0, 10.0) }]);
        mig.mig_layout = vec![MigPlacement { profile: "3g".into(), start: 0 }];
        let mut state = TunerState::default();
        let pass = tune_shares(
            &plan(vec![mig]),
            &slos(&[("web", 50.0)]),
            &measured(&[("n1", "web", 200.0, 10.0, 100.0)]),
            0.0,
            &instant(),
            &mut state,
        );
        assert_eq!(pass, TuningPass { plan: None, decisions: vec![] });
        assert!(state.is_empty());
    }

    #[test]
    fn workloads_without_a_measurement_or_a_service_are_untouched() {
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0), wl("batch", 20.0, 0.0), wl("gone", 20.0, 0.0)])]);
        // web has a window (and a deficit); batch has none; gone's Service was deleted.
        let m = measured(&[("n1", "web", 80.0, 100.0, 100.0), ("n1", "gone", 80.0, 100.0, 100.0), ("n2", "batch", 80.0, 100.0, 100.0)]);
        let mut state = TunerState::default();
        let pass = tune_shares(&p, &slos(&[("web", 50.0), ("batch", 50.0)]), &m, 0.0, &instant(), &mut state);
        assert_eq!(pass.decisions.len(), 1);
        assert_eq!(pass.decisions[0].workload.service, "web");
        let tuned = pass.plan.unwrap();
        assert_eq!(tuned.gpus[0].workloads[1].mps_percent, 20.0);
        assert_eq!(tuned.gpus[0].workloads[2].mps_percent, 20.0);
        assert_eq!(state.len(), 1);
        assert!(!state.tracks(&key("n1", "GPU-0", "batch")), "another node's window is not batch's on n1");
    }

    #[test]
    fn a_window_without_completions_or_with_a_bad_value_is_no_sample() {
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0)])]);
        let mut state = TunerState::default();
        let pass = tune_shares(&p, &slos(&[("web", 50.0)]), &measured(&[("n1", "web", 0.0, 0.0, 5.0)]), 0.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::NoSample]);
        assert!(state.is_empty());
        let pass =
            tune_shares(&p, &slos(&[("web", 50.0)]), &measured(&[("n1", "web", f64::NAN, 100.0, 100.0)]), 0.0, &instant(), &mut state);
        let [ShareOutcome::BadSample { error }] = &outcomes(&pass)[..] else { panic!("{pass:?}") };
        assert!(error.contains("latency_ms"), "{error}");
        assert_eq!(pass.plan, None);
    }

    #[test]
    fn tuners_of_workloads_that_leave_the_plan_are_dropped() {
        let slo = slos(&[("web", 50.0), ("batch", 50.0)]);
        let m = measured(&[("n1", "web", 45.0, 100.0, 100.0), ("n1", "batch", 45.0, 100.0, 100.0)]);
        let mut state = TunerState::default();
        let both = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 0.0)]), gpu("n1", "GPU-1", vec![wl("batch", 30.0, 0.0)])]);
        tune_shares(&both, &slo, &m, 0.0, &instant(), &mut state);
        assert_eq!(state.len(), 2);
        // web's service is gone from the re-planned plan: its tuner goes.
        let without_web = plan(vec![gpu("n1", "GPU-1", vec![wl("batch", 30.0, 0.0)])]);
        tune_shares(&without_web, &slos(&[("batch", 50.0)]), &m, 1.0, &instant(), &mut state);
        assert!(!state.tracks(&key("n1", "GPU-0", "web")));
        assert!(state.tracks(&key("n1", "GPU-1", "batch")));
        // The GPU is partitioned with MIG now: batch's tuner goes too.
        let mut mig = gpu("n1", "GPU-1", vec![WorkloadAssignment { mig_instance: Some(0), ..wl("batch", 100.0, 0.0) }]);
        mig.mig_layout = vec![MigPlacement { profile: "7g".into(), start: 0 }];
        tune_shares(&plan(vec![mig]), &slo, &m, 2.0, &instant(), &mut state);
        assert!(state.is_empty());
    }

    #[test]
    fn a_changed_slo_starts_its_workloads_tuner_afresh() {
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0)])]);
        let mut state = TunerState::default();
        let m = measured(&[("n1", "web", 80.0, 100.0, 100.0)]);
        assert!(tune_shares(&p, &slos(&[("web", 50.0)]), &m, 0.0, &instant(), &mut state).plan.is_some());
        // Same SLO one second later: held down. A new SLO (target 80 ms, p99 120 ms): a new
        // tuner with no hold-down and the new target: 30 × (1 + 40/120) = 40.
        let held = tune_shares(&p, &slos(&[("web", 50.0)]), &m, 1.0, &instant(), &mut state);
        assert_eq!(held.plan, None);
        let m = measured(&[("n1", "web", 120.0, 100.0, 100.0)]);
        let pass = tune_shares(&p, &slos(&[("web", 100.0)]), &m, 2.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Changed { from_pct: 30.0, to_pct: 40.0 }]);
    }

    #[test]
    fn a_nodes_window_feeds_every_workload_of_the_service_on_that_node_only() {
        let p = plan(vec![
            gpu("n1", "GPU-0", vec![wl("web", 30.0, 10.0)]),
            gpu("n1", "GPU-1", vec![wl("web", 20.0, 10.0)]),
            gpu("n2", "GPU-2", vec![wl("web", 30.0, 10.0)]),
        ]);
        let pass = tune_shares(
            &p,
            &slos(&[("web", 50.0)]),
            &measured(&[("n1", "web", 80.0, 100.0, 100.0)]),
            0.0,
            &instant(),
            &mut TunerState::default(),
        );
        let tuned = pass.plan.unwrap();
        let shares: Vec<f64> = tuned.gpus.iter().map(|g| g.workloads[0].mps_percent).collect();
        assert_eq!(shares, vec![45.0, 30.0, 30.0]);
    }

    #[test]
    fn only_the_first_workload_of_a_service_on_a_gpu_is_tuned() {
        let p = plan(vec![gpu("n1", "GPU-0", vec![wl("web", 30.0, 0.0), wl("web", 30.0, 0.0)])]);
        let mut state = TunerState::default();
        let pass = tune_shares(&p, &slos(&[("web", 50.0)]), &measured(&[("n1", "web", 80.0, 100.0, 100.0)]), 0.0, &instant(), &mut state);
        assert_eq!(outcomes(&pass), vec![ShareOutcome::Changed { from_pct: 30.0, to_pct: 45.0 }, ShareOutcome::Duplicate]);
        let tuned = pass.plan.unwrap();
        assert_eq!(tuned.gpus[0].workloads[1].mps_percent, 30.0);
        assert_eq!(state.len(), 1);
    }

    #[test]
    fn settings_are_checked() {
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let err = TuningSettings::new(bad, TunerConfig::default()).unwrap_err();
            assert_eq!(err.field, "slo_fraction", "{bad}");
        }
        let err = TuningSettings::new(0.8, TunerConfig { hold_down_s: -1.0, ..TunerConfig::default() }).unwrap_err();
        assert_eq!(err.field, "config.hold_down_s");
        assert_eq!(TuningSettings::default().slo_fraction(), 1.0);
        assert_eq!(TuningSettings::new(1.0, TunerConfig::default()).unwrap().slo_fraction(), 1.0);
    }
}
