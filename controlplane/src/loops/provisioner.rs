//! The provisioner loop: plans every service on the fleet and commits the Plan named
//! `current` when its inputs changed since the committed one was computed.
//!
//! "Changed" is judged by the plan's `inputs_digest` (services, profiles, GPU models,
//! instance types, the healthy fleet, the strategy), not by comparing plans: the tuner
//! adjusts shares in the committed plan, and re-planning from unchanged inputs would revert
//! them on every pass. When the inputs change the plan is recomputed as before and tuning
//! starts again from the new plan.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::sync::broadcast;

use super::runner::{Pass, Reconciler, Settled, Write};
use super::LoopSettings;
use super::PlanChange;
use crate::controller::Controller;
use crate::provision::{gather, inputs_digest, provision_keeping, MigStrategy, PoolPlans};
use crate::raft::WatchSignal;
use crate::resources::{Kind, Spec};
use crate::state::{ChangeEvent, ChangeType, ClusterState};

/// Changes settle before a pass until none has come for this long (at most
/// [`MAX_SETTLE`]), so one `apply` of many resources, in several batches, costs one plan:
/// its batches follow each other within a Raft commit (2,500 Services in 0.25 s at 10,000
/// hosts, `fleet-bench`). Every change waits this long before it is planned, so it is kept
/// short: 200 ms were 40% of a one-Service change's way to its agents at that size.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Settling ends after this long even while changes keep coming.
const MAX_SETTLE: Duration = Duration::from_secs(1);

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
    /// The trace of the change that woke the pass; none for a periodic pass.
    trigger: Option<String>,
    /// Whether this pass planned (and so counts in the planning time), and whether it
    /// proposed a plan.
    planned: bool,
    proposed: bool,
    /// What this pass's plan needs, published for the autoscaler once the pass settles.
    demand: Option<BTreeMap<String, u32>>,
}

/// What a pass reads: the state (an O(1) copy) and the committed plan's version.
pub(crate) struct Committed {
    cluster: ClusterState,
    plan_version: u64,
}

impl Provisioner {
    fn new(controller: &Controller, settings: &LoopSettings) -> Self {
        Provisioner {
            interval: settings.provision_interval,
            strategy: settings.mig_strategy,
            can_grow: settings.provider.is_some(),
            signals: controller.sm.subscribe(),
            fleet_seen: FleetFingerprints::default(),
            planned_digest: None,
            memory: None,
            trigger: None,
            planned: false,
            proposed: false,
            demand: None,
        }
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

    fn pass(&mut self, view: Committed, _now: tokio::time::Instant, cancelled: &dyn Fn() -> bool) -> Pass {
        let Committed { cluster, plan_version } = view;
        (self.planned, self.proposed, self.demand) = (false, false, None);
        // Taken: a pass that stops plans in full next time.
        let previous = self.memory.take();
        let mut inputs = gather(&cluster);
        inputs.capacity = Some(crate::provision::fleet_capacity(&cluster, &inputs.fleet, &inputs.input.gpu_types, self.can_grow));
        let digest = inputs_digest(&inputs, self.strategy);
        let current = inputs.current.as_ref();
        if current.is_some_and(|p| p.inputs_digest == digest) || self.planned_digest.as_deref() == Some(digest.as_str()) {
            // Planned from these very inputs (and perhaps tuned since): nothing to do.
            self.memory = previous;
            return Pass::default();
        }
        let Some((plan, pools)) = provision_keeping(&inputs, self.strategy, digest.clone(), previous.as_ref(), cancelled) else {
            // Stopped: leadership moved.
            return Pass::default();
        };
        self.planned = true;
        self.demand = Some(pools.gpus_by_model());
        self.memory = Some(pools);
        // The patch from the committed plan, so the proposal carries only what moved.
        let change = PlanChange::between(inputs.current.as_ref().map(|c| (plan_version, c)), plan);
        if let (PlanChange::Patch { patch, .. }, Some(current)) = (&change, &inputs.current) {
            if patch.moves_nothing() && patch.strategy == current.strategy {
                // New inputs (a node joined, a node's health came back) that move nothing:
                // no commit, so no agent is woken.
                self.planned_digest = Some(digest);
                return Pass::default();
            }
        }
        self.planned_digest = None;
        self.proposed = true;
        Pass { writes: vec![Write::Plan(change)], ..Pass::default() }
    }

    fn settled(&mut self, controller: &Controller, settled: Settled) {
        if self.planned {
            controller.telemetry.observe_planning(settled.pass_time);
        }
        if let Some(demand) = self.demand.take() {
            controller.planned_demand.publish(demand);
        }
        match settled.writes.into_iter().next() {
            Some(Ok(_)) => tracing::info!("committed a new plan"),
            Some(Err(e)) => tracing::warn!(error = %e, "provisioning pass failed; retrying at the next one"),
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
