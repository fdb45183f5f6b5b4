//! The provisioner loop: plans every service on the fleet and commits the Plan named
//! `current` when its inputs changed since the committed one was computed.
//!
//! "Changed" is judged by the plan's `inputs_digest` (services, profiles, GPU models,
//! instance types, the healthy fleet, the strategy), not by comparing plans: the tuner
//! adjusts shares in the committed plan, and re-planning from unchanged inputs would revert
//! them on every pass. When the inputs change the plan is recomputed as before and tuning
//! starts again from the new plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::sync::broadcast;

use super::runner::{Pass, Reconciler, Settled, Write};
use super::LoopSettings;
use super::PlanChange;
use crate::controller::Controller;
use crate::provision::handover::{drop_retiring, replacements_ready};
use crate::provision::{gather, inputs_digest, place, plan_inputs, MigStrategy, PoolPlans, Previous};
use crate::raft::WatchSignal;
use crate::resources::{Kind, PlanSpec, Spec};
use crate::state::{ChangeEvent, ChangeType, ClusterState};

/// Changes settle before a pass until none has come for this long (at most
/// [`MAX_SETTLE`]), so one `apply` of many resources, in several batches, costs one plan:
/// its batches follow each other within a Raft commit (2,500 Services in 0.25 s at 10,000
/// hosts, `fleet-bench`). Every change waits this long before it is planned, so it is kept
/// short: 200 ms were 40% of a one-Service change's way to its agents at that size.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Settling ends after this long even while changes keep coming.
const MAX_SETTLE: Duration = Duration::from_secs(1);
/// How often a pass looks again while workloads hand over (`provision::handover`): a
/// retiring workload holds capacity until a pass sees its replacements serve.
const HANDOVER_POLL: Duration = Duration::from_secs(2);

pub async fn run(controller: Controller, settings: LoopSettings) {
    let provisioner = Provisioner::new(&controller, &settings);
    super::runner::run(controller, settings, provisioner).await
}

/// The provisioner as a leader loop (`loops::runner`).
pub(crate) struct Provisioner {
    interval: Duration,
    strategy: MigStrategy,
    /// What the fleet can hold, tenants share by weight: without a node provider, the fleet;
    /// with one, up to the instance types' limits.
    can_grow: bool,
    signals: broadcast::Receiver<WatchSignal>,
    fleet_seen: FleetFingerprints,
    /// The digest of the inputs the last pass planned from, when that pass found the
    /// committed placement already right: the same inputs are not planned again (leader
    /// memory only).
    planned_digest: Option<String>,
    /// The pool plans of the last pass, for minimal re-planning (`provision::replan`).
    memory: Option<PoolPlans>,
    /// The last placement committed, with the planner's shares: a re-plan tells the
    /// tuner's changes to the committed plan by it and keeps them where the planned content
    /// stays (`provision::tuned`). Leader memory: a new leader's first plan puts the
    /// planner's shares back.
    placed: Option<PlanSpec>,
    /// This pass's placement, as planned, until its commit settles.
    proposed_placement: Option<PlanSpec>,
    /// Whether a change woke this pass (else it is the periodic one). A change's pass
    /// re-plans minimally and leaves consolidation (weighing a full plan, as much work
    /// again) owed to the periodic pass.
    woken: bool,
    /// When a pass last left no consolidation owed (planned in full, or weighed it): the
    /// periodic pass comes at most an interval after, however often changes wake passes.
    weighed_at: Option<tokio::time::Instant>,
    /// The trace of the change that woke the pass; none for a periodic pass.
    trigger: Option<String>,
    /// Whether this pass planned (and so counts in the planning time), and whether it
    /// proposed a plan.
    planned: bool,
    proposed: bool,
    /// What this pass's plan needs, published for the autoscaler once the pass settles.
    demand: Option<BTreeMap<String, u32>>,
    /// Per service with retiring workloads in the committed plan, since when (leader
    /// memory: a new leader counts from its first pass).
    handing_over: BTreeMap<String, tokio::time::Instant>,
    /// Longest a retiring workload waits for its replacements (`[loops] handover_max_s`).
    handover_max: Duration,
}

/// The services with retiring workloads in the committed plan (`provision::handover`).
#[derive(Default)]
struct Retirements {
    /// Still waiting for their replacements: carried over by a new placement.
    pending: BTreeSet<String>,
    /// To be dropped from the plan.
    done: BTreeSet<String>,
}

impl Retirements {
    /// The committed plan without the done services' retiring workloads, if it has any.
    fn dropped_from(&self, current: &PlanSpec) -> Option<PlanSpec> {
        if self.done.is_empty() {
            return None;
        }
        let done = |s: &str| self.done.contains(s);
        let mut spec = current.clone();
        for i in 0..spec.gpus.len() {
            if spec.gpus[i].retiring.iter().any(|w| done(&w.service)) {
                let mut g = spec.gpus[i].clone();
                drop_retiring(&mut g, &done);
                spec.gpus.set(i, g);
            }
        }
        spec.gpus.retain(|g| !(g.workloads.is_empty() && g.retiring.is_empty()));
        Some(spec)
    }

    /// When to look again: soon while workloads hand over.
    fn next_in(&self, otherwise: Option<Duration>) -> Option<Duration> {
        if self.pending.is_empty() {
            return otherwise;
        }
        polling(otherwise)
    }
}

/// `next_in`, but at most [`HANDOVER_POLL`] away.
fn polling(next_in: Option<Duration>) -> Option<Duration> {
    Some(next_in.map_or(HANDOVER_POLL, |d| d.min(HANDOVER_POLL)))
}

/// What a pass reads: the state (an O(1) copy) and the committed plan's version.
pub(crate) struct Committed {
    cluster: ClusterState,
    plan_version: u64,
}

impl Provisioner {
    fn new(controller: &Controller, settings: &LoopSettings) -> Self {
        let mut p = Self::with(settings.provision_interval, settings.mig_strategy, settings.provider.is_some(), controller.sm.subscribe());
        p.handover_max = settings.handover_max;
        p
    }

    fn with(interval: Duration, strategy: MigStrategy, can_grow: bool, signals: broadcast::Receiver<WatchSignal>) -> Self {
        Provisioner {
            interval,
            strategy,
            can_grow,
            signals,
            fleet_seen: FleetFingerprints::default(),
            planned_digest: None,
            memory: None,
            placed: None,
            proposed_placement: None,
            woken: false,
            weighed_at: None,
            trigger: None,
            planned: false,
            proposed: false,
            demand: None,
            handing_over: BTreeMap::new(),
            handover_max: crate::provision::handover::HANDOVER_MAX,
        }
    }

    /// When a pass at `now` that leaves consolidation owed (`owes`) is to run again: an
    /// interval after the last weighing, so that passes changes wake, however often, never
    /// put the periodic one off; `None` (the loop's interval) when nothing is owed.
    fn periodic_in(&self, owes: bool, now: tokio::time::Instant) -> Option<Duration> {
        let at = self.weighed_at.filter(|_| owes)?;
        Some((at + self.interval).saturating_duration_since(now))
    }

    /// The services with retiring workloads in `current`: those still handing over, and
    /// those done, whose replacements serve on every GPU the plan gives them (by their
    /// agents' reports) or that waited `handover_max`. O(the plan's GPUs), and a Node
    /// status read per node running a service that hands over.
    fn retirements(&mut self, cluster: &ClusterState, current: Option<&PlanSpec>, now: tokio::time::Instant) -> Retirements {
        let Some(current) = current else {
            self.handing_over.clear();
            return Retirements::default();
        };
        let retiring: BTreeSet<&str> = current.gpus.iter().flat_map(|g| &g.retiring).map(|w| w.service.as_str()).collect();
        self.handing_over.retain(|s, _| retiring.contains(s.as_str()));
        let mut timed_out = BTreeSet::new();
        for &s in &retiring {
            let since = *self.handing_over.entry(s.to_string()).or_insert(now);
            if now >= since + self.handover_max {
                tracing::warn!(service = s, "replacements not ready within the hand-over bound: the retiring workloads go");
                timed_out.insert(s);
            }
        }
        let mut waiting: BTreeSet<&str> = BTreeSet::new();
        let mut statuses: HashMap<&str, Option<crate::resources::NodeStatus>> = HashMap::new();
        for g in current.gpus.iter() {
            for w in &g.workloads {
                let s = w.service.as_str();
                if !retiring.contains(s) || timed_out.contains(s) || waiting.contains(s) {
                    continue;
                }
                let status = statuses
                    .entry(g.node.as_str())
                    .or_insert_with(|| cluster.get(Kind::Node, &g.node).and_then(|n| n.status.read::<crate::resources::NodeStatus>().ok()));
                let wanted = cluster.desired().version(&g.node);
                let serving = status.as_ref().is_some_and(|st| {
                    let observed = st.gpus.iter().find(|o| o.gpu_uuid == g.gpu_uuid);
                    replacements_ready(g, s, observed, st.applied_version, wanted)
                });
                if !serving {
                    waiting.insert(s);
                }
            }
        }
        let done = retiring.iter().filter(|s| !waiting.contains(**s)).map(|s| s.to_string()).collect();
        let pending = waiting.into_iter().map(str::to_string).collect();
        Retirements { pending, done }
    }

    /// A change the plan may depend on, then everything that arrives while it settles,
    /// which the one pass to come covers.
    async fn settle(&mut self) {
        self.trigger = relevant_change(&mut self.signals, &mut self.fleet_seen).await;
        let settling = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(DEBOUNCE).await;
            if !drain(&mut self.signals, &mut self.fleet_seen).inputs || settling.elapsed() >= MAX_SETTLE {
                break;
            }
        }
        self.woken = true;
    }
}

impl Provisioner {
    /// A pass that plans nothing: it drops the retiring workloads whose hand-over is done
    /// from the committed plan, if any.
    fn retire(&mut self, retirements: &Retirements, current: Option<&PlanSpec>, plan_version: u64, next_in: Option<Duration>) -> Pass {
        let Some(spec) = current.and_then(|c| retirements.dropped_from(c)) else { return Pass { next_in, ..Pass::default() } };
        let change = PlanChange::between(current.map(|c| (plan_version, c)), spec);
        self.proposed = true;
        Pass { writes: vec![Write::Plan(change)], next_in, ..Pass::default() }
    }
}

impl Reconciler for Provisioner {
    const NAME: &'static str = "provisioner";
    // Plan from everything committed so far.
    const READ_BARRIER: bool = true;
    // Copying the inputs (every GPU of the fleet), the digest (which encodes them),
    // planning, placement and the patch.
    const LONG_PASS: bool = true;
    type View = Committed;

    fn interval(&self) -> Duration {
        self.interval
    }

    fn woken(&mut self) -> impl std::future::Future<Output = ()> + Send {
        self.settle()
    }

    fn span(&mut self) -> tracing::Span {
        let span = tracing::info_span!("provision.pass");
        telemetry_otlp::continue_trace(&span, self.trigger.take().as_deref().unwrap_or_default());
        span
    }

    fn view(&mut self, controller: &Controller) -> Committed {
        // An O(1) copy under the lock: copying every GPU of the fleet under it kept applies,
        // and the reports queued behind them, waiting.
        controller.read(|d| Committed {
            cluster: d.cluster.resources_only(),
            plan_version: d.cluster.get(Kind::Plan, "current").map_or(0, |r| r.resource_version),
        })
    }

    fn pass(&mut self, view: Committed, now: tokio::time::Instant, cancelled: &dyn Fn() -> bool) -> Pass {
        let Committed { cluster, plan_version } = view;
        (self.planned, self.proposed, self.demand) = (false, false, None);
        // A pass no change woke is the periodic one: it weighs a full plan against the
        // minimal re-plans made since (consolidation, `provision::replan`).
        let consolidating = !std::mem::take(&mut self.woken);
        // Taken: a pass that stops plans in full next time.
        let previous = self.memory.take();
        let owed = previous.as_ref().is_some_and(PoolPlans::owes_consolidation);
        let mut inputs = gather(&cluster);
        inputs.capacity = Some(crate::provision::fleet_capacity(&cluster, &inputs.fleet, &inputs.input.gpu_types, self.can_grow));
        let digest = inputs_digest(&inputs, self.strategy);
        let current = inputs.current.as_ref();
        let retirements = self.retirements(&cluster, current, now);
        let planned_already = current.is_some_and(|p| p.inputs_digest == digest) || self.planned_digest.as_deref() == Some(digest.as_str());
        if planned_already && !(owed && consolidating) {
            // Planned from these very inputs (and perhaps tuned since): nothing to plan.
            self.memory = previous;
            let next_in = retirements.next_in(self.periodic_in(owed, now));
            return self.retire(&retirements, current, plan_version, next_in);
        }
        let from = previous.as_ref().map(|plans| Previous { plans, consolidate: consolidating });
        let Some((plan, pools)) = plan_inputs(&inputs, self.strategy, from, cancelled) else {
            // Stopped: leadership moved.
            return Pass::default();
        };
        self.planned = true;
        self.demand = Some(pools.gpus_by_model());
        let (weighed_and_kept, owes) = (planned_already && pools.incremental && !pools.compacted, pools.owes_consolidation());
        if !owes {
            self.weighed_at = Some(now);
        }
        self.memory = Some(pools);
        let next_in = retirements.next_in(self.periodic_in(owes, now));
        if weighed_and_kept {
            // The periodic pass weighed a full plan on the committed inputs and kept the
            // minimal one: the committed plan (and the tuner's changes to it) stays.
            return self.retire(&retirements, current, plan_version, next_in);
        }
        if cancelled() {
            return Pass::default();
        }
        let placed = place(&inputs, &plan, digest.clone(), self.placed.as_ref(), &|s| retirements.pending.contains(s));
        let plan = placed.spec;
        // What moves now hands over: look again soon.
        let hands_over = plan.gpus.iter().any(|g| !g.retiring.is_empty());
        let next_in = if hands_over { polling(next_in) } else { next_in };
        // The patch from the committed plan, so the proposal carries only what moved.
        let change = PlanChange::between(inputs.current.as_ref().map(|c| (plan_version, c)), plan);
        if let (PlanChange::Patch { patch, .. }, Some(current)) = (&change, &inputs.current) {
            if patch.moves_nothing() && patch.strategy == current.strategy {
                // New inputs (a node joined, a node's health came back) that move nothing:
                // no commit, so no agent is woken.
                self.planned_digest = Some(digest);
                return Pass { next_in, ..Pass::default() };
            }
        }
        self.planned_digest = None;
        self.proposed = true;
        self.proposed_placement = Some(placed.as_planned);
        Pass { writes: vec![Write::Plan(change)], next_in, ..Pass::default() }
    }

    fn settled(&mut self, controller: &Controller, settled: Settled) {
        if self.planned {
            controller.telemetry.observe_planning(settled.pass_time);
        }
        if let Some(demand) = self.demand.take() {
            controller.planned_demand.publish(demand);
        }
        let placement = self.proposed_placement.take();
        match settled.writes.into_iter().next() {
            // Only retiring workloads dropped: the placement stays what it was.
            Some(Ok(_)) if placement.is_none() => tracing::info!("retiring workloads handed over"),
            Some(Ok(_)) => {
                self.placed = placement;
                tracing::info!("committed a new plan");
            }
            Some(Err(e)) => {
                // The committed plan is not this placement (perhaps not the last either).
                self.placed = None;
                tracing::warn!(error = %e, "provisioning pass failed; retrying at the next one");
            }
            None => {}
        }
    }
}

/// What of each Node the plan depends on (its GPUs, whether the autoscaler launched it, its
/// health) and of each Tenant (its isolation, weight and quotas), as fingerprints: a report
/// that changes only what the agent applied or serves, a Tenant's display name or the usage
/// the metering writes into its status, does not wake the provisioner.
#[derive(Default)]
pub(super) struct FleetFingerprints {
    nodes: HashMap<String, u64>,
    tenants: HashMap<String, u64>,
}

impl FleetFingerprints {
    /// Whether `event` may change the plan's inputs.
    pub(super) fn is_relevant(&mut self, event: &ChangeEvent) -> bool {
        let r = &event.resource;
        let prints = match r.kind() {
            Kind::Plan => return false,
            Kind::Node => &mut self.nodes,
            Kind::Tenant => &mut self.tenants,
            _ => return true,
        };
        if event.change_type == ChangeType::Deleted {
            prints.remove(&r.name);
            return true;
        }
        let mut hasher = std::hash::DefaultHasher::new();
        match &r.spec {
            Spec::Node(spec) => {
                serde_json::to_string(spec).unwrap_or_default().hash(&mut hasher);
                // What `provision::fleet` reads of the status: unhealthy or not.
                let unhealthy = crate::resources::NodeStatus::is_unhealthy(&r.status);
                unhealthy.hash(&mut hasher);
            }
            // What `provision::service_rules` reads of a Tenant.
            Spec::Tenant(t) => {
                (t.isolation, t.weight.to_bits(), t.max_gpus.map(f64::to_bits), t.max_cost_per_hour.map(f64::to_bits)).hash(&mut hasher)
            }
            _ => return true,
        }
        let print = hasher.finish();
        prints.insert(r.name.clone(), print) != Some(print)
    }
}

/// Resolves on a change the plan may depend on, with the trace of the write that made it.
async fn relevant_change(signals: &mut broadcast::Receiver<WatchSignal>, seen: &mut FleetFingerprints) -> Option<String> {
    loop {
        match signals.recv().await {
            Ok(WatchSignal::Change(ev)) => {
                if seen.is_relevant(&ev) {
                    return ev.trace_parent.clone();
                }
            }
            Ok(WatchSignal::Reset { .. }) | Err(broadcast::error::RecvError::Lagged(_)) => return None,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// What the changes [`drain`] consumed may have changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Drained {
    /// The plan's inputs (services, profiles, models, instance types, the healthy fleet).
    pub inputs: bool,
    /// The committed Plan itself.
    pub plan: bool,
}

/// Consumes the changes already queued, keeping the fingerprints current (missed changes
/// count as both).
pub(super) fn drain(signals: &mut broadcast::Receiver<WatchSignal>, seen: &mut FleetFingerprints) -> Drained {
    let mut drained = Drained::default();
    loop {
        match signals.try_recv() {
            Ok(WatchSignal::Change(ev)) if ev.resource.kind() == Kind::Plan => drained.plan = true,
            Ok(WatchSignal::Change(ev)) => drained.inputs |= seen.is_relevant(&ev),
            Ok(WatchSignal::Reset { .. }) | Err(broadcast::error::TryRecvError::Lagged(_)) => {
                drained = Drained { inputs: true, plan: true }
            }
            Err(_) => return drained,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::resources::{Health, NodeGpu, NodeSpec, NodeStatus, Spec, StoredResource};
    use futures::FutureExt;
    use std::sync::Arc;

    /// A Node's status as its agent's report writes it.
    pub(in crate::loops) fn node_status(applied_version: u64, health: Health) -> serde_json::Value {
        NodeStatus { applied_version, health, ..Default::default() }.to_json()
    }

    pub(in crate::loops) fn node_event(name: &str, change_type: ChangeType, status: serde_json::Value) -> WatchSignal {
        let spec = Spec::Node(NodeSpec {
            address: format!("{name}:7000"),
            instance_type: "a100-1x".into(),
            gpus: vec![NodeGpu { uuid: format!("GPU-{name}"), model: "A100-80GB".into(), mig_enabled: true }],
            labels: Default::default(),
        });
        let resource = StoredResource {
            name: name.into(),
            tenant: String::new(),
            resource_version: 1,
            spec,
            status: status.into(),
            create_revision: 1,
            mod_revision: 1,
        };
        WatchSignal::Change(Arc::new(ChangeEvent { revision: 1, change_type, resource: Arc::new(resource), trace_parent: None }))
    }

    #[tokio::test]
    async fn a_burst_of_registrations_is_one_pass_and_reports_that_change_no_input_are_none() {
        let (tx, mut rx) = broadcast::channel(4096);
        let mut seen = FleetFingerprints::default();
        for i in 0..100 {
            tx.send(node_event(&format!("n{i}"), ChangeType::Added, serde_json::Value::Null)).unwrap();
        }
        // The first registration wakes the loop; the other 99, queued meanwhile, are drained
        // into the same pass.
        assert!(relevant_change(&mut rx, &mut seen).now_or_never().is_some());
        assert!(drain(&mut rx, &mut seen).inputs, "registrations are inputs: settling goes on");
        assert!(rx.is_empty());
        assert_eq!(seen.nodes.len(), 100);
        assert!(!drain(&mut rx, &mut seen).inputs, "nothing more came: settled");
        // Reports that change what the agents applied, or mark them healthy: no pass.
        for i in 0..100 {
            let status = node_status(8, Health::Healthy);
            tx.send(node_event(&format!("n{i}"), ChangeType::Modified, status)).unwrap();
        }
        assert!(relevant_change(&mut rx, &mut seen).now_or_never().is_none(), "applied_version alone is no input");
        for i in 0..10 {
            tx.send(node_event(&format!("n{i}"), ChangeType::Modified, node_status(9, Health::Healthy))).unwrap();
        }
        assert!(!drain(&mut rx, &mut seen).inputs, "reports that change no input do not prolong settling");
        // A node turning unhealthy is.
        tx.send(node_event("n5", ChangeType::Modified, node_status(8, Health::Unhealthy))).unwrap();
        assert!(relevant_change(&mut rx, &mut seen).now_or_never().is_some());
    }

    /// 12 resnet50 Services on 16 hosts of 8 A100s, the first at `rates`.
    fn fleet(rates: &[f64]) -> ClusterState {
        let mut yaml = String::from(
            r#"
kind: GpuModel
name: A100-80GB
spec:
  sm_count: 108
  memory_gib: 80
  mig:
    compute_slices: 7
    memory_slices: 8
    profiles:
      - {name: 1g, compute_slices: 1, memory_slices: 1, starts: [0, 1, 2, 3, 4, 5, 6]}
      - {name: 2g, compute_slices: 2, memory_slices: 2, starts: [0, 2, 4]}
      - {name: 3g, compute_slices: 3, memory_slices: 4, starts: [0, 4]}
      - {name: 4g, compute_slices: 4, memory_slices: 4, starts: [0]}
      - {name: 7g, compute_slices: 7, memory_slices: 8, starts: [0]}
---
kind: InstanceType
name: a100-8x
spec: {gpu_model: A100-80GB, gpu_count: 8, price_per_hour: 32, launch_latency_s: 60}
---
kind: ModelProfile
name: r50
spec:
  model: resnet50
  gpu_model: A100-80GB
  points:
    - {gpcs: 1, batch: 8, throughput_rps: 100, latency_ms: 20}
    - {gpcs: 2, batch: 8, throughput_rps: 210, latency_ms: 15}
    - {gpcs: 3, batch: 8, throughput_rps: 320, latency_ms: 12}
    - {gpcs: 4, batch: 8, throughput_rps: 420, latency_ms: 10}
    - {gpcs: 7, batch: 8, throughput_rps: 720, latency_ms: 8}
---
kind: Tenant
name: acme
spec: {}
"#,
        );
        for n in 0..16 {
            let gpus: Vec<String> = (0..8).map(|g| format!("{{uuid: GPU-{n}-{g}, model: A100-80GB}}")).collect();
            yaml += &format!(
                "---\nkind: Node\nname: n{n}\nspec: {{address: \"n{n}:7000\", instance_type: a100-8x, gpus: [{}]}}\n",
                gpus.join(", ")
            );
        }
        let mut resources = crate::manifest::parse("fleet.yaml", &yaml, crate::manifest::Format::Yaml).unwrap();
        resources.extend(services(rates));
        crate::provision::offline::state_from_resources(&resources).unwrap()
    }

    /// The Services s00, s01, ... at `rates`.
    fn services(rates: &[f64]) -> Vec<proto::Resource> {
        let yaml: String = rates
            .iter()
            .enumerate()
            .map(|(i, rate)| {
                format!("---\nkind: Service\nname: s{i:02}\ntenant: acme\nspec: {{model: resnet50, slo: {{latency_ms: 50, request_rate: {rate}}}}}\n")
            })
            .collect();
        crate::manifest::parse("services.yaml", &yaml, crate::manifest::Format::Yaml).unwrap()
    }

    /// The rates of the twelve Services the tests start from.
    fn base_rates() -> Vec<f64> {
        (0..12).map(|i| 2000.0 + 300.0 * f64::from(i)).collect()
    }

    /// The fleet at [`base_rates`] with its first plan committed, and the provisioner that
    /// made it (at `t0`).
    fn first_plan(t0: tokio::time::Instant) -> (ClusterState, Provisioner) {
        let mut cluster = fleet(&base_rates());
        let mut p = provisioner();
        assert_eq!(pass(&mut p, &mut cluster, true, t0).0, 1, "the first plan");
        assert!(!p.memory.as_ref().unwrap().owes_consolidation(), "a full plan owes nothing");
        (cluster, p)
    }

    fn provisioner() -> Provisioner {
        Provisioner::with(Duration::from_secs(30), MigStrategy::Parvagpu, false, broadcast::channel(1).1)
    }

    /// One pass over `cluster`, woken by a change or periodic: the plans it proposed, each
    /// committed into `cluster`, and when it asked to run again.
    fn pass(p: &mut Provisioner, cluster: &mut ClusterState, woken: bool, now: tokio::time::Instant) -> (usize, Option<Duration>) {
        use crate::state::{Command, Request, WriteMode};
        p.woken = woken;
        let view = Committed {
            cluster: cluster.resources_only(),
            plan_version: cluster.get(Kind::Plan, "current").map_or(0, |r| r.resource_version),
        };
        let pass = p.pass(view, now, &|| false);
        let proposed = pass.writes.len();
        for write in pass.writes {
            let Write::Plan(change) = write else { panic!("the provisioner writes plans only") };
            let command = match change {
                PlanChange::First(spec) => Command::Put {
                    name: "current".into(),
                    tenant: String::new(),
                    spec: Spec::Plan(spec),
                    mode: WriteMode::Create,
                    expected_version: 0,
                },
                PlanChange::Patch { patch, base_version } => {
                    Command::PatchPlan { name: "current".into(), patch, expected_version: base_version }
                }
            };
            let revision = cluster.revision() + 1;
            cluster.apply(revision, &Request { request_id: String::new(), command, trace_parent: None }).0.unwrap();
        }
        (proposed, pass.next_in)
    }

    /// Puts the Services at `rates` into `cluster`.
    fn set_rates(cluster: &mut ClusterState, rates: &[f64]) {
        for r in services(rates) {
            let revision = cluster.revision() + 1;
            crate::provision::offline::put_resource(cluster, revision, &r).unwrap();
        }
    }

    fn plan_version(cluster: &ClusterState) -> u64 {
        cluster.get(Kind::Plan, "current").unwrap().resource_version
    }

    #[test]
    fn a_changes_pass_re_plans_minimally_and_leaves_consolidation_to_the_periodic_pass() {
        let t0 = tokio::time::Instant::now();
        let (mut cluster, mut p) = first_plan(t0);

        // Every rate falls to a fifth: the change's pass relocates each service alone.
        set_rates(&mut cluster, &base_rates().iter().map(|r| r * 0.2).collect::<Vec<_>>());
        let t1 = t0 + Duration::from_secs(10);
        let (proposed, next_in) = pass(&mut p, &mut cluster, true, t1);
        assert_eq!(proposed, 1, "the change is committed");
        let memory = p.memory.as_ref().unwrap();
        assert!(memory.incremental && memory.owes_consolidation(), "re-planned minimally, consolidation owed");
        // The moved services' old workloads hand over until the agents report the new ones:
        // the provisioner looks again soon.
        assert_eq!(next_in, Some(HANDOVER_POLL));
        assert!(!retiring(&committed(&cluster)).is_empty());
        let (proposed, next_in) = pass(&mut p, &mut cluster, true, t1 + Duration::from_secs(1));
        assert_eq!((proposed, next_in), (0, Some(HANDOVER_POLL)));
        report_ready(&mut cluster);
        assert_eq!(pass(&mut p, &mut cluster, true, t1 + Duration::from_secs(2)).0, 1, "the retiring workloads go");
        let minimal = plan_version(&cluster);

        // Another change's pass on the same inputs: nothing to do, still owed, and the
        // periodic pass is not put off.
        let (proposed, next_in) = pass(&mut p, &mut cluster, true, t1 + Duration::from_secs(3));
        assert_eq!((proposed, next_in), (0, Some(Duration::from_secs(17))));
        assert!(p.memory.as_ref().unwrap().owes_consolidation());

        // The periodic pass weighs a full plan on the committed inputs: at a fifth of the
        // rates it saves far more than the bar, so it is committed.
        let (proposed, next_in) = pass(&mut p, &mut cluster, false, t0 + Duration::from_secs(30));
        assert_eq!(proposed, 1, "the consolidated plan is committed");
        assert!(plan_version(&cluster) > minimal);
        let memory = p.memory.as_ref().unwrap();
        assert!(!memory.incremental && !memory.owes_consolidation());
        assert_eq!(next_in, Some(HANDOVER_POLL), "nothing owed, but what moved hands over");
        let working = |p: &PlanSpec| p.gpus.iter().filter(|g| !g.workloads.is_empty()).count();
        let full = crate::provision::provision_from(&gather(&cluster), MigStrategy::Parvagpu);
        assert_eq!(working(&committed(&cluster)), working(&full), "as many GPUs as a full plan");
        report_ready(&mut cluster);
        let (proposed, next_in) = pass(&mut p, &mut cluster, false, t0 + Duration::from_secs(31));
        assert_eq!((proposed, next_in), (1, None), "handed over; nothing owed: the loop's interval");

        // Nothing owed: the next periodic pass does not plan.
        assert_eq!(pass(&mut p, &mut cluster, false, t0 + Duration::from_secs(60)).0, 0);
        assert!(!p.planned, "it did not plan");
    }

    #[test]
    fn a_periodic_pass_that_weighs_and_keeps_the_plan_commits_nothing() {
        let t0 = tokio::time::Instant::now();
        let (mut cluster, mut p) = first_plan(t0);
        let mut raised = base_rates();
        raised[3] *= 1.25;
        set_rates(&mut cluster, &raised);
        assert_eq!(pass(&mut p, &mut cluster, true, t0 + Duration::from_secs(1)).0, 1);
        assert!(p.memory.as_ref().unwrap().owes_consolidation());
        report_ready(&mut cluster);
        assert_eq!(pass(&mut p, &mut cluster, true, t0 + Duration::from_secs(2)).0, 1, "s03's old segments handed over");
        let minimal = plan_version(&cluster);
        let (proposed, next_in) = pass(&mut p, &mut cluster, false, t0 + Duration::from_secs(30));
        assert!(p.planned, "it weighed a full plan");
        assert_eq!(proposed, 0, "one service +25% is not worth a repack: the committed plan (and its tuning) stays");
        assert_eq!(plan_version(&cluster), minimal);
        assert!(p.memory.as_ref().unwrap().incremental && !p.memory.as_ref().unwrap().owes_consolidation());
        assert_eq!(next_in, None);
    }

    fn committed(cluster: &ClusterState) -> PlanSpec {
        let Some(Spec::Plan(plan)) = cluster.get(Kind::Plan, "current").map(|r| r.spec.clone()) else { panic!("a plan") };
        plan
    }

    /// Every node's agent reports what the committed plan gives it, applied and ready.
    fn report_ready(cluster: &mut ClusterState) {
        use crate::resources::{ObservedGpu, ObservedWorkload, StatusJson};
        use crate::state::{Command, Request};
        let plan = committed(cluster);
        let mut by_node: BTreeMap<String, Vec<ObservedGpu>> = BTreeMap::new();
        for g in plan.gpus.iter() {
            let workloads = g
                .workloads
                .iter()
                .chain(&g.retiring)
                .flat_map(|w| {
                    (0..w.processes).map(|_| ObservedWorkload {
                        service: w.service.clone(),
                        mig_instance: w.mig_instance.map_or(-1, |i| i as i32),
                        mps_percent: w.mps_percent,
                        batch: w.batch,
                        state: "ready".into(),
                        shadow: false,
                        pid: 1,
                    })
                })
                .collect();
            by_node.entry(g.node.clone()).or_default().push(ObservedGpu { gpu_uuid: g.gpu_uuid.clone(), workloads, ..Default::default() });
        }
        for (node, gpus) in by_node {
            let status =
                NodeStatus { applied_version: cluster.desired().version(&node), health: Health::Healthy, gpus, ..Default::default() };
            let command =
                Command::PutStatus { kind: Kind::Node, name: node, status: StatusJson::of(&status).unwrap(), expected_version: 0 };
            let revision = cluster.revision() + 1;
            cluster.apply(revision, &Request { request_id: String::new(), command, trace_parent: None }).0.unwrap();
        }
    }

    fn retiring(plan: &PlanSpec) -> BTreeSet<String> {
        plan.gpus.iter().flat_map(|g| &g.retiring).map(|w| w.service.clone()).collect()
    }

    #[test]
    fn a_moved_workload_serves_as_retiring_until_its_replacements_report_ready() {
        let t0 = tokio::time::Instant::now();
        let (mut cluster, mut p) = first_plan(t0);
        let before = committed(&cluster);
        let mut rates = base_rates();
        rates[3] *= 0.5;
        set_rates(&mut cluster, &rates);
        assert_eq!(pass(&mut p, &mut cluster, true, t0 + Duration::from_secs(1)).0, 1);
        let handing_over = committed(&cluster);
        assert_eq!(retiring(&handing_over), BTreeSet::from(["s03".to_string()]), "s03's old segments keep serving");
        // Each retiring workload is one s03 ran in that very instance, and the new ones run
        // beside it.
        for g in handing_over.gpus.iter().filter(|g| !g.retiring.is_empty()) {
            let was = before.gpus.iter().find(|b| b.gpu_uuid == g.gpu_uuid).expect("on a GPU it ran on");
            for r in &g.retiring {
                let slot = &g.mig_layout[r.mig_instance.unwrap()];
                assert!(was.workloads.iter().any(|w| w.service == r.service && was.mig_layout[w.mig_instance.unwrap()] == *slot));
                assert!(!g.workloads.iter().any(|w| g.mig_layout[w.mig_instance.unwrap()] == *slot), "its instance is its own");
            }
        }
        // No report yet: they stay, and the provisioner looks again soon.
        let (proposed, next_in) = pass(&mut p, &mut cluster, true, t0 + Duration::from_secs(2));
        assert_eq!(proposed, 0);
        assert_eq!(next_in, Some(HANDOVER_POLL));
        // The agents report the new workloads ready: the retiring ones go, nothing else moves.
        report_ready(&mut cluster);
        let (proposed, next_in) = pass(&mut p, &mut cluster, true, t0 + Duration::from_secs(4));
        assert_eq!(proposed, 1);
        assert!(next_in.is_none_or(|d| d > HANDOVER_POLL), "{next_in:?}");
        let after = committed(&cluster);
        assert!(retiring(&after).is_empty());
        let working = |p: &PlanSpec| {
            p.gpus.iter().map(|g| (g.gpu_uuid.clone(), g.workloads.clone())).filter(|(_, w)| !w.is_empty()).collect::<Vec<_>>()
        };
        assert_eq!(working(&after), working(&handing_over));
    }

    #[test]
    fn retiring_workloads_whose_replacements_never_report_ready_go_after_the_bound() {
        let t0 = tokio::time::Instant::now();
        let (mut cluster, mut p) = first_plan(t0);
        let mut rates = base_rates();
        rates[3] *= 0.5;
        set_rates(&mut cluster, &rates);
        pass(&mut p, &mut cluster, true, t0 + Duration::from_secs(1));
        assert!(!retiring(&committed(&cluster)).is_empty());
        let first_seen = t0 + Duration::from_secs(2);
        assert_eq!(pass(&mut p, &mut cluster, true, first_seen).0, 0);
        let bound = crate::provision::handover::HANDOVER_MAX;
        assert_eq!(pass(&mut p, &mut cluster, true, first_seen + bound - Duration::from_secs(1)).0, 0);
        assert_eq!(pass(&mut p, &mut cluster, true, first_seen + bound).0, 1);
        assert!(retiring(&committed(&cluster)).is_empty());
    }

    fn tenant_event(spec: serde_json::Value, status: serde_json::Value) -> WatchSignal {
        let resource = StoredResource {
            name: "acme".into(),
            tenant: String::new(),
            resource_version: 1,
            spec: Spec::from_json(Kind::Tenant, &spec.to_string()).unwrap(),
            status: status.into(),
            create_revision: 1,
            mod_revision: 1,
        };
        WatchSignal::Change(Arc::new(ChangeEvent {
            revision: 1,
            change_type: ChangeType::Modified,
            resource: Arc::new(resource),
            trace_parent: None,
        }))
    }

    #[tokio::test]
    async fn a_tenant_wakes_the_provisioner_only_when_what_planning_reads_of_it_changes() {
        let (tx, mut rx) = broadcast::channel(64);
        let mut seen = FleetFingerprints::default();
        tx.send(tenant_event(serde_json::json!({"display_name": "Acme"}), serde_json::Value::Null)).unwrap();
        assert!(relevant_change(&mut rx, &mut seen).now_or_never().is_some(), "a tenant first seen");
        // Its display name, or the usage the metering writes: no pass.
        tx.send(tenant_event(serde_json::json!({"display_name": "Acme Corp"}), serde_json::Value::Null)).unwrap();
        tx.send(tenant_event(serde_json::json!({"display_name": "Acme Corp"}), serde_json::json!({"gpus": 0.5}))).unwrap();
        assert!(relevant_change(&mut rx, &mut seen).now_or_never().is_none());
        // Its weight, isolation or quotas: a pass.
        for spec in [
            serde_json::json!({"weight": 2.0}),
            serde_json::json!({"weight": 2.0, "isolation": "dedicated"}),
            serde_json::json!({"weight": 2.0, "isolation": "dedicated", "max_gpus": 4.0}),
            serde_json::json!({"weight": 2.0, "isolation": "dedicated", "max_gpus": 4.0, "max_cost_per_hour": 10.0}),
        ] {
            tx.send(tenant_event(spec.clone(), serde_json::Value::Null)).unwrap();
            assert!(relevant_change(&mut rx, &mut seen).now_or_never().is_some(), "{spec}");
        }
    }
}
