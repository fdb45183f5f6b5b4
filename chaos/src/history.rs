//! Client histories of the chaos runs and their linearizability check.
//!
//! Every client operation is a register operation on one key (a write of a unique value, or
//! a read). A run records, in real-time order, when each operation was invoked and how it
//! ended: returned, failed (certainly no effect) or unknown (it may or may not have taken
//! effect, e.g. a timeout). The check feeds each key's history to stateright's
//! `LinearizabilityTester` with a register as the sequential specification; linearizability
//! is local (Herlihy & Wing), so checking keys separately is exact and keeps the search small.
//!
//! The tester's cost grows faster than linearly with a key's history (here, debug build: 250
//! operations of 5 concurrent clients 0.75 s, 500 4.6 s, 1000 18 s), so workloads spread their
//! operations over many keys, a few hundred operations each.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

/// A register operation. Written values must be unique within a run, so that a read names
/// the write it observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Write(String),
    Read,
}

/// What a returned operation answered; `ReadOk(None)` is a read of a key never written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    WriteOk,
    ReadOk(Option<String>),
}

/// Names one invoked operation; pass it back to say how the operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpId {
    thread: u64,
    seq: u64,
}

#[derive(Clone, Debug)]
enum Event {
    Invoke { id: OpId, key: String, op: Op },
    Returned { id: OpId, ret: Ret },
    Failed { id: OpId },
    Unknown { id: OpId },
}

#[derive(Default)]
struct Inner {
    events: Vec<Event>,
    next_thread: u64,
}

/// The shared, append-only record of every client's operations, in the order they happened.
#[derive(Clone, Default)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder for one sequential client (one operation at a time).
    pub fn client(&self) -> ClientRecorder {
        let thread = self.new_thread();
        ClientRecorder { history: self.clone(), thread, seq: 0, pending: None }
    }

    fn new_thread(&self) -> u64 {
        let mut inner = self.inner.lock().unwrap();
        inner.next_thread += 1;
        inner.next_thread
    }

    fn push(&self, event: Event) {
        self.inner.lock().unwrap().events.push(event);
    }

    fn events(&self) -> Vec<Event> {
        self.inner.lock().unwrap().events.clone()
    }

    /// Number of recorded events (invocations and endings).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Records one client's operations. A client whose operation ended unknown continues under a
/// fresh thread id: the unknown operation stays in flight for ever (it may still take effect),
/// and a thread can have only one operation in flight.
pub struct ClientRecorder {
    history: History,
    thread: u64,
    seq: u64,
    pending: Option<OpId>,
}

impl ClientRecorder {
    /// Records the invocation of `op` on `key`.
    ///
    /// Panics if this client's previous operation has not ended: a recorder models one
    /// sequential client, and a history with overlapping operations of one client is malformed.
    pub fn invoke(&mut self, key: &str, op: Op) -> OpId {
        assert!(self.pending.is_none(), "client {} invoked an operation before the previous one ended", self.thread);
        self.seq += 1;
        let id = OpId { thread: self.thread, seq: self.seq };
        self.pending = Some(id);
        self.history.push(Event::Invoke { id, key: key.to_string(), op });
        id
    }

    /// The operation returned `ret`.
    pub fn returned(&mut self, id: OpId, ret: Ret) {
        self.end(id);
        self.history.push(Event::Returned { id, ret });
    }

    /// The operation certainly had no effect (refused before it was proposed, or a read that
    /// failed).
    pub fn failed(&mut self, id: OpId) {
        self.end(id);
        self.history.push(Event::Failed { id });
    }

    /// The operation's outcome is unknown: it may have taken effect, now or later.
    pub fn unknown(&mut self, id: OpId) {
        self.end(id);
        self.history.push(Event::Unknown { id });
        self.thread = self.history.new_thread();
        self.seq = 0;
    }

    fn end(&mut self, id: OpId) {
        assert_eq!(self.pending.take(), Some(id), "client {} ended an operation it had not invoked", self.thread);
    }
}

/// The outcome of checking a history.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    pub linearizable: bool,
    /// Operations invoked.
    pub operations: usize,
    pub acknowledged_writes: usize,
    pub failed: usize,
    pub unknown: usize,
    pub keys: usize,
    /// Acknowledged writes the last read of their key proves lost: the value read was written
    /// by a write that had returned before the lost write was invoked.
    pub lost_writes: usize,
    /// Why the history is not linearizable, or why it is malformed.
    pub failure: Option<String>,
}

/// One operation of one key's history, with its invocation and ending positions.
#[derive(Clone, Debug)]
struct Record {
    id: OpId,
    op: Op,
    invoked_at: usize,
    ending: Option<(usize, Ending)>,
}

#[derive(Clone, Debug)]
enum Ending {
    Returned(Ret),
    Failed,
    Unknown,
}

/// Checks that every key's history is linearizable with respect to a register.
pub fn check(history: &History) -> Verdict {
    let events = history.events();
    let mut by_key: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    let mut where_is: BTreeMap<OpId, (String, usize)> = BTreeMap::new();
    let mut verdict = Verdict {
        linearizable: true,
        operations: 0,
        acknowledged_writes: 0,
        failed: 0,
        unknown: 0,
        keys: 0,
        lost_writes: 0,
        failure: None,
    };
    for (at, event) in events.iter().enumerate() {
        match event {
            Event::Invoke { id, key, op } => {
                verdict.operations += 1;
                let records = by_key.entry(key.clone()).or_default();
                where_is.insert(*id, (key.clone(), records.len()));
                records.push(Record { id: *id, op: op.clone(), invoked_at: at, ending: None });
            }
            Event::Returned { id, .. } | Event::Failed { id } | Event::Unknown { id } => {
                let ending = match event {
                    Event::Returned { ret, .. } => Ending::Returned(ret.clone()),
                    Event::Failed { .. } => Ending::Failed,
                    _ => Ending::Unknown,
                };
                let (key, index) = &where_is[id];
                let record = &mut by_key.get_mut(key).unwrap()[*index];
                match (&ending, &record.op) {
                    (Ending::Returned(Ret::WriteOk), Op::Write(_)) => verdict.acknowledged_writes += 1,
                    (Ending::Returned(Ret::ReadOk(_)), Op::Read) => {}
                    (Ending::Returned(ret), op) => {
                        verdict.linearizable = false;
                        verdict.failure = Some(format!("malformed history: {op:?} on {key:?} returned {ret:?}"));
                    }
                    (Ending::Failed, _) => verdict.failed += 1,
                    (Ending::Unknown, _) => verdict.unknown += 1,
                }
                record.ending = Some((at, ending));
            }
        }
    }
    verdict.keys = by_key.len();
    if let Some(duplicate) = duplicate_write(&by_key) {
        verdict.linearizable = false;
        verdict.failure = Some(format!("malformed history: value {duplicate:?} written twice; written values must be unique"));
        return verdict;
    }
    for (key, records) in &by_key {
        verdict.lost_writes += lost_writes(records);
        if verdict.failure.is_some() {
            continue;
        }
        if let Err(why) = check_key_on_a_deep_stack(records) {
            verdict.linearizable = false;
            verdict.failure = Some(format!("key {key:?}: {why}"));
        }
    }
    verdict
}

fn duplicate_write(by_key: &BTreeMap<String, Vec<Record>>) -> Option<String> {
    let mut seen = BTreeSet::new();
    by_key.values().flatten().find_map(|r| match &r.op {
        Op::Write(v) if !seen.insert(v.clone()) => Some(v.clone()),
        _ => None,
    })
}

type Tester = LinearizabilityTester<u64, Register<Option<String>>>;

/// The tester's search recurses once per operation of the key's history, which overflows a
/// main thread's 8 MiB after a few thousand operations (found by a 50-kill run, whose keys
/// had thousands each): check on a thread whose stack is sized for the history. The stack is
/// reserved, not committed: only the depth reached costs memory.
fn check_key_on_a_deep_stack(records: &[Record]) -> Result<(), String> {
    const PER_OPERATION: usize = 16 * 1024;
    let stack = (records.len() * PER_OPERATION).max(8 << 20);
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("linearizability".into())
            .stack_size(stack)
            .spawn_scoped(scope, || check_key(records))
            .map_err(|e| format!("cannot start the checker thread ({stack} bytes of stack): {e}"))?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn check_key(records: &[Record]) -> Result<(), String> {
    // Replay in real-time order. Failed operations had no effect and are left out; a read
    // whose outcome is unknown had none either. Unknown writes stay in flight.
    let mut steps: Vec<(usize, &Record, bool)> = Vec::new();
    for r in records {
        match &r.ending {
            Some((_, Ending::Failed)) => {}
            Some((_, Ending::Unknown)) | None if r.op == Op::Read => {}
            Some((at, Ending::Returned(_))) => {
                steps.push((r.invoked_at, r, false));
                steps.push((*at, r, true));
            }
            _ => steps.push((r.invoked_at, r, false)),
        }
    }
    steps.sort_by_key(|(at, _, _)| *at);
    let mut tester = Tester::new(Register(None));
    for (_, record, is_return) in steps {
        let outcome = if is_return {
            let Some((_, Ending::Returned(ret))) = &record.ending else { unreachable!() };
            let ret = match ret {
                Ret::WriteOk => RegisterRet::WriteOk,
                Ret::ReadOk(v) => RegisterRet::ReadOk(v.clone()),
            };
            tester.on_return(record.id.thread, ret).map(|_| ())
        } else {
            let op = match &record.op {
                Op::Write(v) => RegisterOp::Write(Some(v.clone())),
                Op::Read => RegisterOp::Read,
            };
            tester.on_invoke(record.id.thread, op).map(|_| ())
        };
        outcome.map_err(|e| format!("malformed history: {e}"))?;
    }
    if tester.serialized_history().is_some() {
        Ok(())
    } else {
        Err(format!("no linearization exists for its {} operations:\n{}", records.len(), render(records)))
    }
}

/// Acknowledged writes that the key's last returned read proves lost.
fn lost_writes(records: &[Record]) -> usize {
    let last_read = records.iter().rev().find_map(|r| match &r.ending {
        Some((at, Ending::Returned(Ret::ReadOk(v)))) if r.op == Op::Read => Some((r.invoked_at, *at, v.clone())),
        _ => None,
    });
    let Some((read_invoked, _, value)) = last_read else { return 0 };
    // When the value read came from a write that had returned before another acknowledged
    // write was invoked, and that later write returned before the read was invoked, the
    // later write was lost. A read of nothing loses every write acknowledged before it.
    let source_returned = match &value {
        None => None,
        Some(v) => records.iter().find_map(|r| match (&r.op, &r.ending) {
            (Op::Write(w), Some((at, _))) if w == v => Some(*at),
            (Op::Write(w), None) if w == v => Some(usize::MAX),
            _ => None,
        }),
    };
    records
        .iter()
        .filter(|r| matches!((&r.op, &r.ending), (Op::Write(_), Some((_, Ending::Returned(Ret::WriteOk))))))
        .filter(|r| {
            let (returned, _) = r.ending.as_ref().unwrap();
            *returned < read_invoked && source_returned.is_none_or(|s| s < r.invoked_at)
        })
        .count()
}

/// The tail of a key's history for a failure message (the last 40 operations).
fn render(records: &[Record]) -> String {
    let skip = records.len().saturating_sub(40);
    records
        .iter()
        .skip(skip)
        .map(|r| {
            let ending = match &r.ending {
                Some((at, Ending::Returned(ret))) => format!("returned {ret:?} at {at}"),
                Some((at, Ending::Failed)) => format!("failed at {at}"),
                Some((at, Ending::Unknown)) => format!("unknown at {at}"),
                None => "still in flight".into(),
            };
            format!("  client {} #{}: {:?} invoked at {}, {ending}", r.id.thread, r.id.seq, r.op, r.invoked_at)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
