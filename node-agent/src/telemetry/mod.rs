//! Observability: Prometheus series (`/metrics`) and the `/healthz` and `/readyz` probes on
//! `metrics_listen`.

mod http;
mod metrics;

pub use http::{serve, Response};
pub use metrics::{AgentMetrics, AgentSnapshot};
