//! Group commit: requests that arrive while earlier entries are being flushed and
//! replicated share the next Raft entry.
//!
//! openraft 0.9 appended and flushed each client write on its own before it looked at the
//! next one (`RaftCore` runs its storage commands after every message), so with 64 writers
//! the leader did one sled flush per write, one after another: under raft-bench's 64-client
//! load half of its samples were in sled's flush threads and its Raft core was the
//! bottleneck while the machine was a third idle. An entry per group costs one flush and
//! one replication round for all of its requests; each request keeps its own outcome
//! (`state::Proposal`).

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::types::*;
use crate::resources::limits::{MAX_PROPOSAL_BYTES, MAX_REQUESTS_PER_ENTRY};
use crate::state::{CommandResult, EntryWrites, Proposal, Request};

/// Entries proposed and not yet answered. Requests arriving meanwhile wait and form the
/// next entry: the window is what makes groups form, and keeps the Raft core's queue short.
const ENTRIES_IN_FLIGHT: usize = 2;
/// Requests waiting for an entry, past which proposing waits (back-pressure on callers).
const WAITING: usize = 4096;

/// Why a proposal got no outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum ProposeError {
    /// This node does not lead; the leader's id and address, if known.
    NotLeader(Option<(NodeId, String)>),
    /// Raft did not take or finish the proposal (shutting down, leadership lost, storage).
    Unavailable(String),
}

type Answer = Result<CommandResult, ProposeError>;

/// Hands requests to the proposing task (cheap to clone).
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Waiting>,
}

struct Waiting {
    request: Request,
    /// Encoded size, for [`MAX_PROPOSAL_BYTES`].
    bytes: usize,
    reply: oneshot::Sender<Answer>,
}

impl Proposer {
    /// Starts the proposing task for `raft`; it ends when every `Proposer` is dropped.
    pub(super) fn start(raft: Raft) -> Proposer {
        let (tx, rx) = mpsc::channel(WAITING);
        tokio::spawn(run(raft, rx));
        Proposer { tx }
    }

    /// Queues `request` behind those already queued (entries keep the order of the calls)
    /// and returns its outcome to come: once its entry is committed and applied here.
    pub async fn submit(&self, request: Request) -> Result<impl std::future::Future<Output = Answer>, ProposeError> {
        let bytes = encoded_len(&request);
        let (reply, answer) = oneshot::channel();
        self.tx.send(Waiting { request, bytes, reply }).await.map_err(|_| stopped())?;
        Ok(async move { answer.await.unwrap_or_else(|_| Err(stopped())) })
    }

    /// Proposes `request` and waits for its outcome.
    pub async fn propose(&self, request: Request) -> Answer {
        self.submit(request).await?.await
    }
}

fn stopped() -> ProposeError {
    ProposeError::Unavailable("the Raft proposer stopped (the controller is shutting down)".into())
}

/// JSON size of a request, counted without keeping the bytes, and only up to just past
/// [`MAX_PROPOSAL_BYTES`] (a larger request goes alone, whatever its size: a Plan part need
/// not be encoded one more time to learn that).
fn encoded_len(request: &Request) -> usize {
    // A counting sink rather than a crate: a dozen lines, no dependency.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            if self.0 > MAX_PROPOSAL_BYTES {
                return Err(std::io::Error::other("past the bound"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // The only error is the sink's own, past the bound, where the count says so.
    let _ = serde_json::to_writer(&mut count, request);
    count.0
}

/// The requests of the next entry, in arrival order: each joins while the group holds
/// fewer than [`MAX_REQUESTS_PER_ENTRY`], stays within [`MAX_PROPOSAL_BYTES`] (a larger
/// first one goes alone) and writes nothing an earlier one writes (the state machine would
/// refuse it: `ClusterState::apply_in_entry`). The first that does not join starts the
/// next group, so no request overtakes another.
struct Group<T> {
    requests: Vec<Request>,
    tags: Vec<T>,
    bytes: usize,
    writes: EntryWrites,
}

impl<T> Group<T> {
    fn new(first: Request, bytes: usize, tag: T) -> Self {
        let mut writes = EntryWrites::default();
        // Nothing to conflict with yet.
        let _ = writes.claim(&first);
        Group { requests: vec![first], tags: vec![tag], bytes, writes }
    }

    /// Adds `request` if it may share the entry; else gives it back.
    fn join(&mut self, request: Request, bytes: usize, tag: T) -> Result<(), (Request, T)> {
        let fits = self.requests.len() < MAX_REQUESTS_PER_ENTRY && self.bytes.saturating_add(bytes) <= MAX_PROPOSAL_BYTES;
        if !fits || self.writes.claim(&request).is_err() {
            return Err((request, tag));
        }
        self.bytes += bytes;
        self.requests.push(request);
        self.tags.push(tag);
        Ok(())
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Waiting>) {
    let window = Arc::new(Semaphore::new(ENTRIES_IN_FLIGHT));
    let mut next: Option<Waiting> = None;
    loop {
        let Ok(permit) = window.clone().acquire_owned().await else { return };
        let first = match next.take() {
            Some(w) => w,
            None => match rx.recv().await {
                Some(w) => w,
                None => return,
            },
        };
        let mut group = Group::new(first.request, first.bytes, first.reply);
        while let Ok(w) = rx.try_recv() {
            if let Err((request, reply)) = group.join(w.request, w.bytes, w.reply) {
                next = Some(Waiting { request, bytes: w.bytes, reply });
                break;
            }
        }
        propose(&raft, group, permit).await;
    }
}

/// Hands the group's entry to Raft and answers each request when Raft answers the entry,
/// releasing `permit` then.
async fn propose(raft: &Raft, group: Group<oneshot::Sender<Answer>>, permit: OwnedSemaphorePermit) {
    let Group { requests, tags: replies, .. } = group;
    let count = requests.len();
    let proposal = match Proposal::new(requests) {
        Ok(p) => p,
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(ProposeError::Unavailable(format!("internal error: encoding the entry: {e}"))));
            }
            return;
        }
    };
    let (responder, answer) = openraft::impls::ProgressResponder::complete_only();
    match raft.client_write_ff(proposal, Some(responder)).await {
        Ok(()) => {
            tokio::spawn(async move {
                let answers = answers(answer.await, count);
                drop(permit);
                for (reply, answer) in replies.into_iter().zip(answers) {
                    // The caller may have given up waiting.
                    let _ = reply.send(answer);
                }
            });
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(ProposeError::Unavailable(format!("proposal failed: {e}"))));
            }
        }
    }
}

/// Each request's answer from Raft's answer for their entry.
fn answers<E: std::fmt::Display>(answer: Result<Result<ClientWriteResponse, ClientWriteError>, E>, count: usize) -> VecDeque<Answer> {
    let all = |e: ProposeError| std::iter::repeat_n(Err(e), count).collect();
    match answer {
        Ok(Ok(resp)) if resp.data.len() == count => resp.data.into_iter().map(Ok).collect(),
        Ok(Ok(resp)) => {
            all(ProposeError::Unavailable(format!("internal error: an entry of {count} requests produced {} outcomes", resp.data.len())))
        }
        Ok(Err(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
            all(ProposeError::NotLeader(f.leader_id.zip(f.leader_node.map(|n| n.addr))))
        }
        Ok(Err(e)) => all(ProposeError::Unavailable(format!("proposal failed: {e}"))),
        // The Raft core stopped (shut down or failed) before answering.
        Err(e) => all(ProposeError::Unavailable(format!("proposal failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Kind, Spec};
    use crate::state::{Command, StatusPut, WriteMode};

    fn put_tenant(name: &str) -> Request {
        Request {
            request_id: format!("r-{name}"),
            command: Command::Put {
                name: name.into(),
                tenant: String::new(),
                spec: Spec::Tenant(Default::default()),
                mode: WriteMode::Upsert,
                expected_version: 0,
            },
            trace_parent: None,
        }
    }

    fn names<T>(group: &Group<T>) -> Vec<String> {
        group.requests.iter().map(|r| r.request_id.clone()).collect()
    }

    #[test]
    fn requests_join_in_order_up_to_the_count_bound() {
        let mut group = Group::new(put_tenant("t0"), 10, 0);
        for i in 1..MAX_REQUESTS_PER_ENTRY {
            assert!(group.join(put_tenant(&format!("t{i}")), 10, i).is_ok(), "request {i} fits");
        }
        let refused = group.join(put_tenant("one-too-many"), 10, MAX_REQUESTS_PER_ENTRY).unwrap_err();
        assert_eq!(refused.0.request_id, "r-one-too-many");
        assert_eq!(group.requests.len(), MAX_REQUESTS_PER_ENTRY);
        assert_eq!(group.tags, (0..MAX_REQUESTS_PER_ENTRY).collect::<Vec<_>>(), "answers stay matched to requests");
    }

    #[test]
    fn the_byte_bound_closes_a_group_but_a_large_first_request_goes_alone() {
        let mut group = Group::new(put_tenant("a"), MAX_PROPOSAL_BYTES - 100, ());
        assert!(group.join(put_tenant("b"), 100, ()).is_ok(), "exactly at the bound");
        assert!(group.join(put_tenant("c"), 1, ()).is_err(), "one byte over");
        let mut alone = Group::new(put_tenant("huge"), 2 * MAX_PROPOSAL_BYTES, ());
        assert!(alone.join(put_tenant("small"), 1, ()).is_err());
        assert_eq!(names(&alone), ["r-huge"]);
    }

    #[test]
    fn a_request_writing_what_an_earlier_one_writes_starts_the_next_entry() {
        let mut group = Group::new(put_tenant("a"), 10, ());
        assert!(group.join(put_tenant("b"), 10, ()).is_ok());
        // The same tenant again, inside another command shape: a batch of puts.
        let again =
            Request { request_id: "r-batch".into(), command: Command::Batch { puts: vec![put_tenant("a").command] }, trace_parent: None };
        assert!(group.join(again, 10, ()).is_err());
        // A same-named resource of another kind is another resource.
        let node_status = Request {
            request_id: "r-status".into(),
            command: Command::PutStatuses {
                kind: Kind::Node,
                statuses: vec![StatusPut { name: "a".into(), status: serde_json::json!({}).into() }],
            },
            trace_parent: None,
        };
        assert!(group.join(node_status, 10, ()).is_ok());
        assert_eq!(names(&group), ["r-a", "r-b", "r-status"]);
    }

    #[test]
    fn a_request_is_measured_as_encoded_and_a_large_one_only_past_the_bound() {
        let small = put_tenant("t");
        assert_eq!(encoded_len(&small), serde_json::to_vec(&small).unwrap().len());
        let large = Request {
            request_id: "big".into(),
            command: Command::PutStatuses {
                kind: Kind::Node,
                statuses: vec![StatusPut { name: "n".into(), status: serde_json::json!("x".repeat(4 * MAX_PROPOSAL_BYTES)).into() }],
            },
            trace_parent: None,
        };
        let measured = encoded_len(&large);
        assert!(measured > MAX_PROPOSAL_BYTES, "{measured}");
        // Too large to share an entry.
        assert!(Group::new(small, 10, ()).join(large, measured, ()).is_err());
    }

    #[test]
    fn every_request_of_an_entry_gets_its_own_answer_or_the_entry_s_failure() {
        let resp = |data: Vec<CommandResult>| -> Result<Result<ClientWriteResponse, ClientWriteError>, String> {
            Ok(Ok(ClientWriteResponse { log_id: log_id(1, 7), data, membership: None }))
        };
        let refused = Err(crate::resources::FieldError::invalid("spec", "no"));
        let ok = answers(resp(vec![refused.clone(), refused.clone()]), 2);
        assert_eq!(ok, [Ok(refused.clone()), Ok(refused.clone())]);
        let short = answers(resp(vec![refused]), 2);
        assert!(short.iter().all(|a| matches!(a, Err(ProposeError::Unavailable(m)) if m.contains("2 requests produced 1"))), "{short:?}");
        let stopped = answers::<String>(Err("core stopped".into()), 3);
        assert_eq!(stopped.len(), 3);
        assert!(stopped.iter().all(|a| matches!(a, Err(ProposeError::Unavailable(m)) if m.contains("core stopped"))));
    }
}
