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

use futures::StreamExt;

use tokio::time::Instant;

use super::LoopSettings;
use crate::agents::report_pace::OverdueTimeout;
use crate::agents::Heard;
use crate::controller::Controller;
use crate::resources::{Kind, NodeStatus};
use crate::state::{Command, Request};

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
    let late = |at: Instant, by: Duration| now.saturating_duration_since(at) > by;
    nodes
        .iter()
        .filter(|n| {
            late(heard.reported.get(*n).copied().unwrap_or(since).max(since), patience.report_timeout)
                || heard.watch_ended.get(*n).is_some_and(|at| late(*at, patience.watch_grace))
        })
        .cloned()
        .collect()
}

pub async fn run(controller: Controller, settings: LoopSettings) {
    let since = Instant::now();
    let seconds = |now: Instant| now.saturating_duration_since(since).as_secs_f64();
    let nodes = controller.read(|d| d.cluster.count(Kind::Node));
    let mut timeouts = OverdueTimeout::new(settings.missed_heartbeats, controller.report_pace.interval(nodes), 0.0);
    let mut tick = tokio::time::interval(settings.heartbeat_interval);
    loop {
        tick.tick().await;
        let _pass = controller.telemetry.time_loop_pass("failure_detector");
        let heard = controller.reports.last_heard();
        // Names only: statuses are copied for the overdue nodes alone.
        let (names, gone): (Vec<String>, Vec<String>) = controller.read(|d| {
            let gone = heard.reported.keys().chain(heard.watch_ended.keys()).filter(|n| d.cluster.get(Kind::Node, n).is_none()).cloned();
            (d.cluster.list(Kind::Node).map(|n| n.name.clone()).collect(), gone.collect())
        });
        controller.reports.forget(&gone);
        let now = Instant::now();
        let timeout = timeouts.at(controller.report_pace.interval(names.len()), seconds(now));
        let patience = Patience { report_timeout: timeout, watch_grace: settings.watch_grace };
        // Marked concurrently: one at a time, a mass failure of a hundred hosts took seconds
        // of commit round trips to mark.
        futures::stream::iter(overdue(&names, &heard, since, now, patience))
            .for_each_concurrent(MARKS_IN_FLIGHT, |name| {
                let why = if heard.watch_ended.contains_key(&name) { "its agent's stream ended" } else { "it missed its heartbeats" };
                mark_unhealthy(&controller, name, why, timeout)
            })
            .await;
    }
}

/// Unhealthy marks proposed at once.
const MARKS_IN_FLIGHT: usize = 64;

async fn mark_unhealthy(controller: &Controller, name: String, why: &str, timeout: Duration) {
    let status = controller.read(|d| d.cluster.get(Kind::Node, &name).map(|n| n.status.clone())).unwrap_or_default();
    let Some(marked) = NodeStatus::marked_unhealthy(&status) else { return };
    // No request id: marking a node unhealthy again is the same write, and a de-duplication
    // record would hold the whole Node after it (a few KB each, kept in every snapshot for
    // 100,000 writes) for every node of a mass failure.
    let write = Request {
        request_id: String::new(),
        command: Command::PutStatus { kind: Kind::Node, name: name.clone(), status: marked.into(), expected_version: 0 },
        trace_parent: None,
    };
    match controller.write(write).await {
        Ok(_) => {
            // Its next report must turn it healthy again, whatever was written before.
            controller.status_writer.forget(&name);
            tracing::warn!(node = %name, timeout_ms = timeout.as_millis() as u64, why, "node marked unhealthy")
        }
        Err(e) => tracing::warn!(node = %name, error = %e, "could not mark the node unhealthy"),
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
}
