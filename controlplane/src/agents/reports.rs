//! The latest report of every agent, and the desired-state streams that agents ended, kept
//! in the leader's memory. Soft state: lost on a failover and rebuilt from the next round of
//! reports (ARCHITECTURE.md, "Controller internals"), so it never goes through Raft.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A service's latest window summed over the nodes that serve it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServiceWindow {
    pub arrival_rps: f64,
    /// The worst p99 of the nodes that run the current plan and completed requests, ms.
    pub p99_ms: Option<f64>,
}

/// One agent's latest report and when it arrived.
#[derive(Clone, Debug)]
pub struct NodeReport {
    pub report: proto::ReportRequest,
    pub received: Instant,
}

/// Reports are kept behind `Arc`s: the loops and `/metrics` copy pointers, never the
/// reports, under the lock every Report call takes.
#[derive(Clone, Default)]
pub struct AgentReports {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    latest: HashMap<String, Arc<NodeReport>>,
    /// Nodes whose agent ended the stream it last reported holding: that stream's session,
    /// and when the leader learnt it; cleared by a report naming another stream. At most
    /// one entry per node.
    watch_ended: HashMap<String, (u64, Instant)>,
}

impl AgentReports {
    /// Records `report`; returns the previous one of the same node. A report from a stream
    /// other than the one that ended clears the end; one naming the ended stream does not
    /// (it was sent before the end, and arrived after it: a host that died right after
    /// reporting).
    pub fn record(&self, report: proto::ReportRequest, now: Instant) -> Option<Arc<NodeReport>> {
        let node = report.node.clone();
        let mut inner = self.inner.lock().expect("reports lock");
        if inner.watch_ended.get(&node).is_some_and(|(ended, _)| *ended != report.watch_session) {
            inner.watch_ended.remove(&node);
        }
        inner.latest.insert(node, Arc::new(NodeReport { report, received: now }))
    }

    /// `node`'s agent ended its desired-state stream `session` (its connection closed, or
    /// the agent closed the stream). Taken as a sign the agent is gone unless the agent has
    /// reported a different stream since (it moved to another controller; the end of the
    /// old stream can reach the leader after the report on the new one). Session 0 (an
    /// agent that does not name its streams) says nothing. A repeat keeps the first time:
    /// it does not push the grace further out.
    ///
    /// The end of a node this leader has no report of (it took over since, or the agent
    /// never reported) cannot be checked that way: the agent may have moved and reported
    /// its new stream to the former leader. It counts from `unheard_wait` (one report
    /// interval) later, by when a live agent has reported here and cleared it, unless the
    /// controllers' open streams settle it sooner ([`AgentReports::end_confirmed`],
    /// [`AgentReports::end_refuted`]).
    pub fn watch_ended(&self, node: &str, session: u64, now: Instant, unheard_wait: Duration) -> EndTaken {
        if session == 0 {
            return EndTaken::No;
        }
        let mut inner = self.inner.lock().expect("reports lock");
        let (taken, counts_from) = match inner.latest.get(node) {
            Some(r) if r.report.watch_session != session => return EndTaken::No,
            Some(_) => (EndTaken::Now, now),
            None => (EndTaken::Unheard, now + unheard_wait),
        };
        match inner.watch_ended.entry(node.to_string()) {
            std::collections::hash_map::Entry::Occupied(_) => EndTaken::No,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((session, counts_from));
                taken
            }
        }
    }

    /// No controller holds a stream of `node` open any more (asked at `asked_at`): its end
    /// of `session` counts from then, if it counted from later.
    pub fn end_confirmed(&self, node: &str, session: u64, asked_at: Instant) {
        let mut inner = self.inner.lock().expect("reports lock");
        if let Some((ended, counts_from)) = inner.watch_ended.get_mut(node) {
            if *ended == session && asked_at < *counts_from {
                *counts_from = asked_at;
            }
        }
    }

    /// `node`'s agent holds another stream open on some controller: its end of `session`
    /// is old news.
    pub fn end_refuted(&self, node: &str, session: u64) {
        let mut inner = self.inner.lock().expect("reports lock");
        if inner.watch_ended.get(node).is_some_and(|(ended, _)| *ended == session) {
            inner.watch_ended.remove(node);
        }
    }

    /// Forgets what is kept of `nodes` (deleted: nothing else would clear their entries, and
    /// their last metrics would count for ever).
    pub fn forget(&self, nodes: &[String]) {
        let mut inner = self.inner.lock().expect("reports lock");
        for n in nodes {
            inner.latest.remove(n);
            inner.watch_ended.remove(n);
        }
    }

    pub fn get(&self, node: &str) -> Option<Arc<NodeReport>> {
        self.inner.lock().expect("reports lock").latest.get(node).cloned()
    }

    /// Each service's window over the nodes' latest reports: arrivals summed over them
    /// all, and the worst p99 of those whose agent `converged(node, applied_version)` to
    /// the node's current desired state (a window of an agent still applying a change
    /// measured the old configuration). One pass under the lock, without copying the
    /// reports (the autoscaler's view, every second).
    pub fn windows_by_service(&self, converged: impl Fn(&str, u64) -> bool) -> BTreeMap<String, ServiceWindow> {
        let inner = self.inner.lock().expect("reports lock");
        let mut out: BTreeMap<String, ServiceWindow> = BTreeMap::new();
        for (node, r) in &inner.latest {
            let applied = converged(node, r.report.applied_version);
            for m in &r.report.metrics {
                let w = match out.get_mut(m.service.as_str()) {
                    Some(w) => w,
                    None => out.entry(m.service.clone()).or_default(),
                };
                w.arrival_rps += m.arrival_rps;
                if applied && m.p99_ms > 0.0 && m.arrival_rps > 0.0 {
                    w.p99_ms = Some(w.p99_ms.map_or(m.p99_ms, |p| p.max(m.p99_ms)));
                }
            }
        }
        out
    }

    /// Every node's latest report, in node order.
    pub fn all(&self) -> BTreeMap<String, Arc<NodeReport>> {
        self.inner.lock().expect("reports lock").latest.iter().map(|(n, r)| (n.clone(), r.clone())).collect()
    }

    /// When each node last reported, and when the leader learnt that each node whose
    /// watch ended without a report since ended it.
    pub fn last_heard(&self) -> Heard {
        let inner = self.inner.lock().expect("reports lock");
        Heard {
            reported: inner.latest.iter().map(|(n, r)| (n.clone(), r.received)).collect(),
            watch_ended: inner.watch_ended.iter().map(|(n, (_, at))| (n.clone(), *at)).collect(),
        }
    }
}

/// How the leader took the end of a stream ([`AgentReports::watch_ended`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndTaken {
    /// Not taken: the end of an older or unnamed stream, or a repeat.
    No,
    /// The end of the stream the node last reported: it counts from now.
    Now,
    /// The end of a node this leader has no report of: it counts from one report interval
    /// on, unless the controllers' open streams settle it sooner.
    Unheard,
}

/// What the failure detector goes by (see [`AgentReports::last_heard`]).
#[derive(Clone, Debug, Default)]
pub struct Heard {
    pub reported: HashMap<String, Instant>,
    pub watch_ended: HashMap<String, Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    fn report(node: &str, watch_session: u64) -> proto::ReportRequest {
        proto::ReportRequest { node: node.into(), watch_session, ..Default::default() }
    }

    #[test]
    fn windows_sum_arrivals_over_every_nodes_latest_report_and_take_the_worst_converged_p99() {
        let reports = AgentReports::default();
        let t0 = Instant::now();
        let with = |node: &str, applied_version: u64, rates: &[(&str, f64, f64)]| proto::ReportRequest {
            applied_version,
            metrics: rates
                .iter()
                .map(|(s, r, p99_ms)| proto::ServiceMetrics {
                    service: s.to_string(),
                    arrival_rps: *r,
                    p99_ms: *p99_ms,
                    ..Default::default()
                })
                .collect(),
            ..report(node, 1)
        };
        reports.record(with("a", 3, &[("web", 10.0, 40.0), ("ocr", 1.0, 0.0)]), t0);
        reports.record(with("b", 3, &[("web", 5.0, 90.0)]), t0);
        // Only a node's latest report counts.
        reports.record(with("b", 3, &[("web", 7.0, 50.0)]), t0 + Duration::from_secs(1));
        // "c" still applies version 4: its arrivals count, its p99 (of the old shares) does not.
        reports.record(with("c", 3, &[("web", 2.0, 500.0)]), t0);
        let desired = |node: &str| if node == "c" { 4 } else { 3 };
        let windows = reports.windows_by_service(|node, applied| applied >= desired(node));
        assert_eq!(windows["web"], ServiceWindow { arrival_rps: 19.0, p99_ms: Some(50.0) });
        assert_eq!(windows["ocr"], ServiceWindow { arrival_rps: 1.0, p99_ms: None }, "nothing completed, no p99");
    }

    #[test]
    fn the_end_of_the_stream_an_agent_last_reported_counts_until_its_next_report() {
        let reports = AgentReports::default();
        let t0 = Instant::now();
        reports.record(report("a", 7), t0);
        assert_eq!(reports.watch_ended("a", 7, t0 + Duration::from_secs(1), WAIT), EndTaken::Now);
        // A repeat keeps the first time.
        assert_eq!(reports.watch_ended("a", 7, t0 + Duration::from_secs(2), WAIT), EndTaken::No);
        assert_eq!(reports.last_heard().watch_ended.get("a"), Some(&(t0 + Duration::from_secs(1))));
        // A report the agent sent from the ended stream, arriving late, does not clear it.
        reports.record(report("a", 7), t0 + Duration::from_secs(2));
        assert_eq!(reports.last_heard().watch_ended.get("a"), Some(&(t0 + Duration::from_secs(1))));
        // The agent came back on a new stream and said so.
        reports.record(report("a", 8), t0 + Duration::from_secs(3));
        assert!(reports.last_heard().watch_ended.is_empty());
    }

    #[test]
    fn the_end_of_an_older_stream_or_of_an_unnamed_one_says_nothing() {
        let reports = AgentReports::default();
        let t0 = Instant::now();
        // The agent moved to another controller and reported its new stream before the
        // old controller's word of the old one arrived.
        reports.record(report("a", 8), t0);
        assert_eq!(reports.watch_ended("a", 7, t0, WAIT), EndTaken::No);
        // Agents that do not name their streams.
        reports.record(report("b", 0), t0);
        assert_eq!(reports.watch_ended("b", 0, t0, WAIT), EndTaken::No);
        assert!(reports.last_heard().watch_ended.is_empty());
        // A node this leader has not heard from yet: the end counts (a new leader learns
        // of a dead agent without waiting for the report timeout), from one report interval
        // on, in which an agent that moved reports its new stream here.
        assert_eq!(reports.watch_ended("c", 3, t0, WAIT), EndTaken::Unheard);
        assert_eq!(reports.last_heard().watch_ended.into_iter().collect::<Vec<_>>(), [("c".to_string(), t0 + WAIT)]);
        assert_eq!(reports.watch_ended("moved", 4, t0, WAIT), EndTaken::Unheard);
        reports.record(report("moved", 5), t0 + Duration::from_secs(1));
        assert!(!reports.last_heard().watch_ended.contains_key("moved"));
        // Deleted nodes are forgotten, their reports and ended streams alike.
        reports.forget(&["a".to_string(), "c".to_string(), "moved".to_string()]);
        let heard = reports.last_heard();
        assert_eq!(heard.reported.keys().map(String::as_str).collect::<Vec<_>>(), ["b"]);
        assert!(heard.watch_ended.is_empty());
    }

    #[test]
    fn the_open_streams_confirm_an_unheard_end_sooner_or_refute_it() {
        let reports = AgentReports::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(20);
        for (node, session) in [("dead", 1), ("moved", 2), ("late", 3)] {
            assert_eq!(reports.watch_ended(node, session, t0, WAIT), EndTaken::Unheard);
        }
        // Nobody holds "dead"'s stream: its end counts from when they were asked, not
        // from a report interval later. "moved" holds another one somewhere.
        reports.end_confirmed("dead", 1, t1);
        reports.end_refuted("moved", 2);
        // Answers about another stream than the one that ended change nothing.
        reports.end_confirmed("late", 4, t1);
        reports.end_refuted("late", 4);
        let ended = reports.last_heard().watch_ended;
        assert_eq!(ended.get("dead"), Some(&t1));
        assert!(!ended.contains_key("moved"));
        assert_eq!(ended.get("late"), Some(&(t0 + WAIT)));
        // A confirmation never pushes an end further out.
        reports.end_confirmed("dead", 1, t1 + WAIT);
        assert_eq!(reports.last_heard().watch_ended.get("dead"), Some(&t1));
    }
}
