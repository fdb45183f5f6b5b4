//! What is simulated: the fleet's resources (the manifests `gpuctl apply` takes), the
//! services' traffic, and host failures.

use std::collections::BTreeMap;

use controlplane::provision::offline::state_from_resources;
use controlplane::resources::{InstanceTypeSpec, Kind, Spec};
use controlplane::state::ClusterState;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::traffic::Diurnal;

/// One inference service as the simulation sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct SimService {
    pub name: String,
    pub tenant: String,
    pub model: String,
    pub slo_ms: f64,
    /// The rate its manifest names (the mean of the built-in generator's curve).
    pub base_rps: f64,
    /// GPU models it may run on; empty is any.
    pub allowed_gpu_models: Vec<String>,
}

/// A fleet, its services and what happens to it.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The state the manifests describe (validated as the controllers validate them).
    pub state: ClusterState,
    pub services: Vec<SimService>,
    pub instance_types: BTreeMap<String, InstanceTypeSpec>,
    /// Each service's built-in traffic shape (used when no trace is given).
    pub shapes: BTreeMap<String, Diurnal>,
    /// Host failures: at each of these seconds one host of the GPU model that policy uses
    /// most dies.
    pub failures_at_s: Vec<u32>,
}

impl Scenario {
    /// From manifests (`gpuctl apply`'s format, already parsed): services with a fixed
    /// `request_rate` get a diurnal shape around it (amplitude 0.5, no phase), autoscaling
    /// ones around the middle of their range.
    pub fn from_resources(resources: &[proto::Resource]) -> Result<Scenario, String> {
        let state = state_from_resources(resources)?;
        let mut services = Vec::new();
        let mut shapes = BTreeMap::new();
        for r in state.list(Kind::Service) {
            let Spec::Service(s) = &r.spec else { continue };
            let base = match (&s.slo.autoscaling, s.slo.request_rate) {
                (Some(a), _) => (a.min_rps + a.max_rps) / 2.0,
                (None, Some(rate)) => rate,
                (None, None) => continue,
            };
            services.push(SimService {
                name: r.name.clone(),
                tenant: r.tenant.clone(),
                model: s.model.clone(),
                slo_ms: s.slo.latency_ms,
                base_rps: base,
                allowed_gpu_models: s.allowed_gpu_models.clone(),
            });
            shapes.insert(r.name.clone(), default_shape(base, 0.0));
        }
        let instance_types = controlplane::provision::instance_types(&state);
        Ok(Scenario { state, services, instance_types, shapes, failures_at_s: Vec::new() })
    }

    /// The built-in scenario: the demo's fleet (A100 and H100 with MIG, V100 and T4 with MPS
    /// only; six instance types; profiles from the synthetic performance model) with
    /// `services` services of `tenants` tenants, each with its own day (base rate
    /// log-uniform in 20..400 req/s, swing 0.3..0.7, bursts), all from `seed`. Most tenants
    /// serve the region's own day; one in five is three hours off, one in ten half a day.
    pub fn builtin(services: usize, tenants: usize, seed: u64) -> Result<Scenario, String> {
        const MODELS: [(&str, f64); 4] = [("resnet50", 100.0), ("bert-base", 200.0), ("mobilenet", 60.0), ("inception", 120.0)];
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut resources: Vec<proto::Resource> = devcluster::demo::scenario::resources()
            .into_iter()
            .filter(|r| matches!(r.kind.as_str(), "GpuModel" | "InstanceType" | "ModelProfile"))
            .collect();
        let tenants = tenants.max(1);
        for t in 0..tenants {
            let isolation = if t % 4 == 0 { "mig" } else { "shared" };
            resources.push(resource("Tenant", &format!("tenant-{t:02}"), "", json!({"isolation": isolation})));
        }
        let mut shapes = BTreeMap::new();
        for i in 0..services {
            let (model, slo) = MODELS[rng.random_range(0..MODELS.len())];
            let tenant = format!("tenant-{:02}", i % tenants);
            let name = format!("svc-{i:03}");
            let base = 20.0 * (20.0f64).powf(rng.random::<f64>());
            let phase = match (i % tenants) % 10 {
                0..=6 => 0.0,
                7 | 8 => 0.125,
                _ => 0.5,
            };
            let mut shape = default_shape(base, phase);
            shape.amplitude = rng.random_range(0.3..0.7);
            shapes.insert(name.clone(), shape);
            let spec = json!({"model": model, "slo": {"latency_ms": slo, "request_rate": (base * 100.0).round() / 100.0}});
            resources.push(resource("Service", &name, &tenant, spec));
        }
        let mut scenario = Scenario::from_resources(&resources)?;
        scenario.shapes = shapes;
        Ok(scenario)
    }
}

/// Times of host failures at `per_day` across the fleet (a Poisson process from `seed`),
/// at most `max` of them, within `seconds`.
pub fn failure_times(per_day: f64, seconds: u32, seed: u64, max: usize) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xFA11_0000);
    let mut out = Vec::new();
    let mut t = 0.0f64;
    if per_day <= 0.0 {
        return out;
    }
    while out.len() < max {
        // Exponential gaps with mean 86,400 / per_day seconds.
        t += -(1.0 - rng.random::<f64>()).ln() * 86_400.0 / per_day;
        if t >= f64::from(seconds) {
            break;
        }
        out.push(t as u32);
    }
    out
}

fn default_shape(base_rps: f64, phase: f64) -> Diurnal {
    Diurnal { base_rps, amplitude: 0.5, phase, noise: 0.05, bursts_per_day: 2.0, burst_factor: 1.5, burst_s: 300 }
}

fn resource(kind: &str, name: &str, tenant: &str, spec: serde_json::Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_come_at_the_rate_from_the_seed_and_are_bounded() {
        let week = 7 * 86_400;
        let times = failure_times(10.0, week, 3, 10_000);
        assert_eq!(times, failure_times(10.0, week, 3, 10_000));
        assert!((40..=100).contains(&times.len()), "about 70 in a week, got {}", times.len());
        assert!(times.windows(2).all(|w| w[0] <= w[1]) && times.iter().all(|&t| t < week));
        assert_eq!(failure_times(10.0, week, 3, 5).len(), 5);
        assert!(failure_times(0.0, week, 3, 5).is_empty());
    }
}
