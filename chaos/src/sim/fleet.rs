//! The cluster's fixed contents: GPU model, instance type, performance profile, services
//! and the agents' nodes (two MIG-capable A100s each), enough for the provisioner to plan.

use serde_json::{json, Value};

pub const TENANT: &str = "acme";
/// The service whose request rate the operator changes during a run (each change makes a
/// new plan), and the rates it moves between.
pub const CHANGING_SERVICE: &str = "web";
pub const RATES: [f64; 4] = [150.0, 300.0, 450.0, 700.0];

pub fn resource(kind: &str, name: &str, tenant: &str, spec: Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

/// Everything but the nodes and the services, in dependency order.
pub fn catalogue() -> Vec<proto::Resource> {
    let mig = json!({"compute_slices": 7, "memory_slices": 8, "profiles": [
        {"name": "1g", "compute_slices": 1, "memory_slices": 1, "starts": [0,1,2,3,4,5,6]},
        {"name": "2g", "compute_slices": 2, "memory_slices": 2, "starts": [0,2,4]},
        {"name": "3g", "compute_slices": 3, "memory_slices": 4, "starts": [0,4]},
        {"name": "4g", "compute_slices": 4, "memory_slices": 4, "starts": [0]},
        {"name": "7g", "compute_slices": 7, "memory_slices": 8, "starts": [0]}]});
    let points = |scale: f64| -> Vec<Value> {
        [(1, 100.0), (2, 210.0), (3, 330.0), (4, 430.0), (7, 760.0)]
            .iter()
            .map(|&(g, tp)| json!({"gpcs": g, "batch": 8, "throughput_rps": tp * scale, "latency_ms": 10}))
            .collect()
    };
    vec![
        resource("Tenant", TENANT, "", json!({})),
        resource("GpuModel", "A100-80GB", "", json!({"sm_count": 108, "memory_gib": 80, "mig": mig})),
        resource("InstanceType", "a2", "", json!({"gpu_model": "A100-80GB", "gpu_count": 2, "price_per_hour": 8, "launch_latency_s": 60})),
        resource("ModelProfile", "resnet50-a100", "", json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": points(1.0)})),
        resource("ModelProfile", "bert-a100", "", json!({"model": "bert", "gpu_model": "A100-80GB", "points": points(0.5)})),
    ]
}

pub fn service(name: &str, model: &str, rate: f64) -> proto::Resource {
    resource("Service", name, TENANT, json!({"model": model, "slo": {"latency_ms": 100, "request_rate": rate}}))
}

pub fn services(web_rate: f64) -> Vec<proto::Resource> {
    vec![service(CHANGING_SERVICE, "resnet50", web_rate), service("search", "bert", 120.0)]
}

/// The Node an agent registers.
pub fn node(name: &str) -> proto::Resource {
    resource(
        "Node",
        name,
        "",
        json!({"address": format!("{name}:7100"), "instance_type": "a2", "gpus": [
            {"uuid": format!("GPU-{name}-0"), "model": "A100-80GB", "mig_enabled": true},
            {"uuid": format!("GPU-{name}-1"), "model": "A100-80GB", "mig_enabled": true}]}),
    )
}
