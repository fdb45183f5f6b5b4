//! The agent's `/metrics`, `/healthz` and `/readyz`.

use super::Agent;
use crate::telemetry::{serve, AgentSnapshot, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Agent {
    /// Serves `/metrics`, `/healthz` and `/readyz` on `metrics_listen`, if configured, for
    /// as long as the process runs; returns the bound address.
    pub async fn start_telemetry(self: &Arc<Self>) -> anyhow::Result<Option<std::net::SocketAddr>> {
        let Some(at) = self.cfg.metrics_listen else { return Ok(None) };
        let listener =
            tokio::net::TcpListener::bind(at).await.map_err(|e| anyhow::anyhow!("metrics_listen: cannot listen on {at}: {e}"))?;
        let addr = listener.local_addr()?;
        let me = self.clone();
        tokio::spawn(serve(listener, Arc::new(move |path: &str| me.probe(path))));
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        Ok(Some(addr))
    }

    fn probe(&self, path: &str) -> Response {
        match path {
            "/metrics" => {
                let observed = self.last_report.lock().expect("report lock").clone();
                Response::metrics(self.telemetry.render(&AgentSnapshot {
                    services: self.routers.metrics(),
                    observed,
                    busy: self.routers.busy_times(),
                    routers: self.routers.counts(),
                }))
            }
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => match self.readiness() {
                Ok(()) => Response::text(200, "ready\n"),
                Err(reason) => Response::text(503, format!("not ready: {reason}\n")),
            },
            _ => Response::text(404, "not found (try /metrics, /healthz, /readyz)\n"),
        }
    }

    /// Ready once registered with a controller, or while holding a desired state to run
    /// (static stability: an agent cut off from every controller still serves its plan).
    fn readiness(&self) -> Result<(), &'static str> {
        if self.registered.load(Ordering::Relaxed) || self.has_desired.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("not registered with a controller and no desired state yet")
        }
    }
}
