//! When this node may stand for election: openraft's one switch (`RuntimeConfig::elect`),
//! owned here for the two reasons to hold it, so that one reason ending does not lift
//! the other. (A leader transfer's election is openraft's own and does not pass the switch:
//! `consensus::transfer_leadership`.)
//!
//! * [`Hold::Start`]: a starting node waits to hear from a leader first, up to a bound
//!   (`RaftSettings::hold_elections_on_start`).
//! * [`Hold::SplitVote`]: a candidate whose round has not ended stands again at a random
//!   moment of its own, off openraft's ticks. Written for openraft 0.9 (0.10 draws the
//!   timeout for every election and ticks every fifth of a heartbeat; the breaker stays
//!   until failover is measured without it). openraft 0.9 drew a node's election timeout
//!   once, when the node started, and checked it only on ticks of 1.5 heartbeats (150 ms),
//!   longer than the timeouts' whole range (120-200 ms). Two candidates whose ticks fall
//!   together therefore stand together in every round and split the vote round after round
//!   until their ticks drift apart or a third node comes back: one of 50 failovers in
//!   `raft-bench --kills 50` took 4.8 s, terms 32 to 61 in steps of 150 ms. Holding the
//!   ticks' next round for a random number of ticks does not help (a first try: both nodes
//!   then stood every 300 ms, still together, 12.5 s). Raft draws the timeout anew for every
//!   election (Raft paper, Sec. 5.2), at any moment, which is what ends a split vote; after
//!   each round it stands in, this node holds the ticks' elections and, if the round has not
//!   ended after a time drawn from [`split_vote_range`], starts the next one itself; unless a
//!   voter answered with a longer log than its own ([`VoteReplies`]): this node cannot win
//!   then, and standing again early would only raise the term under the node that can (a
//!   second try did that: 2.3 s), so openraft's timer, which waits longer after seeing a
//!   longer log (`smaller_log_timeout`), decides its next round.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::vote::RaftLeaderId;

use super::types::{Raft, ServerState, TypeConfig};

type ServerMetrics = openraft::type_config::alias::WatchReceiverOf<TypeConfig, openraft::metrics::RaftServerMetrics<TypeConfig>>;

/// Why this node's elections are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    Start,
    SplitVote,
}

impl Hold {
    fn bit(self) -> u8 {
        match self {
            Hold::Start => 1,
            Hold::SplitVote => 2,
        }
    }
}

/// The reasons currently holding elections; elections run only when there are none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Holds(u8);

impl Holds {
    /// Sets or lifts `why`; whether this node may now stand for election.
    fn set(&mut self, why: Hold, held: bool) -> bool {
        if held {
            self.0 |= why.bit();
        } else {
            self.0 &= !why.bit();
        }
        self.0 == 0
    }
}

/// How long a candidate waits for its round to end before it stands again: from the
/// shortest election timeout to twice the longest (Raft paper, Sec. 9.3: a range wide
/// against a vote's round trip), so that two candidates seldom stand again within one round
/// trip of each other.
/// openraft's config check keeps the minimum below the maximum, so the range is never empty.
pub fn split_vote_range(election_timeout_min_ms: u64, election_timeout_max_ms: u64) -> std::ops::Range<Duration> {
    Duration::from_millis(election_timeout_min_ms)..Duration::from_millis(2 * election_timeout_max_ms)
}

/// What this node's vote requests heard back (noted by `raft::Network`).
#[derive(Debug, Default)]
pub struct VoteReplies {
    /// The latest term in which a voter had a longer log than this node.
    greater_log_term: AtomicU64,
}

impl VoteReplies {
    pub fn note(&self, request: &VoteRequest<TypeConfig>, reply: &VoteResponse<TypeConfig>) {
        if reply.last_log_id > request.last_log_id {
            self.greater_log_term.fetch_max(request.vote.leader_id().term(), Ordering::Relaxed);
        }
    }

    /// Whether a voter had a longer log than this node when it stood in `term`.
    fn greater_log_seen_in(&self, term: u64) -> bool {
        self.greater_log_term.load(Ordering::Relaxed) == term
    }
}

/// This node's election switch. Clones share it.
#[derive(Clone)]
pub struct ElectionGate {
    raft: Raft,
    holds: Arc<Mutex<Holds>>,
    replies: Arc<VoteReplies>,
}

impl ElectionGate {
    /// The gate of `raft`, whose network notes its vote replies in `replies`.
    pub fn new(raft: Raft, replies: Arc<VoteReplies>) -> Self {
        Self { raft, holds: Arc::default(), replies }
    }

    /// Sets or lifts one reason to hold elections.
    pub fn hold(&self, why: Hold, held: bool) {
        // The lock covers the switch too, so that two callers cannot set it out of order.
        let mut holds = self.holds.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let may_elect = holds.set(why, held);
        self.raft.runtime_config().elect(may_elect);
    }

    /// Whether no reason holds this node's elections.
    pub fn may_elect(&self) -> bool {
        *self.holds.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) == Holds::default()
    }

    /// Holds elections for `Hold::Start` until this node hears from a leader (its server
    /// metrics name one), or for `at_most` when none is heard from (a whole cluster
    /// starting). A task on the current runtime lifts it.
    pub fn hold_until_leader_heard(&self, at_most: Duration) {
        self.hold(Hold::Start, true);
        let gate = self.clone();
        let mut metrics = self.raft.server_metrics();
        tokio::spawn(async move {
            // Ends early, too, when Raft shuts down (the metrics' sender is dropped).
            let _ = tokio::time::timeout(at_most, metrics.wait_until(|m| m.current_leader.is_some())).await;
            gate.hold(Hold::Start, false);
        });
    }

    /// Starts the split-vote breaker (see the module's doc); it ends when Raft shuts down.
    pub fn spawn_split_vote_breaker(&self) {
        let config = self.raft.config();
        let range = split_vote_range(config.election_timeout_min, config.election_timeout_max);
        tokio::spawn(break_split_votes(self.clone(), self.raft.server_metrics(), range));
    }
}

/// The rounds this node stands in, as its metrics show them.
#[derive(Debug, Default)]
struct Rounds {
    last_term: u64,
}

impl Rounds {
    /// Whether this node has just begun a round: a candidate in a term it had not stood in.
    fn begun(&mut self, state: ServerState, term: u64) -> bool {
        if state == ServerState::Candidate && term > self.last_term {
            self.last_term = term;
            return true;
        }
        false
    }
}

/// Watches the server metrics (state and vote), which change with elections only, not with
/// every commit as the full metrics do.
async fn break_split_votes(gate: ElectionGate, mut metrics: ServerMetrics, range: std::ops::Range<Duration>) {
    use rand::Rng;
    let mut rounds = Rounds::default();
    let mut held = false;
    loop {
        let (state, term) = {
            let m = metrics.borrow_and_update();
            (m.state, m.vote.leader_id().term())
        };
        if held && state != ServerState::Candidate {
            // Won, or following another candidate or a leader: openraft's timer is back in charge.
            gate.hold(Hold::SplitVote, false);
            held = false;
        }
        if rounds.begun(state, term) {
            if !held {
                gate.hold(Hold::SplitVote, true);
                held = true;
            }
            let wait = rand::rng().random_range(range.clone());
            let ended = tokio::time::timeout(
                wait,
                metrics.wait_until(move |m| m.state != ServerState::Candidate || m.vote.leader_id().term() != term),
            );
            if ended.await.is_err() {
                if gate.replies.greater_log_seen_in(term) {
                    // It cannot win: openraft's timer, longer after a longer log, decides.
                    gate.hold(Hold::SplitVote, false);
                    held = false;
                } else if gate.raft.trigger().elect(false).await.is_err() {
                    return;
                }
                // Otherwise still a candidate of this round: it stood again just now; the new
                // round is seen (and drawn for) on a later turn of the loop.
            }
            continue;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elections_run_only_when_no_reason_holds_them() {
        let mut holds = Holds::default();
        assert!(!holds.set(Hold::Start, true));
        assert!(!holds.set(Hold::SplitVote, true));
        // The split-vote hold ends during the start hold: still held.
        assert!(!holds.set(Hold::SplitVote, false));
        assert!(!holds.set(Hold::SplitVote, true));
        assert!(!holds.set(Hold::Start, false));
        assert!(holds.set(Hold::SplitVote, false));
        // Lifting a reason that was not set changes nothing.
        assert!(holds.set(Hold::Start, false));
        assert!(!holds.set(Hold::SplitVote, true));
        assert!(!holds.set(Hold::SplitVote, true), "setting twice, then lifting once, lifts it");
        assert!(holds.set(Hold::SplitVote, false));
    }

    #[test]
    fn a_candidate_stands_again_within_a_range_wider_than_a_tick() {
        let range = split_vote_range(120, 200);
        assert_eq!((range.start, range.end), (Duration::from_millis(120), Duration::from_millis(400)));
        // Wider than one of openraft's ticks (150 ms) and many times a vote's round trip on a
        // LAN (about 1 ms), so that two candidates seldom stand again within one of each other.
        assert!(range.end - range.start > Duration::from_millis(150));
    }

    #[test]
    fn a_reply_with_a_longer_log_is_noted_for_its_term_only() {
        let log = |index| Some(crate::raft::log_id(7, index));
        let request = |term, last| VoteRequest { vote: crate::raft::Vote::new(term, 3), last_log_id: last, leadership_transfer: false };
        let reply = |last| VoteResponse { vote: crate::raft::Vote::new(8, 3), vote_granted: false, last_log_id: last };
        let replies = VoteReplies::default();
        replies.note(&request(8, log(752)), &reply(log(752)));
        replies.note(&request(8, log(752)), &reply(None));
        assert!(!replies.greater_log_seen_in(8), "a log as long, or shorter, is no reason to wait");
        replies.note(&request(8, log(752)), &reply(log(753)));
        assert!(replies.greater_log_seen_in(8));
        assert!(!replies.greater_log_seen_in(9), "a later round has heard nothing yet");
        replies.note(&request(9, None), &reply(log(1)));
        assert!(replies.greater_log_seen_in(9) && !replies.greater_log_seen_in(8));
    }

    #[test]
    fn a_round_begins_once_per_term_and_only_as_a_candidate() {
        let mut rounds = Rounds::default();
        assert!(!rounds.begun(ServerState::Follower, 3));
        assert!(rounds.begun(ServerState::Candidate, 4));
        assert!(!rounds.begun(ServerState::Candidate, 4), "the same round seen again");
        assert!(!rounds.begun(ServerState::Leader, 4));
        assert!(rounds.begun(ServerState::Candidate, 6), "a later round after a split");
        assert!(!rounds.begun(ServerState::Candidate, 5), "a term it already passed");
        assert!(!rounds.begun(ServerState::Follower, 7));
    }
}
