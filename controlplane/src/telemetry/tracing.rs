//! Logs and, when an OTLP endpoint is configured, OpenTelemetry traces: a client request
//! carries its W3C trace context in gRPC metadata (`traceparent`), the controller continues
//! that trace (`grpc.request` → `raft.proposal`), and the provisioning pass is a trace of
//! its own (`provision.pass` → `raft.proposal` of the plan).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Instrument;
use tracing::Level;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;

/// The standard variable, used when the config names no endpoint.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Flushes and stops the exporter when dropped (at the end of `main`).
pub struct TracingGuard {
    provider: Option<SdkTracerProvider>,
}

impl TracingGuard {
    /// Exports every finished span now.
    pub fn flush(&self) {
        if let Some(p) = &self.provider {
            if let Err(e) = p.force_flush() {
                tracing::warn!(error = %e, "flushing spans failed");
            }
        }
    }
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// The endpoint from the config, else from `OTEL_EXPORTER_OTLP_ENDPOINT`; none (no export)
/// when both are unset or empty.
pub fn otlp_endpoint(configured: Option<&str>) -> Option<String> {
    configured.map(str::to_string).or_else(|| std::env::var(OTLP_ENDPOINT_ENV).ok()).filter(|e| !e.is_empty())
}

/// Installs the global subscriber: `RUST_LOG`-filtered logs (default `default_filter`) on
/// stderr, plus span export over OTLP/gRPC to `endpoint` (e.g. `http://collector:4317`)
/// as `service`. Must run inside a Tokio runtime (the exporter's channel lives there).
pub fn init(service: &str, default_filter: &str, endpoint: Option<&str>) -> Result<TracingGuard, String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let fmt = tracing_subscriber::fmt::layer().with_target(false).with_filter(filter);
    let Some(endpoint) = endpoint else {
        tracing_subscriber::registry().with(fmt).try_init().map_err(|e| e.to_string())?;
        return Ok(TracingGuard { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("otlp_endpoint {endpoint:?}: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service.to_string()).build())
        .build();
    // Its own filter, so that a quieter RUST_LOG does not thin the traces; below info the
    // exporter's own transport (tonic, h2) would trace itself.
    let spans = Targets::new().with_default(Level::INFO).with_target("openraft", Level::WARN);
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("gpuplane")).with_filter(spans);
    tracing_subscriber::registry().with(fmt).with(otel).try_init().map_err(|e| e.to_string())?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing::info!(endpoint, service, "exporting traces over OTLP");
    Ok(TracingGuard { provider: Some(provider) })
}

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
