//! The serving model: whether one second of a service's load meets its SLO on what a
//! policy gives it.
//!
//! A service's capacity `C` (req/s) and batch time `t` (ms) come from its plan (or, for
//! whole GPUs, from the synthetic performance model the simulated GPUs run,
//! `planner::perf::synthetic`). At offered load `λ` the utilisation is `ρ = λ / C`; the
//! window's p99 latency is taken as
//!
//! ```text
//! p99 = t · s · e^(σ z) · (1 + 0.2 · ρ / (1 − ρ))        (ρ < 1; otherwise the window fails)
//! ```
//!
//! with `s = 1 + interference · 0.5` when the service shares its GPU or MIG instance with
//! another (iGniter Eq. 8's contention, which the planner does not model) and log-normal
//! noise (`σ = 0.1`, one draw per window). The factor is an M/D/1-shaped queueing delay
//! scaled so that at 80% utilisation (HetSev's target) the p99 is 1.8 batch times: within
//! an SLO of two batch times (the planners keep a batch within half the SLO), with room
//! for the noise. Its limits: one queue per service (not per process), no batch formation
//! delay beyond what the factor stands for, no cold caches after a reconfiguration.

use planner::perf::synthetic::{example_models, gpu_speed, ModelShape};
use rand::rngs::SmallRng;
use rand_distr::{Distribution, StandardNormal};

/// σ of the per-window log-normal noise.
pub const NOISE_SIGMA: f64 = 0.1;
/// Busy fraction of a co-located neighbour, for the interference slow-down.
const NEIGHBOUR_LOAD: f64 = 0.5;

/// What a service runs on for one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Serving {
    pub capacity_rps: f64,
    pub batch_ms: f64,
    /// Slow-down from co-located neighbours (1 = alone).
    pub slowdown: f64,
}

impl Serving {
    /// No capacity: every window with load fails.
    pub const NOTHING: Serving = Serving { capacity_rps: 0.0, batch_ms: f64::INFINITY, slowdown: 1.0 };
}

/// Whether `load` req/s for one second on `serving` meets `slo_ms`.
pub fn window_met(load: f64, serving: &Serving, slo_ms: f64, rng: &mut SmallRng) -> bool {
    load <= 0.0 || window_p99(load, serving, rng) <= slo_ms
}

/// The p99 latency of one second of `load` req/s on `serving`, ms; infinite when the load
/// reaches its capacity.
pub fn window_p99(load: f64, serving: &Serving, rng: &mut SmallRng) -> f64 {
    let rho = load / serving.capacity_rps;
    // Also a capacity of 0 (ρ infinite) or NaN.
    if rho.is_nan() || rho >= 1.0 {
        return f64::INFINITY;
    }
    let z: f64 = StandardNormal.sample(rng);
    serving.batch_ms * serving.slowdown * (NOISE_SIGMA * z).exp() * (1.0 + 0.2 * rho / (1.0 - rho))
}

/// The synthetic shape of `model`, if it is one of the example models.
pub fn shape(model: &str) -> Option<ModelShape> {
    example_models().into_iter().find(|m| m.name == model)
}

/// The slow-down of `model` when co-located.
pub fn colocated_slowdown(model: &str) -> f64 {
    shape(model).map_or(1.0, |s| 1.0 + s.interference * NEIGHBOUR_LOAD)
}

/// One whole GPU of `gpu` serving `model` alone: (capacity req/s, batch ms) at the largest
/// batch (a power of two up to 128) whose time stays within half the SLO; `None` if even a
/// batch of one does not, or the model is unknown.
pub fn whole_gpu(model: &str, gpu: &str, slo_ms: f64) -> Option<(f64, f64)> {
    let (shape, speed) = (shape(model)?, gpu_speed(gpu)?);
    (0..8)
        .map(|k| 1u32 << k)
        .filter_map(|b| shape.latency_ms(7, b, 1).map(|ms| (b, ms / speed)))
        .filter(|&(_, ms)| ms <= slo_ms / 2.0)
        .map(|(b, ms)| (f64::from(b) * 1000.0 / ms, ms))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_window_fails_over_capacity_and_passes_at_the_target_utilisation() {
        let mut rng = SmallRng::seed_from_u64(1);
        let s = Serving { capacity_rps: 100.0, batch_ms: 10.0, slowdown: 1.0 };
        assert!(!window_met(100.0, &s, 1000.0, &mut rng), "at capacity");
        assert!(window_met(0.0, &Serving { capacity_rps: 0.0, ..s }, 20.0, &mut rng), "no load, nothing to miss");
        // At 80% the p99 is 1.8 batch times: an SLO of two batch times holds nearly always.
        let met = (0..1000).filter(|_| window_met(80.0, &s, 20.0, &mut rng)).count();
        assert!(met > 800, "{met}");
        let met = (0..1000).filter(|_| window_met(95.0, &s, 20.0, &mut rng)).count();
        assert_eq!(met, 0, "at 95% the queue alone is 3.8 batch times");
    }

    #[test]
    fn a_whole_gpu_takes_the_largest_batch_within_half_the_slo() {
        let (cap_a100, ms) = whole_gpu("resnet50", "A100-80GB", 100.0).unwrap();
        assert!(ms <= 50.0 && cap_a100 > 0.0);
        // A T4 runs at a quarter of an A100's speed: even one batch takes 57.6 ms.
        assert_eq!(whole_gpu("resnet50", "T4-16GB", 100.0), None);
        let (cap_t4, _) = whole_gpu("resnet50", "T4-16GB", 250.0).unwrap();
        assert!(cap_t4 < cap_a100, "a T4 is slower");
        assert_eq!(whole_gpu("no-such-model", "A100-80GB", 100.0), None);
    }
}
