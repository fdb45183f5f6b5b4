//! A node agent (real process, simulated GPUs) under a 3-node controller cluster (real
//! processes): a desired state with MIG and MPS workloads converges; kill -9 of the agent
//! and a restart adopt the running workload processes instead of duplicating them; the loss
//! of the controller leader does not interrupt the workloads, and the agent follows the
//! new leader; a workload moved to another GPU serves from its old slot until its
//! replacement is ready.

use std::path::{Path, PathBuf};
use std::time::Duration;

use controlplane::client::Client;
use controlplane::resources::NodeStatus;
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use proto::open_inference;
use serde_json::{json, Value};
use tests::agent::{alive, router_endpoint, Workloads};
use tests::{binary, Cluster, Proc};

fn resource(kind: &str, name: &str, tenant: &str, spec: Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

async fn seed(client: &Client) {
    let profile = json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 8, "throughput_rps": 400, "latency_ms": 18}]});
    for r in [
        resource("Tenant", "acme", "", json!({})),
        resource("GpuModel", "A100-80GB", "", json!({"sm_count": 108, "memory_gib": 80})),
        resource("GpuModel", "T4", "", json!({"sm_count": 40, "memory_gib": 16})),
        resource(
            "InstanceType",
            "mixed",
            "",
            json!({"gpu_model": "A100-80GB", "gpu_count": 2, "price_per_hour": 10, "launch_latency_s": 60}),
        ),
        resource("ModelProfile", "resnet50-a100", "", profile),
        // Generous SLOs: these tests check adoption and switches, not latency, and must not see
        // a p99 failover because the test machine is busy.
        resource("Service", "web", "acme", json!({"model": "resnet50", "slo": {"latency_ms": 2000, "request_rate": 100}})),
        resource("Service", "batch", "acme", json!({"model": "resnet50", "slo": {"latency_ms": 2000, "request_rate": 50}})),
    ] {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap();
    }
}

/// Waits up to 30 s (`tests::agent::wait_for`).
async fn wait_for<T>(what: &str, log: &Path, f: impl AsyncFnMut() -> Option<T>) -> T {
    tests::agent::wait_for(what, log, Duration::from_secs(30), f).await
}

async fn registered_gpus(client: &Client, log: &Path) -> Vec<String> {
    tests::agent::registered_gpus(client, "n1", log).await
}

async fn converged(client: &Client, log: &Path, version: u64) -> Value {
    tests::agent::converged(client, "n1", log, version, Duration::from_secs(30)).await
}

fn start_agent(dir: &Path, servers: &[String], router_port: u16) -> Proc {
    // The metrics listener is the port after the routers' range.
    let config = format!(
        r#"node = "n1"
controllers = {servers:?}
instance_type = "mixed"
insecure = true
state_dir = "{state}"
interval_ms = 200
router_ports = [{router}, {router_last}]
metrics_listen = "127.0.0.1:{metrics}"
[sim]
gpus = ["A100-80GB", "T4"]
[template]
kind = "command"
program = "{sim_infer}"
args = ["--listen=127.0.0.1:{{port}}", "--model={{model}}", "--mig-gpcs={{gpcs}}", "--max-batch={{batch}}", "--time-scale=0.1", "--id={{service}}-{{port}}"]
"#,
        state = dir.join("agent").display(),
        router = router_port,
        router_last = router_port + 20,
        metrics = metrics_port(router_port),
        sim_infer = binary("sim-infer").display(),
    );
    tests::node_agent(dir, &config)
}

fn metrics_port(router_port: u16) -> u16 {
    router_port + 21
}

/// The agent's `/metrics` page.
async fn agent_metrics(router_port: u16) -> String {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port(router_port)));
    let (status, text) = telemetry_http::get(addr, "/metrics").await.expect("the agent serves /metrics");
    assert_eq!(status, 200, "{text}");
    text
}

/// The agent's busy seconds of `service`'s active processes, added up over its instances.
async fn busy_seconds(router_port: u16, service: &str) -> f64 {
    let text = agent_metrics(router_port).await;
    let labels = format!("service=\"{service}\",role=\"active\"}}");
    text.lines()
        .filter(|l| l.starts_with("gpuplane_agent_busy_seconds_total{") && l.contains(&labels))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// One of the agent's counters (`gpuplane_agent_<name>_total`).
async fn agent_counter(router_port: u16, name: &str) -> f64 {
    let text = agent_metrics(router_port).await;
    let prefix = format!("gpuplane_agent_{name}_total ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok()).unwrap_or_else(|| panic!("no {prefix}in {text}"))
}

fn plan(gpus: &[String], web_batch: u32) -> proto::Resource {
    resource(
        "Plan",
        "current",
        "",
        json!({"strategy": "test", "gpus": [
            {"node": "n1", "gpu_uuid": gpus[0], "mig_layout": [{"profile": "4g", "start": 0}, {"profile": "3g", "start": 4}],
             "workloads": [{"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": web_batch, "shadow_mps_percent": 0},
                           {"service": "batch", "mig_instance": 1, "mps_percent": 50, "batch": 4, "processes": 2}]},
            {"node": "n1", "gpu_uuid": gpus[1],
             "workloads": [{"service": "web", "mps_percent": 40, "batch": 8, "shadow_mps_percent": 10}]}
        ]}),
    )
}

fn workload_pids(status: &Value) -> Vec<u64> {
    let mut pids: Vec<u64> = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["workloads"].as_array().unwrap().iter().map(|w| w["pid"].as_u64().unwrap()))
        .collect();
    pids.sort_unstable();
    pids
}

/// A controller cluster with the fleet's resources, and an agent on simulated GPUs.
struct Setup {
    cluster: Cluster,
    client: Client,
    workloads: Workloads,
    log: PathBuf,
    router_port: u16,
    agent: Proc,
}

impl Setup {
    async fn start() -> Setup {
        // These tests write the plans themselves: no provisioner.
        let cluster = Cluster::start_with(&["--no-loops"]);
        let client = Client::new(cluster.servers());
        seed(&client).await;
        let workloads = Workloads(cluster.dir.path().join("agent"));
        let log = cluster.dir.path().join("agent.log");
        let router_port: u16 = tests::free_addr().rsplit_once(':').unwrap().1.parse().unwrap();
        let agent = start_agent(cluster.dir.path(), &cluster.servers(), router_port);
        Setup { cluster, client, workloads, log, router_port, agent }
    }
}

/// The tests of this file each run a cluster, an agent and load: one at a time on small CI
/// machines.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_converges_survives_its_own_kill_and_the_leader_loss() {
    let _serial = SERIAL.lock().await;
    let Setup { mut cluster, client, workloads, log, router_port, mut agent } = Setup::start().await;

    // The agent registers its GPUs.
    let gpus = registered_gpus(&client, &log).await;
    assert_eq!(gpus.len(), 2);

    let put = client.put(plan(&gpus, 8), proto::WriteMode::Unspecified).await.unwrap();
    let version = put.resource.unwrap().mod_revision;
    let status = converged(&client, &log, version).await;
    let a100 = status["gpus"].as_array().unwrap().iter().find(|g| g["gpu_uuid"] == gpus[0].as_str()).unwrap();
    // The routers are published per service, for clients and load balancers.
    let endpoints = wait_for("the routers' endpoints", &log, async || {
        let out = tests::gpuctl(&cluster.servers(), &["get", "endpoints", "-o", "json"]);
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    assert!(endpoints
        .iter()
        .any(|r| r["service"] == "web" && r["node"] == "n1" && r["endpoint"].as_str().unwrap().starts_with("127.0.0.1:")));
    assert_eq!(a100["instances"], json!(["4g@0", "3g@4"]), "observed MIG layout equals the desired one");
    // `gpuctl get desired` shows the node's share of the plan at the version it applied.
    let desired: Value =
        serde_json::from_slice(&tests::gpuctl(&cluster.servers(), &["get", "desired", "n1", "-o", "json"]).stdout).unwrap();
    assert_eq!(desired["version"].as_u64(), Some(NodeStatus::applied_version(&status)));
    let layout = desired["gpus"].as_array().unwrap().iter().find(|g| g["gpu_uuid"] == gpus[0].as_str()).unwrap()["mig_layout"].clone();
    assert_eq!(layout, json!(["4g@0", "3g@4"]));
    // Three workloads, each its processes (batch runs two) and a warm standby.
    let pids = workload_pids(&status);
    assert_eq!(pids.len(), 7, "{status}");
    assert!(pids.iter().all(|&p| alive(p as u32)));
    // Each process is reported "ready" once it answers (what a plan's hand-over waits for),
    // and "starting" before.
    let states = |status: &Value| -> Vec<String> {
        status["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["workloads"].as_array().into_iter().flatten())
            .map(|w| w["state"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert!(states(&status).iter().all(|s| s == "ready" || s == "starting"), "{status}");
    wait_for("every process reported ready", &log, async || {
        let node = client.get("Node", "n1", false).await.ok()?;
        let status: Value = serde_json::from_str(&node.status_json).ok()?;
        let states = states(&status);
        (states.len() == 7 && states.iter().all(|s| s == "ready")).then_some(())
    })
    .await;

    // Its reports (every 200 ms here) and its stream share one connection per controller:
    // a report does not open a connection of its own.
    wait_for("ten answered reports", &log, async || (agent_counter(router_port, "reports_answered").await >= 10.0).then_some(())).await;
    let connections = agent_counter(router_port, "controller_connections").await;
    assert!((1.0..=3.0).contains(&connections), "{connections} connections opened for 10 reports and a stream (3 controllers)");

    // kill -9 of the agent, then a restart: the same processes, none duplicated.
    agent.kill9();
    drop(agent);
    let _agent = start_agent(cluster.dir.path(), &cluster.servers(), router_port);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = converged(&client, &log, version).await;
    assert_eq!(workload_pids(&after), pids, "adopted, not restarted");
    assert_eq!(workloads.pids().len(), 7);

    // Continuous load on web's router endpoint while the controller leader dies and a
    // change committed by the new leader resizes web through a standby (a pointer swap).
    let endpoint = router_endpoint(&log, "web").await;
    let load = Load::start(&endpoint, 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Under load the routers count the time web's instances are busy (utilisation per MIG
    // instance, measured at the router): it grows while requests flow, and the other
    // service's instance, which gets none, stays idle.
    let before = busy_seconds(router_port, "web").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = busy_seconds(router_port, "web").await;
    assert!(after > before, "web's instances are busy under load: {before} s, then {after} s");
    assert_eq!(busy_seconds(router_port, "batch").await, 0.0, "no request reached batch's instance");
    let leader = cluster.leader();
    cluster.controllers.kill9(leader);
    assert!(pids.iter().all(|&p| alive(p as u32)), "workloads unaffected by the controller loss");
    let client = Client::new(cluster.servers());
    let put = client.put(plan(&gpus, 16), proto::WriteMode::Unspecified).await.unwrap();
    let resized = converged(&client, &log, put.resource.unwrap().mod_revision).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0, "no request failed across the leader loss and the resize ({ok} succeeded)");
    assert!(ok > 100, "the load ran: {ok} requests");
    let now = workload_pids(&resized);
    assert_eq!(now.len(), 7, "{resized}");
    let kept = now.iter().filter(|p| pids.contains(p)).count();
    assert_eq!(kept, 5, "only web's two processes on the 4g instance were replaced: {pids:?} → {now:?}");
}

/// Concurrent clients sending requests to one endpoint, counting successes and failures.
struct Load {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<(u64, u64)>>,
}

impl Load {
    fn start(endpoint: &str, clients: usize) -> Load {
        Self::start_for(endpoint, "web", clients)
    }

    fn start_for(endpoint: &str, service: &str, clients: usize) -> Load {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let tasks = (0..clients)
            .map(|c| {
                let endpoint = endpoint.to_string();
                let service = service.to_string();
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let mut client = GrpcInferenceServiceClient::connect(endpoint).await.expect("router reachable");
                    let (mut ok, mut failed) = (0, 0);
                    let mut id = (c as u64) << 32;
                    while !*stopped.borrow() {
                        id += 1;
                        let value = (id % 1000) as f32;
                        match client.model_infer(open_inference::fp32_request(&service, &id.to_string(), 1, 4, value)).await {
                            // The model's answer (sim-infer's identity model), for this request.
                            Ok(r)
                                if r.get_ref().id == id.to_string()
                                    && open_inference::fp32_output(r.get_ref(), 0) == Some(vec![value; 4]) =>
                            {
                                ok += 1
                            }
                            Ok(_) | Err(_) => failed += 1,
                        }
                    }
                    (ok, failed)
                })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn stop(self) -> (u64, u64) {
        self.stop.send_replace(true);
        let mut totals = (0, 0);
        for t in self.tasks {
            let (ok, failed) = t.await.unwrap();
            totals = (totals.0 + ok, totals.1 + failed);
        }
        totals
    }
}

/// The active process of `service` in the Node's observed state.
fn active_pid(status: &Value, service: &str) -> Option<u64> {
    status["gpus"]
        .as_array()?
        .iter()
        .flat_map(|g| g["workloads"].as_array().into_iter().flatten())
        .find_map(|w| (w["service"] == service && w["shadow"] == false).then(|| w["pid"].as_u64()).flatten())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p99_over_the_slo_switches_to_the_warm_standby_without_failing_a_request() {
    let _serial = SERIAL.lock().await;
    let Setup { cluster: _cluster, client, workloads: _workloads, log, agent: _agent, .. } = Setup::start().await;
    // An SLO no process can meet: every window violates it, so the agent keeps failing over.
    client
        .put(
            resource("Service", "tight", "acme", json!({"model": "resnet50", "slo": {"latency_ms": 0.01, "request_rate": 10}})),
            proto::WriteMode::Create,
        )
        .await
        .unwrap();
    let gpus = registered_gpus(&client, &log).await;
    let plan = resource(
        "Plan",
        "current",
        "",
        json!({"strategy": "test", "gpus": [{"node": "n1", "gpu_uuid": gpus[1],
            "workloads": [{"service": "tight", "mps_percent": 50, "batch": 4, "shadow_mps_percent": 10}]}]}),
    );
    let put = client.put(plan, proto::WriteMode::Create).await.unwrap();
    let status = converged(&client, &log, put.resource.unwrap().mod_revision).await;
    let first = active_pid(&status, "tight").expect("an active process");
    let endpoint = router_endpoint(&log, "tight").await;
    let load = Load::start_for(&endpoint, "tight", 4);
    // Two violating one-second windows, then the switch; wait for the Node to show it.
    wait_for("a failover to the standby", &log, async || {
        let node = client.get("Node", "n1", false).await.ok()?;
        let status: Value = serde_json::from_str(&node.status_json).ok()?;
        active_pid(&status, "tight").filter(|&p| p != first)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0, "no request failed across the failover ({ok} succeeded)");
    assert!(ok > 100, "the load ran: {ok} requests");
    assert!(!alive(first as u32), "the replaced process was stopped");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("p99 over the SLO"), "the agent says why it switched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_controller_down_the_agent_keeps_serving_its_last_desired_state() {
    let _serial = SERIAL.lock().await;
    let Setup { mut cluster, client, workloads, log, router_port, mut agent } = Setup::start().await;
    let gpus = registered_gpus(&client, &log).await;
    let put = client.put(plan(&gpus, 8), proto::WriteMode::Unspecified).await.unwrap();
    let version = put.resource.unwrap().mod_revision;
    let pids = workload_pids(&converged(&client, &log, version).await);

    // Every controller goes away; then the agent itself is killed and restarted. It runs
    // from the desired state it kept on disk and serves through its routers.
    for id in [1, 2, 3] {
        cluster.controllers.kill9(id);
    }
    agent.kill9();
    drop(agent);
    let _agent = start_agent(cluster.dir.path(), &cluster.servers(), router_port);
    let endpoint = wait_for("web's router endpoint", &log, async || {
        let ports: Value = serde_json::from_slice(&std::fs::read(cluster.dir.path().join("agent/router-ports.json")).ok()?).ok()?;
        let port = ports["web"].as_u64()?;
        let mut c = GrpcInferenceServiceClient::connect(format!("http://127.0.0.1:{port}")).await.ok()?;
        c.model_infer(open_inference::fp32_request("web", "1", 1, 4, 1.0)).await.ok()?;
        Some(format!("http://127.0.0.1:{port}"))
    })
    .await;
    let load = Load::start(&endpoint, 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0);
    assert!(ok > 50, "served with no controller: {ok} requests");
    assert!(pids.iter().all(|&p| alive(p as u32)), "the same processes, adopted");
    assert_eq!(workloads.pids().len(), pids.len(), "none duplicated");
    let agent_log = std::fs::read_to_string(&log).unwrap();
    assert!(agent_log.contains("controller link lost"), "it keeps retrying the controllers");

    // The controllers come back: the agent follows them again (a new plan reaches it).
    for id in [1, 2, 3] {
        cluster.controllers.start(id, false).unwrap();
    }
    let client = Client::new(cluster.servers());
    let put = wait_for("the controllers to take writes again", &log, async || {
        client.put(plan(&gpus, 16), proto::WriteMode::Unspecified).await.ok()
    })
    .await;
    let status = converged(&client, &log, put.resource.unwrap().mod_revision).await;
    assert_eq!(workload_pids(&status).len(), pids.len());
}

/// All processes of `service` in the Node's observed state: (pid, state, shadow).
fn processes_of(status: &Value, service: &str) -> Vec<(u64, String, bool)> {
    status["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["workloads"].as_array().into_iter().flatten())
        .filter(|w| w["service"] == service)
        .map(|w| (w["pid"].as_u64().unwrap_or(0), w["state"].as_str().unwrap_or_default().to_string(), w["shadow"] == true))
        .collect()
}

/// Make-before-break as the provisioner writes it (`provision::handover`): the plan moves
/// web to another GPU and keeps its old workload there as retiring until the new process
/// reports ready; then a plan without it drains it. Clients see no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_moved_to_another_gpu_serves_from_its_old_slot_until_its_replacement_is_ready() {
    let _serial = SERIAL.lock().await;
    let Setup { cluster: _cluster, client, workloads: _workloads, log, agent: _agent, .. } = Setup::start().await;
    let gpus = registered_gpus(&client, &log).await;
    let old = json!({"service": "web", "mps_percent": 40, "batch": 8, "shadow_mps_percent": 10});
    let moved = |gpus_json: Value| resource("Plan", "current", "", json!({"strategy": "test", "gpus": gpus_json}));
    let put =
        client.put(moved(json!([{"node": "n1", "gpu_uuid": gpus[1], "workloads": [old]}])), proto::WriteMode::Unspecified).await.unwrap();
    let status = converged(&client, &log, put.resource.unwrap().mod_revision).await;
    let first = active_pid(&status, "web").expect("web's active process");
    let endpoint = router_endpoint(&log, "web").await;
    let load = Load::start(&endpoint, 4);

    // The move: web on the first GPU's 4g instance, its old workload retiring in place.
    let new = json!({"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": 8, "shadow_mps_percent": 0});
    let handing_over = json!([
        {"node": "n1", "gpu_uuid": gpus[0], "mig_layout": [{"profile": "4g", "start": 0}], "workloads": [new]},
        {"node": "n1", "gpu_uuid": gpus[1], "workloads": [], "retiring": [{"service": "web", "mps_percent": 40, "batch": 8}]}
    ]);
    let put = client.put(moved(handing_over), proto::WriteMode::Unspecified).await.unwrap();
    converged(&client, &log, put.resource.unwrap().mod_revision).await;
    let both = wait_for("the replacement reported ready beside the retiring process", &log, async || {
        let node = client.get("Node", "n1", false).await.ok()?;
        let status: Value = serde_json::from_str(&node.status_json).ok()?;
        let active: Vec<(u64, String, bool)> = processes_of(&status, "web").into_iter().filter(|(.., shadow)| !shadow).collect();
        (active.len() == 2 && active.iter().all(|(_, state, _)| state == "ready")).then_some(active)
    })
    .await;
    assert!(both.iter().any(|(pid, ..)| *pid == first), "the old process still serves: {both:?}");
    assert!(alive(first as u32));

    // Its replacement serves: the retiring workload goes, drained.
    let put = client
        .put(
            moved(json!([{"node": "n1", "gpu_uuid": gpus[0], "mig_layout": [{"profile": "4g", "start": 0}], "workloads": [new]}])),
            proto::WriteMode::Unspecified,
        )
        .await
        .unwrap();
    let after = converged(&client, &log, put.resource.unwrap().mod_revision).await;
    wait_for("the retiring process to stop", &log, async || (!alive(first as u32)).then_some(())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0, "no request failed across the move ({ok} succeeded)");
    assert!(ok > 100, "the load ran: {ok} requests");
    let web = processes_of(&after, "web");
    assert!(web.iter().all(|(pid, ..)| *pid != first), "{web:?}");
}
