//! Writes agents' observed state to their Node's status off the report path. A report is
//! answered at once; what it observed goes through Raft only when it differs from what was
//! last written for that node (compared by a fingerprint of the report, not by building and
//! comparing JSON), at most one write per node in flight (a newer state waiting replaces an
//! older one), and a bounded number in flight overall. So a fleet-wide re-plan, after which
//! every agent's status changes, costs one write per changed node without holding up any
//! report behind Raft.
//!
//! A plan being committed goes first: while one is ([`StatusWriter::hold_back`]) no status
//! write starts, as after a fleet-wide re-plan thousands of them (a few KB each) would
//! otherwise share the log with the plan's parts and hold up the desired state that every
//! agent waits for, for an observed state nobody waits for.
//!
//! Leader memory: it is forgotten when the term changes (another leader may have written
//! since), and a node whose status someone else writes (the failure detector) is forgotten
//! by that writer.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use prost::Message;

use crate::controller::Controller;
use crate::resources::Kind;
use crate::state::{Command, Request};

/// Status writes in flight at once: enough to fill Raft's batches, few enough that a burst
/// of them does not crowd other writes out.
const MAX_IN_FLIGHT: usize = 64;

/// What of a report the Node's status shows, as a fingerprint.
pub fn fingerprint(report: &proto::ReportRequest) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    report.applied_version.hash(&mut h);
    for g in &report.gpus {
        g.encode_to_vec().hash(&mut h);
    }
    for m in report.metrics.iter().filter(|m| !m.endpoint.is_empty()) {
        (&m.service, &m.endpoint).hash(&mut h);
    }
    h.finish()
}

#[derive(Default)]
struct Memory {
    term: u64,
    /// Fingerprint of the status last written (or found already stored) per node.
    written: HashMap<String, u64>,
    /// The newest status waiting to be written per node, with its fingerprint.
    pending: HashMap<String, (u64, serde_json::Value)>,
    /// Nodes with a write in flight.
    writing: HashSet<String>,
}

#[derive(Clone)]
pub struct StatusWriter {
    memory: Arc<Mutex<Memory>>,
    slots: Arc<tokio::sync::Semaphore>,
    /// Status writes take it shared; a plan commit exclusively (fair: once a plan waits,
    /// new status writes wait behind it).
    plan_first: Arc<tokio::sync::RwLock<()>>,
}

impl Default for StatusWriter {
    fn default() -> Self {
        StatusWriter { memory: Arc::default(), slots: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)), plan_first: Arc::default() }
    }
}

impl StatusWriter {
    /// Holds status writes back until the guard is dropped, once those in flight are done.
    pub async fn hold_back(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.plan_first.clone().write_owned().await
    }

    /// Whether a report with `fingerprint` shows nothing new for `node` (in `term`).
    pub fn is_current(&self, term: u64, node: &str, fingerprint: u64) -> bool {
        let mut m = self.memory.lock().expect("status writer lock");
        m.reset_if_new(term);
        m.pending.get(node).map(|(f, _)| *f).or_else(|| m.written.get(node).copied()) == Some(fingerprint)
    }

    /// Forgets what was written for `node`: its next report is compared with the stored status.
    pub fn forget(&self, node: &str) {
        self.memory.lock().expect("status writer lock").written.remove(node);
    }

    /// Queues `status` for `node`'s Node; writes it unless it is already stored.
    pub fn submit(&self, controller: &Controller, term: u64, node: &str, fingerprint: u64, status: serde_json::Value) {
        let start = {
            let mut m = self.memory.lock().expect("status writer lock");
            m.reset_if_new(term);
            m.pending.insert(node.to_string(), (fingerprint, status));
            m.writing.insert(node.to_string())
        };
        if start {
            tokio::spawn(self.clone().drain(controller.clone(), node.to_string()));
        }
    }

    /// Writes `node`'s pending status until none is left.
    async fn drain(self, controller: Controller, node: String) {
        loop {
            let next = {
                let mut m = self.memory.lock().expect("status writer lock");
                match m.pending.remove(&node) {
                    Some(p) => p,
                    None => {
                        m.writing.remove(&node);
                        return;
                    }
                }
            };
            let (fingerprint, status) = next;
            let stored = controller.read(|d| d.cluster.get(Kind::Node, &node).map(|n| n.status == status));
            let written = match stored {
                None => false, // deleted meanwhile
                Some(true) => true,
                Some(false) => {
                    let _turn = self.plan_first.read().await;
                    let _slot = self.slots.acquire().await.expect("never closed");
                    // No request id: an unconditional write of the latest observed state is
                    // idempotent, and thousands of agents' writes must not fill the
                    // de-duplication window (kept in memory and in every snapshot).
                    let write = Request {
                        request_id: String::new(),
                        command: Command::PutStatus { kind: Kind::Node, name: node.clone(), status, expected_version: 0 },
                        trace_parent: None,
                    };
                    match controller.write(write).await {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::warn!(node = %node, error = %e, "could not write the node's observed state; the next report retries");
                            false
                        }
                    }
                }
            };
            let mut m = self.memory.lock().expect("status writer lock");
            if written {
                m.written.insert(node.clone(), fingerprint);
            } else {
                m.written.remove(&node);
            }
        }
    }
}

impl Memory {
    fn reset_if_new(&mut self, term: u64) {
        if term != self.term {
            self.term = term;
            self.written.clear();
        }
    }
}
