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

/// The index (into the agent's list of `controllers`) of the controller for the next report,
/// after one at `current` was answered: the next one when the leader answered and there is
/// another, so that the leader, which also replicates and applies every write, answers
/// none (fleet-bench at 10,000 hosts, 9 alternating pairs: report p99 24-93 ms with the
/// reports on the followers, 46-213 ms spread over all three). After a leader change an
/// agent moves at its next report, so the fleet moves over one report interval.
pub fn next_report_to(current: usize, from_leader: bool, controllers: usize) -> usize {
    if from_leader && controllers > 1 {
        (current + 1) % controllers
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_from_the_leader_sends_the_next_report_to_another_controller() {
        assert_eq!(next_report_to(0, true, 3), 1);
        assert_eq!(next_report_to(2, true, 3), 0);
        assert_eq!(next_report_to(1, false, 3), 1, "a follower's answer: stay");
        assert_eq!(next_report_to(0, true, 1), 0, "the only controller: stay");
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
