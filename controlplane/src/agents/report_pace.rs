//! How often each agent reports: the configured heartbeat interval, stretched as the fleet
//! grows so that the whole fleet's reports stay within a budget per second. Every report
//! costs the controllers a request, a check and a memory update whatever it says, so a fixed
//! interval makes their load grow with the fleet; 10,000 agents at one report a second
//! saturated a 3-controller cluster. Kubernetes paces node heartbeats for the same reason
//! (a 10 s lease per node).
//!
//! The controllers tell each agent the interval in every report's answer; the failure
//! detector and the tuner use the same interval, so a node is overdue after `missed`
//! paced intervals, not `missed` seconds.

use std::time::Duration;

/// The longest interval the controllers ask for (and the longest an agent accepts): a node
/// that fails is noticed within `missed` times this, whatever the fleet's size.
pub use proto::report_pace::MAX_REPORT_INTERVAL;

/// Report pacing settings (`[loops]` `heartbeat_interval_ms`, `report_budget_per_s`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReportPace {
    /// Each agent's interval while the fleet is small.
    pub heartbeat: Duration,
    /// Reports per second the whole fleet may send.
    pub budget_per_s: u32,
}

/// 10,000 hosts, the design point, report every 4 s: the metrics the loops read are then
/// at most 5 s old, with a second left for a report's delays (an agent never waits longer
/// than the interval asked, `proto::report_pace::ReportSchedule`).
impl Default for ReportPace {
    fn default() -> Self {
        ReportPace { heartbeat: Duration::from_secs(1), budget_per_s: 2_500 }
    }
}

impl ReportPace {
    /// Each agent's interval in a fleet of `nodes`: the heartbeat, or `nodes / budget`
    /// seconds when longer, at most [`MAX_REPORT_INTERVAL`].
    pub fn interval(&self, nodes: usize) -> Duration {
        let fleet = Duration::from_secs_f64(nodes as f64 / f64::from(self.budget_per_s.max(1)));
        self.heartbeat.max(fleet).min(MAX_REPORT_INTERVAL.max(self.heartbeat))
    }
}

/// The failure detector's timeout as the fleet's size changes: `missed` times the paced
/// interval, except that after the interval shrinks (nodes left) the longer one holds
/// until every agent has had the time to report once at it and learn the new one, so no
/// agent still on the longer interval is taken for dead.
#[derive(Clone, Debug)]
pub struct OverdueTimeout {
    missed: u32,
    /// The longest interval announced within its own timeout, and since when (seconds on
    /// the caller's clock).
    longest: Duration,
    since_s: f64,
}

impl OverdueTimeout {
    pub fn new(missed: u32, interval: Duration, now_s: f64) -> Self {
        OverdueTimeout { missed: missed.max(1), longest: interval, since_s: now_s }
    }

    /// The timeout at `now_s`, the interval announced now being `interval`.
    pub fn at(&mut self, interval: Duration, now_s: f64) -> Duration {
        let held = now_s - self.since_s > (self.longest * self.missed).as_secs_f64();
        if interval >= self.longest || held {
            self.longest = interval;
            self.since_s = now_s;
        }
        self.longest * self.missed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_the_heartbeat_until_the_fleet_outgrows_the_budget_then_grows_with_it_up_to_a_cap() {
        let pace = ReportPace { heartbeat: Duration::from_secs(1), budget_per_s: 2_000 };
        assert_eq!(pace.interval(0), Duration::from_secs(1));
        assert_eq!(pace.interval(2_000), Duration::from_secs(1));
        assert_eq!(pace.interval(10_000), Duration::from_secs(5));
        assert_eq!(pace.interval(50_000), Duration::from_secs(25));
        assert_eq!(pace.interval(usize::MAX), MAX_REPORT_INTERVAL);
        // The default at the design point: 4 s, so that metrics are at most 5 s old.
        assert_eq!(ReportPace::default().interval(10_000), Duration::from_secs(4));
        // A budget of 0 is taken as 1, never a division by zero.
        assert_eq!(ReportPace { budget_per_s: 0, ..pace }.interval(30), Duration::from_secs(30));
        // A heartbeat above the cap is the operator's choice and stands.
        let slow = ReportPace { heartbeat: Duration::from_secs(90), budget_per_s: 2_000 };
        assert_eq!(slow.interval(10), Duration::from_secs(90));
    }

    #[test]
    fn after_the_interval_shrinks_the_longer_timeout_holds_for_one_old_timeout() {
        let mut t = OverdueTimeout::new(5, Duration::from_secs(5), 0.0);
        assert_eq!(t.at(Duration::from_secs(5), 1.0), Duration::from_secs(25));
        // The fleet shrank: agents still report every 5 s until their next answer.
        assert_eq!(t.at(Duration::from_secs(1), 10.0), Duration::from_secs(25));
        assert_eq!(t.at(Duration::from_secs(1), 25.9), Duration::from_secs(25));
        assert_eq!(t.at(Duration::from_secs(1), 26.1), Duration::from_secs(5));
        // Growth applies at once.
        assert_eq!(t.at(Duration::from_secs(3), 27.0), Duration::from_secs(15));
    }
}
