//! Real NVIDIA Triton and real MLServer behind a gpuplane agent (real processes, simulated
//! GPUs) under a 3-controller cluster: each Service names its ServingRuntime and its model's
//! location; the agent launches the servers with the plan's device and MPS settings, routes
//! to them once their model is ready, and NVIDIA's own client gets each model's correct
//! answers through the gpuplane endpoints over gRPC and HTTP. Under steady load a plan change
//! that moves the Triton workload, a shadow failover and `kill -9` of the active Triton
//! process (with a warm shadow) each happen without one failed request.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use controlplane::client::Client;
use proto::fixture_models::FixtureModel;
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::{json, Value};
use tests::agent::{alive, converged, registered_gpus, router_endpoint, wait_for, Workloads};
use tests::{Cluster, Proc};

/// Real servers take seconds to start on a busy 2-core machine.
const SERVER_WAIT: Duration = Duration::from_secs(120);

fn resource(kind: &str, name: &str, tenant: &str, spec: Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

/// Writes the Triton repository and the MLServer model directory the fixtures make.
fn write_models(root: &Path, dir: &Path) {
    let python = root.join("venv/bin/python");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/real-servers/fixtures");
    let run = |args: &[&str]| {
        let out = Command::new(&python).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let repo = dir.join("triton-repo");
    run(&[fixtures.join("triton_model.py").to_str().unwrap(), repo.to_str().unwrap(), "--name", "double"]);
    let models = dir.join("mlserver-models");
    // The ports it writes are placeholders: the runtime passes the agent's through MLServer's
    // environment, which settings.json would override, so they are taken out.
    run(&[
        fixtures.join("mlserver_model.py").to_str().unwrap(),
        models.to_str().unwrap(),
        "--name",
        "lin",
        "--http-port",
        "1",
        "--grpc-port",
        "2",
        "--metrics-port",
        "3",
    ]);
    let settings = models.join("settings.json");
    let mut s: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    for port in ["http_port", "grpc_port", "metrics_port"] {
        s.as_object_mut().unwrap().remove(port);
    }
    std::fs::write(&settings, s.to_string()).unwrap();
}

async fn seed(client: &Client, root: &Path, dir: &Path) {
    let point = json!([{"gpcs": 3, "batch": 8, "throughput_rps": 400, "latency_ms": 18}]);
    let triton = json!({
        "program": root.join("bin/tritonserver"),
        // The agent loads the model through the repository API once Triton is up.
        "model_control": "repository",
        "args": ["--model-repository={model_uri}", "--model-control-mode=explicit",
                 "--grpc-port={port}", "--http-port={http_port}", "--metrics-port={metrics_port}",
                 "--grpc-address=127.0.0.1", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--exit-timeout-secs=5"],
        "metrics_path": "/metrics",
        "cold_start_s": 10
    });
    let mlserver = json!({
        "program": root.join("venv/bin/mlserver"),
        "args": ["start", "{model_uri}"],
        "env": {"MLSERVER_GRPC_PORT": "{port}", "MLSERVER_HTTP_PORT": "{http_port}", "MLSERVER_METRICS_PORT": "{metrics_port}",
                "MLSERVER_HOST": "127.0.0.1", "PATH": format!("{}:/usr/bin:/bin", root.join("venv/bin").display())},
        "metrics_path": "/metrics",
        "cold_start_s": 5
    });
    // Generous SLOs: a busy test machine must not cause failovers the test does not ask for.
    let service = |model: &str, runtime: &str, uri: &Path| json!({"model": model, "slo": {"latency_ms": 5000, "request_rate": 50}, "runtime": runtime, "model_uri": uri});
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
        resource("ModelProfile", "double-a100", "", json!({"model": "double", "gpu_model": "A100-80GB", "points": point})),
        resource("ModelProfile", "lin-a100", "", json!({"model": "lin", "gpu_model": "A100-80GB", "points": point})),
        resource("ServingRuntime", "triton", "", triton),
        resource("ServingRuntime", "mlserver", "", mlserver),
        resource("Service", "triton-svc", "acme", service("double", "triton", &dir.join("triton-repo"))),
        resource("Service", "sk-svc", "acme", service("lin", "mlserver", &dir.join("mlserver-models"))),
    ] {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap_or_else(|e| panic!("{e}"));
    }
}

fn start_agent(dir: &Path, servers: &[String], router_port: u16) -> Proc {
    let config = format!(
        r#"node = "n1"
controllers = {servers:?}
instance_type = "mixed"
insecure = true
state_dir = "{state}"
interval_ms = 250
router_ports = [{router}, {router_last}]
metrics_listen = "127.0.0.1:{metrics}"
[sim]
gpus = ["A100-80GB", "T4"]
[template]
kind = "command"
program = "/bin/false"
"#,
        state = dir.join("agent").display(),
        router = router_port,
        router_last = router_port + 10,
        metrics = router_port + 11,
    );
    tests::node_agent(dir, &config)
}

/// Triton on MIG instance `instance` of GPU 0 (a warm shadow beside it), MLServer on the
/// whole second GPU at a 40% MPS share.
fn plan(gpus: &[String], triton_instance: u32) -> proto::Resource {
    resource(
        "Plan",
        "current",
        "",
        json!({"strategy": "test", "gpus": [
            {"node": "n1", "gpu_uuid": gpus[0], "mig_layout": [{"profile": "4g", "start": 0}, {"profile": "3g", "start": 4}],
             "workloads": [{"service": "triton-svc", "mig_instance": triton_instance, "mps_percent": 100, "batch": 8, "shadow_mps_percent": 0}]},
            {"node": "n1", "gpu_uuid": gpus[1],
             "workloads": [{"service": "sk-svc", "mps_percent": 40, "batch": 8, "shadow_mps_percent": 10}]}
        ]}),
    )
}

/// Steady closed-loop load on one endpoint: every answer's values are checked.
#[derive(Default)]
struct Load {
    ok: AtomicU64,
    failed: AtomicU64,
    stop: AtomicBool,
    last_error: std::sync::Mutex<String>,
}

fn load(endpoint: String, service: &'static str, model: FixtureModel, clients: usize) -> (Arc<Load>, Vec<tokio::task::JoinHandle<()>>) {
    let load = Arc::new(Load::default());
    let tasks = (0..clients)
        .map(|_| {
            let (load, endpoint) = (load.clone(), endpoint.clone());
            tokio::spawn(async move {
                let mut client = GrpcInferenceServiceClient::connect(endpoint).await.unwrap();
                while !load.stop.load(Relaxed) {
                    let answer = client.model_infer(model.request(service)).await;
                    match answer.map_err(|s| s.to_string()).and_then(|r| model.check(r.get_ref())) {
                        Ok(()) => load.ok.fetch_add(1, Relaxed),
                        Err(e) => {
                            *load.last_error.lock().unwrap() = e;
                            load.failed.fetch_add(1, Relaxed)
                        }
                    };
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    (load, tasks)
}

/// One of `tests/clients/` run with the real servers' Python; what it printed, parsed.
async fn tritonclient(root: &Path, args: &[&str]) -> Value {
    let python = root.join("venv/bin/python");
    let script = format!("{}/clients/oip_model_client.py", env!("CARGO_MANIFEST_DIR"));
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || Command::new(python).arg(script).args(&args).output()).await.unwrap().unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the client failed:\n{printed}");
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap_or_else(|e| panic!("{e}:\n{printed}"))
}

/// The agent's process records of `service` in `role`.
fn processes(workloads: &Workloads, service: &str, role: &str) -> Vec<Value> {
    workloads.records().into_iter().filter(|r| r["spec"]["service"] == service && r["role"] == role).collect()
}

/// Whether a process answers ModelReady for `model` on its own gRPC port.
async fn model_ready(port: u64, model: &str) -> bool {
    let Ok(mut c) = GrpcInferenceServiceClient::connect(format!("http://127.0.0.1:{port}")).await else { return false };
    let request = proto::oip::ModelReadyRequest { name: model.into(), version: String::new() };
    c.model_ready(request).await.is_ok_and(|r| r.get_ref().ready)
}

fn environ(pid: u64) -> Vec<(String, String)> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|&b| b == 0)
        .filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn env_of(env: &[(String, String)], key: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

async fn agent_metrics(port: u16) -> String {
    metrics_page(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await
}

async fn metrics_page(addr: std::net::SocketAddr) -> String {
    telemetry_http::get(addr, "/metrics").await.map(|(_, text)| text).unwrap_or_default()
}

fn series_sum(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_triton_and_mlserver_serve_behind_the_agent_and_fail_over_without_a_failed_request() {
    let root = tests::real_servers();
    let cluster = Cluster::start_with(&["--no-loops"]);
    let dir = cluster.dir.path();
    write_models(&root, dir);
    let client = Client::new(cluster.servers());
    seed(&client, &root, dir).await;
    let workloads = Workloads(dir.join("agent"));
    let log = dir.join("agent.log");
    let router_port: u16 = tests::free_addr().rsplit_once(':').unwrap().1.parse().unwrap();
    let _agent = start_agent(dir, &cluster.servers(), router_port);
    let gpus = registered_gpus(&client, "n1", &log).await;
    let put = client.put(plan(&gpus, 0), proto::WriteMode::Unspecified).await.unwrap();
    converged(&client, "n1", &log, put.resource.unwrap().mod_revision, SERVER_WAIT).await;

    // Routed once the model is ready; NVIDIA's client gets each model's answers over both
    // protocols through the gpuplane endpoints.
    let triton_url = router_endpoint(&log, "triton-svc").await;
    let sk_url = router_endpoint(&log, "sk-svc").await;
    for (url, service, model) in [(&triton_url, "triton-svc", "double"), (&sk_url, "sk-svc", "lin")] {
        let host = url.trim_start_matches("http://").to_string();
        wait_for("the service to be ready through its endpoint", &log, SERVER_WAIT, async || {
            let mut c = GrpcInferenceServiceClient::connect(url.clone()).await.ok()?;
            let ready = proto::oip::ModelReadyRequest { name: service.into(), version: String::new() };
            c.model_ready(ready).await.ok()?.get_ref().ready.then_some(())
        })
        .await;
        for protocol in ["grpc", "http"] {
            let seen = tritonclient(&root, &[protocol, &host, service, model]).await;
            assert_eq!((&seen["live"], &seen["model_ready"]), (&Value::Bool(true), &Value::Bool(true)), "{protocol}: {seen}");
            assert_eq!(seen["output_matches"], true, "{service} over {protocol}: {seen}");
        }
    }

    // Each process runs with its slot's device and MPS settings, and its runtime's ports.
    let active = |service: &str| processes(&workloads, service, "Active").first().cloned().expect("an active process");
    let triton = active("triton-svc");
    let env = environ(triton["pid"].as_u64().unwrap());
    let device = env_of(&env, "CUDA_VISIBLE_DEVICES").unwrap();
    assert!(device.starts_with("MIG-"), "Triton runs on its MIG instance: {device}");
    assert_eq!(env_of(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(), Some("100"));
    assert!(env_of(&env, "CUDA_MPS_PIPE_DIRECTORY").is_some_and(|p| p.contains(&device)), "{env:?}");
    let command = triton["command"]["args"].as_array().unwrap();
    for flag in ["--grpc-port=", "--http-port=", "--metrics-port="] {
        assert!(command.iter().any(|a| a.as_str().unwrap().starts_with(flag)), "{flag} set: {command:?}");
    }
    let sk = active("sk-svc");
    let env = environ(sk["pid"].as_u64().unwrap());
    assert_eq!(env_of(&env, "CUDA_VISIBLE_DEVICES").as_deref(), Some(gpus[1].as_str()), "MLServer sees the whole GPU");
    assert_eq!(env_of(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(), Some("40"));
    assert_eq!(env_of(&env, "MLSERVER_GRPC_PORT"), sk["port"].as_u64().map(|p| p.to_string()));
    let metrics = agent_metrics(router_port + 11).await;
    assert!(
        metrics.contains("gpuplane_workload_cold_start_seconds_count{service=\"triton-svc\",runtime=\"triton\"}"),
        "cold starts measured: {metrics}"
    );
    // Triton started with no model: the agent loaded it (its command line does not).
    assert!(!command.iter().any(|a| a.as_str().unwrap().starts_with("--load-model")), "{command:?}");
    assert!(series_sum(&metrics, "gpuplane_agent_model_loads_total{service=\"triton-svc\",outcome=\"loaded\"}") >= 1.0, "{metrics}");

    // Steady load on both services from here on.
    let (triton_load, mut tasks) = load(triton_url.clone(), "triton-svc", FixtureModel::TritonDouble, 3);
    let (sk_load, sk_tasks) = load(sk_url.clone(), "sk-svc", FixtureModel::MlserverLin, 2);
    tasks.extend(sk_tasks);
    let served = |l: &Load| l.ok.load(Relaxed);
    wait_for("load to be served", &log, SERVER_WAIT, async || (served(&triton_load) > 20 && served(&sk_load) > 20).then_some(())).await;

    // The servers' own counters reach the leader beside the router's windows: what each
    // server counted as served, read from its metrics page by the agent.
    for service in ["triton-svc", "sk-svc"] {
        let series = format!("gpuplane_service_server_success_rps{{service=\"{service}\"");
        wait_for("the servers' own counters at the leader", &log, SERVER_WAIT, async || {
            let mut rps = 0.0;
            for addr in cluster.metrics.values() {
                rps += series_sum(&metrics_page(addr.parse().ok()?).await, &series);
            }
            (rps > 0.0).then_some(())
        })
        .await;
        let pages = agent_metrics(router_port + 11).await;
        let refused = format!("gpuplane_agent_server_pages_total{{service=\"{service}\",outcome=\"refused\"}}");
        assert_eq!(series_sum(&pages, &refused), 0.0, "a real server's page is believed: {pages}");
    }

    // 1. A plan change moves Triton to the other MIG instance: the new process serves
    //    before the old one drains.
    let before = triton["pid"].as_u64().unwrap();
    let put = client.put(plan(&gpus, 1), proto::WriteMode::Unspecified).await.unwrap();
    converged(&client, "n1", &log, put.resource.unwrap().mod_revision, SERVER_WAIT).await;
    let moved = active("triton-svc");
    assert_ne!(moved["pid"].as_u64(), Some(before));
    assert_eq!(moved["spec"]["slot"]["Mig"]["start"], 4, "on the 3g instance: {moved}");
    let mark = served(&triton_load);
    wait_for("the moved workload to serve", &log, SERVER_WAIT, async || (served(&triton_load) > mark + 20).then_some(())).await;

    // 2. kill -9 of the active Triton, whose warm shadow has loaded the model: the shadow
    //    takes over and the requests the dead one failed are sent to it.
    let standby = wait_for("a warm shadow of Triton", &log, SERVER_WAIT, async || {
        let s = processes(&workloads, "triton-svc", "Standby").into_iter().next()?;
        model_ready(s["port"].as_u64()?, "double").await.then_some(s)
    })
    .await;
    // The agent probes its standbys every round (250 ms): let it see this one ready.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = active("triton-svc")["pid"].as_u64().unwrap();
    let switches = series_sum(&agent_metrics(router_port + 11).await, "gpuplane_agent_shadow_switches_total{service=\"triton-svc\"}");
    Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap();
    wait_for("the shadow to take over", &log, SERVER_WAIT, async || (active("triton-svc")["id"] == standby["id"]).then_some(())).await;
    let after = series_sum(&agent_metrics(router_port + 11).await, "gpuplane_agent_shadow_switches_total{service=\"triton-svc\"}");
    assert_eq!(after, switches + 1.0, "one failover");
    assert!(!alive(victim as u32));
    let mark = served(&triton_load);
    wait_for("the shadow to serve", &log, SERVER_WAIT, async || (served(&triton_load) > mark + 20).then_some(())).await;

    // 3. A shadow failover on the SLO: an SLO no window meets, until one switch happened.
    let tight = json!({"model": "double", "slo": {"latency_ms": 0.001, "request_rate": 50}, "runtime": "triton",
                       "model_uri": dir.join("triton-repo")});
    let metrics_port = router_port + 11;
    wait_for("a new warm shadow", &log, SERVER_WAIT, async || {
        let s = processes(&workloads, "triton-svc", "Standby").into_iter().next()?;
        model_ready(s["port"].as_u64()?, "double").await.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    client.put(resource("Service", "triton-svc", "acme", tight), proto::WriteMode::Unspecified).await.unwrap();
    wait_for("a failover on the SLO", &log, SERVER_WAIT, async || {
        let n = series_sum(&agent_metrics(metrics_port).await, "gpuplane_agent_shadow_switches_total{service=\"triton-svc\"}");
        (n > after).then_some(())
    })
    .await;
    let relaxed = json!({"model": "double", "slo": {"latency_ms": 5000, "request_rate": 50}, "runtime": "triton",
                         "model_uri": dir.join("triton-repo")});
    client.put(resource("Service", "triton-svc", "acme", relaxed), proto::WriteMode::Unspecified).await.unwrap();
    let mark = served(&triton_load);
    wait_for("Triton to serve after the failover", &log, SERVER_WAIT, async || (served(&triton_load) > mark + 20).then_some(())).await;

    for l in [&triton_load, &sk_load] {
        l.stop.store(true, Relaxed);
    }
    for t in tasks {
        t.await.unwrap();
    }
    for (name, l) in [("triton-svc", &triton_load), ("sk-svc", &sk_load)] {
        let (ok, failed) = (l.ok.load(Relaxed), l.failed.load(Relaxed));
        assert_eq!(failed, 0, "{name}: {failed} of {} requests failed; last: {}", ok + failed, l.last_error.lock().unwrap());
        assert!(ok > 100, "{name}: only {ok} requests served");
    }
}
