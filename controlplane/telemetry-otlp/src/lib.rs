//! The subscriber of the gpuplane binaries: `RUST_LOG`-filtered logs on stderr and, when an
//! OTLP endpoint is configured, span export over OTLP/gRPC with W3C trace-context
//! propagation. Shared by the controller and the node agent.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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

/// The current span's W3C `traceparent`, to carry a trace where gRPC metadata does not go
/// (a Raft log entry, a Plan, an agent's desired state). `None` when no span is exported:
/// then nothing extra is written, and runs without an endpoint stay byte-for-byte the same.
pub fn current_traceparent() -> Option<String> {
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let mut carrier = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut carrier);
    carrier.remove("traceparent").filter(|t| !t.is_empty())
}

/// Makes `span` continue the trace named by `traceparent` (from [`current_traceparent`]);
/// nothing when it is empty or malformed, or when spans are not exported.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if traceparent.is_empty() {
        return;
    }
    let carrier = std::collections::HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    if parent.span().span_context().is_valid() {
        // Without an exporting layer there is no trace to continue: nothing to do.
        let _ = span.set_parent(parent);
    }
}
