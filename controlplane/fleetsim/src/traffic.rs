//! Offered load per service and second: a built-in diurnal generator (seeded) or a CSV trace.
//!
//! The generator: `rate(t) = base · (1 + amplitude · sin(2π (t / 86,400 − phase))) · noise(t)
//! · burst(t)`, where the noise is a mean-reverting random walk updated each minute (±5%
//! typical), and a burst multiplies the rate for its duration (a few per service and day).
//! A trace is `time_s,service,rate_rps` lines: a rate holds until the service's next line.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The shape of one service's day.
#[derive(Clone, Debug, PartialEq)]
pub struct Diurnal {
    pub base_rps: f64,
    /// Peak-to-mean swing, 0..1.
    pub amplitude: f64,
    /// Fraction of a day by which the curve is shifted (tenants in other time zones).
    pub phase: f64,
    /// Relative size of the minute-to-minute noise.
    pub noise: f64,
    /// Bursts per day (Poisson), each `burst_factor` times the rate for `burst_s`.
    pub bursts_per_day: f64,
    pub burst_factor: f64,
    pub burst_s: u32,
}

/// Rates per service, one value per simulated second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Traffic {
    pub seconds: u32,
    pub rates: BTreeMap<String, Vec<f64>>,
}

impl Traffic {
    /// Every service's rate over `seconds`, from `seed` (the same seed gives the same rates).
    pub fn generate(shapes: &BTreeMap<String, Diurnal>, seconds: u32, seed: u64) -> Traffic {
        let mut rates = BTreeMap::new();
        for (i, (name, d)) in shapes.iter().enumerate() {
            let mut rng = SmallRng::seed_from_u64(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let bursts: Vec<u32> = (0..poisson(&mut rng, d.bursts_per_day * f64::from(seconds) / 86_400.0))
                .map(|_| rng.random_range(0..seconds.max(1)))
                .collect();
            let mut walk = 0.0f64;
            let mut out = Vec::with_capacity(seconds as usize);
            for t in 0..seconds {
                if t % 60 == 0 {
                    // Mean-reverting: the noise wanders but stays near 1.
                    walk = 0.8 * walk + d.noise * (rng.random::<f64>() * 2.0 - 1.0);
                }
                let day = f64::from(t) / 86_400.0 - d.phase;
                let diurnal = 1.0 + d.amplitude * (std::f64::consts::TAU * day).sin();
                let burst = if bursts.iter().any(|&b| t >= b && t < b.saturating_add(d.burst_s)) { d.burst_factor } else { 1.0 };
                out.push((d.base_rps * diurnal * (1.0 + walk) * burst).max(0.0));
            }
            rates.insert(name.clone(), out);
        }
        Traffic { seconds, rates }
    }

    /// A trace: `time_s,service,rate_rps` lines (a header line and `#` comments are
    /// skipped), over `seconds`. A service's rate holds from its line until its next one,
    /// and is 0 before its first. Every service named must be one of `known` (the
    /// scenario's), which bounds what the trace can make the simulator hold.
    pub fn from_csv(text: &str, seconds: u32, known: &BTreeSet<String>) -> Result<Traffic, String> {
        let mut points: BTreeMap<String, Vec<(u32, f64)>> = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || (n == 0 && line.starts_with("time")) {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [t, service, rate] = fields[..] else {
                return Err(format!("trace line {}: expected time_s,service,rate_rps, got {line:?}", n + 1));
            };
            let t: u32 = t.parse().map_err(|e| format!("trace line {}: time_s {t:?}: {e}", n + 1))?;
            let rate: f64 = rate.parse().map_err(|e| format!("trace line {}: rate_rps {rate:?}: {e}", n + 1))?;
            if !(rate.is_finite() && rate >= 0.0) {
                return Err(format!("trace line {}: rate_rps must be a finite number >= 0, got {rate}", n + 1));
            }
            if !known.contains(service) {
                return Err(format!("trace line {}: service {service:?} is not in the scenario", n + 1));
            }
            points.entry(service.to_string()).or_default().push((t, rate));
        }
        let mut rates = BTreeMap::new();
        for (service, mut pts) in points {
            pts.sort_by_key(|p| p.0);
            let mut out = vec![0.0; seconds as usize];
            for (i, &(t, rate)) in pts.iter().enumerate() {
                let end = pts.get(i + 1).map_or(seconds, |p| p.0.min(seconds));
                for slot in out.iter_mut().take(end as usize).skip(t as usize) {
                    *slot = rate;
                }
            }
            rates.insert(service, out);
        }
        Ok(Traffic { seconds, rates })
    }

    /// A service's highest rate.
    pub fn peak(&self, service: &str) -> f64 {
        self.rates.get(service).map_or(0.0, |r| r.iter().copied().fold(0.0, f64::max))
    }
}

/// A Poisson draw by inversion (small means only).
fn poisson(rng: &mut SmallRng, mean: f64) -> u32 {
    let (limit, mut product, mut k) = ((-mean).exp(), rng.random::<f64>(), 0);
    while product > limit && k < 1000 {
        product *= rng.random::<f64>();
        k += 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Diurnal {
        Diurnal { base_rps: 100.0, amplitude: 0.5, phase: 0.0, noise: 0.05, bursts_per_day: 4.0, burst_factor: 2.0, burst_s: 300 }
    }

    #[test]
    fn the_same_seed_gives_the_same_day_and_the_curve_follows_the_sun() {
        let shapes: BTreeMap<String, Diurnal> = [("a".to_string(), shape())].into();
        let one = Traffic::generate(&shapes, 86_400, 7);
        assert_eq!(one, Traffic::generate(&shapes, 86_400, 7));
        assert_ne!(one, Traffic::generate(&shapes, 86_400, 8));
        let r = &one.rates["a"];
        // A quarter day in: the sine's top; three quarters: its bottom.
        assert!(r[21_600] > 1.2 * 100.0 && r[64_800] < 0.8 * 100.0, "{} {}", r[21_600], r[64_800]);
    }

    #[test]
    fn a_trace_holds_each_rate_until_the_next_line() {
        let known: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        let t = Traffic::from_csv("time_s,service,rate_rps\n0,a,10\n5,a,20\n2,b,1\n", 8, &known).unwrap();
        assert_eq!(t.rates["a"], vec![10.0, 10.0, 10.0, 10.0, 10.0, 20.0, 20.0, 20.0]);
        assert_eq!(t.rates["b"], vec![0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(Traffic::from_csv("0,a,-1\n", 8, &known).unwrap_err().contains("line 1"));
        assert!(Traffic::from_csv("0,a\n", 8, &known).unwrap_err().contains("expected"));
        assert!(Traffic::from_csv("0,c,1\n", 8, &known).unwrap_err().contains("\"c\" is not in the scenario"));
    }
}
