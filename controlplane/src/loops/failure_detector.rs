//! The failure detector: a node is marked unhealthy in its status (the provisioner then
//! plans around it) when either
//! - its agent ended the desired-state stream it last reported holding and has not reported
//!   since, for longer than `watch_grace` (the fast path: a dead process or host closes its
//!   stream or misses its connection's keep-alive; `agents::watch_ends`), or
//! - its agent has not reported for `missed × interval` (the backstop for an agent that hangs
//!   with its stream open). The interval is the one agents are told to report at, which
//!   grows with the fleet (`agents::report_pace`).
//!
//! Its next report marks it healthy again. Heartbeats and ended streams are kept in the
//! leader's memory, so a new leader first gives every node a full timeout from the moment it
//! took over; ended streams, which every controller sends again to each new leader, count
//! once it learns of them (one report interval later for a node it has not heard from).

use std::time::Duration;

use tokio::time::Instant;

use super::runner::{Pass, Reconciler, Settled, Write};
use super::LoopSettings;
use crate::agents::report_pace::OverdueTimeout;
use crate::agents::Heard;
use crate::controller::Controller;
use crate::resources::{Kind, NodeStatus, StatusJson};
use crate::state::Command;

/// How long the failure detector waits for each signal.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// Since the last report (or `since`, when never).
    pub report_timeout: Duration,
    /// Since the leader learnt the node's agent ended its stream.
    pub watch_grace: Duration,
}

/// Nodes overdue at `now`: last heard of (or `since`, when never) more than the report
/// timeout ago, or whose stream ended more than the grace ago with no report since.
pub fn overdue(nodes: &[String], heard: &Heard, since: Instant, now: Instant, patience: Patience) -> Vec<String> {
    nodes.iter().filter(|n| is_overdue(n, heard, since, now, patience)).cloned().collect()
}

/// Whether `node` is overdue at `now` (see [`overdue`]).
fn is_overdue(node: &str, heard: &Heard, since: Instant, now: Instant, patience: Patience) -> bool {
    let late = |at: Instant, by: Duration| now.saturating_duration_since(at) > by;
    late(heard.reported.get(node).copied().unwrap_or(since).max(since), patience.report_timeout)
        || heard.watch_ended.get(node).is_some_and(|at| late(*at, patience.watch_grace))
}

/// How long ago, at `now`, the live node heard of least recently reported: the age of the
/// oldest metrics the loops read. A node marked unhealthy, or whose agent's stream ended,
/// is not live (its silence is the detector's to judge); one not heard of since this
/// leader took over has no metrics here yet. `None`: no live node heard of.
pub fn oldest_live_report(nodes: &[(String, StatusJson)], heard: &Heard, now: Instant) -> Option<Duration> {
    nodes
        .iter()
        .filter(|(name, status)| !heard.watch_ended.contains_key(name) && !NodeStatus::is_unhealthy(status))
        .filter_map(|(name, _)| heard.reported.get(name))
        .map(|at| now.saturating_duration_since(*at))
        .max()
}

pub async fn run(controller: Controller, settings: LoopSettings) {
    let nodes = controller.read(|d| d.cluster.count(Kind::Node));
    let detector = FailureDetector::new(&settings, controller.report_pace.interval(nodes), Instant::now());
    super::runner::run(controller, settings, detector).await
}

/// The failure detector as a leader loop (`loops::runner`).
pub(crate) struct FailureDetector {
    /// When this controller took over: a node never heard of gets its full timeout from here.
    since: Instant,
    timeouts: OverdueTimeout,
    heartbeat: Duration,
    watch_grace: Duration,
    /// This pass's marks, in the order of its writes, with why and after what timeout.
    marking: Vec<(String, &'static str)>,
    timeout: Duration,
    /// Nodes deleted since they were heard of: the reports forget them once the pass is done.
    gone: Vec<String>,
    /// This pass's [`oldest_live_report`], published once it settles.
    oldest_report: Option<Duration>,
}

/// What a pass reads: every node's status (shared, not copied), what the leader heard, and
/// the interval agents are told to report at.
pub(crate) struct NodesHeard {
    nodes: Vec<(String, crate::resources::StatusJson)>,
    heard: Heard,
    /// Nodes heard of whose Node is deleted.
    gone: Vec<String>,
    report_interval: Duration,
}

impl FailureDetector {
    pub(crate) fn new(settings: &LoopSettings, report_interval: Duration, now: Instant) -> Self {
        FailureDetector {
            since: now,
            timeouts: OverdueTimeout::new(settings.missed_heartbeats, report_interval, 0.0),
            heartbeat: settings.heartbeat_interval,
            watch_grace: settings.watch_grace,
            marking: Vec::new(),
            timeout: Duration::ZERO,
            gone: Vec::new(),
            oldest_report: None,
        }
    }
}

impl Reconciler for FailureDetector {
    const NAME: &'static str = "failure_detector";
    type View = NodesHeard;

    fn interval(&self) -> Duration {
        self.heartbeat
    }

    fn view(&mut self, controller: &Controller) -> NodesHeard {
        let heard = controller.reports.last_heard();
        let (nodes, gone) = controller.read(|d| {
            let nodes: Vec<_> = d.cluster.list(Kind::Node).map(|n| (n.name.clone(), n.status.clone())).collect();
            let gone = heard.reported.keys().chain(heard.watch_ended.keys()).filter(|n| d.cluster.get(Kind::Node, n).is_none());
            (nodes, gone.cloned().collect())
        });
        let report_interval = controller.report_pace.interval(nodes.len());
        NodesHeard { nodes, heard, gone, report_interval }
    }

    fn pass(&mut self, view: NodesHeard, now: Instant, _cancelled: &dyn Fn() -> bool) -> Pass {
        let NodesHeard { nodes, heard, gone, report_interval } = view;
        self.gone = gone;
        self.oldest_report = oldest_live_report(&nodes, &heard, now);
        self.timeout = self.timeouts.at(report_interval, now.saturating_duration_since(self.since).as_secs_f64());
        let patience = Patience { report_timeout: self.timeout, watch_grace: self.watch_grace };
        self.marking.clear();
        let mut pass = Pass::default();
        for (name, status) in nodes.iter().filter(|(n, _)| is_overdue(n, &heard, self.since, now, patience)) {
            // Already marked: nothing to write.
            let Some(marked) = NodeStatus::marked_unhealthy(&status.to_value()) else { continue };
            let why = if heard.watch_ended.contains_key(name) { "its agent's stream ended" } else { "it missed its heartbeats" };
            self.marking.push((name.clone(), why));
            // Repeatable: marking a node unhealthy again is the same write, and a
            // de-duplication record would hold the whole Node after it (a few KB each) for
            // every node of a mass failure.
            let command = Command::PutStatus { kind: Kind::Node, name: name.clone(), status: marked.into(), expected_version: 0 };
            pass.writes.push(Write::Command { command, repeatable: true });
        }
        pass
    }

    fn settled(&mut self, controller: &Controller, settled: Settled) {
        controller.reports.forget(&std::mem::take(&mut self.gone));
        if let Some(age) = self.oldest_report.take() {
            controller.telemetry.observe_report_age_max(age);
        }
        for ((name, why), result) in self.marking.drain(..).zip(settled.writes) {
            match result {
                // Its next report turns it healthy again: the mark dropped the digest of the
                // report the status was written from (`NodeStatus::marked_unhealthy`).
                Ok(_) => tracing::warn!(node = %name, timeout_ms = self.timeout.as_millis() as u64, why, "node marked unhealthy"),
                Err(e) => tracing::warn!(node = %name, error = %e, "could not mark the node unhealthy"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(reported: &[(&str, u64)], ended: &[(&str, u64)], t0: Instant) -> Heard {
        let at = |s: u64| t0 + Duration::from_secs(s);
        Heard {
            reported: reported.iter().map(|(n, s)| (n.to_string(), at(*s))).collect(),
            watch_ended: ended.iter().map(|(n, s)| (n.to_string(), at(*s))).collect(),
        }
    }

    #[test]
    fn a_node_is_overdue_only_after_the_timeout_from_its_last_report_or_the_takeover() {
        let t0 = Instant::now();
        let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let heard = heard(&[("a", 8), ("b", 1)], &[], t0);
        let patience = Patience { report_timeout: Duration::from_secs(5), watch_grace: Duration::from_secs(2) };
        // c never reported to this leader: it gets the full timeout from the takeover at t0.
        let at = |s| t0 + Duration::from_secs(s);
        assert!(overdue(&nodes, &heard, t0, at(4), patience).is_empty());
        assert_eq!(overdue(&nodes, &heard, t0, at(6), patience), vec!["c".to_string()]);
        assert_eq!(overdue(&nodes, &heard, t0, at(7), patience), vec!["b".to_string(), "c".to_string()]);
        assert_eq!(overdue(&nodes, &heard, t0, at(14), patience), nodes);
    }

    #[test]
    fn a_node_whose_stream_ended_is_overdue_after_the_grace_long_before_the_report_timeout() {
        let t0 = Instant::now();
        let nodes: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        // Both reported at 10; a's stream ended at 11 (no report since), b's never did.
        let heard = heard(&[("a", 10), ("b", 10)], &[("a", 11)], t0);
        let patience = Patience { report_timeout: Duration::from_secs(25), watch_grace: Duration::from_secs(2) };
        let at = |s| t0 + Duration::from_secs(s);
        assert!(overdue(&nodes, &heard, t0, at(13), patience).is_empty(), "within the grace");
        assert_eq!(overdue(&nodes, &heard, t0, at(14), patience), vec!["a".to_string()]);
        assert_eq!(overdue(&nodes, &heard, t0, at(36), patience), nodes, "b by the report timeout");
        // A node deleted since its stream ended is not marked.
        assert!(overdue(&nodes[1..], &heard, t0, at(14), patience).is_empty());
    }

    #[test]
    fn the_oldest_report_is_that_of_the_live_node_heard_of_least_recently() {
        let t0 = Instant::now();
        let status = |h: crate::resources::Health| StatusJson::from(serde_json::json!({"health": h.as_str()}));
        let healthy = status(crate::resources::Health::Healthy);
        let nodes: Vec<(String, StatusJson)> = vec![
            ("fresh".into(), healthy.clone()),
            ("older".into(), healthy.clone()),
            ("never".into(), healthy.clone()),
            ("marked".into(), status(crate::resources::Health::Unhealthy)),
            ("ended".into(), healthy.clone()),
        ];
        // At 10 s: "fresh" reported at 9, "older" at 6; "marked" (at 1) is marked unhealthy
        // and "ended" (at 2) ended its stream: neither counts, nor does "never".
        let heard = heard(&[("fresh", 9), ("older", 6), ("marked", 1), ("ended", 2)], &[("ended", 3)], t0);
        let now = t0 + Duration::from_secs(10);
        assert_eq!(oldest_live_report(&nodes, &heard, now), Some(Duration::from_secs(4)));
        assert_eq!(oldest_live_report(&nodes[2..4], &heard, now), None, "no live node heard of");
    }

    #[test]
    fn a_pass_marks_the_overdue_nodes_not_marked_yet() {
        let t0 = Instant::now();
        let settings = LoopSettings { missed_heartbeats: 5, heartbeat_interval: Duration::from_secs(1), ..LoopSettings::default() };
        let mut detector = FailureDetector::new(&settings, Duration::from_secs(1), t0);
        let status = |h: crate::resources::Health| crate::resources::StatusJson::from(serde_json::json!({"health": h.as_str()}));
        let view = NodesHeard {
            nodes: vec![
                ("a".into(), status(crate::resources::Health::Healthy)),
                ("b".into(), status(crate::resources::Health::Unhealthy)),
                ("c".into(), status(crate::resources::Health::Healthy)),
            ],
            // c reported a second ago.
            heard: heard(&[("c", 9)], &[], t0),
            gone: Vec::new(),
            report_interval: Duration::from_secs(1),
        };
        let pass = detector.pass(view, t0 + Duration::from_secs(10), &|| false);
        let marked: Vec<(&str, bool)> = pass
            .writes
            .iter()
            .map(|w| match w {
                Write::Command { command: Command::PutStatus { name, status, .. }, repeatable } => {
                    assert!(NodeStatus::is_unhealthy(status), "{status}");
                    (name.as_str(), *repeatable)
                }
                _ => panic!("only status writes"),
            })
            .collect();
        // a was never heard of since the takeover 10 s ago; b is overdue but already marked.
        assert_eq!(marked, vec![("a", true)]);
    }
}
