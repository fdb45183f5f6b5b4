//! What a controller collects for the leader and sends in batches (ended agent streams,
//! reports it took from agents): a queue with a bound, a wake-up and an off switch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

pub struct Queue<T> {
    pending: Mutex<Vec<T>>,
    wake: Notify,
    /// Set when this controller stops: nothing more is taken.
    stopping: AtomicBool,
    capacity: usize,
}

impl<T> Queue<T> {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Queue { pending: Mutex::new(Vec::new()), wake: Notify::new(), stopping: AtomicBool::new(false), capacity })
    }

    /// Queues `item`; false (and dropped) when full or stopping.
    pub fn push(&self, item: T) -> bool {
        if self.stopping.load(Ordering::Relaxed) {
            return false;
        }
        let mut pending = self.pending.lock().expect("relay queue lock");
        if pending.len() >= self.capacity {
            return false;
        }
        pending.push(item);
        drop(pending);
        self.wake.notify_one();
        true
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Waits until something was pushed since the last take.
    pub async fn pushed(&self) {
        self.wake.notified().await;
    }

    /// Takes the oldest items, at most `max`.
    pub fn take(&self, max: usize) -> Vec<T> {
        let mut pending = self.pending.lock().expect("relay queue lock");
        let n = pending.len().min(max);
        pending.drain(..n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_taken_oldest_first_in_bounded_batches_up_to_the_capacity_and_none_after_stop() {
        let q = Queue::new(5);
        for i in 0..7 {
            assert_eq!(q.push(i), i < 5, "item {i}");
        }
        assert_eq!(q.take(3), [0, 1, 2]);
        assert!(q.push(7));
        assert_eq!(q.take(10), [3, 4, 7]);
        assert!(q.take(10).is_empty());
        q.stop();
        assert!(!q.push(8));
        assert!(q.take(10).is_empty());
    }
}
