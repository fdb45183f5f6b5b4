//! The data plane on loopback: sim-infer servers, the router and its switches. Assertions
//! are on outcomes (who served, nothing lost), never on timings.

use node_agent::router::{serve, Backend, BackendSpec, Router, RouterConfig};
use node_agent::sim_infer::{self, model_shape, Placement, ShapeServiceTime, SimInferConfig, SimInferHandle};
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use proto::oip::{ModelInferRequest, ModelInferResponse, ModelReadyRequest};
use proto::open_inference::{self, EXECUTED_BATCH};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
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

type InferenceClient = GrpcInferenceServiceClient<Channel>;

fn backend(id: &str, model: &str, addr: SocketAddr, gpcs: u32) -> Arc<Backend> {
    Backend::connect_lazy(BackendSpec { id: id.into(), addr: addr.to_string(), gpcs, max_batch: 8, model: model.into() }).unwrap()
}

fn router(model: &str, slo_ms: f64, window_ms: u64, time_scale: f64, backends: Vec<Arc<Backend>>) -> Router {
    let config = RouterConfig { window_ms, ..RouterConfig::new("svc", slo_ms) };
    let times = Arc::new(ShapeServiceTime { shape: model_shape(model).unwrap(), time_scale });
    Router::new(config, times, backends).unwrap()
}

/// Serves the router on loopback; returns a client to it.
async fn serve_router(r: &Router) -> InferenceClient {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(r.clone(), listener, std::future::pending()));
    InferenceClient::connect(format!("http://{addr}")).await.unwrap()
}

/// A request to the router's service "svc" of `batch` samples of 4 features, all `id`.
fn request(request_id: u64, batch: u32) -> ModelInferRequest {
    open_inference::fp32_request("svc", &request_id.to_string(), batch, 4, request_id as f32)
}

fn id_of(r: &ModelInferResponse) -> u64 {
    r.id.parse().unwrap()
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
fn load(client: &InferenceClient, clients: u64, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<Outcome>> {
    (0..clients)
        .map(|c| {
            let (mut client, stop) = (client.clone(), Arc::clone(stop));
            tokio::spawn(async move {
                let mut out = Outcome::default();
                while !stop.load(SeqCst) {
                    let id = (c << 32) + out.sent;
                    out.sent += 1;
                    match client.model_infer(request(id, 1)).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            out.answered.push(id_of(&r));
                            *out.served_by.entry(open_inference::served_by(&r).to_string()).or_default() += 1;
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
    let (ba, bb) = (backend("a", "mobilenet", a.addr, 3), backend("b", "mobilenet", b.addr, 4));
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
    let backends = || vec![backend("big", "resnet50", big.addr, 7), backend("small", "resnet50", small.addr, 1)];
    for (slo_ms, expect) in [(10.0, "small"), (4.0, "big")] {
        let r = router("resnet50", slo_ms, 1000, 0.2, backends());
        let mut client = serve_router(&r).await;
        for id in 0..5 {
            // One at a time: every decision sees empty queues.
            let resp = client.model_infer(request(id, 8)).await.unwrap().into_inner();
            assert_eq!(open_inference::served_by(&resp), expect, "SLO {slo_ms} ms");
            assert_eq!(open_inference::int_parameter(&resp.parameters, EXECUTED_BATCH), Some(8));
            // The answer is the service's, and the model's (an identity): the input back.
            assert_eq!((resp.model_name.as_str(), id_of(&resp)), ("svc", id));
            assert_eq!(open_inference::fp32_output(&resp, 0), Some(vec![id as f32; 32]));
        }
        let wrong = client.model_infer(ModelInferRequest { model_name: "other".into(), ..request(9, 1) }).await.unwrap_err();
        assert_eq!(wrong.code(), Code::NotFound);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_infer_drains_in_flight_requests_and_refuses_new_ones() {
    // ≈ 1.5 s per batch, so the drain is certainly still waiting when the probe arrives.
    let sim = start_sim("s", "resnet50", 1, 100.0).await;
    let mut client = InferenceClient::connect(format!("http://{}", sim.addr)).await.unwrap();
    // sim-infer serves its model under the model's own name.
    let request = |id: u64, batch: u32| ModelInferRequest { model_name: "resnet50".into(), ..request(id, batch) };
    let in_flight: Vec<_> = (0..3)
        .map(|i| {
            let mut c = client.clone();
            tokio::spawn(async move { c.model_infer(request(i, 1)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(sim.drain_and_stop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = client.model_infer(request(99, 1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    let ready = client.model_ready(ModelReadyRequest { name: "resnet50".into(), version: String::new() }).await.unwrap();
    assert!(!ready.into_inner().ready);
    for (i, t) in in_flight.into_iter().enumerate() {
        assert_eq!(id_of(&t.await.unwrap().unwrap().into_inner()), i as u64);
    }
    stopping.await.unwrap().unwrap();
}

fn token_digest(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn with_token(req: ModelInferRequest, token: Option<&str>) -> tonic::Request<ModelInferRequest> {
    let mut r = tonic::Request::new(req);
    if let Some(t) = token {
        r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

/// Concurrent senders with `token` until `stop`: the codes of their answers.
fn flood(client: &InferenceClient, senders: u64, token: Option<&'static str>, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<Vec<Code>>> {
    (0..senders)
        .map(|c| {
            let (mut client, stop) = (client.clone(), Arc::clone(stop));
            tokio::spawn(async move {
                let mut codes = Vec::new();
                while !stop.load(SeqCst) {
                    let code = match client.model_infer(with_token(request(c, 1), token)).await {
                        Ok(_) => Code::Ok,
                        Err(s) => s.code(),
                    };
                    codes.push(code);
                }
                codes
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listed_tokens_are_served_their_share_under_a_flood_and_anonymous_callers_are_refused() {
    // resnet50 on 1g, × 5: about 40 ms a batch of 8, so a flood fills the router.
    let sim = start_sim("s", "resnet50", 1, 5.0).await;
    let r = router("resnet50", 1000.0, 1000, 5.0, vec![backend("s", "resnet50", sim.addr, 1)]);
    r.set_callers(node_agent::router::Callers::from_hex([token_digest("victim").as_str(), token_digest("noisy").as_str()]));
    let mut client = serve_router(&r).await;
    let stop = Arc::new(AtomicBool::new(false));
    // 64 anonymous senders and 64 with a listed token, against a bound of 4 batches of 8.
    let anonymous = flood(&client, 64, None, &stop);
    let noisy = flood(&client, 64, Some("noisy"), &stop);
    let wrong = flood(&client, 4, Some("not-listed"), &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The victim, one request at a time meanwhile: every one served.
    for id in 0..20 {
        let answer = client.model_infer(with_token(request(1_000 + id, 1), Some("victim"))).await;
        assert!(answer.is_ok(), "the victim's request {id}: {answer:?}");
    }
    stop.store(true, SeqCst);
    let codes = |tasks: Vec<JoinHandle<Vec<Code>>>| async move {
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    };
    let anonymous = codes(anonymous).await;
    assert!(!anonymous.is_empty() && anonymous.iter().all(|c| *c == Code::Unauthenticated), "{anonymous:?}");
    let wrong = codes(wrong).await;
    assert!(!wrong.is_empty() && wrong.iter().all(|c| *c == Code::Unauthenticated));
    let noisy = codes(noisy).await;
    assert!(noisy.contains(&Code::Ok), "the noisy token is served its share");
    assert!(noisy.contains(&Code::ResourceExhausted), "and shed past it");
    assert!(noisy.iter().all(|c| matches!(c, Code::Ok | Code::ResourceExhausted)), "{noisy:?}");
    assert_eq!(r.in_flight(), 0);
    sim.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_is_refused_by_the_router_before_any_backend_sees_it() {
    // A backend nothing listens on: whatever reached it would fail UNAVAILABLE instead.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let r = router("resnet50", 100.0, 1000, 1.0, vec![backend("gone", "resnet50", dead, 1)]);
    let mut client = serve_router(&r).await;
    let mut wrong_bytes = request(1, 2);
    wrong_bytes.raw_input_contents[0].truncate(3);
    let mut huge = request(2, 1);
    huge.inputs[0].shape = vec![1 << 20, 1 << 20];
    let mut no_inputs = request(3, 1);
    no_inputs.inputs.clear();
    let mut no_such_type = request(5, 1);
    no_such_type.inputs[0].datatype = "FP33".into();
    let mut wrong_shape = request(6, 2);
    wrong_shape.inputs[0].shape = vec![2, -4];
    let cases = [
        (wrong_bytes, "raw_input_contents[0]"),
        (huge, "inputs[0].shape"),
        (no_inputs, "inputs"),
        (no_such_type, "inputs[0].datatype"),
        (wrong_shape, "inputs[0].shape[1]"),
    ];
    for (bad, field) in cases {
        let refused = client.model_infer(bad).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");
        assert_eq!(refused.metadata().get(proto::meta::FIELD).unwrap().to_str().unwrap(), field);
    }
    let elsewhere = client.model_infer(ModelInferRequest { model_name: "other".into(), ..request(7, 1) }).await.unwrap_err();
    assert_eq!(elsewhere.code(), Code::NotFound, "{elsewhere}");
    assert_eq!(r.active().backends()[0].in_flight(), 0);
    // A well-formed one is forwarded (and fails only because nothing serves it).
    assert_eq!(client.model_infer(request(4, 1)).await.unwrap_err().code(), Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_backend_fails_under_is_sent_again_to_another() {
    let live = start_sim("live", "resnet50", 3, 0.1).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // Both active: whatever ELSA sends to the dead one is answered by the live one.
    let r = router("resnet50", 100.0, 1000, 0.1, vec![backend("dead", "resnet50", dead, 7), backend("live", "resnet50", live.addr, 3)]);
    let mut client = serve_router(&r).await;
    for id in 0..20 {
        let answer = client.model_infer(request(id, 1)).await.unwrap().into_inner();
        assert_eq!(open_inference::served_by(&answer), "live");
    }
    // Only the dead one active: a request waits for the set to change (a shadow taking
    // over) and is answered by the new backend.
    r.set_active(vec![backend("dead", "resnet50", dead, 7)]);
    let resends_before = r.counts().resends;
    let pending = tokio::spawn({
        let mut client = client.clone();
        async move { client.model_infer(request(99, 1)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.set_active(vec![backend("live-2", "resnet50", live.addr, 3)]);
    let answer = pending.await.unwrap().unwrap().into_inner();
    assert_eq!((id_of(&answer), open_inference::served_by(&answer)), (99, "live"));
    let resends = r.counts().resends;
    assert!(resends > resends_before, "the resend is counted: {resends}");
    // A refusal of the request itself is not sent again: it would be refused anywhere.
    let wrong = client.model_infer(ModelInferRequest { model_name: "svc".into(), ..request(5, 64) }).await.unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument, "{wrong}");
    assert_eq!(r.counts().resends, resends);
    live.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_nobody_serves_is_not_found_at_the_router_and_a_served_one_is_forwarded() {
    let sim = start_sim("v", "resnet50", 3, 0.1).await;
    let r = router("resnet50", 100.0, 1000, 0.1, vec![backend("v", "resnet50", sim.addr, 3)]);
    let mut client = serve_router(&r).await;
    let served = client.model_infer(ModelInferRequest { model_version: "1".into(), ..request(1, 1) }).await.unwrap();
    assert_eq!(id_of(served.get_ref()), 1);
    let refused = client.model_infer(ModelInferRequest { model_version: "2".into(), ..request(2, 1) }).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused}");
    assert_eq!(refused.metadata().get(proto::meta::FIELD).unwrap().to_str().unwrap(), "model_version");
    assert!(refused.message().contains("served: [\"1\"]"), "the router refused it, naming what is served: {refused}");
    sim.drain_and_stop().await.unwrap();
}

/// A backend that misbehaves at the connection: it accepts and then never answers, closes
/// at once (a reset: the client's bytes are unread), or answers bytes that are not HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Misbehaving {
    Hangs,
    Resets,
    Garbage,
}

async fn misbehaving_backend(how: Misbehaving) -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            match how {
                Misbehaving::Hangs => held.push(stream),
                Misbehaving::Resets => drop(stream),
                Misbehaving::Garbage => {
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n\x00\xff\xfe not a frame \x07\x07\x07\x07\x07\x07\x07\x07\x07").await;
                    held.push(stream);
                }
            }
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_that_hang_reset_or_answer_garbage_fail_their_requests_and_stall_no_other_service() {
    let good = start_sim("good", "resnet50", 3, 0.1).await;
    let web = router("resnet50", 100.0, 1000, 0.1, vec![backend("good", "resnet50", good.addr, 3)]);
    let mut web_client = serve_router(&web).await;
    let mut bad_routers = Vec::new();
    let mut pending = Vec::new();
    for how in [Misbehaving::Hangs, Misbehaving::Resets, Misbehaving::Garbage] {
        let addr = misbehaving_backend(how).await;
        let config = RouterConfig { backend_deadline_floor: Duration::from_millis(300), ..RouterConfig::new("svc", 10.0) };
        let times = Arc::new(ShapeServiceTime { shape: model_shape("resnet50").unwrap(), time_scale: 0.1 });
        let r = Router::new(config, times, vec![backend(&format!("{how:?}"), "resnet50", addr, 3)]).unwrap();
        let client = serve_router(&r).await;
        for id in 0..4 {
            let mut client = client.clone();
            pending.push((how, tokio::spawn(async move { client.model_infer(request(id, 1)).await })));
        }
        bad_routers.push(r);
    }
    // While the misbehaving backends hold their requests, another service is served.
    for id in 0..30 {
        let answer = web_client.model_infer(request(id, 1)).await.unwrap_or_else(|e| panic!("request {id}: {e}"));
        assert_eq!(id_of(answer.get_ref()), id);
    }
    // Each request on a misbehaving backend ends, with the backend's failure.
    for (how, call) in pending {
        let failure = call.await.unwrap().expect_err("a misbehaving backend answers nothing");
        match how {
            Misbehaving::Hangs => {
                assert_eq!(failure.code(), Code::DeadlineExceeded, "{failure}");
                assert!(failure.message().contains("backend `Hangs` did not answer in 300 ms"), "{failure}");
            }
            _ => assert!(
                matches!(failure.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
                "{how:?}: {failure}"
            ),
        }
    }
    for r in &bad_routers {
        assert_eq!(r.in_flight(), 0, "nothing is left in flight");
        assert_eq!(r.active().backends()[0].in_flight(), 0);
    }
    good.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_refused_and_a_slow_client_stalls_nobody() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sim = start_sim("s", "resnet50", 3, 0.1).await;
    let r = router("resnet50", 100.0, 1000, 0.1, vec![backend("s", "resnet50", sim.addr, 3)]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(r.clone(), listener, std::future::pending()));
    let mut client = InferenceClient::connect(format!("http://{addr}")).await.unwrap();

    // A slow client: half a REST request, then nothing, on a connection it keeps open.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /v2/models/svc/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n{\"inputs\": [").await.unwrap();

    // A REST body declared over the message limit is refused before it is read.
    let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v2/models/svc/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        open_inference::MAX_MESSAGE_BYTES + 1
    );
    big.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 64];
    let n = big.read(&mut answer).await.unwrap();
    let status_line = String::from_utf8_lossy(&answer[..n]).lines().next().unwrap_or_default().to_string();
    assert!(status_line.contains(" 413 "), "{status_line}");

    // A gRPC message over the limit is refused by the router's decoder.
    let mut over = request(1, 1);
    over.raw_input_contents[0] = vec![0u8; open_inference::MAX_MESSAGE_BYTES + 1].into();
    let refused = client.model_infer(over).await.unwrap_err();
    assert!(matches!(refused.code(), Code::OutOfRange | Code::ResourceExhausted), "{refused}");

    // Meanwhile the service is served, and the slow client has stalled no one.
    for id in 0..20 {
        assert_eq!(id_of(client.model_infer(request(id, 1)).await.unwrap().get_ref()), id);
    }
    assert_eq!(r.in_flight(), 0);
    drop(slow);
    sim.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holding_every_connection_of_its_endpoint_takes_none_from_another_service() {
    use node_agent::router::connections::MAX_ROUTER_CONNECTIONS;
    use tokio::io::AsyncReadExt;
    let sim = start_sim("s", "resnet50", 3, 0.1).await;
    let flooded = router("resnet50", 100.0, 1000, 0.1, vec![backend("s", "resnet50", sim.addr, 3)]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(flooded.clone(), listener, std::future::pending()));
    // A client connected before the flood keeps its connection and its service.
    let mut held = InferenceClient::connect(format!("http://{addr}")).await.unwrap();
    assert_eq!(id_of(held.model_infer(request(1, 1)).await.unwrap().get_ref()), 1);
    let other = router("resnet50", 100.0, 1000, 0.1, vec![backend("s", "resnet50", sim.addr, 3)]);
    let mut other_client = serve_router(&other).await;

    // The flood: idle connections until the endpoint is full.
    let mut idle = Vec::new();
    for _ in 0..MAX_ROUTER_CONNECTIONS - 1 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // One more is accepted by the kernel, then closed by the router: it reads end of file.
    let mut past = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), past.read(&mut buf)).await.expect("the router closes it");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // A new client of the full endpoint is not served; the held one and the other service are.
    if let Ok(mut late) = InferenceClient::connect(format!("http://{addr}")).await {
        assert!(late.model_infer(request(2, 1)).await.is_err(), "a new client of a full endpoint is not served");
    }
    for id in 10..20 {
        assert_eq!(id_of(held.model_infer(request(id, 1)).await.unwrap().get_ref()), id);
        assert_eq!(id_of(other_client.model_infer(request(id, 1)).await.unwrap().get_ref()), id);
    }
    assert!(flooded.counts().connections_refused >= 1, "{:?}", flooded.counts());
    assert_eq!(other.counts().connections_refused, 0);
    // The flood ends: its slots come back.
    drop(idle);
    let mut fresh = None;
    for _ in 0..100 {
        if let Ok(mut c) = InferenceClient::connect(format!("http://{addr}")).await {
            if c.model_infer(request(30, 1)).await.is_ok() {
                fresh = Some(c);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fresh.is_some(), "a client after the flood is served");
    sim.drain_and_stop().await.unwrap();
}
