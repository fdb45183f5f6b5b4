//! Logs and, when an OTLP endpoint is configured, OpenTelemetry traces: a client request
//! carries its W3C trace context in gRPC metadata (`traceparent`), the controller continues
//! that trace (`grpc.request` → `raft.proposal`), the log entry carries it to every
//! controller's `raft.apply`, a provisioning pass continues the trace of the change that
//! triggered it (`provision.pass` → `raft.proposal` of the plan), and the committed Plan
//! carries it on to the agents (`agent.reconcile`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use telemetry_otlp::{init, otlp_endpoint, TracingGuard, OTLP_ENDPOINT_ENV};

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes());
        if let (Ok(key), Ok(value)) = (key, value.parse()) {
            self.0.insert(key, value);
        }
    }
}

/// Puts the current span's trace context into an outgoing request's metadata; nothing
/// when traces are not exported.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut MetadataInjector(metadata)));
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// A tower layer for the gRPC server: every request runs in a `grpc.request` span that
/// continues the caller's trace when its metadata carries one.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceContextLayer;

impl<S> tower::Layer<S> for TraceContextLayer {
    type Service = TraceContextService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        TraceContextService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct TraceContextService<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for TraceContextService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let span = tracing::info_span!("grpc.request", rpc = %request.uri().path());
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
        // Without a layer that exports, there is no trace to continue: nothing to do.
        let _ = span.set_parent(parent);
        let response = self.inner.call(request);
        Box::pin(response.instrument(span))
    }
}
