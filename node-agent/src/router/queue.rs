//! What the router knows of a backend's queue, for ELSA (paris-elsa.txt Fig. 9, Eq. 1).
//!
//! The router cannot see inside a backend, so it infers the queue from the requests it sent
//! there and has not had answered: in send order, they form batches of up to the backend's
//! max batch (as its batcher forms them); the first batch is the one running, started when
//! it was sent or when the previous answer came back, whichever is later; the rest are
//! queued. Pure: times are ms since the router's epoch.

use planner::policy::elsa::{PartitionState, RunningQuery};
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Sent {
    ticket: u64,
    batch: u32,
    sent_ms: f64,
}

/// Requests sent to one backend and not yet answered.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendQueue {
    gpcs: u32,
    max_batch: u32,
    next_ticket: u64,
    unanswered: VecDeque<Sent>,
    last_answer_ms: Option<f64>,
}

impl BackendQueue {
    pub fn new(gpcs: u32, max_batch: u32) -> Self {
        BackendQueue { gpcs, max_batch: max_batch.max(1), next_ticket: 0, unanswered: VecDeque::new(), last_answer_ms: None }
    }

    /// Records a request of `batch` samples sent at `now_ms`; the ticket identifies it.
    pub fn sent(&mut self, batch: u32, now_ms: f64) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.unanswered.push_back(Sent { ticket, batch: batch.max(1), sent_ms: now_ms });
        ticket
    }

    /// Records the answer (or failure, or cancellation) of `ticket` at `now_ms`.
    pub fn answered(&mut self, ticket: u64, now_ms: f64) {
        if let Some(pos) = self.unanswered.iter().position(|s| s.ticket == ticket) {
            self.unanswered.remove(pos);
            self.last_answer_ms = Some(self.last_answer_ms.map_or(now_ms, |t| t.max(now_ms)));
        }
    }

    pub fn unanswered(&self) -> usize {
        self.unanswered.len()
    }

    /// ELSA's view of this backend at `now_ms`.
    pub fn partition_state(&self, now_ms: f64) -> PartitionState {
        let mut batches: Vec<(u32, f64)> = Vec::new();
        for s in &self.unanswered {
            match batches.last_mut() {
                Some((samples, _)) if *samples + s.batch <= self.max_batch => *samples += s.batch,
                _ => batches.push((s.batch, s.sent_ms)),
            }
        }
        let mut batches = batches.into_iter();
        let running = batches.next().map(|(batch, sent_ms)| {
            let started = self.last_answer_ms.map_or(sent_ms, |t| t.max(sent_ms));
            RunningQuery { batch, started_ms: started.min(now_ms) }
        });
        PartitionState { gpcs: self.gpcs, running, queued: batches.map(|(b, _)| b).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_unanswered_requests_into_a_running_batch_and_a_queue() {
        let mut q = BackendQueue::new(3, 8);
        assert_eq!(q.partition_state(0.0), PartitionState { gpcs: 3, running: None, queued: vec![] });
        let a = q.sent(4, 10.0);
        q.sent(4, 11.0);
        q.sent(2, 12.0);
        q.sent(8, 13.0);
        q.sent(1, 14.0);
        let s = q.partition_state(20.0);
        assert_eq!(s.running, Some(RunningQuery { batch: 8, started_ms: 10.0 }));
        assert_eq!(s.queued, vec![2, 8, 1]);
        // After the first answer the next batch counts as started then.
        q.answered(a, 30.0);
        let s = q.partition_state(31.0);
        assert_eq!(s.running, Some(RunningQuery { batch: 6, started_ms: 30.0 }));
        assert_eq!(s.queued, vec![8, 1]);
        assert_eq!(q.unanswered(), 4);
    }

    #[test]
    fn unknown_tickets_are_ignored_and_start_never_lies_in_the_future() {
        let mut q = BackendQueue::new(1, 4);
        q.answered(99, 5.0);
        assert_eq!(q.unanswered(), 0);
        let t = q.sent(1, 50.0);
        // A clock read slightly earlier than the send (another thread) is clamped.
        assert_eq!(q.partition_state(49.0).running, Some(RunningQuery { batch: 1, started_ms: 49.0 }));
        q.answered(t, 60.0);
        assert_eq!(q.partition_state(61.0).running, None);
    }
}
