//! The tuner loop (GSLICE Sec. 3.2.2, Alg. 1, at the leader): every `tune_interval` it
//! feeds the routers' latest windows to [`crate::tuning::tune_shares`] and writes the
//! committed Plan back with the new MPS shares, compare-and-set on its version. A failed write
//! (a newer plan, a lost leadership) leaves the tuners as they were, and the next tick
//! retries from the plan then committed. The tuners' averages and hold-downs are the
//! leader's soft state: a new leader starts them afresh, one hold-down after it took over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::LoopSettings;
use crate::agents::NodeReport;
use crate::api::ApiError;
use crate::controller::Controller;
use crate::resources::{Kind, Spec};
use crate::tuning::{tune_shares, Measurement, Measurements, ShareOutcome, TunerState};

pub async fn run(controller: Controller, settings: LoopSettings) {
    // A new leader does not know when the previous one last changed a share, so it lets one
    // hold-down pass before its first change could land (GSLICE Sec. 3.2.1).
    tokio::time::sleep(Duration::from_secs_f64(settings.tuning.gslice().hold_down_s)).await;
    let started = Instant::now();
    let mut state = TunerState::default();
    // Per node: when the report last fed to the tuners arrived.
    let mut fed: BTreeMap<String, Instant> = BTreeMap::new();
    let mut tick = tokio::time::interval(settings.tune_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now_s = started.elapsed().as_secs_f64();
        let pass_started = std::time::Instant::now();
        let result = pass(&controller, &settings, now_s, &mut state, &mut fed).await;
        controller.telemetry.observe_loop_pass("tuner", pass_started.elapsed());
        controller.telemetry.observe_loop_outcome("tuner", result.is_err());
        match result {
            Ok(Some(version)) => tracing::info!(version, "tuner: committed new MPS shares"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "tuning pass failed; retrying at the next tick"),
        }
    }
}

/// One pass; `Ok(Some(version))` when a plan with new shares was committed at `version`.
async fn pass(
    controller: &Controller,
    settings: &LoopSettings,
    now_s: f64,
    state: &mut TunerState,
    fed: &mut BTreeMap<String, Instant>,
) -> Result<Option<u64>, ApiError> {
    controller.read_barrier().await?;
    // Copy what the pass needs under the state lock; tune without it.
    let (current, slos_ms) = controller.read(|d| {
        let current = d.cluster.get(Kind::Plan, "current").and_then(|r| match &r.spec {
            Spec::Plan(p) => Some((r.resource_version, p.clone())),
            _ => None,
        });
        let slos_ms: BTreeMap<String, f64> = d
            .cluster
            .list(Kind::Service)
            .filter_map(|r| match &r.spec {
                Spec::Service(s) => Some((r.name.clone(), s.slo.latency_ms)),
                _ => None,
            })
            .collect();
        (current, slos_ms)
    });
    let Some((version, plan)) = current else { return Ok(None) };
    let max_age = controller.report_pace.interval(controller.read(|d| d.cluster.count(Kind::Node))) * settings.missed_heartbeats;
    // The rest is O(reports + plan): on the blocking pool, not the async workers. It tunes
    // a copy of the state: the tuners move on only with the plan they decided.
    let (reports, sm, tuning, now) = (controller.reports.clone(), controller.sm.clone(), settings.tuning, Instant::now());
    let (mut next, mut fed_copy) = (state.clone(), std::mem::take(fed));
    let (mut result, next, fed_back, plan) = super::off_runtime(settings, "tuning", move |_cancel| {
        let reports = reports.all();
        // Each reporting node's desired version, to tell converged agents from lagging ones.
        let desired: BTreeMap<String, u64> = {
            let d = sm.data.read().expect("state lock");
            reports.keys().map(|n| (n.clone(), d.cluster.desired().version(n))).collect()
        };
        let measured = fresh_measurements(&reports, &desired, now, max_age, &mut fed_copy);
        let result = tune_shares(&plan, &slos_ms, &measured, now_s, &tuning, &mut next);
        (result, next, fed_copy, plan)
    })
    .await?;
    *fed = fed_back;
    for d in &result.decisions {
        match &d.outcome {
            ShareOutcome::Changed { from_pct, to_pct } => {
                tracing::info!(workload = %d.workload, from_pct, to_pct, "tuner: GSLICE share change")
            }
            ShareOutcome::Clipped { from_pct, wanted_pct, to_pct } => {
                tracing::info!(workload = %d.workload, from_pct, wanted_pct, to_pct, "tuner: increase clipped to the GPU's free share")
            }
            ShareOutcome::NoFreeShare { from_pct, wanted_pct } => {
                tracing::info!(workload = %d.workload, from_pct, wanted_pct, "tuner: increase wanted, but the GPU has no free share")
            }
            ShareOutcome::BadSample { error } => tracing::warn!(workload = %d.workload, error, "tuner: window refused"),
            other => tracing::debug!(workload = %d.workload, outcome = ?other, gslice = ?d.gslice, "tuner: no change"),
        }
    }
    let Some(tuned) = result.plan.take() else {
        *state = next;
        return Ok(None);
    };
    // Compare-and-set: shares tuned on an older plan never overwrite a newer one. The
    // patch (O(plan)) is worked out off the async workers too.
    let change = super::off_runtime(settings, "tuning", move |_cancel| super::PlanChange::between(Some((version, &plan)), tuned)).await?;
    let outcome = super::commit_plan(controller, settings, change).await?;
    *state = next;
    Ok(Some(outcome.resource.resource_version))
}

/// The windows worth feeding to the tuners, by (node, service): from reports that arrived
/// within `max_age` (the failure detector's timeout: an older one describes a node that is
/// being planned around), that are newer than the last one fed from the same node (each
/// window counts once in the EWMAs), and whose agent has converged to its node's current
/// desired state (`applied_version` is the desired version it runs, and a node's desired
/// version is the index of the last change to it, so an agent still running an older
/// assignment reports less: its window measured the old shares).
fn fresh_measurements(
    reports: &BTreeMap<String, Arc<NodeReport>>,
    desired: &BTreeMap<String, u64>,
    now: Instant,
    max_age: Duration,
    fed: &mut BTreeMap<String, Instant>,
) -> Measurements {
    let mut measured = Measurements::new();
    for (node, r) in reports {
        let stale = now.saturating_duration_since(r.received) > max_age;
        let seen = fed.get(node).is_some_and(|&at| r.received <= at);
        if stale || seen || r.report.applied_version < desired.get(node).copied().unwrap_or(0) {
            continue;
        }
        fed.insert(node.clone(), r.received);
        for m in &r.report.metrics {
            let window = Measurement { p99_ms: m.p99_ms, throughput_rps: m.throughput_rps, arrival_rps: m.arrival_rps };
            measured.insert((node.clone(), m.service.clone()), window);
        }
    }
    fed.retain(|node, _| reports.contains_key(node));
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str, applied_version: u64, received: Instant, p99_ms: f64) -> (String, Arc<NodeReport>) {
        let metrics =
            vec![proto::ServiceMetrics { service: "web".into(), p99_ms, throughput_rps: 90.0, arrival_rps: 100.0, ..Default::default() }];
        (
            node.to_string(),
            Arc::new(NodeReport {
                report: proto::ReportRequest { node: node.into(), applied_version, metrics, ..Default::default() },
                received,
            }),
        )
    }

    #[test]
    fn only_fresh_converged_unseen_windows_are_fed() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(10);
        let max_age = Duration::from_secs(5);
        let reports: BTreeMap<String, Arc<NodeReport>> = [
            report("fresh", 7, now - Duration::from_secs(1), 80.0),
            report("stale", 7, now - Duration::from_secs(6), 80.0),
            report("behind", 6, now - Duration::from_secs(1), 80.0),
            report("ahead", 9, now - Duration::from_secs(1), 70.0),
            report("elsewhere", 3, now - Duration::from_secs(1), 75.0),
        ]
        .into_iter()
        .collect();
        let mut fed = BTreeMap::new();
        // Every node's desired state is at version 7, except "elsewhere"'s, which is at 3.
        let desired: BTreeMap<String, u64> = ["fresh", "stale", "behind", "ahead", "elsewhere"]
            .iter()
            .map(|n| (n.to_string(), if *n == "elsewhere" { 3 } else { 7 }))
            .collect();
        let measured = fresh_measurements(&reports, &desired, now, max_age, &mut fed);
        let nodes: Vec<&str> = measured.keys().map(|(n, _)| n.as_str()).collect();
        // Converged is per node: "elsewhere" runs its own node's version 3 although others are at 7.
        assert_eq!(nodes, vec!["ahead", "elsewhere", "fresh"]);
        assert_eq!(
            measured[&("fresh".to_string(), "web".to_string())],
            Measurement { p99_ms: 80.0, throughput_rps: 90.0, arrival_rps: 100.0 }
        );
        // The same reports again: already fed, nothing new.
        assert!(fresh_measurements(&reports, &desired, now, max_age, &mut fed).is_empty());
        // A newer report from one node is fed; a node that stopped reporting is forgotten.
        let newer: BTreeMap<String, Arc<NodeReport>> = [report("fresh", 7, now, 60.0)].into_iter().collect();
        let measured = fresh_measurements(&newer, &desired, now, max_age, &mut fed);
        assert_eq!(measured[&("fresh".to_string(), "web".to_string())].p99_ms, 60.0);
        assert_eq!(fed.keys().collect::<Vec<_>>(), vec!["fresh"]);
    }
}
