//! The run's report: what the clients did, what the check says, what the faults did.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use super::faults::{Injection, StorageOutcome};
use super::floods::Figures;
use super::hostile::Attempt;
use super::workload::{Ack, Counts};
use crate::history::Verdict;

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub scenario: String,
    pub seconds: f64,
    pub operations: Counts,
    pub acknowledged_writes: usize,
    /// Acknowledged writes the final reads prove lost (must be 0).
    pub lost: usize,
    pub linearizable: bool,
    pub linearizability_failure: Option<String>,
    pub leader_changes: u64,
    /// The longest time with no write acknowledged, over the whole run.
    pub longest_unavailability_ms: f64,
    /// Per fault: from its injection to the first acknowledged write invoked after it.
    pub unavailability_after_fault_ms: Vec<(String, f64)>,
    pub unavailability_median_ms: f64,
    pub unavailability_max_ms: f64,
    pub faults: BTreeMap<String, u32>,
    /// From the final heal until every agent runs the latest plan.
    pub agent_convergence_ms: Option<f64>,
    pub storage_faults: Vec<StorageOutcome>,
    /// The `hostile` scenario's attacks and what became of each.
    pub hostile: Vec<Attempt>,
    /// The `hostile` scenario's floods and the leader under the tenant at its quota.
    pub floods: Option<Figures>,
    /// Anything that fails the run besides lost or non-linearizable operations.
    pub problems: Vec<String>,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// The longest stretch between `from` and `to` without a write acknowledgement.
pub fn longest_gap(acks: &[Ack], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = acks.iter().map(|a| a.returned).filter(|t| *t >= from && *t <= to).collect();
    times.sort();
    let mut prev = from;
    let mut longest = Duration::ZERO;
    for t in times.into_iter().chain([to]) {
        longest = longest.max(t - prev);
        prev = t;
    }
    longest
}

/// From `at` to the acknowledgement of the first write invoked at or after it.
pub fn unavailable_after(acks: &[Ack], at: Instant) -> Option<Duration> {
    acks.iter().filter(|a| a.invoked >= at).map(|a| a.returned - at).min()
}

fn median(sorted: &[f64]) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

pub struct Inputs<'a> {
    pub scenario: &'a str,
    pub started: Instant,
    pub ended: Instant,
    pub counts: Counts,
    pub verdict: Verdict,
    pub acks: &'a [Ack],
    pub injections: &'a [Injection],
    pub leader_changes: u64,
    pub agent_convergence: Option<Duration>,
    pub storage_faults: Vec<StorageOutcome>,
    pub hostile: Vec<Attempt>,
    pub floods: Option<Figures>,
    pub problems: Vec<String>,
}

impl Report {
    pub fn build(i: Inputs<'_>) -> Report {
        let mut problems = i.problems;
        let mut faults = BTreeMap::new();
        let mut per_fault = Vec::new();
        for inj in i.injections {
            *faults.entry(inj.kind.name().to_string()).or_insert(0) += 1;
            match unavailable_after(i.acks, inj.at) {
                Some(d) => per_fault.push((format!("{} (controller {})", inj.kind.name(), inj.node), ms(d))),
                None => problems.push(format!("no write was acknowledged after the {} of controller {}", inj.kind.name(), inj.node)),
            }
        }
        let mut sorted: Vec<f64> = per_fault.iter().map(|(_, v)| *v).collect();
        sorted.sort_by(f64::total_cmp);
        for s in &i.storage_faults {
            if s.served_reset_state {
                problems.push(format!("controller {} served reset state after {}", s.node, s.how));
            }
            if s.panicked {
                problems.push(format!(
                    "controller {} panicked after {} instead of stopping with a clear message: {}",
                    s.node, s.how, s.message
                ));
            }
            if !s.rejoined {
                problems.push(format!("controller {} did not rejoin after {}", s.node, s.how));
            }
        }
        for a in i.hostile.iter().filter(|a| !a.refused_as_expected()) {
            problems.push(format!("{} attack \"{}\": expected {}, got {}", a.who, a.what, a.expected, a.got));
        }
        Report {
            hostile: i.hostile,
            floods: i.floods,
            scenario: i.scenario.to_string(),
            seconds: (i.ended - i.started).as_secs_f64().round(),
            operations: i.counts,
            acknowledged_writes: i.verdict.acknowledged_writes,
            lost: i.verdict.lost_writes,
            linearizable: i.verdict.linearizable,
            linearizability_failure: i.verdict.failure,
            leader_changes: i.leader_changes,
            longest_unavailability_ms: ms(longest_gap(i.acks, i.started, i.ended)),
            unavailability_median_ms: median(&sorted),
            unavailability_max_ms: sorted.last().copied().unwrap_or(0.0),
            unavailability_after_fault_ms: per_fault,
            faults,
            agent_convergence_ms: i.agent_convergence.map(ms),
            storage_faults: i.storage_faults,
            problems,
        }
    }

    /// The run passes: nothing lost, linearizable, and no other problem.
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.linearizable && self.problems.is_empty()
    }

    pub fn table(&self) -> String {
        let mut s = String::new();
        let o = &self.operations;
        let _ = writeln!(s, "chaos real --scenario {}: {:.0}s", self.scenario, self.seconds);
        let _ = writeln!(s, "{:<34} {}", "operations attempted", o.attempted);
        let _ = writeln!(s, "{:<34} {} ({} writes)", "  acknowledged", o.acknowledged, self.acknowledged_writes);
        let _ = writeln!(s, "{:<34} {}", "  failed (no effect)", o.failed);
        let _ = writeln!(s, "{:<34} {}", "  unknown (may have applied)", o.unknown);
        let _ = writeln!(s, "{:<34} {}", "acknowledged writes lost", self.lost);
        let verdict =
            if self.linearizable { "yes".to_string() } else { format!("NO: {}", self.linearizability_failure.as_deref().unwrap_or("")) };
        let _ = writeln!(s, "{:<34} {verdict}", "linearizable");
        let _ = writeln!(s, "{:<34} {}", "leader changes", self.leader_changes);
        let _ = writeln!(s, "{:<34} {:.0} ms", "longest unavailability (writes)", self.longest_unavailability_ms);
        let _ = writeln!(
            s,
            "{:<34} median {:.0} ms, max {:.0} ms over {} faults",
            "unavailability after a fault",
            self.unavailability_median_ms,
            self.unavailability_max_ms,
            self.unavailability_after_fault_ms.len()
        );
        let convergence = self.agent_convergence_ms.map_or("not measured".to_string(), |v| format!("{v:.0} ms"));
        let _ = writeln!(s, "{:<34} {convergence}", "agent convergence after heal");
        let _ = writeln!(s, "faults injected:");
        for (k, n) in &self.faults {
            let _ = writeln!(s, "  {k:<32} {n}");
        }
        for f in &self.storage_faults {
            let _ = writeln!(s, "storage fault on controller {}: {}", f.node, f.how);
            if f.stopped {
                let _ = writeln!(s, "  stopped (exit code {:?}): {}", f.exit_code, f.message);
            }
            for n in &f.notes {
                let _ = writeln!(s, "  {n}");
            }
            let _ = writeln!(s, "  {}", if f.rejoined { &f.recovery } else { "did NOT rejoin" });
        }
        if !self.hostile.is_empty() {
            let ok = self.hostile.iter().filter(|a| a.refused_as_expected()).count();
            let _ = writeln!(s, "hostile attempts: {ok} of {} answered as expected", self.hostile.len());
            for a in &self.hostile {
                let _ = writeln!(s, "  {:<8} {:<66} {}", a.who, a.what, a.got);
            }
        }
        for line in self.floods.iter().flat_map(Figures::lines) {
            let _ = writeln!(s, "{line}");
        }
        for p in &self.problems {
            let _ = writeln!(s, "PROBLEM: {p}");
        }
        let _ = writeln!(s, "result: {}", if self.passed() { "PASS" } else { "FAIL" });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(start: Instant, invoked_ms: u64, returned_ms: u64) -> Ack {
        Ack { invoked: start + Duration::from_millis(invoked_ms), returned: start + Duration::from_millis(returned_ms) }
    }

    #[test]
    fn the_longest_gap_counts_from_the_start_and_to_the_end_of_the_run() {
        let t = Instant::now();
        let acks = [ack(t, 0, 100), ack(t, 150, 300), ack(t, 900, 1000)];
        assert_eq!(longest_gap(&acks, t, t + Duration::from_millis(1200)), Duration::from_millis(700));
        assert_eq!(longest_gap(&acks, t, t + Duration::from_millis(2000)), Duration::from_millis(1000));
        assert_eq!(longest_gap(&[], t, t + Duration::from_millis(50)), Duration::from_millis(50));
    }

    #[test]
    fn unavailability_after_a_fault_ignores_writes_invoked_before_it() {
        let t = Instant::now();
        // The first write was in flight at the fault and acknowledged early: it does not show
        // that the cluster serves again; the one invoked after the fault does.
        let acks = [ack(t, 0, 1050), ack(t, 1100, 1900), ack(t, 1200, 1500)];
        let at = t + Duration::from_millis(1000);
        assert_eq!(unavailable_after(&acks, at), Some(Duration::from_millis(500)));
        assert_eq!(unavailable_after(&acks, t + Duration::from_millis(1300)), None);
    }
}
