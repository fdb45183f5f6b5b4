//! Watch streams per principal on one controller (`[limits] watches_per_principal`) and the
//! bounds of each stream's queue (`watch_queue_events`, `watch_queue_kib`). One
//! [`WatchSlots`] per controller rides in every request's extensions (`server` puts it
//! there), so that `ResourceService::watch` finds it without a field of its own. Counts are
//! a map of counters, one per principal with a stream open, and a slot gives its count back
//! when the stream is dropped: no scan of anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::metrics::gauge::Gauge;
use tonic::Status;

use crate::security::{Principal, RateLimits};
use crate::telemetry::ControllerMetrics;

/// The bounds of one Watch stream's queue and of a principal's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchBounds {
    /// Changes waiting to be sent.
    pub events: usize,
    /// Bytes of encoded changes waiting to be sent.
    pub bytes: usize,
    /// Streams of one principal on this controller.
    pub per_principal: usize,
}

impl WatchBounds {
    pub fn of(limits: &RateLimits) -> Self {
        Self {
            events: limits.watch_queue_events as usize,
            bytes: limits.watch_queue_kib as usize * 1024,
            per_principal: limits.watches_per_principal as usize,
        }
    }
}

impl Default for WatchBounds {
    fn default() -> Self {
        Self::of(&RateLimits::default())
    }
}

/// This controller's Watch streams, counted per principal (cheap to clone: shared).
#[derive(Clone)]
pub struct WatchSlots {
    inner: Arc<Inner>,
}

struct Inner {
    bounds: WatchBounds,
    open: Mutex<HashMap<String, usize>>,
    metrics: ControllerMetrics,
    gauge: Gauge,
}

/// One open Watch stream of a principal: dropped with the stream, it gives its count back.
pub struct WatchSlot {
    inner: Arc<Inner>,
    principal: String,
}

impl WatchSlots {
    pub fn new(bounds: WatchBounds, metrics: ControllerMetrics) -> Self {
        let gauge = metrics.watch_streams();
        Self { inner: Arc::new(Inner { bounds, open: Mutex::default(), metrics, gauge }) }
    }

    /// The controller's slots, from a request's extensions (none outside `server`).
    pub fn of<T>(request: &tonic::Request<T>) -> Option<Self> {
        request.extensions().get::<Self>().cloned()
    }

    pub fn bounds(&self) -> WatchBounds {
        self.inner.bounds
    }

    /// A slot for one more stream of `principal`, or ResourceExhausted naming the bound.
    pub fn take(&self, principal: &Principal) -> Result<WatchSlot, Status> {
        let key = principal.to_meta();
        let bound = self.inner.bounds.per_principal;
        {
            let mut open = self.inner.open.lock().unwrap_or_else(PoisonError::into_inner);
            let n = open.entry(key.clone()).or_insert(0);
            if *n >= bound {
                drop(open);
                self.inner.metrics.observe_watch_refused();
                return Err(Status::resource_exhausted(format!(
                    "{principal} has {bound} Watch streams open on this controller, the most one principal may have \
                     ([limits] watches_per_principal = {bound}); end one before watching again"
                )));
            }
            *n += 1;
        }
        self.inner.gauge.inc();
        Ok(WatchSlot { inner: self.inner.clone(), principal: key })
    }

    /// Streams `principal` has open here.
    pub fn open(&self, principal: &Principal) -> usize {
        self.inner.open.lock().unwrap_or_else(PoisonError::into_inner).get(&principal.to_meta()).copied().unwrap_or(0)
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.inner.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                // Only principals with a stream open are kept: the map stays as small as that.
                open.remove(&self.principal);
            }
        }
        drop(open);
        self.inner.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_its_own_bound_and_a_dropped_stream_gives_its_slot_back() {
        let slots = WatchSlots::new(WatchBounds { per_principal: 2, ..WatchBounds::default() }, ControllerMetrics::default());
        let (acme, globex) = (Principal::Tenant("acme".into()), Principal::Tenant("globex".into()));
        let first = slots.take(&acme).unwrap();
        let _second = slots.take(&acme).unwrap();
        let refused = slots.take(&acme).err().expect("a third stream of acme");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("watches_per_principal = 2"), "{}", refused.message());
        let _other = slots.take(&globex).expect("another tenant's streams are counted apart");
        drop(first);
        assert_eq!(slots.open(&acme), 1);
        let _again = slots.take(&acme).expect("the dropped stream's slot is free again");
        assert_eq!(slots.inner.metrics.watch_streams().get(), 3);
    }
}
