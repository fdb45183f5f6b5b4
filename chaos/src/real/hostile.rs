//! The `hostile` scenario's attacks: a tenant, an operator and a compromised node send what
//! the hostile-input issue found (sizes that reach allocations, inputs that break the
//! planner's arithmetic, super-linear lists, limits to exceed, reports for what is not the
//! node's) while clients write. Each attempt must be refused with the expected code and
//! field; afterwards the other tenant's service must still be planned and routed only to
//! the real agents, the valid-but-hostile service refused by name, and every controller up.

use std::time::{Duration, Instant};

use controlplane::client::Client;
use serde_json::{json, Value};
use tonic::Code;

use super::cluster::{Cluster, HOSTILE_TENANT};

/// One attack and what became of it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attempt {
    /// `tenant`, `operator` or `node`.
    pub who: &'static str,
    pub what: &'static str,
    pub expected: String,
    pub got: String,
}

impl Attempt {
    pub fn refused_as_expected(&self) -> bool {
        self.expected == self.got
    }
}

fn resource(kind: &str, name: &str, tenant: &str, spec: Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

fn service(name: &str, model: &str, rate: f64, extra: Value) -> proto::Resource {
    let mut spec = json!({"model": model, "slo": {"latency_ms": 100, "request_rate": rate}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    resource("Service", name, HOSTILE_TENANT, spec)
}

/// `code field` of a refusal, or `accepted`.
fn outcome<T>(result: Result<T, tonic::Status>) -> String {
    match result {
        Ok(_) => "accepted".into(),
        Err(e) => {
            let field = e.metadata().get(proto::meta::FIELD).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            format!("{:?} {field}", e.code())
        }
    }
}

fn expected(code: Code, field: &str) -> String {
    format!("{code:?} {field}")
}

/// The service a provisioning pass cannot size (valid, yet 10^7 req/s at 0.01 req/s each).
pub const HOG: &str = "mallory-hog";

/// The admin's set-up: the hostile tenant (at most 3 services) and the slow model's profile.
pub async fn prepare(admin: &Client) -> Result<(), String> {
    let tenant = resource("Tenant", HOSTILE_TENANT, "", json!({"max_services": 3}));
    let slow = resource(
        "ModelProfile",
        "slowmodel-a100",
        "",
        json!({"model": "slowmodel", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 1, "throughput_rps": 0.01, "latency_ms": 10}]}),
    );
    for r in [tenant, slow] {
        admin.put(r, proto::WriteMode::Unspecified).await.map_err(|e| format!("hostile set-up: {e}"))?;
    }
    Ok(())
}

/// Sends every attack once; the attempts with their outcomes. `victim` is a service of
/// another tenant that the plan places on agent `node_index` (named `node`).
pub async fn attack(
    cluster: &Cluster,
    admin: &Client,
    node_index: u8,
    node: &str,
    other_node: &str,
    victim: &str,
) -> Result<Vec<Attempt>, String> {
    let tenant = cluster.tenant_client()?;
    let compromised = cluster.node_client(node_index)?;
    let mut out = Vec::new();
    let mut record = |who, what, expected: String, got: String| out.push(Attempt { who, what, expected, got });

    // The tenant.
    let bomb =
        json!({"strategy": "paris", "batch_distribution": {"type": "log-normal", "mu": 1.0, "sigma": 0.5, "max_batch": 4_000_000_000u32}});
    let got = outcome(tenant.put(service("mallory-bomb", "resnet50", 10.0, bomb), proto::WriteMode::Create).await);
    record("tenant", "PARIS max_batch in the billions", expected(Code::InvalidArgument, "spec.batch_distribution.max_batch"), got);
    let dupes = json!({"allowed_gpu_models": vec!["A100-80GB"; 180_000]});
    let got = outcome(tenant.put(service("mallory-dupes", "resnet50", 10.0, dupes), proto::WriteMode::Create).await);
    record("tenant", "allowed_gpu_models repeated 180,000 times", expected(Code::InvalidArgument, "spec.allowed_gpu_models"), got);
    let got = outcome(tenant.put(service("mallory-rate", "resnet50", 1e300, json!({})), proto::WriteMode::Create).await);
    record("tenant", "a request rate of 1e300", expected(Code::InvalidArgument, "spec.slo.request_rate"), got);
    let profile = resource(
        "ModelProfile",
        "mallory-profile",
        "",
        json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 1, "throughput_rps": 1e7, "latency_ms": 1}]}),
    );
    let got = outcome(tenant.put(profile, proto::WriteMode::Create).await);
    record("tenant", "a tenant writing the catalogue", expected(Code::PermissionDenied, "kind"), got);
    let got = outcome(tenant.put(service(HOG, "slowmodel", 10_000_000.0, json!({})), proto::WriteMode::Create).await);
    record("tenant", "a valid service no plan can size (admitted, then refused by name)", "accepted".into(), got);
    // Another tenant's names are that tenant's: the victim's tenant is acme.
    for name in ["acme-web", "Acme-Web", "acrne-web", "AcmE.web"] {
        let got = outcome(tenant.put(service(name, "resnet50", 5.0, json!({})), proto::WriteMode::Create).await);
        record("tenant", "another tenant's service name, or a look-alike of it", expected(Code::InvalidArgument, "name"), got);
    }
    let long_id = "r".repeat(10_000);
    let got = outcome(tenant.put_with_id(service("mallory-id", "resnet50", 5.0, json!({})), proto::WriteMode::Create, &long_id).await);
    record("tenant", "a request id of 10 KB (every controller remembers ids)", expected(Code::InvalidArgument, "request_id"), got);
    for name in ["mallory-2", "mallory-3"] {
        let got = outcome(tenant.put(service(name, "resnet50", 5.0, json!({})), proto::WriteMode::Create).await);
        record("tenant", "services within max_services", "accepted".into(), got);
    }
    let got = outcome(tenant.put(service("mallory-4", "resnet50", 5.0, json!({})), proto::WriteMode::Create).await);
    record("tenant", "a service over max_services (3)", expected(Code::ResourceExhausted, "tenant"), got);

    // The operator (an admin certificate, still bound by the limits).
    let zero = resource(
        "ModelProfile",
        "zero-throughput",
        "",
        json!({"model": "m-zero", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 1, "throughput_rps": 0, "latency_ms": 5}]}),
    );
    let got = outcome(admin.put(zero, proto::WriteMode::Create).await);
    record("operator", "a profile point with zero throughput", expected(Code::InvalidArgument, "spec.points[0].throughput_rps"), got);
    let second = resource(
        "ModelProfile",
        "resnet50-again",
        "",
        json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 8, "throughput_rps": 9000, "latency_ms": 1}]}),
    );
    let got = outcome(admin.put(second, proto::WriteMode::Create).await);
    record("operator", "a second profile of (resnet50, A100-80GB)", expected(Code::AlreadyExists, "spec.model"), got);

    // The compromised node.
    let metrics = |service: &str, endpoint: &str, p99: f64| proto::ServiceMetrics {
        service: service.into(),
        p99_ms: p99,
        throughput_rps: 10.0,
        arrival_rps: 10.0,
        failed: 0,
        endpoint: endpoint.into(),
        ..Default::default()
    };
    // It claims to run its current desired state: a lagging agent's windows of services
    // moved away are dropped rather than refused (see controlplane's report_check).
    let current = match compromised.report(proto::ReportRequest { node: node.into(), ..Default::default() }).await {
        Ok(r) => r.desired_version,
        Err(e) => return Err(format!("the compromised node's first report failed: {e}")),
    };
    let report = |node: &str, m: Vec<proto::ServiceMetrics>| proto::ReportRequest {
        node: node.into(),
        applied_version: current,
        metrics: m,
        ..Default::default()
    };
    let got = outcome(compromised.report(report(node, vec![metrics(HOG, "", 1.0)])).await);
    record("node", "metrics for a service not placed on it", expected(Code::PermissionDenied, "metrics[0].service"), got);
    let got = outcome(compromised.report(report(node, vec![metrics(victim, "10.66.66.66:443", 1.0)])).await);
    record("node", "the victim's endpoint on another host (hijack)", expected(Code::PermissionDenied, "metrics[0].endpoint"), got);
    let got = outcome(compromised.report(report(node, vec![metrics(victim, "", f64::NAN)])).await);
    record("node", "a NaN p99", expected(Code::InvalidArgument, "metrics[0].p99_ms"), got);
    let got = outcome(compromised.report(report(other_node, vec![])).await);
    record("node", "a report as another node", expected(Code::PermissionDenied, "node"), got);
    let forged = metrics("x\"} 1\ngpuplane_raft_is_leader{a=\"", "", 1.0);
    let got = outcome(compromised.report(report(node, vec![forged])).await);
    record("node", "a service name that would forge a metric series", expected(Code::InvalidArgument, "metrics[0].service"), got);

    // The compromised node re-registering its own Node: with another node's GPU, at another
    // host's address, or with more GPUs than its instance type has.
    let spec_of = |r: proto::Resource| serde_json::from_str::<Value>(&r.spec_json).map_err(|e| format!("a Node's spec: {e}"));
    let own = spec_of(admin.get("Node", node, false).await.map_err(|e| format!("reading Node {node}: {e}"))?)?;
    let theirs = spec_of(admin.get("Node", other_node, false).await.map_err(|e| format!("reading Node {other_node}: {e}"))?)?;
    let register = |spec: Value| resource("Node", node, "", spec);
    let mut stolen = own.clone();
    if let (Some(gpus), Some(victim_gpu)) = (stolen["gpus"].as_array_mut(), theirs["gpus"].get(0).cloned()) {
        gpus.push(victim_gpu);
    }
    let claimed = stolen["gpus"].as_array().map_or(0, Vec::len).saturating_sub(1);
    let got = outcome(compromised.put(register(stolen), proto::WriteMode::Unspecified).await);
    record("node", "another node's GPU uuid in its own Node", expected(Code::AlreadyExists, &format!("spec.gpus[{claimed}].uuid")), got);
    let mut moved = own.clone();
    moved["address"] = json!("10.66.66.66:7000");
    let got = outcome(compromised.put(register(moved), proto::WriteMode::Unspecified).await);
    record("node", "its address moved to another host", expected(Code::FailedPrecondition, "spec.address"), got);
    let mut many = own;
    many["gpus"] = (0..64).map(|g| json!({"uuid": format!("GPU-fake-{g}"), "model": "A100-80GB", "mig_enabled": true})).collect();
    let got = outcome(compromised.put(register(many), proto::WriteMode::Unspecified).await);
    record("node", "64 GPUs on a 1-GPU instance type", expected(Code::InvalidArgument, "spec.gpus"), got);
    Ok(out)
}

/// The default quota of a tenant without `max_gpus` (the hostile tenant has none).
const DEFAULT_QUOTA_GPUS: f64 = controlplane::resources::limits::DEFAULT_TENANT_MAX_GPUS;

/// The tenant fills its quota with the hardest services it may create: its two services
/// within `max_services` are changed to rates whose least need (the rate over the best
/// throughput per GPU of any resnet50 profile point, the planning budget's bound) takes
/// 45% of the default quota each, so the planner sizes them in full (on a fleet of two GPUs,
/// infeasible after a whole pass) every pass. Their names.
pub async fn fill_quota(cluster: &Cluster, admin: &Client) -> Result<Vec<String>, String> {
    let profile = admin.get("ModelProfile", "resnet50-a100-80gb", false).await.map_err(|e| format!("reading resnet50's profile: {e}"))?;
    let spec: Value = serde_json::from_str(&profile.spec_json).map_err(|e| format!("resnet50's profile: {e}"))?;
    let per_gpu = spec["points"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let gpcs = p["gpcs"].as_f64().unwrap_or(0.0);
            let segment = p["throughput_rps"].as_f64().unwrap_or(0.0) * p["processes"].as_f64().unwrap_or(1.0);
            segment * if gpcs == 0.0 { 1.0 } else { 7.0 / gpcs.min(7.0) }
        })
        .fold(0.0, f64::max);
    if per_gpu <= 0.0 {
        return Err("resnet50's profile has no point with throughput".into());
    }
    let tenant = cluster.tenant_client()?;
    let names = vec!["mallory-2".to_string(), "mallory-3".to_string()];
    for name in &names {
        let rate = (0.45 * DEFAULT_QUOTA_GPUS * per_gpu).floor();
        tenant
            .put(service(name, "resnet50", rate, json!({})), proto::WriteMode::Unspecified)
            .await
            .map_err(|e| format!("the tenant filling its quota ({name} at {rate} req/s): {e}"))?;
    }
    Ok(names)
}

/// After the attacks: the hog refused by name, the victim still planned and routed only to
/// the real agents' hosts (`agent_hosts`), every controller answering. Problems, if any.
pub async fn check_aftermath(cluster: &Cluster, admin: &Client, victim: &str, agent_hosts: &[String], within: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    let started = Instant::now();
    let plan = loop {
        let planned = admin.list("Plan", "", false).await.ok().and_then(|l| devcluster::demo::show::plan_of(&l.resources)).map(|(p, _)| p);
        if let Some(plan) = planned.filter(|p| p.services.iter().any(|s| s.service == HOG)) {
            break Some(plan);
        }
        if started.elapsed() > within {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    match plan {
        None => problems.push(format!("no plan named {HOG} within {within:?}")),
        Some(plan) => {
            let reason = |s: &str| plan.services.iter().find(|p| p.service == s).map(|p| p.infeasible_reason.clone());
            // Its least need is past the tenant's quota (the default): refused before any
            // strategy plans it.
            match reason(HOG) {
                Some(Some(r)) if r.contains("over quota") && r.contains("refused before planning") => {}
                other => problems.push(format!("{HOG} should be refused over quota before planning, the plan says {other:?}")),
            }
            if reason(victim) != Some(None) {
                problems.push(format!("{victim} is no longer planned: {:?}", reason(victim)));
            }
        }
    }
    match admin.list("Node", "", false).await {
        Ok(nodes) => {
            for (service, node, endpoint) in controlplane::agents::endpoints::service_endpoints(&nodes.resources) {
                let host = endpoint.rsplit_once(':').map_or("", |(h, _)| h);
                if !agent_hosts.iter().any(|h| h == host) {
                    problems.push(format!("{service} is routed to {endpoint} (node {node}), not an agent's host"));
                }
            }
        }
        Err(e) => problems.push(format!("listing nodes after the attacks: {e}")),
    }
    for addr in cluster.servers() {
        if let Err(e) = admin.node_status(&addr).await {
            problems.push(format!("controller {addr} does not answer after the attacks: {e}"));
        }
    }
    problems
}
