//! Where a run stands, shared by the driver and the simulated clients and agents, and the
//! run's event trace (a digest of everything that happened, for replay checks).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// The stages of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Faults are injected; clients and agents work.
    Faults = 0,
    /// Every fault is healed; agents must converge.
    Settling = 1,
    /// Clients read every key once more and stop; agents stop.
    FinalReads = 2,
}

#[derive(Clone, Default)]
pub struct Phase(Arc<AtomicU8>);

impl Phase {
    pub fn get(&self) -> Stage {
        match self.0.load(Ordering::SeqCst) {
            0 => Stage::Faults,
            1 => Stage::Settling,
            _ => Stage::FinalReads,
        }
    }

    pub fn set(&self, stage: Stage) {
        self.0.store(stage as u8, Ordering::SeqCst);
    }
}

/// FNV-1a over every event line, plus the last lines for a failure message.
#[derive(Clone)]
pub struct Trace(Arc<Mutex<TraceInner>>);

struct TraceInner {
    digest: u64,
    events: u64,
    tail: VecDeque<String>,
    /// Every line, when asked for (`chaos sim --seed S --trace`).
    all: Option<Vec<String>>,
}

const TAIL: usize = 40;

impl Trace {
    /// A trace that keeps every line when `keep_all`, else only the digest and the tail.
    pub fn new(keep_all: bool) -> Self {
        let inner = TraceInner { digest: 0xcbf2_9ce4_8422_2325, events: 0, tail: VecDeque::new(), all: keep_all.then(Vec::new) };
        Self(Arc::new(Mutex::new(inner)))
    }

    /// Every line, if kept.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().all.clone().unwrap_or_default()
    }

    /// Records one event at simulated time `at_ms`.
    pub fn event(&self, at_ms: u128, what: String) {
        let line = format!("{at_ms} {what}");
        let mut t = self.0.lock().unwrap();
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            t.digest = (t.digest ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        t.events += 1;
        if t.tail.len() == TAIL {
            t.tail.pop_front();
        }
        if let Some(all) = &mut t.all {
            all.push(line.clone());
        }
        t.tail.push_back(line);
    }

    pub fn digest(&self) -> u64 {
        self.0.lock().unwrap().digest
    }

    pub fn events(&self) -> u64 {
        self.0.lock().unwrap().events
    }

    /// The latest events, oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.0.lock().unwrap().tail.iter().cloned().collect()
    }
}

/// Simulated time inside a host or client, in ms.
pub fn now_ms() -> u128 {
    turmoil::elapsed().as_millis()
}
