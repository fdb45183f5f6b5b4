//! Hostile tenants, operators and nodes (the classes of the hostile-input issue): what they
//! send is refused at the door with the code and the field, commits nothing, and leaves
//! every controller up and planning the other tenants' services.

mod common;

use std::time::{Duration, Instant};

use common::*;
use controlplane::loops::LoopSettings;
use proto::WriteMode;
use serde_json::{json, Value};
use tonic::Code;

/// Two tenants, an A100 node with two GPUs, resnet50 profiled normally and `slowmodel`
/// profiled (validly) at the slowest throughput the bounds allow.
fn fleet() -> Vec<proto::Resource> {
    let points: Vec<Value> = [(1, 100.0), (2, 210.0), (3, 330.0), (4, 430.0), (7, 760.0)]
        .iter()
        .map(|&(g, tp)| json!({"gpcs": g, "batch": 8, "throughput_rps": tp, "latency_ms": 10, "utilisation": 0.5}))
        .collect();
    vec![
        resource("Tenant", "acme", "", json!({})),
        resource("Tenant", "mallory", "", json!({"max_services": 3})),
        resource("GpuModel", "A100-80GB", "", json!({"sm_count": 108, "memory_gib": 80, "mig": a100_mig()})),
        resource("InstanceType", "a2", "", json!({"gpu_model": "A100-80GB", "gpu_count": 2, "price_per_hour": 8, "launch_latency_s": 60})),
        resource("ModelProfile", "resnet50-a100", "", json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": points})),
        resource(
            "ModelProfile",
            "slowmodel-a100",
            "",
            json!({"model": "slowmodel", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 1, "throughput_rps": 0.01, "latency_ms": 10}]}),
        ),
        resource(
            "Node",
            "n1",
            "",
            json!({"address": "n1:7100", "instance_type": "a2", "gpus": [
            {"uuid": "GPU-a", "model": "A100-80GB", "mig_enabled": true}, {"uuid": "GPU-b", "model": "A100-80GB", "mig_enabled": true}]}),
        ),
    ]
}

fn svc(tenant: &str, name: &str, model: &str, rate: f64, extra: Value) -> proto::Resource {
    let mut spec = json!({"model": model, "slo": {"latency_ms": 100, "request_rate": rate}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    resource("Service", name, tenant, spec)
}

fn field_of(err: &tonic::Status) -> String {
    err.metadata().get(proto::meta::FIELD).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

/// The committed plan once `ok` accepts it (waits up to 30 s).
async fn plan_where(client: &controlplane::client::Client, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = Value::Null;
    loop {
        if let Ok(r) = client.get("Plan", "current", false).await {
            last = serde_json::from_str(&r.spec_json).unwrap();
            if ok(&last) {
                return last;
            }
        }
        assert!(Instant::now() < deadline, "no plan as expected in time; the last: {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn prediction<'a>(plan: &'a Value, service: &str) -> Option<&'a Value> {
    plan["services"].as_array()?.iter().find(|s| s["service"] == service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_manifests_are_refused_at_the_door_and_commit_nothing() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    for r in fleet() {
        client.put(r, WriteMode::Unspecified).await.unwrap();
    }
    let allowed_180k: Vec<&str> = vec!["A100-80GB"; 180_000];
    let many_gpus: Vec<Value> = (0..65).map(|i| json!({"uuid": format!("GPU-{i}"), "model": "A100-80GB"})).collect();
    let many_labels: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases: Vec<(&str, proto::Resource, Code, &str)> = vec![
        // Class 1: sizes that reach allocations.
        (
            "PARIS max_batch in the billions",
            svc(
                "mallory",
                "paris-bomb",
                "resnet50",
                10.0,
                json!({"strategy": "paris", "batch_distribution": {"type": "log-normal", "mu": 1.0, "sigma": 0.5, "max_batch": 4_000_000_000u32}}),
            ),
            Code::InvalidArgument,
            "spec.batch_distribution.max_batch",
        ),
        (
            "a Node with more GPUs than any server",
            resource("Node", "n9", "", json!({"address": "n9:1", "instance_type": "a2", "gpus": many_gpus})),
            Code::InvalidArgument,
            "spec.gpus",
        ),
        (
            "a Node with too many labels",
            resource("Node", "n9", "", json!({"address": "n9:1", "instance_type": "a2", "labels": many_labels})),
            Code::InvalidArgument,
            "spec.labels",
        ),
        (
            "a Node with a huge label value",
            resource("Node", "n9", "", json!({"address": "n9:1", "instance_type": "a2", "labels": {"k": "v".repeat(100_000)}})),
            Code::InvalidArgument,
            "spec.labels.k",
        ),
        // Class 2: planner inputs that break the arithmetic.
        (
            "a profile point with zero throughput",
            resource(
                "ModelProfile",
                "zero-tp",
                "",
                json!({"model": "m2", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 1, "throughput_rps": 0, "latency_ms": 5}]}),
            ),
            Code::InvalidArgument,
            "spec.points[0].throughput_rps",
        ),
        (
            "a profile point with a batch beyond the bound",
            resource(
                "ModelProfile",
                "big-batch",
                "",
                json!({"model": "m2", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 1_000_000, "throughput_rps": 5, "latency_ms": 5}]}),
            ),
            Code::InvalidArgument,
            "spec.points[0].batch",
        ),
        (
            "a MIG size no GPU has",
            resource(
                "ModelProfile",
                "gpcs-5",
                "",
                json!({"model": "m2", "gpu_model": "A100-80GB", "points": [{"gpcs": 5, "batch": 1, "throughput_rps": 5, "latency_ms": 5}]}),
            ),
            Code::InvalidArgument,
            "spec.points[0].gpcs",
        ),
        (
            "iGniter's allocation unit too small to search",
            resource(
                "GpuModel",
                "T4",
                "",
                json!({"sm_count": 40, "memory_gib": 16, "idle_power_w": 30, "max_power_w": 70, "max_frequency_mhz": 1590, "pcie_gbps": 16,
                       "igniter": {"alpha_f": -1.0, "alpha_sch": 0.001, "beta_sch": 0.01, "r_unit_pct": 1e-9}}),
            ),
            Code::InvalidArgument,
            "spec.igniter.r_unit_pct",
        ),
        (
            "a MIG start that overflows a byte",
            resource(
                "GpuModel",
                "H100",
                "",
                json!({"sm_count": 132, "memory_gib": 80, "mig": {"compute_slices": 7, "memory_slices": 8, "profiles": [
                    {"name": "1g", "compute_slices": 1, "memory_slices": 1, "starts": [255]}]}}),
            ),
            Code::InvalidArgument,
            "spec.mig.profiles[0].starts[0]",
        ),
        // Class 3: super-linear work.
        (
            "allowed_gpu_models listing one model 180,000 times",
            svc("mallory", "dupes", "resnet50", 10.0, json!({"allowed_gpu_models": allowed_180k})),
            Code::InvalidArgument,
            "spec.allowed_gpu_models",
        ),
        (
            "allowed_gpu_models listing a model twice",
            svc("mallory", "dupes", "resnet50", 10.0, json!({"allowed_gpu_models": ["A100-80GB", "A100-80GB"]})),
            Code::InvalidArgument,
            "spec.allowed_gpu_models[1]",
        ),
        // Class 5: limits that were declared but not enforced.
        (
            "a second ModelProfile for the same model and GPU model",
            resource(
                "ModelProfile",
                "resnet50-a100-again",
                "",
                json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 8, "throughput_rps": 9000, "latency_ms": 1}]}),
            ),
            Code::AlreadyExists,
            "spec.model",
        ),
    ];
    let leader = cluster.wait_leader().await;
    let before = cluster.node(leader).controller.status().last_log_index;
    for (what, resource, code, field) in cases {
        let err = client.put(resource, WriteMode::Create).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {}", err.message());
        assert_eq!(field_of(&err), field, "{what}: {}", err.message());
    }
    let err = client.get("ModelProfile", "resnet50-a100-again", false).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(cluster.node(leader).controller.status().last_log_index, before, "refused input must not reach the log");

    // max_services: mallory may have 3.
    for i in 0..3 {
        client.put(svc("mallory", &format!("m{i}"), "resnet50", 10.0, json!({})), WriteMode::Create).await.unwrap();
    }
    let err = client.put(svc("mallory", "m3", "resnet50", 10.0, json!({})), WriteMode::Create).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert_eq!(field_of(&err), "tenant");
    assert!(err.message().contains("max_services is 3"), "{}", err.message());
    // An update of an existing one is no new service; another tenant is not limited by it.
    client.put(svc("mallory", "m0", "resnet50", 20.0, json!({})), WriteMode::Update).await.unwrap();
    client.put(svc("acme", "m3", "resnet50", 10.0, json!({})), WriteMode::Create).await.unwrap();
    assert_eq!(client.list("Service", "mallory", false).await.unwrap().resources.len(), 3);

    // Every controller is still up and serving.
    for (id, _) in cluster.running() {
        cluster.client_of(id).get("Tenant", "acme", true).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_but_valid_service_is_refused_by_name_while_the_others_stay_planned() {
    let loops = LoopSettings { provision_interval: Duration::from_secs(1), ..LoopSettings::default() };
    let cluster = TestCluster::start_with_loops(3, fast_settings(), loops).await;
    let client = cluster.client();
    for r in fleet() {
        client.put(r, WriteMode::Unspecified).await.unwrap();
    }
    client.put(svc("acme", "web", "resnet50", 300.0, json!({})), WriteMode::Create).await.unwrap();
    // Within every bound, yet 10^7 req/s at 0.01 req/s per instance would be 10^9 instances.
    client.put(svc("mallory", "hog", "slowmodel", 10_000_000.0, json!({})), WriteMode::Create).await.unwrap();
    // PARIS at its largest distribution and rate.
    let paris = json!({"strategy": "paris", "batch_distribution": {"type": "log-normal", "mu": 20.0, "sigma": 10.0, "max_batch": 1024}});
    client.put(svc("mallory", "paris-max", "resnet50", 10_000_000.0, paris), WriteMode::Create).await.unwrap();
    let plan = plan_where(&client, |p| {
        prediction(p, "web").is_some_and(|w| w["capacity_rps"].as_f64() >= Some(300.0))
            && prediction(p, "hog").is_some()
            && prediction(p, "paris-max").is_some()
    })
    .await;
    let hog = prediction(&plan, "hog").unwrap();
    // Its least need alone is past mallory's quota (the default): refused before any
    // strategy plans it (`provision::budget`).
    assert!(hog["infeasible_reason"].as_str().is_some_and(|r| r.contains("over quota") && r.contains("refused before planning")), "{plan}");
    assert!(prediction(&plan, "paris-max").unwrap()["infeasible_reason"].is_string(), "{plan}");
    assert!(prediction(&plan, "web").unwrap()["infeasible_reason"].is_null(), "{plan}");

    // The leader's loops did not fail, and every controller answers.
    let leader = cluster.wait_leader().await;
    assert_eq!(cluster.node(leader).controller.telemetry.failing_loops(1), vec![]);
    for (id, _) in cluster.running() {
        cluster.client_of(id).get("Plan", "current", true).await.unwrap();
    }

    // Class 4: node n1 reports. What the plan placed on it is accepted ...
    let mut agent = proto::agent_client::AgentClient::connect(format!("http://{}", cluster.endpoints()[0])).await.unwrap();
    let metrics = |service: &str, endpoint: &str| proto::ServiceMetrics {
        service: service.into(),
        p99_ms: 20.0,
        throughput_rps: 300.0,
        arrival_rps: 300.0,
        failed: 0,
        endpoint: endpoint.into(),
        ..Default::default()
    };
    // The node claims to run its current desired state (an agent behind it may still report
    // windows of services moved away: those are dropped, see report_check).
    let current =
        agent.report(proto::ReportRequest { node: "n1".into(), ..Default::default() }).await.unwrap().into_inner().desired_version;
    let report = |m: Vec<proto::ServiceMetrics>| proto::ReportRequest {
        node: "n1".into(),
        applied_version: current,
        metrics: m,
        ..Default::default()
    };
    agent.report(report(vec![metrics("web", "n1:7200")])).await.unwrap();
    // ... metrics and an endpoint for a service the plan did not put there are denied ...
    let err = agent.report(report(vec![metrics("web", "n1:7200"), metrics("m0", "n1:7201")])).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err).as_str()), (Code::PermissionDenied, "metrics[1].service"), "{}", err.message());
    // ... as is an endpoint on another host (a traffic hijack) ...
    let err = agent.report(report(vec![metrics("web", "10.6.6.6:443")])).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err).as_str()), (Code::PermissionDenied, "metrics[0].endpoint"), "{}", err.message());
    // ... and numbers that are not finite, or negative.
    let mut nan = metrics("web", "");
    nan.p99_ms = f64::NAN;
    let err = agent.report(report(vec![nan])).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err).as_str()), (Code::InvalidArgument, "metrics[0].p99_ms"), "{}", err.message());
    let mut negative = metrics("web", "");
    negative.arrival_rps = -5.0;
    let err = agent.report(report(vec![negative])).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err).as_str()), (Code::InvalidArgument, "metrics[0].arrival_rps"), "{}", err.message());

    // The endpoints published are only the accepted one.
    let (status, _) = node_status_when(&client, "n1", |s| s["endpoints"].as_object().is_some_and(|e| !e.is_empty())).await;
    assert_eq!(status["endpoints"], json!({"web": "n1:7200"}));
    let leader = cluster.wait_leader().await;
    let exposition = cluster.node(leader).controller.telemetry.render(&Default::default());
    assert!(exposition.contains("gpuplane_agent_reports_refused_total{reason=\"not_the_nodes\"} 2"), "{exposition}");
    assert!(exposition.contains("gpuplane_agent_reports_refused_total{reason=\"invalid\"} 2"), "{exposition}");
}
