//! The failure detector: a node whose agent has not reported for `missed × interval` is
//! marked unhealthy in its status (the provisioner then plans around it); its next report
//! marks it healthy again. The interval is the one agents are told to report at, which
//! grows with the fleet (`agents::report_pace`). Heartbeats are the agents' reports, kept in the leader's memory,
//! so a new leader first gives every node a full timeout from the moment it took over.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::LoopSettings;
use crate::agents::report_pace::OverdueTimeout;
use crate::controller::Controller;
use crate::resources::Kind;
use crate::state::{Command, Request};

/// The health a node's status carries.
pub const UNHEALTHY: &str = "unhealthy";

/// Nodes overdue at `now`: last heard of (or `since`, when never) more than `timeout` ago.
pub fn overdue(nodes: &[String], last_report: &HashMap<String, Instant>, since: Instant, now: Instant, timeout: Duration) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| now.saturating_duration_since(last_report.get(*n).copied().unwrap_or(since).max(since)) > timeout)
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
        let reports = controller.reports.last_heard();
        // Names only: statuses are copied for the overdue nodes alone.
        let names: Vec<String> = controller.read(|d| d.cluster.list(Kind::Node).map(|n| n.name.clone()).collect());
        let now = Instant::now();
        let timeout = timeouts.at(controller.report_pace.interval(names.len()), seconds(now));
        for name in overdue(&names, &reports, since, now, timeout) {
            let status = controller.read(|d| d.cluster.get(Kind::Node, &name).map(|n| n.status.clone())).unwrap_or_default();
            if status.get("health").and_then(|h| h.as_str()) == Some(UNHEALTHY) {
                continue;
            }
            let mut marked = if status.is_object() { status } else { serde_json::json!({}) };
            marked["health"] = serde_json::Value::from(UNHEALTHY);
            // No request id: marking a node unhealthy again is the same write, and a
            // de-duplication record would hold the whole Node after it (a few KB each, kept
            // in every snapshot for 100,000 writes) for every node of a mass failure.
            let write = Request {
                request_id: String::new(),
                command: Command::PutStatus { kind: Kind::Node, name: name.clone(), status: marked, expected_version: 0 },
                trace_parent: None,
            };
            match controller.write(write).await {
                Ok(_) => {
                    // Its next report must turn it healthy again, whatever was written before.
                    controller.status_writer.forget(&name);
                    tracing::warn!(node = %name, timeout_ms = timeout.as_millis() as u64, "node missed its heartbeats: marked unhealthy")
                }
                Err(e) => tracing::warn!(node = %name, error = %e, "could not mark the node unhealthy"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_overdue_only_after_the_timeout_from_its_last_report_or_the_takeover() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(5);
        let nodes = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let mut last = HashMap::new();
        last.insert("a".to_string(), t0 + Duration::from_secs(8));
        last.insert("b".to_string(), t0 + Duration::from_secs(1));
        // c never reported to this leader: it gets the full timeout from the takeover at t0.
        let at = |s| t0 + Duration::from_secs(s);
        assert!(overdue(&nodes, &last, t0, at(4), timeout).is_empty());
        assert_eq!(overdue(&nodes, &last, t0, at(6), timeout), vec!["c".to_string()]);
        assert_eq!(overdue(&nodes, &last, t0, at(7), timeout), vec!["b".to_string(), "c".to_string()]);
        assert_eq!(overdue(&nodes, &last, t0, at(14), timeout), nodes);
    }
}
