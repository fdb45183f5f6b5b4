//! Watch streams: the current state or the changes after a revision, then live changes.
//! Served from the local applied state, so any controller can serve watchers.
//!
//! A watcher holds what its client has not read yet, and no more than its bounds
//! ([`WatchBounds`], `[limits] watch_queue_events` / `watch_queue_kib`):
//!
//! - the state (or the history) it starts from is sent lazily, one resource each time the
//!   stream is polled (tonic polls it while the client's HTTP/2 window has room), from an
//!   O(1) copy of the applied state (persistent maps), never built up front;
//! - the changes applied meanwhile wait in the stream's own queue, which a task fills from
//!   the state machine's signals, with the changes this watcher may see only;
//! - a watcher whose queue passes its bounds is cut off: its queue (and the copy of the
//!   state it was sending) is dropped at once, and the stream ends with Aborted naming the
//!   revision to watch again from (also in [`RESUME_REVISION_META`]). A watch from it is
//!   served from the history (`WATCH_HISTORY` changes) while it is recent enough, else with
//!   the whole state again (RESYNC), as any resumption is.
//!
//! A watcher that has not finished receiving the state keeps that state's copy, and with it
//! every resource changed since; it is cut off once [`STATE_CHANGES_BOUND`] changes have
//! been applied, so that the versions kept for all watchers together are at most those the
//! latest changes replaced.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use prost::Message;
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::metadata::MetadataValue;
use tonic::Status;

use super::access::Visibility;
use super::convert::{parse_kind, resource_to_proto};
use crate::raft::{SmData, SmShared, WatchSignal};
use crate::resources::{FieldError, Kind, StoredResource};
use crate::security::Principal;
use crate::server::{WatchBounds, WatchSlot};
use crate::state::{ChangeEvent, ChangeType};
use crate::telemetry::ControllerMetrics;

/// Metadata of a watch cut off for falling behind: the revision to watch again from.
pub const RESUME_REVISION_META: &str = "x-gpuplane-resume-revision";

/// Changes applied while a watcher is being sent the state after which it is cut off (at
/// fleet scale, about ten seconds of the agents' status changes).
pub const STATE_CHANGES_BOUND: usize = 10_000;

pub struct Filter {
    kind: Option<Kind>,
    name: Option<String>,
    /// Whose view of the state this is (see `access`); `None`: everything.
    caller: Option<Principal>,
}

/// Which resources of a kind the state may hold for a filter.
enum Scan<'a> {
    None,
    One(&'a str),
    All,
}

impl Filter {
    pub fn from_request(req: &proto::WatchRequest) -> Result<Self, FieldError> {
        let kind = if req.kind.is_empty() { None } else { Some(parse_kind("kind", &req.kind)?) };
        let name = if req.name.is_empty() { None } else { Some(req.name.clone()) };
        Ok(Self { kind, name, caller: None })
    }

    /// Leaves out what `caller` may not read.
    pub fn visible_to(mut self, caller: Principal) -> Self {
        self.caller = Some(caller);
        self
    }

    fn matches(&self, r: &StoredResource) -> bool {
        self.kind.is_none_or(|k| r.kind() == k)
            && self.name.as_ref().is_none_or(|n| *n == r.name)
            && self.caller.as_ref().is_none_or(|c| Visibility::of(c, r.kind()).allows(r))
    }

    /// Where in `kind` the matches can be (`visibility`: the caller's of `kind`), so that
    /// sending the state looks up one resource instead of scanning a kind when it can.
    fn scan<'a>(&'a self, kind: Kind, visibility: &'a Option<Visibility>) -> Scan<'a> {
        if self.kind.is_some_and(|k| k != kind) {
            return Scan::None;
        }
        match (&self.name, visibility) {
            (_, Some(Visibility::Nothing)) => Scan::None,
            (Some(n), _) | (None, Some(Visibility::Named(n))) => Scan::One(n),
            (None, _) => Scan::All,
        }
    }
}

fn event(kind: proto::EventType, resource: Option<&StoredResource>, revision: u64) -> proto::WatchEvent {
    proto::WatchEvent { r#type: kind as i32, resource: resource.map(resource_to_proto), revision }
}

fn change(ev: &ChangeEvent) -> proto::WatchEvent {
    let kind = match ev.change_type {
        ChangeType::Added => proto::EventType::Added,
        ChangeType::Modified => proto::EventType::Modified,
        ChangeType::Deleted => proto::EventType::Deleted,
    };
    event(kind, Some(&ev.resource), ev.revision)
}

/// What waits in a watcher's queue.
enum Queued {
    /// A change and its encoded size.
    Change(proto::WatchEvent, usize),
    /// The state was replaced (a snapshot installed): the state is sent again.
    Reset,
}

/// The state a watcher is being sent.
struct Sending {
    /// An O(1) copy of the applied state; dropped when the watcher is cut off.
    data: Arc<SmData>,
    /// Changes applied since it was taken.
    changes: usize,
}

/// What the stream and the task that fills its queue share.
#[derive(Default)]
struct Queue {
    items: VecDeque<Queued>,
    bytes: usize,
    sending: Option<Sending>,
    /// Sending the state or the history the watch started from (or, after a reset, the
    /// state again): the client has every change up to `through` and no later one yet.
    catching_up: bool,
    /// Every change up to this revision is in what the stream gave its client.
    through: u64,
    /// Set when the queue ends: `Ok` when the state machine stopped, `Err` when cut off.
    end: Option<Result<(), Status>>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The stream, waiting for the queue.
    waker: AtomicWaker,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Cuts the watcher off: drops what it holds and ends it with Aborted naming where to watch
/// again from. `first_left_out`: the revision of the first change it will not be sent, when
/// known.
fn cut_off(q: &mut Queue, why: &str, first_left_out: Option<u64>, last_seen: u64, metrics: &ControllerMetrics) {
    let resume = if q.catching_up {
        q.through
    } else {
        match q.items.front() {
            Some(Queued::Change(ev, _)) => ev.revision - 1,
            Some(Queued::Reset) => q.through,
            None => first_left_out.unwrap_or(last_seen).saturating_sub(1).max(q.through),
        }
    };
    let message = match &q.sending {
        Some(s) => format!(
            "watch fell behind while being sent the state at revision {}: {why}; watch again from revision {resume}",
            s.data.cluster.revision()
        ),
        None => format!("watch fell behind at revision {resume}: {why}; watch again from revision {resume}"),
    };
    let mut status = Status::aborted(message);
    status.metadata_mut().insert(RESUME_REVISION_META, MetadataValue::from(resume));
    q.items.clear();
    q.bytes = 0;
    q.sending = None;
    q.end = Some(Err(status));
    metrics.observe_watch_cut_off();
}

/// Fills the queue from the state machine's signals until the watcher is cut off or the
/// state machine stops (aborted when the stream is dropped). Changes up to `covered` are in
/// what the stream starts with.
async fn follow(
    shared: Arc<Shared>,
    mut signals: broadcast::Receiver<WatchSignal>,
    filter: Arc<Filter>,
    covered: u64,
    bounds: WatchBounds,
    metrics: ControllerMetrics,
) {
    let mut last_seen = covered;
    let too_many = |events: usize, kib: usize| {
        format!(
            "{events} changes ({kib} KiB) waited to be sent to it, past the bounds of {} changes or {} KiB ([limits] \
             watch_queue_events, watch_queue_kib)",
            bounds.events,
            bounds.bytes / 1024
        )
    };
    loop {
        let signal = signals.recv().await;
        // Converted before the lock: the stream waits for it meanwhile.
        let step = match signal {
            Ok(WatchSignal::Change(ev)) if ev.revision <= covered => continue,
            Ok(WatchSignal::Change(ev)) => Ok((ev.revision, filter.matches(&ev.resource).then(|| change(&ev)))),
            Ok(WatchSignal::Reset { .. }) => Err(true),
            Err(broadcast::error::RecvError::Lagged(_)) => Err(false),
            Err(broadcast::error::RecvError::Closed) => {
                shared.lock().end.get_or_insert(Ok(()));
                shared.waker.wake();
                return;
            }
        };
        let mut q = shared.lock();
        if q.end.is_some() {
            return;
        }
        match step {
            Ok((revision, matched)) => {
                if let Some(s) = q.sending.as_mut() {
                    s.changes += 1;
                    if s.changes > STATE_CHANGES_BOUND {
                        let why = format!("{STATE_CHANGES_BOUND} changes were applied while it was");
                        cut_off(&mut q, &why, Some(revision), last_seen, &metrics);
                        break;
                    }
                }
                last_seen = revision;
                let Some(ev) = matched else { continue };
                let size = ev.encoded_len();
                // A change larger than the bytes bound still goes, alone.
                if !q.items.is_empty() && (q.items.len() >= bounds.events || q.bytes + size > bounds.bytes) {
                    let why = too_many(q.items.len() + 1, (q.bytes + size) / 1024);
                    cut_off(&mut q, &why, Some(revision), last_seen, &metrics);
                    break;
                }
                q.bytes += size;
                q.items.push_back(Queued::Change(ev, size));
            }
            Err(true) if q.items.len() >= bounds.events => {
                let why = too_many(q.items.len() + 1, q.bytes / 1024);
                cut_off(&mut q, &why, None, last_seen + 1, &metrics);
                break;
            }
            Err(true) => q.items.push_back(Queued::Reset),
            // This task fell behind the signals themselves (a starved runtime): what it
            // missed is unknown, so the watcher resumes from before it.
            Err(false) => {
                cut_off(&mut q, "the controller's change feed overran it", None, last_seen, &metrics);
                break;
            }
        }
        drop(q);
        shared.waker.wake();
    }
    shared.waker.wake();
}

/// Sending the state: the kinds in order, each in name order.
struct StateCursor {
    /// A RESYNC event goes first (the state replaces what the client had).
    resync: bool,
    kind: usize,
    /// The last resource sent of `Kind::ALL[kind]`.
    after: Option<String>,
    revision: u64,
}

impl StateCursor {
    fn new(revision: u64, resync: bool) -> Self {
        Self { resync, kind: 0, after: None, revision }
    }

    /// The next event of the state, or `None` after its last resource (the bookmark is the
    /// caller's).
    fn next(&mut self, data: &SmData, filter: &Filter) -> Option<proto::WatchEvent> {
        if std::mem::take(&mut self.resync) {
            return Some(event(proto::EventType::Resync, None, self.revision));
        }
        while let Some(&kind) = Kind::ALL.get(self.kind) {
            let visibility = filter.caller.as_ref().map(|c| Visibility::of(c, kind));
            let found = match filter.scan(kind, &visibility) {
                Scan::None => None,
                Scan::One(name) if self.after.is_none() => data.cluster.get(kind, name).filter(|r| filter.matches(r)),
                Scan::One(_) => None,
                Scan::All => data.cluster.list_after(kind, self.after.as_deref()).find(|r| filter.matches(r)),
            };
            match found {
                Some(r) => {
                    self.after = Some(r.name.clone());
                    return Some(event(proto::EventType::Added, Some(r), r.mod_revision));
                }
                None => {
                    self.kind += 1;
                    self.after = None;
                }
            }
        }
        None
    }
}

/// Sending the history after a revision.
struct HistoryCursor {
    history: imbl::Vector<Arc<ChangeEvent>>,
    next: usize,
    from: u64,
}

impl HistoryCursor {
    fn next(&mut self, filter: &Filter) -> Option<proto::WatchEvent> {
        while let Some(ev) = self.history.get(self.next) {
            self.next += 1;
            if ev.revision > self.from && filter.matches(&ev.resource) {
                return Some(change(ev));
            }
        }
        None
    }
}

enum Phase {
    State(StateCursor),
    History(HistoryCursor),
    Live,
    Done,
}

/// One watcher's stream (see the module).
pub struct Watch {
    sm: Arc<SmShared>,
    filter: Arc<Filter>,
    shared: Arc<Shared>,
    phase: Phase,
    /// Every change up to this revision is in the state or history the stream sends:
    /// queued ones at or below it are skipped.
    covered: u64,
    follower: tokio::task::AbortHandle,
    /// Its principal's count of streams, given back when the stream is dropped.
    _slot: Option<WatchSlot>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl Stream for Watch {
    type Item = Result<proto::WatchEvent, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if matches!(this.phase, Phase::Done) {
                return Poll::Ready(None);
            }
            let mut q = this.shared.lock();
            if let Some(end) = q.end.take() {
                this.phase = Phase::Done;
                return Poll::Ready(end.err().map(Err));
            }
            match &mut this.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::State(cursor) => {
                    let next = q.sending.as_ref().and_then(|s| cursor.next(&s.data, &this.filter));
                    if let Some(ev) = next {
                        return Poll::Ready(Some(Ok(ev)));
                    }
                    let revision = cursor.revision;
                    q.sending = None;
                    q.catching_up = false;
                    q.through = revision;
                    this.covered = revision;
                    this.phase = Phase::Live;
                    return Poll::Ready(Some(Ok(event(proto::EventType::Bookmark, None, revision))));
                }
                Phase::History(cursor) => match cursor.next(&this.filter) {
                    Some(ev) => {
                        q.through = q.through.max(ev.revision - 1);
                        return Poll::Ready(Some(Ok(ev)));
                    }
                    None => {
                        q.catching_up = false;
                        q.through = this.covered;
                        this.phase = Phase::Live;
                    }
                },
                Phase::Live => match q.items.pop_front() {
                    Some(Queued::Change(ev, size)) => {
                        q.bytes -= size;
                        if ev.revision > this.covered {
                            q.through = q.through.max(ev.revision - 1);
                            return Poll::Ready(Some(Ok(ev)));
                        }
                    }
                    // The state was replaced: send it again, from a copy taken now.
                    Some(Queued::Reset) => {
                        let data = this.sm.data.load_full();
                        let revision = data.cluster.revision();
                        q.sending = Some(Sending { data, changes: 0 });
                        q.catching_up = true;
                        this.covered = revision;
                        this.phase = Phase::State(StateCursor::new(revision, true));
                    }
                    None => {
                        // Registered under the lock: a change queued after it wakes us.
                        this.shared.waker.register(cx.waker());
                        return Poll::Pending;
                    }
                },
            }
        }
    }
}

/// A watch of what `filter` lets through, from revision `from` (0: the whole state first),
/// within `bounds`; `slot` is its principal's count, held as long as the stream.
pub fn start(
    sm: Arc<SmShared>,
    filter: Filter,
    from: u64,
    bounds: WatchBounds,
    metrics: ControllerMetrics,
    slot: Option<WatchSlot>,
) -> Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>> {
    Box::pin(watch(sm, filter, from, bounds, metrics, slot))
}

fn watch(sm: Arc<SmShared>, filter: Filter, from: u64, bounds: WatchBounds, metrics: ControllerMetrics, slot: Option<WatchSlot>) -> Watch {
    // Subscribe before reading the state so no change falls between the two.
    let signals = sm.subscribe();
    let data = sm.data.load_full();
    let filter = Arc::new(filter);
    let state_revision = data.cluster.revision();
    // Every change up to `covered` is in what is sent first; the signals queued behind it
    // are skipped. Changes after it are all sent, several of one revision included (one log
    // entry writes several resources: a batch of puts, agents' statuses, grouped requests).
    let (phase, covered, queue) = if from == 0 || from < data.history_floor {
        let queue = Queue { sending: Some(Sending { data, changes: 0 }), catching_up: true, through: from, ..Queue::default() };
        (Phase::State(StateCursor::new(state_revision, from != 0)), state_revision, queue)
    } else {
        let covered = from.max(data.history.back().map_or(from, |e| e.revision));
        let cursor = HistoryCursor { history: data.history.clone(), next: 0, from };
        (Phase::History(cursor), covered, Queue { catching_up: true, through: from, ..Queue::default() })
    };
    let shared = Arc::new(Shared { queue: Mutex::new(queue), waker: AtomicWaker::new() });
    let follower = tokio::spawn(follow(shared.clone(), signals, filter.clone(), covered, bounds, metrics)).abort_handle();
    Watch { sm, filter, shared, phase, covered, follower, _slot: slot }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Spec;
    use crate::storage::MemBackend;
    use tokio_stream::StreamExt;

    fn controller_state() -> Arc<SmShared> {
        crate::raft::StateMachineStore::open(Arc::new(MemBackend::new()), false).unwrap().shared()
    }

    fn changed(sm: &SmShared, kind: Kind, name: &str, revision: u64, display_name: &str) {
        let spec = match kind {
            Kind::Tenant => serde_json::json!({ "display_name": display_name }),
            _ => serde_json::json!({"model": "resnet50", "slo": {"latency_ms": 50.0, "request_rate": 10.0}}),
        };
        let resource = StoredResource {
            name: name.into(),
            tenant: if kind == Kind::Service { "acme".into() } else { String::new() },
            resource_version: revision,
            spec: Spec::from_json(kind, &spec.to_string()).unwrap(),
            status: serde_json::Value::Null.into(),
            create_revision: revision,
            mod_revision: revision,
        };
        let ev = ChangeEvent { revision, change_type: ChangeType::Added, resource: Arc::new(resource), trace_parent: None };
        sm.signals.send(WatchSignal::Change(Arc::new(ev))).unwrap();
    }

    fn bounds(events: usize, bytes: usize) -> WatchBounds {
        WatchBounds { events, bytes, per_principal: 16 }
    }

    /// Lets the task that fills the queue take every signal sent so far.
    async fn settle(w: &Watch) {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let _ = w;
    }

    async fn next(w: &mut Watch) -> Result<proto::WatchEvent, Status> {
        tokio::time::timeout(std::time::Duration::from_secs(10), w.next()).await.expect("an event").expect("the stream goes on")
    }

    fn kind_of(ev: &proto::WatchEvent) -> proto::EventType {
        proto::EventType::try_from(ev.r#type).unwrap()
    }

    #[tokio::test]
    async fn a_watcher_that_does_not_read_is_cut_off_naming_the_revision_to_watch_again_from() {
        let sm = controller_state();
        let metrics = ControllerMetrics::default();
        let mut w = watch(sm.clone(), Filter { kind: None, name: None, caller: None }, 0, bounds(3, 1 << 20), metrics.clone(), None);
        assert_eq!(kind_of(&next(&mut w).await.unwrap()), proto::EventType::Bookmark);
        changed(&sm, Kind::Tenant, "t11", 11, "");
        assert_eq!(next(&mut w).await.unwrap().revision, 11);
        // Not read: three changes wait, the fourth is one too many.
        for r in 12..=16 {
            changed(&sm, Kind::Tenant, &format!("t{r}"), r, "");
        }
        settle(&w).await;
        assert!(w.shared.lock().items.is_empty(), "the queue is dropped when the watcher is cut off");
        let err = next(&mut w).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        assert!(err.message().starts_with("watch fell behind at revision 11: 4 changes"), "{}", err.message());
        assert!(err.message().ends_with("watch again from revision 11"), "{}", err.message());
        assert_eq!(err.metadata().get(RESUME_REVISION_META).unwrap(), "11");
        assert!(w.next().await.is_none(), "the stream ends there");
        assert!(metrics.render(&Default::default()).contains("gpuplane_watches_cut_off_total 1"));
    }

    #[tokio::test]
    async fn changes_a_watcher_may_not_see_do_not_fill_its_queue_and_a_large_change_goes_alone() {
        let sm = controller_state();
        let services = Filter { kind: Some(Kind::Service), name: None, caller: None };
        let mut w = watch(sm.clone(), services, 0, bounds(2, 1024), ControllerMetrics::default(), None);
        assert_eq!(kind_of(&next(&mut w).await.unwrap()), proto::EventType::Bookmark);
        for r in 1..=10 {
            changed(&sm, Kind::Tenant, &format!("t{r}"), r, "");
        }
        changed(&sm, Kind::Service, "web", 11, "");
        settle(&w).await;
        assert_eq!(next(&mut w).await.unwrap().revision, 11, "ten Tenants went by, not queued");
        // Past the bytes bound alone: it still goes, as long as nothing else waits.
        changed(&sm, Kind::Tenant, "big", 12, "");
        let big = Filter { kind: Some(Kind::Tenant), name: None, caller: None };
        let mut t = watch(sm.clone(), big, 12, bounds(10, 100), ControllerMetrics::default(), None);
        changed(&sm, Kind::Tenant, "large", 13, &"x".repeat(200));
        assert_eq!(next(&mut t).await.unwrap().resource.unwrap().name, "large");
        changed(&sm, Kind::Tenant, "large", 14, &"x".repeat(200));
        changed(&sm, Kind::Tenant, "large", 15, &"x".repeat(200));
        settle(&t).await;
        let err = next(&mut t).await.unwrap_err();
        assert!(err.message().contains("watch again from revision 13"), "{}", err.message());
    }

    #[tokio::test]
    async fn a_replaced_state_is_sent_again_after_a_resync() {
        let sm = controller_state();
        let mut w =
            watch(sm.clone(), Filter { kind: None, name: None, caller: None }, 0, bounds(10, 1 << 20), ControllerMetrics::default(), None);
        assert_eq!(kind_of(&next(&mut w).await.unwrap()), proto::EventType::Bookmark);
        sm.signals.send(WatchSignal::Reset { revision: 0 }).unwrap();
        assert_eq!(kind_of(&next(&mut w).await.unwrap()), proto::EventType::Resync);
        assert_eq!(kind_of(&next(&mut w).await.unwrap()), proto::EventType::Bookmark);
        changed(&sm, Kind::Tenant, "after", 3, "");
        assert_eq!(next(&mut w).await.unwrap().resource.unwrap().name, "after");
    }
}
