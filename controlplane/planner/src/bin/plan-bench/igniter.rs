//! iGniter's motivation example (igniter.txt Sec. 2.3, Table 1): AlexNet 15 ms / 500 req/s,
//! ResNet-50 40 ms / 400 req/s, VGG-19 60 ms / 200 req/s on V100s. The paper provisions one
//! GPU: A (10%, batch 4), R (30%, batch 8), V (37.5%, batch 6).
//!
//! The coefficients are fitted at run time from iGniter's published profiling data
//! (`igniter/config.jsonl`) with the crate's least-squares fitting (`perf::igniter`); nothing
//! of the answer is built in.

use planner::input::{GpuType, PlanningInput, ServiceDemand};
use planner::mig::GpuModel;
use planner::perf::igniter::{
    appropriate_batch, fit_frequency, fit_scheduling, fit_workload, resource_lower_bound, HardwareCoeffs, SoloSample, WorkloadCoeffs,
    WorkloadProfile,
};
use planner::plan::Plan;
use planner::strategy::igniter::{self, IgniterConfig};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Profiling grid of `gpulatency`, `power` and `frequency` (rows: batch, columns: MPS %).
const BATCHES: [u32; 3] = [1, 16, 32];
const THREADS: [f64; 3] = [10.0, 50.0, 100.0];
const GPU_TYPE: &str = "v100";

/// (model in config.jsonl, label, SLO ms, rate req/s, paper's share %, paper's batch).
const EXAMPLE: [(&str, &str, f64, f64, f64, u32); 3] = [
    ("alexnet", "AlexNet", 15.0, 500.0, 10.0, 4),
    ("resnet50", "ResNet-50", 40.0, 400.0, 30.0, 8),
    ("vgg19", "VGG-19", 60.0, 200.0, 37.5, 6),
];
/// Paper Sec. 5.1: α_f, α_sch, β_sch as profiled on the V100.
const PAPER_HW: (f64, f64, f64) = (-1.025, 0.00475, -0.00902);

/// The merged JSON objects of config.jsonl: `{"alexnet": {...}, "hardware": {...}, ...}`.
pub struct Config(BTreeMap<String, serde_json::Map<String, Value>>);

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut merged: BTreeMap<String, serde_json::Map<String, Value>> = BTreeMap::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
            let obj = v.as_object().ok_or_else(|| format!("line {}: not a JSON object", i + 1))?;
            for (k, inner) in obj {
                let inner = inner.as_object().ok_or_else(|| format!("line {}: `{k}` is not an object", i + 1))?;
                merged.entry(k.clone()).or_default().extend(inner.clone());
            }
        }
        Ok(Config(merged))
    }
    fn get(&self, section: &str, key: &str) -> Result<&Value, String> {
        self.0.get(section).and_then(|s| s.get(key)).ok_or_else(|| format!("missing `{section}.{key}`"))
    }
    fn num(&self, section: &str, key: &str) -> Result<f64, String> {
        self.get(section, key)?.as_f64().ok_or_else(|| format!("`{section}.{key}` is not a number"))
    }
    fn vec(&self, section: &str, key: &str) -> Result<Vec<f64>, String> {
        let v = self.get(section, key)?.as_array().ok_or_else(|| format!("`{section}.{key}` is not an array"))?;
        v.iter().map(|x| x.as_f64().ok_or_else(|| format!("`{section}.{key}` holds a non-number"))).collect()
    }
    fn grid(&self, section: &str, key: &str) -> Result<Vec<Vec<f64>>, String> {
        let rows = self.get(section, key)?.as_array().ok_or_else(|| format!("`{section}.{key}` is not an array"))?;
        let g: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| {
                r.as_array()
                    .ok_or_else(|| format!("`{section}.{key}` is not a 2-D array"))?
                    .iter()
                    .map(|x| x.as_f64().ok_or_else(|| format!("`{section}.{key}` holds a non-number")))
                    .collect()
            })
            .collect::<Result<_, String>>()?;
        if g.len() != BATCHES.len() || g.iter().any(|r| r.len() != THREADS.len()) {
            return Err(format!("`{section}.{key}` is not {}x{}", BATCHES.len(), THREADS.len()));
        }
        Ok(g)
    }

    /// Hardware coefficients: P, F, p_idle, B_pcie, r_unit read directly; α_f (Eq. 9) and
    /// α_sch, β_sch (Eq. 6) fitted from the 1..5 co-located-workload samples.
    pub fn hardware(&self) -> Result<HardwareCoeffs, String> {
        let (max_power_w, max_freq_mhz) = (self.num("hardware", "maxGPUpower")?, self.num("hardware", "maxGPUfrequency")?);
        let (power, freq) = (self.vec("hardware", "power")?, self.vec("hardware", "frequency")?);
        let alpha_f = fit_frequency(&power, &freq, max_power_w, max_freq_mhz).ok_or("cannot fit α_f (Eq. 9)")?;
        let (alpha_sch, beta_sch) =
            fit_scheduling(&self.vec("hardware", "idletime")?, &freq, max_freq_mhz).ok_or("cannot fit α_sch, β_sch (Eq. 6)")?;
        Ok(HardwareCoeffs {
            max_power_w,
            max_freq_mhz,
            idle_power_w: self.num("hardware", "idlepower")?,
            // `bandwidth` is in bytes per ms (10 GB/s, Sec. 5.1).
            pcie_bytes_per_ms: self.num("hardware", "bandwidth")?,
            alpha_f,
            alpha_sch,
            beta_sch,
            r_unit_pct: self.num("hardware", "unit")?,
            r_max_pct: 100.0,
        })
    }

    /// The profiling data of one model in the shape [`fit_workload`] takes.
    pub fn workload_profile(&self, m: &str) -> Result<WorkloadProfile, String> {
        let (lat, power, freq) = (self.grid(m, "gpulatency")?, self.grid(m, "power")?, self.grid(m, "frequency")?);
        let mut samples = Vec::new();
        for (i, &batch) in BATCHES.iter().enumerate() {
            for (j, &r_pct) in THREADS.iter().enumerate() {
                samples.push(SoloSample { batch, r_pct, gpu_latency_ms: lat[i][j], power_w: power[i][j], frequency_mhz: freq[i][j] });
            }
        }
        // `l2caches` were measured on the grid's diagonal: (1, 10%), (16, 50%), (32, 100%).
        let l2 = self.vec(m, "l2caches")?;
        if l2.len() != BATCHES.len() {
            return Err(format!("`{m}.l2caches` must have {} values", BATCHES.len()));
        }
        let cache_samples = (0..BATCHES.len()).map(|i| (BATCHES[i], THREADS[i], l2[i])).collect();
        Ok(WorkloadProfile {
            d_load_bytes: self.num(m, "inputdata")?,
            d_feedback_bytes: self.num(m, "outputdata")?,
            n_kernels: self.num(m, "kernel")?,
            solo_idle_ms: self.num(m, "idletime_1")?,
            samples,
            cache_samples,
            active_solo_ms: self.num(m, "activetime_1")?,
            active_pair_ms: self.num(m, "activetime_2")?,
            pair_freq_mhz: self.num(m, "frequency_2")?,
            pair_cache_util: self.num(m, "l2cache")?,
        })
    }
}

/// Fitted coefficients of the three example models (and the hardware).
pub struct Fitted {
    pub hw: HardwareCoeffs,
    pub models: Vec<(String, WorkloadCoeffs)>,
}

pub fn fit(cfg: &Config) -> Result<Fitted, String> {
    let hw = cfg.hardware()?;
    let models = EXAMPLE
        .iter()
        .map(|&(m, ..)| {
            let p = cfg.workload_profile(m)?;
            let c = fit_workload(&hw, &p).ok_or_else(|| format!("cannot fit the coefficients of `{m}`"))?;
            Ok((m.to_string(), c))
        })
        .collect::<Result<_, String>>()?;
    Ok(Fitted { hw, models })
}

pub fn input(f: &Fitted) -> PlanningInput {
    let gpu = GpuType { name: GPU_TYPE.into(), model: GpuModel::NoMig, price_per_hour: 3.06, mps: true, igniter: Some(f.hw.clone()) };
    let mut inp = PlanningInput { gpu_types: vec![gpu], ..Default::default() };
    inp.profiles.igniter.insert(GPU_TYPE.into(), f.models.iter().cloned().collect());
    inp.services = EXAMPLE
        .iter()
        .map(|&(m, label, slo_ms, rate, ..)| ServiceDemand { name: label.into(), model: m.into(), slo_ms, request_rate: rate })
        .collect();
    inp
}

fn share_of(plan: &Plan, service: &str) -> Option<(usize, f64, u32, f64, f64)> {
    plan.gpus.iter().enumerate().find_map(|(g, gpu)| {
        gpu.workloads
            .iter()
            .find(|w| w.service == service)
            .map(|w| (g + 1, w.mps_percent, w.batch_size, w.predicted_latency_ms, w.shadow_percent))
    })
}

/// Runs and prints the example; `Err` only for unreadable or malformed data.
pub fn run(anchors: &Path, runs: usize) -> Result<(), String> {
    let path = anchors.join("igniter/config.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cfg = Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let fitted = fit(&cfg).map_err(|e| format!("{}: {e}", path.display()))?;
    let inp = input(&fitted);
    let icfg = IgniterConfig::default();
    let plan = igniter::plan(&inp, &icfg);
    let t = crate::median_time(runs, || drop(igniter::plan(&inp, &icfg)));
    let hw = &fitted.hw;

    println!("\niGniter motivation example on V100 (igniter.txt Sec. 2.3, Table 1; coefficients fitted from {})", path.display());
    println!(
        "hardware fit: α_f {:.4} (paper {}), α_sch {:.5} (paper {}), β_sch {:.5} (paper {}); r_unit {}%",
        hw.alpha_f, PAPER_HW.0, hw.alpha_sch, PAPER_HW.1, hw.beta_sch, PAPER_HW.2, hw.r_unit_pct
    );
    println!(
        "{:<10} {:>5} {:>6} {:>7} {:>7} {:>10} {:>13} {:>9} {:>8} {:>9} {:>11}",
        "workload", "SLO", "rate", "b_appr", "r_lower", "paper GPU", "paper share", "our GPU", "share", "shadow", "pred. lat"
    );
    for &(m, label, slo, rate, paper_share, paper_batch) in &EXAMPLE {
        let c = &fitted.models.iter().find(|(n, _)| n == m).expect("fitted above").1;
        let b = appropriate_batch(hw, c, slo, rate);
        let lower = resource_lower_bound(hw, c, slo, b).map_or("none".to_string(), |r| format!("{r}%"));
        let ours = share_of(&plan, label);
        println!(
            "{:<10} {:>5} {:>6} {:>7} {:>7} {:>10} {:>13} {:>9} {:>8} {:>9} {:>11}",
            label,
            format!("{slo}ms"),
            rate,
            b,
            lower,
            "GPU1",
            format!("{paper_share}% b{paper_batch}"),
            ours.map_or("-".into(), |o| format!("GPU{}", o.0)),
            ours.map_or("-".into(), |o| format!("{}% b{}", o.1, o.2)),
            ours.map_or("-".into(), |o| format!("{}%", o.4)),
            ours.map_or("-".into(), |o| format!("{:.2}ms", o.3)),
        );
    }
    let paper_total: f64 = EXAMPLE.iter().map(|e| e.4).sum();
    let ours_total: f64 = plan.gpus.iter().flat_map(|g| &g.workloads).map(|w| w.mps_percent).sum();
    println!(
        "GPUs: paper 1, ours {}; total share: paper {paper_total}%, ours {ours_total}%; infeasible {}; planning time {:.2?}",
        plan.gpus_used(),
        plan.infeasible.len(),
        t
    );
    for (m, c) in &fitted.models {
        println!(
            "  fit {m:<9} k1..k5 [{:.4e}, {:.4}, {:.3}, {:.3}, {:.4}]  k_sch·n_k {:.4} ms  α_cache {:.5}  power {:.4}·h{:+.2}  L2 {:.5}·h{:+.3}",
            c.k[0],
            c.k[1],
            c.k[2],
            c.k[3],
            c.k[4],
            c.k_sch_ms * c.n_kernels,
            c.alpha_cache,
            c.alpha_power,
            c.beta_power,
            c.alpha_cacheutil,
            c.beta_cacheutil
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up profile in config.jsonl's layout (not iGniter's data).
    fn config_text() -> String {
        let lines = [
            r#"{"hardware": {"idlepower": 50.0}}"#,
            r#"{"hardware": {"power": [100.0, 160.0, 220.0, 250.0, 250.0]}}"#,
            r#"{"hardware": {"frequency": [1500.0, 1500.0, 1500.0, 1470.0, 1410.0]}}"#,
            r#"{"hardware": {"idletime": [0.001, 0.006, 0.011, 0.016, 0.021]}}"#,
            r#"{"hardware": {"maxGPUfrequency": 1500}}"#,
            r#"{"hardware": {"maxGPUpower": 250}}"#,
            r#"{"hardware": {"unit": 2.5}}"#,
            r#"{"hardware": {"bandwidth": 10000000}}"#,
            r#"{"m": {"inputdata": 1000, "outputdata": 10}}"#,
            r#"{"m": {"gpulatency": [[3.0, 1.0, 0.7], [16.0, 3.6, 2.0], [30.0, 6.5, 3.6]]}}"#,
            r#"{"m": {"power": [[80, 150, 180], [85, 180, 240], [85, 190, 245]]}}"#,
            r#"{"m": {"frequency": [[1500, 1500, 1500], [1500, 1500, 1500], [1500, 1500, 1490]]}}"#,
            r#"{"m": {"l2caches": [2.0, 16.0, 30.0]}}"#,
            "",
            r#"{"m": {"l2cache": 16.0, "idletime_1": 0.03, "activetime_1": 3.0, "activetime_2": 3.2, "frequency_2": 1500, "kernel": 20}}"#,
        ];
        lines.join("\n")
    }

    #[test]
    fn parses_and_merges_the_json_lines() {
        let cfg = Config::parse(&config_text()).unwrap();
        assert_eq!(cfg.num("hardware", "idlepower").unwrap(), 50.0);
        assert_eq!(cfg.vec("hardware", "power").unwrap().len(), 5);
        let hw = cfg.hardware().unwrap();
        // Power rises 60 W per workload until the cap; demands 280, 340 -> α_f = −1 (as in
        // perf::igniter's fitting test); idle time rises 0.005 ms per workload at full
        // frequency.
        assert!((hw.alpha_f + 1.0).abs() < 1e-9, "{}", hw.alpha_f);
        assert_eq!((hw.pcie_bytes_per_ms, hw.r_unit_pct, hw.max_power_w, hw.max_freq_mhz), (1e7, 2.5, 250.0, 1500.0));
        let p = cfg.workload_profile("m").unwrap();
        assert_eq!(p.samples.len(), 9);
        assert_eq!((p.samples[5].batch, p.samples[5].r_pct, p.samples[5].gpu_latency_ms), (16, 100.0, 2.0));
        assert_eq!(p.cache_samples, vec![(1, 10.0, 2.0), (16, 50.0, 16.0), (32, 100.0, 30.0)]);
        assert_eq!((p.n_kernels, p.solo_idle_ms, p.pair_cache_util), (20.0, 0.03, 16.0));
    }

    #[test]
    fn malformed_or_incomplete_data_is_named() {
        let e = Config::parse("{\"hardware\": {\"unit\": 2.5}}\nnot json").err().unwrap();
        assert!(e.starts_with("line 2:"), "{e}");
        let cfg = Config::parse(&config_text().replace(r#", "kernel": 20"#, "")).unwrap();
        assert_eq!(cfg.workload_profile("m").err().unwrap(), "missing `m.kernel`");
        let cfg = Config::parse(&config_text().replace("[[3.0, 1.0, 0.7], ", "[")).unwrap();
        assert_eq!(cfg.workload_profile("m").err().unwrap(), "`m.gpulatency` is not 3x3");
    }
}
