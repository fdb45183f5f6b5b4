//! The synthetic fleet the scale benchmarks use (`fleet-bench`, `provision-bench`): hosts of
//! 8 A100-80GB GPUs and resnet50 Services (SLO 50 ms) of one tenant, over the demo's GPU
//! models, instance types and profiles.

use serde_json::json;

pub const GPUS_PER_NODE: usize = 8;

pub fn node_name(i: usize) -> String {
    format!("host-{i:05}")
}

/// Host `name` as its agent registers it.
pub fn node_resource(name: &str) -> proto::Resource {
    let gpus: Vec<_> =
        (0..GPUS_PER_NODE).map(|g| json!({"uuid": format!("GPU-{name}-{g}"), "model": "A100-80GB", "mig_enabled": true})).collect();
    proto::Resource {
        kind: "Node".into(),
        name: name.into(),
        spec_json: json!({"address": format!("{name}:7000"), "instance_type": "a100-8x", "gpus": gpus}).to_string(),
        ..Default::default()
    }
}

/// Service `i` at `rate` requests a second.
pub fn service(i: usize, rate: f64) -> proto::Resource {
    proto::Resource {
        kind: "Service".into(),
        name: format!("svc-{i:05}"),
        tenant: TENANT.into(),
        spec_json: json!({"model": "resnet50", "slo": {"latency_ms": 50.0, "request_rate": rate}, "allowed_gpu_models": ["A100-80GB"]})
            .to_string(),
        ..Default::default()
    }
}

/// The tenant of every Service.
pub const TENANT: &str = "acme";

/// A second tenant that sets no quota (so has the default one), for the benchmarks'
/// `--hostile N`, and its `n` Services of `rate` req/s of resnet50 each.
pub fn hostile_resources(n: usize, rate: f64) -> Vec<proto::Resource> {
    let tenant = proto::Resource { kind: "Tenant".into(), name: "mallory".into(), spec_json: "{}".into(), ..Default::default() };
    let hog = move |i: usize| proto::Resource {
        kind: "Service".into(),
        name: format!("mallory-{i:05}"),
        tenant: "mallory".into(),
        spec_json: json!({"model": "resnet50", "slo": {"latency_ms": 50.0, "request_rate": rate}}).to_string(),
        ..Default::default()
    };
    std::iter::once(tenant).chain((0..n).map(hog)).collect()
}

/// What the Services and Nodes refer to: the demo's GPU models, instance types and
/// profiles, and the tenant (room for 10,000 Services).
pub fn base_resources() -> Vec<proto::Resource> {
    let mut resources: Vec<proto::Resource> = crate::demo::scenario::resources().into_iter().filter(|r| r.kind != "Service").collect();
    resources.push(proto::Resource {
        kind: "Tenant".into(),
        name: TENANT.into(),
        // The whole fleet: a tenant without max_gpus gets the default quota.
        spec_json: json!({"display_name": "Acme", "max_services": 10_000, "max_gpus": controlplane::resources::limits::MAX_TENANT_GPUS})
            .to_string(),
        ..Default::default()
    });
    resources
}
