//! Observability: Prometheus series (`/metrics`) and the `/healthz` and `/readyz` probes on
//! `metrics_listen`.

mod metrics;
pub mod tracing;

pub use metrics::{AgentMetrics, AgentSnapshot};
pub use telemetry_http::{serve, Response};
