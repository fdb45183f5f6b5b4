//! Traces reach an OTLP collector (an in-process TraceService server) with the request's
//! context carried across gRPC and through the Raft log: client span → `grpc.request` on
//! the leader → `raft.proposal` → `raft.apply` on every controller → the `provision.pass`
//! the change triggers → the `raft.proposal` of the new plan → its `raft.apply`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use controlplane::loops::LoopSettings;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tracing::Instrument;

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        self.spans.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn string_attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_is_one_trace_from_the_client_to_the_raft_proposal() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let guard = controlplane::telemetry::tracing::init("gpuplane-test", "off", Some(&endpoint)).unwrap();

    // Only change-triggered provisioning passes: a periodic one would start a trace of its own.
    let loops = LoopSettings { provision_interval: Duration::from_secs(3600), tuner: false, ..LoopSettings::default() };
    let cluster = TestCluster::start_with_loops(3, fast_settings(), loops).await;
    let client = cluster.client();
    // The new leader's first pass (of the empty state) is a trace of its own: wait it out.
    let mut waited = Duration::ZERO;
    while client.get("Plan", "current", false).await.is_err() {
        assert!(waited < Duration::from_secs(20), "the leader committed no first plan");
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    let root = tracing::info_span!("test.client");
    async {
        // A Service, so the plan changes (a pass whose plan places the same as the committed
        // one commits nothing).
        for r in base_resources().into_iter().chain([service("web", 100.0, 50.0)]) {
            client.put(r, proto::WriteMode::Unspecified).await.unwrap();
        }
    }
    .instrument(root)
    .await;

    let named = |name: &str| collector.spans.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect::<Vec<_>>();
    let mut waited = Duration::ZERO;
    let plan_applied_in_trace = || {
        let client_trace = named("test.client").first().map(|c| c.trace_id.clone());
        let passes: Vec<Vec<u8>> =
            named("provision.pass").into_iter().filter(|p| Some(&p.trace_id) == client_trace.as_ref()).map(|p| p.span_id).collect();
        let plan_proposals: Vec<String> = named("raft.proposal")
            .into_iter()
            .filter(|p| passes.contains(&p.parent_span_id))
            .filter_map(|p| string_attribute(&p, "request_id"))
            .collect();
        named("raft.apply")
            .into_iter()
            .filter(|a| Some(&a.trace_id) == client_trace.as_ref())
            .filter(|a| string_attribute(a, "request_id").is_some_and(|id| plan_proposals.contains(&id)))
            .count()
            == 3
    };
    while named("test.client").is_empty() || !plan_applied_in_trace() {
        assert!(
            waited < Duration::from_secs(20),
            "spans not exported: {:?}",
            collector.spans.lock().unwrap().iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        guard.flush();
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }

    let client_span = named("test.client").remove(0);
    // A write that reaches a follower is forwarded: the leader's request is then the child
    // of the follower's. The leader's is the one with the proposal under it.
    let requests: Vec<Span> = named("grpc.request").into_iter().filter(|s| s.trace_id == client_span.trace_id).collect();
    let request_ids: Vec<Vec<u8>> = requests.iter().map(|r| r.span_id.clone()).collect();
    assert!(requests.iter().any(|r| r.parent_span_id == client_span.span_id), "no grpc.request span continues the client's span");
    for r in &requests {
        assert!(
            r.parent_span_id == client_span.span_id || request_ids.contains(&r.parent_span_id),
            "grpc.request's parent is the client span or the follower's request that forwarded it"
        );
        assert_eq!(string_attribute(r, "rpc").as_deref(), Some("/gpuplane.v1.ControlPlane/Put"));
    }
    let proposal = named("raft.proposal")
        .into_iter()
        .find(|p| request_ids.contains(&p.parent_span_id))
        .expect("a raft.proposal under one of the client's requests");
    let request_id = string_attribute(&proposal, "request_id").expect("raft.proposal names its request");
    let applied: Vec<Span> =
        named("raft.apply").into_iter().filter(|a| string_attribute(a, "request_id").as_deref() == Some(&request_id)).collect();
    assert_eq!(applied.len(), 3, "every controller applies the entry, each in a raft.apply span naming the request");
    for a in &applied {
        assert_eq!(a.trace_id, client_span.trace_id, "raft.apply continues the writer's trace");
        assert_eq!(a.parent_span_id, proposal.span_id, "raft.apply's parent is the proposal");
    }
    // The wait above saw a provisioning pass in the client's trace commit a plan that every
    // controller applied in that trace too; the pass hangs under the leader's raft.apply of
    // one of the client's writes.
    let applies_in_trace: Vec<Vec<u8>> =
        named("raft.apply").into_iter().filter(|a| a.trace_id == client_span.trace_id).map(|a| a.span_id).collect();
    let pass = named("provision.pass").into_iter().find(|p| p.trace_id == client_span.trace_id).expect("a pass in the client's trace");
    assert!(applies_in_trace.contains(&pass.parent_span_id), "provision.pass's parent is the raft.apply of the triggering write");
}
