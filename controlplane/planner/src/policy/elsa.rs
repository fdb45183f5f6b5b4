//! ELSA, the ELastic Scheduling Algorithm of Kim, Choi, Rhu: "PARIS and ELSA: An Elastic
//! Scheduling Algorithm for Reconfigurable Multi-GPU Inference Servers", DAC 2022
//! (`paris-elsa.txt`, Sec. IV-C): which GPU partition of a heterogeneously partitioned server
//! a newly arrived query goes to.
//!
//! * Execution times come from a profiled lookup table indexed by (partition size, batch
//!   size) (Sec. IV-C, "Estimating DNN model execution time via profiling"):
//!   [`ServiceTimeModel`], with [`ServiceTimeTable`] as the table itself.
//! * Eq. 1: `T_wait = Σ(T_estimated,queued) + T_remaining,current`, where
//!   `T_remaining,current = T_estimated,current − T_elapsed,current` (Fig. 9).
//! * Eq. 2: `SLA slack = SLA_target − α (T_wait + β · T_estimated,new)`; α and β are the
//!   paper's "configurable parameters … to tune the SLA slack predictor" ([`ElsaConfig`]).
//! * Algorithm 2, Step A (lines 2–9): partitions in ascending size; the first whose slack is
//!   met (`SLA > α (T_wait + β T_estimated,new)`, strict) gets the query. Step B (lines
//!   10–20): otherwise the partition minimising `T_wait + T_estimated,new` (no α, β: that is
//!   the literal line 14), the strict `<` of line 14 keeping the earliest on ties.
//!
//! Choices where the paper is silent (each also noted where it is used):
//! * Order among partitions of equal size (line 3 sorts by size only): least `T_wait` first,
//!   then input order, so equal partitions share load instead of piling onto the first.
//! * Time the query has already spent before this decision (`now − arrival`) is subtracted
//!   from `SLA_target` unscaled (it is measured, not estimated, so α does not apply). At the
//!   paper's decision point, the arrival itself, this term is 0 and the slack is Eq. 2.
//! * A running query past its estimate has `T_remaining,current = 0`, not a negative wait.
//! * A partition with no profiled time for the new query's batch (e.g. the batch does not fit
//!   its memory) is not a candidate; a queued or running batch without a profiled time is an
//!   error, since the queue could not have been formed from the same table.

use super::validate::{at_least_one, finite, non_negative, positive, InvalidField};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Refusals of [`schedule`] and [`ServiceTimeTable`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ElsaError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error("invalid `partitions`: no partition to schedule on")]
    NoPartitions,
    #[error("`{field}`: no profiled service time for batch {batch} on a {gpcs}-GPC partition")]
    MissingServiceTime { field: String, gpcs: u32, batch: u32 },
    #[error("no partition has a profiled service time for the query's batch {batch}")]
    NoEligiblePartition { batch: u32 },
}

/// The profiled execution time of one batch on one partition size (Sec. IV-C).
pub trait ServiceTimeModel {
    /// Milliseconds to execute a batch of `batch` on a partition of `gpcs` GPCs, or `None`
    /// where it was not profiled (cannot run there).
    fn service_time_ms(&self, gpcs: u32, batch: u32) -> Option<f64>;
}

impl<F: Fn(u32, u32) -> Option<f64>> ServiceTimeModel for F {
    fn service_time_ms(&self, gpcs: u32, batch: u32) -> Option<f64> {
        self(gpcs, batch)
    }
}

/// ELSA's two-dimensional lookup table: (partition GPCs, batch) → execution time, ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceTimeTable {
    entries: BTreeMap<(u32, u32), f64>,
}

impl ServiceTimeTable {
    /// From rows `(gpcs, batch, service_time_ms)`; a later row for the same key replaces an
    /// earlier one.
    pub fn from_rows(rows: &[(u32, u32, f64)]) -> Result<Self, ElsaError> {
        let mut entries = BTreeMap::new();
        for (i, &(gpcs, batch, ms)) in rows.iter().enumerate() {
            at_least_one(&format!("rows[{i}].gpcs"), gpcs)?;
            at_least_one(&format!("rows[{i}].batch"), batch)?;
            positive(&format!("rows[{i}].service_time_ms"), ms)?;
            entries.insert((gpcs, batch), ms);
        }
        Ok(ServiceTimeTable { entries })
    }
}

impl ServiceTimeModel for ServiceTimeTable {
    fn service_time_ms(&self, gpcs: u32, batch: u32) -> Option<f64> {
        self.entries.get(&(gpcs, batch)).copied()
    }
}

/// The newly arrived query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Query {
    /// Query size, i.e. its batch (Sec. II-A).
    pub batch: u32,
    pub arrival_ms: f64,
    /// `SLA_target`, ms from arrival.
    pub sla_target_ms: f64,
}

/// The query a partition is executing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunningQuery {
    pub batch: u32,
    /// When it started executing (`T_elapsed,current = now − started`, Fig. 9).
    pub started_ms: f64,
}

/// One GPU partition and its local scheduling queue (Fig. 9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Partition size in GPCs: GPU(1) … GPU(7).
    pub gpcs: u32,
    #[serde(default)]
    pub running: Option<RunningQuery>,
    /// Batch sizes of the queries waiting in its queue.
    #[serde(default)]
    pub queued: Vec<u32>,
}

/// α and β of Eq. 2.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ElsaConfig {
    /// Scales the whole estimate; > 1 makes ELSA conservative about the predictor's error.
    pub alpha: f64,
    /// Scales the new query's own execution time within it.
    pub beta: f64,
}

impl Default for ElsaConfig {
    /// The paper gives no values; 1 and 1 make Eq. 2 the unadjusted estimate.
    fn default() -> Self {
        ElsaConfig { alpha: 1.0, beta: 1.0 }
    }
}

/// Why a partition was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Choice {
    /// Step A: the smallest partition (in Alg. 2 order) whose SLA slack is positive.
    SlackMet { slack_ms: f64 },
    /// Step B: no partition meets the slack; this one finishes the query soonest.
    Fastest { finish_ms: f64, slack_ms: f64 },
}

/// Eq. 1 and Eq. 2 for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlackEstimate {
    /// Index into the input partitions.
    pub partition: usize,
    pub gpcs: u32,
    /// `T_wait` (Eq. 1).
    pub wait_ms: f64,
    /// `T_estimated,new`; `None` when the batch has no profiled time here (not a candidate).
    pub service_ms: Option<f64>,
    /// Eq. 2, less the time already spent since arrival; `None` when not a candidate.
    pub slack_ms: Option<f64>,
}

/// ELSA's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElsaDecision {
    /// Index into the input partitions.
    pub partition: usize,
    pub choice: Choice,
    /// Every partition's estimate, in the order Algorithm 2 visited them.
    pub estimates: Vec<SlackEstimate>,
}

/// Algorithm 2: the partition `query` should be queued on at `now_ms`.
pub fn schedule(
    query: &Query,
    partitions: &[PartitionState],
    model: &impl ServiceTimeModel,
    config: &ElsaConfig,
    now_ms: f64,
) -> Result<ElsaDecision, ElsaError> {
    positive("config.alpha", config.alpha)?;
    non_negative("config.beta", config.beta)?;
    finite("now_ms", now_ms)?;
    at_least_one("query.batch", query.batch)?;
    finite("query.arrival_ms", query.arrival_ms)?;
    positive("query.sla_target_ms", query.sla_target_ms)?;
    if query.arrival_ms > now_ms {
        return Err(InvalidField::new("query.arrival_ms", format!("is after now_ms ({} > {now_ms})", query.arrival_ms)).into());
    }
    if partitions.is_empty() {
        return Err(ElsaError::NoPartitions);
    }
    // Measured, so not scaled by α (see the module docs).
    let budget_ms = query.sla_target_ms - (now_ms - query.arrival_ms);

    let mut estimates = Vec::with_capacity(partitions.len());
    for (i, p) in partitions.iter().enumerate() {
        let wait_ms = wait_ms(i, p, model, now_ms)?;
        let service_ms = lookup(model, p.gpcs, query.batch, || format!("partitions[{i}]"))?;
        // Eq. 2.
        let slack_ms = service_ms.map(|t_new| budget_ms - config.alpha * (wait_ms + config.beta * t_new));
        estimates.push(SlackEstimate { partition: i, gpcs: p.gpcs, wait_ms, service_ms, slack_ms });
    }
    // Line 3: ascending size; equal sizes least loaded first, then input order.
    estimates.sort_by(|a, b| a.gpcs.cmp(&b.gpcs).then(a.wait_ms.total_cmp(&b.wait_ms)).then(a.partition.cmp(&b.partition)));

    // Step A (lines 4–9): strict `>`, so a slack of exactly 0 is not met.
    if let Some(e) = estimates.iter().find(|e| e.slack_ms.is_some_and(|s| s > 0.0)) {
        let choice = Choice::SlackMet { slack_ms: e.slack_ms.unwrap_or_default() };
        return Ok(ElsaDecision { partition: e.partition, choice, estimates });
    }
    // Step B (lines 11–19): the first strict minimum of `T_wait + T_estimated,new`.
    let mut best: Option<(&SlackEstimate, f64)> = None;
    for e in &estimates {
        let Some(t_new) = e.service_ms else { continue };
        let finish_ms = e.wait_ms + t_new;
        if best.is_none_or(|(_, t_min)| finish_ms.partial_cmp(&t_min) == Some(Ordering::Less)) {
            best = Some((e, finish_ms));
        }
    }
    let (e, finish_ms) = best.ok_or(ElsaError::NoEligiblePartition { batch: query.batch })?;
    let choice = Choice::Fastest { finish_ms, slack_ms: e.slack_ms.unwrap_or_default() };
    Ok(ElsaDecision { partition: e.partition, choice, estimates })
}

/// Eq. 1 for partition `i`: its queued work plus what remains of the running query.
fn wait_ms(i: usize, p: &PartitionState, model: &impl ServiceTimeModel, now_ms: f64) -> Result<f64, ElsaError> {
    at_least_one(&format!("partitions[{i}].gpcs"), p.gpcs)?;
    let mut wait = 0.0;
    for (j, &batch) in p.queued.iter().enumerate() {
        let field = || format!("partitions[{i}].queued[{j}]");
        at_least_one(&field(), batch)?;
        wait += required(model, p.gpcs, batch, field)?;
    }
    if let Some(r) = &p.running {
        let field = || format!("partitions[{i}].running");
        at_least_one(&format!("{}.batch", field()), r.batch)?;
        finite(&format!("{}.started_ms", field()), r.started_ms)?;
        if r.started_ms > now_ms {
            return Err(
                InvalidField::new(format!("{}.started_ms", field()), format!("is after now_ms ({} > {now_ms})", r.started_ms)).into()
            );
        }
        let estimated = required(model, p.gpcs, r.batch, field)?;
        // A query past its estimate is about to finish: no negative wait.
        wait += (estimated - (now_ms - r.started_ms)).max(0.0);
    }
    Ok(wait)
}

/// The model's time for `(gpcs, batch)`, checked; `None` where it has none.
fn lookup(model: &impl ServiceTimeModel, gpcs: u32, batch: u32, field: impl Fn() -> String) -> Result<Option<f64>, ElsaError> {
    match model.service_time_ms(gpcs, batch) {
        None => Ok(None),
        Some(t) => Ok(Some(positive(&format!("{}: service time of batch {batch} on {gpcs} GPCs", field()), t)?)),
    }
}

/// As [`lookup`], where a missing entry is an error.
fn required(model: &impl ServiceTimeModel, gpcs: u32, batch: u32, field: impl Fn() -> String) -> Result<f64, ElsaError> {
    lookup(model, gpcs, batch, &field)?.ok_or_else(|| ElsaError::MissingServiceTime { field: field(), gpcs, batch })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPU(1), GPU(3), GPU(7) at batches 1, 8 and 32 (32 does not fit GPU(1)), ms.
    fn table() -> ServiceTimeTable {
        ServiceTimeTable::from_rows(&[
            (1, 1, 4.0),
            (1, 8, 20.0),
            (3, 1, 3.0),
            (3, 8, 9.0),
            (3, 32, 30.0),
            (7, 1, 2.5),
            (7, 8, 5.0),
            (7, 32, 12.0),
        ])
        .unwrap()
    }

    fn idle(gpcs: u32) -> PartitionState {
        PartitionState { gpcs, running: None, queued: vec![] }
    }

    fn queued(gpcs: u32, batches: &[u32]) -> PartitionState {
        PartitionState { gpcs, running: None, queued: batches.to_vec() }
    }

    fn query(batch: u32, sla_target_ms: f64) -> Query {
        Query { batch, arrival_ms: 100.0, sla_target_ms }
    }

    fn run(q: &Query, parts: &[PartitionState], cfg: ElsaConfig) -> Result<ElsaDecision, ElsaError> {
        schedule(q, parts, &table(), &cfg, 100.0)
    }

    #[test]
    fn picks_the_smallest_partition_whose_slack_is_met_whatever_the_input_order() {
        // Every partition meets a 10 ms SLA for batch 1 when idle; GPU(1) is smallest.
        let d = run(&query(1, 10.0), &[idle(7), idle(3), idle(1)], ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 2);
        assert_eq!(d.choice, Choice::SlackMet { slack_ms: 6.0 });
        assert_eq!(d.estimates.iter().map(|e| e.gpcs).collect::<Vec<_>>(), vec![1, 3, 7]);
    }

    #[test]
    fn skips_small_partitions_that_would_miss_the_sla() {
        // Batch 8: GPU(1) needs 20 ms > 15; GPU(3) needs 9 ms.
        let d = run(&query(8, 15.0), &[idle(1), idle(3), idle(7)], ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.choice, Choice::SlackMet { slack_ms: 6.0 });
        assert_eq!(d.estimates[0].slack_ms, Some(-5.0));
    }

    #[test]
    fn waits_for_a_busy_large_partition_rather_than_run_late_on_an_idle_small_one() {
        // Fig. 10: FIFS would take the idle GPU(1) (20 ms > 10 ms SLA). GPU(7) runs a batch 8
        // (5 ms) started 2 ms ago: T_wait = 3, finish 3 + 5 = 8 < 10.
        let busy = PartitionState { gpcs: 7, running: Some(RunningQuery { batch: 8, started_ms: 98.0 }), queued: vec![] };
        let d = run(&query(8, 10.0), &[idle(1), busy], ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.choice, Choice::SlackMet { slack_ms: 2.0 });
        assert_eq!(d.estimates[1].wait_ms, 3.0);
    }

    #[test]
    fn falls_back_to_the_partition_that_finishes_soonest() {
        // SLA 6 ms, batch 8: GPU(1) 0 + 20; GPU(3) 9 + 9 = 18; GPU(7) 5 + 5 + 5 = 15.
        let parts = [idle(1), queued(3, &[8]), queued(7, &[8, 8])];
        let d = run(&query(8, 6.0), &parts, ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 2);
        assert_eq!(d.choice, Choice::Fastest { finish_ms: 15.0, slack_ms: -9.0 });

        // A deeper GPU(7) queue makes the busy GPU(3) the fastest: 18 < 5·3 + 5 = 20.
        let parts = [idle(1), queued(3, &[8]), queued(7, &[8, 8, 8])];
        let d = run(&query(8, 6.0), &parts, ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.choice, Choice::Fastest { finish_ms: 18.0, slack_ms: -12.0 });
    }

    #[test]
    fn eq_1_and_eq_2_by_hand() {
        // GPU(1): queued batch 1 (4 ms) + running batch 8 (20 ms) started at 90, now 105:
        // T_wait = 4 + (20 − 15) = 9. New batch 1: T_new = 4.
        // Slack = 100 − (105 − 100) − 1.5 (9 + 2 · 4) = 100 − 5 − 25.5 = 69.5.
        let p = PartitionState { gpcs: 1, running: Some(RunningQuery { batch: 8, started_ms: 90.0 }), queued: vec![1] };
        let cfg = ElsaConfig { alpha: 1.5, beta: 2.0 };
        let d = schedule(&query(1, 100.0), &[p], &table(), &cfg, 105.0).unwrap();
        assert_eq!(d.estimates[0], SlackEstimate { partition: 0, gpcs: 1, wait_ms: 9.0, service_ms: Some(4.0), slack_ms: Some(69.5) });
        assert_eq!(d.choice, Choice::SlackMet { slack_ms: 69.5 });
    }

    #[test]
    fn alpha_and_beta_make_the_small_partition_miss() {
        // GPU(1) with one queued batch 1: α = 1 gives 10 − (4 + 4) = 2 > 0.
        let parts = [queued(1, &[1]), idle(3)];
        assert_eq!(run(&query(1, 10.0), &parts, ElsaConfig::default()).unwrap().partition, 0);
        // α = 2: 10 − 2 · 8 < 0 on GPU(1); 10 − 2 · 3 = 4 on GPU(3).
        let d = run(&query(1, 10.0), &parts, ElsaConfig { alpha: 2.0, beta: 1.0 }).unwrap();
        assert_eq!((d.partition, d.choice), (1, Choice::SlackMet { slack_ms: 4.0 }));
        // β = 3 on an idle GPU(1): 10 − 3 · 4 < 0; GPU(3): 10 − 9 = 1.
        let d = run(&query(1, 10.0), &[idle(1), idle(3)], ElsaConfig { alpha: 1.0, beta: 3.0 }).unwrap();
        assert_eq!((d.partition, d.choice), (1, Choice::SlackMet { slack_ms: 1.0 }));
    }

    #[test]
    fn step_b_ignores_alpha_and_beta() {
        // α = 10 fails everyone; the fastest is still GPU(7) at 2.5 ms (line 14 has no α, β).
        let d = run(&query(1, 10.0), &[idle(1), idle(7), idle(3)], ElsaConfig { alpha: 10.0, beta: 1.0 }).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.choice, Choice::Fastest { finish_ms: 2.5, slack_ms: -15.0 });
    }

    #[test]
    fn time_already_waited_counts_against_the_sla() {
        // Arrived 8 ms ago with a 10 ms SLA: GPU(1) (4 ms) no longer fits, GPU(7) (2.5) no
        // longer either (−0.5): fall back to the fastest.
        let q = Query { batch: 1, arrival_ms: 92.0, sla_target_ms: 10.0 };
        let d = run(&q, &[idle(1), idle(7)], ElsaConfig::default()).unwrap();
        assert_eq!(d.choice, Choice::Fastest { finish_ms: 2.5, slack_ms: -0.5 });
    }

    #[test]
    fn a_slack_of_exactly_zero_is_not_met() {
        // GPU(1): 4 − 4 = 0 (line 5 is strict); GPU(3): 4 − 3 = 1.
        let d = run(&query(1, 4.0), &[idle(1), idle(3)], ElsaConfig::default()).unwrap();
        assert_eq!((d.partition, d.choice), (1, Choice::SlackMet { slack_ms: 1.0 }));
    }

    #[test]
    fn equal_sizes_prefer_the_less_loaded_then_the_first() {
        let parts = [queued(3, &[1]), idle(3), idle(3)];
        let d = run(&query(1, 20.0), &parts, ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.estimates.iter().map(|e| e.partition).collect::<Vec<_>>(), vec![1, 2, 0]);
    }

    #[test]
    fn fallback_ties_go_to_the_smaller_partition() {
        // Batch 8, SLA 1 (nobody meets it): idle GPU(3) finishes at 9; GPU(7) behind a
        // queued 4 ms query at 4 + 5 = 9. Line 14's strict `>` keeps the first, GPU(3).
        let model = |g: u32, b: u32| match (g, b) {
            (3, 8) => Some(9.0),
            (7, 8) => Some(5.0),
            (7, 1) => Some(4.0),
            _ => None,
        };
        let parts = [queued(7, &[1]), idle(3)];
        let d = schedule(&query(8, 1.0), &parts, &model, &ElsaConfig::default(), 100.0).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.choice, Choice::Fastest { finish_ms: 9.0, slack_ms: -8.0 });
    }

    #[test]
    fn a_running_query_past_its_estimate_adds_no_wait() {
        let p = PartitionState { gpcs: 3, running: Some(RunningQuery { batch: 8, started_ms: 50.0 }), queued: vec![] };
        let d = run(&query(1, 10.0), &[p], ElsaConfig::default()).unwrap();
        assert_eq!(d.estimates[0].wait_ms, 0.0);
        assert_eq!(d.choice, Choice::SlackMet { slack_ms: 7.0 });
    }

    #[test]
    fn partitions_without_a_profile_for_the_batch_are_not_candidates() {
        // Batch 32 has no GPU(1) entry: GPU(3) meets 40 ms (30), though GPU(1) is smaller.
        let d = run(&query(32, 40.0), &[idle(1), idle(3)], ElsaConfig::default()).unwrap();
        assert_eq!(d.partition, 1);
        assert_eq!(d.estimates[0].service_ms, None);
        assert_eq!(d.estimates[0].slack_ms, None);
        assert_eq!(run(&query(32, 40.0), &[idle(1)], ElsaConfig::default()), Err(ElsaError::NoEligiblePartition { batch: 32 }));
    }

    #[test]
    fn refuses_bad_input_naming_the_field() {
        let cfg = ElsaConfig::default();
        let invalid = |r: Result<ElsaDecision, ElsaError>| match r {
            Err(ElsaError::Invalid(f)) => (f.field, f.reason),
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(run(&query(1, 10.0), &[], cfg), Err(ElsaError::NoPartitions));
        assert_eq!(invalid(run(&query(1, 0.0), &[idle(1)], cfg)), ("query.sla_target_ms".into(), "must be > 0, got 0".into()));
        assert_eq!(invalid(run(&query(1, f64::NAN), &[idle(1)], cfg)), ("query.sla_target_ms".into(), "is NaN".into()));
        assert_eq!(invalid(run(&query(0, 10.0), &[idle(1)], cfg)).0, "query.batch");
        assert_eq!(invalid(run(&query(1, 10.0), &[idle(1), idle(0)], cfg)).0, "partitions[1].gpcs");
        assert_eq!(invalid(run(&query(1, 10.0), &[queued(1, &[1, 0])], cfg)).0, "partitions[0].queued[1]");
        assert_eq!(invalid(run(&query(1, 10.0), &[idle(1)], ElsaConfig { alpha: f64::NAN, beta: 1.0 })).0, "config.alpha");
        assert_eq!(invalid(run(&query(1, 10.0), &[idle(1)], ElsaConfig { alpha: 1.0, beta: -1.0 })).0, "config.beta");
        assert_eq!(invalid(schedule(&query(1, 10.0), &[idle(1)], &table(), &cfg, f64::NAN)).0, "now_ms");
        let late = Query { batch: 1, arrival_ms: 101.0, sla_target_ms: 10.0 };
        assert_eq!(invalid(run(&late, &[idle(1)], cfg)), ("query.arrival_ms".into(), "is after now_ms (101 > 100)".into()));
        let future = PartitionState { gpcs: 1, running: Some(RunningQuery { batch: 1, started_ms: 200.0 }), queued: vec![] };
        assert_eq!(invalid(run(&query(1, 10.0), &[future], cfg)).0, "partitions[0].running.started_ms");
    }

    #[test]
    fn refuses_queues_the_table_cannot_price() {
        assert_eq!(
            run(&query(1, 10.0), &[idle(3), queued(1, &[32])], ElsaConfig::default()),
            Err(ElsaError::MissingServiceTime { field: "partitions[1].queued[0]".into(), gpcs: 1, batch: 32 })
        );
        let nan_model = |_: u32, _: u32| Some(f64::NAN);
        let err = schedule(&query(1, 10.0), &[idle(1)], &nan_model, &ElsaConfig::default(), 100.0).unwrap_err();
        assert_eq!(err.to_string(), "invalid `partitions[0]: service time of batch 1 on 1 GPCs`: is NaN");
    }

    #[test]
    fn the_table_refuses_bad_rows() {
        let err = ServiceTimeTable::from_rows(&[(1, 1, 4.0), (3, 8, -1.0)]).unwrap_err();
        assert_eq!(err, ElsaError::Invalid(InvalidField::new("rows[1].service_time_ms", "must be > 0, got -1")));
        assert!(matches!(ServiceTimeTable::from_rows(&[(0, 1, 4.0)]), Err(ElsaError::Invalid(f)) if f.field == "rows[0].gpcs"));
    }
}
