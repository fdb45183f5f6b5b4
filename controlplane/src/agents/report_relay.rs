//! Reports a follower answered, relayed to the leader in batches. A follower checks a report
//! against its own applied state and answers at once; the leader, which keeps the reports and
//! writes what they observed, gets them some milliseconds later, many per request. Two
//! thirds of a fleet's reports reach a follower: forwarded one by one, each cost the leader
//! a request of its own and the agent a wait on the leader's busiest moments.
//!
//! Soft state like the reports themselves: a batch the leader cannot take is dropped, and
//! for a second after that the follower answers reports UNAVAILABLE, so agents report to
//! another controller instead of to one that cannot pass them on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::time::Instant;

use super::relay::Queue;
use crate::controller::{Controller, NoLeaderChannel};

/// The most reports one batch carries; the leader refuses more.
pub const MAX_REPORTS_PER_BATCH: usize = 512;
/// And the most bytes (well under the 4 MiB a gRPC message may have).
const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// Reports waiting for the leader, at most: past that, reports are answered UNAVAILABLE.
const MAX_PENDING_REPORTS: usize = 8_192;
/// How long the first report of a batch waits for others. Once the agents spread their
/// reports over their interval, 5 ms gathered 3 to 5 of them; 25 ms took about a tenth off
/// the leader's CPU and the followers' at 10,000 hosts (fleet-bench, 6 alternating runs of
/// each, 2026-11-28). The leader hears of a report that much later; the agent's answer
/// does not wait for it.
const GATHER: Duration = Duration::from_millis(25);
/// How long after a failed batch reports are turned away.
const BACK_OFF: Duration = Duration::from_secs(1);
const RELAY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct ReportRelay {
    queue: Arc<Queue<proto::ReportRequest>>,
    failed_at: Arc<Mutex<Option<Instant>>>,
}

impl Default for ReportRelay {
    fn default() -> Self {
        ReportRelay { queue: Queue::new(MAX_PENDING_REPORTS), failed_at: Arc::default() }
    }
}

impl ReportRelay {
    /// Queues `report` for the leader; the reason when it cannot be taken.
    pub fn submit(&self, report: proto::ReportRequest) -> Result<(), &'static str> {
        if self.failed_at.lock().expect("relay lock").is_some_and(|at| at.elapsed() < BACK_OFF) {
            return Err("this controller cannot reach the leader; report to another");
        }
        if !self.queue.push(report) {
            return Err("this controller has too many reports waiting for the leader; report to another");
        }
        Ok(())
    }

    pub fn stop(&self) {
        self.queue.stop();
    }
}

/// Sends what `controller.report_relay` queues to the leader; runs as long as the controller.
pub async fn relay(controller: Controller) {
    let relay = controller.report_relay.clone();
    loop {
        relay.queue.pushed().await;
        tokio::time::sleep(GATHER).await;
        loop {
            let reports = relay.queue.take(MAX_REPORTS_PER_BATCH);
            if reports.is_empty() {
                break;
            }
            for batch in by_bytes(reports, MAX_BATCH_BYTES) {
                let delivered = deliver(&controller, batch).await;
                *relay.failed_at.lock().expect("relay lock") = (!delivered).then(Instant::now);
            }
        }
    }
}

/// `reports` in order, cut into batches of at most `budget` encoded bytes (one report each
/// at least).
fn by_bytes(reports: Vec<proto::ReportRequest>, budget: usize) -> Vec<Vec<proto::ReportRequest>> {
    let mut batches: Vec<Vec<proto::ReportRequest>> = Vec::new();
    let mut bytes = 0;
    for r in reports {
        let len = r.encoded_len();
        match batches.last_mut() {
            Some(b) if bytes + len <= budget => b.push(r),
            _ => {
                batches.push(vec![r]);
                bytes = 0;
            }
        }
        bytes += len;
    }
    batches
}

async fn deliver(controller: &Controller, reports: Vec<proto::ReportRequest>) -> bool {
    let n = reports.len();
    let (id, channel) = match controller.leader_channel(controller.leader()) {
        Ok(leader) => leader,
        // This controller took over meanwhile: the new leader waits a full timeout for every
        // node anyway; their next reports come to it.
        Err(NoLeaderChannel::ThisNode) => return true,
        Err(why) => {
            tracing::debug!(reports = n, ?why, "reports not relayed");
            return false;
        }
    };
    let mut request = tonic::Request::new(proto::ReportBatchRequest { reports });
    request.set_timeout(RELAY_TIMEOUT);
    match proto::agent_client::AgentClient::new(channel).report_batch(request).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(reports = n, leader = id, error = %e, "reports not relayed to the leader");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str, gpus: usize) -> proto::ReportRequest {
        proto::ReportRequest { node: node.into(), gpus: vec![proto::ObservedGpu::default(); gpus], ..Default::default() }
    }

    #[test]
    fn batches_keep_the_order_and_stay_within_the_byte_budget_with_one_report_at_least() {
        let reports: Vec<_> = (0..10).map(|i| report(&format!("n{i}"), 1)).collect();
        let one = reports[0].encoded_len();
        let batches = by_bytes(reports.clone(), 3 * one);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 1]);
        assert_eq!(batches.concat(), reports);
        // A report bigger than the budget goes alone.
        let big = report("big", 100);
        let batches = by_bytes(vec![reports[0].clone(), big.clone(), reports[1].clone()], 3 * one);
        assert_eq!(batches, [vec![reports[0].clone()], vec![big], vec![reports[1].clone()]]);
    }

    #[test]
    fn after_a_failed_batch_reports_are_turned_away_for_a_while() {
        let relay = ReportRelay::default();
        assert!(relay.submit(report("a", 0)).is_ok());
        *relay.failed_at.lock().unwrap() = Some(Instant::now());
        assert!(relay.submit(report("a", 0)).unwrap_err().contains("cannot reach the leader"));
        *relay.failed_at.lock().unwrap() = Some(Instant::now() - BACK_OFF);
        assert!(relay.submit(report("a", 0)).is_ok());
    }
}
