//! gpuplane's provisioner in simulated time: the same planning input, pools, strategies and
//! incremental re-planning (`plan_within_limits` with the previous pool plans) the leader
//! runs, for the rates a policy asks; what each service gets out of the plan.

use std::collections::{BTreeMap, BTreeSet};

use controlplane::provision::quota::plan_within_limits;
use controlplane::provision::{planning_input, service_rules, MigStrategy, PoolPlans, ServiceRules};
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

    /// Plans every service for `rates` (services absent keep their manifest's rate),
    /// incrementally from the previous plan; what each service gets, and the plan (for the
    /// node assignment).
    pub fn plan(&mut self, rates: &BTreeMap<String, f64>) -> (Planned, Plan) {
        for s in &mut self.input.services {
            if let Some(&r) = rates.get(&s.name) {
                // The planner needs a positive rate; a service with no load keeps a trickle.
                s.request_rate = r.max(0.01);
            }
        }
        let (plan, pools) = plan_within_limits(&self.input, &self.rules, self.strategy, self.previous.as_ref(), &|| false, None)
            .expect("a plan that is never stopped");
        let incremental = pools.incremental;
        self.previous = Some(pools);
        (Planned { incremental, ..outcome(&plan) }, plan)
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
