//! Per-second windows of the router's measurements (iGniter Sec. 4.2 monitors "the P99
//! latency of each inference workload every second"): p99 and p50 latency of the requests
//! completed in the window, throughput (completions/s), arrival rate (arrivals/s), failures.
//!
//! Pure: time is passed in as milliseconds since an epoch. Latencies go into an HDR
//! histogram (3 significant digits, 1 µs .. 1 h), so p99 is exact to 0.1% at any load.

use hdrhistogram::Histogram;

/// Statistics of one closed window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStats {
    /// Window number since the epoch (`start_ms / length_ms`).
    pub index: u64,
    pub length_ms: u64,
    /// p99 latency of successful requests, ms; `None` when none completed.
    pub p99_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub completed: u64,
    pub failed: u64,
    pub arrivals: u64,
}

impl WindowStats {
    /// Completions per second.
    pub fn throughput_rps(&self) -> f64 {
        self.completed as f64 * 1000.0 / self.length_ms as f64
    }

    /// Arrivals per second.
    pub fn arrival_rps(&self) -> f64 {
        self.arrivals as f64 * 1000.0 / self.length_ms as f64
    }
}

/// The window being filled.
#[derive(Debug, Clone)]
pub struct Window {
    length_ms: u64,
    index: u64,
    latencies_us: Histogram<u64>,
    completed: u64,
    failed: u64,
    arrivals: u64,
}

const MAX_LATENCY_US: u64 = 3_600_000_000;

impl Window {
    /// A window series of `length_ms` (≥ 1; 1000 for per-second windows) starting at 0.
    pub fn new(length_ms: u64) -> Result<Self, hdrhistogram::CreationError> {
        let latencies_us = Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?;
        Ok(Window { length_ms: length_ms.max(1), index: 0, latencies_us, completed: 0, failed: 0, arrivals: 0 })
    }

    /// Closes the current window if `now_ms` is past it. Returns the closed window and, when
    /// whole windows passed with no event at all, one empty window standing for that idle
    /// gap (so "consecutive windows" rules see the break) — at most two entries.
    pub fn advance(&mut self, now_ms: u64) -> Vec<WindowStats> {
        let now_index = now_ms / self.length_ms;
        if now_index <= self.index {
            return Vec::new();
        }
        let mut closed = vec![self.stats()];
        if now_index > self.index + 1 {
            closed.push(WindowStats {
                index: now_index - 1,
                length_ms: self.length_ms,
                p99_ms: None,
                p50_ms: None,
                completed: 0,
                failed: 0,
                arrivals: 0,
            });
        }
        self.index = now_index;
        self.latencies_us.reset();
        (self.completed, self.failed, self.arrivals) = (0, 0, 0);
        closed
    }

    /// Counts an arrival at `now_ms`; returns any windows this closed.
    pub fn arrival(&mut self, now_ms: u64) -> Vec<WindowStats> {
        let closed = self.advance(now_ms);
        self.arrivals += 1;
        closed
    }

    /// Records a successful request that completed at `now_ms` after `latency_us`.
    pub fn completed(&mut self, now_ms: u64, latency_us: u64) -> Vec<WindowStats> {
        let closed = self.advance(now_ms);
        self.latencies_us.saturating_record(latency_us.clamp(1, MAX_LATENCY_US));
        self.completed += 1;
        closed
    }

    /// Records a failed request at `now_ms` (not part of the latency percentiles).
    pub fn failed(&mut self, now_ms: u64) -> Vec<WindowStats> {
        let closed = self.advance(now_ms);
        self.failed += 1;
        closed
    }

    /// The current (open) window's statistics so far.
    pub fn stats(&self) -> WindowStats {
        let q = |q: f64| (self.completed > 0).then(|| self.latencies_us.value_at_quantile(q) as f64 / 1000.0);
        WindowStats {
            index: self.index,
            length_ms: self.length_ms,
            p99_ms: q(0.99),
            p50_ms: q(0.5),
            completed: self.completed,
            failed: self.failed,
            arrivals: self.arrivals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_throughput_and_arrivals_per_second() {
        let mut w = Window::new(1000).unwrap();
        // Second 0: 100 arrivals, 100 completions at 1..=100 ms, 2 failures.
        for i in 1..=100u64 {
            assert!(w.arrival(i * 5).is_empty());
            assert!(w.completed(i * 5 + 1, i * 1000).is_empty());
        }
        w.failed(990);
        w.failed(991);
        let closed = w.arrival(1500);
        assert_eq!(closed.len(), 1);
        let s = &closed[0];
        assert_eq!((s.index, s.completed, s.failed, s.arrivals), (0, 100, 2, 100));
        // HDR with 3 digits: 99 ms is recorded within 0.1%.
        let p99 = s.p99_ms.unwrap();
        assert!((p99 - 99.0).abs() < 0.1, "{p99}");
        assert!((s.p50_ms.unwrap() - 50.0).abs() < 0.1);
        assert_eq!(s.throughput_rps(), 100.0);
        assert_eq!(s.arrival_rps(), 100.0);
        // The new window holds only what came after.
        assert_eq!(w.stats().arrivals, 1);
        assert_eq!(w.stats().p99_ms, None);
    }

    #[test]
    fn idle_gaps_close_as_one_empty_window() {
        let mut w = Window::new(1000).unwrap();
        w.completed(10, 5_000);
        let closed = w.advance(4_200);
        assert_eq!(closed.len(), 2);
        assert_eq!(closed[0].index, 0);
        // HDR reports the highest value equivalent to the sample (within 0.1%).
        assert!(closed[0].p99_ms.is_some_and(|p| (5.0..5.005).contains(&p)), "{:?}", closed[0].p99_ms);
        assert_eq!(closed[1], WindowStats { index: 3, length_ms: 1000, p99_ms: None, p50_ms: None, completed: 0, failed: 0, arrivals: 0 });
        assert_eq!(w.stats().index, 4);
        assert!(w.advance(4_999).is_empty());
    }

    #[test]
    fn shorter_windows_scale_rates() {
        let mut w = Window::new(100).unwrap();
        for t in 0..10 {
            w.arrival(t);
        }
        let s = &w.advance(100)[0];
        assert_eq!(s.arrival_rps(), 100.0);
        // Out-of-range latencies saturate instead of failing.
        w.completed(150, u64::MAX);
        assert!(w.stats().p99_ms.unwrap() >= 3_600_000.0 * 0.999);
    }
}
