//! Real clients against gpuplane's data plane: NVIDIA's `tritonclient` (installed by
//! `deploy/real-servers/install.sh`) talks to a router endpoint over the Open Inference
//! Protocol unchanged, over gRPC and over HTTP/REST (and curl), and every answer is the
//! model's (sim-infer's identity model), not only a status.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use node_agent::router::{serve, Backend, BackendSpec, Router, RouterConfig};
use node_agent::sim_infer::{self, model_shape, Placement, ShapeServiceTime, SimInferConfig};
use serde_json::Value;

/// sim-infer (resnet50, an identity model) behind a router serving service `web`; the
/// router's address and the server to stop.
async fn endpoint() -> (String, sim_infer::SimInferHandle) {
    let config = SimInferConfig {
        id: "web-1".into(),
        model: "resnet50".into(),
        placement: Placement { mig_gpcs: 3, time_scale: 0.1, ..Placement::default() },
        max_batch: 8,
        batch_window: Duration::from_micros(500),
        seed: 1,
    };
    let sim = sim_infer::spawn(config, "127.0.0.1:0").await.unwrap();
    let backend = Backend::connect_lazy(BackendSpec {
        id: "web-1".into(),
        addr: sim.addr.to_string(),
        gpcs: 3,
        max_batch: 8,
        model: "resnet50".into(),
    })
    .unwrap();
    let config = RouterConfig::new("web", 100.0);
    let times = Arc::new(ShapeServiceTime { shape: model_shape("resnet50").unwrap(), time_scale: 0.1 });
    let router = Router::new(config, times, vec![backend]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    tokio::spawn(serve(router, listener, std::future::pending()));
    (endpoint, sim)
}

/// Runs one of `tests/clients/` with the real servers' Python against `endpoint`; what it
/// printed, parsed.
async fn run_client(script: &str, endpoint: &str) -> (Value, String) {
    let python = tests::real_servers().join("venv/bin/python");
    let script = format!("{}/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let endpoint = endpoint.to_string();
    let out =
        tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(&endpoint).arg("web").output()).await.unwrap().unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the client run failed:\n{printed}");
    let seen = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap_or_else(|e| panic!("{e}:\n{printed}"));
    (seen, printed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_over_grpc_is_served_through_a_router_endpoint() {
    let (endpoint, sim) = endpoint().await;
    let (seen, printed) = run_client("oip_grpc_client.py", &endpoint).await;
    assert_eq!((&seen["live"], &seen["ready"], &seen["model_ready"]), (&Value::Bool(true), &Value::Bool(true), &Value::Bool(true)));
    assert_eq!(seen["metadata_name"], "web", "{printed}");
    assert_eq!(seen["metadata_inputs"], serde_json::json!(["INPUT0"]));
    assert_eq!(seen["output_matches"], true, "{printed}");
    assert_eq!((&seen["response_id"], &seen["response_model"]), (&Value::from("req-1"), &Value::from("web")));
    let unknown = seen["unknown_model"].as_str().unwrap();
    assert!(unknown.contains("NOT_FOUND") && unknown.contains("not served here"), "{unknown}");
    sim.drain_and_stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_over_http_and_curl_are_served_through_the_same_endpoint() {
    let (endpoint, sim) = endpoint().await;
    let (seen, printed) = run_client("oip_http_client.py", &endpoint).await;
    assert_eq!((&seen["live"], &seen["ready"], &seen["model_ready"]), (&Value::Bool(true), &Value::Bool(true), &Value::Bool(true)));
    assert_eq!(seen["metadata_name"], "web", "{printed}");
    assert_eq!((&seen["output_matches"], &seen["response_id"]), (&Value::Bool(true), &Value::from("req-2")), "{printed}");
    let unknown = seen["unknown_model"].as_str().unwrap();
    assert!(unknown.contains("404") && unknown.contains("not served here"), "{unknown}");

    // curl, as README shows it: a nested JSON tensor in, the model's answer out.
    let body = r#"{"id": "c1", "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [[0.5, 1, 2]]}]}"#;
    let curl = |args: Vec<String>| {
        // The router serves on this runtime's other worker meanwhile.
        let out = tokio::task::block_in_place(|| Command::new("curl").args(["-s", "-w", "\n%{http_code}"]).args(args).output())
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').map(|(b, c)| (b.to_string(), c.to_string())).unwrap_or_default();
        (code, body)
    };
    let url = format!("http://{endpoint}/v2/models/web/infer");
    let (code, answer) = curl(vec!["-H".into(), "content-type: application/json".into(), "-d".into(), body.into(), url.clone()]);
    assert_eq!(code, "200", "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["outputs"][0]["data"], serde_json::json!([0.5, 1.0, 2.0]));
    assert_eq!((&answer["id"], &answer["model_name"]), (&Value::from("c1"), &Value::from("web")));
    // A body that does not match its shape: 400 naming the field, nothing forwarded.
    let bad = r#"{"inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": "FP32", "data": [1, 2]}]}"#;
    let (code, answer) = curl(vec!["-d".into(), bad.into(), url.clone()]);
    assert_eq!(code, "400", "{answer}");
    assert!(answer.contains("inputs[0].contents"), "{answer}");
    let (code, _) = curl(vec!["-d".into(), "{not json".into(), url]);
    assert_eq!(code, "400");
    let (code, answer) = curl(vec![format!("http://{endpoint}/v2/health/ready")]);
    assert_eq!((code.as_str(), answer.as_str()), ("200", r#"{"ready":true}"#));
    sim.drain_and_stop().await.unwrap();
}
