//! What a run reports: its faults, what the invariant checks saw, and on failure the seed
//! and how to replay it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::history::Verdict;

/// A passing run.
#[derive(Clone, Debug)]
pub struct SimReport {
    pub seed: u64,
    /// The faults injected, in order, e.g. `at 3.20 s for 1.10 s: crash c2`.
    pub faults: Vec<String>,
    pub faults_by_kind: BTreeMap<&'static str, u64>,
    /// Terms in which some controller saw a leader.
    pub terms_with_leader: usize,
    /// Committed plan revisions checked against the plan invariants.
    pub plans_checked: usize,
    /// The linearizability check of the clients' history.
    pub verdict: Verdict,
    /// Simulated time from healing every fault to every agent holding the latest plan.
    pub converged_after: Duration,
    /// Agents whose converged desired state runs something (so convergence compared plans,
    /// not empty states).
    pub agents_with_work: usize,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// Digest of the run's event trace: the same seed gives the same digest.
    pub trace_digest: u64,
    pub events: u64,
    /// Every event, when the options asked to keep them.
    pub trace: Vec<String>,
}

/// A failing run: the seed, when and why, and the events just before.
#[derive(Clone, Debug)]
pub struct SimFailure {
    pub seed: u64,
    /// Simulated time of the failure.
    pub at: Duration,
    pub reason: String,
    pub recent_events: Vec<String>,
}

impl SimFailure {
    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        format!("cargo run -p chaos -- sim --seed {}", self.seed)
    }
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} failed at {:.3} s (simulated): {}", self.seed, self.at.as_secs_f64(), self.reason)?;
        writeln!(f, "replay: {}", self.replay_command())?;
        if !self.recent_events.is_empty() {
            writeln!(f, "last events (simulated ms):")?;
            for e in &self.recent_events {
                writeln!(f, "  {e}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for SimFailure {}

/// Totals over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub seeds: u64,
    pub faults_by_kind: BTreeMap<&'static str, u64>,
    pub operations: u64,
    pub acknowledged_writes: u64,
    pub unknown: u64,
    pub plans_checked: u64,
    pub terms: u64,
    /// Agents that converged to a plan with work for them, over all seeds.
    pub agents_with_work: u64,
    pub simulated: Duration,
}

impl Totals {
    pub fn add(&mut self, r: &SimReport) {
        self.seeds += 1;
        for (k, n) in &r.faults_by_kind {
            *self.faults_by_kind.entry(k).or_default() += n;
        }
        self.operations += r.verdict.operations as u64;
        self.acknowledged_writes += r.verdict.acknowledged_writes as u64;
        self.unknown += r.verdict.unknown as u64;
        self.plans_checked += r.plans_checked as u64;
        self.terms += r.terms_with_leader as u64;
        self.agents_with_work += r.agents_with_work as u64;
        self.simulated += r.simulated;
    }
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} seeds passed, {:.0} s simulated: {} client operations ({} acknowledged writes, {} unknown outcomes) linearizable, \
             {} plans checked, {} terms with a leader, {} agents converged to a plan with work",
            self.seeds,
            self.simulated.as_secs_f64(),
            self.operations,
            self.acknowledged_writes,
            self.unknown,
            self.plans_checked,
            self.terms,
            self.agents_with_work
        )?;
        let kinds: Vec<String> = self.faults_by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
        write!(f, "faults injected: {}", kinds.join(", "))
    }
}
