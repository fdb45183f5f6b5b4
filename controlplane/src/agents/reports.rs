//! The latest report of every agent, kept in the leader's memory. Soft state: lost on a
//! failover and rebuilt from the next round of reports (ARCHITECTURE.md, "Controller
//! internals"), so it never goes through Raft.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

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
    inner: Arc<Mutex<HashMap<String, Arc<NodeReport>>>>,
}

impl AgentReports {
    /// Records `report`; returns the previous one of the same node.
    pub fn record(&self, report: proto::ReportRequest, now: Instant) -> Option<Arc<NodeReport>> {
        let node = report.node.clone();
        self.inner.lock().expect("reports lock").insert(node, Arc::new(NodeReport { report, received: now }))
    }

    pub fn get(&self, node: &str) -> Option<Arc<NodeReport>> {
        self.inner.lock().expect("reports lock").get(node).cloned()
    }

    /// Every node's latest report, in node order.
    pub fn all(&self) -> BTreeMap<String, Arc<NodeReport>> {
        self.inner.lock().expect("reports lock").iter().map(|(n, r)| (n.clone(), r.clone())).collect()
    }

    /// When each node last reported.
    pub fn last_heard(&self) -> HashMap<String, Instant> {
        self.inner.lock().expect("reports lock").iter().map(|(n, r)| (n.clone(), r.received)).collect()
    }
}
