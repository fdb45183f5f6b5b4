//! The demo's cluster, as resources: a heterogeneous fleet (A100 and H100 with MIG, V100 and
//! T4 with MPS only), instance types with illustrative prices, profiles generated from the
//! synthetic performance model the simulated GPUs run (`planner::perf::synthetic`; tables
//! for the MIG GPUs, fitted iGniter coefficients for the others), three tenants and their
//! services. Pure: the same scenario every run.

use planner::perf::synthetic::{example_models, gpu_speed, igniter_hardware, igniter_workload, ModelShape};
use serde_json::{json, Value};

/// A node the demo starts with: its name, instance type, and GPU models.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoNode {
    pub name: &'static str,
    pub instance_type: &'static str,
    pub gpus: Vec<&'static str>,
}

/// A service of the demo and the rate its load generator sends at first.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoService {
    pub name: &'static str,
    pub tenant: &'static str,
    pub model: &'static str,
    pub slo_ms: f64,
    pub rate_rps: f64,
    /// `Some((min, max))`: the autoscaler sizes it within this range instead of `rate_rps`.
    pub autoscaling: Option<(f64, f64)>,
    pub allowed_gpu_models: &'static [&'static str],
}

/// GPU models with MIG, then without.
pub const MIG_GPUS: [&str; 2] = ["A100-80GB", "H100-80GB"];
pub const MPS_GPUS: [&str; 2] = ["V100-16GB", "T4-16GB"];

/// The models the demo's services run.
const MODELS: [&str; 4] = ["resnet50", "bert-base", "mobilenet", "inception"];

/// (name, GPU model, GPUs, price per hour, launch latency s). Prices are in the range of
/// public on-demand list prices, rounded; not quotes.
pub const INSTANCE_TYPES: [(&str, &str, u32, f64, f64); 6] = [
    ("a100-1x", "A100-80GB", 1, 3.67, 120.0),
    ("a100-8x", "A100-80GB", 8, 40.96, 180.0),
    ("h100-1x", "H100-80GB", 1, 6.98, 150.0),
    ("v100-1x", "V100-16GB", 1, 3.06, 90.0),
    ("t4-1x", "T4-16GB", 1, 0.53, 60.0),
    ("t4-4x", "T4-16GB", 4, 3.91, 90.0),
];

/// The fleet the demo starts: two single-A100 hosts (one is the spare a failed node's
/// services move to), an H100, a V100 and a T4 host.
pub fn fleet() -> Vec<DemoNode> {
    vec![
        DemoNode { name: "a100-host-1", instance_type: "a100-1x", gpus: vec!["A100-80GB"] },
        DemoNode { name: "a100-host-2", instance_type: "a100-1x", gpus: vec!["A100-80GB"] },
        DemoNode { name: "h100-host-1", instance_type: "h100-1x", gpus: vec!["H100-80GB"] },
        DemoNode { name: "v100-host-1", instance_type: "v100-1x", gpus: vec!["V100-16GB"] },
        DemoNode { name: "t4-host-1", instance_type: "t4-1x", gpus: vec!["T4-16GB"] },
    ]
}

/// The sample multi-tenant workload.
pub fn services() -> Vec<DemoService> {
    let s = |name, tenant, model, slo_ms, rate_rps| DemoService {
        name,
        tenant,
        model,
        slo_ms,
        rate_rps,
        autoscaling: None,
        allowed_gpu_models: &[],
    };
    vec![
        s("image-classify", "acme", "resnet50", 80.0, 160.0),
        s("text-embed", "acme", "bert-base", 150.0, 60.0),
        s("thumbnails", "globex", "mobilenet", 150.0, 40.0),
        // Globex runs its ranking on cheap T4s only: a load step needs more T4 hosts. (A
        // single BERT request takes ~90 ms on a simulated T4 at any share, so the SLO leaves
        // room for a batch to wait behind another.)
        DemoService {
            autoscaling: Some((30.0, 400.0)),
            allowed_gpu_models: &["T4-16GB"],
            ..s("search-rank", "globex", "bert-base", 300.0, 30.0)
        },
        DemoService { allowed_gpu_models: &["H100-80GB"], ..s("vision-h100", "initech", "inception", 60.0, 120.0) },
        DemoService { allowed_gpu_models: &["V100-16GB"], ..s("legacy-ocr", "initech", "resnet50", 250.0, 20.0) },
    ]
}

/// The service whose load the demo raises to show autoscaling.
pub const AUTOSCALED_SERVICE: &str = "search-rank";

fn resource(kind: &str, name: &str, tenant: &str, spec: Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

fn mig_capability() -> Value {
    json!({"compute_slices": 7, "memory_slices": 8, "profiles": [
        {"name": "1g", "compute_slices": 1, "memory_slices": 1, "starts": [0, 1, 2, 3, 4, 5, 6]},
        {"name": "1g.2m", "compute_slices": 1, "memory_slices": 2, "starts": [0, 2, 4, 6]},
        {"name": "2g", "compute_slices": 2, "memory_slices": 2, "starts": [0, 2, 4]},
        {"name": "3g", "compute_slices": 3, "memory_slices": 4, "starts": [0, 4]},
        {"name": "4g", "compute_slices": 4, "memory_slices": 4, "starts": [0]},
        {"name": "7g", "compute_slices": 7, "memory_slices": 8, "starts": [0]}
    ]})
}

fn shape(model: &str) -> ModelShape {
    example_models().into_iter().find(|m| m.name == model).expect("the demo uses the example models")
}

fn speed(gpu: &str) -> f64 {
    gpu_speed(gpu).expect("the demo's GPUs have synthetic speeds")
}

/// ParvaGPU-style table rows of `model` on a MIG GPU (up to 5 processes per instance, as the
/// planner's ParvaGPU uses).
fn table_points(model: &str, gpu: &str) -> Vec<Value> {
    shape(model)
        .table_at_speed(5, speed(gpu))
        .points
        .iter()
        .map(|p| {
            json!({"gpcs": p.gpcs, "batch": p.batch, "processes": p.processes,
                   "throughput_rps": (p.throughput_per_process * 1000.0).round() / 1000.0,
                   "latency_ms": (p.latency_s * 1e6).round() / 1000.0})
        })
        .collect()
}

/// Every resource of the demo, in an order `apply` accepts (references first).
pub fn resources() -> Vec<proto::Resource> {
    let mut out = vec![
        // Acme shares GPUs only through MIG instances; the other two may share MPS servers.
        resource("Tenant", "acme", "", json!({"display_name": "Acme Corp", "weight": 2, "isolation": "mig"})),
        resource("Tenant", "globex", "", json!({"display_name": "Globex", "isolation": "shared"})),
        resource("Tenant", "initech", "", json!({"display_name": "Initech", "isolation": "shared"})),
    ];
    for gpu in MIG_GPUS {
        out.push(resource("GpuModel", gpu, "", json!({"sm_count": 108, "memory_gib": 80, "mig": mig_capability()})));
    }
    let hw = igniter_hardware();
    for gpu in MPS_GPUS {
        out.push(resource(
            "GpuModel",
            gpu,
            "",
            json!({"sm_count": 80, "memory_gib": 16, "idle_power_w": hw.idle_power_w, "max_power_w": hw.max_power_w,
                   "max_frequency_mhz": hw.max_freq_mhz, "pcie_gbps": hw.pcie_bytes_per_ms / 1e6,
                   "igniter": {"alpha_f": hw.alpha_f, "alpha_sch": hw.alpha_sch, "beta_sch": hw.beta_sch,
                               "r_unit_pct": hw.r_unit_pct, "r_max_pct": hw.r_max_pct}}),
        ));
    }
    for (name, gpu, count, price, launch) in INSTANCE_TYPES {
        out.push(resource(
            "InstanceType",
            name,
            "",
            json!({"gpu_model": gpu, "gpu_count": count, "price_per_hour": price, "launch_latency_s": launch}),
        ));
    }
    for model in MODELS {
        for gpu in MIG_GPUS {
            let name = format!("{model}-{}", gpu.to_lowercase());
            out.push(resource("ModelProfile", &name, "", json!({"model": model, "gpu_model": gpu, "points": table_points(model, gpu)})));
        }
        for gpu in MPS_GPUS {
            let name = format!("{model}-{}", gpu.to_lowercase());
            let coeffs = igniter_workload(&shape(model), speed(gpu));
            out.push(resource("ModelProfile", &name, "", json!({"model": model, "gpu_model": gpu, "igniter": coeffs})));
        }
    }
    for s in services() {
        let slo = match s.autoscaling {
            Some((min, max)) => json!({"latency_ms": s.slo_ms, "autoscaling": {"min_rps": min, "max_rps": max}}),
            None => json!({"latency_ms": s.slo_ms, "request_rate": s.rate_rps}),
        };
        out.push(resource("Service", s.name, s.tenant, json!({"model": s.model, "slo": slo, "allowed_gpu_models": s.allowed_gpu_models})));
    }
    out
}

/// The scenario as one YAML manifest (`gpuctl demo --print-manifest`).
pub fn manifest_yaml() -> String {
    let docs: Vec<String> = resources()
        .iter()
        .map(|r| {
            let spec: Value = serde_json::from_str(&r.spec_json).expect("generated JSON");
            let mut doc = serde_json::Map::new();
            doc.insert("kind".into(), r.kind.clone().into());
            doc.insert("name".into(), r.name.clone().into());
            if !r.tenant.is_empty() {
                doc.insert("tenant".into(), r.tenant.clone().into());
            }
            doc.insert("spec".into(), spec);
            serde_yaml_ng::to_string(&Value::Object(doc)).expect("YAML of JSON")
        })
        .collect();
    format!("# gpuctl demo's scenario (generated; profiles from planner::perf::synthetic).\n{}", docs.join("---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use controlplane::provision::offline::{plan_offline, state_from_resources};
    use controlplane::provision::MigStrategy;

    #[test]
    fn the_scenario_applies_and_every_service_is_planned_on_the_fleet_with_a_spare_a100() {
        let state = state_from_resources(&resources()).expect("the demo's resources are valid");
        for strategy in [MigStrategy::Parvagpu, MigStrategy::ExactMig] {
            let (plan, _) = plan_offline(&state, strategy);
            assert!(plan.infeasible.is_empty(), "{strategy:?}: {:?}", plan.infeasible);
            let count = |gpu: &str| plan.gpus.iter().filter(|g| g.gpu_type == gpu).count();
            let have = |gpu: &str| fleet().iter().flat_map(|n| n.gpus.iter()).filter(|g| **g == gpu).count();
            // One A100 host can fail and its services still fit on the other.
            assert!(count("A100-80GB") < have("A100-80GB"), "{strategy:?}: {} A100s planned", count("A100-80GB"));
            for gpu in ["H100-80GB", "V100-16GB", "T4-16GB"] {
                assert!(count(gpu) <= have(gpu), "{strategy:?}: {} {gpu} planned, {} in the fleet", count(gpu), have(gpu));
            }
            // Every kind of GPU serves something: the demo shows a heterogeneous fleet.
            for gpu in MIG_GPUS.iter().chain(&MPS_GPUS) {
                assert!(count(gpu) >= 1, "{strategy:?}: nothing on {gpu}");
            }
        }
    }

    #[test]
    fn the_manifest_round_trips_through_the_parser() {
        let parsed = controlplane::manifest::parse("demo.yaml", &manifest_yaml(), controlplane::manifest::Format::Yaml).unwrap();
        assert_eq!(parsed.len(), resources().len());
        assert!(state_from_resources(&parsed).is_ok());
    }
}
