//! HetSev's heterogeneity-aware instance autoscaling (Sec. 4.1) for one inference service.
//!
//! The paper's ILP (Sec. 4.1, "Formulation") chooses a scaling action `X_i` per instance
//! type `i` to
//!
//! ```text
//! minimize   Σ_i C_i (X_i + λ O_i^launch max(X_i, 0))
//! subject to Σ_i T_i (N_i + X_i) >= W                 (1)
//!            Σ_i R_i^type (N_i + X_i) <= R_total^type  (2)
//!            N_i + X_i >= 0                            (3)
//!            L_i^inf <= S                              (4)
//! ```
//!
//! and is approximated by the paper's heuristic ("A heuristic algorithm"): (a) detect the risk
//! of violating (1) from the throughput saturation of the running instances, (b) choose to
//! scale out or in, (c) price each instance type with the objective and take the cheapest.
//!
//! * Scale-out ("Scaling-out algorithm"): saturation = arrival rate / capacity above the
//!   threshold (80%, "based on experience") for the whole window ("for a period of time");
//!   then every type passing (4) and (2) is sized to restore (1) and priced with the
//!   objective; the minimum wins. One type per action, as in the paper's selection policy;
//!   over that action space, enumerating every type is exact.
//! * Scale-in ("Scaling-in algorithm"): instances are removed when the workload can be
//!   accommodated without them, only once that has held for the cool-down, and never to swap
//!   hardware for a cheaper type. Which instances to remove is the ILP restricted to
//!   `X_i <= 0` (the λ term vanishes: maximise the price removed subject to (1) and (3)),
//!   a bounded knapsack solved *exactly* by branch-and-bound over per-type counts (no solver
//!   crate is available; the running fleet of one service is small).
//!
//! Ambiguities resolved (documented at each use):
//! * Target capacity: (1) literally asks for `capacity >= W`, but a fleet sized to exactly
//!   `W` sits at 100% saturation and would re-trigger at once. Both directions therefore
//!   target `W <= threshold × capacity`, which also gives hysteresis: scale-out fires above
//!   the threshold and scale-in never leaves the fleet above it.
//! * `W`: scale-out uses the newest sample's arrival rate (the trigger has already required
//!   persistence); scale-in uses the peak over the cool-down period.
//! * Samples are sample-and-hold: a sample describes the interval up to the next one, so a
//!   window `[now - w, now]` is covered only if some sample is at or before `now - w`.
//! * Capacity for sizing: the newest sample's measured capacity plus the profiled `T_i` of
//!   instances still launching at that sample's time (ready at `launched_at + O_i^launch`),
//!   so a fleet that is already growing is not scaled out again.
//! * `λ` is per second of launch latency, so `λ O_i^launch` is dimensionless.
//! * Resources (2): a replica's GPU memory must fit in one GPU of the type, and, when the
//!   caller gives residual GPUs per GPU model, the new instances' GPUs must fit in them.

use super::{finite, non_negative, positive, HetSevError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Slack for comparisons of sums of floats.
const EPS: f64 = 1e-9;

/// What offline profiling says about one model on one instance type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// `T_i` (Sec. 4.1 (e)): maximum throughput of one instance, req/s.
    pub throughput_rps: f64,
    /// `L_i^inf` (Sec. 4.1 (j)): inference latency, ms; Constraint (4) needs `<= S`.
    pub inference_latency_ms: f64,
    /// `R_i^{GPU memory}` (Sec. 4.1 (h)): GPU memory one replica needs on one GPU, GB.
    pub gpu_memory_gb: f64,
}

/// An instance type the controller may launch (Sec. 4.1 (a)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceType {
    /// Unique name, e.g. `g4dn.xlarge`.
    pub name: String,
    /// GPU model, e.g. `T4`; residual GPUs are counted per GPU model.
    pub gpu_model: String,
    pub gpu_count: u32,
    /// `C_i`: price per hour of one instance.
    pub price_per_hour: f64,
    /// `O_i^launch`: seconds from launch request until the instance serves.
    pub launch_latency_s: f64,
    /// Memory of each GPU, GB.
    pub gpu_memory_gb: f64,
    /// Per-model profiles, used by [`ProfiledCapacity`]; a model absent here cannot run on
    /// this type.
    #[serde(default)]
    pub capacity: BTreeMap<String, ModelProfile>,
}

/// Where `T_i`, `L_i^inf` and memory come from: the per-type table ([`ProfiledCapacity`]) or
/// any function `Fn(&InstanceType, &str) -> Option<ModelProfile>`.
pub trait CapacityModel {
    /// The profile of `model` on `instance_type`, or `None` if it cannot run there.
    fn profile(&self, instance_type: &InstanceType, model: &str) -> Option<ModelProfile>;
}

/// Reads [`InstanceType::capacity`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfiledCapacity;

impl CapacityModel for ProfiledCapacity {
    fn profile(&self, instance_type: &InstanceType, model: &str) -> Option<ModelProfile> {
        instance_type.capacity.get(model).copied()
    }
}

impl<F: Fn(&InstanceType, &str) -> Option<ModelProfile>> CapacityModel for F {
    fn profile(&self, instance_type: &InstanceType, model: &str) -> Option<ModelProfile> {
        self(instance_type, model)
    }
}

/// A running (or launching) instance of the service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningInstance {
    pub id: String,
    /// Name of an [`InstanceType`].
    pub instance_type: String,
    /// When it was requested; it serves from `launched_at_s + launch_latency_s`.
    pub launched_at_s: f64,
}

/// One monitored sample (Sec. 4, "metric repository").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadSample {
    pub t_s: f64,
    /// `W` at `t_s`, req/s.
    pub arrival_rate: f64,
    /// Summed throughput capacity of the instances serving at `t_s`, req/s.
    pub capacity: f64,
}

impl LoadSample {
    /// Throughput saturation `arrival_rate / capacity`; infinite when there is load but no
    /// capacity, 0 when there is neither.
    pub fn saturation(&self) -> f64 {
        if self.capacity > 0.0 {
            self.arrival_rate / self.capacity
        } else if self.arrival_rate > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    }
}

/// Everything one scaling decision needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleInput {
    /// The service's model.
    pub model: String,
    /// `S`: the latency SLO, ms.
    pub slo_ms: f64,
    pub instance_types: Vec<InstanceType>,
    pub instances: Vec<RunningInstance>,
    /// Samples in non-decreasing time order, none after `now_s`. History older than
    /// `max(window_s, cooldown_s)` is ignored.
    pub samples: Vec<LoadSample>,
    /// `R_total^GPU` per GPU model; `None` means unlimited (a cloud). A GPU model missing
    /// from `Some(map)` has no free GPU.
    #[serde(default)]
    pub residual_gpus: Option<BTreeMap<String, u32>>,
    pub now_s: f64,
}

/// Scaling-controller parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AutoscaleConfig {
    /// Saturation above which to scale out; the paper uses 80% (Sec. 4.1).
    pub saturation_threshold: f64,
    /// How long saturation must stay above the threshold, seconds ("for a period of time").
    pub window_s: f64,
    /// How long the lower load must hold before instances are destroyed, seconds.
    pub cooldown_s: f64,
    /// `λ` per second of launch latency (Sec. 4.1 (d)): large for fluctuating load.
    pub lambda_per_s: f64,
    /// Scale-in never goes below this many instances (Constraint (3) allows 0).
    pub min_instances: u32,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        // 0.8 is the paper's; the rest are this implementation's defaults. A 300 s cool-down
        // matches the Kubernetes scale-down stabilisation window the paper's evaluation
        // mirrors (Sec. 6, "Baseline").
        AutoscaleConfig { saturation_threshold: 0.8, window_s: 60.0, cooldown_s: 300.0, lambda_per_s: 0.001, min_instances: 1 }
    }
}

/// The scaling controller's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ScaleDecision {
    /// Launch `count` instances of `instance_type`.
    ScaleOut {
        instance_type: String,
        count: u32,
    },
    /// Destroy these instances (ascending ids).
    ScaleIn {
        instance_ids: Vec<String>,
    },
    Hold {
        reason: HoldReason,
    },
}

/// Why nothing is done now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HoldReason {
    /// The newest sample is saturated but the samples do not reach back to the window start.
    InsufficientHistory { needed_from_s: f64, earliest_sample_s: Option<f64> },
    /// Saturated only since `saturated_since_s`: shorter than the window (a spike).
    SaturationNotSustained { saturated_since_s: f64, window_s: f64 },
    /// Instances still launching already bring capacity to the target.
    PendingCapacitySuffices { capacity: f64, required: f64 },
    /// No type passes Constraints (2) and (4); why each failed.
    NoAdequateInstanceType { rejected: Vec<TypeRejection> },
    /// Instances could go, but the load has only been low since `underload_since_s`.
    CoolDown { underload_since_s: f64, remaining_s: f64 },
    /// Below the threshold and no instance can be removed.
    WithinTarget { saturation: f64 },
}

/// Why an instance type cannot take a scale-out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TypeRejection {
    NoProfile {
        instance_type: String,
    },
    /// Constraint (4).
    SloViolated {
        instance_type: String,
        latency_ms: f64,
        slo_ms: f64,
    },
    /// Constraint (2), GPU memory of one GPU.
    GpuMemory {
        instance_type: String,
        needed_gb: f64,
        per_gpu_gb: f64,
    },
    /// Constraint (2), residual GPUs of its model.
    ResidualGpus {
        instance_type: String,
        needed: u64,
        free: u32,
    },
}

/// The ILP objective of scaling out `count` instances of one type (the only non-zero `X_i`):
/// `C_i (X_i + λ O_i^launch X_i)`.
pub fn launch_objective(price_per_hour: f64, launch_latency_s: f64, count: u32, lambda_per_s: f64) -> f64 {
    let x = f64::from(count);
    price_per_hour * (x + lambda_per_s * launch_latency_s * x)
}

/// [`decide_with`] using the per-type profile tables.
pub fn decide(input: &ScaleInput, config: &AutoscaleConfig) -> Result<ScaleDecision, HetSevError> {
    decide_with(input, config, &ProfiledCapacity)
}

/// One scaling decision (Sec. 4.1 heuristic, steps (a)–(c)).
pub fn decide_with(input: &ScaleInput, config: &AutoscaleConfig, capacity: &dyn CapacityModel) -> Result<ScaleDecision, HetSevError> {
    let profiles = validate(input, config, capacity)?;
    let Some(latest) = input.samples.last() else {
        return Ok(hold(HoldReason::InsufficientHistory { needed_from_s: input.now_s - config.window_s, earliest_sample_s: None }));
    };
    let theta = config.saturation_threshold;
    if latest.saturation() > theta {
        // (a) Risk for Constraint (1): saturated through the whole window?
        let from = input.now_s - config.window_s;
        let since = suffix_start(&input.samples, |s| s.saturation() > theta);
        return Ok(match in_effect_from(&input.samples, from) {
            None => hold(HoldReason::InsufficientHistory { needed_from_s: from, earliest_sample_s: Some(input.samples[0].t_s) }),
            Some(i0) if since <= i0 => scale_out(input, config, &profiles, latest),
            Some(_) => hold(HoldReason::SaturationNotSustained { saturated_since_s: input.samples[since].t_s, window_s: config.window_s }),
        });
    }
    Ok(scale_in(input, config, &profiles, latest))
}

fn hold(reason: HoldReason) -> ScaleDecision {
    ScaleDecision::Hold { reason }
}

/// Index of the sample in effect at `from` (the last one at or before it), if any.
pub(super) fn in_effect_from(samples: &[LoadSample], from: f64) -> Option<usize> {
    samples.iter().rposition(|s| s.t_s <= from)
}

/// Start of the longest suffix of samples that all satisfy `pred` (`len` if none does).
pub(super) fn suffix_start(samples: &[LoadSample], pred: impl Fn(&LoadSample) -> bool) -> usize {
    samples.iter().rposition(|s| !pred(s)).map_or(0, |i| i + 1)
}

/// Scale-out: size every adequate type to restore Constraint (1) at the threshold and take
/// the one with the least objective (ties: shorter launch, then name).
fn scale_out(input: &ScaleInput, config: &AutoscaleConfig, profiles: &Profiles, latest: &LoadSample) -> ScaleDecision {
    let required = latest.arrival_rate / config.saturation_threshold;
    let launching: f64 = input
        .instances
        .iter()
        .filter(|inst| inst.launched_at_s + profiles.launch_latency(&inst.instance_type) > latest.t_s)
        .map(|inst| profiles.throughput(&inst.instance_type))
        .sum();
    let capacity = latest.capacity + launching;
    let deficit = required - capacity;
    if deficit <= EPS {
        return hold(HoldReason::PendingCapacitySuffices { capacity, required });
    }
    let mut best: Option<(f64, &InstanceType, u32)> = None;
    let mut rejected = Vec::new();
    for (ty, profile) in input.instance_types.iter().zip(&profiles.by_type) {
        let name = ty.name.clone();
        let Some(p) = profile else {
            rejected.push(TypeRejection::NoProfile { instance_type: name });
            continue;
        };
        if p.inference_latency_ms > input.slo_ms {
            rejected.push(TypeRejection::SloViolated { instance_type: name, latency_ms: p.inference_latency_ms, slo_ms: input.slo_ms });
            continue;
        }
        if p.gpu_memory_gb > ty.gpu_memory_gb {
            rejected.push(TypeRejection::GpuMemory { instance_type: name, needed_gb: p.gpu_memory_gb, per_gpu_gb: ty.gpu_memory_gb });
            continue;
        }
        // Constraints (1) and (3): the fewest instances of this type that cover the deficit.
        let count = ((deficit / p.throughput_rps) - EPS).ceil().max(1.0);
        if count > f64::from(u32::MAX) {
            continue; // a throughput so small it cannot matter; never the minimum anyway
        }
        let count = count as u32;
        if let Some(residual) = &input.residual_gpus {
            let free = residual.get(&ty.gpu_model).copied().unwrap_or(0);
            let needed = u64::from(count) * u64::from(ty.gpu_count);
            if needed > u64::from(free) {
                rejected.push(TypeRejection::ResidualGpus { instance_type: name, needed, free });
                continue;
            }
        }
        let objective = launch_objective(ty.price_per_hour, ty.launch_latency_s, count, config.lambda_per_s);
        let better = match best {
            None => true,
            Some((o, b, _)) => {
                objective < o - EPS
                    || (objective <= o + EPS && (ty.launch_latency_s, ty.name.as_str()) < (b.launch_latency_s, b.name.as_str()))
            }
        };
        if better {
            best = Some((objective, ty, count));
        }
    }
    match best {
        Some((_, ty, count)) => ScaleDecision::ScaleOut { instance_type: ty.name.clone(), count },
        None => hold(HoldReason::NoAdequateInstanceType { rejected }),
    }
}

/// Scale-in: the exact ILP with `X_i <= 0` at the peak load of the cool-down period; if that
/// removes nothing but the newest load alone would allow removals, report the cool-down.
fn scale_in(input: &ScaleInput, config: &AutoscaleConfig, profiles: &Profiles, latest: &LoadSample) -> ScaleDecision {
    let theta = config.saturation_threshold;
    let groups = groups(input, profiles);
    let removable = input.instances.len().saturating_sub(config.min_instances as usize);
    let now_plan = remove_plan(&groups, latest.arrival_rate / theta, removable);
    if now_plan.is_empty() {
        return hold(HoldReason::WithinTarget { saturation: latest.saturation() });
    }
    let from = input.now_s - config.cooldown_s;
    if let Some(i0) = in_effect_from(&input.samples, from) {
        let peak = input.samples[i0..].iter().map(|s| s.arrival_rate).fold(0.0, f64::max);
        let plan = remove_plan(&groups, peak / theta, removable);
        if !plan.is_empty() {
            let mut ids: Vec<String> = plan.into_iter().map(|(g, i)| groups[g].ids[i].clone()).collect();
            ids.sort();
            return ScaleDecision::ScaleIn { instance_ids: ids };
        }
    }
    // The removals the newest load allows leave `kept`; the load must have stayed within
    // threshold × kept for the whole cool-down.
    let removed: f64 = now_plan.iter().map(|&(g, _)| groups[g].throughput).sum();
    let kept: f64 = groups.iter().map(|g| g.throughput * g.ids.len() as f64).sum::<f64>() - removed;
    let start = suffix_start(&input.samples, |s| s.arrival_rate <= theta * kept + EPS).min(input.samples.len() - 1);
    let since = input.samples[start].t_s;
    hold(HoldReason::CoolDown { underload_since_s: since, remaining_s: (since + config.cooldown_s - input.now_s).max(0.0) })
}

/// The running instances of one type: interchangeable for the ILP.
struct Group {
    name: String,
    price: f64,
    throughput: f64,
    /// Newest first (then id descending): removals take the newest.
    ids: Vec<String>,
}

fn groups(input: &ScaleInput, profiles: &Profiles) -> Vec<Group> {
    let mut by_type: BTreeMap<&str, Vec<&RunningInstance>> = BTreeMap::new();
    for inst in &input.instances {
        by_type.entry(inst.instance_type.as_str()).or_default().push(inst);
    }
    by_type
        .into_iter()
        .map(|(name, mut insts)| {
            insts.sort_by(|a, b| b.launched_at_s.total_cmp(&a.launched_at_s).then_with(|| b.id.cmp(&a.id)));
            let ty = profiles.index[name];
            Group {
                name: name.to_string(),
                price: input.instance_types[ty].price_per_hour,
                throughput: profiles.throughput(name),
                ids: insts.into_iter().map(|i| i.id.clone()).collect(),
            }
        })
        .collect()
}

/// Exact solution of `max Σ C_g r_g  s.t.  Σ T_g (N_g - r_g) >= required, 0 <= r_g <= N_g,
/// Σ r_g <= removable` by depth-first branch-and-bound over the per-type counts `r_g`,
/// groups ordered by price per unit of capacity, bounded by the fractional-knapsack
/// relaxation. Returns (group, index into its newest-first ids) pairs; empty when no removal
/// saves anything.
fn remove_plan(groups: &[Group], required: f64, removable: usize) -> Vec<(usize, usize)> {
    let total: f64 = groups.iter().map(|g| g.throughput * g.ids.len() as f64).sum();
    let slack = total - required;
    if slack < -EPS || removable == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|&a, &b| {
        let (ga, gb) = (&groups[a], &groups[b]);
        (gb.price / gb.throughput).total_cmp(&(ga.price / ga.throughput)).then_with(|| ga.name.cmp(&gb.name))
    });
    let mut search = Search { groups, order, counts: vec![0; groups.len()], best: 0.0, best_counts: vec![0; groups.len()] };
    search.dfs(0, slack.max(0.0), removable, 0.0);
    let mut plan = Vec::new();
    for (g, &r) in search.best_counts.iter().enumerate() {
        plan.extend((0..r).map(|i| (g, i)));
    }
    plan
}

struct Search<'a> {
    groups: &'a [Group],
    order: Vec<usize>,
    counts: Vec<usize>,
    best: f64,
    best_counts: Vec<usize>,
}

impl Search<'_> {
    fn dfs(&mut self, level: usize, slack: f64, removable: usize, saved: f64) {
        if level == self.order.len() {
            if saved > self.best + EPS {
                self.best = saved;
                self.best_counts.clone_from(&self.counts);
            }
            return;
        }
        if saved + self.bound(level, slack) <= self.best + EPS {
            return;
        }
        let g = &self.groups[self.order[level]];
        let fit = ((slack + EPS) / g.throughput).floor() as usize;
        let max = g.ids.len().min(fit).min(removable);
        for r in (0..=max).rev() {
            self.counts[self.order[level]] = r;
            self.dfs(level + 1, slack - r as f64 * g.throughput, removable - r, saved + r as f64 * g.price);
        }
        self.counts[self.order[level]] = 0;
    }

    /// Fractional-knapsack upper bound on what the groups from `level` on can still save.
    fn bound(&self, level: usize, mut slack: f64) -> f64 {
        let mut gain = 0.0;
        for &g in &self.order[level..] {
            let g = &self.groups[g];
            let take = (g.ids.len() as f64).min(slack / g.throughput).max(0.0);
            gain += take * g.price;
            slack -= take * g.throughput;
            if slack <= 0.0 {
                break;
            }
        }
        gain
    }
}

/// Profiles of the service's model per instance type, validated once.
struct Profiles {
    /// Parallel to `input.instance_types`.
    by_type: Vec<Option<ModelProfile>>,
    launch: Vec<f64>,
    index: BTreeMap<String, usize>,
}

impl Profiles {
    fn throughput(&self, name: &str) -> f64 {
        self.by_type[self.index[name]].map_or(0.0, |p| p.throughput_rps)
    }
    fn launch_latency(&self, name: &str) -> f64 {
        self.launch[self.index[name]]
    }
}

/// The controller's parameters: the threshold in (0, 1], a positive window, the rest finite
/// and non-negative.
pub(super) fn validate_config(config: &AutoscaleConfig) -> Result<(), HetSevError> {
    let th = config.saturation_threshold;
    positive(|| "config.saturation_threshold".into(), th)?;
    if th > 1.0 {
        return Err(HetSevError::invalid("config.saturation_threshold", format!("must be in (0, 1], got {th}")));
    }
    positive(|| "config.window_s".into(), config.window_s)?;
    non_negative(|| "config.cooldown_s".into(), config.cooldown_s)?;
    non_negative(|| "config.lambda_per_s".into(), config.lambda_per_s)
}

/// Samples in time order, none after `now_s`, with finite non-negative rates.
pub(super) fn validate_samples(samples: &[LoadSample], now_s: f64) -> Result<(), HetSevError> {
    for (k, s) in samples.iter().enumerate() {
        let f = |name: &str| format!("samples[{k}].{name}");
        finite(|| f("t_s"), s.t_s)?;
        if s.t_s > now_s {
            return Err(HetSevError::invalid(f("t_s"), format!("{} is after now_s {}", s.t_s, now_s)));
        }
        if k > 0 && s.t_s < samples[k - 1].t_s {
            return Err(HetSevError::invalid(f("t_s"), format!("{} is before samples[{}].t_s {}", s.t_s, k - 1, samples[k - 1].t_s)));
        }
        non_negative(|| f("arrival_rate"), s.arrival_rate)?;
        non_negative(|| f("capacity"), s.capacity)?;
    }
    Ok(())
}

fn validate(input: &ScaleInput, config: &AutoscaleConfig, capacity: &dyn CapacityModel) -> Result<Profiles, HetSevError> {
    validate_config(config)?;
    if input.model.is_empty() {
        return Err(HetSevError::invalid("model", "must not be empty"));
    }
    positive(|| "slo_ms".into(), input.slo_ms)?;
    finite(|| "now_s".into(), input.now_s)?;

    let mut index = BTreeMap::new();
    let mut by_type = Vec::new();
    let mut launch = Vec::new();
    for (i, ty) in input.instance_types.iter().enumerate() {
        let f = |name: &str| format!("instance_types[{i}].{name}");
        if ty.name.is_empty() {
            return Err(HetSevError::invalid(f("name"), "must not be empty"));
        }
        if index.insert(ty.name.clone(), i).is_some() {
            return Err(HetSevError::invalid(f("name"), format!("duplicate instance type `{}`", ty.name)));
        }
        if ty.gpu_count == 0 {
            return Err(HetSevError::invalid(f("gpu_count"), "must be >= 1"));
        }
        non_negative(|| f("price_per_hour"), ty.price_per_hour)?;
        non_negative(|| f("launch_latency_s"), ty.launch_latency_s)?;
        positive(|| f("gpu_memory_gb"), ty.gpu_memory_gb)?;
        let profile = capacity.profile(ty, &input.model);
        if let Some(p) = &profile {
            let pf = |name: &str| format!("instance_types[{i}].capacity[{}].{name}", input.model);
            positive(|| pf("throughput_rps"), p.throughput_rps)?;
            non_negative(|| pf("inference_latency_ms"), p.inference_latency_ms)?;
            non_negative(|| pf("gpu_memory_gb"), p.gpu_memory_gb)?;
        }
        by_type.push(profile);
        launch.push(ty.launch_latency_s);
    }

    let mut ids = BTreeSet::new();
    for (j, inst) in input.instances.iter().enumerate() {
        let f = |name: &str| format!("instances[{j}].{name}");
        if !ids.insert(inst.id.as_str()) {
            return Err(HetSevError::invalid(f("id"), format!("duplicate instance id `{}`", inst.id)));
        }
        let Some(&ty) = index.get(&inst.instance_type) else {
            return Err(HetSevError::UnknownInstanceType { field: f("instance_type"), name: inst.instance_type.clone() });
        };
        if by_type[ty].is_none() {
            return Err(HetSevError::invalid(
                f("instance_type"),
                format!("type `{}` has no capacity profile for model `{}`", inst.instance_type, input.model),
            ));
        }
        finite(|| f("launched_at_s"), inst.launched_at_s)?;
        if inst.launched_at_s > input.now_s {
            return Err(HetSevError::invalid(f("launched_at_s"), format!("{} is after now_s {}", inst.launched_at_s, input.now_s)));
        }
    }

    validate_samples(&input.samples, input.now_s)?;
    Ok(Profiles { by_type, launch, index })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MODEL: &str = "resnet50";

    fn ty(name: &str, gpu: &str, price: f64, launch_s: f64, mem_gb: f64, rps: f64, lat_ms: f64) -> InstanceType {
        InstanceType {
            name: name.into(),
            gpu_model: gpu.into(),
            gpu_count: 1,
            price_per_hour: price,
            launch_latency_s: launch_s,
            gpu_memory_gb: mem_gb,
            capacity: BTreeMap::from([(
                MODEL.to_string(),
                ModelProfile { throughput_rps: rps, inference_latency_ms: lat_ms, gpu_memory_gb: 8.0 },
            )]),
        }
    }

    fn inst(id: &str, ty: &str, at: f64) -> RunningInstance {
        RunningInstance { id: id.into(), instance_type: ty.into(), launched_at_s: at }
    }

    /// One sample every 10 s from t = 0 to `until`, rate given by `rate(t)`.
    fn samples(until: u32, capacity: f64, rate: impl Fn(f64) -> f64) -> Vec<LoadSample> {
        (0..=until / 10)
            .map(|i| {
                let t = f64::from(i * 10);
                LoadSample { t_s: t, arrival_rate: rate(t), capacity }
            })
            .collect()
    }

    fn input(types: Vec<InstanceType>, instances: Vec<RunningInstance>, samples: Vec<LoadSample>, now: f64) -> ScaleInput {
        ScaleInput { model: MODEL.into(), slo_ms: 100.0, instance_types: types, instances, samples, residual_gpus: None, now_s: now }
    }

    fn cfg() -> AutoscaleConfig {
        AutoscaleConfig { saturation_threshold: 0.8, window_s: 30.0, cooldown_s: 60.0, lambda_per_s: 0.001, min_instances: 1 }
    }

    /// t4 is the cheapest adequate type; k80 is cheaper but breaks the SLO (Constraint 4),
    /// tiny is cheaper but its 4 GB GPU cannot hold the 8 GB model (Constraint 2).
    fn fleet_types() -> Vec<InstanceType> {
        vec![
            ty("v100", "V100", 3.0, 60.0, 32.0, 300.0, 20.0),
            ty("t4", "T4", 0.5, 60.0, 16.0, 100.0, 40.0),
            ty("k80", "K80", 0.2, 60.0, 12.0, 50.0, 150.0),
            ty("tiny", "T4", 0.1, 60.0, 4.0, 100.0, 40.0),
        ]
    }

    #[test]
    fn sustained_step_above_80_percent_scales_out_on_cheapest_adequate_type() {
        // Two t4 (200 req/s); load steps from 100 (50%) to 180 (90%) at t = 50.
        let s = samples(100, 200.0, |t| if t < 50.0 { 100.0 } else { 180.0 });
        let insts = vec![inst("a", "t4", 0.0), inst("b", "t4", 0.0)];
        let d = decide(&input(fleet_types(), insts.clone(), s.clone(), 100.0), &cfg()).unwrap();
        // Target 180 / 0.8 = 225 > 200: deficit 25 → one t4 (0.5 × 1.06 = 0.53) beats one
        // v100 (3 × 1.06 = 3.18); k80 and tiny are filtered out.
        assert_eq!(d, ScaleDecision::ScaleOut { instance_type: "t4".into(), count: 1 });

        // With t4 at 9.0/h (9 × 1.06 = 9.54), k80 and tiny still excluded: v100 wins.
        let mut types = fleet_types();
        types[1].price_per_hour = 9.0;
        let d = decide(&input(types, insts, s, 100.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::ScaleOut { instance_type: "v100".into(), count: 1 });
    }

    #[test]
    fn count_enters_the_objective() {
        // Deficit 350 - 100 = 250 req/s: three t4 (3 × 0.5 × 1.06 = 1.59) beat one v100
        // (3.0 × 1.06 = 3.18); at 1.2/h one v100 (1.2 × 1.06 = 1.272) beats three t4.
        let s = samples(100, 100.0, |_| 280.0); // need 350, have 100
        let insts = vec![inst("a", "t4", 0.0)];
        let d = decide(&input(fleet_types(), insts.clone(), s.clone(), 100.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::ScaleOut { instance_type: "t4".into(), count: 3 });
        let mut types = fleet_types();
        types[0].price_per_hour = 1.2;
        let d = decide(&input(types, insts, s, 100.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::ScaleOut { instance_type: "v100".into(), count: 1 });
    }

    #[test]
    fn lambda_makes_a_cheap_but_slow_to_launch_type_lose() {
        let types = vec![ty("spot-slow", "T4", 0.4, 900.0, 16.0, 100.0, 40.0), ty("fast", "T4", 0.6, 30.0, 16.0, 100.0, 40.0)];
        // Hand-computed objective C (X + λ O X), X = 1, λ = 0.002/s:
        // slow: 0.4 × (1 + 1.8) = 1.12, fast: 0.6 × (1 + 0.06) = 0.636.
        assert!((launch_objective(0.4, 900.0, 1, 0.002) - 1.12).abs() < 1e-12);
        assert!((launch_objective(0.6, 30.0, 1, 0.002) - 0.636).abs() < 1e-12);
        assert!((launch_objective(0.4, 900.0, 2, 0.002) - 2.24).abs() < 1e-12);
        let s = samples(100, 100.0, |_| 90.0); // 90% saturated, need 112.5: one more
        let mk = || input(types.clone(), vec![inst("a", "fast", 0.0)], s.clone(), 100.0);
        let slow_loses = decide(&mk(), &AutoscaleConfig { lambda_per_s: 0.002, ..cfg() }).unwrap();
        assert_eq!(slow_loses, ScaleDecision::ScaleOut { instance_type: "fast".into(), count: 1 });
        // λ = 0 (stable load): price alone, 0.4 < 0.6.
        let slow_wins = decide(&mk(), &AutoscaleConfig { lambda_per_s: 0.0, ..cfg() }).unwrap();
        assert_eq!(slow_wins, ScaleDecision::ScaleOut { instance_type: "spot-slow".into(), count: 1 });
    }

    #[test]
    fn spike_shorter_than_the_window_does_not_scale_out() {
        // 50% load, spike to 95% from t = 90; window 30 s reaches back to t = 70.
        let s = samples(100, 200.0, |t| if t >= 90.0 { 190.0 } else { 100.0 });
        let insts = vec![inst("a", "t4", 0.0), inst("b", "t4", 0.0)];
        let d = decide(&input(fleet_types(), insts.clone(), s.clone(), 100.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::Hold { reason: HoldReason::SaturationNotSustained { saturated_since_s: 90.0, window_s: 30.0 } });
        // The same spike held through the window does scale out (t = 120: samples 90..120).
        let mut longer = s;
        longer.extend([110.0, 120.0].map(|t| LoadSample { t_s: t, arrival_rate: 190.0, capacity: 200.0 }));
        let d = decide(&input(fleet_types(), insts.clone(), longer.clone(), 120.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::ScaleOut { instance_type: "t4".into(), count: 1 });
        // After the spike subsides, nothing scales out.
        longer.push(LoadSample { t_s: 130.0, arrival_rate: 100.0, capacity: 200.0 });
        let d = decide(&input(fleet_types(), insts, longer, 130.0), &cfg()).unwrap();
        assert!(!matches!(d, ScaleDecision::ScaleOut { .. }), "{d:?}");
    }

    #[test]
    fn saturation_without_window_history_holds() {
        let s = vec![LoadSample { t_s: 90.0, arrival_rate: 190.0, capacity: 200.0 }];
        let d = decide(&input(fleet_types(), vec![inst("a", "t4", 0.0)], s, 100.0), &cfg()).unwrap();
        assert_eq!(
            d,
            ScaleDecision::Hold { reason: HoldReason::InsufficientHistory { needed_from_s: 70.0, earliest_sample_s: Some(90.0) } }
        );
    }

    #[test]
    fn launching_instances_count_towards_the_target() {
        // 90% of 200 for the whole window, but a t4 launched at t = 80 (ready at 140) is
        // on its way: 200 + 100 >= 225.
        let s = samples(100, 200.0, |_| 180.0);
        let insts = vec![inst("a", "t4", 0.0), inst("b", "t4", 0.0), inst("c", "t4", 80.0)];
        let d = decide(&input(fleet_types(), insts, s, 100.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::Hold { reason: HoldReason::PendingCapacitySuffices { capacity: 300.0, required: 225.0 } });
    }

    #[test]
    fn residual_gpus_and_slo_reject_types_with_reasons() {
        let s = samples(100, 100.0, |_| 90.0);
        let mut i = input(fleet_types(), vec![inst("a", "t4", 0.0)], s, 100.0);
        i.residual_gpus = Some(BTreeMap::from([("T4".to_string(), 0)]));
        let d = decide(&i, &cfg()).unwrap();
        let ScaleDecision::Hold { reason: HoldReason::NoAdequateInstanceType { rejected } } = d else { panic!("{d:?}") };
        assert_eq!(
            rejected,
            vec![
                TypeRejection::ResidualGpus { instance_type: "v100".into(), needed: 1, free: 0 },
                TypeRejection::ResidualGpus { instance_type: "t4".into(), needed: 1, free: 0 },
                TypeRejection::SloViolated { instance_type: "k80".into(), latency_ms: 150.0, slo_ms: 100.0 },
                TypeRejection::GpuMemory { instance_type: "tiny".into(), needed_gb: 8.0, per_gpu_gb: 4.0 },
            ]
        );
        // One free V100 makes v100 the only choice.
        i.residual_gpus = Some(BTreeMap::from([("V100".to_string(), 1)]));
        assert_eq!(decide(&i, &cfg()).unwrap(), ScaleDecision::ScaleOut { instance_type: "v100".into(), count: 1 });
    }

    #[test]
    fn drop_scales_in_only_after_the_cool_down() {
        // Four t4 (400 req/s); 300 req/s (75%, not saturated) until t = 100, then 100 req/s.
        let insts = vec![inst("a", "t4", 0.0), inst("b", "t4", 10.0), inst("c", "t4", 20.0), inst("d", "t4", 30.0)];
        let at = |now: u32| {
            let s = samples(now, 400.0, |t| if t <= 100.0 { 300.0 } else { 100.0 });
            decide(&input(fleet_types(), insts.clone(), s, f64::from(now)), &cfg()).unwrap()
        };
        // Newest load 100 needs 125: two t4 could go, but 300 req/s is inside the 60 s
        // cool-down (underload since the t = 110 sample).
        assert_eq!(at(130), ScaleDecision::Hold { reason: HoldReason::CoolDown { underload_since_s: 110.0, remaining_s: 40.0 } });
        assert_eq!(at(160), ScaleDecision::Hold { reason: HoldReason::CoolDown { underload_since_s: 110.0, remaining_s: 10.0 } });
        // At t = 170 the cool-down window [110, 170] holds only 100 req/s: the two newest go.
        assert_eq!(at(170), ScaleDecision::ScaleIn { instance_ids: vec!["c".into(), "d".into()] });
    }

    #[test]
    fn scale_in_removes_the_most_expensive_instances_it_can() {
        // v100 (3.0/h, 300) + two t4 (0.5/h, 100 each); 100 req/s needs 125.
        // Options: drop v100 (saves 3.0, keeps 200) or both t4 (saves 1.0, keeps 300);
        // v100 + a t4 keeps 100 < 125. The ILP drops the v100.
        let insts = vec![inst("big", "v100", 0.0), inst("s1", "t4", 0.0), inst("s2", "t4", 0.0)];
        let s = samples(200, 500.0, |_| 100.0);
        let d = decide(&input(fleet_types(), insts, s, 200.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::ScaleIn { instance_ids: vec!["big".into()] });
    }

    #[test]
    fn scale_in_keeps_min_instances_and_holds_when_nothing_can_go() {
        let s = samples(200, 100.0, |_| 0.0);
        let d = decide(&input(fleet_types(), vec![inst("only", "t4", 0.0)], s.clone(), 200.0), &cfg()).unwrap();
        assert_eq!(d, ScaleDecision::Hold { reason: HoldReason::WithinTarget { saturation: 0.0 } });
        let zero = AutoscaleConfig { min_instances: 0, ..cfg() };
        let d = decide(&input(fleet_types(), vec![inst("only", "t4", 0.0)], s, 200.0), &zero).unwrap();
        assert_eq!(d, ScaleDecision::ScaleIn { instance_ids: vec!["only".into()] });
    }

    #[test]
    fn capacity_function_replaces_the_table() {
        let types: Vec<_> = fleet_types().into_iter().map(|t| InstanceType { capacity: BTreeMap::new(), ..t }).collect();
        let f = |t: &InstanceType, m: &str| {
            (m == MODEL && t.name == "v100").then_some(ModelProfile {
                throughput_rps: 50.0,
                inference_latency_ms: 10.0,
                gpu_memory_gb: 1.0,
            })
        };
        let s = samples(100, 50.0, |_| 100.0); // need 125, have 50 → two v100
        let d = decide_with(&input(types, vec![], s, 100.0), &cfg(), &f).unwrap();
        assert_eq!(d, ScaleDecision::ScaleOut { instance_type: "v100".into(), count: 2 });
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let ok = || input(fleet_types(), vec![inst("a", "t4", 0.0)], samples(100, 100.0, |_| 50.0), 100.0);
        let err = |i: ScaleInput, c: AutoscaleConfig| decide(&i, &c).unwrap_err();

        let mut i = ok();
        i.samples[2].arrival_rate = -1.0;
        let e = err(i, cfg());
        assert_eq!(e.field(), "samples[2].arrival_rate");
        assert_eq!(e.to_string(), "invalid `samples[2].arrival_rate`: must be >= 0, got -1");

        let mut i = ok();
        i.samples[0].capacity = f64::NAN;
        assert_eq!(err(i, cfg()), HetSevError::invalid("samples[0].capacity", "is NaN"));

        let e = err(ok(), AutoscaleConfig { window_s: 0.0, ..cfg() });
        assert_eq!(e, HetSevError::invalid("config.window_s", "must be > 0, got 0"));

        let e = err(ok(), AutoscaleConfig { saturation_threshold: 1.5, ..cfg() });
        assert_eq!(e.field(), "config.saturation_threshold");

        let mut i = ok();
        i.instances.push(inst("b", "a100", 0.0));
        let e = err(i, cfg());
        assert_eq!(e, HetSevError::UnknownInstanceType { field: "instances[1].instance_type".into(), name: "a100".into() });
        assert_eq!(e.to_string(), "`instances[1].instance_type` names unknown instance type `a100`");

        let mut i = ok();
        i.instance_types[1].price_per_hour = f64::NAN;
        assert_eq!(err(i, cfg()).field(), "instance_types[1].price_per_hour");

        let mut i = ok();
        i.samples.swap(3, 4);
        assert_eq!(err(i, cfg()).field(), "samples[4].t_s");

        let mut i = ok();
        i.instance_types[1].capacity.get_mut(MODEL).unwrap().throughput_rps = 0.0;
        assert_eq!(err(i, cfg()).field(), "instance_types[1].capacity[resnet50].throughput_rps");
    }

    #[test]
    fn config_and_decisions_round_trip_through_serde() {
        let c = cfg();
        assert_eq!(serde_json::from_str::<AutoscaleConfig>(&serde_json::to_string(&c).unwrap()).unwrap(), c);
        let d: AutoscaleConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(d.saturation_threshold, 0.8);
        let h = ScaleDecision::Hold { reason: HoldReason::CoolDown { underload_since_s: 1.0, remaining_s: 2.0 } };
        assert_eq!(serde_json::from_str::<ScaleDecision>(&serde_json::to_string(&h).unwrap()).unwrap(), h);
        let i = input(fleet_types(), vec![inst("a", "t4", 0.0)], samples(20, 1.0, |_| 1.0), 20.0);
        assert_eq!(serde_json::from_str::<ScaleInput>(&serde_json::to_string(&i).unwrap()).unwrap(), i);
    }

    proptest! {
        /// Scale-out restores the target; scale-in never drops the profiled capacity below
        /// the cool-down peak / threshold; the chosen type is never beaten by another.
        #[test]
        fn decisions_respect_the_target(
            n_t4 in 0usize..5, n_v100 in 0usize..3,
            rates in proptest::collection::vec(0.0f64..1500.0, 1..15),
            lambda in 0.0f64..0.01,
        ) {
            let types = fleet_types();
            let mut insts = Vec::new();
            for k in 0..n_t4 { insts.push(inst(&format!("t{k}"), "t4", 0.0)); }
            for k in 0..n_v100 { insts.push(inst(&format!("v{k}"), "v100", 0.0)); }
            let cap = n_t4 as f64 * 100.0 + n_v100 as f64 * 300.0;
            let s: Vec<LoadSample> = rates.iter().enumerate()
                .map(|(k, &r)| LoadSample { t_s: 100.0 + 10.0 * k as f64, arrival_rate: r, capacity: cap }).collect();
            let now = s.last().unwrap().t_s;
            let c = AutoscaleConfig { lambda_per_s: lambda, ..cfg() };
            let d = decide(&input(types.clone(), insts.clone(), s.clone(), now), &c).unwrap();
            let latest = *s.last().unwrap();
            match &d {
                ScaleDecision::ScaleOut { instance_type, count } => {
                    prop_assert!(latest.saturation() > 0.8);
                    let t = types.iter().find(|t| &t.name == instance_type).unwrap();
                    let rps = t.capacity[MODEL].throughput_rps;
                    prop_assert!(cap + f64::from(*count) * rps >= latest.arrival_rate / 0.8 - 1e-6);
                    prop_assert!(cap + f64::from(*count - 1) * rps < latest.arrival_rate / 0.8);
                    let mine = launch_objective(t.price_per_hour, t.launch_latency_s, *count, lambda);
                    for o in types.iter().filter(|o| o.name == "t4" || o.name == "v100") {
                        let need = ((latest.arrival_rate / 0.8 - cap) / o.capacity[MODEL].throughput_rps - 1e-9).ceil().max(1.0) as u32;
                        prop_assert!(mine <= launch_objective(o.price_per_hour, o.launch_latency_s, need, lambda) + 1e-9);
                    }
                }
                ScaleDecision::ScaleIn { instance_ids } => {
                    prop_assert!(insts.len() - instance_ids.len() >= 1);
                    let removed: f64 = instance_ids.iter().map(|id| if id.starts_with('v') { 300.0 } else { 100.0 }).sum();
                    let i0 = s.iter().rposition(|x| x.t_s <= now - 60.0).unwrap();
                    let peak = s[i0..].iter().map(|x| x.arrival_rate).fold(0.0, f64::max);
                    prop_assert!(0.8 * (cap - removed) >= peak - 1e-6);
                }
                ScaleDecision::Hold { .. } => {}
            }
        }
    }
}
