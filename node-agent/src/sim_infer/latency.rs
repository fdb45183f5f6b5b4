//! The simulated inference process's batch service time: a pure function of the model, the
//! partition it runs on and its neighbours, plus seeded noise.
//!
//! Mean time extends the planner's synthetic model (`planner::perf::synthetic::ModelShape`,
//! whose formula it reproduces exactly at a 100% MPS share with no neighbours):
//! * MPS share `s` of a `g`-GPC instance leaves `g·s` GPCs of compute; memory bandwidth is not
//!   partitioned by MPS (it limits threads, not memory slices), so only the compute-bound
//!   part of the slow-down scales with it;
//! * co-located load `L` (the sum of the GPU busy fractions of the other processes on the
//!   GPU or instance) slows every batch by `1 + interference · L`: iGniter's Eq. 8 cache
//!   contention (`t_act · (1 + α_cache · Σ c_j)`), with the neighbours' cache use taken as
//!   proportional to their load, and `interference` the model's per-process coefficient;
//! * noise is log-normal, `mean · exp(σ z)`, so the median is the mean and the tail is
//!   heavier than the planner predicts.

use super::rng::SplitMix64;
use planner::perf::synthetic::{instance_memory_gib, ModelShape};

/// MIG instance sizes (GPCs) a simulated process may run on.
pub const MIG_SIZES: [u8; 5] = [1, 2, 3, 4, 7];

/// Refusals of [`LatencyModel::new`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LatencyModelError {
    #[error("invalid MIG size {0} GPCs: expected one of 1, 2, 3, 4, 7 (or 0 for the whole GPU)")]
    MigSize(u8),
    #[error("invalid MPS share {0}%: expected 1..=100")]
    MpsShare(u32),
    #[error("invalid `{field}`: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("model `{model}` with max batch {batch} needs {need_gib:.1} GiB, more than the {have_gib:.0} GiB of a {gpcs}g instance")]
    DoesNotFit { model: String, batch: u32, gpcs: u8, need_gib: f64, have_gib: f64 },
}

/// Where the process runs and how it is perturbed.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// MIG instance size in GPCs; 0 means the whole GPU (7).
    pub mig_gpcs: u8,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 1..=100.
    pub mps_percent: u32,
    /// Sum of the other co-located processes' busy fractions (0 = alone).
    pub colocated_load: f64,
    /// σ of the log-normal noise (0 = deterministic).
    pub noise_sigma: f64,
    /// Multiplies every time (tests run the simulation faster than real time).
    pub time_scale: f64,
}

impl Default for Placement {
    fn default() -> Self {
        Placement { mig_gpcs: 0, mps_percent: 100, colocated_load: 0.0, noise_sigma: 0.1, time_scale: 1.0 }
    }
}

/// Validated model + placement.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyModel {
    shape: ModelShape,
    gpcs: u8,
    share: f64,
    colocated_load: f64,
    noise_sigma: f64,
    time_scale: f64,
}

impl LatencyModel {
    /// Checks the placement and that `max_batch` fits the instance's memory.
    pub fn new(shape: ModelShape, placement: &Placement, max_batch: u32) -> Result<Self, LatencyModelError> {
        let gpcs = if placement.mig_gpcs == 0 { 7 } else { placement.mig_gpcs };
        if !MIG_SIZES.contains(&gpcs) {
            return Err(LatencyModelError::MigSize(placement.mig_gpcs));
        }
        if !(1..=100).contains(&placement.mps_percent) {
            return Err(LatencyModelError::MpsShare(placement.mps_percent));
        }
        non_negative("colocated_load", placement.colocated_load)?;
        non_negative("noise_sigma", placement.noise_sigma)?;
        if !(placement.time_scale.is_finite() && placement.time_scale > 0.0) {
            return Err(field("time_scale", format!("must be > 0, got {}", placement.time_scale)));
        }
        if max_batch == 0 {
            return Err(field("max_batch", "must be >= 1".into()));
        }
        let need_gib = shape.weights_gib + shape.activation_gib * f64::from(max_batch);
        let have_gib = instance_memory_gib(gpcs);
        if need_gib > have_gib {
            return Err(LatencyModelError::DoesNotFit { model: shape.name, batch: max_batch, gpcs, need_gib, have_gib });
        }
        Ok(LatencyModel {
            shape,
            gpcs,
            share: f64::from(placement.mps_percent) / 100.0,
            colocated_load: placement.colocated_load,
            noise_sigma: placement.noise_sigma,
            time_scale: placement.time_scale,
        })
    }

    /// The instance size in GPCs (7 for a whole GPU).
    pub fn gpcs(&self) -> u8 {
        self.gpcs
    }

    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// Mean time of one batch of `batch` samples, ms (see the module docs).
    pub fn mean_ms(&self, batch: u32) -> f64 {
        let solo = self.shape.shared_batch_ms(self.gpcs, self.share, batch);
        solo * (1.0 + self.shape.interference * self.colocated_load) * self.time_scale
    }

    /// One noisy draw of the batch time, ms.
    pub fn sample_ms(&self, batch: u32, rng: &mut SplitMix64) -> f64 {
        let mean = self.mean_ms(batch);
        if self.noise_sigma == 0.0 {
            return mean;
        }
        mean * (self.noise_sigma * rng.next_normal()).exp()
    }
}

fn field(field: &'static str, reason: String) -> LatencyModelError {
    LatencyModelError::Field { field, reason }
}

fn non_negative(name: &'static str, v: f64) -> Result<(), LatencyModelError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(field(name, format!("must be a finite number >= 0, got {v}")))
    }
}

/// The example model called `name`, with the list of known names on a miss.
pub fn model_shape(name: &str) -> Result<ModelShape, String> {
    let models = planner::perf::synthetic::example_models();
    let known: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    models.into_iter().find(|m| m.name == name).ok_or_else(|| format!("unknown model `{name}`; known: {}", known.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resnet() -> ModelShape {
        model_shape("resnet50").unwrap()
    }

    fn quiet(mig_gpcs: u8, mps_percent: u32, colocated_load: f64) -> Placement {
        Placement { mig_gpcs, mps_percent, colocated_load, noise_sigma: 0.0, time_scale: 1.0 }
    }

    #[test]
    fn matches_the_planner_model_alone_at_full_share() {
        for g in MIG_SIZES {
            let m = LatencyModel::new(resnet(), &quiet(g, 100, 0.0), 32).unwrap();
            for b in [1, 2, 8, 32] {
                let planner = resnet().latency_ms(g, b, 1).unwrap();
                assert!((m.mean_ms(b) - planner).abs() < 1e-9, "{g}g batch {b}: {} vs {planner}", m.mean_ms(b));
            }
        }
        // 0 GPCs means the whole GPU.
        assert_eq!(LatencyModel::new(resnet(), &quiet(0, 100, 0.0), 8).unwrap().gpcs(), 7);
    }

    #[test]
    fn mps_share_and_interference_by_hand() {
        // 7g at 50%: 3.5 GPCs of compute; batch 32 > knee 3·3.5; slow-down 0.6·7/3.5 + 0.4·8/8
        // = 1.6; 6 + 0.4·32·1.6 = 26.48 ms; load 2 → × (1 + 0.03·2) = 28.0688.
        let m = LatencyModel::new(resnet(), &quiet(7, 50, 0.0), 32).unwrap();
        assert!((m.mean_ms(32) - 26.48).abs() < 1e-9, "{}", m.mean_ms(32));
        let m = LatencyModel::new(resnet(), &quiet(7, 50, 2.0), 32).unwrap();
        assert!((m.mean_ms(32) - 28.0688).abs() < 1e-9, "{}", m.mean_ms(32));
        // A smaller share is never faster.
        let at = |p| LatencyModel::new(resnet(), &quiet(3, p, 0.0), 16).unwrap().mean_ms(16);
        assert!(at(30) > at(60) && at(60) > at(100));
    }

    #[test]
    fn noise_is_seeded_and_centred_on_the_mean() {
        let p = Placement { noise_sigma: 0.2, ..quiet(3, 100, 0.0) };
        let m = LatencyModel::new(resnet(), &p, 8).unwrap();
        let draw = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..2001).map(|_| m.sample_ms(8, &mut r)).collect::<Vec<f64>>()
        };
        let (a, b) = (draw(1), draw(1));
        assert_eq!(a, b);
        assert_ne!(a, draw(2));
        let mut sorted = a.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[1000];
        assert!((median / m.mean_ms(8) - 1.0).abs() < 0.05, "median {median} vs {}", m.mean_ms(8));
        assert!(sorted[1980] > m.mean_ms(8) * 1.3, "a σ = 0.2 tail reaches past +30% at p99");
        assert!(a.iter().all(|&t| t > 0.0));
    }

    #[test]
    fn refuses_bad_placements_precisely() {
        let err = |p: Placement, b| LatencyModel::new(resnet(), &p, b).unwrap_err();
        assert_eq!(err(quiet(5, 100, 0.0), 1), LatencyModelError::MigSize(5));
        assert_eq!(err(quiet(1, 0, 0.0), 1), LatencyModelError::MpsShare(0));
        assert_eq!(err(quiet(1, 101, 0.0), 1), LatencyModelError::MpsShare(101));
        assert!(matches!(err(quiet(1, 100, -1.0), 1), LatencyModelError::Field { field: "colocated_load", .. }));
        assert!(matches!(err(quiet(1, 100, 0.0), 0), LatencyModelError::Field { field: "max_batch", .. }));
        let llm = model_shape("llama-7b-int8").unwrap();
        let e = LatencyModel::new(llm, &quiet(1, 100, 0.0), 1).unwrap_err();
        assert_eq!(e.to_string(), "model `llama-7b-int8` with max batch 1 needs 10.3 GiB, more than the 10 GiB of a 1g instance");
        assert!(model_shape("nope").unwrap_err().contains("resnet50"));
    }
}
