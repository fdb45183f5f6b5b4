//! Counting requests in flight on a process or backend, so it can be drained: wait until
//! every request that got in has completed, optionally refusing new ones.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tokio::sync::Notify;

/// An in-flight counter with an optional gate.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    closed: AtomicBool,
    idle: Notify,
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
        self.count.fetch_add(1, SeqCst);
        InFlightGuard { owner: Arc::clone(self) }
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
}
