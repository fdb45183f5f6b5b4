//! The four policies, each a fleet and a rule for what every service gets each second:
//! whole GPUs sized for the peak, ParvaGPU sized for the peak, homogeneous autoscaling on
//! one instance type, and gpuplane (HetSev's controller per service, the provisioner's
//! incremental re-planning, launches of the cheapest instance types).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use controlplane::provision::sizing::{ServiceSizing, SizingInput};
use controlplane::provision::MigStrategy;
use controlplane::resources::InstanceTypeSpec;
use controlplane::tuning::Measurement;
use planner::plan::Plan;
use planner::policy::hetsev::{
    decide, record_sample, AutoscaleConfig, InstanceType, LoadSample, ModelProfile, RateRange, RunningInstance, ScaleDecision, ScaleInput,
};
use planner::policy::slo_headroom::{Prediction, Window};

use crate::fleet::{Fleet, LAMBDA_PER_S};
use crate::placement::{Placement, Switches};
use crate::planning::{Planned, Provisioner};
use crate::report::{Condition, Replanning};
use crate::scenario::{Scenario, SimService};
use crate::serving::{colocated_slowdown, whole_gpu, Serving};

/// HetSev's saturation target: capacity is sized so that load is 80% of it.
pub const TARGET: f64 = 0.8;
/// How often the homogeneous baseline decides, simulated seconds (Kubernetes' HPA syncs
/// every 15 s, KServe's KPA every 2 s).
pub const DECIDE_EVERY_S: u32 = 10;
/// The p99 an overloaded window reports, as a multiple of the SLO.
const OVERLOADED_P99: f64 = 10.0;

/// The controller settings every autoscaling policy shares (README's defaults).
pub fn autoscale_config() -> AutoscaleConfig {
    AutoscaleConfig { saturation_threshold: TARGET, window_s: 60.0, cooldown_s: 300.0, lambda_per_s: LAMBDA_PER_S, min_instances: 1 }
}

/// gpuplane's settings in a run: its autoscaler's (`[loops]` in the controller's config),
/// how often it decides, and what a reconfiguration costs on the agents.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuplaneSettings {
    pub autoscale: AutoscaleConfig,
    /// Simulated seconds between the autoscaler's decisions (the controller decides every
    /// heartbeat, 1 s).
    pub decide_every_s: u32,
    /// Seconds from a re-plan to a changed workload serving in its new configuration: the
    /// agent starts the new process (its model loaded) before it stops and drains the old
    /// one, so until then the old configuration serves.
    pub reconfigure_s: u32,
}

impl Default for GpuplaneSettings {
    fn default() -> Self {
        GpuplaneSettings { autoscale: autoscale_config(), decide_every_s: 2, reconfigure_s: 10 }
    }
}

/// One policy under simulation.
pub trait Policy {
    fn name(&self) -> &'static str;
    /// Decisions at second `t`, having observed `arrivals` (each service's rate of the last
    /// second, in the scenario's service order).
    fn step(&mut self, t: u32, arrivals: &[f64]);
    /// What service `i` runs on during second `t`.
    fn serving(&self, i: usize, t: u32) -> Serving;
    fn fleet(&mut self) -> &mut Fleet;
    /// What second `t` was: each service's offered load and its window's p99 (ms; 0 without
    /// load, infinite when overloaded), as the routers report them.
    fn observe(&mut self, _t: u32, _loads: &[f64], _p99_ms: &[f64]) {}
    /// What service `i` is going through now, for the windows it misses.
    fn condition(&self, _i: usize) -> Condition {
        Condition::Steady
    }
    /// Workload changes the agents would carry out (none for a fleet sized once).
    fn reconfigurations(&self) -> u32 {
        0
    }
    /// Where the reconfigurations come from, for a policy that re-plans.
    fn replanning(&self) -> Option<Replanning> {
        None
    }
}

/// Fraction of the GPUs `needed` per model that serve at `t`.
fn availability(fleet: &Fleet, needed: &BTreeMap<String, u32>, t: u32) -> BTreeMap<String, f64> {
    needed
        .iter()
        .map(|(m, &n)| {
            let (ready, _) = fleet.gpus(m, t);
            (m.clone(), if n == 0 { 1.0 } else { (f64::from(ready) / f64::from(n)).min(1.0) })
        })
        .collect()
}

/// A service's serving from its plan and the availability of its GPU models.
fn planned_serving(planned: &Planned, available: &BTreeMap<String, f64>, s: &SimService) -> Serving {
    let Some(p) = planned.services.get(&s.name) else { return Serving::NOTHING };
    let share: f64 = p.on_models.iter().map(|(m, f)| f * available.get(m).copied().unwrap_or(0.0)).sum();
    Serving {
        capacity_rps: p.capacity_rps * share,
        batch_ms: p.batch_ms,
        slowdown: if p.colocated { colocated_slowdown(&s.model) } else { 1.0 },
    }
}

/// For whole-GPU policies: the GPU model a service runs best on per unit of cost, with its
/// capacity and batch time per GPU.
fn best_whole_gpu(s: &SimService, types: &BTreeMap<String, InstanceTypeSpec>) -> Option<(String, f64, f64)> {
    let mut best: Option<(String, f64, f64, f64)> = None;
    for t in types.values() {
        if !s.allowed_gpu_models.is_empty() && !s.allowed_gpu_models.contains(&t.gpu_model) {
            continue;
        }
        let Some((cap, ms)) = whole_gpu(&s.model, &t.gpu_model, s.slo_ms) else { continue };
        let per_rps = t.price_per_hour / f64::from(t.gpu_count.max(1)) / cap;
        if best.as_ref().is_none_or(|b| per_rps < b.3) {
            best = Some((t.gpu_model.clone(), cap, ms, per_rps));
        }
    }
    best.map(|(m, cap, ms, _)| (m, cap, ms))
}

/// (a) Whole GPUs per service, sized for its peak at 80% utilisation, bought up front (the
/// Kubernetes device-plugin way).
pub struct WholeGpuPeak {
    fleet: Fleet,
    /// Per service: (GPU model, GPUs, capacity and batch time per GPU).
    sizing: Vec<Option<(String, u32, f64, f64)>>,
    needed: BTreeMap<String, u32>,
    /// This second's [`availability`].
    available: BTreeMap<String, f64>,
}

impl WholeGpuPeak {
    pub fn new(scenario: &Scenario, peaks: &[f64]) -> Self {
        let mut needed: BTreeMap<String, u32> = BTreeMap::new();
        let sizing: Vec<_> = scenario
            .services
            .iter()
            .zip(peaks)
            .map(|(s, &peak)| {
                let (model, cap, ms) = best_whole_gpu(s, &scenario.instance_types)?;
                let gpus = ((peak / TARGET) / cap).ceil().max(1.0) as u32;
                *needed.entry(model.clone()).or_default() += gpus;
                Some((model, gpus, cap, ms))
            })
            .collect();
        let mut fleet = Fleet::new(&scenario.instance_types);
        fleet.add_gpus(&needed, 0, true);
        WholeGpuPeak { fleet, sizing, needed, available: BTreeMap::new() }
    }
}

impl Policy for WholeGpuPeak {
    fn name(&self) -> &'static str {
        "whole-gpu-peak"
    }
    fn step(&mut self, t: u32, _arrivals: &[f64]) {
        self.available = availability(&self.fleet, &self.needed, t);
    }
    fn serving(&self, i: usize, _t: u32) -> Serving {
        match &self.sizing[i] {
            Some((model, gpus, cap, ms)) => {
                Serving { capacity_rps: f64::from(*gpus) * cap * self.available[model], batch_ms: *ms, slowdown: 1.0 }
            }
            None => Serving::NOTHING,
        }
    }
    fn fleet(&mut self) -> &mut Fleet {
        &mut self.fleet
    }
}

/// (b) gpuplane's planner (ParvaGPU on MIG GPUs, iGniter on MPS-only ones) sized once for
/// every service's peak at 80% utilisation; no autoscaling.
pub struct ParvaGpuPeak {
    fleet: Fleet,
    planned: Planned,
    services: Vec<SimService>,
    available: BTreeMap<String, f64>,
}

impl ParvaGpuPeak {
    pub fn new(scenario: &Scenario, peaks: &[f64]) -> Self {
        let mut provisioner = Provisioner::new(&scenario.state, MigStrategy::Parvagpu);
        let rates = scenario.services.iter().zip(peaks).map(|(s, p)| (s.name.clone(), p / TARGET)).collect();
        let (planned, _) = provisioner.plan(&rates);
        let mut fleet = Fleet::new(&scenario.instance_types);
        fleet.add_gpus(&planned.gpus, 0, true);
        ParvaGpuPeak { fleet, planned, services: scenario.services.clone(), available: BTreeMap::new() }
    }
}

impl Policy for ParvaGpuPeak {
    fn name(&self) -> &'static str {
        "parvagpu-peak"
    }
    fn step(&mut self, t: u32, _arrivals: &[f64]) {
        self.available = availability(&self.fleet, &self.planned.gpus, t);
    }
    fn serving(&self, i: usize, _t: u32) -> Serving {
        planned_serving(&self.planned, &self.available, &self.services[i])
    }
    fn fleet(&mut self) -> &mut Fleet {
        &mut self.fleet
    }
}

/// (c) Homogeneous autoscaling (the KServe / Ray Serve way): every replica a whole GPU of one
/// instance type, replicas added and removed by HetSev's controller restricted to that type.
pub struct HomogeneousAutoscale {
    fleet: Fleet,
    instance_type: String,
    spec: InstanceTypeSpec,
    /// Per service: its profile on the type (None: cannot meet its SLO there), replicas with
    /// their launch times, and its load history.
    services: Vec<Replicas>,
    reconfigurations: u32,
    /// This second's fraction of replicas on failed hosts.
    lost: f64,
}

struct Replicas {
    profile: Option<ModelProfile>,
    slo_ms: f64,
    model: String,
    running: Vec<RunningInstance>,
    samples: VecDeque<LoadSample>,
    next_id: u64,
}

impl HomogeneousAutoscale {
    pub fn new(scenario: &Scenario, instance_type: &str, initial: &[f64]) -> Result<Self, String> {
        let spec = scenario.instance_types.get(instance_type).ok_or(format!("no instance type {instance_type:?}"))?.clone();
        let mut fleet = Fleet::new(&scenario.instance_types);
        let mut services = Vec::new();
        for (s, &rate) in scenario.services.iter().zip(initial) {
            let profile = whole_gpu(&s.model, &spec.gpu_model, s.slo_ms).map(|(cap, ms)| ModelProfile {
                throughput_rps: cap * f64::from(spec.gpu_count),
                inference_latency_ms: ms,
                gpu_memory_gb: 0.0,
            });
            let mut r =
                Replicas { profile, slo_ms: s.slo_ms, model: s.model.clone(), running: Vec::new(), samples: VecDeque::new(), next_id: 0 };
            if let Some(p) = profile {
                for _ in 0..((rate / TARGET) / p.throughput_rps).ceil().max(1.0) as u32 {
                    fleet.launch(instance_type, 0, true);
                    r.running.push(RunningInstance {
                        id: format!("{:08}", r.next_id),
                        instance_type: instance_type.into(),
                        launched_at_s: -1e6,
                    });
                    r.next_id += 1;
                }
            }
            services.push(r);
        }
        Ok(HomogeneousAutoscale { fleet, instance_type: instance_type.into(), spec, services, reconfigurations: 0, lost: 0.0 })
    }

    fn serving_replicas(&self, r: &Replicas, t: u32) -> usize {
        r.running.iter().filter(|i| i.launched_at_s + self.spec.launch_latency_s <= f64::from(t)).count()
    }
}

impl Policy for HomogeneousAutoscale {
    fn name(&self) -> &'static str {
        "homogeneous-autoscale"
    }
    fn step(&mut self, t: u32, arrivals: &[f64]) {
        let config = autoscale_config();
        let it = InstanceType {
            name: self.instance_type.clone(),
            gpu_model: self.spec.gpu_model.clone(),
            gpu_count: self.spec.gpu_count,
            price_per_hour: self.spec.price_per_hour,
            launch_latency_s: self.spec.launch_latency_s,
            gpu_memory_gb: 80.0,
            capacity: BTreeMap::new(),
        };
        for (i, &arrival) in arrivals.iter().enumerate().take(self.services.len()) {
            let serving = self.serving_replicas(&self.services[i], t);
            let r = &mut self.services[i];
            let Some(profile) = r.profile else { continue };
            let sample = LoadSample { t_s: f64::from(t), arrival_rate: arrival, capacity: serving as f64 * profile.throughput_rps };
            record_sample(&mut r.samples, sample, f64::from(t) - config.cooldown_s.max(config.window_s));
            if !t.is_multiple_of(DECIDE_EVERY_S) {
                continue;
            }
            let mut it = it.clone();
            it.capacity.insert(r.model.clone(), profile);
            let input = ScaleInput {
                model: r.model.clone(),
                slo_ms: r.slo_ms,
                instance_types: vec![it],
                instances: r.running.clone(),
                samples: r.samples.iter().copied().collect(),
                residual_gpus: None,
                now_s: f64::from(t),
            };
            match decide(&input, &config) {
                Ok(ScaleDecision::ScaleOut { count, .. }) => {
                    for _ in 0..count {
                        self.fleet.launch(&self.instance_type, t, false);
                        r.running.push(RunningInstance {
                            id: format!("{:08}", r.next_id),
                            instance_type: self.instance_type.clone(),
                            launched_at_s: f64::from(t),
                        });
                        r.next_id += 1;
                        self.reconfigurations += 1;
                    }
                }
                Ok(ScaleDecision::ScaleIn { instance_ids }) => {
                    for id in instance_ids {
                        r.running.retain(|i| i.id != id);
                        self.fleet.terminate_one(&self.instance_type);
                        self.reconfigurations += 1;
                    }
                }
                Ok(ScaleDecision::Hold { .. }) | Err(_) => {}
            }
        }
        // A failed host takes a replica with it until its replacement serves.
        let (ready, all) = self.fleet.gpus(&self.spec.gpu_model, t);
        let launching: u32 = self
            .services
            .iter()
            .map(|r| r.running.iter().filter(|i| i.launched_at_s + self.spec.launch_latency_s > f64::from(t)).count() as u32)
            .sum::<u32>()
            * self.spec.gpu_count;
        let expected = all.saturating_sub(launching);
        self.lost = if expected == 0 { 0.0 } else { 1.0 - (f64::from(ready) / f64::from(expected)).min(1.0) };
    }
    fn serving(&self, i: usize, t: u32) -> Serving {
        let r = &self.services[i];
        match r.profile {
            Some(p) => {
                let replicas = self.serving_replicas(r, t) as f64 * (1.0 - self.lost);
                Serving { capacity_rps: replicas * p.throughput_rps, batch_ms: p.inference_latency_ms, slowdown: 1.0 }
            }
            None => Serving::NOTHING,
        }
    }
    fn fleet(&mut self) -> &mut Fleet {
        &mut self.fleet
    }
    fn reconfigurations(&self) -> u32 {
        self.reconfigurations
    }
}

/// (d) gpuplane: each service's provisioned rate from HetSev's controller
/// (`decide_rate`), the provisioner re-planning incrementally when a rate moved, instances
/// launched for the plan's shortfall (cheapest by HetSev's objective) and terminated once
/// surplus for the cool-down.
pub struct Gpuplane {
    fleet: Fleet,
    provisioner: Provisioner,
    planned: Planned,
    /// The plan `planned` came from, and where it is placed (and tuned).
    plan: Plan,
    placement: Placement,
    /// The hosts it was placed on.
    placed_on: Vec<u64>,
    slos_ms: BTreeMap<String, f64>,
    /// Each service's last window, as its routers report it (the tuner's input).
    windows: BTreeMap<String, Measurement>,
    /// Seconds between the tuner's passes (`[loops] tune_interval`, its default).
    tune_every_s: u32,
    /// Seconds between the provisioner's periodic passes (`[loops] provision_interval`, its
    /// default), which consolidate what changes re-planned minimally.
    provision_every_s: u32,
    /// When the provisioner last left no consolidation owed.
    weighed_at: u32,
    services: Vec<SimService>,
    provisioned: Vec<f64>,
    settings: GpuplaneSettings,
    /// Per GPU model: since when the fleet has had a terminable surplus.
    surplus_since: BTreeMap<String, u32>,
    reconfigurations: u32,
    replanning: Replanning,
    available: BTreeMap<String, f64>,
    /// Per service being reconfigured: until when, and what serves meanwhile (its previous
    /// configuration).
    switching: BTreeMap<usize, (u32, Serving)>,
    /// Of those, the services whose switch stopped some capacity before its replacement
    /// served (break-before-make).
    broken: BTreeSet<usize>,
    /// The autoscaler's sizing (HetSev's controller per service at the saturation its SLO
    /// leaves it, within its restart budget), as the leader runs it.
    sizing: ServiceSizing,
}

impl Gpuplane {
    pub fn new(scenario: &Scenario, initial: &[f64], settings: GpuplaneSettings) -> Self {
        let mut provisioner = Provisioner::new(&scenario.state, MigStrategy::Parvagpu).restarts_take(f64::from(settings.reconfigure_s));
        let target = settings.autoscale.saturation_threshold;
        let provisioned: Vec<f64> = initial.iter().map(|r| (r / target).max(1.0)).collect();
        let rates = scenario.services.iter().zip(&provisioned).map(|(s, &r)| (s.name.clone(), r)).collect();
        let (planned, plan) = provisioner.plan(&rates);
        let mut fleet = Fleet::new(&scenario.instance_types);
        fleet.add_gpus(&planned.gpus, 0, true);
        let mut placement = Placement::default();
        placement.assign(&plan, &fleet.placeable(0));
        Gpuplane {
            placed_on: fleet.placeable_ids(0),
            fleet,
            provisioner,
            planned,
            plan,
            placement,
            slos_ms: scenario.services.iter().map(|s| (s.name.clone(), s.slo_ms)).collect(),
            windows: BTreeMap::new(),
            tune_every_s: (controlplane::loops::LoopSettings::default().tune_interval.as_secs() as u32).max(1),
            provision_every_s: (controlplane::loops::LoopSettings::default().provision_interval.as_secs() as u32).max(1),
            weighed_at: 0,
            services: scenario.services.clone(),
            provisioned,
            sizing: ServiceSizing::new(settings.autoscale.clone()),
            settings,
            surplus_since: BTreeMap::new(),
            reconfigurations: 0,
            replanning: Replanning::default(),
            available: BTreeMap::new(),
            switching: BTreeMap::new(),
            broken: BTreeSet::new(),
        }
    }

    /// What the plan predicts for service `i`, as the leader reads it from the Plan.
    fn prediction(&self, i: usize) -> Option<Prediction> {
        let p = self.planned.services.get(&self.services[i].name)?;
        Some(Prediction { capacity_rps: p.capacity_rps, batch_ms: p.batch_ms })
    }

    /// Places `plan` on the hosts there are at `t`; the services reconfigured.
    fn place(&mut self, plan: &Plan, t: u32) -> Switches {
        self.placed_on = self.fleet.placeable_ids(t);
        let gpus = self.fleet.placeable(t);
        self.placement.assign(plan, &gpus)
    }

    /// What every service serves at `t`, before a change: what a reconfigured one keeps
    /// serving until its new processes do.
    fn servings(&self, t: u32) -> Vec<Serving> {
        (0..self.services.len()).map(|i| self.serving(i, t)).collect()
    }

    /// `changed` services serve on what of `before` (their old configuration) the agents
    /// keep serving through the switch until their new processes serve (`reconfigure_s`):
    /// all of it when every workload moves through its warm standby, less what drains
    /// before its replacement starts (break-before-make, counted).
    fn reconfigure(&mut self, changed: &Switches, before: &[Serving], t: u32) {
        for (i, s) in self.services.iter().enumerate() {
            let Some(&serving) = changed.get(&s.name) else { continue };
            let old = self.switching.get(&i).map_or(before[i], |(_, old)| *old);
            let old = Serving { capacity_rps: old.capacity_rps * serving, ..old };
            self.switching.insert(i, (t + self.settings.reconfigure_s, old));
            if serving < 1.0 {
                self.broken.insert(i);
            }
            self.replanning.break_before_make += u32::from(serving < 1.0);
        }
        self.reconfigurations += changed.len() as u32;
    }

    /// Launches for the plan's shortfall; terminates what has been surplus for the cool-down.
    fn fit_fleet(&mut self, t: u32) {
        let cooldown = self.settings.autoscale.cooldown_s as u32;
        let mut shortfall = BTreeMap::new();
        let models: Vec<String> = self.planned.gpus.keys().cloned().collect();
        for m in &models {
            let (_, all) = self.fleet.gpus(m, t);
            let needed = self.planned.gpus[m];
            if needed > all {
                shortfall.insert(m.clone(), needed - all);
                self.surplus_since.remove(m);
            } else if all > needed {
                let since = *self.surplus_since.entry(m.clone()).or_insert(t);
                if t >= since + cooldown && self.fleet.terminate_within(m, all - needed) > 0 {
                    self.surplus_since.remove(m);
                }
            } else {
                self.surplus_since.remove(m);
            }
        }
        if !shortfall.is_empty() {
            self.fleet.add_gpus(&shortfall, t, false);
        }
    }
}

impl Policy for Gpuplane {
    fn name(&self) -> &'static str {
        "gpuplane"
    }
    fn step(&mut self, t: u32, arrivals: &[f64]) {
        let deciding = t.is_multiple_of(self.settings.decide_every_s.max(1));
        let mut resized = BTreeSet::new();
        for (i, s) in self.services.iter().enumerate() {
            if !deciding {
                continue;
            }
            let input = SizingInput {
                range: RateRange { provisioned_rps: self.provisioned[i], min_rps: 1.0, max_rps: 100.0 * s.base_rps.max(1.0) },
                arrival_rps: arrivals[i],
                slo_ms: s.slo_ms,
                prediction: self.prediction(i),
            };
            if let Ok(Some(to_rps)) = self.sizing.decide(&s.name, f64::from(t), input) {
                self.provisioned[i] = to_rps;
                resized.insert(s.name.clone());
            }
        }
        // The provisioner wakes on the status write and plans within its debounce (about a
        // second): here, at once. It places the plan on the hosts there are.
        if !resized.is_empty() {
            let rates = self.services.iter().zip(&self.provisioned).map(|(s, &r)| (s.name.clone(), r)).collect();
            let (planned, plan) = self.provisioner.plan(&rates);
            let before = self.servings(t);
            // Services the last placement left short of their plan start what they lacked
            // when hosts come: those restarts are the fleet's, whatever pass places them.
            let waiting = self.placement.short_of(&self.plan);
            let changed = self.place(&plan, t);
            let r = &mut self.replanning;
            r.replans += 1;
            r.full_replans += u32::from(!planned.incremental);
            let others = changed.keys().filter(|s| !resized.contains(*s) && !waiting.contains(*s)).count() as u32;
            let of_waiting = changed.keys().filter(|s| !resized.contains(*s) && waiting.contains(*s)).count() as u32;
            r.of_resized += changed.len() as u32 - others - of_waiting;
            r.of_fleet_changes += of_waiting;
            r.of_others += others;
            r.of_others_in_full += if planned.incremental { 0 } else { others };
            self.reconfigure(&changed, &before, t);
            (self.planned, self.plan) = (planned, plan);
            if !self.provisioner.owes_consolidation() {
                self.weighed_at = t;
            }
        } else if self.provisioner.owes_consolidation() && t >= self.weighed_at + self.provision_every_s {
            // The periodic pass, an interval after the last weighing: a full plan replaces
            // the minimal re-plans when it saves enough (`CONSOLIDATION_SAVING`).
            self.weighed_at = t;
            if let Some((planned, plan)) = self.provisioner.consolidate() {
                let before = self.servings(t);
                let changed = self.place(&plan, t);
                let r = &mut self.replanning;
                r.replans += 1;
                r.full_replans += u32::from(!planned.incremental);
                r.of_others += changed.len() as u32;
                r.of_others_in_full += if planned.incremental { 0 } else { changed.len() as u32 };
                self.reconfigure(&changed, &before, t);
                (self.planned, self.plan) = (planned, plan);
            }
        } else if deciding && self.fleet.placeable_ids(t) != self.placed_on {
            // A host registered or was marked failed: the provisioner places the same plan
            // on the hosts there are now.
            let before = self.servings(t);
            let changed = self.place(&self.plan.clone(), t);
            self.replanning.of_fleet_changes += changed.len() as u32;
            self.reconfigure(&changed, &before, t);
        }
        if t.is_multiple_of(self.tune_every_s) && !self.windows.is_empty() {
            let before = self.servings(t);
            let changed = self.placement.tune(&self.slos_ms, &self.windows, f64::from(t));
            self.replanning.of_tuner += changed.len() as u32;
            self.reconfigure(&changed, &before, t);
        }
        if deciding {
            self.fit_fleet(t);
        }
        self.available = availability(&self.fleet, &self.planned.gpus, t);
        self.switching.retain(|_, (until, _)| *until > t);
        self.broken.retain(|i| self.switching.contains_key(i));
        // Services whose new processes serve: their retiring workloads go (the provisioner
        // polls the agents' reports every couple of seconds).
        let switching: BTreeSet<&str> = self.switching.keys().map(|&i| self.services[i].name.as_str()).collect();
        self.placement.retire(&|s| !switching.contains(s));
    }
    fn serving(&self, i: usize, _t: u32) -> Serving {
        match self.switching.get(&i) {
            Some((_, old)) => *old,
            None => {
                let s = &self.services[i];
                let planned = planned_serving(&self.planned, &self.available, s);
                Serving { capacity_rps: planned.capacity_rps * self.placement.capacity_factor(&s.name), ..planned }
            }
        }
    }
    fn fleet(&mut self) -> &mut Fleet {
        &mut self.fleet
    }
    fn condition(&self, i: usize) -> Condition {
        if self.broken.contains(&i) {
            Condition::SwitchingBroken
        } else if self.switching.contains_key(&i) {
            Condition::Switching
        } else if self
            .planned
            .services
            .get(&self.services[i].name)
            .is_some_and(|p| p.on_models.iter().any(|(m, f)| *f > 0.0 && self.available.get(m).copied().unwrap_or(0.0) < 1.0))
        {
            Condition::ShortOfPlan
        } else {
            Condition::Steady
        }
    }
    fn observe(&mut self, t: u32, loads: &[f64], p99_ms: &[f64]) {
        for i in 0..self.services.len() {
            // As the autoscaler's: windows of agents that have applied the plan only.
            if self.switching.contains_key(&i) {
                continue;
            }
            let Some(prediction) = self.prediction(i) else { continue };
            let p99_ms = if p99_ms[i].is_finite() { p99_ms[i] } else { OVERLOADED_P99 * self.services[i].slo_ms };
            let s = &self.services[i];
            self.sizing.learn(&s.name, f64::from(t), s.slo_ms, Window { arrival_rps: loads[i], p99_ms }, prediction);
        }
        if !(t + 1).is_multiple_of(self.tune_every_s) {
            return;
        }
        self.windows.clear();
        for (i, s) in self.services.iter().enumerate() {
            // As the tuner's `fresh_measurements`: a service whose processes are still
            // switching runs on an agent that has not applied the desired state, whose
            // windows measure the old configuration.
            if loads[i] <= 0.0 || self.switching.contains_key(&i) {
                continue;
            }
            let capacity = self.serving(i, t).capacity_rps;
            // An overloaded window: its requests time out, which the router reports as a
            // p99 far past the SLO.
            let p99_ms = if p99_ms[i].is_finite() { p99_ms[i] } else { OVERLOADED_P99 * s.slo_ms };
            self.windows.insert(s.name.clone(), Measurement { p99_ms, throughput_rps: loads[i].min(capacity), arrival_rps: loads[i] });
        }
    }
    fn reconfigurations(&self) -> u32 {
        self.reconfigurations
    }
    fn replanning(&self) -> Option<Replanning> {
        Some(self.replanning)
    }
}
