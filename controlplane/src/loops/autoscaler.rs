//! The autoscaler (HetSev Sec. 4.1, at fleet level): services with an autoscaling range are
//! provisioned for their reported arrival rate at 80% saturation, raised only after the
//! load has stayed up for the window and lowered only after the cool-down; nodes are
//! launched through the [`NodeProvider`] when the plan needs more GPUs than the healthy
//! fleet has, of the instance type with the least price-and-launch-latency objective, and
//! launched nodes that hold nothing for the cool-down are terminated.

use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;

use super::provisioner::{drain, Drained, FleetFingerprints};
use super::LoopSettings;
use crate::cloud::AUTOSCALED_LABEL;
use crate::controller::Controller;
use crate::provision::scaling::{idle_nodes, launch_room, launches_for, provisioned_rate, shortfall};
use crate::provision::{fleet, plan_services, MigStrategy};
use crate::resources::{InstanceTypeSpec, Kind, ServiceStatus, Spec};
use crate::state::{ClusterState, Command, Request};

/// HetSev's saturation threshold: capacity is provisioned so that load is 80% of it.
const TARGET_SATURATION: f64 = 0.8;
/// Provisioned rates move only for a change of more than this fraction (no churn).
const MIN_CHANGE: f64 = 0.05;

struct Pending {
    instance_type: String,
    gpu_model: String,
    gpus: u32,
    since: Instant,
    deadline_s: f64,
}

/// What the node decisions need of the fleet (see [`FleetView::of`]).
struct FleetView {
    /// GPUs the services' plan needs, by model (before it meets the fleet).
    planned: BTreeMap<String, u32>,
    /// Healthy GPUs, by model.
    available: BTreeMap<String, u32>,
    types: BTreeMap<String, InstanceTypeSpec>,
    /// Nodes the committed plan places something on.
    plan_nodes: BTreeSet<String>,
    /// Nodes the autoscaler launched.
    autoscaled: Vec<String>,
    /// Registered nodes per instance type (for the types' `max_instances`).
    instances: BTreeMap<String, u32>,
}

impl FleetView {
    /// O(fleet) and a planning pass: run off the workers, on a copy of the state.
    fn of(cluster: &ClusterState, strategy: MigStrategy) -> Self {
        let mut planned: BTreeMap<String, u32> = BTreeMap::new();
        for g in &plan_services(cluster, strategy).gpus {
            *planned.entry(g.gpu_type.clone()).or_default() += 1;
        }
        let mut available: BTreeMap<String, u32> = BTreeMap::new();
        for g in fleet(cluster) {
            *available.entry(g.model).or_default() += 1;
        }
        let types = cluster
            .list(Kind::InstanceType)
            .filter_map(|r| match &r.spec {
                Spec::InstanceType(s) => Some((r.name.clone(), s.clone())),
                _ => None,
            })
            .collect();
        let autoscaled = cluster
            .list(Kind::Node)
            .filter(|n| matches!(&n.spec, Spec::Node(s) if s.labels.get(AUTOSCALED_LABEL).is_some_and(|v| v == "true")))
            .map(|n| n.name.clone())
            .collect();
        let mut instances: BTreeMap<String, u32> = BTreeMap::new();
        for n in cluster.list(Kind::Node) {
            if let Spec::Node(s) = &n.spec {
                *instances.entry(s.instance_type.clone()).or_default() += 1;
            }
        }
        FleetView { planned, available, types, plan_nodes: plan_nodes(cluster), autoscaled, instances }
    }
}

fn plan_nodes(cluster: &ClusterState) -> BTreeSet<String> {
    match cluster.get(Kind::Plan, "current").map(|r| &r.spec) {
        Some(Spec::Plan(p)) => p.gpus.iter().map(|g| g.node.clone()).collect(),
        _ => BTreeSet::new(),
    }
}

pub async fn run(controller: Controller, settings: LoopSettings) {
    let started = Instant::now();
    let now_s = move || started.elapsed().as_secs_f64();
    let mut tick = tokio::time::interval(settings.heartbeat_interval);
    // Per service: since when the measured rate has asked for more (or less).
    let mut up_since: BTreeMap<String, f64> = BTreeMap::new();
    let mut down_since: BTreeMap<String, f64> = BTreeMap::new();
    let mut pending: BTreeMap<String, Pending> = BTreeMap::new();
    let mut idle_since: BTreeMap<String, f64> = BTreeMap::new();
    let mut launched = 0u64;
    let mut signals = controller.sm.subscribe();
    let mut seen = FleetFingerprints::default();
    let mut view: Option<FleetView> = None;
    loop {
        tick.tick().await;
        let _pass = controller.telemetry.time_loop_pass("autoscaler");
        let t = now_s();
        // 1. Services: provisioned rate from the reported arrival rates.
        let mut arrivals: BTreeMap<String, f64> = BTreeMap::new();
        for r in controller.reports.all().values() {
            for m in &r.report.metrics {
                *arrivals.entry(m.service.clone()).or_default() += m.arrival_rps;
            }
        }
        let services: Vec<(String, f64, f64, f64)> = controller.read(|d| {
            d.cluster
                .list(Kind::Service)
                .filter_map(|s| match &s.spec {
                    Spec::Service(spec) => spec.slo.autoscaling.as_ref().map(|a| {
                        let current = ServiceStatus::provisioned_rps(&s.status).unwrap_or(a.min_rps);
                        (s.name.clone(), a.min_rps, a.max_rps, current)
                    }),
                    _ => None,
                })
                .collect()
        });
        for (name, min, max, current) in services {
            let Some(&arrival) = arrivals.get(&name) else { continue };
            let wanted = provisioned_rate(arrival, TARGET_SATURATION, min, max);
            let change = (wanted - current) / current.max(1e-9);
            let (since, other) = if change > MIN_CHANGE { (&mut up_since, &mut down_since) } else { (&mut down_since, &mut up_since) };
            other.remove(&name);
            if change.abs() <= MIN_CHANGE {
                since.remove(&name);
                continue;
            }
            let first = *since.entry(name.clone()).or_insert(t);
            let wait = if change > 0.0 { settings.scale_window_s } else { settings.cooldown_s };
            if t - first < wait {
                continue;
            }
            since.remove(&name);
            let status = ServiceStatus { provisioned_rps: wanted, arrival_rps: arrival }.to_json();
            let write = Request {
                request_id: uuid::Uuid::new_v4().to_string(),
                command: Command::PutStatus { kind: Kind::Service, name: name.clone(), status: status.into(), expected_version: 0 },
                trace_parent: None,
            };
            match controller.write(write).await {
                Ok(_) => tracing::info!(service = %name, arrival, from = current, to = wanted, "autoscaler: service re-sized"),
                Err(e) => tracing::warn!(service = %name, error = %e, "autoscaler: could not re-size"),
            }
        }

        // Without a provider nodes come and go by hand; services are still re-sized.
        let Some(provider) = settings.provider.clone() else { continue };
        // 2. Nodes: launch what the plan needs beyond the healthy fleet and launches in flight.
        // The view of the fleet is computed again only when what it is made of changed: at
        // 10,000 hosts it is a full planning pass over 80,000 GPUs, which every second kept
        // the state locked and a runtime worker busy while reports waited.
        let Drained { inputs: inputs_changed, plan: plan_changed } = drain(&mut signals, &mut seen);
        if view.is_none() || inputs_changed || plan_changed {
            let sm = controller.sm.clone();
            let strategy = settings.mig_strategy;
            let previous = view.take().filter(|_| !inputs_changed);
            // An O(1) copy of the state under its lock; the rest off the workers.
            let refreshed = super::off_runtime(&settings, "autoscaler planning", move |_| {
                let cluster = sm.data.read().expect("state lock").cluster.resources_only();
                match previous {
                    Some(v) => FleetView { plan_nodes: plan_nodes(&cluster), ..v },
                    None => FleetView::of(&cluster, strategy),
                }
            })
            .await;
            match refreshed {
                Ok(v) => view = Some(v),
                Err(e) => {
                    controller.telemetry.observe_loop_outcome("autoscaler", true);
                    tracing::warn!(error = %e, "autoscaler: planning failed; retrying at the next tick");
                    continue;
                }
            }
        }
        controller.telemetry.observe_loop_outcome("autoscaler", false);
        let FleetView { planned, available, types, plan_nodes, autoscaled, instances } = view.as_ref().expect("refreshed above");
        // A launch is in flight until its node registers, or three launch latencies pass.
        pending.retain(|node, p| !autoscaled.contains(node) && p.since.elapsed().as_secs_f64() < p.deadline_s);
        let mut with_pending = available.clone();
        let mut launched_or_pending = instances.clone();
        for p in pending.values() {
            *with_pending.entry(p.gpu_model.clone()).or_default() += p.gpus;
            *launched_or_pending.entry(p.instance_type.clone()).or_default() += 1;
        }
        let room = launch_room(types, &launched_or_pending);
        for launch in launches_for(&shortfall(planned, &with_pending), types, &room, settings.lambda_per_s) {
            let spec = &types[&launch.instance_type];
            for _ in 0..launch.count {
                launched += 1;
                let node = format!("auto-{}-{}-{launched}", launch.instance_type, controller.id);
                match provider.launch(&node, &launch.instance_type, spec) {
                    Ok(()) => {
                        tracing::info!(node, instance_type = %launch.instance_type, objective = launch.objective, "autoscaler: scale-out");
                        pending.insert(
                            node,
                            Pending {
                                instance_type: launch.instance_type.clone(),
                                gpu_model: spec.gpu_model.clone(),
                                gpus: spec.gpu_count,
                                since: Instant::now(),
                                deadline_s: 3.0 * spec.launch_latency_s.max(10.0),
                            },
                        );
                    }
                    Err(e) => tracing::warn!(instance_type = %launch.instance_type, error = %e, "autoscaler: launch failed"),
                }
            }
        }

        // 3. Scale-in: launched nodes the plan leaves empty for the cool-down.
        idle_since.retain(|n, _| autoscaled.contains(n) && !plan_nodes.contains(n));
        for n in autoscaled {
            if !plan_nodes.contains(n) {
                idle_since.entry(n.clone()).or_insert(t);
            }
        }
        for node in idle_nodes(&idle_since, t, settings.cooldown_s) {
            idle_since.remove(&node);
            if let Err(e) = provider.terminate(&node) {
                tracing::warn!(node, error = %e, "autoscaler: terminate failed");
                continue;
            }
            let delete = Request {
                request_id: uuid::Uuid::new_v4().to_string(),
                command: Command::Delete { kind: Kind::Node, name: node.clone(), expected_version: 0 },
                trace_parent: None,
            };
            match controller.write(delete).await {
                Ok(_) => tracing::info!(node, "autoscaler: scale-in"),
                Err(e) => tracing::warn!(node, error = %e, "autoscaler: node not removed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loops::provisioner::tests::{node_event, node_status};
    use crate::raft::WatchSignal;
    use crate::resources::Health;
    use crate::state::ChangeType;
    use tokio::sync::broadcast;

    fn changed(inputs: bool, plan: bool) -> Drained {
        Drained { inputs, plan }
    }

    #[test]
    fn the_fleet_view_is_recomputed_only_for_changes_of_its_inputs_or_of_the_plan() {
        let (tx, mut rx) = broadcast::channel(16);
        let mut seen = FleetFingerprints::default();
        assert_eq!(drain(&mut rx, &mut seen), changed(false, false), "nothing happened");
        tx.send(node_event("n1", ChangeType::Added, serde_json::Value::Null)).unwrap();
        assert_eq!(drain(&mut rx, &mut seen), changed(true, false), "a node joined");
        // Reports that change only what the agent applied: the view stands.
        for v in 1..=5 {
            tx.send(node_event("n1", ChangeType::Modified, node_status(v, Health::Healthy))).unwrap();
        }
        assert_eq!(drain(&mut rx, &mut seen), changed(false, false));
        tx.send(node_event("n1", ChangeType::Modified, node_status(0, Health::Unhealthy))).unwrap();
        assert_eq!(drain(&mut rx, &mut seen), changed(true, false), "its health is an input");
        let WatchSignal::Change(node) = node_event("n1", ChangeType::Modified, serde_json::Value::Null) else { unreachable!() };
        let mut plan = (*node).clone();
        plan.resource.name = "current".into();
        plan.resource.spec = Spec::Plan(Default::default());
        tx.send(WatchSignal::Change(std::sync::Arc::new(plan))).unwrap();
        assert_eq!(drain(&mut rx, &mut seen), changed(false, true), "a plan commit changes which nodes hold work");
        // Missed changes: everything again.
        for v in 0..20 {
            tx.send(node_event("n1", ChangeType::Modified, node_status(v, Health::Healthy))).unwrap();
        }
        assert_eq!(drain(&mut rx, &mut seen), changed(true, true));
    }
}
