//! Ends of agents' desired-state streams, relayed to the leader: the failure detector's fast
//! signal of a dead host. Every agent holds one stream to some controller; when that stream
//! ends without the controller ending it (the agent's process went away, or its connection
//! closed or missed its HTTP/2 keep-alive), the controller serving it tells the leader, which
//! takes the node for dead after a short grace unless the agent reports from a new stream.
//! The report timeout (`missed × interval`, 25 s at 10,000 hosts) stays as the backstop for
//! agents that hang with their stream open.
//!
//! Ends are collected and sent in batches, so a controller that loses thousands of streams
//! at once (a network partition) sends a few requests, not thousands. Soft state like the
//! reports: an end that cannot be delivered is dropped (the timeout still applies).

use std::sync::Arc;

use tokio::time::Instant;

use super::relay::Queue;
use crate::controller::Controller;

/// The most ends one relay request carries (~300 KB of node names at most); the leader
/// refuses more.
pub const MAX_ENDS_PER_RELAY: usize = 4_096;

/// Ends waiting to be relayed, at most (one per stream this controller served; beyond, the
/// report timeout still applies).
const MAX_PENDING_ENDS: usize = 100_000;

/// How long the leader may take to take a relay.
const RELAY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone)]
pub struct WatchEnds {
    queue: Arc<Queue<proto::EndedWatch>>,
}

impl Default for WatchEnds {
    fn default() -> Self {
        WatchEnds { queue: Queue::new(MAX_PENDING_ENDS) }
    }
}

impl WatchEnds {
    /// The agent of `node` ended its stream `session` (0: an unnamed stream, ignored).
    pub fn ended(&self, node: &str, session: u64) {
        if session != 0 {
            self.queue.push(proto::EndedWatch { node: node.to_string(), session });
        }
    }

    /// From now on, streams end because this controller stops: nothing is relayed.
    pub fn stop(&self) {
        self.queue.stop();
    }

    fn take(&self) -> Vec<proto::EndedWatch> {
        self.queue.take(MAX_ENDS_PER_RELAY)
    }
}

/// Delivers the ends `controller.watch_ends` collects, to this controller's own reports when
/// it leads, else to the leader; runs as long as the controller.
pub async fn relay(controller: Controller) {
    loop {
        controller.watch_ends.queue.pushed().await;
        loop {
            let batch = controller.watch_ends.take();
            if batch.is_empty() {
                break;
            }
            deliver(&controller, batch).await;
        }
    }
}

async fn deliver(controller: &Controller, batch: Vec<proto::EndedWatch>) {
    if controller.is_leader() {
        record(controller, &batch);
        return;
    }
    let n = batch.len();
    // This controller took over meanwhile (dropped: soft state), no leader, no channel.
    let (id, channel) = match controller.leader_channel(controller.leader()) {
        Ok(leader) => leader,
        Err(why) => return tracing::debug!(ends = n, ?why, "ended agent streams not relayed"),
    };
    let mut request = tonic::Request::new(proto::WatchesEndedRequest { ended: batch });
    request.set_timeout(RELAY_TIMEOUT);
    if let Err(e) = proto::agent_client::AgentClient::new(channel).watches_ended(request).await {
        tracing::debug!(ends = n, leader = id, error = %e, "ended agent streams not relayed");
    }
}

/// Records ends at the leader (relayed or its own).
pub fn record(controller: &Controller, ended: &[proto::EndedWatch]) {
    let now = Instant::now();
    for e in ended {
        if controller.reports.watch_ended(&e.node, e.session, now) {
            tracing::info!(node = %e.node, session = e.session, "agent's desired-state stream ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_taken_in_bounded_batches_and_none_after_stop() {
        let ends = WatchEnds::default();
        for i in 0..MAX_ENDS_PER_RELAY + 10 {
            ends.ended(&format!("n{i}"), 1);
        }
        ends.ended("unnamed", 0);
        assert_eq!(ends.take().len(), MAX_ENDS_PER_RELAY);
        let rest = ends.take();
        assert_eq!(rest.len(), 10);
        assert_eq!(rest[0].node, format!("n{MAX_ENDS_PER_RELAY}"));
        assert!(ends.take().is_empty(), "the unnamed stream is not relayed");
        ends.stop();
        ends.ended("late", 1);
        assert!(ends.take().is_empty());
    }
}
