//! Logs and, when an OTLP endpoint is configured (`otlp_endpoint` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), span export: a reconcile round that changes something is
//! an `agent.reconcile` span (the desired-state version it applies) with one
//! `agent.action` child per step, in the trace of the controller's pass that committed the
//! plan.

pub use telemetry_otlp::{init, otlp_endpoint, TracingGuard};

use crate::desired::NodeDesired;
use crate::reconcile::Step;

/// The span of a reconcile round that executes `steps` steps towards `desired`: a child of
/// the controller's pass that committed the plan, when its trace came along.
pub fn reconcile_span(desired: &NodeDesired, steps: usize) -> tracing::Span {
    let span = tracing::info_span!("agent.reconcile", desired_version = desired.version, steps);
    telemetry_otlp::continue_trace(&span, &desired.trace_parent);
    span
}

/// The span of one step.
pub fn action_span(step: &Step) -> tracing::Span {
    tracing::info_span!("agent.action", step = ?step)
}
