//! The agent's side of `ReportResponse.report_interval_ms`: how long to wait before the next
//! report. The agent's own interval, or longer when the controllers ask (they stretch every
//! agent's interval as the fleet grows, so that the fleet's reports stay within their
//! budget). Shared by the node agent, fleet-bench's simulated agents and the controllers'
//! own cap.

use std::time::Duration;

/// The longest wait a controller's answer can ask for, and the longest the controllers ask
/// for: a controller's message is input like any other, and a node that reported once an
/// hour would be taken for dead.
pub const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(60);

/// The wait before the next report, from the agent's `own` interval and the interval the
/// last answer asked for (`0`: none).
pub fn next_report_in(own: Duration, asked_ms: u32) -> Duration {
    own.max(Duration::from_millis(u64::from(asked_ms)).min(MAX_REPORT_INTERVAL))
}

/// How much the asked interval may move before an agent spreads its reports again: a
/// fleet that grows host by host changes every agent's interval a little at each
/// registration, and spreading at each would shorten every agent's next wait each time.
const IN_STEP: std::ops::RangeInclusive<f64> = 0.8..=1.25;

/// When an agent sends its next report. Agents that start together (a fleet restarting,
/// the agents of a controller that went away reconnecting) would otherwise report
/// together for as long as they run, and the controllers' pacing, which keeps the fleet's
/// reports within a budget per second on average, would see bursts of several times it
/// (`fleet-bench` at 10,000 hosts, paced at 2,000 a second: 4,600 reports in one second,
/// 800 in each of the next three). So after a report out of its schedule, and when the
/// interval asked for changes by more than a quarter, the next report comes after a
/// uniformly random part of the interval, so that the agents' phases spread evenly over
/// it. Never sooner than the agent's own interval and never later than the asked one: a
/// draw below the agent's own interval is reached in two equal waits, each half of the
/// draw plus one interval (sooner, the agents of a growing fleet, spread at each step of
/// its growth, reported twice as often as asked; later, the controllers' view of a node
/// was older than the interval they asked for). So the metrics the controllers hold are
/// at most one asked interval old, plus the report's own delay. With an asked interval
/// under twice the agent's own, the few draws that cannot be split so wait the agent's
/// own interval twice. Between those, the reports keep the asked interval exactly. While
/// the controllers do not pace (the asked interval is the agent's own), there is nothing
/// to spread. Randomness is the caller's (`u`), so that this stays a pure function of its
/// inputs.
#[derive(Clone, Debug)]
pub struct ReportSchedule {
    own: Duration,
    /// The interval the last answer asked for (the agent's own before any).
    interval: Duration,
    /// The interval the reports were last spread at; `None`: the next answer spreads them.
    spread_at: Option<Duration>,
    /// The second of two waits a spreading draw was split into.
    then: Option<Duration>,
}

impl ReportSchedule {
    pub fn new(own: Duration) -> Self {
        ReportSchedule { own, interval: own, spread_at: None, then: None }
    }

    /// The wait before a report when the last one was not answered.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The agent sent a report out of its schedule (at once, on a new desired-state
    /// stream): the answer to it spreads the reports again.
    pub fn sent_out_of_schedule(&mut self) {
        self.spread_at = None;
    }

    /// The wait before the next report after an answer that asked for `asked_ms` (as
    /// [`next_report_in`]), `u` being uniformly random in `[0, 1)`.
    pub fn answered(&mut self, asked_ms: u32, u: f64) -> Duration {
        self.interval = next_report_in(self.own, asked_ms);
        if self.interval <= self.own {
            // Not paced: nothing is spread, and pacing that resumes spreads anew rather
            // than finishing a split drawn before.
            self.spread_at = None;
            self.then = None;
            return self.own;
        }
        let in_step = self.spread_at.is_some_and(|at| IN_STEP.contains(&(self.interval.as_secs_f64() / at.as_secs_f64())));
        if in_step {
            // Within a quarter of the interval it was split at, `then` may be a little
            // longer than the one asked now.
            return self.then.take().map_or(self.interval, |then| then.min(self.interval));
        }
        self.spread_at = Some(self.interval);
        self.then = None;
        let u = if u.is_finite() { u.clamp(0.0, 1.0) } else { 0.0 };
        let phase = self.interval.mul_f64(u);
        if phase >= self.own {
            return phase;
        }
        let half = ((phase + self.interval) / 2).max(self.own);
        self.then = Some(half);
        half
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stand-in for the agents' random draws: the fractional part of
    /// `i` times the golden ratio, spread evenly over `[0, 1)`.
    fn draw(i: usize) -> f64 {
        (i as f64 * 0.618_033_988_749_895).fract()
    }

    #[test]
    fn agents_that_start_in_step_spread_their_reports_over_the_paced_interval() {
        // 10,000 agents whose first reports (out of schedule: a new stream each) all
        // arrive in the same second, paced at 2,000 reports a second: 5 s each.
        let own = Duration::from_secs(1);
        let mut per_second = std::collections::BTreeMap::<u64, u32>::new();
        for agent in 0..10_000 {
            let mut schedule = ReportSchedule::new(own);
            schedule.sent_out_of_schedule();
            let mut at = 0.0;
            for report in 0..8 {
                at += schedule.answered(5_000, draw(agent * 8 + report)).as_secs_f64();
                *per_second.entry(at as u64).or_default() += 1;
            }
        }
        // From the fifth second on, every second has about its 2,000; in step they would
        // be 10,000 in one second of every five and none in the others.
        let steady: Vec<u32> = (5..35).map(|s| per_second.get(&s).copied().unwrap_or(0)).collect();
        assert!(steady.iter().all(|n| (1_600..=2_400).contains(n)), "{steady:?}");
    }

    #[test]
    fn a_wait_is_at_least_the_agents_own_interval_and_at_most_the_asked_one() {
        let own = Duration::from_secs(1);
        for asked_ms in [1_500, 2_000, 5_000, 60_000] {
            let asked = Duration::from_millis(asked_ms.into());
            for u in [0.0, 0.1, 0.2, 0.25, 0.5, 0.999, 1.0, -3.0, 7.0, f64::NAN, f64::INFINITY] {
                let mut schedule = ReportSchedule::new(own);
                for _ in 0..3 {
                    let wait = schedule.answered(asked_ms, u);
                    assert!(wait >= own && wait <= asked, "asked {asked:?}, u {u}: {wait:?}");
                }
            }
        }
        // A draw below the agent's own interval (0.5 s of 5 s) is reached in two equal
        // waits, (0.5 + 5) / 2 each; then the interval.
        let mut schedule = ReportSchedule::new(own);
        assert_eq!(schedule.answered(5_000, 0.1), Duration::from_millis(2_750));
        assert_eq!(schedule.answered(5_000, 0.1), Duration::from_millis(2_750));
        assert_eq!(schedule.answered(5_000, 0.1), Duration::from_secs(5));
        // An interval that moved by less than a quarter keeps the split's second wait...
        let mut schedule = ReportSchedule::new(own);
        assert_eq!(schedule.answered(5_000, 0.19), Duration::from_millis(2_975));
        assert_eq!(schedule.answered(4_100, 0.19), Duration::from_millis(2_975));
        // ...but never longer than the interval asked when it is taken.
        let mut schedule = ReportSchedule::new(own);
        assert!(schedule.answered(1_500, 0.666) > Duration::from_millis(1_210));
        assert_eq!(schedule.answered(1_210, 0.666), Duration::from_millis(1_210));
        // Moved by more than a quarter: spread again, the split forgotten.
        let mut schedule = ReportSchedule::new(own);
        assert_eq!(schedule.answered(5_000, 0.0), Duration::from_millis(2_500));
        assert_eq!(schedule.answered(2_000, 0.0), Duration::from_millis(1_000));
        let mut schedule = ReportSchedule::new(own);
        assert_eq!(schedule.answered(1_500, 0.1), own, "no split fits: the agent's own interval");
        assert_eq!(schedule.answered(1_500, 0.1), own);
        assert_eq!(schedule.answered(1_500, 0.1), Duration::from_millis(1_500));
        assert_eq!(schedule.interval(), Duration::from_millis(1_500));
        // A small fleet: the agent's own interval, spread or not.
        let mut small = ReportSchedule::new(own);
        assert_eq!(small.answered(0, 0.9), own);
        assert_eq!(small.answered(400, 0.9), own);
    }

    #[test]
    fn reports_keep_the_asked_interval_until_it_moves_by_a_quarter_or_one_is_sent_out_of_schedule() {
        let own = Duration::from_secs(1);
        let mut schedule = ReportSchedule::new(own);
        assert_eq!(schedule.answered(5_000, 0.5), Duration::from_millis(2_500), "the first answer spreads");
        assert_eq!(schedule.answered(5_000, 0.5), Duration::from_secs(5));
        // A fleet growing host by host: a little longer at each answer, in step.
        assert_eq!(schedule.answered(5_500, 0.5), Duration::from_millis(5_500));
        assert_eq!(schedule.answered(6_200, 0.5), Duration::from_millis(6_200));
        // More than a quarter longer than where they were spread: spread again.
        assert_eq!(schedule.answered(6_300, 0.5), Duration::from_millis(3_150));
        assert_eq!(schedule.answered(6_300, 0.5), Duration::from_millis(6_300));
        // Shorter by more than a fifth (hosts left): spread again.
        assert_eq!(schedule.answered(5_000, 0.3), Duration::from_millis(1_500));
        assert_eq!(schedule.answered(5_000, 0.3), Duration::from_secs(5));
        schedule.sent_out_of_schedule();
        assert_eq!(schedule.answered(5_000, 0.25), Duration::from_millis(1_250));
    }

    #[test]
    fn pacing_that_stops_and_resumes_spreads_the_reports_again() {
        let own = Duration::from_secs(1);
        let mut schedule = ReportSchedule::new(own);
        assert_eq!(schedule.answered(4_000, 0.1), Duration::from_millis(2_200), "a split: (0.4 + 4) / 2");
        assert_eq!(schedule.answered(1_000, 0.1), own, "not paced");
        // Paced again at the split's interval: a new draw, not the old split's second wait.
        assert_eq!(schedule.answered(4_000, 0.9), Duration::from_millis(3_600));
    }

    #[test]
    fn the_agent_reports_at_its_own_interval_or_the_longer_one_asked_for_up_to_a_minute() {
        let own = Duration::from_secs(1);
        assert_eq!(next_report_in(own, 0), own);
        assert_eq!(next_report_in(own, 500), own);
        assert_eq!(next_report_in(own, 5_000), Duration::from_secs(5));
        assert_eq!(next_report_in(own, u32::MAX), MAX_REPORT_INTERVAL);
    }
}
