//! gpuplane's provisioner in simulated time: the same planning input, pools, strategies and
//! incremental re-planning (`plan_within_limits` with the previous pool plans) the leader
//! runs, for the rates a policy asks, and the same consolidation on its periodic pass; what
//! each service gets out of the plan.

use std::collections::{BTreeMap, BTreeSet};

use controlplane::provision::quota::plan_within_limits;
use controlplane::provision::{planning_input, service_rules, MigStrategy, PoolPlans, Previous, ServiceRules};
use controlplane::state::ClusterState;
use planner::input::PlanningInput;
use planner::plan::{Plan, Sharing};

/// What one service is planned to serve.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Served {
    /// Predicted throughput of all its workloads, req/s.
    pub capacity_rps: f64,
    /// Worst predicted batch latency of its workloads, ms.
    pub batch_ms: f64,
    /// Some workload shares its GPU or MIG instance with another service's (interference
    /// the planner does not model).
    pub colocated: bool,
    /// The GPU models its capacity is on, and the fraction of it on each.
    pub on_models: BTreeMap<String, f64>,
}

/// One plan's outcome.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Planned {
    pub services: BTreeMap<String, Served>,
    /// GPUs the plan uses, per GPU model.
    pub gpus: BTreeMap<String, u32>,
    /// Planned from the previous plan (minimal re-planning), not every service again.
    pub incremental: bool,
}

/// The provisioner over one scenario's state, keeping its previous plan.
pub struct Provisioner {
    input: PlanningInput,
    rules: ServiceRules,
    strategy: MigStrategy,
    previous: Option<PoolPlans>,
}

impl Provisioner {
    pub fn new(state: &ClusterState, strategy: MigStrategy) -> Self {
        Provisioner { input: planning_input(state), rules: service_rules(state), strategy, previous: None }
    }

    /// Every service's processes take `seconds` to serve again when restarted (the
    /// simulated cold start), unless its runtime says otherwise: what a consolidation's
    /// restarts are weighed at.
    pub fn restarts_take(mut self, seconds: f64) -> Self {
        for s in &self.input.services {
            self.rules.restart_s.entry(s.name.clone()).or_insert(seconds);
        }
        self
    }

    /// Plans every service for `rates` (services absent keep their manifest's rate),
    /// incrementally from the previous plan, as a pass a change woke (consolidation left
    /// owed); what each service gets, and the plan (for the node assignment).
    pub fn plan(&mut self, rates: &BTreeMap<String, f64>) -> (Planned, Plan) {
        for s in &mut self.input.services {
            if let Some(&r) = rates.get(&s.name) {
                // The planner needs a positive rate; a service with no load keeps a trickle.
                s.request_rate = r.max(0.01);
            }
        }
        let previous = self.previous.as_ref().map(|plans| Previous { plans, consolidate: false });
        let (plan, pools) =
            plan_within_limits(&self.input, &self.rules, self.strategy, previous, &|| false, None).expect("a plan that is never stopped");
        let incremental = pools.incremental;
        self.previous = Some(pools);
        (Planned { incremental, ..outcome(&plan) }, plan)
    }

    /// Whether minimal re-plans since the last full plan leave a consolidation owed.
    pub fn owes_consolidation(&self) -> bool {
        self.previous.as_ref().is_some_and(PoolPlans::owes_consolidation)
    }

    /// The provisioner's periodic pass: when a consolidation is owed, weighs a full plan (and
    /// a repack in small steps) against the current one; the plan when one was taken.
    pub fn consolidate(&mut self) -> Option<(Planned, Plan)> {
        let plans = self.previous.as_ref().filter(|p| p.owes_consolidation())?;
        let previous = Some(Previous { plans, consolidate: true });
        let (plan, pools) =
            plan_within_limits(&self.input, &self.rules, self.strategy, previous, &|| false, None).expect("a plan that is never stopped");
        let (taken, incremental) = (!pools.incremental || pools.compacted, pools.incremental);
        self.previous = Some(pools);
        taken.then(|| (Planned { incremental, ..outcome(&plan) }, plan))
    }
}

fn outcome(plan: &Plan) -> Planned {
    let mut services: BTreeMap<String, Served> = BTreeMap::new();
    let mut gpus: BTreeMap<String, u32> = BTreeMap::new();
    for g in &plan.gpus {
        *gpus.entry(g.gpu_type.clone()).or_default() += 1;
        // Services sharing a MIG instance (or an MPS-only GPU) with another service.
        let mut on_instance: BTreeMap<Option<usize>, BTreeSet<&str>> = BTreeMap::new();
        for w in &g.workloads {
            let key = match g.sharing {
                Sharing::Mig { .. } => w.mig_instance,
                Sharing::MpsOnly => None,
            };
            on_instance.entry(key).or_default().insert(&w.service);
        }
        for w in &g.workloads {
            let key = match g.sharing {
                Sharing::Mig { .. } => w.mig_instance,
                Sharing::MpsOnly => None,
            };
            let s = services.entry(w.service.clone()).or_default();
            s.capacity_rps += w.predicted_throughput;
            s.batch_ms = s.batch_ms.max(w.predicted_latency_ms);
            s.colocated |= on_instance[&key].len() > 1;
            *s.on_models.entry(g.gpu_type.clone()).or_default() += w.predicted_throughput;
        }
    }
    for s in services.values_mut() {
        let total = s.capacity_rps.max(1e-9);
        for share in s.on_models.values_mut() {
            *share /= total;
        }
    }
    Planned { services, gpus, incremental: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn a_change_leaves_consolidation_to_the_periodic_pass_which_takes_a_full_plan_that_saves_enough() {
        let scenario = Scenario::builtin(24, 2, 7).unwrap();
        let mut provisioner = Provisioner::new(&scenario.state, MigStrategy::Parvagpu);
        let peak: BTreeMap<String, f64> = scenario.services.iter().map(|s| (s.name.clone(), s.base_rps * 4.0)).collect();
        let (first, _) = provisioner.plan(&peak);
        assert!(!first.incremental && !provisioner.owes_consolidation());
        assert!(provisioner.consolidate().is_none(), "nothing owed, nothing weighed");
        // A few services' rates fall to a twentieth: re-planned minimally, repacking owed.
        let mut fallen = peak.clone();
        for rate in fallen.values_mut().take(6) {
            *rate /= 20.0;
        }
        let (changed, _) = provisioner.plan(&fallen);
        assert!(changed.incremental && provisioner.owes_consolidation());
        let (consolidated, _) = provisioner.consolidate().expect("a full plan that saves at least 2%");
        assert!(!consolidated.incremental && !provisioner.owes_consolidation());
        let gpus = |p: &Planned| p.gpus.values().sum::<u32>();
        assert!(gpus(&consolidated) < gpus(&changed), "{} GPUs repacked, {} relocated", gpus(&consolidated), gpus(&changed));
        assert!(provisioner.consolidate().is_none(), "paid");
    }
}
