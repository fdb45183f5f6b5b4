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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_reports_at_its_own_interval_or_the_longer_one_asked_for_up_to_a_minute() {
        let own = Duration::from_secs(1);
        assert_eq!(next_report_in(own, 0), own);
        assert_eq!(next_report_in(own, 500), own);
        assert_eq!(next_report_in(own, 5_000), Duration::from_secs(5));
        assert_eq!(next_report_in(own, u32::MAX), MAX_REPORT_INTERVAL);
    }
}
