//! The node assignment and the GSLICE tuner in simulated time. The plan's GPUs are placed on
//! the fleet's hosts by the provisioner's own `assign_to_nodes` (a physical GPU that already
//! runs a planned GPU's content keeps it, then one with its MIG layout, then any), and the
//! leader's tuner pass (`tuning::tune_shares`, GSLICE Algorithm 1) adjusts the MPS shares of
//! the placed plan's MPS-only GPUs from each host's windows. A service is reconfigured when
//! one of its workloads starts or stops on a physical GPU, by the agents' rule
//! (`controlplane::provision::kept`): a workload whose MIG instance and process
//! configuration stay keeps running when its neighbours on the GPU change.

use std::collections::{BTreeMap, BTreeSet};

use controlplane::provision::handover::{drop_retiring, hand_over_all};
use controlplane::provision::kept::{capacity_weight, restarted_services, running, stopped_before_replaced};
use controlplane::provision::tuned::assign_over_tuned;
use controlplane::provision::FleetGpu;
use controlplane::resources::{GpuAssignment, PlanSpec};
use controlplane::tuning::{tune_shares, Measurement, Measurements, TunerState, TuningSettings};
use planner::plan::{Plan, Sharing};

/// The placed (and tuned) plan, with what the serving model needs of it.
#[derive(Default)]
pub struct Placement {
    current: PlanSpec,
    /// The last placement with the planner's shares, by which the tuner's are told.
    as_planned: PlanSpec,
    tuner: TunerState,
    settings: TuningSettings,
    /// Per service, its MPS shares (`mps_percent × processes`) on MPS-only GPUs as the plan
    /// has them, without the tuner's.
    planned_share: BTreeMap<String, f64>,
    /// Per service, the fraction of its planned throughput on MPS-only GPUs.
    mps_fraction: BTreeMap<String, f64>,
    /// Per service, its MPS shares in `current`, and the hosts it runs on.
    share: BTreeMap<String, f64>,
    nodes: BTreeMap<String, BTreeSet<String>>,
}

impl Placement {
    /// Places `plan` on `fleet`, keeping what runs where it can; the services reconfigured.
    /// As the provisioner places it: a GPU whose planned content stays keeps the shares the
    /// tuner gave it (`provision::tuned`); one whose content changed gets the plan's.
    pub fn assign(&mut self, plan: &Plan, fleet: &[FleetGpu]) -> Switches {
        let (gpus, _unplaced, tuned) = assign_over_tuned(plan, fleet, Some(&self.current), Some(&self.as_planned));
        self.as_planned = PlanSpec { strategy: plan.strategy.clone(), gpus: gpus.into(), ..PlanSpec::default() };
        let mut next = self.as_planned.clone();
        tuned.keep_tuned(&mut next.gpus);
        // As the provisioner places it: what leaves its slot retires there where the GPU has
        // room, until its replacements serve (`provision::handover`).
        let planned: BTreeSet<&str> = plan.gpus.iter().flat_map(|g| &g.workloads).map(|w| w.service.as_str()).collect();
        hand_over_all(Some(&self.current), &mut next.gpus, fleet, &|_| true, &|s| planned.contains(s));
        let changed = switches(&self.current, &next);
        self.current = next;
        let (mut on_mps, mut all): (BTreeMap<String, f64>, BTreeMap<String, f64>) = Default::default();
        for g in &plan.gpus {
            for w in &g.workloads {
                *all.entry(w.service.clone()).or_default() += w.predicted_throughput;
                if matches!(g.sharing, Sharing::MpsOnly) {
                    *on_mps.entry(w.service.clone()).or_default() += w.predicted_throughput;
                }
            }
        }
        self.mps_fraction = all.iter().map(|(s, &t)| (s.clone(), on_mps.get(s).copied().unwrap_or(0.0) / t.max(1e-9))).collect();
        self.index();
        self.planned_share = mps_shares(&self.as_planned);
        changed
    }

    /// Drops the retiring workloads of the services `done` names (their replacements serve),
    /// as the provisioner's next pass does.
    pub fn retire(&mut self, done: &dyn Fn(&str) -> bool) {
        if !self.current.gpus.iter().any(|g| g.retiring.iter().any(|w| done(&w.service))) {
            return;
        }
        for i in 0..self.current.gpus.len() {
            if self.current.gpus[i].retiring.iter().any(|w| done(&w.service)) {
                let mut g = self.current.gpus[i].clone();
                drop_retiring(&mut g, done);
                self.current.gpus.set(i, g);
            }
        }
        self.current.gpus.retain(|g| !(g.workloads.is_empty() && g.retiring.is_empty()));
    }

    /// The services of `plan` with fewer workloads placed than it plans for them: waiting for
    /// hosts (a launch that has not come yet, a host that failed).
    pub fn short_of(&self, plan: &Plan) -> BTreeSet<String> {
        let mut count: BTreeMap<&str, i64> = BTreeMap::new();
        for w in plan.gpus.iter().flat_map(|g| &g.workloads) {
            *count.entry(&w.service).or_default() += 1;
        }
        for w in self.current.gpus.iter().flat_map(|g| &g.workloads) {
            *count.entry(&w.service).or_default() -= 1;
        }
        count.into_iter().filter(|&(_, n)| n > 0).map(|(s, _)| s.to_string()).collect()
    }

    fn index(&mut self) {
        self.share = mps_shares(&self.current);
        self.nodes.clear();
        for g in &self.current.gpus {
            for w in &g.workloads {
                self.nodes.entry(w.service.clone()).or_default().insert(g.node.clone());
            }
        }
    }

    /// One tuner pass at `now_s` on each service's last window (`p99_ms`, served and offered
    /// req/s, by service), fed to every host the service runs on; the services whose share
    /// changed (their processes restart with it).
    pub fn tune(&mut self, slos_ms: &BTreeMap<String, f64>, windows: &BTreeMap<String, Measurement>, now_s: f64) -> Switches {
        let measured: Measurements = windows
            .iter()
            .flat_map(|(service, m)| self.nodes.get(service).into_iter().flatten().map(move |node| ((node.clone(), service.clone()), *m)))
            .collect();
        let pass = tune_shares(&self.current, slos_ms, &measured, now_s, &self.settings, &mut self.tuner);
        let Some(plan) = pass.plan else { return Switches::new() };
        let changed = switches(&self.current, &plan);
        self.current = plan;
        self.index();
        changed
    }

    /// What the tuner's shares make of a service's planned capacity: its MPS-only part
    /// scaled by its shares now over its shares as planned (a batch's time on an MPS share
    /// taken as inversely proportional to the share, as in iGniter's model at a fixed batch).
    pub fn capacity_factor(&self, service: &str) -> f64 {
        let f = self.mps_fraction.get(service).copied().unwrap_or(0.0);
        match (self.planned_share.get(service), self.share.get(service)) {
            (Some(&planned), Some(&now)) if planned > 0.0 && f > 0.0 => (1.0 - f) + f * now / planned,
            _ => 1.0,
        }
    }
}

/// Per service, `mps_percent × processes` summed over its workloads on MPS-only GPUs.
fn mps_shares(plan: &PlanSpec) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for g in plan.gpus.iter().filter(|g| g.mig_layout.is_empty()) {
        for w in &g.workloads {
            *out.entry(w.service.clone()).or_default() += w.mps_percent * f64::from(w.processes);
        }
    }
    out
}

fn by_gpu(plan: &PlanSpec) -> BTreeMap<(&str, &str), &GpuAssignment> {
    plan.gpus.iter().map(|g| ((g.node.as_str(), g.gpu_uuid.as_str()), g)).collect()
}

/// The services reconfigured between two placements, each with the share of its capacity
/// that keeps serving until its new processes do.
pub type Switches = BTreeMap<String, f64>;

/// The services with a workload that starts or stops on some physical GPU between `before`
/// and `after`, each with the share of its capacity in `before` that serves through the
/// switch by the agents' rule (`kept::stopped_before_replaced`): 1 when every workload that
/// goes is replaced in its own slot through the warm standby, less for each that drains
/// before its replacement, on another instance, GPU or host, has started.
fn switches(before: &PlanSpec, after: &PlanSpec) -> Switches {
    let (old, new) = (by_gpu(before), by_gpu(after));
    let gpus: BTreeSet<_> = old.keys().chain(new.keys()).collect();
    let mut changed = BTreeSet::new();
    let mut stopped: BTreeMap<&str, f64> = BTreeMap::new();
    for key in gpus {
        let (b, a) = (old.get(key).copied(), new.get(key).copied());
        changed.extend(restarted_services(b, a));
        for (service, lost) in stopped_before_replaced(b, a) {
            *stopped.entry(service).or_default() += lost;
        }
    }
    let mut total: BTreeMap<&str, f64> = BTreeMap::new();
    for w in before.gpus.iter().flat_map(running) {
        *total.entry(w.service).or_default() += capacity_weight(&w);
    }
    changed
        .into_iter()
        .map(|s| {
            let serving = match (total.get(s), stopped.get(s)) {
                (Some(&all), Some(&lost)) if all > 0.0 => (1.0 - lost / all).clamp(0.0, 1.0),
                _ => 1.0,
            };
            (s.to_string(), serving)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::plan::Workload;

    fn workload(service: &str, mps_percent: f64, throughput: f64) -> Workload {
        Workload {
            service: service.into(),
            mig_instance: None,
            mps_percent,
            batch_size: 4,
            processes: 1,
            shadow_percent: 0.0,
            predicted_throughput: throughput,
            predicted_latency_ms: 10.0,
        }
    }

    /// Two T4s (MPS only): "a" and "b" share the first, "c" has the second.
    fn plan() -> Plan {
        let gpu = |slot, workloads| planner::plan::GpuPlan { slot, gpu_type: "T4".into(), sharing: Sharing::MpsOnly, workloads };
        Plan {
            strategy: "igniter".into(),
            gpus: vec![gpu(0, vec![workload("a", 30.0, 100.0), workload("b", 30.0, 100.0)]), gpu(1, vec![workload("c", 50.0, 200.0)])],
            predictions: vec![],
            infeasible: vec![],
        }
    }

    fn hosts(ids: &[u32]) -> Vec<FleetGpu> {
        ids.iter()
            .map(|i| FleetGpu { node: format!("host-{i}"), uuid: format!("GPU-{i}-0"), model: "T4".into(), autoscaled: false })
            .collect()
    }

    #[test]
    fn only_the_services_on_a_gpu_whose_content_changes_are_reconfigured() {
        let mut p = Placement::default();
        let all = |serving: f64| Switches::from([("a".into(), 1.0), ("b".into(), 1.0), ("c".into(), serving)]);
        assert_eq!(p.assign(&plan(), &hosts(&[1, 2])), all(1.0), "everything starts, nothing served before");
        assert!(p.assign(&plan(), &hosts(&[1, 2])).is_empty(), "the same plan on the same hosts moves nothing");
        assert!(p.assign(&plan(), &hosts(&[1, 2, 3])).is_empty(), "a new host takes nothing from the others");
        // The host running "c" is gone: "c" moves to the spare GPU, starting cold with
        // nothing serving meanwhile; "a" and "b" stay.
        let c_host = p.nodes["c"].iter().next().unwrap().clone();
        let left: Vec<u32> = [1, 2, 3].into_iter().filter(|i| format!("host-{i}") != c_host).collect();
        assert_eq!(p.assign(&plan(), &hosts(&left)), Switches::from([("c".to_string(), 0.0)]));
        // "c" grows in place: its new share starts as the standby, the old one serves until
        // it is ready.
        let mut grown = plan();
        grown.gpus[1].workloads[0].mps_percent = 60.0;
        assert_eq!(p.assign(&grown, &hosts(&left)), Switches::from([("c".to_string(), 1.0)]));
        // "a" grows out of the shared GPU onto a new one: its old process stays there as
        // retiring (the GPU has room) and serves until the new one does.
        let mut moved = grown.clone();
        let mut a = moved.gpus[0].workloads.remove(0);
        a.mps_percent = 80.0;
        moved.gpus.push(planner::plan::GpuPlan { slot: 2, gpu_type: "T4".into(), sharing: Sharing::MpsOnly, workloads: vec![a.clone()] });
        let spare: Vec<u32> = left.iter().copied().chain([4]).collect();
        assert_eq!(p.assign(&moved, &hosts(&spare)), Switches::from([("a".to_string(), 1.0)]));
        let retiring = |p: &Placement| p.current.gpus.iter().flat_map(|g| &g.retiring).count();
        assert_eq!(retiring(&p), 1);
        p.retire(&|s| s == "a");
        assert_eq!(retiring(&p), 0);
        // Its new GPU's host fails: nothing of it serves until it starts elsewhere.
        let a_host = p.nodes["a"].iter().next().unwrap().clone();
        let alive: Vec<u32> = spare.iter().copied().filter(|i| format!("host-{i}") != a_host).collect();
        assert_eq!(p.assign(&moved, &hosts(&alive)), Switches::from([("a".to_string(), 0.0)]));
    }

    #[test]
    fn the_tuner_lifts_a_slow_services_share_and_its_capacity_with_it() {
        let mut p = Placement::default();
        p.assign(&plan(), &hosts(&[1, 2]));
        let slos = BTreeMap::from([("a".to_string(), 50.0), ("b".to_string(), 50.0), ("c".to_string(), 50.0)]);
        // "a" misses its target (0.8 × 50 ms) in every window; "b" and "c" are well within.
        let window = |p99_ms| Measurement { p99_ms, throughput_rps: 90.0, arrival_rps: 90.0 };
        let windows = BTreeMap::from([("a".to_string(), window(80.0)), ("b".to_string(), window(30.0)), ("c".to_string(), window(30.0))]);
        let mut tuned = BTreeSet::new();
        for pass in 0..12 {
            for (service, serving) in p.tune(&slos, &windows, f64::from(pass * 5)) {
                assert_eq!(serving, 1.0, "a share moves through the warm standby");
                tuned.insert(service);
            }
        }
        assert!(tuned.contains("a"), "{tuned:?}");
        assert!(p.capacity_factor("a") > 1.0, "{}", p.capacity_factor("a"));
        let on_gpu: f64 = p
            .current
            .gpus
            .iter()
            .filter(|g| g.workloads.iter().any(|w| w.service == "a"))
            .flat_map(|g| &g.workloads)
            .map(|w| w.mps_percent)
            .sum();
        assert!(on_gpu <= 100.0, "shares within the GPU: {on_gpu}");
        // A re-plan that leaves a's planned workload as it was keeps the tuner's share, as
        // the provisioner places it (`provision::tuned`): nothing restarts.
        let factor = p.capacity_factor("a");
        assert_eq!(p.assign(&plan(), &hosts(&[1, 2])), Switches::new());
        assert_eq!(p.capacity_factor("a"), factor);
    }
}
