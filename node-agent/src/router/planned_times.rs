//! ELSA's service times (paris-elsa Sec. IV-C prices a batch on each partition size from a
//! profiled table) from what the controller planned: each process's desired state carries
//! the planner's predicted time of one batch of its `batch` in its slot. The router of a
//! service keeps one figure per partition size, updated as its processes change.
//!
//! A query of up to the process's batch costs one planned batch (a batch's time grows with
//! its size, so this never prices a partition as faster than planned); a larger query costs
//! as many batches as it needs. While any partition has no prediction (a plan written by
//! hand), every partition costs the same, and ELSA falls back to the shortest wait.

use planner::policy::elsa::ServiceTimeModel;
use std::collections::BTreeMap;
use std::sync::RwLock;

/// One partition size's planned batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannedBatch {
    /// Partition size in GPCs (7 for a whole GPU).
    pub gpcs: u32,
    /// The process's batch.
    pub batch: u32,
    /// Predicted time of that batch, ms; 0 when not known.
    pub batch_ms: f64,
}

#[derive(Debug, Default)]
pub struct PlannedServiceTimes {
    by_gpcs: RwLock<BTreeMap<u32, PlannedBatch>>,
}

impl PlannedServiceTimes {
    /// The service's partitions now. Of two processes on one partition size (MPS shares of
    /// whole GPUs), the slower per request counts, and one without a prediction makes the
    /// size unknown.
    pub fn set(&self, batches: impl IntoIterator<Item = PlannedBatch>) {
        let mut by_gpcs: BTreeMap<u32, PlannedBatch> = BTreeMap::new();
        for b in batches.into_iter().filter(|b| b.batch > 0) {
            let per_request = |b: &PlannedBatch| b.batch_ms / f64::from(b.batch);
            let keep = by_gpcs.get(&b.gpcs).is_some_and(|have| {
                // Not knowing one of them is not knowing the size.
                b.batch_ms > 0.0 && (have.batch_ms == 0.0 || per_request(have) >= per_request(&b))
            });
            if !keep {
                by_gpcs.insert(b.gpcs, b);
            }
        }
        *self.by_gpcs.write().unwrap_or_else(|p| p.into_inner()) = by_gpcs;
    }
}

impl ServiceTimeModel for PlannedServiceTimes {
    fn service_time_ms(&self, gpcs: u32, batch: u32) -> Option<f64> {
        let by_gpcs = self.by_gpcs.read().unwrap_or_else(|p| p.into_inner());
        let all_known = !by_gpcs.is_empty() && by_gpcs.values().all(|b| b.batch_ms > 0.0);
        if !all_known {
            return Some(1.0);
        }
        let planned = by_gpcs.get(&gpcs)?;
        Some(planned.batch_ms * f64::from(batch.max(1).div_ceil(planned.batch)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(gpcs: u32, batch: u32, batch_ms: f64) -> PlannedBatch {
        PlannedBatch { gpcs, batch, batch_ms }
    }

    #[test]
    fn a_query_costs_the_planned_batches_it_needs() {
        let t = PlannedServiceTimes::default();
        t.set([batch(1, 8, 18.0), batch(7, 16, 6.0)]);
        assert_eq!(t.service_time_ms(1, 1), Some(18.0));
        assert_eq!(t.service_time_ms(1, 8), Some(18.0));
        assert_eq!(t.service_time_ms(1, 9), Some(36.0));
        assert_eq!(t.service_time_ms(7, 4), Some(6.0));
        assert_eq!(t.service_time_ms(3, 4), None, "no partition of that size");
    }

    #[test]
    fn without_a_prediction_for_every_partition_all_cost_the_same() {
        let t = PlannedServiceTimes::default();
        assert_eq!(t.service_time_ms(1, 4), Some(1.0), "nothing known yet");
        t.set([batch(1, 8, 18.0), batch(7, 16, 0.0)]);
        assert_eq!((t.service_time_ms(1, 4), t.service_time_ms(7, 4)), (Some(1.0), Some(1.0)));
    }

    #[test]
    fn of_two_processes_on_one_size_the_slower_per_request_counts() {
        let t = PlannedServiceTimes::default();
        t.set([batch(7, 8, 8.0), batch(7, 4, 8.0), batch(7, 16, 8.0)]);
        assert_eq!(t.service_time_ms(7, 4), Some(8.0));
        assert_eq!(t.service_time_ms(7, 5), Some(16.0), "batch 4 at 8 ms: 2 ms a request");
        t.set([batch(7, 8, 8.0), batch(7, 4, 0.0), batch(7, 16, 8.0)]);
        assert_eq!(t.service_time_ms(7, 4), Some(1.0), "one process without a prediction");
    }
}
