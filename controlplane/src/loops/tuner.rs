//! The tuner loop (GSLICE Sec. 3.2.2, Alg. 1, at the leader): every `tune_interval` it
//! feeds the routers' latest windows to [`crate::tuning::tune_shares`] and writes the
//! committed Plan back with the new MPS shares, compare-and-set on its version. A failed write
//! (a newer plan, a lost leadership) leaves the tuners as they were, and the next tick
//! retries from the plan then committed. The tuners' averages and hold-downs are the
//! leader's soft state: a new leader starts them afresh, one hold-down after it took over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::runner::{Pass, Reconciler, Settled, Write};
use super::{LoopSettings, PlanChange};
use crate::agents::NodeReport;
use crate::controller::Controller;
use crate::resources::{Kind, PlanSpec, Spec};
use crate::tuning::{tune_shares, Measurement, Measurements, ShareDecision, ShareOutcome, TunerState, TuningSettings};

pub async fn run(controller: Controller, settings: LoopSettings) {
    let tuner = Tuner::new(&settings);
    super::runner::run(controller, settings, tuner).await
}

/// The tuner as a leader loop (`loops::runner`).
pub(crate) struct Tuner {
    interval: Duration,
    hold_down: Duration,
    missed_heartbeats: u32,
    tuning: TuningSettings,
    /// The first pass: GSLICE's clock starts there.
    started: Option<Instant>,
    state: TunerState,
    /// The tuners after this pass's decisions: theirs once its plan is committed.
    next: Option<TunerState>,
    /// Per node: when the report last fed to the tuners arrived.
    fed: BTreeMap<String, Instant>,
    decisions: Vec<ShareDecision>,
}

/// What a pass reads: the committed plan at its version, the services' SLOs, the latest
/// reports and each reporting node's desired version.
pub(crate) struct TunerView {
    current: Option<(u64, PlanSpec)>,
    slos_ms: BTreeMap<String, f64>,
    reports: BTreeMap<String, Arc<NodeReport>>,
    desired: BTreeMap<String, u64>,
    /// Reports older than this describe nodes being planned around (the failure detector's
    /// timeout).
    max_age: Duration,
}

impl Tuner {
    pub(crate) fn new(settings: &LoopSettings) -> Self {
        Tuner {
            interval: settings.tune_interval,
            hold_down: Duration::from_secs_f64(settings.tuning.gslice().hold_down_s),
            missed_heartbeats: settings.missed_heartbeats,
            tuning: settings.tuning,
            started: None,
            state: TunerState::default(),
            next: None,
            fed: BTreeMap::new(),
            decisions: Vec::new(),
        }
    }
}

impl Reconciler for Tuner {
    const NAME: &'static str = "tuner";
    // It rewrites the plan: read what the last leader committed.
    const READ_BARRIER: bool = true;
    // O(reports + plan).
    const LONG_PASS: bool = true;
    type View = TunerView;

    fn interval(&self) -> Duration {
        self.interval
    }

    /// A new leader does not know when the previous one last changed a share, so it lets one
    /// hold-down pass before its first change could land (GSLICE Sec. 3.2.1).
    fn first_wait(&self) -> Duration {
        self.hold_down
    }

    fn view(&mut self, controller: &Controller) -> TunerView {
        let reports = controller.reports.all();
        controller.read(|d| {
            let current = d.cluster.get(Kind::Plan, "current").and_then(|r| match &r.spec {
                Spec::Plan(p) => Some((r.resource_version, p.clone())),
                _ => None,
            });
            let slos_ms = d
                .cluster
                .list(Kind::Service)
                .filter_map(|r| match &r.spec {
                    Spec::Service(s) => Some((r.name.clone(), s.slo.latency_ms)),
                    _ => None,
                })
                .collect();
            let desired = reports.keys().map(|n| (n.clone(), d.cluster.desired().version(n))).collect();
            let max_age = controller.report_pace.interval(d.cluster.count(Kind::Node)) * self.missed_heartbeats;
            TunerView { current, slos_ms, reports, desired, max_age }
        })
    }

    fn pass(&mut self, view: TunerView, now: Instant, _cancelled: &dyn Fn() -> bool) -> Pass {
        let now_s = now.saturating_duration_since(*self.started.get_or_insert(now)).as_secs_f64();
        let Some((version, plan)) = view.current else { return Pass::default() };
        let measured = fresh_measurements(&view.reports, &view.desired, now, view.max_age, &mut self.fed);
        // The tuners move on only with the plan they decided.
        let mut next = self.state.clone();
        let mut result = tune_shares(&plan, &view.slos_ms, &measured, now_s, &self.tuning, &mut next);
        self.decisions = std::mem::take(&mut result.decisions);
        let mut pass = Pass::default();
        match result.plan.take() {
            // Compare-and-set: shares tuned on an older plan never overwrite a newer one.
            Some(tuned) => {
                self.next = Some(next);
                pass.writes.push(Write::Plan(PlanChange::between(Some((version, &plan)), tuned)));
            }
            None => self.state = next,
        }
        pass
    }

    fn settled(&mut self, _controller: &Controller, settled: Settled) {
        for d in self.decisions.drain(..) {
            log_decision(&d);
        }
        let next = self.next.take();
        match (next, settled.writes.into_iter().next()) {
            (Some(next), Some(Ok(version))) => {
                self.state = next;
                tracing::info!(version, "tuner: committed new MPS shares");
            }
            // A newer plan, or a lost leadership: the tuners stay as they were, and the next
            // pass retries from the plan then committed.
            (Some(_), Some(Err(e))) => tracing::warn!(error = %e, "tuning pass failed; retrying at the next tick"),
            _ => {}
        }
    }
}

fn log_decision(d: &ShareDecision) {
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
