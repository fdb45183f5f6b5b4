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
//! reports, kept where it arose: each controller keeps the ends of the streams it served
//! that have not been opened again on it (for [`KEEP_ENDS_FOR`], at most
//! [`MAX_PENDING_ENDS`]) and sends them again to every new leader, which learns nothing of
//! its predecessor's. Without that, a host that died around a leader change (its end sent
//! to the old leader, or to none) was marked only at the report timeout counted from the
//! takeover.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::relay::Queue;
use super::reports::EndTaken;
use crate::controller::Controller;
use crate::raft::consensus::LeadershipWatch;

/// The most ends one relay request carries (~300 KB of node names at most); the leader
/// refuses more.
pub const MAX_ENDS_PER_RELAY: usize = 4_096;

/// Ends waiting to be relayed, and ends kept for a new leader, at most each (one per stream
/// this controller served; beyond, the report timeout still applies).
const MAX_PENDING_ENDS: usize = 100_000;

/// How long an end is sent again to new leaders. Longer than any report timeout
/// (`missed × interval`, 25 s at 10,000 hosts): by then a leader that heard of the end has
/// marked the node, and one that did not has reached the timeout.
pub const KEEP_ENDS_FOR: Duration = Duration::from_secs(300);

/// How long the leader may take to take a relay.
const RELAY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone)]
pub struct WatchEnds {
    queue: Arc<Queue<proto::EndedWatch>>,
    streams: Arc<Mutex<Streams>>,
    keep_at_most: usize,
}

#[derive(Default)]
struct Streams {
    /// Per node, the session and time of the last stream of it that ended here, until the
    /// node opens a stream here again.
    kept: HashMap<String, (u64, Instant)>,
    /// Per node, the session of the latest stream it opened here, while that stream is
    /// open: what a new leader asks about when it has no report of a node whose end it
    /// was sent ([`crate::agents::end_check`]).
    open: HashMap<String, u64>,
}

impl Default for WatchEnds {
    fn default() -> Self {
        Self::with_bounds(MAX_PENDING_ENDS, MAX_PENDING_ENDS)
    }
}

impl WatchEnds {
    /// At most `queued` ends waiting to be relayed, and at most `kept` nodes' ends kept
    /// and open streams known (one per node each).
    fn with_bounds(queued: usize, kept: usize) -> Self {
        WatchEnds { queue: Queue::new(queued), streams: Arc::default(), keep_at_most: kept }
    }

    /// The agent of `node` ended its stream `session` (0: an unnamed stream, ignored). Kept
    /// for new leaders even when the relay queue is full (the next leader gets it), not once
    /// this controller stops.
    pub fn ended(&self, node: &str, session: u64, now: Instant) {
        if session == 0 || self.queue.is_stopping() {
            return;
        }
        self.queue.push(proto::EndedWatch { node: node.to_string(), session });
        let mut streams = self.streams.lock().expect("streams lock");
        if streams.open.get(node) == Some(&session) {
            streams.open.remove(node);
        }
        if streams.kept.len() < self.keep_at_most || streams.kept.contains_key(node) {
            streams.kept.insert(node.to_string(), (session, now));
        }
    }

    /// The agent of `node` opened the stream `session` here: its earlier ends here are old
    /// news. (An end of the old stream noticed after this is kept, and harmless: the
    /// agent's next report names its new stream, which clears that end at the leader.)
    pub fn opened(&self, node: &str, session: u64) {
        let mut streams = self.streams.lock().expect("streams lock");
        streams.kept.remove(node);
        if session != 0 && (streams.open.len() < self.keep_at_most || streams.open.contains_key(node)) {
            streams.open.insert(node.to_string(), session);
        }
    }

    /// The streams open here of `nodes`, the latest of each.
    pub fn open_of<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) -> Vec<proto::OpenWatch> {
        let streams = self.streams.lock().expect("streams lock");
        nodes.into_iter().filter_map(|n| streams.open.get(n).map(|s| proto::OpenWatch { node: n.clone(), session: *s })).collect()
    }

    /// Queues again every end kept from the last [`KEEP_ENDS_FOR`], for a new leader;
    /// forgets older ones.
    pub fn resend(&self, now: Instant) {
        let mut streams = self.streams.lock().expect("streams lock");
        streams.kept.retain(|_, (_, at)| now.saturating_duration_since(*at) <= KEEP_ENDS_FOR);
        for (node, (session, _)) in streams.kept.iter() {
            if !self.queue.push(proto::EndedWatch { node: node.clone(), session: *session }) {
                break;
            }
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
/// it leads, else to the leader, and the kept ones again to every new leader; runs as long
/// as the controller.
pub async fn relay(controller: Controller) {
    let mut leadership = LeadershipWatch::new(&controller.raft);
    let mut leaders = NewLeader::default();
    loop {
        tokio::select! {
            () = controller.watch_ends.queue.pushed() => {}
            running = leadership.changed() => {
                if !running {
                    return; // Raft stopped: so does this controller.
                }
                let (term, leader) = leadership.current();
                if !leaders.is_new(term, leader) {
                    continue;
                }
                controller.watch_ends.resend(Instant::now());
            }
        }
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

/// Tells a leader that has come to be since the last one seen (a term and a known leader;
/// with one leader per term, a new term with a leader is a new leader's reign).
#[derive(Debug, Default)]
struct NewLeader {
    term_seen: u64,
}

impl NewLeader {
    fn is_new(&mut self, term: u64, leader: Option<u64>) -> bool {
        if leader.is_none() || term <= self.term_seen {
            return false;
        }
        self.term_seen = term;
        true
    }
}

/// Records ends at the leader (relayed or its own); those of nodes it has no report of are
/// checked with the controllers ([`crate::agents::end_check`]).
pub fn record(controller: &Controller, ended: &[proto::EndedWatch]) {
    let now = Instant::now();
    let nodes = controller.read(|d| d.cluster.count(crate::resources::Kind::Node));
    let unheard_wait = controller.report_pace.interval(nodes);
    let mut unheard = Vec::new();
    for e in ended {
        match controller.reports.watch_ended(&e.node, e.session, now, unheard_wait) {
            EndTaken::No => continue,
            EndTaken::Now => {}
            EndTaken::Unheard => unheard.push((e.node.clone(), e.session)),
        }
        tracing::info!(node = %e.node, session = e.session, "agent's desired-state stream ended");
    }
    if !unheard.is_empty() {
        tokio::spawn(crate::agents::end_check::check(controller.clone(), unheard));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_taken_in_bounded_batches_and_none_after_stop() {
        let ends = WatchEnds::default();
        let now = Instant::now();
        for i in 0..MAX_ENDS_PER_RELAY + 10 {
            ends.ended(&format!("n{i}"), 1, now);
        }
        ends.ended("unnamed", 0, now);
        assert_eq!(ends.take().len(), MAX_ENDS_PER_RELAY);
        let rest = ends.take();
        assert_eq!(rest.len(), 10);
        assert_eq!(rest[0].node, format!("n{MAX_ENDS_PER_RELAY}"));
        assert!(ends.take().is_empty(), "the unnamed stream is not relayed");
        ends.stop();
        ends.ended("late", 1, now);
        ends.resend(now);
        assert!(ends.take().is_empty());
    }

    #[test]
    fn an_end_the_full_queue_refuses_is_kept_for_the_next_leader() {
        let ends = WatchEnds::with_bounds(2, 3);
        let now = Instant::now();
        for node in ["a", "b", "c"] {
            ends.ended(node, 1, now);
        }
        assert_eq!(taken(&ends), [("a".into(), 1), ("b".into(), 1)], "the queue holds two");
        ends.opened("a", 2);
        ends.resend(now);
        assert_eq!(taken(&ends), [("b".into(), 1), ("c".into(), 1)]);
        // Kept ends are bounded too: with three kept (b, c, d), e's end is relayed, not kept.
        ends.ended("d", 1, now);
        ends.ended("e", 1, now);
        assert_eq!(taken(&ends), [("d".into(), 1), ("e".into(), 1)]);
        ends.opened("b", 2);
        ends.resend(now);
        assert_eq!(taken(&ends), [("c".into(), 1), ("d".into(), 1)]);
    }

    fn taken(ends: &WatchEnds) -> Vec<(String, u64)> {
        let mut taken: Vec<_> = ends.take().into_iter().map(|e| (e.node, e.session)).collect();
        taken.sort();
        taken
    }

    #[test]
    fn ends_not_reopened_here_are_sent_again_until_they_are_old() {
        let ends = WatchEnds::default();
        let t0 = Instant::now();
        ends.ended("dies", 11, t0);
        ends.ended("blinks", 21, t0);
        ends.ended("old", 31, t0);
        assert_eq!(taken(&ends).len(), 3, "relayed once as they end");
        ends.opened("blinks", 22);
        ends.ended("old", 32, t0 + Duration::from_secs(1));
        assert_eq!(taken(&ends), [("old".into(), 32)]);

        // A new leader: the ends of the streams not opened again here, the latest of each.
        ends.resend(t0 + Duration::from_secs(2));
        assert_eq!(taken(&ends), [("dies".into(), 11), ("old".into(), 32)]);
        // And again for the next one, until they are too old to matter.
        ends.resend(t0 + KEEP_ENDS_FOR + Duration::from_millis(500));
        assert_eq!(taken(&ends), [("old".into(), 32)]);
        ends.resend(t0 + KEEP_ENDS_FOR + Duration::from_secs(2));
        assert!(taken(&ends).is_empty());
    }

    #[test]
    fn the_open_streams_known_are_the_latest_each_node_opened_until_it_ends() {
        let ends = WatchEnds::with_bounds(10, 2);
        let now = Instant::now();
        let asked: Vec<String> = ["a", "b", "c", "unnamed"].map(String::from).into();
        let open = |ends: &WatchEnds| ends.open_of(&asked).into_iter().map(|o| (o.node, o.session)).collect::<Vec<_>>();
        ends.opened("a", 1);
        ends.opened("a", 2);
        ends.opened("unnamed", 0);
        assert_eq!(open(&ends), [("a".into(), 2)]);
        // The end of the stream it replaced leaves the new one open.
        ends.ended("a", 1, now);
        assert_eq!(open(&ends), [("a".into(), 2)]);
        ends.opened("b", 7);
        // Bounded: a third node's stream is not recorded (its end still is relayed).
        ends.opened("c", 9);
        assert_eq!(open(&ends), [("a".into(), 2), ("b".into(), 7)]);
        ends.ended("a", 2, now);
        assert_eq!(open(&ends), [("b".into(), 7)]);
    }

    #[test]
    fn a_new_leader_is_a_later_term_with_a_leader() {
        let mut leaders = NewLeader::default();
        assert!(!leaders.is_new(1, None), "an election under way");
        assert!(leaders.is_new(1, Some(2)));
        assert!(!leaders.is_new(1, Some(2)), "the same reign");
        assert!(!leaders.is_new(2, None));
        assert!(leaders.is_new(3, Some(2)), "re-elected in a later term: it may have lost what it knew");
        assert!(!leaders.is_new(2, Some(1)), "a stale view of an older term");
    }
}
