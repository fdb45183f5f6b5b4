//! The latest report of every agent, kept in the leader's memory. Soft state: lost on a
//! failover and rebuilt from the next round of reports (ARCHITECTURE.md, "Controller
//! internals"), so it never goes through Raft.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// One agent's latest report and when it arrived.
#[derive(Clone, Debug)]
pub struct NodeReport {
    pub report: proto::ReportRequest,
    pub received: Instant,
}

#[derive(Clone, Default)]
pub struct AgentReports {
    inner: Arc<Mutex<BTreeMap<String, NodeReport>>>,
}

impl AgentReports {
    /// Records `report`; returns the previous one of the same node.
    pub fn record(&self, report: proto::ReportRequest, now: Instant) -> Option<NodeReport> {
        let node = report.node.clone();
        self.inner.lock().expect("reports lock").insert(node, NodeReport { report, received: now })
    }

    pub fn get(&self, node: &str) -> Option<NodeReport> {
        self.inner.lock().expect("reports lock").get(node).cloned()
    }

    pub fn all(&self) -> BTreeMap<String, NodeReport> {
        self.inner.lock().expect("reports lock").clone()
    }
}
