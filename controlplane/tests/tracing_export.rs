//! Traces reach an OTLP collector (an in-process TraceService server) with the request's
//! context carried across gRPC: client span → `grpc.request` on the leader →
//! `raft.proposal`, and the entry's `raft.apply` names the same request.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
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

    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    let root = tracing::info_span!("test.client");
    client.put(base_resources().remove(0), proto::WriteMode::Unspecified).instrument(root).await.unwrap();

    let named = |name: &str| collector.spans.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect::<Vec<_>>();
    let mut waited = Duration::ZERO;
    while named("raft.apply").len() < 3 || named("test.client").is_empty() {
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
    // Requests that reached a follower first were refused there: the leader's is the one
    // with the proposal under it.
    let requests: Vec<Span> = named("grpc.request").into_iter().filter(|s| s.trace_id == client_span.trace_id).collect();
    assert!(!requests.is_empty(), "no grpc.request span continues the client's trace");
    for r in &requests {
        assert_eq!(r.parent_span_id, client_span.span_id, "grpc.request's parent is the client span");
        assert_eq!(string_attribute(r, "rpc").as_deref(), Some("/gpuplane.v1.ControlPlane/Put"));
    }
    let proposal = named("raft.proposal")
        .into_iter()
        .find(|p| p.trace_id == client_span.trace_id)
        .expect("a raft.proposal span in the client's trace");
    assert!(requests.iter().any(|r| r.span_id == proposal.parent_span_id), "raft.proposal's parent is a grpc.request span");
    let request_id = string_attribute(&proposal, "request_id").expect("raft.proposal names its request");
    let applied = named("raft.apply").into_iter().filter(|a| string_attribute(a, "request_id").as_deref() == Some(&request_id)).count();
    assert_eq!(applied, 3, "every controller applies the entry, each in a raft.apply span naming the request");
}
