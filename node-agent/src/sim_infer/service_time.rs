//! ELSA's service-time table from the synthetic model, for routers in front of simulated
//! processes in tests and benchmarks (the agent's routers price partitions with the
//! planner's predictions instead, `router::PlannedServiceTimes`).

use planner::perf::synthetic::ModelShape;
use planner::policy::elsa::ServiceTimeModel;

/// One process per partition, batch time × `time_scale` (match the backends' own scale).
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
