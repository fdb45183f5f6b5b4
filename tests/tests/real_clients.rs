//! Real clients against gpuplane's data plane: NVIDIA's `tritonclient` (installed by
//! `deploy/real-servers/install.sh`) talks to a router endpoint over the Open Inference
//! Protocol unchanged, and every answer is the model's (sim-infer's identity model), not
//! only a status.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use node_agent::router::{serve, Backend, BackendSpec, Router, RouterConfig};
use node_agent::sim_infer::{self, model_shape, Placement, ShapeServiceTime, SimInferConfig};
use planner::policy::elsa::ElsaConfig;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_over_grpc_is_served_through_a_router_endpoint() {
    let python = tests::real_servers().join("venv/bin/python");
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
    let config = RouterConfig { service: "web".into(), slo_ms: 100.0, elsa: ElsaConfig::default(), window_ms: 1000 };
    let times = Arc::new(ShapeServiceTime { shape: model_shape("resnet50").unwrap(), time_scale: 0.1 });
    let router = Router::new(config, times, vec![backend]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    tokio::spawn(serve(router, listener, std::future::pending()));

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/oip_grpc_client.py");
    let out =
        tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(&endpoint).arg("web").output()).await.unwrap().unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the tritonclient run failed:\n{printed}");
    let seen: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap_or_else(|e| panic!("{e}:\n{printed}"));
    assert_eq!((&seen["live"], &seen["ready"], &seen["model_ready"]), (&Value::Bool(true), &Value::Bool(true), &Value::Bool(true)));
    assert_eq!(seen["metadata_name"], "web", "{printed}");
    assert_eq!(seen["metadata_inputs"], serde_json::json!(["INPUT0"]));
    assert_eq!(seen["output_matches"], true, "{printed}");
    assert_eq!((&seen["response_id"], &seen["response_model"]), (&Value::from("req-1"), &Value::from("web")));
    let unknown = seen["unknown_model"].as_str().unwrap();
    assert!(unknown.contains("NOT_FOUND") && unknown.contains("not served here"), "{unknown}");
    sim.drain_and_stop().await.unwrap();
}
