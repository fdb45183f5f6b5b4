//! Traces across processes, received by an in-process OTLP collector: the test's client span
//! is continued by a controller process (`grpc.request` → `raft.proposal`), and the agent
//! process applies the plan in an `agent.reconcile` span of the same trace (the Plan carries
//! the trace of the write that committed it) with an `agent.action` per step.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controlplane::client::Client;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use tests::{binary, Cluster, Proc};
use tracing::Instrument;

/// Spans received, with the `service.name` of the process that sent them.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for r in request.into_inner().resource_spans {
            let service = r.resource.as_ref().and_then(|res| res.attributes.iter().find(|a| a.key == "service.name")).and_then(string);
            for s in r.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push((service.clone().unwrap_or_default(), s));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn string(kv: &opentelemetry_proto::tonic::common::v1::KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

impl Collector {
    fn named(&self, service: &str, name: &str) -> Vec<Span> {
        self.spans.lock().unwrap().iter().filter(|(svc, s)| svc == service && s.name == name).map(|(_, s)| s.clone()).collect()
    }
}

fn resource(kind: &str, name: &str, spec: serde_json::Value) -> proto::Resource {
    let tenant = if kind == "Service" { "acme" } else { "" };
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

fn start_agent(dir: &Path, servers: &[String], otlp: &str) -> Proc {
    let config = format!(
        "node = \"n1\"\ncontrollers = {servers:?}\ninstance_type = \"one\"\nstate_dir = \"{state}\"\ninterval_ms = 200\ninsecure = true\n\
         otlp_endpoint = \"{otlp}\"\n[sim]\ngpus = [\"A100-80GB\"]\n[template]\nkind = \"command\"\nprogram = \"{sim_infer}\"\n\
         args = [\"--listen=127.0.0.1:{{port}}\", \"--model={{model}}\", \"--mig-gpcs={{gpcs}}\"]\n",
        state = dir.join("agent").display(),
        sim_infer = binary("sim-infer").display(),
    );
    tests::node_agent(dir, &config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_write_and_the_agent_reconcile_are_traced_across_processes() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let tracing = controlplane::telemetry::tracing::init("gpuplane-test", "off", Some(&otlp)).unwrap();

    let cluster = Cluster::start_with(&["--no-loops", "--otlp-endpoint", &otlp]);
    let client = Client::new(cluster.servers());
    for r in [
        resource("Tenant", "acme", json!({})),
        resource("GpuModel", "A100-80GB", json!({"sm_count": 108, "memory_gib": 80})),
        resource("InstanceType", "one", json!({"gpu_model": "A100-80GB", "gpu_count": 1, "price_per_hour": 4, "launch_latency_s": 60})),
        resource(
            "ModelProfile",
            "resnet50-a100",
            json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 8, "throughput_rps": 400, "latency_ms": 18}]}),
        ),
        resource("Service", "web", json!({"model": "resnet50", "slo": {"latency_ms": 2000, "request_rate": 100}})),
    ] {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap();
    }
    let _agent = start_agent(cluster.dir.path(), &cluster.servers(), &otlp);
    let log = cluster.dir.path().join("agent.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    let gpu = loop {
        let node = client.get("Node", "n1", false).await.ok();
        if let Some(uuid) = node
            .and_then(|n| serde_json::from_str::<serde_json::Value>(&n.spec_json).ok())
            .and_then(|s| s["gpus"][0]["uuid"].as_str().map(String::from))
        {
            break uuid;
        }
        assert!(Instant::now() < deadline, "the agent did not register: {}", std::fs::read_to_string(&log).unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The plan, written under the test's own span: one trace from here into the leader.
    let plan = resource(
        "Plan",
        "current",
        json!({"strategy": "test", "gpus": [{"node": "n1", "gpu_uuid": gpu, "mig_layout": [{"profile": "3g", "start": 0}],
               "workloads": [{"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": 8, "shadow_mps_percent": 0}]}]}),
    );
    client.put(plan, proto::WriteMode::Unspecified).instrument(tracing::info_span!("test.write-plan")).await.unwrap();
    tracing.flush();

    let deadline = Instant::now() + Duration::from_secs(30);
    let (root, proposal, reconcile, actions) = loop {
        let root = collector.named("gpuplane-test", "test.write-plan").pop();
        let proposal = root.as_ref().and_then(|root| {
            // The contacted controller's span is the client span's child; a follower forwards
            // the write to the leader, whose span is a child of the follower's.
            let requests: BTreeMap<Vec<u8>, Span> = collector
                .named("gpuplane-controller", "grpc.request")
                .into_iter()
                .filter(|r| r.trace_id == root.trace_id)
                .map(|r| (r.span_id.clone(), r))
                .collect();
            if !requests.values().any(|r| r.parent_span_id == root.span_id) {
                return None;
            }
            collector.named("gpuplane-controller", "raft.proposal").into_iter().find(|p| requests.contains_key(&p.parent_span_id))
        });
        // The plan carries the trace of the write that committed it to the agent.
        let reconcile = root
            .as_ref()
            .and_then(|root| collector.named("gpuplane-agent", "agent.reconcile").into_iter().find(|r| r.trace_id == root.trace_id));
        let actions = reconcile
            .as_ref()
            .map(|r| collector.named("gpuplane-agent", "agent.action").into_iter().filter(|a| a.parent_span_id == r.span_id).count());
        let root_trace = root.as_ref().map(|r| r.trace_id.clone());
        let found = format!(
            "client span {}, proposal under it {}, reconcile in its trace {}, actions under it {actions:?}",
            root.is_some(),
            proposal.is_some(),
            reconcile.is_some()
        );
        if let (Some(root), Some(proposal), Some(reconcile), Some(actions @ 1..)) = (root, proposal, reconcile, actions) {
            break (root, proposal, reconcile, actions);
        }
        let mut received = BTreeMap::<(String, String), usize>::new();
        for (svc, s) in collector.spans.lock().unwrap().iter() {
            *received.entry((svc.clone(), s.name.clone())).or_default() += 1;
        }
        let in_root_trace: Vec<(String, String, bool)> = collector
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| root_trace.as_ref() == Some(&s.trace_id))
            .map(|(svc, s)| (svc.clone(), s.name.clone(), s.parent_span_id.is_empty()))
            .collect();
        assert!(Instant::now() < deadline, "{found}; received: {received:?}; in the client's trace: {in_root_trace:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(proposal.trace_id, root.trace_id, "the controller process continued the client's trace");
    assert_eq!(reconcile.trace_id, root.trace_id, "the agent process continued the trace of the plan's write");
    assert!(reconcile.attributes.iter().any(|a| a.key == "desired_version"), "agent.reconcile names the desired version");
    assert!(actions >= 1);
}
