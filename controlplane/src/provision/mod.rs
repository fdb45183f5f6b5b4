//! The provisioner: from the committed state (GPU models, instance types, profiles,
//! services, nodes) to a Plan mapped onto the nodes' GPUs. The pure parts are here; the
//! leader-only loop that runs them is in `crate::loops`.

mod assign;
pub mod budget;
pub mod handover;
mod input;
pub mod kept;
pub mod offline;
pub mod pools;
pub mod quota;
mod replan;
pub mod scaling;
pub mod sizing;
pub mod tuned;

pub use assign::{assign_to_nodes, FleetGpu};
pub use input::{gpu_price, instance_types, planning_input};
pub use pools::{plan_pools, ServiceRules};
pub use replan::{plan_pools_from, PoolPlans, Previous};

use std::collections::BTreeMap;

use crate::resources::{InstanceTypeSpec, Isolation, Kind, NodeStatus, PlanSpec, ServicePrediction, Spec};
use crate::state::ClusterState;
use planner::isolation::Boundary;
use quota::Quota;
use serde::{Deserialize, Serialize};

/// GPUs of each model the provisioner's latest plan needs, before it meets the fleet.
pub type GpuDemand = std::sync::Arc<BTreeMap<String, u32>>;

/// The provisioner's latest [`GpuDemand`], which the autoscaler reads instead of planning
/// the same services again (a planning pass is 0.3 s at 10,000 hosts, and the autoscaler's
/// own was more than half of the leader's planning in a roll-out, perf). Leader memory.
#[derive(Clone)]
pub struct PlannedDemand(std::sync::Arc<tokio::sync::watch::Sender<Option<GpuDemand>>>);

impl Default for PlannedDemand {
    fn default() -> Self {
        PlannedDemand(std::sync::Arc::new(tokio::sync::watch::Sender::new(None)))
    }
}

impl PlannedDemand {
    pub fn publish(&self, demand: BTreeMap<String, u32>) {
        self.0.send_replace(Some(std::sync::Arc::new(demand)));
    }

    /// A receiver that has seen what is published now: it changes at the next publication.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<GpuDemand>> {
        self.0.subscribe()
    }
}

/// The default strategy for MIG pools (a Service's `spec.strategy` overrides it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MigStrategy {
    #[default]
    Parvagpu,
    ExactMig,
}

impl MigStrategy {
    /// The name in flags and config files (`parvagpu`, `exact-mig`).
    pub fn flag_name(self) -> &'static str {
        match self {
            MigStrategy::Parvagpu => "parvagpu",
            MigStrategy::ExactMig => "exact-mig",
        }
    }
}

/// Every registered node the failure detector has not marked unhealthy, with its spec:
/// what the fleet is made of, for [`fleet`] and [`fleet_gpus_by_model`] alike.
fn healthy_nodes(cluster: &ClusterState) -> impl Iterator<Item = (&str, &crate::resources::NodeSpec)> {
    cluster.list(Kind::Node).filter(|n| !NodeStatus::is_unhealthy(&n.status)).filter_map(|n| match &n.spec {
        Spec::Node(spec) => Some((n.name.as_str(), spec)),
        _ => None,
    })
}

/// The fleet's GPUs: every GPU of every healthy node, with its GpuModel name.
pub fn fleet(cluster: &ClusterState) -> Vec<FleetGpu> {
    healthy_nodes(cluster)
        .flat_map(|(node, spec)| {
            let autoscaled = spec.labels.get(crate::cloud::AUTOSCALED_LABEL).is_some_and(|v| v == "true");
            spec.gpus.iter().map(move |g| FleetGpu { node: node.to_string(), uuid: g.uuid.clone(), model: g.model.clone(), autoscaled })
        })
        .collect()
}

/// How many GPUs of each model [`fleet`] holds, counted without copying the fleet (the
/// autoscaler's view, made again whenever the plan's inputs change: at 10,000 hosts
/// building the 80,000 entries only to count them was most of its pass).
pub fn fleet_gpus_by_model(cluster: &ClusterState) -> BTreeMap<String, u32> {
    let mut out: BTreeMap<String, u32> = BTreeMap::new();
    for g in healthy_nodes(cluster).flat_map(|(_, spec)| &spec.gpus) {
        match out.get_mut(g.model.as_str()) {
            Some(n) => *n += 1,
            None => {
                out.insert(g.model.clone(), 1);
            }
        }
    }
    out
}

/// What a provisioning pass reads from the state: copied out under the state lock, so that
/// the planning itself never holds up the state machine.
///
/// Serialised (without `current`) for [`inputs_digest`]: every field added here is part of
/// the digest unless it is skipped too.
#[derive(Clone, Debug, Serialize)]
pub struct ProvisionInputs {
    pub input: planner::input::PlanningInput,
    pub rules: ServiceRules,
    pub fleet: Vec<FleetGpu>,
    /// The committed plan: only where the new plan's GPUs land (fewest moves), not what is
    /// planned, so it is no input of the digest (the tuner's changes to it must not count).
    #[serde(skip)]
    pub current: Option<PlanSpec>,
    /// What the fleet can hold of each GPU model ([`fleet_capacity`]), for the tenants' fair
    /// share (`quota::over_fair_share`); `None` plans without a share. Part of the digest:
    /// with a node provider it reads the instance types' limits, which nothing else here has.
    pub capacity: Option<quota::Capacity>,
}

/// A stable digest of what a plan is computed from: the planning input, the fleet and the
/// strategy. The provisioner stores it in the plan and re-plans only when it changes, so the
/// shares the tuner adjusts survive its periodic passes.
///
/// FNV-1a, 64 bits (the `fnv` crate, already in the lock file through `h2`), over the
/// inputs' JSON: a published, fixed algorithm, so every controller and every build agrees
/// on the digest of the same inputs (std's `DefaultHasher` promises neither, and the output
/// of `fxhash` and `foldhash` is not specified across versions). Nothing here is
/// adversarial, and at 64 bits an accidental collision, which would skip one re-plan, is
/// negligible. The JSON is deterministic: the inputs hold vectors in state order and
/// `BTreeMap`s only.
pub fn inputs_digest(inputs: &ProvisionInputs, strategy: MigStrategy) -> String {
    use std::hash::Hasher;
    /// Hashes the JSON as it is written: at 10,000 hosts it is megabytes, never needed whole.
    struct HashingWriter(fnv::FnvHasher);
    impl std::io::Write for HashingWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut writer = HashingWriter(fnv::FnvHasher::default());
    serde_json::to_writer(&mut writer, &(inputs, strategy)).expect("planning inputs hold only JSON-representable data");
    format!("fnv1a64:{:016x}", writer.0.finish())
}

pub fn gather(cluster: &ClusterState) -> ProvisionInputs {
    let current = cluster.get(Kind::Plan, "current").and_then(|r| match &r.spec {
        Spec::Plan(p) => Some(p.clone()),
        _ => None,
    });
    ProvisionInputs { input: planning_input(cluster), rules: service_rules(cluster), fleet: fleet(cluster), current, capacity: None }
}

/// The strategy each Service names, every Service's tenant boundary (its tenant and the
/// isolation that Tenant declares; the default, `mig`, for a tenant without one),
/// creation revision and priority, and every limited Tenant's quota.
pub fn service_rules(cluster: &ClusterState) -> ServiceRules {
    let mut rules = ServiceRules::default();
    for r in cluster.list(Kind::Service) {
        let Spec::Service(s) = &r.spec else { continue };
        if let Some(st) = s.strategy {
            rules.strategies.insert(r.name.clone(), st);
        }
        let isolation = match cluster.get(Kind::Tenant, &r.tenant).map(|t| &t.spec) {
            Some(Spec::Tenant(t)) => t.isolation,
            _ => Isolation::default(),
        };
        rules.boundaries.insert(r.name.clone(), Boundary { tenant: r.tenant.clone(), isolation });
        rules.admitted.insert(r.name.clone(), r.create_revision);
        if s.priority > 0 {
            rules.priorities.insert(r.name.clone(), s.priority);
        }
        let runtime = s.runtime.as_deref().and_then(|name| cluster.get(Kind::ServingRuntime, name));
        if let Some(Spec::ServingRuntime(rt)) = runtime.map(|r| &r.spec) {
            rules.restart_s.insert(r.name.clone(), rt.cold_start_s);
        }
    }
    for t in cluster.list(Kind::Tenant) {
        let Spec::Tenant(spec) = &t.spec else { continue };
        rules.weights.insert(t.name.clone(), spec.weight);
        let quota = Quota::of(spec);
        if quota.is_limited() {
            rules.quotas.insert(t.name.clone(), quota);
        }
    }
    rules
}

/// The planner's plan for every service of `cluster` within the tenants' quotas, before it
/// meets the fleet (what the autoscaler sizes the fleet for).
pub fn plan_services(cluster: &ClusterState, strategy: MigStrategy) -> planner::plan::Plan {
    quota::plan_within_limits(&planning_input(cluster), &service_rules(cluster), strategy, None, &|| false, None).expect("never stopped").0
}

/// GPUs of each model the fleet can hold. A fleet that cannot grow (`can_grow` false: no
/// node provider) holds its healthy GPUs (`fleet`), and every model of `gpu_types` is listed,
/// 0 where it has none. One that can grows up to its instance types' `max_instances`: a model
/// holds its healthy GPUs plus those its types may still launch, and is listed only when
/// every type offering it has a limit; where one has none, the autoscaler launches what the
/// plan needs and the model is left out (no limit, no share).
pub fn fleet_capacity(
    cluster: &ClusterState,
    fleet: &[FleetGpu],
    gpu_types: &[planner::input::GpuType],
    can_grow: bool,
) -> quota::Capacity {
    let mut capacity: quota::Capacity = gpu_types.iter().map(|t| (t.name.clone(), 0)).collect();
    for g in fleet {
        *capacity.entry(g.model.clone()).or_default() += 1;
    }
    if !can_grow {
        return capacity;
    }
    let types: BTreeMap<String, InstanceTypeSpec> = cluster
        .list(Kind::InstanceType)
        .filter_map(|r| match &r.spec {
            Spec::InstanceType(s) => Some((r.name.clone(), s.clone())),
            _ => None,
        })
        .collect();
    let mut instances: BTreeMap<String, u32> = BTreeMap::new();
    for n in cluster.list(Kind::Node) {
        if let Spec::Node(s) = &n.spec {
            *instances.entry(s.instance_type.clone()).or_default() += 1;
        }
    }
    let room = scaling::launch_room(&types, &instances);
    for (name, t) in &types {
        let Some(held) = capacity.get_mut(&t.gpu_model) else { continue };
        match room.get(name) {
            Some(&r) => *held = held.saturating_add(r.saturating_mul(t.gpu_count)),
            None => {
                capacity.remove(&t.gpu_model);
            }
        }
    }
    capacity
}

/// One provisioning pass: plan the services, then place the plan's GPUs on the fleet,
/// keeping what the current plan already runs where it can.
pub fn provision(cluster: &ClusterState, strategy: MigStrategy) -> PlanSpec {
    provision_from(&gather(cluster), strategy)
}

/// [`provision`] from inputs already gathered.
pub fn provision_from(inputs: &ProvisionInputs, strategy: MigStrategy) -> PlanSpec {
    let (plan, _) = plan_inputs(inputs, strategy, None, &|| false).expect("never stopped");
    place(inputs, &plan, inputs_digest(inputs, strategy), None, &|_| false).spec
}

/// A pass's plan, before it meets the fleet ([`place`]), and its pool plans for the next
/// pass: from `previous` when only a few services' rates or SLOs changed (minimal
/// re-planning, `replan`). `stop` is asked between steps (each pool, each service
/// re-planned); `None` when it said to stop.
pub fn plan_inputs(
    inputs: &ProvisionInputs,
    strategy: MigStrategy,
    previous: Option<Previous>,
    stop: &dyn Fn() -> bool,
) -> Option<(planner::plan::Plan, PoolPlans)> {
    quota::plan_within_limits(&inputs.input, &inputs.rules, strategy, previous, stop, inputs.capacity.as_ref())
}

/// A plan placed on the fleet ([`place`]).
pub struct Placed {
    /// What to commit: the tuner's shares kept where the planned content stays.
    pub spec: PlanSpec,
    /// The same placement with the planner's shares everywhere: what the next pass tells
    /// the tuner's changes by ([`tuned::TunedGpus::between`]).
    pub as_planned: PlanSpec,
}

/// `plan` placed on the fleet, keeping what the committed plan runs where it can, with what
/// each service is predicted to get. `digest` is `inputs_digest(inputs, strategy)`, which
/// the caller has computed already (it encodes every GPU of the fleet). `placed_before`: the
/// provisioner's last committed placement as planned (leader memory), so that a GPU whose
/// planned content stays keeps the shares the tuner gave it since ([`tuned`]); without it
/// every tuned share goes back to the planner's. A workload that leaves its slot keeps
/// serving there as retiring where the GPU has room (make-before-break, [`handover`]); the
/// committed plan's retiring workloads are carried over while `pending(service)`.
pub fn place(
    inputs: &ProvisionInputs,
    plan: &planner::plan::Plan,
    digest: String,
    placed_before: Option<&PlanSpec>,
    pending: &dyn Fn(&str) -> bool,
) -> Placed {
    let (mut gpus, unplaced, tuned) = tuned::assign_over_tuned(plan, &inputs.fleet, inputs.current.as_ref(), placed_before);
    // Each workload carries its tenant's boundary, for the agent's own check.
    for w in gpus.iter_mut().flat_map(|g| g.workloads.iter_mut()) {
        if let Some(b) = inputs.rules.boundaries.get(&w.service) {
            w.tenant.clone_from(&b.tenant);
            w.isolation = b.isolation;
        }
    }
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
    let as_planned = PlanSpec {
        strategy: plan.strategy.clone(),
        gpus: gpus.into(),
        services: services.into(),
        inputs_digest: digest,
        trace_parent: String::new(),
    };
    // A copy that shares the placement's chunks: only the tuned GPUs' are copied again.
    let mut spec = as_planned.clone();
    tuned.keep_tuned(&mut spec.gpus);
    let planned: std::collections::HashSet<&str> = plan.gpus.iter().flat_map(|g| &g.workloads).map(|w| w.service.as_str()).collect();
    handover::hand_over_all(inputs.current.as_ref(), &mut spec.gpus, &inputs.fleet, pending, &|s| planned.contains(s));
    Placed { spec, as_planned }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{GpuAssignment, WorkloadAssignment};
    use planner::input::{PlanningInput, ServiceDemand};

    fn inputs(rate: f64) -> ProvisionInputs {
        let input = PlanningInput {
            services: vec![ServiceDemand { name: "web".into(), model: "resnet50".into(), slo_ms: 50.0, request_rate: rate }],
            ..PlanningInput::default()
        };
        let fleet = vec![FleetGpu { node: "n1".into(), uuid: "GPU-0".into(), model: "T4-16GB".into(), autoscaled: false }];
        ProvisionInputs { input, rules: ServiceRules::default(), fleet, current: None, capacity: None }
    }

    #[test]
    fn the_digest_is_fnv1a_over_the_inputs_json_and_follows_every_planning_input() {
        let base = inputs(100.0);
        let digest = inputs_digest(&base, MigStrategy::Parvagpu);
        // FNV-1a 64 by its definition, so a change of algorithm or encoding shows here.
        let json = serde_json::to_vec(&(&base, MigStrategy::Parvagpu)).unwrap();
        let fnv = json.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        assert_eq!(digest, format!("fnv1a64:{fnv:016x}"));
        assert_eq!(inputs_digest(&base.clone(), MigStrategy::Parvagpu), digest, "same inputs, same digest");

        assert_ne!(inputs_digest(&inputs(120.0), MigStrategy::Parvagpu), digest, "a service's rate");
        assert_ne!(inputs_digest(&base, MigStrategy::ExactMig), digest, "the strategy");
        let mut pinned = base.clone();
        pinned.rules.strategies.insert("web".into(), crate::resources::Strategy::Igniter);
        assert_ne!(inputs_digest(&pinned, MigStrategy::Parvagpu), digest, "a service's strategy override");
        let mut fewer = base.clone();
        fewer.fleet.clear();
        assert_ne!(inputs_digest(&fewer, MigStrategy::Parvagpu), digest, "the fleet");
        let mut limited = base.clone();
        limited.capacity = Some(quota::Capacity::from([("T4-16GB".into(), 1)]));
        assert_ne!(inputs_digest(&limited, MigStrategy::Parvagpu), digest, "what the fleet can hold (the instance types' limits)");
    }

    #[test]
    fn the_committed_plan_is_no_input_of_the_digest() {
        // The tuner changes shares in the committed plan; that must not look like new inputs.
        let mut tuned = inputs(100.0);
        tuned.current = Some(PlanSpec {
            strategy: "igniter".into(),
            gpus: vec![GpuAssignment {
                node: "n1".into(),
                gpu_uuid: "GPU-0".into(),
                mig_layout: vec![],
                workloads: vec![WorkloadAssignment {
                    service: "web".into(),
                    mig_instance: None,
                    mps_percent: 45.0,
                    batch: 8,
                    processes: 1,
                    shadow_mps_percent: 10.0,
                    tenant: String::new(),
                    isolation: crate::resources::Isolation::default(),
                    batch_ms: 0.0,
                }],
                retiring: vec![],
            }]
            .into(),
            ..PlanSpec::default()
        });
        assert_eq!(inputs_digest(&tuned, MigStrategy::Parvagpu), inputs_digest(&inputs(100.0), MigStrategy::Parvagpu));
    }

    #[test]
    fn the_fleet_can_hold_its_gpus_or_grow_to_its_instance_types_limits() {
        let yaml = r#"
kind: GpuModel
name: A100-80GB
spec: {sm_count: 108, memory_gib: 80}
---
kind: InstanceType
name: a2
spec: {gpu_model: A100-80GB, gpu_count: 1, price_per_hour: 4, launch_latency_s: 60, max_instances: 3}
---
kind: InstanceType
name: a2-8
spec: {gpu_model: A100-80GB, gpu_count: 8, price_per_hour: 30, launch_latency_s: 60, max_instances: 1}
---
kind: Node
name: n1
spec: {address: "10.0.0.1:7500", instance_type: a2, gpus: [{uuid: GPU-1, model: A100-80GB}]}
"#;
        let resources = crate::manifest::parse("fleet.yaml", yaml, crate::manifest::Format::Yaml).unwrap();
        let mut state = offline::state_from_resources(&resources).unwrap();
        let (gpus, types) = (fleet(&state), planning_input(&state).gpu_types);
        assert_eq!(fleet_capacity(&state, &gpus, &types, false), quota::Capacity::from([("A100-80GB".into(), 1)]), "its GPUs");
        // 1 GPU, 2 more a2 (1 GPU each) and 1 a2-8 (8 GPUs).
        assert_eq!(fleet_capacity(&state, &gpus, &types, true), quota::Capacity::from([("A100-80GB".into(), 11)]), "up to the limits");
        // A type without a limit: the model has none.
        let open = crate::resources::Spec::InstanceType(InstanceTypeSpec {
            gpu_model: "A100-80GB".into(),
            gpu_count: 8,
            price_per_hour: 30.0,
            launch_latency_s: 60.0,
            cpu_cores: 0,
            memory_gib: 0.0,
            max_instances: None,
        });
        let put = crate::state::Request {
            request_id: "open".into(),
            command: crate::state::Command::Put {
                name: "open".into(),
                tenant: String::new(),
                spec: open,
                mode: crate::state::WriteMode::Upsert,
                expected_version: 0,
            },
            trace_parent: None,
        };
        state.apply(100, &put).0.unwrap();
        assert!(fleet_capacity(&state, &gpus, &types, true).is_empty(), "no limit, no share");
        assert_eq!(fleet_capacity(&state, &gpus, &types, false).len(), 1, "a fleet that cannot grow is limited whatever its types");
    }

    #[test]
    fn the_fleet_counted_by_model_is_the_fleet_without_its_unhealthy_nodes() {
        let yaml = r#"
kind: GpuModel
name: A100-80GB
spec: {sm_count: 108, memory_gib: 80}
---
kind: GpuModel
name: T4-16GB
spec: {sm_count: 40, memory_gib: 16}
---
kind: InstanceType
name: mixed
spec: {gpu_model: A100-80GB, gpu_count: 2, price_per_hour: 4, launch_latency_s: 60}
---
kind: Node
name: n1
spec: {address: "10.0.0.1:7500", instance_type: mixed, gpus: [{uuid: GPU-1, model: A100-80GB}, {uuid: GPU-2, model: T4-16GB}]}
---
kind: Node
name: n2
spec: {address: "10.0.0.2:7500", instance_type: mixed, gpus: [{uuid: GPU-3, model: A100-80GB}, {uuid: GPU-4, model: A100-80GB}]}
---
kind: Node
name: n3
spec: {address: "10.0.0.3:7500", instance_type: mixed, gpus: [{uuid: GPU-5, model: T4-16GB}]}
"#;
        let resources = crate::manifest::parse("fleet.yaml", yaml, crate::manifest::Format::Yaml).unwrap();
        let mut state = offline::state_from_resources(&resources).unwrap();
        let unhealthy = NodeStatus { health: crate::resources::Health::Unhealthy, ..Default::default() }.to_json();
        let mark = crate::state::Request {
            request_id: "mark".into(),
            command: crate::state::Command::PutStatus {
                kind: Kind::Node,
                name: "n3".into(),
                status: unhealthy.into(),
                expected_version: 0,
            },
            trace_parent: None,
        };
        state.apply(100, &mark).0.unwrap();
        let mut from_fleet: BTreeMap<String, u32> = BTreeMap::new();
        for g in fleet(&state) {
            *from_fleet.entry(g.model).or_default() += 1;
        }
        assert_eq!(fleet_gpus_by_model(&state), from_fleet);
        assert_eq!(from_fleet, BTreeMap::from([("A100-80GB".to_string(), 3), ("T4-16GB".to_string(), 1)]), "n3 is unhealthy");
    }

    #[test]
    fn a_provisioned_plan_carries_the_digest_of_its_inputs() {
        let base = inputs(100.0);
        assert_eq!(provision_from(&base, MigStrategy::Parvagpu).inputs_digest, inputs_digest(&base, MigStrategy::Parvagpu));
    }
}
