//! The autoscaler (HetSev Sec. 4.1, at fleet level): services with an autoscaling range are
//! re-sized by HetSev's scaling controller for a provisioned rate
//! (`planner::policy::hetsev::decide_rate`: raised to the arrival rate at the service's
//! saturation target once the load has stayed above it for the window, lowered to the
//! cool-down's peak once the cool-down has passed) from the history of arrival rates this
//! loop keeps. The target is the service's own (`planner::policy::slo_headroom`: its SLO
//! over the plan's batch time and an M/D/1 queue, corrected by the windows of agents that
//! run the plan), at most `target_saturation`. Nodes are
//! launched through the [`NodeProvider`] when the plan needs more GPUs than the healthy
//! fleet has, of the instance type with the least price-and-launch-latency objective, and
//! launched nodes that hold nothing for the cool-down are terminated.

use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;

use planner::policy::hetsev::{AutoscaleConfig, RateRange};
use planner::policy::slo_headroom::{Prediction, Window};

use super::provisioner::{drain, Drained, FleetFingerprints};
use super::runner::{Pass, ProviderCall, Reconciler, Settled, Write};
use super::LoopSettings;
use crate::agents::ServiceWindow;
use crate::cloud::AUTOSCALED_LABEL;
use crate::controller::Controller;
use crate::provision::scaling::{idle_nodes, launch_room, launches_for, shortfall};
use crate::provision::sizing::{ServiceSizing, SizingInput};
use crate::provision::{fleet_gpus_by_model, instance_types, plan_services, GpuDemand, MigStrategy};
use crate::resources::{InstanceTypeSpec, Kind, ServiceStatus, Spec};
use crate::state::{ClusterState, Command};

#[derive(Debug, Clone, PartialEq)]
struct Pending {
    instance_type: String,
    gpu_model: String,
    gpus: u32,
    since: Instant,
    deadline_s: f64,
    /// HetSev's objective of the launch (price and launch latency), for the log.
    objective: f64,
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
    /// O(fleet), and a planning pass unless the provisioner's `demand` is given: run off
    /// the workers, on a copy of the state.
    fn of(cluster: &ClusterState, strategy: MigStrategy, demand: Option<&GpuDemand>) -> Self {
        let planned = match demand {
            Some(d) => d.as_ref().clone(),
            None => {
                let mut planned: BTreeMap<String, u32> = BTreeMap::new();
                for g in &plan_services(cluster, strategy).gpus {
                    *planned.entry(g.gpu_type.clone()).or_default() += 1;
                }
                planned
            }
        };
        let available = fleet_gpus_by_model(cluster);
        let types = instance_types(cluster);
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

/// Made again at each plan change: one name per node, not one per GPU (80,000 names to
/// sort at 10,000 hosts), as a plan's GPUs come in node order.
fn plan_nodes(cluster: &ClusterState) -> BTreeSet<String> {
    let mut nodes = BTreeSet::new();
    if let Some(Spec::Plan(p)) = cluster.get(Kind::Plan, "current").map(|r| &r.spec) {
        let mut last: Option<&str> = None;
        for g in p.gpus.iter() {
            if last != Some(g.node.as_str()) && !nodes.contains(&g.node) {
                nodes.insert(g.node.clone());
            }
            last = Some(g.node.as_str());
        }
    }
    nodes
}

/// The autoscaler as a leader loop (`loops::runner`): its hysteresis timers and launches in
/// flight are its memory; a pass decides re-sizes, launches and terminations from the
/// reported arrival rates, the services' ranges and the fleet view, at `now`.
pub(crate) struct Autoscaler {
    heartbeat: std::time::Duration,
    /// HetSev's controller parameters (threshold, window, cool-down, λ).
    policy: AutoscaleConfig,
    strategy: MigStrategy,
    /// With no node provider nodes come and go by hand; services are still re-sized.
    provider: bool,
    /// Launched nodes are named `auto-<type>-<controller id>-<n>`.
    controller_id: u64,
    started: Instant,
    /// Per service: HetSev's load history, its saturation target from its SLO corrected by
    /// its windows (the configured threshold, `target_saturation`, is its upper bound), and
    /// its restart budget.
    sizing: ServiceSizing,
    /// Launches in flight, by node.
    pending: BTreeMap<String, Pending>,
    /// Launched nodes the plan leaves empty, since when.
    idle_since: BTreeMap<String, f64>,
    launched: u64,
    /// Terminated nodes whose Node the next pass deletes.
    terminated: Vec<String>,
    signals: Option<tokio::sync::broadcast::Receiver<crate::raft::WatchSignal>>,
    seen: FleetFingerprints,
    /// The provisioner's plans' needs (`provision::PlannedDemand`), published in this
    /// leadership; until the first, the fleet view plans the services itself.
    demand: Option<tokio::sync::watch::Receiver<Option<GpuDemand>>>,
    latest_demand: Option<GpuDemand>,
    fleet: Option<FleetView>,
    /// This pass's decisions, in the order of its writes and calls, for [`Reconciler::settled`].
    resizing: Vec<Resize>,
    deleting: Vec<String>,
    launching: Vec<(String, Pending)>,
    terminating: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct Resize {
    service: String,
    arrival: f64,
    from: f64,
    to: f64,
}

/// A service with an autoscaling range, as a pass reads it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Autoscaled {
    name: String,
    min_rps: f64,
    max_rps: f64,
    /// The rate it is provisioned for now.
    current_rps: f64,
    slo_ms: f64,
    /// What the committed plan predicts for it (none while it is not planned).
    prediction: Option<Prediction>,
}

/// What a pass reads.
pub(crate) struct ScaleView {
    /// Each service's window over the nodes' latest reports.
    windows: BTreeMap<String, ServiceWindow>,
    services: Vec<Autoscaled>,
    /// The state, when the fleet view is to be made again: `true` when its inputs changed
    /// (else only the plan did). `None`: the view stands.
    refresh: Option<(ClusterState, bool)>,
    /// The provisioner's latest demand, when it published one in this leadership.
    demand: Option<GpuDemand>,
}

impl Autoscaler {
    pub(crate) fn new(controller: &Controller, settings: &LoopSettings, now: Instant) -> Self {
        let signals = settings.provider.is_some().then(|| controller.sm.subscribe());
        let mut a = Autoscaler::with(settings, controller.id, signals, now);
        a.demand = settings.provider.is_some().then(|| controller.planned_demand.subscribe());
        a
    }

    /// `signals`: the state's changes, which tell when the fleet view is to be made again
    /// (only with a node provider).
    fn with(
        settings: &LoopSettings,
        controller_id: u64,
        signals: Option<tokio::sync::broadcast::Receiver<crate::raft::WatchSignal>>,
        now: Instant,
    ) -> Self {
        let policy = AutoscaleConfig {
            // HetSev's 80% (Sec. 4.1, "based on experience") unless configured: the upper
            // bound of each service's own target.
            saturation_threshold: settings.target_saturation,
            window_s: settings.scale_window_s,
            cooldown_s: settings.cooldown_s,
            lambda_per_s: settings.lambda_per_s,
            min_instances: 0,
        };
        Autoscaler {
            heartbeat: settings.heartbeat_interval,
            sizing: ServiceSizing::new(policy.clone()),
            policy,
            strategy: settings.mig_strategy,
            provider: settings.provider.is_some(),
            controller_id,
            started: now,
            pending: BTreeMap::new(),
            idle_since: BTreeMap::new(),
            launched: 0,
            terminated: Vec::new(),
            signals,
            seen: FleetFingerprints::default(),
            demand: None,
            latest_demand: None,
            fleet: None,
            resizing: Vec::new(),
            deleting: Vec::new(),
            launching: Vec::new(),
            terminating: Vec::new(),
        }
    }

    /// Services whose provisioned rate is due to move (`provision::sizing`: HetSev's
    /// controller at the saturation each one's SLO leaves it, learnt from this pass's window
    /// first, within its restart budget). A service without a reported rate keeps its
    /// history and is not decided on.
    fn resizes(&mut self, windows: &BTreeMap<String, ServiceWindow>, services: &[Autoscaled], t: f64) -> Vec<Resize> {
        let mut out = Vec::new();
        // What is kept of services no longer autoscaled goes (one pass over each).
        let names: BTreeSet<&str> = services.iter().map(|s| s.name.as_str()).collect();
        self.sizing.retain(|name| names.contains(name));
        for s in services {
            let Some(window) = windows.get(&s.name) else { continue };
            let arrival = window.arrival_rps;
            if let (Some(prediction), Some(p99_ms)) = (s.prediction, window.p99_ms) {
                self.sizing.learn(&s.name, t, s.slo_ms, Window { arrival_rps: arrival, p99_ms }, prediction);
            }
            let input = SizingInput {
                range: RateRange { provisioned_rps: s.current_rps, min_rps: s.min_rps, max_rps: s.max_rps },
                arrival_rps: arrival,
                slo_ms: s.slo_ms,
                prediction: s.prediction,
            };
            match self.sizing.decide(&s.name, t, input) {
                Ok(Some(to)) => out.push(Resize { service: s.name.clone(), arrival, from: s.current_rps, to }),
                Ok(None) => {}
                // The inputs were checked when the Service was applied; a refusal here is a
                // bug to see in the log, and the service stays as it is.
                Err(e) => tracing::warn!(service = %s.name, error = %e, "autoscaler: HetSev refused the service's inputs"),
            }
        }
        out
    }

    /// Launches for what the plan needs beyond the healthy fleet and the launches in flight,
    /// and terminations of launched nodes the plan has left empty for the cool-down.
    fn nodes(&mut self, now: Instant, t: f64, pass: &mut Pass) {
        let Some(FleetView { planned, available, types, plan_nodes, autoscaled, instances }) = &self.fleet else { return };
        // A launch is in flight until its node registers, or three launch latencies pass.
        self.pending.retain(|node, p| !autoscaled.contains(node) && now.saturating_duration_since(p.since).as_secs_f64() < p.deadline_s);
        let mut with_pending = available.clone();
        let mut launched_or_pending = instances.clone();
        for p in self.pending.values() {
            *with_pending.entry(p.gpu_model.clone()).or_default() += p.gpus;
            *launched_or_pending.entry(p.instance_type.clone()).or_default() += 1;
        }
        let room = launch_room(types, &launched_or_pending);
        for launch in launches_for(&shortfall(planned, &with_pending), types, &room, self.policy.lambda_per_s) {
            let spec = &types[&launch.instance_type];
            for _ in 0..launch.count {
                self.launched += 1;
                let node = format!("auto-{}-{}-{}", launch.instance_type, self.controller_id, self.launched);
                let pending = Pending {
                    instance_type: launch.instance_type.clone(),
                    gpu_model: spec.gpu_model.clone(),
                    gpus: spec.gpu_count,
                    since: now,
                    deadline_s: 3.0 * spec.launch_latency_s.max(10.0),
                    objective: launch.objective,
                };
                pass.calls.push(ProviderCall::Launch {
                    node: node.clone(),
                    instance_type: launch.instance_type.clone(),
                    spec: spec.clone(),
                });
                self.launching.push((node, pending));
            }
        }
        self.idle_since.retain(|n, _| autoscaled.contains(n) && !plan_nodes.contains(n));
        for n in autoscaled {
            if !plan_nodes.contains(n) {
                self.idle_since.entry(n.clone()).or_insert(t);
            }
        }
        for node in idle_nodes(&self.idle_since, t, self.policy.cooldown_s) {
            // Tried again after another cool-down should the termination fail.
            self.idle_since.remove(&node);
            pass.calls.push(ProviderCall::Terminate { node: node.clone() });
            self.terminating.push(node);
        }
    }
}

pub async fn run(controller: Controller, settings: LoopSettings) {
    let autoscaler = Autoscaler::new(&controller, &settings, Instant::now());
    super::runner::run(controller, settings, autoscaler).await
}

impl Reconciler for Autoscaler {
    const NAME: &'static str = "autoscaler";
    // A fleet view is a planning pass over the whole fleet when its inputs change.
    const LONG_PASS: bool = true;
    type View = ScaleView;

    fn interval(&self) -> std::time::Duration {
        self.heartbeat
    }

    fn view(&mut self, controller: &Controller) -> ScaleView {
        let (windows, services) = controller.read(|d| {
            let desired = d.cluster.desired();
            let windows = controller.reports.windows_by_service(|node, applied| applied >= desired.version(node));
            let predictions: BTreeMap<&str, Prediction> = match d.cluster.get(Kind::Plan, "current").map(|r| &r.spec) {
                Some(Spec::Plan(p)) => p
                    .services
                    .iter()
                    .filter(|p| p.infeasible_reason.is_none())
                    .map(|p| (p.service.as_str(), Prediction { capacity_rps: p.capacity_rps, batch_ms: p.latency_ms }))
                    .collect(),
                _ => BTreeMap::new(),
            };
            let services = d
                .cluster
                .list(Kind::Service)
                .filter_map(|s| match &s.spec {
                    Spec::Service(spec) => spec.slo.autoscaling.as_ref().map(|a| Autoscaled {
                        name: s.name.clone(),
                        min_rps: a.min_rps,
                        max_rps: a.max_rps,
                        current_rps: ServiceStatus::provisioned_rps(&s.status).unwrap_or(a.min_rps),
                        slo_ms: spec.slo.latency_ms,
                        prediction: predictions.get(s.name.as_str()).copied(),
                    }),
                    _ => None,
                })
                .collect();
            (windows, services)
        });
        // The fleet view is made again only when what it is made of changed: at 10,000
        // hosts it is a planning pass over 80,000 GPUs.
        // A new demand from the provisioner makes the view again as new inputs do.
        let new_demand = self.demand.as_mut().is_some_and(|d| d.has_changed().unwrap_or(false));
        if new_demand {
            self.latest_demand = self.demand.as_mut().and_then(|d| d.borrow_and_update().clone());
        }
        let demand = self.latest_demand.clone();
        let refresh = self.signals.as_mut().and_then(|signals| {
            let Drained { inputs, plan } = drain(signals, &mut self.seen);
            let inputs = inputs || new_demand;
            (self.fleet.is_none() || inputs || plan).then(|| (controller.read(|d| d.cluster.resources_only()), inputs))
        });
        ScaleView { windows, services, refresh, demand }
    }

    fn pass(&mut self, view: ScaleView, now: Instant, _cancelled: &dyn Fn() -> bool) -> Pass {
        let t = now.saturating_duration_since(self.started).as_secs_f64();
        let mut pass = Pass::default();
        self.resizing = self.resizes(&view.windows, &view.services, t);
        for r in &self.resizing {
            let status = ServiceStatus { provisioned_rps: r.to, arrival_rps: r.arrival }.to_json();
            let command = Command::PutStatus { kind: Kind::Service, name: r.service.clone(), status: status.into(), expected_version: 0 };
            pass.writes.push(Write::Command { command, repeatable: false });
        }
        if !self.provider {
            return pass;
        }
        self.deleting = std::mem::take(&mut self.terminated);
        for node in &self.deleting {
            let command = Command::Delete { kind: Kind::Node, name: node.clone(), expected_version: 0 };
            pass.writes.push(Write::Command { command, repeatable: false });
        }
        if let Some((cluster, inputs_changed)) = view.refresh {
            let previous = self.fleet.take().filter(|_| !inputs_changed);
            self.fleet = Some(match previous {
                Some(v) => FleetView { plan_nodes: plan_nodes(&cluster), ..v },
                None => FleetView::of(&cluster, self.strategy, view.demand.as_ref()),
            });
        }
        self.nodes(now, t, &mut pass);
        pass
    }

    fn settled(&mut self, _controller: &Controller, settled: Settled) {
        self.record(settled);
    }
}

impl Autoscaler {
    /// What became of the pass's writes and calls: launches that started are in flight,
    /// terminated nodes are deleted by the next pass.
    fn record(&mut self, settled: Settled) {
        let mut writes = settled.writes.into_iter();
        for (r, result) in std::mem::take(&mut self.resizing).into_iter().zip(writes.by_ref()) {
            match result {
                Ok(_) => {
                    tracing::info!(service = %r.service, arrival = r.arrival, from = r.from, to = r.to, "autoscaler: service re-sized")
                }
                Err(e) => tracing::warn!(service = %r.service, error = %e, "autoscaler: could not re-size"),
            }
        }
        for (node, result) in std::mem::take(&mut self.deleting).into_iter().zip(writes) {
            match result {
                Ok(_) => tracing::info!(node, "autoscaler: scale-in"),
                Err(e) => tracing::warn!(node, error = %e, "autoscaler: node not removed"),
            }
        }
        let mut calls = settled.calls.into_iter();
        for ((node, pending), result) in std::mem::take(&mut self.launching).into_iter().zip(calls.by_ref()) {
            match result {
                Ok(()) => {
                    tracing::info!(node, instance_type = %pending.instance_type, objective = pending.objective, "autoscaler: scale-out");
                    self.pending.insert(node, pending);
                }
                Err(e) => tracing::warn!(instance_type = %pending.instance_type, error = %e, "autoscaler: launch failed"),
            }
        }
        for (node, result) in std::mem::take(&mut self.terminating).into_iter().zip(calls) {
            match result {
                Ok(()) => self.terminated.push(node),
                Err(e) => tracing::warn!(node, error = %e, "autoscaler: terminate failed"),
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
        let resource = std::sync::Arc::make_mut(&mut plan.resource);
        resource.name = "current".into();
        resource.spec = Spec::Plan(Default::default());
        tx.send(WatchSignal::Change(std::sync::Arc::new(plan))).unwrap();
        assert_eq!(drain(&mut rx, &mut seen), changed(false, true), "a plan commit changes which nodes hold work");
        // Missed changes: everything again.
        for v in 0..20 {
            tx.send(node_event("n1", ChangeType::Modified, node_status(v, Health::Healthy))).unwrap();
        }
        assert_eq!(drain(&mut rx, &mut seen), changed(true, true));
    }

    /// A node provider that is never called: passes are pure, the tests feed outcomes.
    struct NoProvider;
    impl crate::cloud::NodeProvider for NoProvider {
        fn launch(&self, _: &str, _: &str, _: &InstanceTypeSpec) -> Result<(), String> {
            unreachable!("a pass makes no call")
        }
        fn terminate(&self, _: &str) -> Result<(), String> {
            unreachable!("a pass makes no call")
        }
    }

    fn settings(provider: bool) -> LoopSettings {
        LoopSettings {
            scale_window_s: 10.0,
            cooldown_s: 30.0,
            provider: provider.then(|| std::sync::Arc::new(NoProvider) as std::sync::Arc<dyn crate::cloud::NodeProvider>),
            ..LoopSettings::default()
        }
    }

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + std::time::Duration::from_secs(s)
    }

    fn web(provisioned: f64, prediction: Option<Prediction>) -> Autoscaled {
        Autoscaled { name: "web".into(), min_rps: 10.0, max_rps: 1000.0, current_rps: provisioned, slo_ms: 100.0, prediction }
    }

    /// "web" not planned yet: sized at the configured saturation.
    fn view(arrival: f64, provisioned: f64) -> ScaleView {
        ScaleView {
            windows: [("web".to_string(), ServiceWindow { arrival_rps: arrival, p99_ms: None })].into(),
            services: vec![web(provisioned, None)],
            refresh: None,
            demand: None,
        }
    }

    fn resized_to(pass: &Pass) -> Vec<f64> {
        pass.writes
            .iter()
            .filter_map(|w| match w {
                Write::Command { command: Command::PutStatus { kind: Kind::Service, status, .. }, repeatable: false } => {
                    ServiceStatus::provisioned_rps(status)
                }
                _ => None,
            })
            .collect()
    }

    fn settled(calls: Vec<Result<(), String>>, writes: usize) -> Settled {
        Settled { calls, writes: (0..writes).map(|_| Ok(1)).collect(), pass_time: std::time::Duration::ZERO }
    }

    #[test]
    fn a_service_is_sized_up_after_the_window_and_down_after_the_cool_down() {
        let t0 = Instant::now();
        let mut a = Autoscaler::with(&settings(false), 1, None, t0);
        // 100 req/s at 80% saturation wants 125 req/s provisioned; 50 is provisioned.
        assert!(resized_to(&a.pass(view(100.0, 50.0), at(t0, 0), &|| false)).is_empty(), "the load just rose");
        assert!(resized_to(&a.pass(view(100.0, 50.0), at(t0, 9), &|| false)).is_empty(), "within the window");
        assert_eq!(resized_to(&a.pass(view(100.0, 50.0), at(t0, 10), &|| false)), vec![125.0]);
        // A dip below the threshold restarts the clock.
        assert!(resized_to(&a.pass(view(20.0, 125.0), at(t0, 11), &|| false)).is_empty());
        assert!(resized_to(&a.pass(view(100.0, 125.0), at(t0, 12), &|| false)).is_empty(), "within 5%: no churn");
        assert!(resized_to(&a.pass(view(20.0, 125.0), at(t0, 13), &|| false)).is_empty());
        assert!(resized_to(&a.pass(view(20.0, 125.0), at(t0, 42), &|| false)).is_empty(), "the cool-down counts from 13");
        assert_eq!(resized_to(&a.pass(view(20.0, 125.0), at(t0, 43), &|| false)), vec![25.0]);
    }

    #[test]
    fn a_service_slower_than_its_profile_is_sized_for_less_saturation_than_one_as_profiled() {
        let t0 = Instant::now();
        // Planned for 125 req/s in 20 ms batches, SLO 100 ms; load 100 req/s (ρ = 0.8 of it).
        let plan = Prediction { capacity_rps: 125.0, batch_ms: 20.0 };
        let run = |slowdown: f64| {
            let mut a = Autoscaler::with(&settings(false), 1, None, t0);
            let (mut provisioned, mut to) = (125.0, Vec::new());
            for s in 0..=600 {
                let p99_ms = slowdown * planner::policy::slo_headroom::predicted_p99_ms(20.0, 0.8);
                let view = ScaleView {
                    windows: [("web".to_string(), ServiceWindow { arrival_rps: 100.0, p99_ms: Some(p99_ms) })].into(),
                    services: vec![web(provisioned, Some(plan))],
                    refresh: None,
                    demand: None,
                };
                let moved = resized_to(&a.pass(view, at(t0, s), &|| false));
                provisioned = moved.last().copied().unwrap_or(provisioned);
                to.extend(moved);
            }
            to
        };
        // As profiled: 3 batch times at ρ = 0.8 is 60 ms, within 100 ms; 0.8 is the bound.
        assert!(run(1.0).is_empty(), "within the configured saturation: no move");
        // Twice as slow: 2 · 20 · (1 + ρ / (2 (1 − ρ))) ≤ 100 gives ρ ≤ 0.75, so 100 req/s
        // needs 133 provisioned, raised once the correction has learnt it.
        let to = run(2.0);
        assert_eq!(to.len(), 1, "{to:?}");
        assert!((to[0] - 100.0 / 0.75).abs() < 1.0, "{to:?}");
    }

    fn a2_fleet(planned: u32, available: u32, autoscaled: &[&str], plan_nodes: &[&str]) -> FleetView {
        let a2 = InstanceTypeSpec {
            gpu_model: "A100-80GB".into(),
            gpu_count: 2,
            price_per_hour: 8.0,
            launch_latency_s: 60.0,
            cpu_cores: 0,
            memory_gib: 0.0,
            max_instances: None,
        };
        FleetView {
            planned: [("A100-80GB".to_string(), planned)].into(),
            available: [("A100-80GB".to_string(), available)].into(),
            types: [("a2".to_string(), a2)].into(),
            plan_nodes: plan_nodes.iter().map(|n| n.to_string()).collect(),
            autoscaled: autoscaled.iter().map(|n| n.to_string()).collect(),
            instances: BTreeMap::new(),
        }
    }

    fn calls(pass: &Pass) -> Vec<String> {
        pass.calls
            .iter()
            .map(|c| match c {
                ProviderCall::Launch { node, .. } => format!("launch {node}"),
                ProviderCall::Terminate { node } => format!("terminate {node}"),
            })
            .collect()
    }

    #[test]
    fn the_fleet_view_takes_the_provisioners_demand_and_plans_itself_only_without_one() {
        let t0 = Instant::now();
        let mut a = Autoscaler::with(&settings(true), 7, None, t0);
        let demand: GpuDemand = std::sync::Arc::new([("A100-80GB".to_string(), 4)].into());
        // No service in the state: planned itself, the view would need nothing.
        let refresh = |demand: Option<GpuDemand>| ScaleView {
            windows: BTreeMap::new(),
            services: Vec::new(),
            refresh: Some((ClusterState::default(), true)),
            demand,
        };
        a.pass(refresh(Some(demand.clone())), at(t0, 0), &|| false);
        assert_eq!(a.fleet.as_ref().map(|f| &f.planned), Some(demand.as_ref()));
        a.pass(refresh(None), at(t0, 1), &|| false);
        assert_eq!(a.fleet.as_ref().map(|f| f.planned.is_empty()), Some(true), "without a demand it plans the state's services");
    }

    #[test]
    fn the_shortfall_is_launched_once_and_an_idle_launched_node_goes_after_the_cool_down() {
        let t0 = Instant::now();
        let mut a = Autoscaler::with(&settings(true), 7, None, t0);
        let quiet = || ScaleView { windows: BTreeMap::new(), services: Vec::new(), refresh: None, demand: None };
        // The plan needs 4 GPUs, the fleet has 1: two 2-GPU nodes.
        a.fleet = Some(a2_fleet(4, 1, &[], &[]));
        let pass = a.pass(quiet(), at(t0, 0), &|| false);
        assert_eq!(calls(&pass), vec!["launch auto-a2-7-1", "launch auto-a2-7-2"]);
        // One launch fails: the next pass launches again for its GPUs alone.
        a.record(settled(vec![Ok(()), Err("quota".into())], 0));
        assert_eq!(calls(&a.pass(quiet(), at(t0, 1), &|| false)), vec!["launch auto-a2-7-3"]);
        a.record(settled(vec![Ok(())], 0));
        assert!(calls(&a.pass(quiet(), at(t0, 2), &|| false)).is_empty(), "the launches in flight cover the shortfall");
        // Both registered; the plan then moves its work off auto-a2-7-1.
        a.fleet = Some(a2_fleet(4, 5, &["auto-a2-7-1", "auto-a2-7-3"], &["auto-a2-7-3"]));
        assert!(calls(&a.pass(quiet(), at(t0, 3), &|| false)).is_empty());
        assert!(calls(&a.pass(quiet(), at(t0, 32), &|| false)).is_empty(), "idle since 3: within the cool-down");
        let pass = a.pass(quiet(), at(t0, 33), &|| false);
        assert_eq!(calls(&pass), vec!["terminate auto-a2-7-1"]);
        a.record(settled(vec![Ok(())], 0));
        // Terminated: the next pass deletes its Node.
        let pass = a.pass(quiet(), at(t0, 34), &|| false);
        let deleted: Vec<&str> = pass
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Command { command: Command::Delete { kind: Kind::Node, name, .. }, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, vec!["auto-a2-7-1"]);
    }
}
