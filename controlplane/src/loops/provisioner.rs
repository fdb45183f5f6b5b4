//! The provisioner loop: plans every service on the fleet and commits the Plan named
//! `current` when its inputs changed since the committed one was computed.
//!
//! "Changed" is judged by the plan's `inputs_digest` (services, profiles, GPU models,
//! instance types, the healthy fleet, the strategy), not by comparing plans: the tuner
//! adjusts shares in the committed plan, and re-planning from unchanged inputs would revert
//! them on every pass. When the inputs change the plan is recomputed as before and tuning
//! starts again from the new plan.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::sync::broadcast;
use tracing::Instrument;

use super::LoopSettings;
use super::PlanChange;
use crate::api::ApiError;
use crate::controller::Controller;
use crate::provision::{gather, inputs_digest, provision_keeping, PoolPlans};
use crate::raft::WatchSignal;
use crate::resources::{Kind, Spec};
use crate::state::{ChangeEvent, ChangeType};

/// Changes settle before a pass until none has come for this long (at most
/// [`MAX_SETTLE`]), so one `apply` of many resources, in several batches, costs one plan.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Settling ends after this long even while changes keep coming.
const MAX_SETTLE: Duration = Duration::from_secs(1);

pub async fn run(controller: Controller, settings: LoopSettings) {
    let mut signals = controller.sm.subscribe();
    let mut fleet_seen = FleetFingerprints::default();
    // The digest of the inputs the last pass planned from, when that pass found the committed
    // placement already right: the same inputs are not planned again (leader memory only).
    let mut planned_digest: Option<String> = None;
    // The pool plans of the last pass, for minimal re-planning (`provision::replan`).
    let mut memory: Option<PoolPlans> = None;
    // The trace of the change that triggered the pass; none for a periodic pass.
    let mut trigger: Option<String> = None;
    loop {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("provision.pass");
        telemetry_otlp::continue_trace(&span, trigger.take().as_deref().unwrap_or_default());
        let result = pass(&controller, &settings, &mut planned_digest, &mut memory).instrument(span).await;
        controller.telemetry.observe_loop_pass("provisioner", started.elapsed());
        controller.telemetry.observe_loop_outcome("provisioner", result.is_err());
        match result {
            Ok(true) => tracing::info!("committed a new plan"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "provisioning pass failed; retrying at the next one"),
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.provision_interval) => {}
            change = relevant_change(&mut signals, &mut fleet_seen) => {
                trigger = change;
                // Everything that arrives while settling is covered by the one pass to come.
                let settling = tokio::time::Instant::now();
                loop {
                    tokio::time::sleep(DEBOUNCE).await;
                    if !drain(&mut signals, &mut fleet_seen).inputs || settling.elapsed() >= MAX_SETTLE {
                        break;
                    }
                }
            }
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

/// What a pass decided, off the async workers.
enum Decision {
    /// Planned from these very inputs already (the committed plan, or the last pass); the
    /// pool plans kept.
    Unchanged(Option<PoolPlans>),
    /// New inputs that move nothing: remember their digest and pool plans, commit nothing.
    SamePlacement(String, PoolPlans),
    NewPlan(PlanChange, PoolPlans),
    /// The loop was aborted while planning (leadership moved).
    Stopped,
}

/// One pass; `Ok(true)` when a new plan was committed.
async fn pass(
    controller: &Controller,
    settings: &LoopSettings,
    planned_digest: &mut Option<String>,
    memory: &mut Option<PoolPlans>,
) -> Result<bool, ApiError> {
    // Plan from everything committed so far.
    controller.read_barrier().await?;
    let strategy = settings.mig_strategy;
    let last = planned_digest.clone();
    // Taken: a pass that fails plans in full next time.
    let previous = memory.take();
    let sm = controller.sm.clone();
    // What the fleet can hold, tenants share by weight: without a node provider, the fleet;
    // with one, up to the instance types' limits.
    let can_grow = settings.provider.is_some();
    // All of it on the blocking pool: copying the inputs (every GPU of the fleet), the digest
    // (which encodes them), planning, placement and the patch.
    let decision = super::off_runtime(settings, "provisioning", move |cancel: super::Cancel| {
        // An O(1) copy under the lock: copying every GPU of the fleet under it kept applies,
        // and the reports queued behind them, waiting.
        let (cluster, version) = {
            let d = sm.data.read().expect("state lock");
            (d.cluster.resources_only(), d.cluster.get(Kind::Plan, "current").map_or(0, |r| r.resource_version))
        };
        let mut inputs = gather(&cluster);
        inputs.capacity = Some(crate::provision::fleet_capacity(&cluster, &inputs.fleet, &inputs.input.gpu_types, can_grow));
        let digest = inputs_digest(&inputs, strategy);
        let current = inputs.current.as_ref();
        if current.is_some_and(|p| p.inputs_digest == digest) || last.as_deref() == Some(digest.as_str()) {
            // Planned from these very inputs (and perhaps tuned since): nothing to do.
            return Decision::Unchanged(previous);
        }
        let planning = std::time::Instant::now();
        let Some((plan, pools)) = provision_keeping(&inputs, strategy, previous.as_ref(), &|| cancel.is_set()) else {
            return Decision::Stopped;
        };
        tracing::debug!(seconds = planning.elapsed().as_secs_f64(), gpus = plan.gpus.len(), incremental = pools.incremental, "planned");
        // The patch from the committed plan, so the proposal carries only what moved.
        let change = PlanChange::between(inputs.current.as_ref().map(|c| (version, c)), plan);
        if let (PlanChange::Patch { patch, .. }, Some(current)) = (&change, &inputs.current) {
            if patch.moves_nothing() && patch.strategy == current.strategy {
                // New inputs (a node joined, a node's health came back) that move nothing:
                // no commit, so no agent is woken.
                return Decision::SamePlacement(digest, pools);
            }
        }
        Decision::NewPlan(change, pools)
    });
    let started = std::time::Instant::now();
    let decision = decision.await?;
    match decision {
        Decision::Stopped => Ok(false),
        Decision::Unchanged(previous) => {
            *memory = previous;
            Ok(false)
        }
        Decision::SamePlacement(digest, pools) => {
            controller.telemetry.observe_planning(started.elapsed());
            *planned_digest = Some(digest);
            *memory = Some(pools);
            Ok(false)
        }
        Decision::NewPlan(change, pools) => {
            controller.telemetry.observe_planning(started.elapsed());
            *planned_digest = None;
            *memory = Some(pools);
            super::commit_plan(controller, settings, change).await?;
            Ok(true)
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
        WatchSignal::Change(Arc::new(ChangeEvent { revision: 1, change_type, resource, trace_parent: None }))
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
        WatchSignal::Change(Arc::new(ChangeEvent { revision: 1, change_type: ChangeType::Modified, resource, trace_parent: None }))
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
