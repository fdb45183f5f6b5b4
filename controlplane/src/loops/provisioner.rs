//! The provisioner loop: plans every service on the fleet and commits the Plan named
//! `current` when its inputs changed since the committed one was computed.
//!
//! "Changed" is judged by the plan's `inputs_digest` (services, profiles, GPU models,
//! instance types, the healthy fleet, the strategy), not by comparing plans: the tuner
//! adjusts shares in the committed plan, and re-planning from unchanged inputs would revert
//! them on every pass. When the inputs change the plan is recomputed as before and tuning
//! starts again from the new plan.

use std::time::Duration;

use tokio::sync::broadcast;
use tracing::Instrument;

use super::LoopSettings;
use crate::api::ApiError;
use crate::controller::Controller;
use crate::provision::{gather, inputs_digest, provision_from};
use crate::raft::WatchSignal;
use crate::resources::{Kind, Spec};
use crate::state::WriteMode;

/// Changes settle this long before a pass, so one `apply` of many resources costs one plan.
const DEBOUNCE: Duration = Duration::from_millis(200);

pub async fn run(controller: Controller, settings: LoopSettings) {
    let mut signals = controller.sm.subscribe();
    // The trace of the change that triggered the pass; none for a periodic pass.
    let mut trigger: Option<String> = None;
    loop {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("provision.pass");
        telemetry_otlp::continue_trace(&span, trigger.take().as_deref().unwrap_or_default());
        let result = pass(&controller, &settings).instrument(span).await;
        controller.telemetry.observe_loop_pass("provisioner", started.elapsed());
        controller.telemetry.observe_loop_outcome("provisioner", result.is_err());
        match result {
            Ok(true) => tracing::info!("committed a new plan"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "provisioning pass failed; retrying at the next one"),
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.provision_interval) => {}
            change = relevant_change(&mut signals) => {
                trigger = change;
                tokio::time::sleep(DEBOUNCE).await;
            }
        }
    }
}

/// Resolves on a change the plan may depend on (not the Plan itself, which this loop
/// writes, nor tenants), with the trace of the write that made it. Node status reports
/// count too: a pass that changes nothing writes nothing.
async fn relevant_change(signals: &mut broadcast::Receiver<WatchSignal>) -> Option<String> {
    loop {
        match signals.recv().await {
            Ok(WatchSignal::Change(ev)) => {
                if !matches!(ev.resource.kind(), Kind::Plan | Kind::Tenant) {
                    return ev.trace_parent;
                }
            }
            Ok(WatchSignal::Reset { .. }) | Err(broadcast::error::RecvError::Lagged(_)) => return None,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// One pass; `Ok(true)` when a new plan was committed.
async fn pass(controller: &Controller, settings: &LoopSettings) -> Result<bool, ApiError> {
    // Plan from everything committed so far.
    controller.read_barrier().await?;
    // Copy the inputs under the state lock; plan without it.
    let (inputs, current) =
        controller.read(|d| (gather(&d.cluster), d.cluster.get(Kind::Plan, "current").map(|r| (r.resource_version, r.spec.clone()))));
    let digest = inputs_digest(&inputs, settings.mig_strategy);
    if current.as_ref().is_some_and(|(_, s)| matches!(s, Spec::Plan(p) if p.inputs_digest == digest)) {
        // Planned from these very inputs (and perhaps tuned since): nothing to do.
        return Ok(false);
    }
    let strategy = settings.mig_strategy;
    let plan = super::off_runtime(settings, "provisioning", move || provision_from(&inputs, strategy)).await?;
    if current.as_ref().is_some_and(|(_, s)| matches!(s, Spec::Plan(p) if p.same_placement(&plan))) {
        return Ok(false);
    }
    super::commit_plan(controller, plan, WriteMode::Upsert, current.map_or(0, |(v, _)| v)).await?;
    Ok(true)
}
