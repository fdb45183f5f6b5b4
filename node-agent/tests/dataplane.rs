//! The data plane on loopback: sim-infer servers, the router, shadow failover. Assertions
//! are on outcomes (who served, nothing lost), never on timings.

use node_agent::router::{serve, Backend, BackendSpec, Router, RouterConfig, ShapeServiceTime};
use node_agent::shadow::controller::{ProcessControl, ShadowController};
use node_agent::shadow::{FailoverConfig, SwitchReason};
use node_agent::sim_infer::{self, model_shape, Placement, SimInferConfig, SimInferHandle};
use planner::policy::elsa::ElsaConfig;
use proto::inference_client::InferenceClient;
use proto::InferRequest;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::Code;

fn sim_config(id: &str, model: &str, gpcs: u8, time_scale: f64, noise_sigma: f64) -> SimInferConfig {
    SimInferConfig {
        id: id.into(),
        model: model.into(),
        placement: Placement { mig_gpcs: gpcs, time_scale, noise_sigma, ..Placement::default() },
        max_batch: 8,
        batch_window: Duration::from_micros(500),
        seed: 7,
    }
}

async fn start_sim(id: &str, model: &str, gpcs: u8, time_scale: f64) -> SimInferHandle {
    sim_infer::spawn(sim_config(id, model, gpcs, time_scale, 0.1), "127.0.0.1:0").await.unwrap()
}

fn backend(id: &str, addr: SocketAddr, gpcs: u32) -> Arc<Backend> {
    Backend::connect_lazy(BackendSpec { id: id.into(), addr: addr.to_string(), gpcs, max_batch: 8 }).unwrap()
}

fn router(model: &str, slo_ms: f64, window_ms: u64, time_scale: f64, backends: Vec<Arc<Backend>>) -> Router {
    let config = RouterConfig { service: "svc".into(), slo_ms, elsa: ElsaConfig::default(), window_ms };
    let times = Arc::new(ShapeServiceTime { shape: model_shape(model).unwrap(), time_scale });
    Router::new(config, times, backends).unwrap()
}

/// Serves the router on loopback; returns a client to it.
async fn serve_router(r: &Router) -> InferenceClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(r.clone(), listener, std::future::pending()));
    InferenceClient::connect(format!("http://{addr}")).await.unwrap()
}

fn request(request_id: u64, batch: u32) -> InferRequest {
    InferRequest { request_id, service: "svc".into(), batch, payload_bytes: 1024 }
}

/// What a load generator saw.
#[derive(Debug, Default)]
struct Outcome {
    sent: u64,
    answered: Vec<u64>,
    failures: Vec<String>,
    served_by: HashMap<String, u64>,
}

/// `clients` concurrent clients sending until `stop`; ids are unique across clients.
fn load(client: &InferenceClient<Channel>, clients: u64, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<Outcome>> {
    (0..clients)
        .map(|c| {
            let (mut client, stop) = (client.clone(), Arc::clone(stop));
            tokio::spawn(async move {
                let mut out = Outcome::default();
                while !stop.load(SeqCst) {
                    let id = (c << 32) + out.sent;
                    out.sent += 1;
                    match client.infer(request(id, 1)).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            out.answered.push(r.request_id);
                            *out.served_by.entry(r.served_by).or_default() += 1;
                        }
                        Err(s) => out.failures.push(format!("request {id}: {s}")),
                    }
                }
                out
            })
        })
        .collect()
}

async fn finish(stop: &AtomicBool, tasks: Vec<JoinHandle<Outcome>>) -> Outcome {
    stop.store(true, SeqCst);
    let mut total = Outcome::default();
    for t in tasks {
        let o = t.await.unwrap();
        total.sent += o.sent;
        total.answered.extend(o.answered);
        total.failures.extend(o.failures);
        for (k, v) in o.served_by {
            *total.served_by.entry(k).or_default() += v;
        }
    }
    total
}

fn assert_all_answered_once(o: &Outcome) {
    assert!(o.failures.is_empty(), "{} failed: {:?}", o.failures.len(), &o.failures[..o.failures.len().min(5)]);
    let unique: HashSet<u64> = o.answered.iter().copied().collect();
    assert_eq!(unique.len(), o.answered.len(), "a request was answered twice");
    assert_eq!(o.answered.len() as u64, o.sent, "every request sent is answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_switches_under_load_lose_no_request() {
    let (a, b) = (start_sim("a", "mobilenet", 3, 0.1).await, start_sim("b", "mobilenet", 4, 0.1).await);
    let (ba, bb) = (backend("a", a.addr, 3), backend("b", b.addr, 4));
    let r = router("mobilenet", 100.0, 1000, 0.1, vec![Arc::clone(&ba)]);
    let client = serve_router(&r).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&client, 6, &stop);
    for i in 0..100 {
        let next = if i % 2 == 0 { &bb } else { &ba };
        let swap = r.set_active(vec![Arc::clone(next)]);
        assert_eq!(swap.current.ids(), vec![next.id()]);
        for old in swap.retired() {
            old.drained().await;
            assert_eq!(old.in_flight(), 0);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let out = finish(&stop, tasks).await;
    assert_all_answered_once(&out);
    assert!(out.served_by.get("a").is_some_and(|&n| n > 0) && out.served_by.get("b").is_some_and(|&n| n > 0), "{:?}", out.served_by);
    a.drain_and_stop().await.unwrap();
    b.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elsa_takes_the_small_partition_when_slack_allows_and_the_big_one_when_not() {
    // resnet50, batch 8, × 0.2: 1g ≈ 5.9 ms, 7g ≈ 2.9 ms (perf/synthetic.rs). No noise.
    let small = sim_infer::spawn(sim_config("small", "resnet50", 1, 0.2, 0.0), "127.0.0.1:0").await.unwrap();
    let big = sim_infer::spawn(sim_config("big", "resnet50", 7, 0.2, 0.0), "127.0.0.1:0").await.unwrap();
    let backends = || vec![backend("big", big.addr, 7), backend("small", small.addr, 1)];
    for (slo_ms, expect) in [(10.0, "small"), (4.0, "big")] {
        let r = router("resnet50", slo_ms, 1000, 0.2, backends());
        let mut client = serve_router(&r).await;
        for id in 0..5 {
            // One at a time: every decision sees empty queues.
            let resp = client.infer(request(id, 8)).await.unwrap().into_inner();
            assert_eq!(resp.served_by, expect, "SLO {slo_ms} ms");
            assert_eq!(resp.executed_batch, 8);
        }
        let wrong = client.infer(InferRequest { service: "other".into(), ..request(9, 1) }).await.unwrap_err();
        assert_eq!(wrong.code(), Code::NotFound);
    }
}

/// Records stops; answers shadow requests with nothing.
#[derive(Default)]
struct FakeSupervisor {
    stopped: Mutex<Vec<String>>,
    stopped_notify: tokio::sync::Notify,
}

impl ProcessControl for FakeSupervisor {
    async fn stop(&self, backend: &BackendSpec) -> Result<(), String> {
        self.stopped.lock().unwrap().push(backend.id.clone());
        self.stopped_notify.notify_one();
        Ok(())
    }
    fn shadow_wanted(&self) {}
}

impl FakeSupervisor {
    async fn wait_stopped(&self, id: &str) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !self.stopped.lock().unwrap().iter().any(|s| s == id) {
                self.stopped_notify.notified().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{id} was never stopped"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resize_switches_once_the_new_size_reports_ready_then_drains_the_old() {
    let a = start_sim("small", "mobilenet", 2, 0.1).await;
    let ba = backend("small", a.addr, 2);
    let r = router("mobilenet", 100.0, 1000, 0.1, vec![Arc::clone(&ba)]);
    let client = serve_router(&r).await;
    let supervisor = Arc::new(FakeSupervisor::default());
    let config = FailoverConfig { slo_ms: 100.0, consecutive_windows: 2 };
    let (controller, handle) = ShadowController::new(r.clone(), Arc::clone(&ba), config, Arc::clone(&supervisor));
    let mut switches = handle.subscribe_switches();
    tokio::spawn(controller.with_probe_interval(Duration::from_millis(20)).run());

    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&client, 4, &stop);
    // The new size's process is not up yet: its address refuses connections.
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    handle.resize(backend("big", port, 7)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r.active().ids(), vec!["small"], "not ready: still on the old size");

    let b = sim_infer::spawn(sim_config("big", "mobilenet", 7, 0.1, 0.1), &port.to_string()).await.unwrap();
    let record = tokio::time::timeout(Duration::from_secs(10), switches.recv()).await.expect("a switch").unwrap();
    assert_eq!((record.from.as_str(), record.to.as_str(), &record.reason), ("small", "big", &SwitchReason::Resize));
    assert_eq!(r.active().ids(), vec!["big"]);
    supervisor.wait_stopped("small").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let out = finish(&stop, tasks).await;
    assert_all_answered_once(&out);
    assert!(out.served_by.get("big").is_some_and(|&n| n > 0), "{:?}", out.served_by);
    drop(handle);
    a.drain_and_stop().await.unwrap();
    b.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn p99_over_the_slo_fails_over_to_the_ready_shadow() {
    // resnet50 on a 1g: ≈ 15 ms a batch, over a 10 ms SLO; the shadow on a whole GPU × 0.1.
    let slow = start_sim("slow", "resnet50", 1, 1.0).await;
    let fast = start_sim("shadow", "resnet50", 7, 0.1).await;
    let (bslow, bfast) = (backend("slow", slow.addr, 1), backend("shadow", fast.addr, 7));
    let r = router("resnet50", 10.0, 100, 1.0, vec![Arc::clone(&bslow)]);
    let client = serve_router(&r).await;
    let supervisor = Arc::new(FakeSupervisor::default());
    let config = FailoverConfig { slo_ms: 10.0, consecutive_windows: 2 };
    let (controller, handle) = ShadowController::new(r.clone(), Arc::clone(&bslow), config, Arc::clone(&supervisor));
    let mut switches = handle.subscribe_switches();
    tokio::spawn(controller.with_probe_interval(Duration::from_millis(20)).run());
    handle.shadow_started(Arc::clone(&bfast)).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&client, 2, &stop);
    let record = tokio::time::timeout(Duration::from_secs(20), switches.recv()).await.expect("a failover").unwrap();
    assert_eq!((record.from.as_str(), record.to.as_str()), ("slow", "shadow"));
    assert!(matches!(record.reason, SwitchReason::SloViolation { p99_ms, windows: 2 } if p99_ms > 10.0), "{:?}", record.reason);
    supervisor.wait_stopped("slow").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let out = finish(&stop, tasks).await;
    assert_all_answered_once(&out);
    assert!(out.served_by.get("shadow").is_some_and(|&n| n > 0));
    drop(handle);
    slow.drain_and_stop().await.unwrap();
    fast.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_infer_drains_in_flight_requests_and_refuses_new_ones() {
    // ≈ 1.5 s per batch, so the drain is certainly still waiting when the probe arrives.
    let sim = start_sim("s", "resnet50", 1, 100.0).await;
    let mut client = InferenceClient::connect(format!("http://{}", sim.addr)).await.unwrap();
    let in_flight: Vec<_> = (0..3)
        .map(|i| {
            let mut c = client.clone();
            tokio::spawn(async move { c.infer(request(i, 1)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(sim.drain_and_stop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = client.infer(request(99, 1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(!client.ready(proto::ReadyRequest {}).await.unwrap().into_inner().ready);
    for (i, t) in in_flight.into_iter().enumerate() {
        assert_eq!(t.await.unwrap().unwrap().into_inner().request_id, i as u64);
    }
    stopping.await.unwrap().unwrap();
}
