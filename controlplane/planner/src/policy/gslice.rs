//! GSLICE self-tuning of an inference function's MPS GPU% (Dhakal, Kulkarni, Ramakrishnan:
//! "GSLICE: Controlled Spatial Sharing of GPUs for a Scalable Inference Platform", SoCC '20;
//! `gslice.txt`, Sec. 3.2.2, Algorithm 1 "GPU Resource Tuning Algorithm", and the hold-down
//! of Sec. 3.2.1).
//!
//! Algorithm 1 on EWMAs of the measured latency and throughput:
//!
//! ```text
//! residualL = SLO − avgL                diffL% = residualL × 100 / SLO
//! residualT = avgT − arrivalRate        diffT% = residualT × 100 / arrivalRate
//! changeFactor = MAX(|residualL| / avgL, |residualT| / avgT)
//! changeGPU%   = currentGPU% × changeFactor
//! either residual < 0            → newGPU% = currentGPU% + changeGPU%
//! both residuals > 0 (and > 5%)  → newGPU% = currentGPU% − changeGPU%
//! ```
//!
//! A re-allocation happens only when the change is above a threshold (5%, Sec. 3.2.2, "to
//! avoid oscillations"), and no sooner than 10 s after the previous one (Sec. 3.2.1: restarting
//! an IF costs 2–15 s, so changes are held down). The result is bounded to `[min, 100]`.
//! Algorithm 1 adjusts only the GPU%; batch sizes stay as planned (GSLICE's SLAB adapts them
//! inside the inference process, which gpuplane leaves to the serving framework), and
//! the new GPU% is the demand and weight fed to [`super::fair_share`] (Sec. 3.2.3).
//!
//! Choices where the paper's text is ambiguous (each also noted where it is used):
//! * The hold guard. The pseudocode returns `currentGPU%` when `diffL% < threshold &&
//!   diffT% < threshold`, which, read literally, also holds when both residuals are very
//!   negative and so never increases an overloaded IF, contradicting the prose ("when either
//!   of these residual capacities is negative, we try to proportionally increase") and
//!   Fig. 16 (VGG-19 at 65 ms > 50 ms and 15 < 35 req/s is increased). We follow the prose:
//!   increase on any negative residual; decrease only when both `diffL%` and `diffT%` exceed
//!   the threshold; hold otherwise.
//! * `changeFactor` on an increase uses only the negative residuals: with the literal `abs`,
//!   a large latency *surplus* would inflate the increase demanded by a small throughput
//!   deficit. On a decrease both residuals are positive and the formula is the literal one.
//! * "Change above a threshold (5%)" is read relative to the current GPU%, i.e.
//!   `changeFactor >= 5%` before bounding, so a change clipped by the bounds still happens.
//! * No arrivals (`arrivalRate = 0`): the throughput side has unlimited headroom
//!   (`diffT%` is `None`) and contributes 0 to `changeFactor` when nothing was served either;
//!   zero throughput under load makes `changeFactor` infinite, i.e. go to 100%.
//! * The EWMA weight is not given; 0.25 for the newest sample by default. The first sample
//!   seeds it. The EWMAs keep running through hold-down and are not reset on a change.
//! * The first decision is not held down (no previous adjustment); the hold-down ends at
//!   exactly `last + 10 s`.

use super::validate::{finite, in_range, non_negative, positive, InvalidField};
use serde::{Deserialize, Serialize};

/// Refusals of [`GpuTuner`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GsliceError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
}

/// Algorithm 1's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TunerConfig {
    /// Weight of the newest sample in the latency and throughput EWMAs, in `(0, 1]`.
    pub ewma_weight: f64,
    /// Both `diffL%` and `diffT%` must exceed this to decrease (paper: 5%).
    pub threshold_pct: f64,
    /// Smallest `changeFactor` acted on (paper: 5%, "to avoid oscillations").
    pub min_change_fraction: f64,
    /// Minimum time between two adjustments, seconds (paper: 10 s, Sec. 3.2.1).
    pub hold_down_s: f64,
    /// Lower bound of the GPU%; the upper bound is 100.
    pub min_gpu_pct: f64,
}

impl Default for TunerConfig {
    fn default() -> Self {
        // 5%, 5% and 10 s are the paper's; the EWMA weight and the 5% floor are ours (the
        // paper's Fig. 16 tunes ResNet-50 down to 8%, so the floor must sit below that).
        TunerConfig { ewma_weight: 0.25, threshold_pct: 5.0, min_change_fraction: 0.05, hold_down_s: 10.0, min_gpu_pct: 5.0 }
    }
}

/// Algorithm 1's intermediate values, reported with every decision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Residuals {
    /// `avgL`, ms.
    pub avg_latency_ms: f64,
    /// `avgT`, req/s.
    pub avg_throughput_rps: f64,
    /// `residualL = SLO − avgL`, ms.
    pub residual_latency_ms: f64,
    /// `residualT = avgT − arrivalRate`, req/s.
    pub residual_throughput_rps: f64,
    pub diff_latency_pct: f64,
    /// `None` when there are no arrivals (unlimited throughput headroom).
    pub diff_throughput_pct: Option<f64>,
    /// The factor behind the proposed change; 0 when holding within the threshold.
    pub change_factor: f64,
}

/// Which residual capacity is negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Deficit {
    /// Latency above the SLO.
    Latency,
    /// Throughput below the arrival rate.
    Throughput,
    Both,
}

/// Why the GPU% stays.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum HoldReason {
    /// No deficit, and at least one headroom within the threshold.
    WithinThreshold,
    /// The change would be below `min_change_fraction` of the current GPU%.
    ChangeBelowMinimum { change_factor: f64 },
    /// The change points past a bound the GPU% is already at.
    AtBound { bound_pct: f64 },
    /// A change to `proposed_pct` is due but the previous one was less than the hold-down ago.
    HoldDown { until_s: f64, proposed_pct: f64 },
}

/// What to do with the IF's GPU%.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum TuningAction {
    Increase { from_pct: f64, to_pct: f64, by_pct: f64, cause: Deficit },
    Decrease { from_pct: f64, to_pct: f64, by_pct: f64 },
    Hold { reason: HoldReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TuningDecision {
    pub action: TuningAction,
    pub residuals: Residuals,
}

/// Algorithm 1's state for one inference function: the EWMAs and the time of the last
/// adjustment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuTuner {
    slo_ms: f64,
    config: TunerConfig,
    avg_latency_ms: Option<f64>,
    avg_throughput_rps: Option<f64>,
    last_observed_s: Option<f64>,
    last_adjusted_s: Option<f64>,
}

impl GpuTuner {
    pub fn new(slo_ms: f64, config: TunerConfig) -> Result<Self, GsliceError> {
        positive("slo_ms", slo_ms)?;
        positive("config.ewma_weight", config.ewma_weight)?;
        in_range("config.ewma_weight", config.ewma_weight, 0.0, 1.0)?;
        non_negative("config.threshold_pct", config.threshold_pct)?;
        non_negative("config.min_change_fraction", config.min_change_fraction)?;
        non_negative("config.hold_down_s", config.hold_down_s)?;
        positive("config.min_gpu_pct", config.min_gpu_pct)?;
        in_range("config.min_gpu_pct", config.min_gpu_pct, 0.0, 100.0)?;
        Ok(GpuTuner { slo_ms, config, avg_latency_ms: None, avg_throughput_rps: None, last_observed_s: None, last_adjusted_s: None })
    }

    /// The latency and throughput EWMAs, once a sample has been seen.
    pub fn averages(&self) -> Option<(f64, f64)> {
        self.avg_latency_ms.zip(self.avg_throughput_rps)
    }

    /// Feeds one measurement (latency ms, throughput and arrival rate req/s, all over the
    /// same interval ending at `now_s`) and runs Algorithm 1 for the IF now at
    /// `current_gpu_pct`. An `Increase` or `Decrease` starts the hold-down: the caller is
    /// expected to apply it. Bad input is refused and leaves the state unchanged.
    pub fn observe(
        &mut self,
        now_s: f64,
        latency_ms: f64,
        throughput_rps: f64,
        arrival_rate_rps: f64,
        current_gpu_pct: f64,
    ) -> Result<TuningDecision, GsliceError> {
        finite("now_s", now_s)?;
        if let Some(last) = self.last_observed_s.filter(|&last| now_s < last) {
            return Err(InvalidField::new("now_s", format!("goes back in time ({now_s} < previous {last})")).into());
        }
        positive("latency_ms", latency_ms)?;
        non_negative("throughput_rps", throughput_rps)?;
        non_negative("arrival_rate_rps", arrival_rate_rps)?;
        positive("current_gpu_pct", current_gpu_pct)?;
        in_range("current_gpu_pct", current_gpu_pct, 0.0, 100.0)?;

        let w = self.config.ewma_weight;
        let ewma = |avg: Option<f64>, x: f64| avg.map_or(x, |a| w * x + (1.0 - w) * a);
        let avg_l = ewma(self.avg_latency_ms, latency_ms);
        let avg_t = ewma(self.avg_throughput_rps, throughput_rps);
        self.avg_latency_ms = Some(avg_l);
        self.avg_throughput_rps = Some(avg_t);
        self.last_observed_s = Some(now_s);

        let residual_l = self.slo_ms - avg_l;
        let residual_t = avg_t - arrival_rate_rps;
        let diff_l = residual_l * 100.0 / self.slo_ms;
        let diff_t = (arrival_rate_rps > 0.0).then(|| residual_t * 100.0 / arrival_rate_rps);
        let latency_term = residual_l.abs() / avg_l;
        // avgT = 0: no term without demand, an unbounded one under demand.
        let throughput_term = if avg_t > 0.0 {
            residual_t.abs() / avg_t
        } else if residual_t < 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        let mut residuals = Residuals {
            avg_latency_ms: avg_l,
            avg_throughput_rps: avg_t,
            residual_latency_ms: residual_l,
            residual_throughput_rps: residual_t,
            diff_latency_pct: diff_l,
            diff_throughput_pct: diff_t,
            change_factor: 0.0,
        };
        let hold = |reason, residuals| Ok(TuningDecision { action: TuningAction::Hold { reason }, residuals });

        let threshold = self.config.threshold_pct;
        // `Some(deficit)`: increase; `None`: decrease.
        let (deficit, change_factor) = match (residual_l < 0.0, residual_t < 0.0) {
            // Only the deficits set the increase (module docs).
            (true, true) => (Some(Deficit::Both), latency_term.max(throughput_term)),
            (true, false) => (Some(Deficit::Latency), latency_term),
            (false, true) => (Some(Deficit::Throughput), throughput_term),
            (false, false) if diff_l > threshold && diff_t.is_none_or(|d| d > threshold) => (None, latency_term.max(throughput_term)),
            (false, false) => return hold(HoldReason::WithinThreshold, residuals),
        };
        residuals.change_factor = change_factor;
        if change_factor < self.config.min_change_fraction {
            return hold(HoldReason::ChangeBelowMinimum { change_factor }, residuals);
        }

        let from = current_gpu_pct;
        let change = from * change_factor;
        let increase = deficit.is_some();
        let (to, bound) = if increase {
            ((from + change).min(100.0), 100.0)
        } else {
            ((from - change).max(self.config.min_gpu_pct), self.config.min_gpu_pct)
        };
        if (increase && to <= from) || (!increase && to >= from) {
            return hold(HoldReason::AtBound { bound_pct: bound }, residuals);
        }
        if let Some(last) = self.last_adjusted_s {
            let until_s = last + self.config.hold_down_s;
            if now_s < until_s {
                return hold(HoldReason::HoldDown { until_s, proposed_pct: to }, residuals);
            }
        }
        self.last_adjusted_s = Some(now_s);
        let by_pct = (to - from).abs();
        let action = match deficit {
            Some(cause) => TuningAction::Increase { from_pct: from, to_pct: to, by_pct, cause },
            None => TuningAction::Decrease { from_pct: from, to_pct: to, by_pct },
        };
        Ok(TuningDecision { action, residuals })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuner() -> GpuTuner {
        GpuTuner::new(50.0, TunerConfig::default()).unwrap()
    }

    /// EWMA weight 1: each sample replaces the averages.
    fn instant() -> GpuTuner {
        GpuTuner::new(50.0, TunerConfig { ewma_weight: 1.0, ..TunerConfig::default() }).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn ewma_and_residual_arithmetic_by_hand() {
        let mut t = tuner();
        // Sample 1 seeds the EWMAs: diffL = 2 × 100 / 50 = 4% < 5%: hold.
        let d = t.observe(0.0, 48.0, 100.0, 90.0, 60.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::WithinThreshold });
        assert_eq!(d.residuals.change_factor, 0.0);
        // Sample 2: avgL = 0.25 · 40 + 0.75 · 48 = 46; avgT = 0.25 · 80 + 0.75 · 100 = 95.
        // residualL = 4 (8%), residualT = 5 (5.56%): both above 5%, so decrease by
        // max(4/46, 5/95) = 4/46 of 60%.
        let d = t.observe(1.0, 40.0, 80.0, 90.0, 60.0).unwrap();
        let r = d.residuals;
        assert_eq!((r.avg_latency_ms, r.avg_throughput_rps), (46.0, 95.0));
        assert_eq!((r.residual_latency_ms, r.residual_throughput_rps), (4.0, 5.0));
        assert_eq!(r.diff_latency_pct, 8.0);
        assert!(close(r.diff_throughput_pct.unwrap(), 500.0 / 90.0));
        assert!(close(r.change_factor, 4.0 / 46.0));
        let TuningAction::Decrease { from_pct, to_pct, by_pct } = d.action else { panic!("{d:?}") };
        assert_eq!(from_pct, 60.0);
        assert!(close(to_pct, 60.0 - 60.0 * 4.0 / 46.0));
        assert!(close(by_pct, 60.0 * 4.0 / 46.0));
        assert_eq!(t.averages(), Some((46.0, 95.0)));
    }

    #[test]
    fn overloaded_if_is_increased_as_in_fig_16() {
        // VGG-19 at 30%: 65 ms > 50 ms SLO and 15 < 35 req/s. changeFactor =
        // max(15/65, 20/15) = 4/3, so 30 + 40 = 70%.
        let d = tuner().observe(2.0, 65.0, 15.0, 35.0, 30.0).unwrap();
        assert!(close(d.residuals.change_factor, 20.0 / 15.0));
        let TuningAction::Increase { from_pct, to_pct, by_pct, cause } = d.action else { panic!("{d:?}") };
        assert_eq!((from_pct, cause), (30.0, Deficit::Both));
        assert!(close(to_pct, 70.0) && close(by_pct, 40.0));
    }

    #[test]
    fn overprovisioned_if_is_decreased_to_the_floor() {
        // ResNet-50 at 30%: 20 ms and 120 req/s for 35 req/s. changeFactor = max(30/20,
        // 85/120) = 1.5: 30 − 45 < 0, bounded at the 5% floor.
        let d = tuner().observe(2.0, 20.0, 120.0, 35.0, 30.0).unwrap();
        assert_eq!(d.residuals.change_factor, 1.5);
        assert_eq!(d.action, TuningAction::Decrease { from_pct: 30.0, to_pct: 5.0, by_pct: 25.0 });
    }

    #[test]
    fn an_increase_is_sized_by_the_deficit_only() {
        // Latency 55 ms (−5) with throughput 200 for 100 req/s: factor 5/55, not the
        // throughput surplus's 100/200.
        let d = tuner().observe(0.0, 55.0, 200.0, 100.0, 40.0).unwrap();
        let TuningAction::Increase { to_pct, cause, .. } = d.action else { panic!("{d:?}") };
        assert_eq!(cause, Deficit::Latency);
        assert!(close(to_pct, 40.0 * (1.0 + 5.0 / 55.0)));
        // Throughput 80 for 100 req/s with latency headroom: factor 20/80.
        let d = tuner().observe(0.0, 10.0, 80.0, 100.0, 40.0).unwrap();
        assert_eq!(d.action, TuningAction::Increase { from_pct: 40.0, to_pct: 50.0, by_pct: 10.0, cause: Deficit::Throughput });
    }

    #[test]
    fn holds_when_one_headroom_is_within_the_threshold() {
        // Latency headroom 2% (49 ms), throughput headroom 100%: no decrease.
        let d = tuner().observe(0.0, 49.0, 200.0, 100.0, 40.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::WithinThreshold });
        // Throughput headroom 4%, latency headroom 60%.
        let d = tuner().observe(0.0, 20.0, 104.0, 100.0, 40.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::WithinThreshold });
    }

    #[test]
    fn holds_when_the_change_is_below_five_percent() {
        // 51 ms: a deficit, but changeFactor = 1/51 < 0.05.
        let d = tuner().observe(0.0, 51.0, 100.0, 100.0, 40.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::ChangeBelowMinimum { change_factor: 1.0 / 51.0 } });
    }

    #[test]
    fn hold_down_of_ten_seconds_between_adjustments() {
        let mut t = tuner();
        let d = t.observe(0.0, 100.0, 10.0, 20.0, 20.0).unwrap();
        assert!(matches!(d.action, TuningAction::Increase { .. }), "{d:?}");
        // Still overloaded 5 s later: held down until 10 s, with the EWMAs still moving.
        let d = t.observe(5.0, 80.0, 10.0, 20.0, 40.0).unwrap();
        let TuningAction::Hold { reason: HoldReason::HoldDown { until_s, proposed_pct } } = d.action else { panic!("{d:?}") };
        assert_eq!(until_s, 10.0);
        assert!(proposed_pct > 40.0);
        assert_eq!(d.residuals.avg_latency_ms, 0.25 * 80.0 + 0.75 * 100.0);
        assert!(matches!(t.observe(9.999, 80.0, 10.0, 20.0, 40.0).unwrap().action, TuningAction::Hold { .. }));
        // At exactly 10 s the change goes through, and starts a new hold-down.
        assert!(matches!(t.observe(10.0, 80.0, 10.0, 20.0, 40.0).unwrap().action, TuningAction::Increase { .. }));
        assert!(matches!(
            t.observe(12.0, 80.0, 10.0, 20.0, 80.0).unwrap().action,
            TuningAction::Hold { reason: HoldReason::HoldDown { until_s: 20.0, .. } }
        ));
    }

    #[test]
    fn a_hold_down_is_reported_only_when_a_change_is_due() {
        let mut t = instant();
        assert!(matches!(t.observe(0.0, 100.0, 10.0, 20.0, 20.0).unwrap().action, TuningAction::Increase { .. }));
        // Two seconds later the IF is within the threshold: that is the reason, not the hold-down.
        let d = t.observe(2.0, 49.0, 100.0, 100.0, 40.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::WithinThreshold });
    }

    #[test]
    fn bounded_to_min_and_one_hundred() {
        let d = tuner().observe(0.0, 100.0, 10.0, 20.0, 100.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::AtBound { bound_pct: 100.0 } });
        let d = tuner().observe(0.0, 100.0, 10.0, 20.0, 80.0).unwrap();
        assert_eq!(d.action, TuningAction::Increase { from_pct: 80.0, to_pct: 100.0, by_pct: 20.0, cause: Deficit::Both });
        let d = tuner().observe(0.0, 10.0, 100.0, 10.0, 5.0).unwrap();
        assert_eq!(d.action, TuningAction::Hold { reason: HoldReason::AtBound { bound_pct: 5.0 } });
        // Holding at a bound starts no hold-down.
        let mut t = instant();
        t.observe(0.0, 100.0, 10.0, 20.0, 100.0).unwrap();
        assert!(matches!(t.observe(1.0, 10.0, 100.0, 10.0, 100.0).unwrap().action, TuningAction::Decrease { .. }));
    }

    #[test]
    fn no_throughput_under_load_goes_to_one_hundred_and_no_load_to_the_floor() {
        let d = tuner().observe(0.0, 10.0, 0.0, 10.0, 30.0).unwrap();
        assert_eq!(d.residuals.change_factor, f64::INFINITY);
        assert_eq!(d.action, TuningAction::Increase { from_pct: 30.0, to_pct: 100.0, by_pct: 70.0, cause: Deficit::Throughput });
        // No arrivals: diffT is None (unlimited headroom); latency headroom 40/10 decides.
        let d = tuner().observe(0.0, 10.0, 0.0, 0.0, 30.0).unwrap();
        assert_eq!(d.residuals.diff_throughput_pct, None);
        assert_eq!(d.residuals.change_factor, 4.0);
        assert_eq!(d.action, TuningAction::Decrease { from_pct: 30.0, to_pct: 5.0, by_pct: 25.0 });
    }

    #[test]
    fn refuses_bad_input_and_keeps_its_state() {
        let mut t = tuner();
        t.observe(10.0, 48.0, 100.0, 100.0, 40.0).unwrap();
        let field = |r: Result<TuningDecision, GsliceError>| match r {
            Err(GsliceError::Invalid(f)) => f.field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(field(t.observe(9.0, 48.0, 100.0, 100.0, 40.0)), "now_s");
        assert_eq!(field(t.observe(11.0, 0.0, 100.0, 100.0, 40.0)), "latency_ms");
        assert_eq!(field(t.observe(11.0, f64::NAN, 100.0, 100.0, 40.0)), "latency_ms");
        assert_eq!(field(t.observe(11.0, 48.0, -1.0, 100.0, 40.0)), "throughput_rps");
        assert_eq!(field(t.observe(11.0, 48.0, 100.0, f64::INFINITY, 40.0)), "arrival_rate_rps");
        assert_eq!(field(t.observe(11.0, 48.0, 100.0, 100.0, 0.0)), "current_gpu_pct");
        assert_eq!(field(t.observe(11.0, 48.0, 100.0, 100.0, 100.5)), "current_gpu_pct");
        assert_eq!(t.averages(), Some((48.0, 100.0)));

        let bad = |c: TunerConfig| match GpuTuner::new(50.0, c) {
            Err(GsliceError::Invalid(f)) => f.field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        let d = TunerConfig::default();
        assert_eq!(bad(TunerConfig { ewma_weight: 0.0, ..d }), "config.ewma_weight");
        assert_eq!(bad(TunerConfig { ewma_weight: 1.5, ..d }), "config.ewma_weight");
        assert_eq!(bad(TunerConfig { min_gpu_pct: 120.0, ..d }), "config.min_gpu_pct");
        assert_eq!(bad(TunerConfig { hold_down_s: f64::NAN, ..d }), "config.hold_down_s");
        assert!(matches!(GpuTuner::new(0.0, d), Err(GsliceError::Invalid(f)) if f.field == "slo_ms"));
    }
}
