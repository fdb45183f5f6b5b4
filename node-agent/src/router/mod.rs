//! The per-service router of the node agent (ARCHITECTURE.md "Agent internals"): one local
//! endpoint, forwarding to the active backend(s), ELSA across partitions of different sizes,
//! per-second p99 / throughput / arrival-rate windows, and an atomic active-set switch.

pub mod backend;
pub mod queue;
pub mod service;
pub mod window;

pub use backend::{Backend, BackendAddrError, BackendSpec};
pub use service::{serve, ActiveSet, Router, RouterConfig, RouterError, Swap};
pub use window::{Window, WindowStats};

use planner::perf::synthetic::ModelShape;
use planner::policy::elsa::ServiceTimeModel;

/// ELSA's service-time table from the synthetic model: one process per partition, batch
/// time × `time_scale` (match the backends' own scale).
#[derive(Debug, Clone)]
pub struct ShapeServiceTime {
    pub shape: ModelShape,
    pub time_scale: f64,
}

impl ServiceTimeModel for ShapeServiceTime {
    fn service_time_ms(&self, gpcs: u32, batch: u32) -> Option<f64> {
        let gpcs = u8::try_from(gpcs).ok().filter(|g| (1..=7).contains(g))?;
        Some(self.shape.latency_ms(gpcs, batch, 1)? * self.time_scale)
    }
}
