//! Logs and, when an OTLP endpoint is configured (`otlp_endpoint` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), span export: a reconcile round that changes something is
//! an `agent.reconcile` span (the desired-state version it applies) with one
//! `agent.action` child per step.

pub use telemetry_otlp::{init, otlp_endpoint, TracingGuard};

use crate::reconcile::Step;

/// The span of a reconcile round that executes `steps` steps towards desired `version`.
pub fn reconcile_span(version: u64, steps: usize) -> tracing::Span {
    tracing::info_span!("agent.reconcile", desired_version = version, steps)
}

/// The span of one step.
pub fn action_span(step: &Step) -> tracing::Span {
    tracing::info_span!("agent.action", step = ?step)
}
