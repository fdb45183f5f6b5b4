//! The GSLICE tuner on a 3-node cluster: a committed plan with an MPS-only GPU, an agent
//! reporting windows for one of its services; the leader raises that service's share while
//! the p99 misses the target, no sooner than the hold-down after the previous change and
//! never past the GPU's free share, keeps it when latency and throughput have headroom but no
//! neighbour needs the share, and the provisioner neither reverts the tuned plan nor stops
//! re-planning when its inputs change.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use controlplane::loops::LoopSettings;
use controlplane::tuning::TuningSettings;
use planner::policy::gslice::TunerConfig;
use serde_json::{json, Value};

const HOLD_DOWN_S: f64 = 1.5;

/// A T4 host (no MIG: an MPS-only GPU) and two services; the planner has no MIG profile for
/// them on a T4, so the provisioner's own plan places nothing and the test writes the MPS
/// plan, as iGniter would.
fn mps_fleet() -> Vec<proto::Resource> {
    vec![
        resource("Tenant", "acme", "", json!({})),
        resource("GpuModel", "T4-16GB", "", json!({"sm_count": 40, "memory_gib": 16})),
        resource(
            "InstanceType",
            "g4dn",
            "",
            json!({"gpu_model": "T4-16GB", "gpu_count": 1, "price_per_hour": 0.53, "launch_latency_s": 60}),
        ),
        resource(
            "ModelProfile",
            "resnet50-t4",
            "",
            json!({"model": "resnet50", "gpu_model": "T4-16GB", "points": [{"gpcs": 0, "batch": 8, "mps_percent": 30, "throughput_rps": 150, "latency_ms": 20}]}),
        ),
        resource(
            "Node",
            "n1",
            "",
            json!({"address": "n1:7100", "instance_type": "g4dn", "gpus": [{"uuid": "GPU-t4", "model": "T4-16GB"}]}),
        ),
        service("web", 100.0, 50.0),
        service("batch", 10.0, 200.0),
    ]
}

/// One committed version of the plan, as the watch delivered it.
#[derive(Debug)]
struct Seen {
    version: u64,
    at: Instant,
    spec: Value,
}

impl Seen {
    fn share(&self, service: &str) -> Option<f64> {
        let gpu = self.spec["gpus"].as_array()?.iter().find(|g| g["gpu_uuid"] == "GPU-t4")?;
        gpu["workloads"].as_array()?.iter().find(|w| w["service"] == service)?["mps_percent"].as_f64()
    }

    fn gpu_total(&self) -> f64 {
        let gpu = self.spec["gpus"].as_array().unwrap().iter().find(|g| g["gpu_uuid"] == "GPU-t4").unwrap();
        gpu["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["mps_percent"].as_f64().unwrap() + w["shadow_mps_percent"].as_f64().unwrap_or(0.0))
            .sum()
    }

    fn digest(&self) -> &str {
        self.spec["inputs_digest"].as_str().unwrap_or("")
    }
}

/// The next committed plan version (waits up to 20 s).
async fn next_plan(stream: &mut tonic::Streaming<proto::WatchEvent>) -> Seen {
    let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("a plan change in time")
        .expect("watch open")
        .expect("watch not ended");
    let r = event.resource.expect("the event carries the plan");
    Seen { version: r.resource_version, at: Instant::now(), spec: serde_json::from_str(&r.spec_json).unwrap() }
}

/// The committed plan once `ok` accepts it (waits up to 20 s).
async fn plan_where(client: &controlplane::client::Client, ok: impl Fn(&Value) -> bool) -> proto::Resource {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get("Plan", "current", false).await {
            if ok(&serde_json::from_str(&r.spec_json).unwrap()) {
                return r;
            }
        }
        assert!(Instant::now() < deadline, "no plan as expected in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An agent for n1 that has converged to whatever it was last told and reports `window`
/// for `web` (p99 ms, throughput and arrival rate req/s) every 50 ms.
fn start_agent(servers: Vec<String>, window: Arc<Mutex<(f64, f64, f64)>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut applied_version = 0;
        loop {
            for s in &servers {
                let Ok(mut agent) = proto::agent_client::AgentClient::connect(format!("http://{s}")).await else { continue };
                let (p99_ms, throughput_rps, arrival_rps) = *window.lock().unwrap();
                let metrics =
                    vec![proto::ServiceMetrics { service: "web".into(), p99_ms, throughput_rps, arrival_rps, ..Default::default() }];
                if let Ok(r) =
                    agent.report(proto::ReportRequest { node: "n1".into(), applied_version, metrics, ..Default::default() }).await
                {
                    applied_version = r.into_inner().desired_version;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_tunes_mps_shares_from_reported_windows_with_hold_down_and_the_gpus_free_share() {
    let loops = LoopSettings {
        provision_interval: Duration::from_millis(300),
        // No report before the agent starts must not make n1 unhealthy (a new fleet, a re-plan).
        missed_heartbeats: 1000,
        tune_interval: Duration::from_millis(100),
        tuning: TuningSettings::new(0.8, TunerConfig { hold_down_s: HOLD_DOWN_S, ..TunerConfig::default() }).unwrap(),
        ..LoopSettings::default()
    };
    let cluster = TestCluster::start_with_loops(3, fast_settings(), loops).await;
    let client = cluster.client();
    for r in mps_fleet() {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap();
    }

    // The provisioner's plan for both services carries the digest of its inputs; the MPS
    // plan written with the same digest is one the provisioner considers current.
    let provisioned = plan_where(&client, |p| {
        p["inputs_digest"].as_str().is_some_and(|d| !d.is_empty()) && p["services"].as_array().is_some_and(|s| s.len() == 2)
    })
    .await;
    let provisioned_spec: Value = serde_json::from_str(&provisioned.spec_json).unwrap();
    let digest = provisioned_spec["inputs_digest"].as_str().unwrap().to_string();
    let mps_plan = json!({
        "strategy": "igniter",
        "gpus": [{"node": "n1", "gpu_uuid": "GPU-t4", "workloads": [
            {"service": "web", "mps_percent": 30, "batch": 8, "shadow_mps_percent": 10},
            {"service": "batch", "mps_percent": 20, "batch": 4}]}],
        "services": provisioned_spec["services"],
        "inputs_digest": digest,
    });
    let written = client
        .put(
            proto::Resource { resource_version: provisioned.resource_version, ..resource("Plan", "current", "", mps_plan) },
            proto::WriteMode::Update,
        )
        .await
        .unwrap()
        .resource
        .unwrap();
    let mut plans = client.watch("Plan", written.mod_revision).await.unwrap();

    // p99 80 ms against a 40 ms target (0.8 × 50), 60 of 100 req/s served: up, twice. The
    // second change is asked for at once (the windows do not improve) but waits for the
    // hold-down; it is clipped at 70%: 100 − 10 (web's shadow) − 20 (batch).
    let window = Arc::new(Mutex::new((80.0, 60.0, 100.0)));
    let deficit_from = Instant::now();
    let agent = start_agent(cluster.endpoints(), window.clone());
    let tuned = |seen: &Seen| {
        assert_eq!(seen.digest(), digest, "only the tuner writes while the inputs stay: {seen:?}");
        assert_eq!(seen.share("batch"), Some(20.0), "batch reports no window: untouched");
        assert!(seen.gpu_total() <= 100.0, "{seen:?}");
        seen.share("web").unwrap()
    };
    let first = next_plan(&mut plans).await;
    let s1 = tuned(&first);
    let second = next_plan(&mut plans).await;
    let s2 = tuned(&second);
    assert!(30.0 < s1 && s1 < s2, "two increases: 30 → {s1} → {s2}");
    assert_eq!(s2, 70.0, "the second increase is clipped to the free share");
    assert!(written.resource_version < first.version && first.version < second.version);
    assert!(
        second.at.duration_since(deficit_from).as_secs_f64() >= HOLD_DOWN_S,
        "the second change came within the hold-down of the first (both after {deficit_from:?})"
    );

    // Headroom in both residuals (10 ms against 40, 130 served for 100 arriving): GSLICE would
    // lower web's share, but nothing on the GPU asks for it (batch reports no window), so the
    // tuner does not restart web for it. Three hold-downs later, new inputs (batch's rate):
    // the next committed plan is the provisioner's re-plan, not a tuner's write.
    *window.lock().unwrap() = (10.0, 130.0, 100.0);
    tokio::time::sleep(Duration::from_secs_f64(3.0 * HOLD_DOWN_S)).await;
    client.put(service("batch", 20.0, 200.0), proto::WriteMode::Update).await.unwrap();
    let replanned = next_plan(&mut plans).await;
    assert_ne!(replanned.digest(), digest, "no lowering of a share no one needs came first: {replanned:?}");
    assert!(!replanned.digest().is_empty());
    assert!(replanned.share("web").is_none(), "the provisioner's own plan places nothing on the T4: {replanned:?}");
    agent.abort();
}
