//! Each service's saturation target from its own SLO and predicted latency, corrected by what
//! its windows show.
//!
//! HetSev sizes every service for one throughput saturation θ (80% "based on experience",
//! Sec. 4.1). What a service can bear depends on its SLO and its batch time: a 300 ms SLO on
//! a 20 ms batch has room that a 60 ms SLO on a 27 ms batch does not. Here each service gets
//! a θ of its own:
//!
//! * **Prediction.** A window's p99 at utilisation ρ is predicted from the planned batch time
//!   `t` (the plan's worst predicted batch latency of the service, from its profile) and the
//!   Pollaczek–Khinchine mean sojourn time of an M/D/1 queue (Poisson arrivals, a batch of
//!   fixed duration): `L(ρ) = t · (1 + ρ / (2 (1 − ρ)))`. It is a model, and known to be off
//!   (a p99 is not a mean, batches take time to form, neighbours interfere), hence:
//! * **Correction**, as NVIDIA Dynamo's SLA planner corrects its profile's predicted latency
//!   by the ratio of observed to predicted: each window's `r = p99 / L(ρ)` at its observed ρ
//!   (arrivals over the planned capacity) feeds time-weighted EWMAs of the moments of ρ and
//!   `ln r` (the first window sets the means), which fit `ln r` as a line in ρ: the model is
//!   off by an amount that depends on the load, and a constant correction would take that
//!   trend for spread. The factor at ρ is `k(ρ) = exp(fit(ρ) + z √(residual variance))`:
//!   the ratio's high percentile must fit, not its mean. `z` starts at the normal quantile
//!   of the SLO goal ([`GOAL_Z`], 99.9% of windows) and follows the service's share of
//!   windows missed against [`MISS_BUDGET`] ([`Attainment`]), as the goal's quantile at the
//!   autoscaler's trigger point is more margin than a load that sits there only part of the
//!   day needs. The slope is bounded ([`MAX_SLOPE`], and a
//!   ridge keeps it near 0 until the load has spread), and so are `k` and every window's
//!   ratio ([[`MIN_FACTOR`], [`MAX_FACTOR`]]); a gap in the windows relaxes the fit toward
//!   0 (k → 1: the profile again) at the same time constant, so a correction does not
//!   outlive what it was learnt from.
//! * **Target.** The largest ρ, in steps of [`SATURATION_STEP`], with `k(ρ) · L(ρ) ≤ SLO`
//!   (for a constant `k`: `x = SLO / (k t) − 1`, `ρ* = 2x / (1 + 2x)`), bounded to
//!   [[`MIN_SATURATION`], upper], the upper bound being the operator's
//!   `target_saturation`. Correcting at the operating point and sizing from the correction
//!   has its fixed point where the corrected p99 meets the SLO, whatever the true curve's
//!   shape: the model's shape decides only how fast it gets there.
//!
//! A service that misses its SLO even at [`MIN_SATURATION`] is not given more: capacity no
//! longer helps it (its batch, or a neighbour, is the cause), and [`SloHeadroom::saturation`]
//! says so. Pure: time comes in as seconds, observations one at a time.

use std::collections::BTreeMap;

/// Bounds of the correction factor (and of each window's ratio): a profile four times too
/// slow or too fast is a wrong profile, which no correction should paper over.
pub const MIN_FACTOR: f64 = 0.25;
pub const MAX_FACTOR: f64 = 4.0;
/// The lowest saturation a service is sized for: below it, capacity bought for the SLO is
/// five times the load.
pub const MIN_SATURATION: f64 = 0.2;
/// Windows at or above this utilisation of the planned capacity teach nothing about the
/// model (its prediction diverges at 1): they are the autoscaler's to answer.
pub const MAX_LEARNING_UTILISATION: f64 = 0.95;
/// The standard normal quantile of the SLO goal, 99.9% of one-second windows: where each
/// service's quantile starts ([`Attainment`] moves it).
pub const GOAL_Z: f64 = 3.09;
/// The EWMA's time constant by default, s: a correction follows a change in about this.
pub const DEFAULT_TIME_CONSTANT_S: f64 = 600.0;
/// The most one window weighs, s: a longer gap since the last window relaxes the correction
/// toward the profile instead of giving one window its whole length.
pub const MAX_WINDOW_S: f64 = 10.0;

/// What the plan predicts for a service.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Planned capacity, req/s (the sum of its workloads' predicted throughput).
    pub capacity_rps: f64,
    /// Planned batch time, ms (its workloads' worst).
    pub batch_ms: f64,
}

/// One observed window of a service.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub arrival_rps: f64,
    /// The window's p99, ms; 0 when nothing completed.
    pub p99_ms: f64,
}

/// Why a window taught nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skipped {
    /// No arrivals or no completions.
    Idle,
    /// At or past [`MAX_LEARNING_UTILISATION`] of the planned capacity.
    Saturated,
    /// A number that is not finite or not positive where it must be.
    Malformed,
}

/// M/D/1 (Pollaczek–Khinchine) mean sojourn time at utilisation `rho`, in batch times of
/// `batch_ms`, ms; infinite at or past saturation.
pub fn predicted_p99_ms(batch_ms: f64, rho: f64) -> f64 {
    // NaN too.
    if rho.is_nan() || rho >= 1.0 {
        return f64::INFINITY;
    }
    let rho = rho.max(0.0);
    batch_ms * (1.0 + rho / (2.0 * (1.0 - rho)))
}

/// Steps of the saturation targets: a target moves by at least this, so a correction that
/// wobbles does not move it every pass.
pub const SATURATION_STEP: f64 = 0.005;

/// The largest utilisation, in steps of [`SATURATION_STEP`] down from `upper`, at which
/// `factor_at(ρ) · L(ρ)` stays within `slo_ms`; `None` when even [`MIN_SATURATION`] misses
/// (more capacity does not help). `upper` is taken within `[MIN_SATURATION, 1]`, factors
/// within [[`MIN_FACTOR`], [`MAX_FACTOR`]]. At most 160 evaluations.
pub fn saturation_for_slo(slo_ms: f64, batch_ms: f64, factor_at: impl Fn(f64) -> f64, upper: f64) -> Option<f64> {
    let upper = if upper.is_finite() { upper.clamp(MIN_SATURATION, 1.0) } else { 1.0 };
    if !(slo_ms > 0.0 && batch_ms > 0.0 && slo_ms.is_finite() && batch_ms.is_finite()) {
        return None;
    }
    let steps = ((upper - MIN_SATURATION) / SATURATION_STEP + 1e-9).floor() as u32;
    (0..=steps).map(|i| upper - f64::from(i) * SATURATION_STEP).find(|&rho| {
        let k = factor_at(rho);
        let k = if k.is_finite() { k.clamp(MIN_FACTOR, MAX_FACTOR) } else { MAX_FACTOR };
        k * predicted_p99_ms(batch_ms, rho) <= slo_ms
    })
}

/// Bounds of the correction's slope in ρ (per unit of utilisation, in `ln r`): the fit may
/// bend the correction, not turn it into a second model.
pub const MAX_SLOPE: f64 = 1.0;
/// Ridge on the slope: a spread of utilisation (its standard deviation) under about 0.05
/// leaves the slope near 0: a service always at one load says nothing of another.
const SLOPE_RIDGE: f64 = 0.0025;

/// One service's correction: `ln(observed / predicted)` fitted as a line in the window's
/// utilisation by time-weighted EWMAs of the moments (means, variances, covariance).
/// The model is off by an amount that depends on the load (its queueing term is not the
/// server's); a constant correction would count that trend as spread, and `z` times it as
/// margin the SLO never needed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyCorrection {
    /// Means of ρ and of `ln r`.
    mean_rho: f64,
    mean: f64,
    /// Variance of ρ, covariance of ρ and `ln r`, variance of `ln r`.
    var_rho: f64,
    covariance: f64,
    variance: f64,
    /// When the last window was taken, s.
    at_s: Option<f64>,
    time_constant_s: f64,
}

impl LatencyCorrection {
    /// `time_constant_s` is taken within `[1, 86400]`.
    pub fn new(time_constant_s: f64) -> Self {
        let time_constant_s = if time_constant_s.is_finite() { time_constant_s.clamp(1.0, 86_400.0) } else { DEFAULT_TIME_CONSTANT_S };
        LatencyCorrection { mean_rho: 0.0, mean: 0.0, var_rho: 0.0, covariance: 0.0, variance: 0.0, at_s: None, time_constant_s }
    }

    /// The fit at `now_s`: what is learnt of `ln r` relaxed toward 0 over the part of the gap
    /// since the last window that exceeds [`MAX_WINDOW_S`] (what is known of ρ stays).
    fn relaxed(&self, now_s: f64) -> LatencyCorrection {
        let Some(at) = self.at_s else { return *self };
        let gap = (now_s - at - MAX_WINDOW_S).max(0.0);
        let keep = (-gap / self.time_constant_s).exp();
        LatencyCorrection { mean: self.mean * keep, covariance: self.covariance * keep, variance: self.variance * keep, ..*self }
    }

    /// The fitted slope of `ln r` in ρ, within ±[`MAX_SLOPE`].
    fn slope(&self) -> f64 {
        (self.covariance / (self.var_rho + SLOPE_RIDGE)).clamp(-MAX_SLOPE, MAX_SLOPE)
    }

    /// Learns from one window at `now_s` (a clock that never goes back; an earlier time
    /// counts as no time passed).
    pub fn observe(&mut self, now_s: f64, window: Window, prediction: Prediction) -> Result<(), Skipped> {
        let numbers = [now_s, window.arrival_rps, window.p99_ms, prediction.capacity_rps, prediction.batch_ms];
        if numbers.iter().any(|v| !v.is_finite()) || window.arrival_rps < 0.0 || window.p99_ms < 0.0 {
            return Err(Skipped::Malformed);
        }
        if prediction.capacity_rps <= 0.0 || prediction.batch_ms <= 0.0 {
            return Err(Skipped::Malformed);
        }
        if window.arrival_rps == 0.0 || window.p99_ms == 0.0 {
            return Err(Skipped::Idle);
        }
        let rho = window.arrival_rps / prediction.capacity_rps;
        if rho >= MAX_LEARNING_UTILISATION {
            return Err(Skipped::Saturated);
        }
        let y = (window.p99_ms / predicted_p99_ms(prediction.batch_ms, rho)).clamp(MIN_FACTOR, MAX_FACTOR).ln();
        let Some(at) = self.at_s else {
            // The first window sets the means: drawn from the profile's 0, the EWMA's variance
            // would count the whole way to it as spread, and overshoot for several τ.
            (self.mean_rho, self.mean, self.at_s) = (rho, y, Some(now_s));
            return Ok(());
        };
        let c = self.relaxed(now_s);
        let a = 1.0 - (-(now_s - at).clamp(0.0, MAX_WINDOW_S) / self.time_constant_s).exp();
        let (dx, dy) = (rho - c.mean_rho, y - c.mean);
        *self = LatencyCorrection {
            mean_rho: c.mean_rho + a * dx,
            mean: c.mean + a * dy,
            var_rho: (1.0 - a) * (c.var_rho + a * dx * dx),
            covariance: (1.0 - a) * (c.covariance + a * dx * dy),
            variance: (1.0 - a) * (c.variance + a * dy * dy),
            at_s: Some(at.max(now_s)),
            ..c
        };
        Ok(())
    }

    /// `k(ρ) = exp(fit(ρ) + z √(residual variance))` at `now_s`, within [`MIN_FACTOR`,
    /// `MAX_FACTOR`]: the ratio's `z` quantile at utilisation `rho`.
    pub fn factor(&self, now_s: f64, rho: f64, z: f64) -> f64 {
        let c = self.relaxed(now_s);
        let b = c.slope();
        let fit = c.mean + b * (rho - c.mean_rho);
        let residual = c.variance - 2.0 * b * c.covariance + b * b * c.var_rho;
        let k = (fit + z * residual.max(0.0).sqrt()).exp();
        if k.is_finite() {
            k.clamp(MIN_FACTOR, MAX_FACTOR)
        } else {
            MAX_FACTOR
        }
    }
}

/// A service's saturation target and what it came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    /// The saturation to size the service for.
    pub saturation: f64,
    /// The correction factor it was computed with.
    pub factor: f64,
    /// Even [`MIN_SATURATION`] misses the SLO by the corrected prediction: `saturation` is
    /// then the upper bound, as more capacity would not help.
    pub capacity_cannot_meet_slo: bool,
}

/// The share of its windows a service misses its SLO in that it is allowed: half the goal's
/// 0.1%, as margin for the services that miss more whatever they are given.
pub const MISS_BUDGET: f64 = 0.0005;
/// The time constant of the missed share's EWMA, s: a budget of 0.05% needs hours of windows
/// to be told from zero.
pub const ATTAINMENT_TIME_CONSTANT_S: f64 = 7200.0;
/// Bounds of the quantile the correction aims at (95% and beyond the goal's 99.9%).
pub const MIN_Z: f64 = 1.645;
pub const MAX_Z: f64 = 4.0;
/// How fast the quantile follows the missed share: per second, times the log of the missed
/// share over the budget (bounded to ±ln 10), so about 0.6 an hour when nothing is missed.
const Z_RATE_PER_S: f64 = 1.0 / 14_400.0;

/// What a service's windows show of its SLO: the share missed, and the quantile its
/// correction aims at, moved by that share against [`MISS_BUDGET`]. [`GOAL_Z`] aims each
/// window at the goal where the load reaches the autoscaler's trigger, which it does only
/// part of the day: a service that misses none for hours is sized with less margin, one
/// that misses more than its budget with more (an integral controller on the share missed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attainment {
    missed: f64,
    z: f64,
    at_s: Option<f64>,
}

impl Default for Attainment {
    fn default() -> Self {
        // Neutral: the quantile stays put until the windows say otherwise.
        Attainment { missed: MISS_BUDGET * 0.9, z: GOAL_Z, at_s: None }
    }
}

impl Attainment {
    /// One window at `now_s` that met its SLO or `missed` it.
    pub fn observe(&mut self, now_s: f64, missed: bool) {
        if !now_s.is_finite() {
            return;
        }
        let dt = self.at_s.map_or(1.0, |at| (now_s - at).clamp(0.0, MAX_WINDOW_S));
        let a = 1.0 - (-dt / ATTAINMENT_TIME_CONSTANT_S).exp();
        self.missed += a * (f64::from(u8::from(missed)) - self.missed);
        let error = ((self.missed + MISS_BUDGET / 10.0) / MISS_BUDGET).ln().clamp(-(10f64.ln()), 10f64.ln());
        self.z = (self.z + error * dt * Z_RATE_PER_S).clamp(MIN_Z, MAX_Z);
        self.at_s = Some(self.at_s.map_or(now_s, |at| at.max(now_s)));
    }

    /// The quantile the correction aims at.
    pub fn z(&self) -> f64 {
        self.z
    }

    /// The share of windows missed (EWMA).
    pub fn missed(&self) -> f64 {
        self.missed
    }
}

/// What is kept of one service.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Service {
    correction: LatencyCorrection,
    attainment: Attainment,
    /// The widest batch time of the plans seen for it within [`BATCH_MEMORY_S`], ms, and
    /// since when it has been the widest.
    widest_batch: Option<(f64, f64)>,
}

/// How long the widest batch time of a service's plans is remembered, s. Its plans' batch
/// time depends on the rate it is provisioned for (a higher rate may get a larger slice with
/// a smaller batch), so a target from the current plan's batch alone flips between two plans
/// (seen in fleet-sim: a re-plan every few seconds). Sized from the widest batch seen, a
/// service moves back to the plan with the wider batch at most once per this. An hour
/// rather than four cost 0.6% less and restarted 5.6% more (fleet-sim, seed 1).
pub const BATCH_MEMORY_S: f64 = 3600.0;

/// The corrections of every service (soft state of whoever sizes: the leader's autoscaler,
/// or the simulator running it).
#[derive(Clone, Debug)]
pub struct SloHeadroom {
    services: BTreeMap<String, Service>,
    time_constant_s: f64,
}

impl Default for SloHeadroom {
    fn default() -> Self {
        SloHeadroom::new(DEFAULT_TIME_CONSTANT_S)
    }
}

impl SloHeadroom {
    pub fn new(time_constant_s: f64) -> Self {
        SloHeadroom { services: BTreeMap::new(), time_constant_s }
    }

    fn service(&mut self, name: &str) -> &mut Service {
        if !self.services.contains_key(name) {
            let fresh =
                Service { correction: LatencyCorrection::new(self.time_constant_s), attainment: Attainment::default(), widest_batch: None };
            self.services.insert(name.to_string(), fresh);
        }
        self.services.get_mut(name).expect("inserted above")
    }

    /// Learns from `service`'s window at `now_s` (its SLO `slo_ms`): the correction, and
    /// whether the window met the SLO (any window with completions, saturated ones too).
    pub fn observe(&mut self, service: &str, now_s: f64, slo_ms: f64, window: Window, prediction: Prediction) -> Result<(), Skipped> {
        let s = self.service(service);
        if window.arrival_rps > 0.0 && window.p99_ms > 0.0 && slo_ms > 0.0 {
            s.attainment.observe(now_s, window.p99_ms > slo_ms);
        }
        s.correction.observe(now_s, window, prediction)
    }

    /// The saturation to size `service` for at `now_s`, at most `upper`, from its current
    /// plan's `prediction` (whose batch time it remembers).
    pub fn saturation(&mut self, service: &str, now_s: f64, slo_ms: f64, prediction: Prediction, upper: f64) -> Headroom {
        let s = self.service(service);
        let batch = prediction.batch_ms;
        if batch.is_finite() && batch > 0.0 {
            match s.widest_batch {
                Some((widest, since)) if widest > batch && now_s - since <= BATCH_MEMORY_S => {}
                _ => s.widest_batch = Some((batch, now_s)),
            }
        }
        let widest = s.widest_batch.map_or(batch, |(b, _)| b);
        let (correction, z) = (s.correction, s.attainment.z());
        let factor_at = |rho| correction.factor(now_s, rho, z);
        match saturation_for_slo(slo_ms, widest, factor_at, upper) {
            Some(saturation) => Headroom { saturation, factor: factor_at(saturation), capacity_cannot_meet_slo: false },
            None => {
                let saturation = upper.clamp(MIN_SATURATION, 1.0);
                Headroom { saturation, factor: factor_at(saturation), capacity_cannot_meet_slo: true }
            }
        }
    }

    /// Keeps what is kept of the services `keep` says to.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.services.retain(|s, _| keep(s));
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: Prediction = Prediction { capacity_rps: 100.0, batch_ms: 20.0 };

    /// A deterministic stand-in for noise: a normal-looking sequence of z-scores.
    fn z(i: u32) -> f64 {
        // Φ⁻¹ of evenly spread quantiles, by a logistic approximation: enough spread for
        // a variance to be learnt, and the same every run.
        let u = (f64::from(i % 97) + 0.5) / 97.0;
        (u / (1.0 - u)).ln() / 1.702
    }

    #[test]
    fn the_prediction_is_the_md1_sojourn_time() {
        assert_eq!(predicted_p99_ms(20.0, 0.0), 20.0);
        // ρ = 0.5: 1 + 0.5 / 1 = 1.5 batch times.
        assert_eq!(predicted_p99_ms(20.0, 0.5), 30.0);
        // ρ = 0.8: 1 + 0.8 / 0.4 = 3.
        assert!((predicted_p99_ms(20.0, 0.8) - 60.0).abs() < 1e-9);
        assert_eq!(predicted_p99_ms(20.0, 1.0), f64::INFINITY);
        assert_eq!(predicted_p99_ms(20.0, f64::NAN), f64::INFINITY);
    }

    /// The target for a constant factor in closed form: `x = SLO / (k t) − 1`,
    /// `ρ* = 2x / (1 + 2x)`.
    fn closed_form(slo_ms: f64, batch_ms: f64, k: f64) -> f64 {
        let x = slo_ms / (k * batch_ms) - 1.0;
        2.0 * x / (1.0 + 2.0 * x)
    }

    /// `found` is `exact` taken down to the grid of [`SATURATION_STEP`].
    fn on_grid_below(found: Option<f64>, exact: f64) -> bool {
        found.is_some_and(|f| f <= exact + 1e-12 && f > exact - SATURATION_STEP)
    }

    #[test]
    fn the_target_is_the_largest_utilisation_within_the_slo_by_hand() {
        let k = |k: f64| move |_rho: f64| k;
        // 300 ms SLO on a 20 ms batch: x = 14, ρ* = 28/29, capped by the operator's 0.8.
        assert_eq!(saturation_for_slo(300.0, 20.0, k(1.0), 0.8), Some(0.8));
        assert!(on_grid_below(saturation_for_slo(300.0, 20.0, k(1.0), 1.0), 28.0 / 29.0));
        // 60 ms on 27 ms: x = 11/9, ρ* = 22/31 = 0.7097: 0.705 on the grid.
        assert!(on_grid_below(saturation_for_slo(60.0, 27.0, k(1.0), 0.8), 22.0 / 31.0));
        assert!(on_grid_below(saturation_for_slo(60.0, 27.0, k(1.2), 0.8), closed_form(60.0, 27.0, 1.2)));
        // k·L(0.2) = 1.125 k t: a batch at 0.9 of the SLO misses even there.
        assert_eq!(saturation_for_slo(100.0, 90.0, k(1.0), 0.8), None);
        assert_eq!(saturation_for_slo(100.0, 0.0, k(1.0), 0.8), None, "no batch time, no sizing");
        assert_eq!(saturation_for_slo(f64::NAN, 20.0, k(1.0), 0.8), None);
        // A factor out of bounds is taken at the bound; an upper bound out of range too.
        assert_eq!(saturation_for_slo(300.0, 20.0, k(100.0), 0.8), saturation_for_slo(300.0, 20.0, k(MAX_FACTOR), 0.8));
        assert_eq!(saturation_for_slo(300.0, 20.0, k(f64::NAN), 0.8), saturation_for_slo(300.0, 20.0, k(MAX_FACTOR), 0.8));
        assert_eq!(saturation_for_slo(300.0, 20.0, k(1.0), 7.0), saturation_for_slo(300.0, 20.0, k(1.0), 1.0));
        assert_eq!(saturation_for_slo(300.0, 20.0, k(1.0), 0.0), Some(MIN_SATURATION));
        // A factor that falls with the load (the model overstates queueing): more room.
        let falling = |rho: f64| 1.2 - 0.5 * rho;
        assert!(saturation_for_slo(60.0, 27.0, falling, 0.9).unwrap() > saturation_for_slo(60.0, 27.0, k(1.2), 0.9).unwrap());
    }

    #[test]
    fn the_correction_converges_on_a_service_30_percent_slower_than_its_profile() {
        let mut c = LatencyCorrection::new(DEFAULT_TIME_CONSTANT_S);
        assert_eq!(c.factor(0.0, 0.5, GOAL_Z), 1.0, "the profile until something is seen");
        // Without noise, at loads from 0.3 to 0.7: k → 1.3 at every load.
        for t in 0..6_000 {
            let rho = 0.3 + 0.4 * f64::from(t % 50) / 50.0;
            let p99 = 1.3 * predicted_p99_ms(PLAN.batch_ms, rho);
            c.observe(f64::from(t), Window { arrival_rps: rho * PLAN.capacity_rps, p99_ms: p99 }, PLAN).unwrap();
        }
        for rho in [0.3, 0.5, 0.8] {
            assert!((c.factor(6_000.0, rho, GOAL_Z) - 1.3).abs() < 0.01, "at {rho}: {}", c.factor(6_000.0, rho, GOAL_Z));
        }
        // Sized with it: the corrected p99 at the target meets the SLO, a grid step short.
        let rho = saturation_for_slo(100.0, 20.0, |r| c.factor(6_000.0, r, GOAL_Z), 1.0).unwrap();
        assert!(on_grid_below(Some(rho), closed_form(100.0, 20.0, c.factor(6_000.0, rho, GOAL_Z))), "{rho}");

        // With log-normal noise of σ = 0.1 around it: k → 1.3 · e^(3.09 · 0.1) ≈ 1.77, the
        // ratio's 99.9th percentile.
        let mut c = LatencyCorrection::new(DEFAULT_TIME_CONSTANT_S);
        for t in 0..20_000 {
            let p99 = 1.3 * (0.1 * z(t)).exp() * predicted_p99_ms(20.0, 0.6);
            c.observe(f64::from(t), Window { arrival_rps: 60.0, p99_ms: p99 }, PLAN).unwrap();
        }
        let k = c.factor(20_000.0, 0.6, GOAL_Z);
        let expected = 1.3 * (GOAL_Z * 0.1_f64).exp();
        assert!((k / expected - 1.0).abs() < 0.08, "k {k}, expected about {expected}");
    }

    #[test]
    fn a_correction_that_depends_on_the_load_is_fitted_not_taken_for_noise() {
        // The server queues less than M/D/1 says: the ratio falls from 1 at ρ = 0.3 to 0.6
        // at ρ = 0.7 (a slope of −1.28 per unit ρ in ln r, past the bound of 1).
        let ratio = |rho: f64| (-(rho - 0.3) * 0.6_f64.ln().abs() / 0.4).exp();
        let mut c = LatencyCorrection::new(DEFAULT_TIME_CONSTANT_S);
        for t in 0..6_000 {
            let rho = 0.3 + 0.4 * f64::from(t % 50) / 50.0;
            let p99 = ratio(rho) * predicted_p99_ms(20.0, rho);
            c.observe(f64::from(t), Window { arrival_rps: rho * PLAN.capacity_rps, p99_ms: p99 }, PLAN).unwrap();
        }
        // The trend is the fit's, not spread: the factor at the heavy end is far below what a
        // constant correction with its variance would give.
        let (light, heavy) = (c.factor(6_000.0, 0.3, GOAL_Z), c.factor(6_000.0, 0.7, GOAL_Z));
        assert!(heavy < light, "{light} {heavy}");
        assert!(heavy < 0.75, "{heavy}");
        let mut constant = c;
        (constant.var_rho, constant.covariance) = (0.0, 0.0);
        assert!(constant.factor(6_000.0, 0.7, GOAL_Z) > 1.0, "{}", constant.factor(6_000.0, 0.7, GOAL_Z));
    }

    #[test]
    fn the_correction_stays_bounded_under_wild_windows_and_relaxes_without_them() {
        let mut c = LatencyCorrection::new(60.0);
        for t in 0..2_000 {
            // Alternately a million times too slow and a thousand times too fast, at loads
            // all over the place.
            let p99 = if t % 2 == 0 { 1e6 } else { 1e-3 };
            let arrival = f64::from(t % 7) * 13.0 + 1.0;
            c.observe(f64::from(t), Window { arrival_rps: arrival, p99_ms: p99 }, PLAN).unwrap();
            for rho in [0.0, 0.5, 1.0, 10.0] {
                let k = c.factor(f64::from(t), rho, GOAL_Z);
                assert!((MIN_FACTOR..=MAX_FACTOR).contains(&k), "{k}");
            }
        }
        let mut c = LatencyCorrection::new(60.0);
        for t in 0..600 {
            c.observe(f64::from(t), Window { arrival_rps: 50.0, p99_ms: 2.0 * predicted_p99_ms(20.0, 0.5) }, PLAN).unwrap();
        }
        assert!((c.factor(600.0, 0.5, GOAL_Z) - 2.0).abs() < 0.01);
        // An hour without windows (sixty time constants): back to the profile.
        assert!((c.factor(600.0 + 3_600.0, 0.5, GOAL_Z) - 1.0).abs() < 1e-6, "{}", c.factor(4_200.0, 0.5, GOAL_Z));
        // Refused windows change nothing.
        let before = c;
        let bad = [
            (Window { arrival_rps: 0.0, p99_ms: 10.0 }, PLAN, Skipped::Idle),
            (Window { arrival_rps: 10.0, p99_ms: 0.0 }, PLAN, Skipped::Idle),
            (Window { arrival_rps: 96.0, p99_ms: 10.0 }, PLAN, Skipped::Saturated),
            (Window { arrival_rps: f64::NAN, p99_ms: 10.0 }, PLAN, Skipped::Malformed),
            (Window { arrival_rps: 10.0, p99_ms: f64::INFINITY }, PLAN, Skipped::Malformed),
            (Window { arrival_rps: 10.0, p99_ms: -1.0 }, PLAN, Skipped::Malformed),
            (Window { arrival_rps: 10.0, p99_ms: 10.0 }, Prediction { capacity_rps: 0.0, batch_ms: 20.0 }, Skipped::Malformed),
            (Window { arrival_rps: 10.0, p99_ms: 10.0 }, Prediction { capacity_rps: 100.0, batch_ms: -1.0 }, Skipped::Malformed),
        ];
        for (window, prediction, why) in bad {
            assert_eq!(c.observe(601.0, window, prediction), Err(why), "{window:?} {prediction:?}");
        }
        assert_eq!(c, before);
    }

    #[test]
    fn the_quantile_follows_the_share_of_windows_missed() {
        let day = |miss_every: Option<u32>| {
            let mut a = Attainment::default();
            for t in 0..86_400 {
                a.observe(f64::from(t), miss_every.is_some_and(|n| t % n == 0));
            }
            a
        };
        // None missed for a day: the least margin.
        assert_eq!(day(None).z(), MIN_Z);
        // One in a hundred: the most.
        assert_eq!(day(Some(100)).z(), MAX_Z);
        // About the budget (one in 2,000 = 0.05%): near where it started.
        let at_budget = day(Some(2_000));
        assert!((at_budget.z() - GOAL_Z).abs() < 1.0, "{at_budget:?}");
        assert!((at_budget.missed() / MISS_BUDGET - 1.0).abs() < 0.8, "{at_budget:?}");
        // A bad clock changes nothing.
        let mut a = Attainment::default();
        a.observe(f64::NAN, true);
        assert_eq!(a, Attainment::default());
    }

    #[test]
    fn a_service_that_misses_nothing_for_hours_is_sized_with_less_margin() {
        let mut h = SloHeadroom::new(600.0);
        let noisy = |t: u32| (0.1 * z(t)).exp() * predicted_p99_ms(20.0, 0.5);
        let at = |h: &mut SloHeadroom, now: f64| h.saturation("web", now, 100.0, PLAN, 0.95).saturation;
        for t in 0..600 {
            h.observe("web", f64::from(t), 100.0, Window { arrival_rps: 50.0, p99_ms: noisy(t) }, PLAN).unwrap();
        }
        let early = at(&mut h, 600.0);
        for t in 600..6 * 3_600 {
            h.observe("web", f64::from(t), 100.0, Window { arrival_rps: 50.0, p99_ms: noisy(t) }, PLAN).unwrap();
        }
        let late = at(&mut h, 6.0 * 3_600.0);
        assert!(late > early, "{early} → {late}");
    }

    #[test]
    fn each_service_has_its_own_headroom_and_a_hopeless_one_is_not_given_more() {
        let mut h = SloHeadroom::new(60.0);
        // "fast" runs as profiled; "slow" at twice its profile.
        for t in 0..1_000 {
            let now = f64::from(t);
            h.observe("fast", now, 100.0, Window { arrival_rps: 50.0, p99_ms: predicted_p99_ms(20.0, 0.5) }, PLAN).unwrap();
            h.observe("slow", now, 100.0, Window { arrival_rps: 50.0, p99_ms: 2.0 * predicted_p99_ms(20.0, 0.5) }, PLAN).unwrap();
        }
        let fast = h.saturation("fast", 1_000.0, 100.0, PLAN, 0.8);
        let slow = h.saturation("slow", 1_000.0, 100.0, PLAN, 0.8);
        assert_eq!(fast.saturation, 0.8, "room beyond the operator's bound: the bound");
        // 2 · 20 · (1 + ρ / (2 (1 − ρ))) ≤ 100: x = 1.5, ρ* = 0.75.
        assert!((slow.saturation - 0.75).abs() < 0.01, "{slow:?}");
        assert!(!slow.capacity_cannot_meet_slo);
        // An unseen service is sized by its profile alone.
        let unseen = h.saturation("new", 1_000.0, 60.0, Prediction { capacity_rps: 10.0, batch_ms: 27.0 }, 0.8);
        assert_eq!(unseen.factor, 1.0);
        assert!(on_grid_below(Some(unseen.saturation), 22.0 / 31.0), "{unseen:?}");
        // Its next plan has a smaller batch: sized by the wider one until it is forgotten.
        let narrower = Prediction { capacity_rps: 20.0, batch_ms: 10.0 };
        assert_eq!(h.saturation("new", 1_001.0, 60.0, narrower, 0.8).saturation, unseen.saturation);
        assert_eq!(h.saturation("new", 1_000.0 + BATCH_MEMORY_S + 1.0, 60.0, narrower, 0.8).saturation, 0.8);
        // A batch near the SLO: more capacity would not help, so none is bought beyond the bound.
        // 2 · 20 · L(ρ)/t ≤ 40 holds only at ρ = 0.
        let hopeless = h.saturation("slow", 1_000.0, 40.0, PLAN, 0.8);
        assert!(hopeless.capacity_cannot_meet_slo);
        assert_eq!(hopeless.saturation, 0.8);
        h.retain(|s| s == "fast");
        assert_eq!(h.len(), 1);
    }
}
