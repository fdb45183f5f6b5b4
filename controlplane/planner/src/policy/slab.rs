//! SLAB, GSLICE's Self-Learning Adaptive Batching (`gslice.txt`, Sec. 3.3.1): the largest
//! batch an inference function may form, re-derived after every batch from the SLO and the
//! batch's measured latency.
//!
//! The paper: "SLAB works by increasing or decreasing the batch size in proportion to the
//! current batch size, observed latency and deviation from the specified SLO, by checking the
//! headroom (SLO − avg. latency for the previous batch)." With `b` the size of the batch just
//! run and `L` its latency, the proportional step `b · headroom / L` gives
//!
//! ```text
//! next = b + b · (SLO − L) / L = b · SLO / L,   rounded down, bounded to [1, max_batch]
//! ```
//!
//! so a batch running at half the SLO doubles, and one 25% over shrinks by a fifth, in a
//! single step (the paper's convergence within 300–500 ms, Sec. 4.5, versus Clipper's AIMD).
//!
//! Provisioning signals (same paragraph): "An IF is considered to be underprovisioned when it
//! misses its SLO even with a batch size of 1. Instead, if the IF operates within the SLO,
//! then the IF may be overprovisioned. libml tracks (5 successive) such occurrences and
//! notifies the IF Manager to readjust (increase/decrease) its GPU resources."
//!
//! Choices:
//! * `b` is the batch actually executed, which may be below the current limit when fewer
//!   requests were waiting: the latency measured belongs to that batch, so the estimate of
//!   what fits the SLO is scaled from it, not from the limit.
//! * Rounding down keeps the next batch within the SLO under the linear latency model (a
//!   fixed overhead only makes it more conservative); a batch within the SLO never shrinks.
//! * "Operates within the SLO" is read as *within the SLO at the largest batch*, the mirror
//!   of "misses even at batch 1": only then can batching not absorb the headroom. Otherwise
//!   every healthy IF would be reported overprovisioned.
//! * The default `max_batch` is 64: GSLICE's aggregation tracks up to 64 distinct requests
//!   (Sec. 3.3.2). After a signal the streak restarts, so a persisting condition signals
//!   every 5 batches.

use super::validate::{at_least_one, positive, InvalidField};
use serde::{Deserialize, Serialize};

/// Refusals of [`Slab`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SlabError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlabConfig {
    /// Upper bound of the batch (paper: 64 requests aggregated, Sec. 3.3.2).
    pub max_batch: u32,
    /// Successive occurrences before a provisioning signal (paper: 5).
    pub signal_after: u32,
}

impl Default for SlabConfig {
    fn default() -> Self {
        SlabConfig { max_batch: 64, signal_after: 5 }
    }
}

/// What SLAB tells the IF manager about the IF's GPU%.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProvisioningSignal {
    /// Missed the SLO at batch 1, `signal_after` batches in a row: more GPU% needed.
    Underprovisioned,
    /// Within the SLO at `max_batch`, `signal_after` batches in a row: GPU% may be reduced.
    Overprovisioned,
}

/// How the batch limit moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchChange {
    Grow { from: u32, to: u32 },
    Shrink { from: u32, to: u32 },
    Keep,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlabDecision {
    /// The batch limit from now on.
    pub batch: u32,
    pub change: BatchChange,
    /// `SLO − L` of the batch just run, ms; negative when it missed.
    pub headroom_ms: f64,
    pub signal: Option<ProvisioningSignal>,
}

/// SLAB's state for one inference function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slab {
    slo_ms: f64,
    config: SlabConfig,
    batch: u32,
    under_streak: u32,
    over_streak: u32,
}

impl Slab {
    /// Starts at `initial_batch` (bounded to `[1, max_batch]`).
    pub fn new(slo_ms: f64, initial_batch: u32, config: SlabConfig) -> Result<Self, SlabError> {
        positive("slo_ms", slo_ms)?;
        at_least_one("initial_batch", initial_batch)?;
        at_least_one("config.max_batch", config.max_batch)?;
        at_least_one("config.signal_after", config.signal_after)?;
        Ok(Slab { slo_ms, config, batch: initial_batch.min(config.max_batch), under_streak: 0, over_streak: 0 })
    }

    /// The current batch limit.
    pub fn batch(&self) -> u32 {
        self.batch
    }

    /// Feeds the completion of one batch of `executed_batch` requests that took `latency_ms`
    /// and re-derives the limit. Bad input is refused and leaves the state unchanged.
    pub fn observe(&mut self, executed_batch: u32, latency_ms: f64) -> Result<SlabDecision, SlabError> {
        at_least_one("executed_batch", executed_batch)?;
        positive("latency_ms", latency_ms)?;
        let headroom_ms = self.slo_ms - latency_ms;
        // b · SLO / L, rounded down; the cast saturates for huge ratios before the bound.
        let fitted = (f64::from(executed_batch) * self.slo_ms / latency_ms).floor();
        let next = (fitted.min(f64::from(u32::MAX)) as u32).clamp(1, self.config.max_batch);
        let from = self.batch;
        let change = match next.cmp(&from) {
            std::cmp::Ordering::Greater => BatchChange::Grow { from, to: next },
            std::cmp::Ordering::Less => BatchChange::Shrink { from, to: next },
            std::cmp::Ordering::Equal => BatchChange::Keep,
        };
        self.batch = next;

        let missed_at_one = executed_batch == 1 && headroom_ms < 0.0;
        let within_at_max = executed_batch >= self.config.max_batch && headroom_ms >= 0.0;
        self.under_streak = if missed_at_one { self.under_streak + 1 } else { 0 };
        self.over_streak = if within_at_max { self.over_streak + 1 } else { 0 };
        let signal = if self.under_streak >= self.config.signal_after {
            self.under_streak = 0;
            Some(ProvisioningSignal::Underprovisioned)
        } else if self.over_streak >= self.config.signal_after {
            self.over_streak = 0;
            Some(ProvisioningSignal::Overprovisioned)
        } else {
            None
        };
        Ok(SlabDecision { batch: next, change, headroom_ms, signal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slab(initial: u32) -> Slab {
        Slab::new(50.0, initial, SlabConfig::default()).unwrap()
    }

    #[test]
    fn grows_in_proportion_to_the_headroom() {
        // VGG-19-like: 14 ms at batch 1 under a 50 ms SLO → ⌊50/14⌋ = 3.
        let mut s = slab(1);
        let d = s.observe(1, 14.0).unwrap();
        assert_eq!((d.batch, d.change, d.headroom_ms), (3, BatchChange::Grow { from: 1, to: 3 }, 36.0));
        // Batch 3 at 30 ms → ⌊3 · 50/30⌋ = 5; batch 5 at 45 ms → ⌊5.56⌋ = 5: converged.
        assert_eq!(s.observe(3, 30.0).unwrap().change, BatchChange::Grow { from: 3, to: 5 });
        assert_eq!(s.observe(5, 45.0).unwrap().change, BatchChange::Keep);
        assert_eq!(s.batch(), 5);
    }

    #[test]
    fn shrinks_when_the_slo_is_missed() {
        let mut s = slab(16);
        // 16 at 62.5 ms (25% over) → ⌊16 · 0.8⌋ = 12.8 → 12.
        let d = s.observe(16, 62.5).unwrap();
        assert_eq!((d.change, d.headroom_ms), (BatchChange::Shrink { from: 16, to: 12 }, -12.5));
        // Never below 1.
        assert_eq!(s.observe(2, 500.0).unwrap().batch, 1);
    }

    #[test]
    fn a_batch_exactly_at_the_slo_keeps_its_size() {
        let mut s = slab(8);
        assert_eq!(s.observe(8, 50.0).unwrap().change, BatchChange::Keep);
    }

    #[test]
    fn scales_from_the_batch_executed_not_the_limit() {
        // Limit 32, but only 4 requests were waiting: 4 at 20 ms → ⌊4 · 2.5⌋ = 10.
        let mut s = slab(32);
        assert_eq!(s.observe(4, 20.0).unwrap().change, BatchChange::Shrink { from: 32, to: 10 });
    }

    #[test]
    fn bounded_by_max_batch() {
        let mut s = Slab::new(50.0, 100, SlabConfig { max_batch: 16, signal_after: 5 }).unwrap();
        assert_eq!(s.batch(), 16);
        assert_eq!(s.observe(16, 1.0).unwrap().batch, 16);
        assert_eq!(s.observe(1, 1e-300).unwrap().batch, 16);
    }

    #[test]
    fn underprovisioned_after_five_successive_misses_at_batch_one() {
        let mut s = slab(1);
        for _ in 0..4 {
            assert_eq!(s.observe(1, 60.0).unwrap().signal, None);
        }
        assert_eq!(s.observe(1, 60.0).unwrap().signal, Some(ProvisioningSignal::Underprovisioned));
        // The streak restarts after a signal, and any other outcome breaks it.
        for _ in 0..4 {
            assert_eq!(s.observe(1, 60.0).unwrap().signal, None);
        }
        assert_eq!(s.observe(1, 40.0).unwrap().signal, None);
        for _ in 0..4 {
            assert_eq!(s.observe(1, 60.0).unwrap().signal, None);
        }
        assert_eq!(s.observe(1, 60.0).unwrap().signal, Some(ProvisioningSignal::Underprovisioned));
    }

    #[test]
    fn a_miss_above_batch_one_is_not_underprovisioning() {
        let mut s = slab(4);
        for _ in 0..10 {
            assert_eq!(s.observe(2, 60.0).unwrap().signal, None);
        }
    }

    #[test]
    fn overprovisioned_after_five_batches_within_the_slo_at_max_batch() {
        let mut s = Slab::new(50.0, 8, SlabConfig { max_batch: 8, signal_after: 5 }).unwrap();
        for _ in 0..4 {
            assert_eq!(s.observe(8, 20.0).unwrap().signal, None);
        }
        assert_eq!(s.observe(8, 20.0).unwrap().signal, Some(ProvisioningSignal::Overprovisioned));
        // Below the maximum, headroom is for batching to use: no signal.
        for _ in 0..10 {
            assert_eq!(s.observe(7, 20.0).unwrap().signal, None);
        }
    }

    #[test]
    fn refuses_bad_input_and_keeps_its_state() {
        let mut s = slab(4);
        let field = |r: Result<SlabDecision, SlabError>| match r {
            Err(SlabError::Invalid(f)) => f.field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(field(s.observe(0, 10.0)), "executed_batch");
        assert_eq!(field(s.observe(4, 0.0)), "latency_ms");
        assert_eq!(field(s.observe(4, f64::NAN)), "latency_ms");
        assert_eq!(s.batch(), 4);
        let new = |slo, b, c| match Slab::new(slo, b, c) {
            Err(SlabError::Invalid(f)) => f.field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        let d = SlabConfig::default();
        assert_eq!(new(-1.0, 1, d), "slo_ms");
        assert_eq!(new(50.0, 0, d), "initial_batch");
        assert_eq!(new(50.0, 1, SlabConfig { max_batch: 0, ..d }), "config.max_batch");
        assert_eq!(new(50.0, 1, SlabConfig { signal_after: 0, ..d }), "config.signal_after");
    }
}
