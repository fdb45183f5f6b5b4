//! Observability: Prometheus series (`/metrics`) and the `/healthz` and `/readyz` probes,
//! served over plain HTTP on a separate listener (`metrics_listen`), never on the Raft peer
//! port.

mod metrics;
mod scrape;
pub mod tracing;

pub use metrics::{ControllerMetrics, RaftFigures, ServiceSample, Snapshot};
pub use scrape::{readiness, snapshot};
pub use telemetry_http::{serve, Response};

use std::sync::Arc;

use crate::controller::Controller;

/// Serves `/metrics`, `/healthz` and `/readyz` for `controller` on `listener` until aborted.
pub async fn serve_controller(listener: tokio::net::TcpListener, controller: Controller) {
    serve(
        listener,
        Arc::new(move |path: &str| match path {
            "/metrics" => Response::metrics(controller.telemetry.render(&snapshot(&controller))),
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => {
                match readiness(&snapshot(&controller).raft, &controller.telemetry.failing_loops(scrape::UNREADY_AFTER_LOOP_FAILURES)) {
                    Ok(()) => Response::text(200, "ready\n"),
                    Err(reason) => Response::text(503, format!("not ready: {reason}\n")),
                }
            }
            _ => Response::text(404, "not found (try /metrics, /healthz, /readyz)\n"),
        }),
    )
    .await
}
