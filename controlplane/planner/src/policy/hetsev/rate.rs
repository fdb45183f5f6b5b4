//! HetSev's scaling controller (Sec. 4.1, "A heuristic algorithm", steps (a) and (b)) for a
//! service whose capacity is a provisioned request rate rather than a count of instances.
//!
//! gpuplane sizes a service's MIG slices and MPS shares from the rate it is provisioned for,
//! and launches instances for what the resulting plan needs of the fleet ([`launch_objective`]
//! picks the type). What HetSev decides per service is therefore *when* and *to what* its
//! capacity moves; [`super::decide`] answers the same question in whole instances of one type.
//! The trigger is the paper's, with the choices [`super::autoscale`] documents:
//!
//! * Scale-out: the throughput saturation `W / capacity` above the threshold through the whole
//!   window (samples are sample-and-hold, so the window is covered only when some sample is at
//!   or before its start); the new capacity restores Constraint (1) at the threshold:
//!   `W / θ` with `W` the newest arrival rate.
//! * Scale-in: only once the cool-down has passed, to the *peak* arrival rate over it at the
//!   threshold, `max W / θ`; while the newest load alone would allow less, the verdict is a
//!   cool-down with the time left.
//! * The range `[min_rps, max_rps]` bounds both (Constraint (3)'s floor is the service's
//!   minimum), and a move smaller than `min_change` of the current capacity is no move: the
//!   plan would otherwise be recomputed for every wobble of the measured rate.
//!
//! [`launch_objective`]: super::launch_objective

use super::autoscale::{in_effect_from, suffix_start, validate_config, validate_samples};
use super::{finite, non_negative, positive, AutoscaleConfig, HetSevError, HoldReason, LoadSample};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Samples [`record_sample`] keeps at most: the window and cool-down of a one-second tick
/// need a few hundred distinct ones (equal neighbours are merged).
pub const MAX_SAMPLES: usize = 4096;

/// Appends `sample` to a load history: merged into the newest when it repeats its values
/// (samples are sample-and-hold), samples no longer in effect at `from` dropped (`from`:
/// now minus the longer of the window and the cool-down), and never more than
/// [`MAX_SAMPLES`].
pub fn record_sample(samples: &mut VecDeque<LoadSample>, sample: LoadSample, from: f64) {
    let repeats = samples.back().is_some_and(|s| s.arrival_rate == sample.arrival_rate && s.capacity == sample.capacity);
    if !repeats {
        samples.push_back(sample);
    }
    // The newest sample at or before `from` is still in effect; those before it are not.
    while samples.len() > 1 && (samples[1].t_s <= from || samples.len() > MAX_SAMPLES) {
        samples.pop_front();
    }
}

/// What one service's capacity is, and may be.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateRange {
    /// The rate the service is provisioned for now, req/s.
    pub provisioned_rps: f64,
    pub min_rps: f64,
    pub max_rps: f64,
}

/// The verdict for one service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RateDecision {
    /// Provision for `to_rps` (higher than now).
    Raise {
        to_rps: f64,
    },
    /// Provision for `to_rps` (lower than now).
    Lower {
        to_rps: f64,
    },
    Hold {
        reason: HoldReason,
    },
}

/// One decision at `now_s` from `samples` (time order, none after `now_s`; each sample's
/// `capacity` is the rate provisioned when it was taken). `min_change` is a fraction in
/// `[0, 1)`.
pub fn decide_rate(
    samples: &[LoadSample],
    range: RateRange,
    now_s: f64,
    config: &AutoscaleConfig,
    min_change: f64,
) -> Result<RateDecision, HetSevError> {
    validate_config(config)?;
    finite(|| "now_s".into(), now_s)?;
    validate_samples(samples, now_s)?;
    positive(|| "range.provisioned_rps".into(), range.provisioned_rps)?;
    non_negative(|| "range.min_rps".into(), range.min_rps)?;
    positive(|| "range.max_rps".into(), range.max_rps)?;
    if range.min_rps > range.max_rps {
        return Err(HetSevError::invalid("range.min_rps", format!("{} is above max_rps {}", range.min_rps, range.max_rps)));
    }
    non_negative(|| "min_change".into(), min_change)?;
    if min_change >= 1.0 {
        return Err(HetSevError::invalid("min_change", format!("must be below 1, got {min_change}")));
    }

    let hold = |reason| Ok(RateDecision::Hold { reason });
    let Some(latest) = samples.last() else {
        return hold(HoldReason::InsufficientHistory { needed_from_s: now_s - config.window_s, earliest_sample_s: None });
    };
    let theta = config.saturation_threshold;
    let current = range.provisioned_rps;
    let target = |w: f64| (w / theta).clamp(range.min_rps, range.max_rps);
    let moves = |to: f64| (to - current).abs() > min_change * current;

    if latest.saturation() > theta {
        // (a) Risk for Constraint (1): saturated through the whole window?
        let from = now_s - config.window_s;
        let since = suffix_start(samples, |s| s.saturation() > theta);
        return match in_effect_from(samples, from) {
            None => hold(HoldReason::InsufficientHistory { needed_from_s: from, earliest_sample_s: Some(samples[0].t_s) }),
            Some(i0) if since > i0 => {
                hold(HoldReason::SaturationNotSustained { saturated_since_s: samples[since].t_s, window_s: config.window_s })
            }
            // Saturated at the ceiling, or by less than a move: nothing to gain.
            Some(_) => match target(latest.arrival_rate) {
                to if to > current && moves(to) => Ok(RateDecision::Raise { to_rps: to }),
                _ => hold(HoldReason::WithinTarget { saturation: latest.saturation() }),
            },
        };
    }

    // (b) Scale-in: at the peak of the cool-down period, once it is covered.
    let newest = target(latest.arrival_rate);
    if !(newest < current && moves(newest)) {
        return hold(HoldReason::WithinTarget { saturation: latest.saturation() });
    }
    if let Some(i0) = in_effect_from(samples, now_s - config.cooldown_s) {
        let peak = samples[i0..].iter().map(|s| s.arrival_rate).fold(0.0, f64::max);
        let to = target(peak);
        if to < current && moves(to) {
            return Ok(RateDecision::Lower { to_rps: to });
        }
    }
    // The load has asked for less since the start of the longest suffix of samples below the
    // level at which a lower target would be a move.
    let level = theta * current * (1.0 - min_change);
    let start = suffix_start(samples, |s| s.arrival_rate <= level).min(samples.len() - 1);
    let since = samples[start].t_s;
    hold(HoldReason::CoolDown { underload_since_s: since, remaining_s: (since + config.cooldown_s - now_s).max(0.0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AutoscaleConfig {
        AutoscaleConfig { window_s: 10.0, cooldown_s: 30.0, ..AutoscaleConfig::default() }
    }

    fn range(provisioned: f64) -> RateRange {
        RateRange { provisioned_rps: provisioned, min_rps: 10.0, max_rps: 1000.0 }
    }

    /// Samples at the given (time, arrival) points, each taken at `provisioned`.
    fn at(points: &[(f64, f64)], provisioned: f64) -> Vec<LoadSample> {
        points.iter().map(|&(t, w)| LoadSample { t_s: t, arrival_rate: w, capacity: provisioned }).collect()
    }

    #[test]
    fn sustained_saturation_raises_to_the_threshold_after_the_window() {
        let s = at(&[(0.0, 100.0)], 50.0);
        let d = decide_rate(&s, range(50.0), 9.0, &cfg(), 0.05).unwrap();
        assert!(matches!(d, RateDecision::Hold { reason: HoldReason::InsufficientHistory { .. } }), "{d:?}");
        // 100 req/s at 80% saturation: 125 req/s.
        assert_eq!(decide_rate(&s, range(50.0), 10.0, &cfg(), 0.05).unwrap(), RateDecision::Raise { to_rps: 125.0 });
        // Capped by the range.
        let capped = RateRange { max_rps: 60.0, ..range(50.0) };
        assert_eq!(decide_rate(&s, capped, 10.0, &cfg(), 0.05).unwrap(), RateDecision::Raise { to_rps: 60.0 });
        let at_max = RateRange { max_rps: 50.0, ..range(50.0) };
        assert!(matches!(decide_rate(&s, at_max, 10.0, &cfg(), 0.05).unwrap(), RateDecision::Hold { .. }));
    }

    #[test]
    fn a_spike_shorter_than_the_window_holds() {
        let s = at(&[(0.0, 20.0), (5.0, 100.0)], 50.0);
        let d = decide_rate(&s, range(50.0), 12.0, &cfg(), 0.05).unwrap();
        assert_eq!(d, RateDecision::Hold { reason: HoldReason::SaturationNotSustained { saturated_since_s: 5.0, window_s: 10.0 } });
    }

    #[test]
    fn lowering_waits_for_the_cool_down_and_takes_its_peak() {
        // 125 provisioned; the load fell to 20 at t=13 after 100 at t=12.
        let s = at(&[(0.0, 100.0), (12.0, 100.0), (13.0, 20.0)], 125.0);
        let d = decide_rate(&s, range(125.0), 42.0, &cfg(), 0.05).unwrap();
        assert_eq!(d, RateDecision::Hold { reason: HoldReason::CoolDown { underload_since_s: 13.0, remaining_s: 1.0 } });
        assert_eq!(decide_rate(&s, range(125.0), 43.0, &cfg(), 0.05).unwrap(), RateDecision::Lower { to_rps: 25.0 });
        // A bump within the cool-down sets the level: the peak, not the newest rate.
        let s = at(&[(0.0, 100.0), (13.0, 20.0), (20.0, 40.0), (21.0, 20.0)], 125.0);
        assert_eq!(decide_rate(&s, range(125.0), 50.0, &cfg(), 0.05).unwrap(), RateDecision::Lower { to_rps: 50.0 });
        // Never below the range.
        let s = at(&[(0.0, 1.0)], 125.0);
        assert_eq!(decide_rate(&s, range(125.0), 30.0, &cfg(), 0.05).unwrap(), RateDecision::Lower { to_rps: 10.0 });
    }

    #[test]
    fn a_move_within_min_change_is_no_move() {
        // 100 req/s wants 125; 120 provisioned is within 5%.
        let s = at(&[(0.0, 100.0)], 120.0);
        assert!(matches!(decide_rate(&s, range(120.0), 60.0, &cfg(), 0.05).unwrap(), RateDecision::Hold { .. }));
        let s = at(&[(0.0, 100.0)], 130.0);
        assert!(matches!(decide_rate(&s, range(130.0), 60.0, &cfg(), 0.05).unwrap(), RateDecision::Hold { .. }));
    }

    #[test]
    fn bad_inputs_name_the_field() {
        let s = at(&[(0.0, 100.0)], 50.0);
        let field = |r: Result<RateDecision, HetSevError>| r.unwrap_err().field().to_string();
        assert_eq!(field(decide_rate(&s, range(0.0), 1.0, &cfg(), 0.05)), "range.provisioned_rps");
        assert_eq!(field(decide_rate(&s, RateRange { min_rps: 2000.0, ..range(50.0) }, 1.0, &cfg(), 0.05)), "range.min_rps");
        assert_eq!(field(decide_rate(&s, range(50.0), f64::NAN, &cfg(), 0.05)), "now_s");
        assert_eq!(field(decide_rate(&s, range(50.0), 1.0, &cfg(), 1.0)), "min_change");
        assert_eq!(field(decide_rate(&s, range(50.0), -1.0, &cfg(), 0.05)), "samples[0].t_s");
        let bad = AutoscaleConfig { saturation_threshold: 1.5, ..cfg() };
        assert_eq!(field(decide_rate(&s, range(50.0), 1.0, &bad, 0.05)), "config.saturation_threshold");
    }

    #[test]
    fn a_history_keeps_what_is_in_effect_over_the_horizon_and_merges_repeats() {
        let sample = |t: f64, w: f64| LoadSample { t_s: t, arrival_rate: w, capacity: 100.0 };
        let mut h = VecDeque::new();
        for (t, w) in [(0.0, 10.0), (1.0, 10.0), (2.0, 10.0), (3.0, 20.0), (4.0, 20.0), (5.0, 30.0)] {
            record_sample(&mut h, sample(t, w), t - 2.5);
        }
        // At 5 the horizon starts at 2.5: the sample of 0 (held through 2) is in effect there.
        let kept: Vec<(f64, f64)> = h.iter().map(|s| (s.t_s, s.arrival_rate)).collect();
        assert_eq!(kept, vec![(0.0, 10.0), (3.0, 20.0), (5.0, 30.0)]);
        record_sample(&mut h, sample(6.0, 30.0), 3.5);
        assert_eq!(h.iter().map(|s| s.t_s).collect::<Vec<_>>(), vec![3.0, 5.0]);
        // Bounded whatever the horizon.
        for i in 0..2 * MAX_SAMPLES {
            record_sample(&mut h, sample(7.0 + i as f64, i as f64), f64::NEG_INFINITY);
        }
        assert_eq!(h.len(), MAX_SAMPLES);
    }
}
