//! Writes agents' observed state to their Node's status off the report path. A report is
//! answered at once; what it observed goes through Raft only when it differs from what was
//! last written for that node (compared by the report's digest, `proto::observed_digest`,
//! not by building and comparing JSON), at most one write per node in flight (a newer state
//! waiting replaces an older one). Nodes' states share Raft entries (`Command::PutStatuses`,
//! up to `MAX_STATUSES_PER_ENTRY`), with a bounded number of entries in flight: while they
//! are in flight the next entry fills up, so a quiet fleet writes a state at once and a
//! fleet-wide re-plan, after which every agent's status changes, costs tens of entries, not
//! one per host (each entry costs every controller a proposal, a flush, a replication round
//! and an apply), without holding up any report behind Raft.
//!
//! They are paced ([`StatusPace`], `[loops] status_write_kib_per_s`): of a burst of changed
//! states (after a fleet-wide re-plan) at most the bucket's worth goes into the log at once.
//!
//! A plan being committed goes first: while one is ([`StatusWriter::hold_back`]) no status
//! write starts, as after a fleet-wide re-plan thousands of them (a few KB each) would
//! otherwise share the log with the plan's parts and hold up the desired state that every
//! agent waits for, for an observed state nobody waits for.
//!
//! What counts as written is the digest stored in the node's status (the applied state),
//! or the state waiting or in flight for the node: what another leader or the failure
//! detector wrote since this leader's last write counts without any memory to forget.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::StatusPace;
use crate::controller::Controller;
use crate::resources::limits::{MAX_STATUSES_PER_ENTRY, MAX_STATUS_ENTRY_BYTES};
use crate::resources::{Kind, StatusJson};
use crate::state::{Command, Request, StatusPut};

/// Status entries in flight at once: enough to keep Raft's pipeline busy, few enough that
/// a burst of them does not crowd other writes out, and that the next entry fills up while
/// they commit.
const MAX_ENTRIES_IN_FLIGHT: usize = 4;

/// A node's newest observed state waiting to be written.
struct Pending {
    digest: u64,
    status: StatusJson,
    /// Encoded size of the report it came from, to bound an entry's size.
    bytes: usize,
}

#[derive(Default)]
struct Memory {
    /// The newest status waiting to be written per node.
    pending: HashMap<String, Pending>,
    /// Nodes with a pending status and none in flight, oldest first.
    ready: VecDeque<String>,
    /// Nodes with a write in flight, and the digest of the state being written.
    writing: HashMap<String, u64>,
    /// Whether a task is forming entries from `ready`.
    forming: bool,
}

#[derive(Clone)]
pub struct StatusWriter {
    memory: Arc<Mutex<Memory>>,
    slots: Arc<tokio::sync::Semaphore>,
    pace: Arc<StatusPace>,
    /// Status writes take it shared; a plan commit exclusively (fair: once a plan waits,
    /// new status writes wait behind it).
    plan_first: Arc<tokio::sync::RwLock<()>>,
}

impl Default for StatusWriter {
    fn default() -> Self {
        Self::new(StatusPace::default())
    }
}

impl StatusWriter {
    pub fn new(pace: StatusPace) -> Self {
        StatusWriter {
            memory: Arc::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_ENTRIES_IN_FLIGHT)),
            pace: Arc::new(pace),
            plan_first: Arc::default(),
        }
    }

    /// Holds status writes back until the guard is dropped, once those in flight are done.
    pub async fn hold_back(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.plan_first.clone().write_owned().await
    }

    /// Whether a report with `digest` shows nothing new for `node`: the state
    /// waiting to be written, else the one in flight, else the one stored (`stored`: the
    /// digest in the node's status) has it.
    pub fn is_current(&self, node: &str, stored: u64, digest: u64) -> bool {
        let m = self.memory.lock().expect("status writer lock");
        m.pending.get(node).map(|p| p.digest).or_else(|| m.writing.get(node).copied()).unwrap_or(stored) == digest
    }

    /// Queues `status` (from a report of `bytes` encoded) for `node`'s Node; writes it
    /// unless it is already stored.
    pub fn submit(&self, controller: &Controller, node: &str, digest: u64, status: StatusJson, bytes: usize) {
        let start = {
            let mut m = self.memory.lock().expect("status writer lock");
            let waited = m.pending.insert(node.to_string(), Pending { digest, status, bytes }).is_some();
            if !waited && !m.writing.contains_key(node) {
                m.ready.push_back(node.to_string());
            }
            m.start_forming()
        };
        if start {
            tokio::spawn(self.clone().form_entries(controller.clone()));
        }
    }

    /// Takes ready nodes into entries, one entry per free slot, until none is ready.
    async fn form_entries(self, controller: Controller) {
        loop {
            let slot = self.slots.clone().acquire_owned().await.expect("never closed");
            let entry = {
                let mut m = self.memory.lock().expect("status writer lock");
                let entry = m.take_entry();
                if entry.is_empty() {
                    m.forming = false;
                    return;
                }
                entry
            };
            // Paced before taking a turn, which a plan commit waits for. Meanwhile the
            // entry's states count as in flight, and newer ones wait for the next entry.
            let waited = std::time::Instant::now();
            self.pace.until_ready(entry.iter().map(|(_, p)| p.bytes).sum()).await;
            controller.telemetry.observe_status_pace_wait(waited.elapsed());
            let turn = self.plan_first.clone().read_owned().await;
            let writer = self.clone();
            let controller = controller.clone();
            tokio::spawn(async move {
                let outcome = writer.write_entry(&controller, entry).await;
                drop((slot, turn));
                writer.finish(&controller, outcome);
            });
        }
    }

    /// Writes the states in `entry` that differ from the stored ones, as one Raft entry.
    /// Returns the entry's nodes (none in flight any more). A state not written (the write
    /// failed, or the node was deleted) is not retried: the agent's next report, compared
    /// with what is stored, brings it again.
    async fn write_entry(&self, controller: &Controller, entry: Vec<(String, Pending)>) -> Vec<String> {
        let mut done = Vec::with_capacity(entry.len());
        let mut puts = Vec::with_capacity(entry.len());
        controller.read(|d| {
            for (node, p) in entry {
                match d.cluster.get(Kind::Node, &node) {
                    Some(n) if n.status != p.status => puts.push(StatusPut { name: node, status: p.status }),
                    // Deleted meanwhile, or already stored.
                    _ => done.push(node),
                }
            }
        });
        if puts.is_empty() {
            return done;
        }
        let (n, first) = (puts.len(), puts[0].name.clone());
        done.extend(puts.iter().map(|s| s.name.clone()));
        // No request id: an unconditional write of the latest observed states is
        // idempotent, and thousands of agents' writes must not fill the de-duplication
        // window (kept in memory and in every snapshot).
        let write =
            Request { request_id: String::new(), command: Command::PutStatuses { kind: Kind::Node, statuses: puts }, trace_parent: None };
        if let Err(e) = controller.write(write).await {
            tracing::warn!(nodes = n, %first, error = %e, "could not write the nodes' observed states; their next reports retry");
        }
        done
    }

    /// Takes `done`'s nodes out of flight and readies those whose newer state waited meanwhile.
    fn finish(&self, controller: &Controller, done: Vec<String>) {
        let start = {
            let mut m = self.memory.lock().expect("status writer lock");
            for node in done {
                m.writing.remove(&node);
                if m.pending.contains_key(&node) {
                    m.ready.push_back(node);
                }
            }
            !m.ready.is_empty() && m.start_forming()
        };
        if start {
            tokio::spawn(self.clone().form_entries(controller.clone()));
        }
    }
}

impl Memory {
    /// Whether the caller is to start the task forming entries (none runs).
    fn start_forming(&mut self) -> bool {
        !std::mem::replace(&mut self.forming, true)
    }

    /// The next entry: ready nodes, oldest first, up to `MAX_STATUSES_PER_ENTRY` of them and
    /// `MAX_STATUS_ENTRY_BYTES` of reports (at least one). They are now in flight.
    fn take_entry(&mut self) -> Vec<(String, Pending)> {
        let mut entry = Vec::new();
        let mut bytes = 0;
        while entry.len() < MAX_STATUSES_PER_ENTRY {
            let Some(node) = self.ready.front() else { break };
            let next = self.pending.get(node).map_or(0, |p| p.bytes);
            if !entry.is_empty() && bytes + next > MAX_STATUS_ENTRY_BYTES {
                break;
            }
            let node = self.ready.pop_front().expect("front exists");
            if let Some(p) = self.pending.remove(&node) {
                bytes += p.bytes;
                self.writing.insert(node.clone(), p.digest);
                entry.push((node, p));
            }
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(m: &mut Memory, node: &str, bytes: usize) {
        m.pending.insert(node.to_string(), Pending { digest: 1, status: Default::default(), bytes });
        m.ready.push_back(node.to_string());
    }

    #[test]
    fn a_state_is_current_against_the_one_waiting_else_in_flight_else_stored() {
        let writer = StatusWriter::default();
        let (stored, in_flight, waiting) = (1, 2, 3);
        assert!(writer.is_current("a", stored, stored));
        assert!(!writer.is_current("a", stored, in_flight));
        writer.memory.lock().unwrap().writing.insert("a".into(), in_flight);
        assert!(writer.is_current("a", stored, in_flight) && !writer.is_current("a", stored, stored));
        writer.memory.lock().unwrap().pending.insert("a".into(), Pending { digest: waiting, status: Default::default(), bytes: 1 });
        assert!(writer.is_current("a", stored, waiting) && !writer.is_current("a", stored, in_flight));
        // Another node's memory says nothing of this one: a status someone else wrote (the
        // failure detector's mark drops the digest) is what counts.
        assert!(!writer.is_current("b", 0, waiting));
    }

    #[test]
    fn an_entry_takes_the_oldest_ready_nodes_up_to_the_count_and_byte_bounds() {
        let mut m = Memory::default();
        for i in 0..MAX_STATUSES_PER_ENTRY + 3 {
            ready(&mut m, &format!("n{i}"), 10);
        }
        let first = m.take_entry();
        assert_eq!(first.len(), MAX_STATUSES_PER_ENTRY);
        assert_eq!(first[0].0, "n0");
        assert!(first.iter().all(|(n, _)| m.writing.contains_key(n) && !m.pending.contains_key(n)));
        assert_eq!(m.take_entry().len(), 3);
        assert!(m.take_entry().is_empty());

        // Bytes: two reports of 60% of the bound do not share an entry; one over it goes alone.
        let big = MAX_STATUS_ENTRY_BYTES * 6 / 10;
        ready(&mut m, "a", big);
        ready(&mut m, "b", big);
        ready(&mut m, "huge", MAX_STATUS_ENTRY_BYTES * 2);
        ready(&mut m, "c", 10);
        let names = |e: Vec<(String, Pending)>| e.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(m.take_entry()), ["a"]);
        assert_eq!(names(m.take_entry()), ["b"]);
        assert_eq!(names(m.take_entry()), ["huge"]);
        assert_eq!(names(m.take_entry()), ["c"]);
    }
}
