//! iGniter's interference-aware performance model (iGniter Sec. 3.1, Eq. 1-11), Theorem 1
//! (Eq. 17-18) and least-squares fitting of its coefficients from profiling samples.
//!
//! Units: times in milliseconds, request rates in req/s, GPU resources in percent of the GPU
//! (MPS active-thread percentage, `r_max = 100`), data sizes in bytes, PCIe bandwidth in
//! bytes per millisecond, power in watts, frequency in MHz.

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

/// The 7 hardware-specific coefficients of iGniter (Sec. 3.1) plus the allocation unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareCoeffs {
    /// Power cap P (W).
    pub max_power_w: f64,
    /// Maximum frequency F (MHz).
    pub max_freq_mhz: f64,
    /// Idle power p_idle (W).
    pub idle_power_w: f64,
    /// Available PCIe bandwidth B_pcie (bytes/ms).
    pub pcie_bytes_per_ms: f64,
    /// Eq. 9 frequency/power slope α_f (MHz/W, negative).
    pub alpha_f: f64,
    /// Eq. 6 scheduling-delay coefficients α_sch, β_sch (ms per kernel).
    pub alpha_sch: f64,
    pub beta_sch: f64,
    /// Allocation unit r_unit (percent; 2.5 on V100).
    pub r_unit_pct: f64,
    /// r_max (percent).
    pub r_max_pct: f64,
}

/// The workload-specific coefficients of one model on one GPU type (Sec. 3.1). Also the
/// controller's ModelProfile schema, hence unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadCoeffs {
    /// Input bytes per request d_load.
    pub d_load_bytes: f64,
    /// Result bytes per request d_feedback.
    pub d_feedback_bytes: f64,
    /// Kernels per inference n_k.
    pub n_kernels: f64,
    /// Solo scheduling delay per kernel k_sch (ms).
    pub k_sch_ms: f64,
    /// Eq. 11 coefficients k1..k5 (r in percent, result in ms).
    pub k: [f64; 5],
    /// Power line p = α_power · b/k_act + β_power (ability in batches... req/s).
    pub alpha_power: f64,
    pub beta_power: f64,
    /// L2 utilisation line c = α_cacheutil · b/k_act + β_cacheutil.
    pub alpha_cacheutil: f64,
    pub beta_cacheutil: f64,
    /// Eq. 8 cache contention coefficient α_cache.
    pub alpha_cache: f64,
}

impl WorkloadCoeffs {
    /// Eq. 11: solo GPU active time (ms) for batch `b` with `r_pct` percent of the GPU.
    pub fn k_act(&self, b: u32, r_pct: f64) -> f64 {
        let b = f64::from(b);
        let [k1, k2, k3, k4, k5] = self.k;
        (k1 * b * b + k2 * b + k3) / (r_pct + k4) + k5
    }
    /// GPU processing ability b / k_act in req/s.
    pub fn ability(&self, b: u32, r_pct: f64) -> f64 {
        1000.0 * f64::from(b) / self.k_act(b, r_pct)
    }
    /// Power consumption p^i (W above idle).
    pub fn power(&self, b: u32, r_pct: f64) -> f64 {
        self.alpha_power * self.ability(b, r_pct) + self.beta_power
    }
    /// L2 cache utilisation c^i.
    pub fn cache_util(&self, b: u32, r_pct: f64) -> f64 {
        self.alpha_cacheutil * self.ability(b, r_pct) + self.beta_cacheutil
    }
}

/// A workload co-located on a GPU: its coefficients, batch size and MPS share.
#[derive(Debug, Clone, Copy)]
pub struct Colocated<'a> {
    pub coeffs: &'a WorkloadCoeffs,
    pub batch: u32,
    pub r_pct: f64,
}

/// Predicted performance of one co-located workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// t_inf (Eq. 1), ms.
    pub latency_ms: f64,
    /// h (Eq. 2), req/s.
    pub throughput_rps: f64,
    /// t_gpu (Eq. 4), ms.
    pub gpu_ms: f64,
    /// f (Eq. 9), MHz.
    pub frequency_mhz: f64,
}

/// Eq. 3: data loading latency (ms).
pub fn t_load(hw: &HardwareCoeffs, w: &WorkloadCoeffs, b: u32) -> f64 {
    w.d_load_bytes * f64::from(b) / hw.pcie_bytes_per_ms
}
/// Eq. 3: result feedback latency (ms).
pub fn t_feedback(hw: &HardwareCoeffs, w: &WorkloadCoeffs, b: u32) -> f64 {
    w.d_feedback_bytes * f64::from(b) / hw.pcie_bytes_per_ms
}

/// Lower bound on the Eq. 9 frequency, as a fraction of F (see [`predict`]).
pub const MIN_FREQ_FRACTION: f64 = 0.01;

/// Eq. 1-10: latency and throughput of every workload co-located on one GPU.
pub fn predict(hw: &HardwareCoeffs, workloads: &[Colocated<'_>]) -> Vec<Prediction> {
    let n = workloads.len() as f64;
    // Eq. 6: extra scheduling delay per kernel once more than one workload shares the GPU.
    let delta_sch = if workloads.len() <= 1 { 0.0 } else { hw.alpha_sch * n + hw.beta_sch };
    // Eq. 10 and 9: power demand and the resulting frequency.
    let demand: f64 = hw.idle_power_w + workloads.iter().map(|w| w.coeffs.power(w.batch, w.r_pct)).sum::<f64>();
    let freq = if demand <= hw.max_power_w { hw.max_freq_mhz } else { hw.max_freq_mhz + hw.alpha_f * (demand - hw.max_power_w) };
    // Eq. 9 is a line fitted near the power cap; far above it the line crosses zero and a
    // zero or negative frequency would make Eq. 4 predict an infinite or *negative* GPU time
    // (which a planner would read as "meets the SLO"). Keep it at or above 1% of F: the
    // predicted latency is then huge, as it should be for a hopelessly over-subscribed GPU.
    let freq = freq.max(hw.max_freq_mhz * MIN_FREQ_FRACTION);
    let caches: Vec<f64> = workloads.iter().map(|w| w.coeffs.cache_util(w.batch, w.r_pct)).collect();
    let total_cache: f64 = caches.iter().sum();
    workloads
        .iter()
        .zip(&caches)
        .map(|(w, own_cache)| {
            let c = w.coeffs;
            let t_sch = (c.k_sch_ms + delta_sch) * c.n_kernels; // Eq. 5
            let t_act = c.k_act(w.batch, w.r_pct) * (1.0 + c.alpha_cache * (total_cache - own_cache)); // Eq. 8
            let gpu_ms = (t_sch + t_act) / (freq / hw.max_freq_mhz); // Eq. 4
            let fb = t_feedback(hw, c, w.batch);
            Prediction {
                latency_ms: t_load(hw, c, w.batch) + gpu_ms + fb,
                throughput_rps: 1000.0 * f64::from(w.batch) / (gpu_ms + fb),
                gpu_ms,
                frequency_mhz: freq,
            }
        })
        .collect()
}

/// Theorem 1, Eq. 17: the appropriate batch size that just meets `rate_rps` within half the
/// SLO: `ceil(T_slo · R · B / (2 (B + R · d_load)))` (with R in req/ms).
pub fn appropriate_batch(hw: &HardwareCoeffs, w: &WorkloadCoeffs, slo_ms: f64, rate_rps: f64) -> u32 {
    let r = rate_rps / 1000.0;
    let b = slo_ms * r * hw.pcie_bytes_per_ms / (2.0 * (hw.pcie_bytes_per_ms + r * w.d_load_bytes));
    // A tiny epsilon keeps an exact integer (e.g. 4.0000000001 from rounding) from becoming 5.
    // The cast saturates (NaN to 0); no plan carries a batch beyond the planner's bound.
    ((b - 1e-9).ceil() as u32).clamp(1, crate::bounds::MAX_BATCH)
}

/// Theorem 1, Eq. 18: the resource lower bound (percent, a multiple of r_unit) for batch `b`,
/// `ceil(γ/(δ·r_unit) − k4/r_unit) · r_unit`. `None` when δ ≤ 0, i.e. no amount of GPU can
/// meet half the SLO with this batch.
pub fn resource_lower_bound(hw: &HardwareCoeffs, w: &WorkloadCoeffs, slo_ms: f64, b: u32) -> Option<f64> {
    let bf = f64::from(b);
    let [k1, k2, k3, k4, k5] = w.k;
    let gamma = k1 * bf * bf + k2 * bf + k3;
    let delta = slo_ms / 2.0 - (w.d_load_bytes + w.d_feedback_bytes) * bf / hw.pcie_bytes_per_ms - k5 - w.k_sch_ms * w.n_kernels;
    if delta <= 0.0 {
        return None;
    }
    let units = (gamma / (delta * hw.r_unit_pct) - k4 / hw.r_unit_pct - 1e-9).ceil();
    Some((units * hw.r_unit_pct).max(hw.r_unit_pct))
}

// ---------------------------------------------------------------------------------------------
// Least-squares fitting (Sec. 3.1 "Obtaining Model Coefficients").

/// Ordinary least squares `y ≈ X β` via SVD; `None` for an empty or degenerate system.
pub fn least_squares(rows: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let n = rows.len();
    let m = rows.first()?.len();
    if n < m || y.len() != n {
        return None;
    }
    let x = DMatrix::from_fn(n, m, |i, j| rows[i][j]);
    let yv = DVector::from_column_slice(y);
    let svd = x.svd(true, true);
    let beta = svd.solve(&yv, 1e-12).ok()?;
    Some(beta.iter().copied().collect())
}

/// Fits a line `y = slope · x + intercept`.
pub fn fit_line(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let rows: Vec<Vec<f64>> = x.iter().map(|&v| vec![v, 1.0]).collect();
    let b = least_squares(&rows, y)?;
    Some((b[0], b[1]))
}

fn sse_active(samples: &[(u32, f64, f64)], k4: f64) -> Option<(f64, [f64; 5])> {
    let rows: Vec<Vec<f64>> = samples
        .iter()
        .map(|&(b, r, _)| {
            let b = f64::from(b);
            let d = r + k4;
            vec![b * b / d, b / d, 1.0 / d, 1.0]
        })
        .collect();
    let y: Vec<f64> = samples.iter().map(|s| s.2).collect();
    let c = least_squares(&rows, &y)?;
    let k = [c[0], c[1], c[2], k4, c[3]];
    let sse = samples
        .iter()
        .map(|&(b, r, t)| {
            let bf = f64::from(b);
            let pred = (k[0] * bf * bf + k[1] * bf + k[2]) / (r + k4) + k[4];
            (pred - t).powi(2)
        })
        .sum();
    Some((sse, k))
}

/// Fits Eq. 11 `k_act = (k1 b² + k2 b + k3)/(r + k4) + k5` to `(batch, r_pct, k_act_ms)`
/// samples. The model is linear in k1, k2, k3, k5 for a fixed k4, so k4 is found by a 1-D
/// search (log-spaced scan, then golden-section refinement) with an inner linear least
/// squares (variable projection) -- deterministic and free of starting-point sensitivity.
pub fn fit_active_time(samples: &[(u32, f64, f64)]) -> Option<[f64; 5]> {
    if samples.len() < 5 {
        return None;
    }
    let r_min = samples.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    // k4 must keep r + k4 > 0 for every sample.
    let lo = -r_min * 0.999;
    let mut grid: Vec<f64> =
        (0..=400).map(|i| lo + (r_min * 0.999 + 1e4) * ((i as f64 / 400.0) * 12.0).exp_m1() / 12f64.exp_m1()).collect();
    grid.dedup();
    let mut best = (f64::INFINITY, 0usize);
    for (i, &k4) in grid.iter().enumerate() {
        if let Some((sse, _)) = sse_active(samples, k4) {
            if sse < best.0 {
                best = (sse, i);
            }
        }
    }
    if !best.0.is_finite() {
        return None;
    }
    let (mut a, mut b) = (grid[best.1.saturating_sub(1)], grid[(best.1 + 1).min(grid.len() - 1)]);
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    let f = |k4: f64| sse_active(samples, k4).map_or(f64::INFINITY, |v| v.0);
    for _ in 0..200 {
        let c = b - phi * (b - a);
        let d = a + phi * (b - a);
        if f(c) < f(d) {
            b = d;
        } else {
            a = c;
        }
    }
    sse_active(samples, (a + b) / 2.0).map(|v| v.1)
}

/// Fits Eq. 6's α_sch, β_sch from the per-kernel idle (scheduling) time measured with 1..=N
/// identical workloads: times are normalised to maximum frequency, the solo value is
/// subtracted (Δ_sch is the *increase*), and a line is fitted over n = 2..=N.
pub fn fit_scheduling(idle_ms: &[f64], freq_mhz: &[f64], max_freq: f64) -> Option<(f64, f64)> {
    if idle_ms.len() < 3 || idle_ms.len() != freq_mhz.len() {
        return None;
    }
    let norm: Vec<f64> = idle_ms.iter().zip(freq_mhz).map(|(t, f)| t * f / max_freq).collect();
    let x: Vec<f64> = (2..=norm.len()).map(|n| n as f64).collect();
    let y: Vec<f64> = norm[1..].iter().map(|t| t - norm[0]).collect();
    fit_line(&x, &y)
}

/// Fits Eq. 9's α_f from total power and frequency measured with 1..=N co-located
/// workloads. Measured power saturates at the cap once the GPU throttles, but Eq. 9 is in
/// terms of power *demand* (Eq. 10), so the demand of throttled samples is extrapolated with
/// the mean power increment of the unthrottled ones; α_f is then the one-parameter least
/// squares slope of `f − F = α_f (p_demand − P)`.
pub fn fit_frequency(power_w: &[f64], freq_mhz: &[f64], max_power: f64, max_freq: f64) -> Option<f64> {
    let first = freq_mhz.iter().position(|&f| f < max_freq)?;
    if first < 2 {
        return None;
    }
    let step = (power_w[first - 1] - power_w[0]) / (first - 1) as f64;
    let mut demand = power_w.to_vec();
    for i in first..demand.len() {
        demand[i] = demand[i - 1] + step;
    }
    let (mut num, mut den) = (0.0, 0.0);
    for i in first..demand.len() {
        let dp = demand[i] - max_power;
        num += (freq_mhz[i] - max_freq) * dp;
        den += dp * dp;
    }
    (den > 0.0).then(|| num / den)
}

/// Eq. 8's α_cache from the active time solo and beside one identical workload (whose L2
/// utilisation is `cache_util`), with the paired time normalised to maximum frequency.
pub fn fit_cache(active_solo_ms: f64, active_pair_ms: f64, pair_freq: f64, max_freq: f64, cache_util: f64) -> f64 {
    ((active_pair_ms * pair_freq / max_freq) / active_solo_ms - 1.0) / cache_util
}

/// One profiling sample of a workload running alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SoloSample {
    pub batch: u32,
    pub r_pct: f64,
    /// Measured GPU execution time (scheduling + active), ms.
    pub gpu_latency_ms: f64,
    pub power_w: f64,
    pub frequency_mhz: f64,
}

/// Everything needed to fit one workload's coefficients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadProfile {
    pub d_load_bytes: f64,
    pub d_feedback_bytes: f64,
    pub n_kernels: f64,
    /// Total solo scheduling (idle) time per inference, ms.
    pub solo_idle_ms: f64,
    pub samples: Vec<SoloSample>,
    /// (batch, r_pct, L2 utilisation) samples.
    pub cache_samples: Vec<(u32, f64, f64)>,
    pub active_solo_ms: f64,
    pub active_pair_ms: f64,
    pub pair_freq_mhz: f64,
    /// Solo L2 utilisation used with the paired run.
    pub pair_cache_util: f64,
}

/// Fits every workload coefficient (Eq. 11, the power and L2 lines, α_cache).
pub fn fit_workload(hw: &HardwareCoeffs, p: &WorkloadProfile) -> Option<WorkloadCoeffs> {
    let act: Vec<(u32, f64, f64)> = p
        .samples
        .iter()
        .map(|s| {
            // Normalise throttled samples to maximum frequency, then remove scheduling time.
            let t = s.gpu_latency_ms * (s.frequency_mhz / hw.max_freq_mhz).min(1.0);
            (s.batch, s.r_pct, t - p.solo_idle_ms)
        })
        .collect();
    let k = fit_active_time(&act)?;
    let ability = |b: u32, lat: f64| 1000.0 * f64::from(b) / (lat - p.solo_idle_ms);
    // Power is only meaningful where the GPU did not throttle.
    let (px, py): (Vec<f64>, Vec<f64>) = p
        .samples
        .iter()
        .filter(|s| s.frequency_mhz >= hw.max_freq_mhz - 0.5)
        .map(|s| (ability(s.batch, s.gpu_latency_ms), s.power_w - hw.idle_power_w))
        .unzip();
    let (alpha_power, beta_power) = fit_line(&px, &py)?;
    let (cx, cy): (Vec<f64>, Vec<f64>) = p
        .cache_samples
        .iter()
        .filter_map(|&(b, r, c)| {
            let s = p.samples.iter().find(|s| s.batch == b && (s.r_pct - r).abs() < 1e-9)?;
            Some((ability(b, s.gpu_latency_ms), c))
        })
        .unzip();
    let (alpha_cacheutil, beta_cacheutil) = fit_line(&cx, &cy)?;
    Some(WorkloadCoeffs {
        d_load_bytes: p.d_load_bytes,
        d_feedback_bytes: p.d_feedback_bytes,
        n_kernels: p.n_kernels,
        k_sch_ms: p.solo_idle_ms / p.n_kernels,
        k,
        alpha_power,
        beta_power,
        alpha_cacheutil,
        beta_cacheutil,
        alpha_cache: fit_cache(p.active_solo_ms, p.active_pair_ms, p.pair_freq_mhz, hw.max_freq_mhz, p.pair_cache_util),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn hw() -> HardwareCoeffs {
        HardwareCoeffs {
            max_power_w: 250.0,
            max_freq_mhz: 1500.0,
            idle_power_w: 50.0,
            pcie_bytes_per_ms: 1e7,
            alpha_f: -1.0,
            alpha_sch: 0.005,
            beta_sch: -0.01,
            r_unit_pct: 2.5,
            r_max_pct: 100.0,
        }
    }

    pub(crate) fn wl() -> WorkloadCoeffs {
        WorkloadCoeffs {
            d_load_bytes: 500_000.0,
            d_feedback_bytes: 5_000.0,
            n_kernels: 40.0,
            k_sch_ms: 0.001,
            k: [0.05, 20.0, 30.0, 5.0, 0.2],
            alpha_power: 0.05,
            beta_power: 20.0,
            alpha_cacheutil: 0.005,
            beta_cacheutil: 2.0,
            alpha_cache: 0.01,
        }
    }

    #[test]
    fn theorem1_batch_and_lower_bound_by_hand() {
        let (h, w) = (hw(), wl());
        // Eq. 17: T=20 ms, R=400 req/s = 0.4 req/ms: 20·0.4·1e7 / (2·(1e7 + 0.4·5e5)) = 8e7/2.04e7 = 3.92 -> 4.
        assert_eq!(appropriate_batch(&h, &w, 20.0, 400.0), 4);
        // R=1000: 20·1·1e7/(2·(1e7+5e5)) = 2e8/2.1e7 = 9.52 -> 10.
        assert_eq!(appropriate_batch(&h, &w, 20.0, 1000.0), 10);
        // Eq. 18 with b=4: γ = 0.05·16 + 20·4 + 30 = 110.8;
        // δ = 10 − (5.05e5·4)/1e7 − 0.2 − 0.001·40 = 10 − 0.202 − 0.2 − 0.04 = 9.558;
        // γ/(δ·2.5) − 5/2.5 = 4.6370 − 2 = 2.637 -> 3 units = 7.5%.
        assert_eq!(resource_lower_bound(&h, &w, 20.0, 4), Some(7.5));
        // An impossible SLO has no lower bound.
        assert_eq!(resource_lower_bound(&h, &w, 0.4, 4), None);
    }

    #[test]
    fn lower_bound_meets_half_slo_when_alone() {
        let (h, w) = (hw(), wl());
        for (slo, rate) in [(20.0, 400.0), (30.0, 800.0), (50.0, 200.0)] {
            let b = appropriate_batch(&h, &w, slo, rate);
            let r = resource_lower_bound(&h, &w, slo, b).unwrap();
            let p = predict(&h, &[Colocated { coeffs: &w, batch: b, r_pct: r }])[0];
            assert!(p.latency_ms <= slo / 2.0 + 1e-9, "{slo} {rate}: {p:?}");
            assert!(p.throughput_rps >= rate, "{slo} {rate}: {p:?}");
            // One unit less would violate (Eq. 18 is the *lower* bound).
            if r > h.r_unit_pct {
                let q = predict(&h, &[Colocated { coeffs: &w, batch: b, r_pct: r - h.r_unit_pct }])[0];
                assert!(q.latency_ms > slo / 2.0 - 1e-9);
            }
        }
    }

    #[test]
    fn interference_slows_down_colocated_workloads() {
        let (h, w) = (hw(), wl());
        let solo = predict(&h, &[Colocated { coeffs: &w, batch: 8, r_pct: 50.0 }])[0];
        let pair = predict(&h, &[Colocated { coeffs: &w, batch: 8, r_pct: 50.0 }, Colocated { coeffs: &w, batch: 8, r_pct: 50.0 }]);
        assert!(pair[0].latency_ms > solo.latency_ms);
        assert!(pair[0].throughput_rps < solo.throughput_rps);
    }

    #[test]
    fn frequency_never_goes_non_positive() {
        // α_f = −1 MHz/W: a demand 2000 W over the cap would give F − 2000 < 0 by Eq. 9.
        let h = hw();
        let mut w = wl();
        w.beta_power = 2200.0;
        let p = predict(&h, &[Colocated { coeffs: &w, batch: 4, r_pct: 50.0 }])[0];
        assert!((p.frequency_mhz - 15.0).abs() < 1e-9, "{p:?}");
        assert!(p.latency_ms > 0.0 && p.latency_ms.is_finite());
        assert!(p.throughput_rps > 0.0 && p.throughput_rps.is_finite());
        // Just above the cap Eq. 9 applies unchanged: demand 50 + 20 + 0.05·ability.
        w.beta_power = 200.0;
        let p = predict(&h, &[Colocated { coeffs: &w, batch: 4, r_pct: 50.0 }])[0];
        let demand = 50.0 + w.power(4, 50.0);
        assert!((p.frequency_mhz - (1500.0 - (demand - 250.0))).abs() < 1e-9);
    }

    #[test]
    fn fits_recover_known_coefficients() {
        let truth = [0.02, 3.0, 10.0, 4.0, 0.3];
        let mut samples = Vec::new();
        for b in [1u32, 4, 16, 32] {
            for r in [10.0, 30.0, 50.0, 100.0] {
                let bf = f64::from(b);
                samples.push((b, r, (truth[0] * bf * bf + truth[1] * bf + truth[2]) / (r + truth[3]) + truth[4]));
            }
        }
        let k = fit_active_time(&samples).unwrap();
        for (got, want) in k.iter().zip(truth) {
            assert!((got - want).abs() < 1e-3 * want.abs().max(1.0), "{k:?}");
        }
        let (s, i) = fit_line(&[1.0, 2.0, 3.0], &[5.0, 7.0, 9.0]).unwrap();
        assert!((s - 2.0).abs() < 1e-9 && (i - 3.0).abs() < 1e-9);
        // Scheduling: increments 0, 0.005, 0.010 per extra workload -> α 0.005, β −0.005.
        let (a, b) = fit_scheduling(&[0.001, 0.006, 0.011, 0.016], &[1500.0; 4], 1500.0).unwrap();
        assert!((a - 0.005).abs() < 1e-9 && (b + 0.005).abs() < 1e-9);
        // Frequency: power rises 60 W per workload; throttling starts at the 4th sample.
        let af = fit_frequency(&[100.0, 160.0, 220.0, 250.0, 250.0], &[1500.0, 1500.0, 1500.0, 1470.0, 1410.0], 250.0, 1500.0).unwrap();
        // demands 280, 340 -> (−30·30 + −90·90)/(30² + 90²) = −1.
        assert!((af + 1.0).abs() < 1e-9);
        assert!((fit_cache(10.0, 11.0, 1500.0, 1500.0, 20.0) - 0.005).abs() < 1e-12);
    }
}
