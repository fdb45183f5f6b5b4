//! iGniter (igniter.txt Sec. 4): interference-aware GPU resource provisioning over MPS GPUs.
//!
//! * Theorem 1 (Eq. 17-18, [`crate::perf::igniter`]) gives every workload its appropriate
//!   batch `b_appr` and resource lower bound `r_lower` (a multiple of `r_unit`).
//! * Alg. 1 sorts the workloads by `r_lower` (descending) and places each on the GPU where
//!   Alg. 2 ([`alloc_gpus`]) needs the least extra resources `r_inter` (Eq. 19), opening a new
//!   GPU when it fits on none (lines 13-14).
//! * Alg. 2 starts the new workload at `r_lower` and raises the share of *every* co-located
//!   workload whose predicted latency (Eq. 1-11) exceeds half its SLO (Constraint 14) by one
//!   `r_unit` per round until no one violates or the GPU is over `r_max` (Constraint 15).
//! * Each workload gets a warm shadow process whose extra share is `min(10%, free)` (Sec. 4.2,
//!   "Dealing with Performance Prediction Errors").
//! * Heterogeneous GPUs (Sec. 4.1 last paragraph, Sec. 5.3): each workload goes to the type
//!   that is most cost-efficient for it, i.e. the one minimising its share of the cost
//!   objective, `u / r_max · r` (Eq. 19's first term), then Alg. 1 runs once per type.
//!
//! Shares are integer multiples of `r_unit` internally ("units"), so sums are exact.
//!
//! Extensions beyond the paper, each needed to honour "never drop a service silently":
//! * Constraint 16 puts a workload on one GPU. A service whose rate no single GPU can serve
//!   (Eq. 18 has no solution or exceeds `r_max`) is split into the fewest `n` identical
//!   replicas of rate `R / n` that each fit alone (Sec. 5.3 likewise provisions "2+" T4 GPUs
//!   for W7, W8, W10, W12 without saying how); each replica is an Alg. 1 workload.
//! * Line 14 gives a new GPU `r_lower` unchecked. Eq. 18 ignores the frequency drop of Eq. 9
//!   (its proof uses `f ≤ F`), so a workload alone on a GPU may still violate; we run Alg. 2 on
//!   the empty GPU instead, which returns exactly `r_lower` whenever that suffices.
//! * Alg. 2 line 6 checks latency only; the check here also includes Constraint 13
//!   (throughput ≥ R). Theorem 1 makes it implied by the latency check, so this only guards
//!   floating-point rounding.

use super::parvagpu::check_demand;
use crate::input::{GpuType, PlanningInput};
use crate::perf::igniter::{appropriate_batch, predict, resource_lower_bound, Colocated, HardwareCoeffs, Prediction, WorkloadCoeffs};
use crate::plan::{predictions_from_gpus, GpuPlan, Infeasible, InfeasibleReason, Plan, Sharing, Workload};
use serde::{Deserialize, Serialize};

/// iGniter parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IgniterConfig {
    /// Upper bound of a shadow process's extra share, percent (Sec. 4.2: 10%, the maximum
    /// prediction error measured in Sec. 5.2).
    pub shadow_max_pct: f64,
    /// Most replicas a service too large for one GPU may be split into.
    pub max_replicas: u32,
}

impl Default for IgniterConfig {
    fn default() -> Self {
        IgniterConfig { shadow_max_pct: 10.0, max_replicas: 64 }
    }
}

/// The allocation grid of one GPU type: `r_unit` and `r_max` in units of `r_unit`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub unit_pct: f64,
    pub max_units: u32,
}

impl Grid {
    /// `None` for coefficients the model cannot be evaluated with (non-positive `r_unit`,
    /// `r_max`, PCIe bandwidth or frequency). `r_max` is capped at 100% of the GPU.
    pub fn of(hw: &HardwareCoeffs) -> Option<Grid> {
        let pos = |v: f64| v.is_finite() && v > 0.0;
        if !(pos(hw.r_unit_pct) && pos(hw.r_max_pct) && pos(hw.pcie_bytes_per_ms) && pos(hw.max_freq_mhz)) {
            return None;
        }
        let max_units = (hw.r_max_pct.min(100.0) / hw.r_unit_pct + 1e-9).floor();
        // The allocation steps one unit at a time (and a GPU holds at most one workload
        // per unit): a unit below 1% of the GPU is not evaluable in bounded time.
        (1.0..=100.0).contains(&max_units).then(|| Grid { unit_pct: hw.r_unit_pct, max_units: max_units.min(f64::from(u32::MAX)) as u32 })
    }
    pub fn pct(&self, units: u32) -> f64 {
        f64::from(units) * self.unit_pct
    }
    pub fn max_pct(&self) -> f64 {
        self.pct(self.max_units)
    }
}

/// One inference workload of Alg. 1 (a service, or one replica of it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job<'a> {
    /// Index of the service in the caller's list.
    pub service: usize,
    pub coeffs: &'a WorkloadCoeffs,
    /// T_slo (ms).
    pub slo_ms: f64,
    /// R (req/s) this workload must serve.
    pub rate_rps: f64,
    /// b_appr (Eq. 17).
    pub batch: u32,
    /// r_lower (Eq. 18) in units of r_unit.
    pub lower_units: u32,
}

impl<'a> Job<'a> {
    /// Builds a workload with Theorem 1's batch (Eq. 17) and lower bound (Eq. 18). `None`
    /// when Eq. 18 has no solution (δ ≤ 0: no share meets half the SLO with this batch).
    pub fn new(hw: &HardwareCoeffs, grid: Grid, service: usize, coeffs: &'a WorkloadCoeffs, slo_ms: f64, rate_rps: f64) -> Option<Self> {
        let batch = appropriate_batch(hw, coeffs, slo_ms, rate_rps);
        let r = resource_lower_bound(hw, coeffs, slo_ms, batch)?;
        let units = (r / grid.unit_pct).round();
        if !units.is_finite() {
            return None;
        }
        Some(Job { service, coeffs, slo_ms, rate_rps, batch, lower_units: units.clamp(1.0, f64::from(u32::MAX)) as u32 })
    }

    /// Constraints 13 and 14 for this workload's predicted performance.
    pub fn violated_by(&self, p: &Prediction) -> bool {
        let ok = p.latency_ms.is_finite() && p.latency_ms > 0.0 && p.latency_ms <= self.slo_ms / 2.0 && p.throughput_rps >= self.rate_rps;
        !ok
    }
}

fn colocated<'a>(jobs: &[&Job<'a>], units: &[u32], grid: Grid) -> Vec<Colocated<'a>> {
    jobs.iter().zip(units).map(|(j, &u)| Colocated { coeffs: j.coeffs, batch: j.batch, r_pct: grid.pct(u) }).collect()
}

/// Eq. 1-11 for the workloads on one GPU with the given shares.
pub fn predict_gpu(hw: &HardwareCoeffs, grid: Grid, jobs: &[&Job<'_>], units: &[u32]) -> Vec<Prediction> {
    predict(hw, &colocated(jobs, units, grid))
}

/// Alg. 2 (`alloc_gpus`): the shares (units) of `placed` (with their current shares) plus
/// `new` after placing `new` on this GPU, or `None` if the GPU runs out of resources
/// (Σ r > r_max) before every workload meets Constraints 13-14.
///
/// Line 1 starts `new` at `r_lower`; lines 2-11 repeat rounds while Σ r ≤ r_max and the last
/// round changed something; in a round each workload in turn is predicted (Eq. 1, with the
/// shares as already raised earlier in the same round, as the sequential loop of lines 4-10
/// reads) and raised by one `r_unit` if it violates.
pub fn alloc_gpus(hw: &HardwareCoeffs, grid: Grid, placed: &[(&Job<'_>, u32)], new: &Job<'_>) -> Option<Vec<u32>> {
    let jobs: Vec<&Job<'_>> = placed.iter().map(|p| p.0).chain(std::iter::once(new)).collect();
    let mut units: Vec<u32> = placed.iter().map(|p| p.1).chain(std::iter::once(new.lower_units)).collect();
    let total = |u: &[u32]| u.iter().map(|&x| u64::from(x)).sum::<u64>();
    let max = u64::from(grid.max_units);
    let mut flag = true;
    while total(&units) <= max && flag {
        flag = false;
        // Predictions depend only on the shares: recompute them only after a raise (the
        // same sequence of predictions as recomputing before every workload, much cheaper).
        let mut predictions = predict_gpu(hw, grid, &jobs, &units);
        for i in 0..jobs.len() {
            if jobs[i].violated_by(&predictions[i]) {
                units[i] += 1;
                flag = true;
                predictions = predict_gpu(hw, grid, &jobs, &units);
            }
        }
    }
    (total(&units) <= max).then_some(units)
}

/// One GPU of Alg. 1's plan: indices into the job list and their shares in units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuAlloc {
    pub jobs: Vec<usize>,
    pub units: Vec<u32>,
}

impl GpuAlloc {
    pub fn used_units(&self) -> u64 {
        self.units.iter().map(|&u| u64::from(u)).sum()
    }
}

/// Alg. 1 lines 5-17 for one workload: the GPU `q` with the least `r_inter` on which Alg. 2
/// succeeds, together with Alg. 2's shares; `None` (q = −1) when it fits nowhere.
///
/// Line 8 computes `r_a − r` for every workload on the GPU; for `w` itself that includes its
/// `r_lower`, the same on every GPU, so it is left out here (Eq. 19's `r_inter = r − r_lower`)
/// without changing which GPU wins. Ties go to the lowest index (line 9's strict `<`).
pub fn choose_gpu(hw: &HardwareCoeffs, grid: Grid, jobs: &[Job<'_>], gpus: &[GpuAlloc], w: usize) -> Option<(usize, Vec<u32>)> {
    choose_gpu_needing(hw, grid, jobs, gpus, w, jobs[w].lower_units, Neighbours::MayGrow)
}

/// Whether placing a job may raise the shares of the jobs already on a GPU (Alg. 2's
/// Constraint 14), which restarts them: an MPS share is fixed when a process creates its
/// CUDA context.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Neighbours {
    MayGrow,
    /// A minimal re-plan moves the changed service alone (issue 59): a GPU where the
    /// newcomer's interference would raise a neighbour's share is not taken.
    Stay,
}

/// [`choose_gpu`] skipping every GPU whose free share is below `need` units, a share the
/// job needs on any GPU: co-location only adds interference in Eq. 1-11 (lower frequency,
/// cache contention, scheduling delay), so the job never needs less than it does alone.
fn choose_gpu_needing(
    hw: &HardwareCoeffs,
    grid: Grid,
    jobs: &[Job<'_>],
    gpus: &[GpuAlloc],
    w: usize,
    need: u32,
    neighbours: Neighbours,
) -> Option<(usize, Vec<u32>)> {
    let mut best: Option<(usize, Vec<u32>)> = None;
    let mut inter_min = u64::from(grid.max_units); // line 5: r_inter^min ← r_max
    for (j, g) in gpus.iter().enumerate() {
        // Alg. 2 cannot succeed where the job's need does not fit the free share: skip the
        // predictions.
        if g.used_units() + u64::from(need) > u64::from(grid.max_units) {
            continue;
        }
        let placed: Vec<(&Job<'_>, u32)> = g.jobs.iter().zip(&g.units).map(|(&i, &u)| (&jobs[i], u)).collect();
        let Some(ua) = alloc_gpus(hw, grid, &placed, &jobs[w]) else { continue };
        if neighbours == Neighbours::Stay && ua[..g.units.len()] != g.units[..] {
            continue;
        }
        let after: u64 = ua.iter().map(|&u| u64::from(u)).sum();
        let inter = after - g.used_units() - u64::from(jobs[w].lower_units);
        if inter < inter_min {
            inter_min = inter;
            best = Some((j, ua));
            // No later GPU can do strictly better than no interference (line 9's `<`).
            if inter == 0 {
                break;
            }
        }
    }
    best
}

/// Alg. 1 on one GPU type: places every job, returning the GPUs. A job that does not fit
/// even alone on an empty GPU is returned in the error list (callers pre-check with
/// [`fits_alone`], so this does not happen through [`plan`]).
pub fn place_all(hw: &HardwareCoeffs, grid: Grid, jobs: &[Job<'_>]) -> (Vec<GpuAlloc>, Vec<usize>) {
    // Line 3: sort by r_lower, descending (stable: input order among equals).
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(jobs[i].lower_units));
    let mut gpus: Vec<GpuAlloc> = Vec::new();
    let mut unplaced = Vec::new();
    for w in order {
        let need = fits_alone(hw, grid, &jobs[w]).unwrap_or(jobs[w].lower_units);
        match choose_gpu_needing(hw, grid, jobs, &gpus, w, need, Neighbours::MayGrow) {
            // Line 16: adopt Alg. 2's shares on GPU q.
            Some((q, ua)) => {
                gpus[q].jobs.push(w);
                gpus[q].units = ua;
            }
            // Line 14: a new GPU (shares from Alg. 2 on the empty GPU, see module docs).
            None => match alloc_gpus(hw, grid, &[], &jobs[w]) {
                Some(ua) => gpus.push(GpuAlloc { jobs: vec![w], units: ua }),
                None => unplaced.push(w),
            },
        }
    }
    (gpus, unplaced)
}

/// Alg. 2 on an empty GPU: the share (units) `job` needs alone, if any.
pub fn fits_alone(hw: &HardwareCoeffs, grid: Grid, job: &Job<'_>) -> Option<u32> {
    alloc_gpus(hw, grid, &[], job).map(|u| u[0])
}

/// How a service is served on one GPU type: `replicas` identical workloads.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sizing<'a> {
    job: Job<'a>,
    replicas: u32,
    /// Share (units) one replica needs alone.
    solo_units: u32,
}

/// Splits a service into the fewest replicas that each fit alone on a GPU of this type.
fn size_service<'a>(
    hw: &HardwareCoeffs,
    grid: Grid,
    service: usize,
    coeffs: &'a WorkloadCoeffs,
    slo_ms: f64,
    rate: f64,
    max_replicas: u32,
) -> Result<Sizing<'a>, InfeasibleReason> {
    let too_tight = || {
        // Best case for the reason: batch 1 alone with all of r_max.
        let p = predict(hw, &[Colocated { coeffs, batch: 1, r_pct: grid.max_pct() }])[0];
        InfeasibleReason::SloTooTight { slo_ms, best_latency_ms: p.latency_ms }
    };
    for n in 1..=max_replicas.max(1) {
        let per = rate / f64::from(n);
        let batch = appropriate_batch(hw, coeffs, slo_ms, per);
        if let Some(job) = Job::new(hw, grid, service, coeffs, slo_ms, per) {
            if job.lower_units <= grid.max_units {
                if let Some(solo_units) = fits_alone(hw, grid, &job) {
                    return Ok(Sizing { job, replicas: n, solo_units });
                }
            }
        }
        // With b_appr = 1 throughput follows from latency (Theorem 1), so more replicas
        // cannot help: the SLO itself is out of reach.
        if batch <= 1 {
            return Err(too_tight());
        }
    }
    Err(InfeasibleReason::TooLarge { detail: format!("{rate} req/s needs more than {max_replicas} replicas of one GPU each") })
}

fn usable(t: &GpuType) -> Option<(&HardwareCoeffs, Grid)> {
    let hw = t.igniter.as_ref()?;
    if !t.mps {
        return None;
    }
    Some((hw, Grid::of(hw)?))
}

/// The GPU types iGniter can plan on: (index in `gpu_types`, coefficients, grid).
type UsableTypes<'a> = Vec<(usize, &'a HardwareCoeffs, Grid)>;

fn usable_types(input: &PlanningInput) -> UsableTypes<'_> {
    input.gpu_types.iter().enumerate().filter_map(|(i, t)| usable(t).map(|(hw, g)| (i, hw, g))).collect()
}

/// The most cost-efficient type for service `si` (least `u/r_max · r` for its total solo
/// share, Sec. 4.1) with its sizing, as an index into `types`; or why none serves it.
fn choose_type<'a>(
    input: &'a PlanningInput,
    types: &UsableTypes<'a>,
    si: usize,
    cfg: &IgniterConfig,
) -> Result<(usize, Sizing<'a>), InfeasibleReason> {
    let s = &input.services[si];
    if let Some(reason) = check_demand(s) {
        return Err(reason);
    }
    if types.is_empty() {
        return Err(InfeasibleReason::NoGpuType { needed: "MPS with iGniter hardware coefficients".into() });
    }
    let mut best: Option<(f64, usize, Sizing<'_>)> = None;
    let mut reason = InfeasibleReason::NoProfile { model: s.model.clone() };
    for (k, &(ti, hw, grid)) in types.iter().enumerate() {
        let t = &input.gpu_types[ti];
        let Some(coeffs) = input.profiles.coeffs(&t.name, &s.model) else { continue };
        match size_service(hw, grid, si, coeffs, s.slo_ms, s.request_rate, cfg.max_replicas) {
            Ok(sz) => {
                let cost = t.price_per_hour / grid.max_pct() * f64::from(sz.replicas) * grid.pct(sz.solo_units);
                if best.as_ref().is_none_or(|b| cost < b.0) {
                    best = Some((cost, k, sz));
                }
            }
            Err(r) => {
                // Report the most informative reason: a too-tight SLO beats "too large",
                // which beats "no profile"; among too-tight ones the best latency.
                reason = match (&reason, r) {
                    (
                        InfeasibleReason::SloTooTight { best_latency_ms: a, .. },
                        InfeasibleReason::SloTooTight { slo_ms, best_latency_ms: b },
                    ) => InfeasibleReason::SloTooTight { slo_ms, best_latency_ms: a.min(b) },
                    (InfeasibleReason::SloTooTight { .. }, _) => reason,
                    (_, r) => r,
                };
            }
        }
    }
    best.map(|(_, k, sz)| (k, sz)).ok_or(reason)
}

/// iGniter provisioning (Alg. 1 per GPU type after choosing each service's type).
pub fn plan(input: &PlanningInput, cfg: &IgniterConfig) -> Plan {
    let types = usable_types(input);
    let mut infeasible = Vec::new();
    // Per usable type: the jobs assigned to it.
    let mut per_type: Vec<Vec<Job<'_>>> = vec![Vec::new(); types.len()];
    for (si, s) in input.services.iter().enumerate() {
        match choose_type(input, &types, si, cfg) {
            // `sz.job` already carries the per-replica rate R / n.
            Ok((k, sz)) => per_type[k].extend(std::iter::repeat_n(sz.job, sz.replicas as usize)),
            Err(reason) => infeasible.push(Infeasible { service: s.name.clone(), reason }),
        }
    }
    let mut gpus = Vec::new();
    for (k, jobs) in per_type.iter().enumerate() {
        let (ti, hw, grid) = types[k];
        let (allocs, unplaced) = place_all(hw, grid, jobs);
        for w in unplaced {
            // Unreachable through size_service's pre-check; kept so nothing is ever dropped.
            refuse_unplaced(&mut infeasible, &input.services[jobs[w].service].name);
        }
        for a in allocs {
            let slot = gpus.len() as u32;
            gpus.push(to_gpu_plan(&input.gpu_types[ti].name, slot, hw, grid, jobs, &a, cfg, input));
        }
    }
    finish(gpus, infeasible, input)
}

fn refuse_unplaced(infeasible: &mut Vec<Infeasible>, service: &str) {
    if !infeasible.iter().any(|f| f.service == service) {
        infeasible.push(Infeasible {
            service: service.to_string(),
            reason: InfeasibleReason::TooLarge { detail: "does not fit alone on one GPU".into() },
        });
    }
}

/// The plan of `gpus`, without the workloads of a service that is refused (a service with a
/// refused replica must not also appear as planned) and without GPUs left empty.
fn finish(mut gpus: Vec<GpuPlan>, infeasible: Vec<Infeasible>, input: &PlanningInput) -> Plan {
    let refused: Vec<&str> = infeasible.iter().map(|f| f.service.as_str()).collect();
    for g in &mut gpus {
        g.workloads.retain(|w| !refused.contains(&w.service.as_str()));
    }
    gpus.retain(|g| !g.workloads.is_empty());
    Plan { strategy: "igniter".into(), predictions: predictions_from_gpus(&gpus, &input.services), gpus, infeasible }
}

/// Minimal re-planning of one service whose rate or SLO changed (ParvaGPU Sec. III-F's
/// scheme, which iGniter lacks, on iGniter's own rules): its workloads leave the GPUs of
/// `previous`, it is sized again (Theorem 1, the type of Sec. 4.1), and each replica is
/// placed by Alg. 1 lines 5-17 on the GPU where Alg. 2 adds the least interference, or a
/// new GPU. Every other workload keeps its GPU, share and batch: a GPU where Alg. 2 would
/// raise a neighbour's share (Constraint 14) is passed over, since that restarts the
/// neighbour; a consolidation repacks later if it pays. Removing a workload only lowers its
/// neighbours' interference in Eq. 1-11, so they still meet their SLOs.
///
/// `input` is the pool's input with the new demand of `changed`; `previous` was planned by
/// iGniter on that input's GPU types and services. `None` when `previous` does not read
/// back as an iGniter plan of that input (a GPU type or service it does not know): plan
/// everything then.
pub fn replan_service(previous: &Plan, input: &PlanningInput, changed: &str, cfg: &IgniterConfig) -> Option<Plan> {
    let types = usable_types(input);
    let index: std::collections::HashMap<&str, usize> = input.services.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let ci = *index.get(changed)?;
    let mut replicas: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for w in previous.gpus.iter().flat_map(|g| &g.workloads) {
        *replicas.entry(w.service.as_str()).or_default() += 1;
    }
    // Per usable type: the jobs on it and its GPUs (Alg. 1's state), and which GPU of the
    // plan each GPU is (`None`: a new one), for the untouched ones to stay as they are.
    let mut jobs: Vec<Vec<Job<'_>>> = vec![Vec::new(); types.len()];
    let mut allocs: Vec<Vec<GpuAlloc>> = vec![Vec::new(); types.len()];
    let mut origin: Vec<Vec<Option<usize>>> = vec![Vec::new(); types.len()];
    let mut touched = vec![false; previous.gpus.len()];
    for (gi, g) in previous.gpus.iter().enumerate() {
        let k = types.iter().position(|&(ti, _, _)| input.gpu_types[ti].name == g.gpu_type)?;
        let (ti, _, grid) = types[k];
        let mut alloc = GpuAlloc::default();
        for w in &g.workloads {
            let si = *index.get(w.service.as_str())?;
            if si == ci {
                touched[gi] = true;
                continue;
            }
            let s = &input.services[si];
            let coeffs = input.profiles.coeffs(&input.gpu_types[ti].name, &s.model)?;
            let units = (w.mps_percent / grid.unit_pct).round();
            if !(units >= 1.0 && units <= f64::from(grid.max_units)) {
                return None;
            }
            // As placed: its batch and share from the plan, its rate R / n over its replicas.
            let rate_rps = s.request_rate / replicas[w.service.as_str()] as f64;
            jobs[k].push(Job { service: si, coeffs, slo_ms: s.slo_ms, rate_rps, batch: w.batch_size, lower_units: units as u32 });
            alloc.jobs.push(jobs[k].len() - 1);
            alloc.units.push(units as u32);
        }
        allocs[k].push(alloc);
        origin[k].push(Some(gi));
    }
    let mut infeasible: Vec<Infeasible> = previous.infeasible.iter().filter(|f| f.service != changed).cloned().collect();
    match choose_type(input, &types, ci, cfg) {
        Ok((k, sz)) => {
            let (_, hw, grid) = types[k];
            for _ in 0..sz.replicas {
                jobs[k].push(sz.job);
                let w = jobs[k].len() - 1;
                match choose_gpu_needing(hw, grid, &jobs[k], &allocs[k], w, sz.solo_units, Neighbours::Stay) {
                    Some((q, ua)) => {
                        allocs[k][q].jobs.push(w);
                        allocs[k][q].units = ua;
                        if let Some(gi) = origin[k][q] {
                            touched[gi] = true;
                        }
                    }
                    None => match alloc_gpus(hw, grid, &[], &jobs[k][w]) {
                        Some(ua) => {
                            allocs[k].push(GpuAlloc { jobs: vec![w], units: ua });
                            origin[k].push(None);
                        }
                        None => refuse_unplaced(&mut infeasible, changed),
                    },
                }
            }
        }
        Err(reason) => infeasible.push(Infeasible { service: changed.to_string(), reason }),
    }
    let mut next_slot = previous.gpus.iter().map(|g| g.slot + 1).max().unwrap_or(0);
    let mut gpus = Vec::new();
    for (k, list) in allocs.iter().enumerate() {
        let (ti, hw, grid) = types[k];
        for (was, a) in origin[k].iter().zip(list) {
            match was {
                Some(gi) if !touched[*gi] => gpus.push(previous.gpus[*gi].clone()),
                _ => {
                    let slot = was.map_or_else(
                        || {
                            next_slot += 1;
                            next_slot - 1
                        },
                        |gi| previous.gpus[gi].slot,
                    );
                    gpus.push(to_gpu_plan(&input.gpu_types[ti].name, slot, hw, grid, &jobs[k], a, cfg, input));
                }
            }
        }
    }
    gpus.sort_by_key(|g| g.slot);
    Some(finish(gpus, infeasible, input))
}

#[allow(clippy::too_many_arguments)]
fn to_gpu_plan(
    type_name: &str,
    slot: u32,
    hw: &HardwareCoeffs,
    grid: Grid,
    jobs: &[Job<'_>],
    a: &GpuAlloc,
    cfg: &IgniterConfig,
    input: &PlanningInput,
) -> GpuPlan {
    let on: Vec<&Job<'_>> = a.jobs.iter().map(|&i| &jobs[i]).collect();
    let preds = predict_gpu(hw, grid, &on, &a.units);
    // Shadow reserve (Sec. 4.2): min(10%, free), handed out in placement order so that the
    // reserves never push the GPU past r_max.
    let mut free = grid.max_pct() - grid.pct(a.units.iter().sum());
    let workloads = on
        .iter()
        .zip(&a.units)
        .zip(&preds)
        .map(|((j, &u), p)| {
            let shadow = cfg.shadow_max_pct.min(free).max(0.0);
            free -= shadow;
            Workload {
                service: input.services[j.service].name.clone(),
                mig_instance: None,
                mps_percent: grid.pct(u),
                batch_size: j.batch,
                processes: 1,
                shadow_percent: shadow,
                predicted_throughput: p.throughput_rps,
                predicted_latency_ms: p.latency_ms,
            }
        })
        .collect();
    GpuPlan { slot, gpu_type: type_name.to_string(), sharing: Sharing::MpsOnly, workloads }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{Profiles, ServiceDemand};
    use crate::invariants::check_invariants;
    use crate::mig::GpuModel;
    use crate::perf::igniter::tests::{hw, wl};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn gpu_type(name: &str, price: f64, hw: HardwareCoeffs) -> GpuType {
        GpuType { name: name.into(), model: GpuModel::NoMig, price_per_hour: price, mps: true, igniter: Some(hw) }
    }

    fn svc(name: &str, model: &str, slo_ms: f64, rate: f64) -> ServiceDemand {
        ServiceDemand { name: name.into(), model: model.into(), slo_ms, request_rate: rate }
    }

    fn input(types: Vec<GpuType>, models: &[(&str, WorkloadCoeffs)], services: Vec<ServiceDemand>) -> PlanningInput {
        let mut profiles = Profiles::default();
        for t in &types {
            for (m, c) in models {
                profiles.igniter.entry(t.name.clone()).or_default().insert(m.to_string(), c.clone());
            }
        }
        PlanningInput { gpu_types: types, services, profiles }
    }

    fn gpu_of<'p>(plan: &'p Plan, service: &str) -> Vec<&'p GpuPlan> {
        plan.gpus.iter().filter(|g| g.workloads.iter().any(|w| w.service == service)).collect()
    }

    #[test]
    fn lone_workload_gets_theorem1_batch_and_lower_bound() {
        // Hand-computed in perf::igniter: T = 20 ms, R = 400 req/s -> b = 4, r_lower = 7.5%.
        let inp = input(vec![gpu_type("v100", 3.06, hw())], &[("m", wl())], vec![svc("a", "m", 20.0, 400.0)]);
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        assert_eq!(plan.gpus.len(), 1);
        let w = &plan.gpus[0].workloads[0];
        assert_eq!((w.batch_size, w.mps_percent, w.processes), (4, 7.5, 1));
        assert_eq!(w.mig_instance, None);
        assert_eq!(plan.gpus[0].sharing, Sharing::MpsOnly);
        // Shadow: min(10%, 92.5% free) = 10%.
        assert_eq!(w.shadow_percent, 10.0);
        assert!(w.predicted_latency_ms <= 10.0 && w.predicted_throughput >= 400.0);
    }

    /// A model with a large L2 footprint: co-location slows it (Eq. 8) and its neighbours.
    fn heavy() -> WorkloadCoeffs {
        WorkloadCoeffs { alpha_cache: 0.02, beta_cacheutil: 10.0, ..wl() }
    }

    #[test]
    fn two_light_workloads_share_one_gpu() {
        let inp = input(vec![gpu_type("v100", 3.06, hw())], &[("m", wl())], vec![svc("a", "m", 20.0, 400.0), svc("b", "m", 30.0, 300.0)]);
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        assert_eq!(plan.gpus.len(), 1);
        assert_eq!(plan.gpus[0].workloads.len(), 2);
        // Interference (Eq. 6, 8) costs something: co-located latency is above the solo one.
        let solo = input(vec![gpu_type("v100", 3.06, hw())], &[("m", wl())], vec![svc("a", "m", 20.0, 400.0)]);
        let alone = super::plan(&solo, &IgniterConfig::default());
        let lat = |p: &Plan| p.prediction("a").unwrap().latency_ms;
        assert!(lat(&plan) > lat(&alone));
    }

    #[test]
    fn opens_a_second_gpu_when_the_sum_would_violate() {
        let (h, c) = (hw(), heavy());
        let grid = Grid::of(&h).unwrap();
        let a = Job::new(&h, grid, 0, &c, 40.0, 2200.0).unwrap();
        let b = Job::new(&h, grid, 1, &c, 40.0, 2200.0).unwrap();
        // The lower bounds alone fit together (an interference-unaware FFD would co-locate)...
        assert!(a.lower_units + b.lower_units <= grid.max_units, "{} + {}", a.lower_units, b.lower_units);
        // ... but with interference Alg. 2 runs out of the GPU.
        assert_eq!(alloc_gpus(&h, grid, &[(&a, a.lower_units)], &b), None);
        let inp =
            input(vec![gpu_type("v100", 3.06, h)], &[("heavy", c)], vec![svc("a", "heavy", 40.0, 2200.0), svc("b", "heavy", 40.0, 2200.0)]);
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        assert_eq!(plan.gpus.len(), 2);
        assert_ne!(gpu_of(&plan, "a")[0].slot, gpu_of(&plan, "b")[0].slot);
    }

    #[test]
    fn alg2_raises_the_share_of_the_already_placed_workload() {
        let (h, c) = (hw(), heavy());
        let grid = Grid::of(&h).unwrap();
        let a = Job::new(&h, grid, 0, &c, 40.0, 1000.0).unwrap();
        let b = Job::new(&h, grid, 1, &c, 40.0, 1000.0).unwrap();
        let ua = alloc_gpus(&h, grid, &[(&a, a.lower_units)], &b).unwrap();
        assert!(ua[0] > a.lower_units, "{ua:?} vs {}", a.lower_units);
        assert!(ua[1] > b.lower_units);
        let preds = predict_gpu(&h, grid, &[&a, &b], &ua);
        assert!(!a.violated_by(&preds[0]) && !b.violated_by(&preds[1]));
        // One unit less for either workload violates: Alg. 2 adds no more than needed.
        for i in 0..2 {
            let mut less = ua.clone();
            less[i] -= 1;
            let p = predict_gpu(&h, grid, &[&a, &b], &less);
            assert!(a.violated_by(&p[0]) || b.violated_by(&p[1]));
        }
    }

    #[test]
    fn chooses_the_gpu_with_least_added_interference() {
        let (h, light, hv) = (hw(), wl(), heavy());
        let grid = Grid::of(&h).unwrap();
        let jobs = [
            Job::new(&h, grid, 0, &hv, 40.0, 1500.0).unwrap(),
            Job::new(&h, grid, 1, &light, 40.0, 1500.0).unwrap(),
            Job::new(&h, grid, 2, &light, 40.0, 1500.0).unwrap(),
        ];
        // GPU 0 hosts the cache-heavy job, GPU 1 the light one; both have room.
        let gpus = vec![
            GpuAlloc { jobs: vec![0], units: vec![fits_alone(&h, grid, &jobs[0]).unwrap()] },
            GpuAlloc { jobs: vec![1], units: vec![fits_alone(&h, grid, &jobs[1]).unwrap()] },
        ];
        let inter = |g: usize| {
            let placed: Vec<_> = gpus[g].jobs.iter().zip(&gpus[g].units).map(|(&i, &u)| (&jobs[i], u)).collect();
            let ua = alloc_gpus(&h, grid, &placed, &jobs[2]).unwrap();
            ua.iter().sum::<u32>() - gpus[g].units.iter().sum::<u32>() - jobs[2].lower_units
        };
        assert!(inter(1) < inter(0), "{} vs {}", inter(1), inter(0));
        let (q, _) = choose_gpu(&h, grid, &jobs, &gpus, 2).unwrap();
        assert_eq!(q, 1, "first-fit would pick GPU 0");
    }

    #[test]
    fn shadow_is_min_of_ten_percent_and_free() {
        // Three workloads on one GPU whose shares (16 + 11 + 7 units of 2.5%) leave 15%
        // free: shadows 10, 5, 0 in placement order.
        let inp = input(
            vec![gpu_type("v100", 3.06, hw())],
            &[("m", wl())],
            vec![svc("a", "m", 20.0, 1500.0), svc("b", "m", 20.0, 1000.0), svc("c", "m", 20.0, 600.0)],
        );
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        for g in &plan.gpus {
            let used: f64 = g.workloads.iter().map(|w| w.mps_percent).sum();
            let mut free = 100.0 - used;
            for w in &g.workloads {
                assert_eq!(w.shadow_percent, free.min(10.0));
                free -= w.shadow_percent;
            }
            assert!(g.mps_used() <= 100.0 + 1e-9);
        }
        assert_eq!(plan.gpus.len(), 1);
        let shadows: Vec<f64> = plan.gpus[0].workloads.iter().map(|w| w.shadow_percent).collect();
        assert_eq!(shadows, vec![10.0, 5.0, 0.0]);
    }

    #[test]
    fn large_rate_is_split_into_replicas() {
        let inp = input(vec![gpu_type("v100", 3.06, hw())], &[("m", wl())], vec![svc("a", "m", 20.0, 20_000.0)]);
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        let n: usize = plan.gpus.iter().map(|g| g.workloads.len()).sum();
        assert!(n >= 2 && plan.gpus.len() >= 2, "{plan:#?}");
        assert!(plan.prediction("a").unwrap().capacity_rps >= 20_000.0);
        // With too few replicas allowed it is refused as too large, not dropped.
        let cfg = IgniterConfig { max_replicas: 1, ..IgniterConfig::default() };
        let p = super::plan(&inp, &cfg);
        assert!(p.gpus.is_empty());
        assert!(matches!(p.infeasible[0].reason, InfeasibleReason::TooLarge { .. }));
        check_invariants(&p, &inp).unwrap();
    }

    #[test]
    fn cheapest_type_per_workload() {
        // "t4": half the speed (k1..k3 doubled) at a third of the price -> cheaper per workload.
        let fast = wl();
        let slow = WorkloadCoeffs { k: [0.1, 40.0, 60.0, 5.0, 0.2], ..wl() };
        let types = vec![gpu_type("v100", 3.06, hw()), gpu_type("t4", 0.526 * 2.0, hw())];
        let mut inp = input(types, &[], vec![svc("a", "m", 20.0, 400.0), svc("b", "only-v100", 20.0, 400.0)]);
        inp.profiles.igniter.entry("v100".into()).or_default().insert("m".into(), fast.clone());
        inp.profiles.igniter.entry("t4".into()).or_default().insert("m".into(), slow);
        inp.profiles.igniter.entry("v100".into()).or_default().insert("only-v100".into(), fast);
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        assert_eq!(gpu_of(&plan, "a")[0].gpu_type, "t4");
        assert_eq!(gpu_of(&plan, "b")[0].gpu_type, "v100");
        // Price the t4 out and "a" moves to the v100, next to "b".
        inp.gpu_types[1].price_per_hour = 10.0;
        let plan = super::plan(&inp, &IgniterConfig::default());
        assert_eq!(plan.gpus.len(), 1);
        assert_eq!(plan.gpus[0].gpu_type, "v100");
    }

    #[test]
    fn infeasible_services_are_named_with_reasons() {
        let mut no_hw = gpu_type("plain", 1.0, hw());
        no_hw.igniter = None;
        let inp = input(
            vec![gpu_type("v100", 3.06, hw())],
            &[("m", wl())],
            vec![
                svc("ok", "m", 20.0, 400.0),
                svc("tight", "m", 0.5, 10.0),
                svc("unknown", "nope", 20.0, 10.0),
                svc("zero", "m", 20.0, 0.0),
                svc("nan", "m", f64::NAN, 1.0),
            ],
        );
        let plan = plan(&inp, &IgniterConfig::default());
        check_invariants(&plan, &inp).unwrap();
        let reason = |s: &str| plan.infeasible.iter().find(|f| f.service == s).map(|f| f.reason.clone());
        assert!(reason("ok").is_none());
        assert!(matches!(reason("tight"), Some(InfeasibleReason::SloTooTight { best_latency_ms, .. }) if best_latency_ms > 0.25));
        assert_eq!(reason("unknown"), Some(InfeasibleReason::NoProfile { model: "nope".into() }));
        assert!(matches!(reason("zero"), Some(InfeasibleReason::InvalidDemand { .. })));
        assert!(matches!(reason("nan"), Some(InfeasibleReason::InvalidDemand { .. })));
        // Without MPS or without hardware coefficients no type is usable.
        let mut no_mps = gpu_type("v100", 3.06, hw());
        no_mps.mps = false;
        for t in [no_hw, no_mps] {
            let inp = input(vec![t], &[("m", wl())], vec![svc("ok", "m", 20.0, 400.0)]);
            let plan = super::plan(&inp, &IgniterConfig::default());
            check_invariants(&plan, &inp).unwrap();
            assert!(matches!(plan.infeasible[0].reason, InfeasibleReason::NoGpuType { .. }));
        }
    }

    /// (service, share, batch) of every workload on each GPU slot that does not run `except`.
    fn others_by_slot(plan: &Plan, except: &str) -> BTreeMap<u32, Vec<(String, f64, u32)>> {
        plan.gpus
            .iter()
            .filter(|g| g.workloads.iter().all(|w| w.service != except))
            .map(|g| (g.slot, g.workloads.iter().map(|w| (w.service.clone(), w.mps_percent, w.batch_size)).collect()))
            .collect()
    }

    /// Every GPU of `after` without `changed` runs what the same slot ran in `before`, less
    /// `changed`: the same services with the same shares and batches.
    fn only_moved(before: &Plan, after: &Plan, changed: &str) -> Result<(), String> {
        let was: BTreeMap<u32, Vec<(String, f64, u32)>> = before
            .gpus
            .iter()
            .map(|g| {
                let kept = g.workloads.iter().filter(|w| w.service != changed);
                (g.slot, kept.map(|w| (w.service.clone(), w.mps_percent, w.batch_size)).collect())
            })
            .collect();
        for (slot, now) in others_by_slot(after, changed) {
            if was.get(&slot) != Some(&now) {
                return Err(format!("slot {slot} was {:?}, is {now:?}", was.get(&slot)));
            }
        }
        Ok(())
    }

    #[test]
    fn replanning_one_service_moves_that_service_alone() {
        let types = vec![gpu_type("v100", 3.06, hw())];
        let services: Vec<ServiceDemand> =
            (0..12).map(|i| svc(&format!("s{i}"), if i % 3 == 0 { "heavy" } else { "m" }, 40.0, 300.0 + 150.0 * f64::from(i))).collect();
        let inp = input(types.clone(), &[("m", wl()), ("heavy", heavy())], services.clone());
        let before = plan(&inp, &IgniterConfig::default());
        assert!(before.gpus.len() >= 3, "{} GPUs", before.gpus.len());
        let mut raised = services;
        raised[4].request_rate *= 2.5;
        let inp2 = input(types, &[("m", wl()), ("heavy", heavy())], raised);
        let after = replan_service(&before, &inp2, "s4", &IgniterConfig::default()).expect("an iGniter plan of this input");
        check_invariants(&after, &inp2).unwrap();
        assert!(after.prediction("s4").unwrap().capacity_rps >= inp2.services[4].request_rate);
        only_moved(&before, &after, "s4").unwrap();
        // A service the previous plan did not have is placed the same way.
        let without = before.without_service("s7");
        let back = replan_service(&without, &inp, "s7", &IgniterConfig::default()).unwrap();
        check_invariants(&back, &inp).unwrap();
        only_moved(&without, &back, "s7").unwrap();
        // A plan it cannot read back (a GPU type the input lacks) is for a full pass.
        let mut odd = before.clone();
        odd.gpus[0].gpu_type = "t4".into();
        assert_eq!(replan_service(&odd, &inp2, "s4", &IgniterConfig::default()), None);
    }

    fn arb_coeffs() -> impl Strategy<Value = WorkloadCoeffs> {
        (
            1e4..2e6f64,
            0.0..0.2f64,
            1.0..60.0f64,
            10.0..200.0f64,
            0.0..20.0f64,
            0.05..2.0f64,
            (0.0..0.05f64, 0.0..40.0f64, 0.0..0.02f64, 0.0..10.0f64, 0.0..0.05f64),
        )
            .prop_map(|(d_load, k1, k2, k3, k4, k5, (ap, bp, ac, bc, acache))| WorkloadCoeffs {
                d_load_bytes: d_load,
                d_feedback_bytes: d_load / 100.0,
                n_kernels: 50.0,
                k_sch_ms: 0.002,
                k: [k1, k2, k3, k4, k5],
                alpha_power: ap,
                beta_power: bp,
                alpha_cacheutil: ac,
                beta_cacheutil: bc,
                alpha_cache: acache,
            })
    }

    fn arb_hw() -> impl Strategy<Value = HardwareCoeffs> {
        (150.0..350.0f64, -2.0..-0.1f64, prop_oneof![Just(2.5), Just(5.0), Just(10.0)]).prop_map(|(p, af, unit)| HardwareCoeffs {
            max_power_w: p,
            alpha_f: af,
            r_unit_pct: unit,
            ..hw()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn plans_satisfy_the_invariants(
            hws in prop::collection::vec((arb_hw(), 0.5..5.0f64), 1..3),
            models in prop::collection::vec(arb_coeffs(), 1..4),
            demands in prop::collection::vec((0usize..12, 2.0..120.0f64, 1.0..3000.0f64), 1..12),
        ) {
            let types: Vec<GpuType> = hws.into_iter().enumerate().map(|(i, (h, p))| gpu_type(&format!("t{i}"), p, h)).collect();
            let names: Vec<String> = (0..models.len()).map(|i| format!("m{i}")).collect();
            let ms: Vec<(&str, WorkloadCoeffs)> = names.iter().map(String::as_str).zip(models).collect();
            // Model index `ms.len()` has no coefficients on purpose: a NoProfile service.
            let services = demands
                .iter()
                .enumerate()
                .map(|(i, &(m, slo, rate))| svc(&format!("s{i}"), &format!("m{}", m % (ms.len() + 1)), slo, rate))
                .collect();
            let inp = input(types, &ms, services);
            let plan = plan(&inp, &IgniterConfig::default());
            if let Err(e) = check_invariants(&plan, &inp) {
                return Err(TestCaseError::fail(format!("{e}\n{plan:#?}")));
            }
            prop_assert!(plan.gpus.iter().all(|g| g.sharing == Sharing::MpsOnly && !g.workloads.is_empty()));
            prop_assert_eq!(plan.predictions.len() + plan.infeasible.len(), inp.services.len());
        }

        #[test]
        fn a_replanned_service_keeps_the_invariants_and_moves_alone(
            hws in prop::collection::vec((arb_hw(), 0.5..5.0f64), 1..3),
            models in prop::collection::vec(arb_coeffs(), 1..4),
            demands in prop::collection::vec((0usize..12, 2.0..120.0f64, 1.0..3000.0f64), 1..12),
            which in 0usize..12,
            factor in 0.1..4.0f64,
        ) {
            let types: Vec<GpuType> = hws.into_iter().enumerate().map(|(i, (h, p))| gpu_type(&format!("t{i}"), p, h)).collect();
            let names: Vec<String> = (0..models.len()).map(|i| format!("m{i}")).collect();
            let ms: Vec<(&str, WorkloadCoeffs)> = names.iter().map(String::as_str).zip(models).collect();
            let services: Vec<ServiceDemand> = demands
                .iter()
                .enumerate()
                .map(|(i, &(m, slo, rate))| svc(&format!("s{i}"), &format!("m{}", m % (ms.len() + 1)), slo, rate))
                .collect();
            let inp = input(types.clone(), &ms, services.clone());
            let before = plan(&inp, &IgniterConfig::default());
            let which = which % services.len();
            let mut changed = services;
            changed[which].request_rate *= factor;
            let inp2 = input(types, &ms, changed);
            let name = format!("s{which}");
            let after = replan_service(&before, &inp2, &name, &IgniterConfig::default()).expect("its own plan reads back");
            if let Err(e) = check_invariants(&after, &inp2) {
                return Err(TestCaseError::fail(format!("{e}\n{after:#?}")));
            }
            prop_assert_eq!(after.predictions.len() + after.infeasible.len(), inp2.services.len());
            prop_assert!(after.gpus.iter().all(|g| !g.workloads.is_empty()));
            if let Err(e) = only_moved(&before, &after, &name) {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}
