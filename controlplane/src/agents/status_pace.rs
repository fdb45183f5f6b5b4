//! How fast the leader writes agents' observed state into their Nodes' statuses
//! (`[loops] status_write_kib_per_s`): a token bucket (governor's GCRA) over the KiB of
//! reports whose states the status writer puts into the log.
//!
//! After a fleet-wide re-plan every agent that got new work reports a changed state: at
//! 10,000 hosts about 6,000 of them, 22 MB of JSON that every controller encodes, stores,
//! replicates, decodes and applies. Unpaced, how much of that lands in one second depends
//! only on when the agents report; paced, a burst cannot take more than the bucket from the
//! reports and the desired state at once (an observed state is what nobody waits for).
//! It is a bound, not a tuning: at the default and 10,000 hosts reporting every 5 s no
//! entry waited (README, Fleet scale); faster report intervals or larger bursts meet it.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Default rate: 4 MiB of reports a second (a report with 8 GPUs and 40 workloads is about
/// 2 KB, so some 2,000 changed states a second).
pub const DEFAULT_KIB_PER_S: u32 = 4 * 1024;
/// Bounds of `[loops] status_write_kib_per_s`: at least a few reports a second, at most
/// 1 GiB a second (no pacing in practice).
pub const MIN_KIB_PER_S: u32 = 8;
pub const MAX_KIB_PER_S: u32 = 1024 * 1024;

pub struct StatusPace {
    bucket: DefaultDirectRateLimiter,
    /// Two seconds' worth: what may be written at once after a quiet spell.
    burst_kib: NonZeroU32,
}

impl StatusPace {
    /// `kib_per_s` is clamped to [`MIN_KIB_PER_S`, `MAX_KIB_PER_S`] (the config is checked
    /// against the same bounds, with an error naming the field).
    pub fn new(kib_per_s: u32) -> Self {
        let rate = NonZeroU32::new(kib_per_s.clamp(MIN_KIB_PER_S, MAX_KIB_PER_S)).expect("at least MIN_KIB_PER_S");
        let burst_kib = rate.saturating_mul(NonZeroU32::new(2).expect("2 > 0"));
        Self { bucket: RateLimiter::direct(Quota::per_second(rate).allow_burst(burst_kib)), burst_kib }
    }

    /// The bucket's cells for an entry of `bytes` of reports: whole KiB, at least one, and
    /// at most the burst (one larger entry is let through once the bucket is full).
    fn cells(&self, bytes: usize) -> NonZeroU32 {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        NonZeroU32::new(kib.max(1)).expect("max(1)").min(self.burst_kib)
    }

    /// Waits until an entry of `bytes` of reports may be written.
    pub async fn until_ready(&self, bytes: usize) {
        // Never more cells than the burst (`cells`), so never `InsufficientCapacity`.
        let _ = self.bucket.until_n_ready(self.cells(bytes)).await;
    }

    /// Whether an entry of `bytes` may be written now (taking its cells if so).
    #[cfg(test)]
    fn admits_now(&self, bytes: usize) -> bool {
        matches!(self.bucket.check_n(self.cells(bytes)), Ok(Ok(())))
    }
}

impl Default for StatusPace {
    fn default() -> Self {
        Self::new(DEFAULT_KIB_PER_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_charged_its_kib_rounded_up_and_never_more_than_the_burst() {
        let pace = StatusPace::new(64);
        assert_eq!(pace.cells(0).get(), 1);
        assert_eq!(pace.cells(1).get(), 1);
        assert_eq!(pace.cells(1024).get(), 1);
        assert_eq!(pace.cells(1025).get(), 2);
        assert_eq!(pace.cells(usize::MAX).get(), 128, "an entry past the burst waits for a full bucket, no more");
        assert_eq!(StatusPace::new(0).burst_kib.get(), 2 * MIN_KIB_PER_S);
        assert_eq!(StatusPace::new(u32::MAX).burst_kib.get(), 2 * MAX_KIB_PER_S);
    }

    #[test]
    fn two_seconds_of_states_go_at_once_and_the_next_waits() {
        // 64 KiB/s: the bucket holds 128 KiB; refilling the 32 KiB asked next takes 0.5 s,
        // far longer than this test between the two checks.
        let pace = StatusPace::new(64);
        assert!(pace.admits_now(100 * 1024));
        assert!(pace.admits_now(28 * 1024));
        assert!(!pace.admits_now(32 * 1024));
        // An entry larger than the bucket is not refused for ever: it asks for a full one.
        let fresh = StatusPace::new(64);
        assert!(fresh.admits_now(10 * 1024 * 1024));
    }
}
