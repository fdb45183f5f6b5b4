//! Watch streams: the current state or the changes after a revision, then live changes.
//! Served from the local applied state, so any controller can serve watchers.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::Status;

use super::access::Visibility;
use super::convert::{parse_kind, resource_to_proto};
use crate::raft::{SmData, SmShared, WatchSignal};
use crate::resources::{FieldError, Kind, StoredResource};
use crate::security::Principal;
use crate::state::{ChangeEvent, ChangeType};

pub struct Filter {
    kind: Option<Kind>,
    name: Option<String>,
    /// Whose view of the state this is (see `access`); `None`: everything.
    caller: Option<Principal>,
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

/// The full current state as ADDED events followed by a BOOKMARK.
fn full_state(data: &SmData, filter: &Filter, resync: bool) -> (Vec<proto::WatchEvent>, u64) {
    let revision = data.cluster.revision();
    let mut out = Vec::new();
    if resync {
        out.push(event(proto::EventType::Resync, None, revision));
    }
    for kind in Kind::ALL {
        for r in data.cluster.list(kind).filter(|r| filter.matches(r)) {
            out.push(event(proto::EventType::Added, Some(r), r.mod_revision));
        }
    }
    out.push(event(proto::EventType::Bookmark, None, revision));
    (out, revision)
}

fn initial(data: &SmData, filter: &Filter, from: u64) -> (Vec<proto::WatchEvent>, u64) {
    if from == 0 {
        return full_state(data, filter, false);
    }
    if from < data.history_floor {
        return full_state(data, filter, true);
    }
    let events = data.history.iter().filter(|e| e.revision > from && filter.matches(&e.resource)).map(|e| change(e)).collect();
    (events, from.max(data.history.back().map_or(from, |e| e.revision)))
}

pub fn start(sm: Arc<SmShared>, filter: Filter, from: u64) -> Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>> {
    // Subscribe before reading the state so no change falls between the two.
    let mut signals = sm.subscribe();
    // Every change up to `covered` is in what was sent; the signals queued behind it are
    // skipped. Changes after it are all sent, several of one revision included (one log
    // entry writes several resources: a batch of puts, agents' statuses, grouped requests).
    let (first, mut covered) = initial(&sm.data.load(), &filter, from);
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        for ev in first {
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
        }
        loop {
            let batch = match signals.recv().await {
                Ok(WatchSignal::Change(ev)) if ev.revision > covered => {
                    if filter.matches(&ev.resource) {
                        vec![change(&ev)]
                    } else {
                        vec![]
                    }
                }
                Ok(WatchSignal::Change(_)) => vec![],
                // The state was replaced, or this watcher fell too far behind: resend it all.
                Ok(WatchSignal::Reset { .. }) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let (events, revision) = full_state(&sm.data.load(), &filter, true);
                    covered = revision;
                    events
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            for ev in batch {
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}
