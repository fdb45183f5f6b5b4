//! The provisioner: from the committed state (GPU models, instance types, profiles,
//! services, nodes) to a Plan mapped onto the nodes' GPUs. The pure parts are here; the
//! leader-only loop that runs them is in `crate::loops`.

mod assign;
mod input;
pub mod offline;
pub mod pools;
pub mod scaling;

pub use assign::{assign_to_nodes, FleetGpu};
pub use input::planning_input;
pub use pools::{plan_pools, Overrides};

use crate::resources::{Kind, PlanSpec, ServicePrediction, Spec};
use crate::state::ClusterState;
use serde::{Deserialize, Serialize};

/// The default strategy for MIG pools (a Service's `spec.strategy` overrides it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MigStrategy {
    #[default]
    Parvagpu,
    ExactMig,
}

/// The fleet's GPUs: every GPU of every registered node the failure detector has not
/// marked unhealthy, with its GpuModel name.
pub fn fleet(cluster: &ClusterState) -> Vec<FleetGpu> {
    cluster
        .list(Kind::Node)
        .filter(|n| n.status.get("health").and_then(|h| h.as_str()) != Some(crate::loops::failure_detector::UNHEALTHY))
        .filter_map(|n| match &n.spec {
            Spec::Node(spec) => Some((n.name.clone(), spec)),
            _ => None,
        })
        .flat_map(|(node, spec)| {
            let autoscaled = spec.labels.get(crate::cloud::AUTOSCALED_LABEL).is_some_and(|v| v == "true");
            spec.gpus.iter().map(move |g| FleetGpu { node: node.clone(), uuid: g.uuid.clone(), model: g.model.clone(), autoscaled })
        })
        .collect()
}

/// What a provisioning pass reads from the state: copied out under the state lock, so that
/// the planning itself never holds up the state machine.
#[derive(Clone, Debug)]
pub struct ProvisionInputs {
    pub input: planner::input::PlanningInput,
    pub overrides: Overrides,
    pub fleet: Vec<FleetGpu>,
    pub current: Option<PlanSpec>,
}

pub fn gather(cluster: &ClusterState) -> ProvisionInputs {
    let current = cluster.get(Kind::Plan, "current").and_then(|r| match &r.spec {
        Spec::Plan(p) => Some(p.clone()),
        _ => None,
    });
    ProvisionInputs { input: planning_input(cluster), overrides: strategy_overrides(cluster), fleet: fleet(cluster), current }
}

/// The services that name their own strategy.
pub fn strategy_overrides(cluster: &ClusterState) -> Overrides {
    cluster
        .list(Kind::Service)
        .filter_map(|r| match &r.spec {
            Spec::Service(s) => s.strategy.map(|st| (r.name.clone(), st)),
            _ => None,
        })
        .collect()
}

/// The planner's plan for every service of `cluster`, before it meets the fleet.
pub fn plan_services(cluster: &ClusterState, strategy: MigStrategy) -> planner::plan::Plan {
    plan_pools(&planning_input(cluster), &strategy_overrides(cluster), strategy)
}

/// One provisioning pass: plan the services, then place the plan's GPUs on the fleet,
/// keeping what the current plan already runs where it can.
pub fn provision(cluster: &ClusterState, strategy: MigStrategy) -> PlanSpec {
    provision_from(&gather(cluster), strategy)
}

/// [`provision`] from inputs already gathered.
pub fn provision_from(inputs: &ProvisionInputs, strategy: MigStrategy) -> PlanSpec {
    let plan = plan_pools(&inputs.input, &inputs.overrides, strategy);
    let (gpus, unplaced) = assign_to_nodes(&plan, &inputs.fleet, inputs.current.as_ref());
    let mut services: Vec<ServicePrediction> = plan
        .predictions
        .iter()
        .map(|p| ServicePrediction {
            service: p.service.clone(),
            capacity_rps: p.capacity_rps,
            latency_ms: p.latency_ms,
            infeasible_reason: unplaced.get(&p.service).cloned(),
        })
        .collect();
    for i in &plan.infeasible {
        services.push(ServicePrediction {
            service: i.service.clone(),
            capacity_rps: 0.0,
            latency_ms: 0.0,
            infeasible_reason: Some(i.reason.to_string()),
        });
    }
    services.sort_by(|a, b| a.service.cmp(&b.service));
    PlanSpec { strategy: plan.strategy, gpus, services }
}
