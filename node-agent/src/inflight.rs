//! Counting requests in flight on a process or backend, so it can be drained: wait until
//! every request that got in has completed, optionally refusing new ones. It also adds up
//! the time during which at least one request was in flight (the backend's busy time).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// An in-flight counter with an optional gate.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    closed: AtomicBool,
    idle: Notify,
    busy: Mutex<BusyTime>,
}

/// Time with at least one request in flight: what has been added up, and since when the
/// current busy stretch runs.
#[derive(Debug, Default)]
struct BusyTime {
    total: Duration,
    since: Option<Instant>,
}

/// Counts one request until dropped (also when the request's future is cancelled).
#[derive(Debug)]
pub struct InFlightGuard {
    owner: Arc<InFlight>,
}

impl InFlight {
    pub fn new() -> Arc<Self> {
        Arc::new(InFlight::default())
    }

    /// Counts a request whatever the gate says (the router's re-check handles races).
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        if self.count.fetch_add(1, SeqCst) == 0 {
            self.note_busy_edge(Instant::now());
        }
        InFlightGuard { owner: Arc::clone(self) }
    }

    /// After the count went from or to zero: starts or ends a busy stretch. Judged from the
    /// count under the lock, so racing edges (one request leaving as another arrives) end
    /// in the state the count has, not in the order the threads got here.
    fn note_busy_edge(&self, now: Instant) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        match (self.count.load(SeqCst) > 0, busy.since) {
            (true, None) => busy.since = Some(now),
            (false, Some(since)) => {
                busy.total += now.saturating_duration_since(since);
                busy.since = None;
            }
            _ => {}
        }
    }

    /// Time so far with at least one request in flight.
    pub fn busy_time(&self) -> Duration {
        self.busy_time_at(Instant::now())
    }

    fn busy_time_at(&self, now: Instant) -> Duration {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        busy.total + busy.since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    /// Counts a request unless the gate is closed.
    pub fn try_enter(self: &Arc<Self>) -> Option<InFlightGuard> {
        if self.closed.load(SeqCst) {
            return None;
        }
        let guard = self.enter();
        // A close between the check and the increment may already have seen 0 and finished
        // draining: re-check after counting, so nothing slips in behind a drain.
        if self.closed.load(SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// Refuses new requests from now on ([`try_enter`](Self::try_enter) returns `None`).
    pub fn close(&self) {
        self.closed.store(true, SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    pub fn count(&self) -> usize {
        self.count.load(SeqCst)
    }

    /// Resolves once no request is in flight.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the check, so a guard dropped in between still wakes us.
            notified.as_mut().enable();
            if self.count.load(SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.owner.count.fetch_sub(1, SeqCst) == 1 {
            self.owner.note_busy_edge(Instant::now());
            self.owner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drains_after_the_last_guard_and_refuses_once_closed() {
        let f = InFlight::new();
        let a = f.try_enter().expect("open gate admits");
        let b = f.enter();
        assert_eq!(f.count(), 2);
        f.close();
        assert!(f.try_enter().is_none());
        assert_eq!(f.count(), 2, "a refused request is not counted");
        let waiter = tokio::spawn({
            let f = Arc::clone(&f);
            async move { f.wait_idle().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.expect("waiter resolves once idle");
        assert_eq!(f.count(), 0);
    }

    #[test]
    fn busy_time_counts_only_stretches_with_a_request_in_flight() {
        let f = InFlight::new();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Driven through the edge hook with explicit instants: 0-10 busy, 10-30 idle, 30-35
        // busy (the guards call the hook only when the count leaves or reaches zero).
        f.count.store(1, SeqCst);
        f.note_busy_edge(ms(0));
        assert_eq!(f.busy_time_at(ms(7)), Duration::from_millis(7), "a running stretch counts up to now");
        f.count.store(0, SeqCst);
        f.note_busy_edge(ms(10));
        assert_eq!(f.busy_time_at(ms(30)), Duration::from_millis(10), "idle time does not count");
        f.count.store(1, SeqCst);
        f.note_busy_edge(ms(30));
        f.count.store(0, SeqCst);
        f.note_busy_edge(ms(35));
        assert_eq!(f.busy_time_at(ms(100)), Duration::from_millis(15));
        // An edge that finds the count already back where it was changes nothing.
        f.note_busy_edge(ms(200));
        assert_eq!(f.busy_time_at(ms(300)), Duration::from_millis(15));
    }

    #[test]
    fn guards_start_and_end_busy_stretches() {
        let f = InFlight::new();
        assert_eq!(f.busy_time(), Duration::ZERO);
        let a = f.enter();
        std::thread::sleep(Duration::from_millis(2));
        drop(a);
        let after = f.busy_time();
        assert!(after > Duration::ZERO, "busy while the guard lived");
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(f.busy_time(), after, "nothing in flight: the busy time stands still");
    }
}
