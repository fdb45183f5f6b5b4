//! How long a task of the runtime serving the API waits for a worker. A report's handler
//! takes well under a millisecond, yet agents can wait hundreds when the workers are busy
//! elsewhere (or the process waits for a core): this is that wait, as an operator sees it.

use std::time::Duration;

/// How often the probe wakes: often enough to catch a burst of a few tens of milliseconds,
/// rarely enough to cost nothing (100 wake-ups a second).
pub const PERIOD: Duration = Duration::from_millis(10);

/// Gives `record`, until the runtime stops, how late this runtime wakes a task from a
/// timer due every [`PERIOD`] (the controller records it as
/// `gpuplane_runtime_wake_lag_seconds`; fleet-bench per moment of its run).
pub async fn probe_runtime_lag(mut record: impl FnMut(Duration)) {
    loop {
        let due = tokio::time::Instant::now() + PERIOD;
        tokio::time::sleep_until(due).await;
        record(tokio::time::Instant::now().saturating_duration_since(due));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::ControllerMetrics;

    fn lag_bucket(text: &str, le: &str) -> f64 {
        let series = format!("gpuplane_runtime_wake_lag_seconds_bucket{{le=\"{le}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(series.as_str())).and_then(|v| v.trim().parse().ok()).unwrap_or(-1.0)
    }

    /// The only worker held for 300 ms by other work: the probe, due within 10 ms of the
    /// start, wakes at least 290 ms late, and says so (a late wake-up only adds).
    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_held_by_other_work_shows_as_a_late_wake_up() {
        let metrics = ControllerMetrics::default();
        let recorder = metrics.clone();
        let probe = tokio::spawn(probe_runtime_lag(move |late| recorder.observe_runtime_lag(late)));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let before = metrics.render(&Default::default());
        assert!(lag_bucket(&before, "+Inf") >= 1.0, "the probe records every wake-up: {before}");
        std::thread::sleep(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let after = metrics.render(&Default::default());
        let late = |text: &str| lag_bucket(text, "+Inf") - lag_bucket(text, "0.2048");
        assert!(late(&after) - late(&before) >= 1.0, "a wake-up over 0.2 s late: {after}");
        probe.abort();
    }
}
