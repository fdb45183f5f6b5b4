//! Observability: the controller's Prometheus series and the readiness rule of `/readyz`
//! (served by `crate::scrape`), and traces.

mod metrics;
mod readiness;
mod runtime_lag;
pub mod tracing;

pub use metrics::{ControllerMetrics, RaftFigures, ServiceSample, Snapshot};
pub use readiness::{readiness, UNREADY_AFTER_LOOP_FAILURES};
pub use runtime_lag::probe_runtime_lag;
pub use telemetry_http::{serve, Response};
