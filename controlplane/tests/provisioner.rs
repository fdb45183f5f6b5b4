//! The leader-only provisioner on a 3-node cluster: it plans the services onto the
//! registered nodes' GPUs, re-plans on a change, keeps running after a leader failover, and
//! names the services the fleet cannot hold.

mod common;

use std::time::{Duration, Instant};

use common::*;
use controlplane::loops::LoopSettings;
use controlplane::resources::{Health, NodeStatus, ServiceStatus};
use serde_json::{json, Value};

fn fleet_resources() -> Vec<proto::Resource> {
    let mig = a100_mig();
    // Illustrative round figures: throughput per process grows with the instance.
    let points: Vec<Value> = [(1, 100.0), (2, 210.0), (3, 330.0), (4, 430.0), (7, 760.0)]
        .iter()
        .map(|&(g, tp)| json!({"gpcs": g, "batch": 8, "throughput_rps": tp, "latency_ms": 10}))
        .collect();
    vec![
        resource("Tenant", "acme", "", json!({})),
        resource("GpuModel", "A100-80GB", "", json!({"sm_count": 108, "memory_gib": 80, "mig": mig})),
        resource("InstanceType", "a2", "", json!({"gpu_model": "A100-80GB", "gpu_count": 2, "price_per_hour": 8, "launch_latency_s": 60})),
        resource("ModelProfile", "resnet50-a100", "", json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": points})),
        resource(
            "Node",
            "n1",
            "",
            json!({"address": "n1:7100", "instance_type": "a2", "gpus": [
            {"uuid": "GPU-a", "model": "A100-80GB", "mig_enabled": true}, {"uuid": "GPU-b", "model": "A100-80GB", "mig_enabled": true}]}),
        ),
    ]
}

fn svc(name: &str, rate: f64) -> proto::Resource {
    resource("Service", name, "acme", json!({"model": "resnet50", "slo": {"latency_ms": 100, "request_rate": rate}}))
}

/// A 3-controller cluster running `loops`, holding `fleet_resources()`.
async fn cluster_with_fleet(loops: LoopSettings) -> (TestCluster, controlplane::client::Client) {
    let cluster = TestCluster::start_with_loops(3, fast_settings(), loops).await;
    let client = cluster.client();
    for r in fleet_resources() {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap();
    }
    (cluster, client)
}

/// A second node, n2, with one A100.
fn node_n2() -> proto::Resource {
    resource(
        "Node",
        "n2",
        "",
        json!({"address": "n2:7100", "instance_type": "a2", "gpus": [{"uuid": "GPU-c", "model": "A100-80GB", "mig_enabled": true}]}),
    )
}

/// The committed plan once `ok` accepts it (waits up to 20 s).
async fn plan_where(client: &controlplane::client::Client, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get("Plan", "current", false).await {
            let spec: Value = serde_json::from_str(&r.spec_json).unwrap();
            if ok(&spec) {
                return spec;
            }
        }
        assert!(Instant::now() < deadline, "no plan as expected in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn capacity(plan: &Value, service: &str) -> f64 {
    plan["services"].as_array().unwrap().iter().find(|s| s["service"] == service).and_then(|s| s["capacity_rps"].as_f64()).unwrap_or(0.0)
}

fn gpcs(plan: &Value) -> u64 {
    let size = |p: &Value| p["profile"].as_str().unwrap()[..1].parse::<u64>().unwrap();
    plan["gpus"].as_array().unwrap().iter().flat_map(|g| g["mig_layout"].as_array().unwrap().iter().map(size)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_plans_services_onto_the_fleet_and_keeps_doing_so_after_a_failover() {
    let loops = LoopSettings { provision_interval: Duration::from_secs(1), ..LoopSettings::default() };
    let (mut cluster, client) = cluster_with_fleet(loops).await;
    client.put(svc("web", 300.0), proto::WriteMode::Create).await.unwrap();
    let plan = plan_where(&client, |p| capacity(p, "web") >= 300.0).await;
    assert!(plan["gpus"].as_array().unwrap().iter().all(|g| g["node"] == "n1"));
    assert!(plan["services"][0]["infeasible_reason"].is_null(), "{plan}");
    let before = gpcs(&plan);

    // More load: the next pass plans more GPCs.
    client.put(svc("web", 900.0), proto::WriteMode::Update).await.unwrap();
    let plan = plan_where(&client, |p| capacity(p, "web") >= 900.0).await;
    assert!(gpcs(&plan) > before);

    // The leader goes away; the new leader's provisioner takes over.
    let leader = cluster.wait_leader().await;
    cluster.stop(leader).await;
    cluster.wait_leader().await;
    let client = cluster.client();
    client.put(svc("batch", 200.0), proto::WriteMode::Create).await.unwrap();
    let plan = plan_where(&client, |p| capacity(p, "batch") >= 200.0 && capacity(p, "web") >= 900.0).await;

    // A service the two GPUs cannot hold is named, with the reason, not dropped: no node
    // provider, so the fleet cannot grow and the tenant's oldest services keep it.
    client.put(svc("huge", 5000.0), proto::WriteMode::Create).await.unwrap();
    let plan_after = plan_where(&client, |p| p["services"].as_array().unwrap().iter().any(|s| s["service"] == "huge")).await;
    let huge = plan_after["services"].as_array().unwrap().iter().find(|s| s["service"] == "huge").unwrap();
    assert!(
        huge["infeasible_reason"].as_str().is_some_and(|r| r.starts_with("fleet full: the fleet can hold 2 A100-80GB GPUs")),
        "{plan_after}"
    );
    assert!(capacity(&plan_after, "web") >= 900.0, "the oldest service keeps its GPUs: {plan_after}");
    assert!(plan_after["gpus"].as_array().unwrap().len() <= 2);
    let _ = plan;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_bigger_than_one_raft_entry_is_committed_in_parts_and_ends_whole() {
    let loops = LoopSettings { provision_interval: Duration::from_secs(1), ..LoopSettings::default() };
    let (_cluster, client) = cluster_with_fleet(loops).await; // kept running to the end
                                                              // 40 more hosts of 8 GPUs, and a service that needs most of them: more GPUs than
                                                              // `MAX_PATCH_CHANGES` in one plan.
    let a8 = json!({"gpu_model": "A100-80GB", "gpu_count": 8, "price_per_hour": 32, "launch_latency_s": 60});
    client.put(resource("InstanceType", "a8", "", a8), proto::WriteMode::Create).await.unwrap();
    for n in 0..40 {
        let gpus: Vec<Value> = (0..8).map(|g| json!({"uuid": format!("GPU-{n}-{g}"), "model": "A100-80GB", "mig_enabled": true})).collect();
        let spec = json!({"address": format!("big-{n:02}:7100"), "instance_type": "a8", "gpus": gpus});
        client.put(resource("Node", &format!("big-{n:02}"), "", spec), proto::WriteMode::Create).await.unwrap();
    }
    let mut plans = client.watch("Plan", 0).await.unwrap();
    client.put(svc("wide", 200_000.0), proto::WriteMode::Create).await.unwrap();
    let plan = plan_where(&client, |p| capacity(p, "wide") >= 200_000.0).await;
    let gpus = plan["gpus"].as_array().unwrap().len();
    assert!(gpus > controlplane::resources::MAX_PATCH_CHANGES, "the plan holds {gpus} GPUs");
    assert!(plan["inputs_digest"].as_str().is_some_and(|d| !d.is_empty()), "{}", plan["inputs_digest"]);
    // Watchers saw it arrive in parts of at most 256 GPUs, each without the inputs digest
    // (a part-way plan was planned from no inputs) but the last.
    let mut seen = Vec::new();
    while seen.last() != Some(&(gpus, true)) {
        let event = tokio::time::timeout(Duration::from_secs(10), plans.message()).await.expect("plan events").unwrap().unwrap();
        let Some(resource) = event.resource else { continue }; // the end of the initial listing
        let spec: Value = serde_json::from_str(&resource.spec_json).unwrap();
        seen.push((spec["gpus"].as_array().unwrap().len(), spec["inputs_digest"].as_str().is_some_and(|d| !d.is_empty())));
    }
    let start =
        seen.iter().rposition(|&(n, _)| n < gpus.min(controlplane::resources::MAX_PATCH_CHANGES)).expect("an event before the big change");
    let parts = &seen[start..];
    assert!(parts.len() >= 3, "{seen:?}");
    assert!(parts.windows(2).all(|w| w[1].0.abs_diff(w[0].0) <= controlplane::resources::MAX_PATCH_CHANGES), "{seen:?}");
    assert!(parts[1..parts.len() - 1].iter().all(|&(_, digest)| !digest), "{seen:?}");
}

async fn report(agent: &mut proto::agent_client::AgentClient<tonic::transport::Channel>, node: &str) {
    agent.report(proto::ReportRequest { node: node.into(), ..Default::default() }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_misses_its_heartbeats_is_planned_around_until_it_reports_again() {
    let loops = LoopSettings {
        provision_interval: Duration::from_millis(500),
        heartbeat_interval: Duration::from_millis(100),
        missed_heartbeats: 3,
        ..LoopSettings::default()
    };
    let (cluster, client) = cluster_with_fleet(loops).await;
    client.put(node_n2(), proto::WriteMode::Create).await.unwrap();
    // Enough load for all three GPUs.
    client.put(svc("web", 2000.0), proto::WriteMode::Create).await.unwrap();
    let leader = cluster.wait_leader().await;
    let mut agent = proto::agent_client::AgentClient::connect(format!("http://{}", cluster.node(leader).addr)).await.unwrap();
    // n2's agent reports once, then goes silent; n1's keeps reporting. (n2's next report is
    // the same as this one: it must still turn the node healthy, although its observed state
    // was written before.)
    report(&mut agent, "n2").await;
    // n1's agent keeps reporting; n2's stays silent.
    let deadline = Instant::now() + Duration::from_secs(20);
    let uses_only_n1 =
        |p: &Value| !p["gpus"].as_array().unwrap().is_empty() && p["gpus"].as_array().unwrap().iter().all(|g| g["node"] == "n1");
    loop {
        report(&mut agent, "n1").await;
        let node2: Value = serde_json::from_str(&client.get("Node", "n2", false).await.unwrap().status_json).unwrap_or(Value::Null);
        let plan = client.get("Plan", "current", false).await.ok().map(|r| serde_json::from_str::<Value>(&r.spec_json).unwrap());
        if NodeStatus::is_unhealthy(&node2) && plan.as_ref().is_some_and(uses_only_n1) {
            break;
        }
        assert!(Instant::now() < deadline, "n2 was not marked unhealthy and planned around: {node2} {plan:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let n1: Value = serde_json::from_str(&client.get("Node", "n1", false).await.unwrap().status_json).unwrap();
    assert!(NodeStatus::is_healthy(&n1), "{n1}");

    // n2 reports again: healthy, and its GPU is planned on again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        report(&mut agent, "n1").await;
        report(&mut agent, "n2").await;
        let plan: Value = serde_json::from_str(&client.get("Plan", "current", false).await.unwrap().spec_json).unwrap();
        if plan["gpus"].as_array().unwrap().iter().any(|g| g["node"] == "n2") {
            break;
        }
        assert!(Instant::now() < deadline, "n2 was not planned on again: {plan}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_report_budget_agents_are_told_to_report_less_often_and_get_that_much_longer_before_they_are_unhealthy() {
    // Two nodes on a budget of 4 reports a second: each is to report every 500 ms, not every
    // 100 ms, and is overdue after 3 × 500 ms.
    let loops = LoopSettings {
        heartbeat_interval: Duration::from_millis(100),
        missed_heartbeats: 3,
        report_budget_per_s: 4,
        ..LoopSettings::default()
    };
    let (cluster, client) = cluster_with_fleet(loops).await;
    client.put(node_n2(), proto::WriteMode::Create).await.unwrap();
    let leader = cluster.wait_leader().await;
    let mut agent = proto::agent_client::AgentClient::connect(format!("http://{}", cluster.node(leader).addr)).await.unwrap();
    let answer = agent.report(proto::ReportRequest { node: "n2".into(), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(answer.report_interval_ms, 500);

    // n1 reports every 400 ms (overdue at the unpaced 300 ms, on time at 500 ms); n2 is silent.
    let health = |status: String| {
        serde_json::from_str::<Value>(&status).ok().and_then(|s| serde_json::from_value::<NodeStatus>(s).ok()).map(|s| s.health)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = agent.report(proto::ReportRequest { node: "n1".into(), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(answer.report_interval_ms, 500);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            health(client.get("Node", "n1", false).await.unwrap().status_json),
            Some(Health::Healthy),
            "n1 reports on its paced interval"
        );
        if health(client.get("Node", "n2", false).await.unwrap().status_json) == Some(Health::Unhealthy) {
            break;
        }
        assert!(Instant::now() < deadline, "the silent n2 was never marked unhealthy");
    }
}

/// A cloud whose instances come up at once: it registers the node the way its agent would.
struct InstantCloud {
    servers: Vec<String>,
    launched: std::sync::Mutex<Vec<(String, String)>>,
    terminated: std::sync::Mutex<Vec<String>>,
}

impl controlplane::cloud::NodeProvider for InstantCloud {
    fn launch(&self, node: &str, type_name: &str, spec: &controlplane::resources::InstanceTypeSpec) -> Result<(), String> {
        self.launched.lock().unwrap().push((node.to_string(), type_name.to_string()));
        let gpus: Vec<Value> =
            (0..spec.gpu_count).map(|i| json!({"uuid": format!("GPU-{node}-{i}"), "model": spec.gpu_model, "mig_enabled": true})).collect();
        let r = resource(
            "Node",
            node,
            "",
            json!({"address": format!("{node}:7100"), "instance_type": type_name, "gpus": gpus, "labels": {controlplane::cloud::AUTOSCALED_LABEL: "true"}}),
        );
        let client = controlplane::client::Client::new(self.servers.clone());
        tokio::spawn(async move { client.put(r, proto::WriteMode::Create).await.unwrap() });
        Ok(())
    }

    fn terminate(&self, node: &str) -> Result<(), String> {
        self.terminated.lock().unwrap().push(node.to_string());
        Ok(())
    }
}

/// A 3-controller cluster holding `fleet_resources()` whose loops run as `loops` with an
/// [`InstantCloud`] as their node provider. It starts without loops to learn the addresses
/// the cloud's nodes register with, then restarts each controller with them on.
async fn cluster_with_cloud(loops: LoopSettings) -> (TestCluster, std::sync::Arc<InstantCloud>, controlplane::client::Client) {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let cloud =
        std::sync::Arc::new(InstantCloud { servers: cluster.endpoints(), launched: Default::default(), terminated: Default::default() });
    cluster.loops = LoopSettings { provider: Some(cloud.clone()), ..loops };
    for id in 1..=3 {
        cluster.stop(id).await;
        cluster.restart(id).await;
    }
    cluster.wait_leader().await;
    let client = cluster.client();
    for r in fleet_resources() {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap();
    }
    (cluster, cloud, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_above_80_percent_launches_the_cheapest_adequate_instance_and_a_drop_scales_in_after_the_cooldown() {
    let (cluster, cloud, client) = cluster_with_cloud(LoopSettings {
        provision_interval: Duration::from_millis(300),
        heartbeat_interval: Duration::from_millis(100),
        missed_heartbeats: 20,
        scale_window_s: 0.3,
        cooldown_s: 1.5,
        // The reports below carry no GPUs: what a re-plan moves never reports ready, and
        // hands over at this bound.
        handover_max: Duration::from_secs(1),
        ..LoopSettings::default()
    })
    .await;
    // A cheaper single-GPU type next to the 2-GPU one (8 per hour).
    client
        .put(
            resource(
                "InstanceType",
                "a1",
                "",
                json!({"gpu_model": "A100-80GB", "gpu_count": 1, "price_per_hour": 5, "launch_latency_s": 60}),
            ),
            proto::WriteMode::Create,
        )
        .await
        .unwrap();
    client
        .put(
            resource(
                "Service",
                "web",
                "acme",
                json!({"model": "resnet50", "slo": {"latency_ms": 100, "autoscaling": {"min_rps": 100, "max_rps": 5000}}}),
            ),
            proto::WriteMode::Create,
        )
        .await
        .unwrap();

    // Every registered node reports; n1 measures 1600 req/s arriving for web: at 80%
    // saturation that is 2000 req/s, three GPUs' worth for a fleet of two.
    let reporter = {
        let servers = cluster.endpoints();
        let arrival = std::sync::Arc::new(std::sync::Mutex::new(1600.0));
        let a = arrival.clone();
        let task = tokio::spawn(async move {
            let client = controlplane::client::Client::new(servers.clone());
            loop {
                let nodes = client.list("Node", "", true).await.map(|l| l.resources).unwrap_or_default();
                for s in &servers {
                    let Ok(mut agent) = proto::agent_client::AgentClient::connect(format!("http://{s}")).await else { continue };
                    for n in &nodes {
                        let metrics = if n.name == "n1" {
                            vec![proto::ServiceMetrics { service: "web".into(), arrival_rps: *a.lock().unwrap(), ..Default::default() }]
                        } else {
                            vec![]
                        };
                        let _ = agent.report(proto::ReportRequest { node: n.name.clone(), metrics, ..Default::default() }).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        (task, arrival)
    };
    let plan =
        plan_where(&client, |p| capacity(p, "web") >= 2000.0 && p["gpus"].as_array().unwrap().iter().any(|g| g["node"] != "n1")).await;
    let launched = cloud.launched.lock().unwrap().clone();
    assert_eq!(launched.len(), 1, "one instance for one missing GPU: {launched:?}");
    assert_eq!(launched[0].1, "a1", "the cheapest adequate type (price and launch latency)");
    let service = client.get("Service", "web", false).await.unwrap();
    let status: Value = serde_json::from_str(&service.status_json).unwrap();
    assert_eq!(ServiceStatus::provisioned_rps(&status), Some(2000.0));
    assert!(plan["services"][0]["infeasible_reason"].is_null(), "{plan}");

    // The load drops: after the cool-down the service is sized down, the plan leaves the
    // launched node empty, and after another cool-down it is terminated and removed.
    *reporter.1.lock().unwrap() = 80.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.get("Node", &launched[0].0, false).await.is_ok() {
        assert!(Instant::now() < deadline, "the idle launched node was not scaled in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cloud.terminated.lock().unwrap().clone(), vec![launched[0].0.clone()]);
    let plan = plan_where(&client, |p| capacity(p, "web") >= 100.0).await;
    assert!(plan["gpus"].as_array().unwrap().iter().all(|g| g["node"] == "n1"));
    reporter.0.abort();
}

/// With a node provider, the fleet grows only to its instance types' `max_instances`: what
/// it cannot hold even then is named "fleet full", the autoscaler launches up to the limit
/// and no further, and a raised limit plans the refused service.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_grows_to_its_instance_types_limits_and_what_they_cannot_hold_is_named() {
    let (_cluster, cloud, client) =
        cluster_with_cloud(LoopSettings { provision_interval: Duration::from_millis(300), ..LoopSettings::default() }).await;
    // n1 is one a2 of at most 2: room for one more, 4 GPUs in all.
    let a2 = |max: u32| {
        resource(
            "InstanceType",
            "a2",
            "",
            json!({"gpu_model": "A100-80GB", "gpu_count": 2, "price_per_hour": 8, "launch_latency_s": 60, "max_instances": max}),
        )
    };
    client.put(a2(2), proto::WriteMode::Update).await.unwrap();
    client.put(svc("web", 900.0), proto::WriteMode::Create).await.unwrap();
    client.put(svc("huge", 5000.0), proto::WriteMode::Create).await.unwrap();
    let refused = |p: &Value| -> Option<String> {
        let huge = p["services"].as_array()?.iter().find(|s| s["service"] == "huge")?;
        huge["infeasible_reason"].as_str().map(str::to_string)
    };
    let plan = plan_where(&client, |p| {
        refused(p).is_some_and(|r| r.starts_with("fleet full: the fleet can hold 4 A100-80GB GPUs")) && capacity(p, "web") >= 900.0
    })
    .await;
    assert!(plan["gpus"].as_array().unwrap().len() <= 4, "{plan}");
    // The autoscaler launched the one instance the limit leaves room for, and stops there.
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.list("Node", "", false).await.unwrap().resources.len() < 2 {
        assert!(Instant::now() < deadline, "the instance within the limit was not launched");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let launched = cloud.launched.lock().unwrap().clone();
    assert_eq!(launched.len(), 1, "{launched:?}");

    // A raised limit: the refused service is planned, on the instances launched for it.
    client.put(a2(10), proto::WriteMode::Update).await.unwrap();
    let plan = plan_where(&client, |p| refused(p).is_none() && capacity(p, "huge") >= 5000.0 && capacity(p, "web") >= 900.0).await;
    assert!(cloud.launched.lock().unwrap().len() > 1, "{plan}");
}

/// Tenant quotas: a Service that cannot fit its tenant's quota even alone is refused when it
/// is written, naming the quota; services that each fit but not together are planned oldest
/// first, and the newest is named over quota in the plan. Every planned workload carries
/// its tenant and isolation for the agent. The Tenant's status shows its usage against the
/// quota and the SLO windows its agents reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_quota_refuses_at_admission_and_caps_the_plan() {
    let loops = LoopSettings {
        provision_interval: Duration::from_secs(1),
        metering_interval: Duration::from_millis(200),
        ..LoopSettings::default()
    };
    let (cluster, client) = cluster_with_fleet(loops).await;
    // 90 req/s takes one 1g instance (1/7 of a GPU): room for two under 0.3.
    client.put(resource("Tenant", "acme", "", json!({"max_gpus": 0.3})), proto::WriteMode::Update).await.unwrap();
    let err = client.put(svc("big", 2000.0), proto::WriteMode::Create).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("spec.max_gpus is 0.3"), "{}", err.message());
    assert!(client.get("Service", "big", false).await.is_err(), "a refused service is not written");
    for name in ["first", "second", "third"] {
        client.put(svc(name, 90.0), proto::WriteMode::Create).await.unwrap();
    }
    let named = |p: &Value, s: &str| p["services"].as_array().unwrap().iter().any(|x| x["service"] == s);
    let plan = plan_where(&client, |p| named(p, "third") && capacity(p, "second") >= 90.0).await;
    assert!(capacity(&plan, "first") >= 90.0, "{plan}");
    let third = plan["services"].as_array().unwrap().iter().find(|s| s["service"] == "third").unwrap();
    let reason = third["infeasible_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("over quota: tenant \"acme\"'s max_gpus is 0.3"), "{plan}");
    for w in plan["gpus"].as_array().unwrap().iter().flat_map(|g| g["workloads"].as_array().unwrap()) {
        assert_eq!((w["tenant"].as_str(), w["isolation"].as_str()), (Some("acme"), Some("mig")), "{w}");
    }

    // Metered: two 1g instances of a GPU priced 8/2 an hour, within the quota.
    let status = tenant_status_when(&client, "acme", |s| s["services_planned"] == 2).await;
    assert_eq!((status["gpus"].as_f64(), status["cost_per_hour"].as_f64()), (Some(0.285714), Some(1.142857)), "{status}");
    assert_eq!((status["mig_gpcs"].as_f64(), status["mps_gpus"].as_f64()), (Some(2.0), Some(0.0)), "{status}");
    // And per service, on the leader's /metrics.
    let leader = cluster.wait_leader().await;
    let exposition = cluster.node(leader).controller.telemetry.render(&Default::default());
    let line = exposition.lines().find(|l| l.starts_with("gpuplane_service_gpus{tenant=\"acme\",service=\"first\"}"));
    let gpus: Option<f64> = line.and_then(|l| l.rsplit(' ').next()?.parse().ok());
    assert!(gpus.is_some_and(|g| (g - 1.0 / 7.0).abs() < 1e-9), "{exposition}");
    assert_eq!(status["slo"], json!({"windows": 0, "met": 0}));
    // An agent reports a window of "first" within its SLO and one of "second" over it.
    let window =
        |service: &str, p99_ms: f64| proto::ServiceMetrics { service: service.into(), p99_ms, arrival_rps: 90.0, ..Default::default() };
    let mut agent = proto::agent_client::AgentClient::connect(format!("http://{}", cluster.endpoints()[0])).await.unwrap();
    let metrics = vec![window("first", 20.0), window("second", 150.0)];
    agent.report(proto::ReportRequest { node: "n1".into(), metrics, ..Default::default() }).await.unwrap();
    let status = tenant_status_when(&client, "acme", |s| s["slo"]["windows"] == 2).await;
    assert_eq!(status["slo"], json!({"windows": 2, "met": 1}));
}

/// A change to a Tenant's quota is planned at once, not at the next periodic pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lowered_quota_is_planned_at_once() {
    // No periodic pass, and no node that turns unhealthy (no agent reports here) to wake it.
    let loops = LoopSettings { provision_interval: Duration::from_secs(3600), missed_heartbeats: 100_000, ..LoopSettings::default() };
    let (_cluster, client) = cluster_with_fleet(loops).await;
    for name in ["first", "second"] {
        client.put(svc(name, 90.0), proto::WriteMode::Create).await.unwrap();
    }
    plan_where(&client, |p| capacity(p, "first") >= 90.0 && capacity(p, "second") >= 90.0).await;
    // One 1g instance (1/7 of a GPU) fits, not two.
    client.put(resource("Tenant", "acme", "", json!({"max_gpus": 0.2})), proto::WriteMode::Update).await.unwrap();
    let plan = plan_where(&client, |p| capacity(p, "second") == 0.0).await;
    assert!(capacity(&plan, "first") >= 90.0, "{plan}");
}

/// The Tenant's status once `ok` accepts it (waits up to 20 s).
async fn tenant_status_when(client: &controlplane::client::Client, tenant: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = client.get("Tenant", tenant, false).await.unwrap();
        let status: Value = serde_json::from_str(&r.status_json).unwrap_or_default();
        if ok(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "tenant {tenant}'s status never got there: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
