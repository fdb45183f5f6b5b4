//! The reconcile loop: every interval, or at once on a new desired state, one round off the
//! async workers: shadow failover first (the policies hear what runs, their standbys'
//! readiness and the routers' windows; the executor carries out what they decide), then the
//! plan of steps from what runs to what is desired.

use super::Agent;
use crate::desired::NodeDesired;
use crate::executor::Executor;
use crate::reconcile;
use crate::shadow::workloads::ShadowPolicies;
use crate::shadow::{Action, SwitchReason};
use crate::telemetry::AgentMetrics;
use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

impl Agent {
    pub(super) async fn reconcile_loop(self: Arc<Self>, mut rx: watch::Receiver<Option<NodeDesired>>) {
        let interval = Duration::from_millis(self.cfg.interval_ms);
        let shadows = Arc::new(Mutex::new(ShadowPolicies::default()));
        loop {
            let desired = rx.borrow_and_update().clone();
            if let Some(desired) = desired {
                let (executor, shadows, telemetry) = (self.executor.clone(), shadows.clone(), self.telemetry.clone());
                let result = tokio::task::spawn_blocking(move || {
                    let mut executor = executor.lock().expect("executor lock");
                    reconcile_once(&mut executor, &mut shadows.lock().expect("shadows lock"), &desired, &telemetry)
                })
                .await;
                match result {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => tracing::info!(steps = n, "reconciled"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "reconcile failed; retrying"),
                    Err(e) => tracing::error!(error = %e, "reconcile task panicked"),
                }
            }
            let _ = tokio::time::timeout(interval, rx.changed()).await;
        }
    }
}

/// One reconcile round: shadow failover, then observe, plan, execute in order. Returns the
/// number of steps.
fn reconcile_once(
    executor: &mut Executor,
    shadows: &mut ShadowPolicies,
    desired: &NodeDesired,
    telemetry: &AgentMetrics,
) -> anyhow::Result<usize> {
    executor.supervisor.check(std::time::Instant::now())?;
    // Processes the supervisor relaunched after a crash load their model again.
    executor.load_models();
    executor.runtimes.clone_from(&desired.runtimes);
    executor.refresh(desired)?;
    // Before any request reaches a router this round: who may call each service now.
    if let Some(routers) = &executor.routers {
        routers.set_callers(&desired.callers);
    }
    // Observed once a round (on real GPUs each observation asks the driver about every GPU),
    // and again only when a failover changed what runs.
    let mut observed = executor.observe()?;
    if fail_over(executor, shadows, &observed, telemetry)? {
        observed = executor.observe()?;
    }
    let steps = reconcile::plan(desired, &observed)?;
    let round = (!steps.is_empty()).then(|| crate::telemetry::tracing::reconcile_span(desired, steps.len()));
    let _round = round.as_ref().map(tracing::Span::enter);
    for step in &steps {
        tracing::debug!(?step, "executing");
        crate::telemetry::tracing::action_span(step).in_scope(|| executor.execute(step))?;
    }
    executor.route_all()?;
    for c in executor.take_cold_starts() {
        telemetry.cold_start(&c.service, &c.runtime, c.seconds);
    }
    Ok(steps.len())
}

/// The shadow policies hear what runs (`observed`), whether their standbys answer Ready, and
/// the windows the routers closed since the last round; the executor carries out what they
/// decide, and what that leads to (drained, gone) goes back to them. Returns whether a
/// process was switched or stopped.
fn fail_over(
    executor: &mut Executor,
    shadows: &mut ShadowPolicies,
    observed: &reconcile::NodeObserved,
    telemetry: &AgentMetrics,
) -> anyhow::Result<bool> {
    let mut probed = BTreeSet::new();
    let mut changed = false;
    let mut actions: VecDeque<Action> = shadows.observe(observed).into();
    actions.extend(shadows.unready_standbys().into_iter().map(Action::ProbeReady));
    let windows = executor.routers.as_ref().map(|r| r.take_windows()).unwrap_or_default();
    let mut windows = windows.into_iter();
    loop {
        let Some(action) = actions.pop_front() else {
            // Each window after what the previous ones led to has been carried out.
            match windows.next() {
                Some((service, window)) => {
                    actions.extend(shadows.on_window(&service, &window));
                    continue;
                }
                None => return Ok(changed),
            }
        };
        match &action {
            // One probe per standby and round.
            Action::ProbeReady(id) if !probed.insert(id.clone()) => continue,
            Action::Switch { from, to, reason } => {
                let service = executor.supervisor.get(to).map(|r| (r.spec.service.clone(), r.spec.slo_ms));
                if let Some((service, slo_ms)) = service {
                    match reason {
                        SwitchReason::SloViolation { p99_ms, windows } => {
                            tracing::warn!(service, p99_ms, slo_ms, windows, from, to, "p99 over the SLO: failing over to the standby")
                        }
                        SwitchReason::ActiveExited => {
                            tracing::warn!(service, from, to, "the active process exited: failing over to the standby")
                        }
                    }
                    telemetry.shadow_switch(&service);
                }
            }
            _ => {}
        }
        changed |= matches!(action, Action::Switch { .. } | Action::Stop(_));
        for event in executor.carry_out(&action)? {
            actions.extend(shadows.on_process(&event));
        }
    }
}
