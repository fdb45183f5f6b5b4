use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::resources::{FieldError, Kind, PlanPatch, Spec, StoredResource};

/// The application data of one Raft log entry: requests proposed together (group commit,
/// `raft::proposer`), applied in order, each with its own outcome, as if each had its own
/// entry. Their changes all carry the entry's index as revision, so no two may write the
/// same resource (a later one that does is refused: `ClusterState::apply_in_entry`). 1 to
/// [`crate::resources::limits::MAX_REQUESTS_PER_ENTRY`].
///
/// Encoded as `{"requests": [...]}`, once: a proposal keeps its JSON from when it was made
/// (on the leader) or decoded (from a peer or the disk), and writes that whenever it is
/// encoded again. Otherwise each entry was encoded by the leader for its log and once per
/// follower, and by each follower again for its own log: with agents' statuses (64 nodes'
/// observed state in an entry of ~0.5 MB) that was a tenth of the controllers' CPU in a
/// fleet-wide roll-out at 10,000 hosts (perf). The JSON is the same text either way, so
/// neither the log's format nor the peers' messages change.
#[derive(Clone)]
pub struct Proposal {
    requests: Vec<Request>,
    /// `requests` as JSON (`ProposalFields`); immutable, like `requests`, once made.
    encoded: Arc<RawValue>,
}

/// What a [`Proposal`] is encoded as.
#[derive(Serialize, Deserialize)]
struct ProposalFields<R> {
    requests: R,
}

impl Proposal {
    /// An entry of `requests` (encoded now, once).
    pub fn new(requests: Vec<Request>) -> Result<Self, serde_json::Error> {
        let encoded = serde_json::value::to_raw_value(&ProposalFields { requests: &requests })?;
        Ok(Proposal { requests, encoded: Arc::from(encoded) })
    }

    /// An entry of one request.
    pub fn one(request: Request) -> Result<Self, serde_json::Error> {
        Self::new(vec![request])
    }

    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    pub fn into_requests(self) -> Vec<Request> {
        self.requests
    }

    /// Refuses an entry of no requests or more than the bound (every request of it).
    pub fn check(&self) -> Result<(), FieldError> {
        use crate::resources::limits::MAX_REQUESTS_PER_ENTRY;
        match self.requests.len() {
            1..=MAX_REQUESTS_PER_ENTRY => Ok(()),
            n => {
                Err(FieldError::invalid("requests", format!("{n} requests in one log entry; an entry holds 1 to {MAX_REQUESTS_PER_ENTRY}")))
            }
        }
    }
}

/// Its requests are its value; the JSON is how they were written.
impl PartialEq for Proposal {
    fn eq(&self, other: &Self) -> bool {
        self.requests == other.requests
    }
}

impl std::fmt::Debug for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposal").field("requests", &self.requests).finish()
    }
}

/// What openraft's logs print of an entry: its size and first request, not its contents (an
/// entry may hold hundreds of KB of statuses).
impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.requests.first() {
            Some(first) => write!(f, "{} request(s) from {:?}", self.requests.len(), first.request_id),
            None => f.write_str("no requests"),
        }
    }
}

impl Serialize for Proposal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RawValue::serialize(&self.encoded, s)
    }
}

/// Only from JSON text (`serde_json::from_slice`/`from_str`, as the log and the peers'
/// messages are read): the text is kept, then decoded.
impl<'de> Deserialize<'de> for Proposal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let encoded: Box<RawValue> = Deserialize::deserialize(d)?;
        let fields: ProposalFields<Vec<Request>> = serde_json::from_str(encoded.get()).map_err(serde::de::Error::custom)?;
        Ok(Proposal { requests: fields.requests, encoded: Arc::from(encoded) })
    }
}

/// One client's write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Client-chosen idempotency key; a retried request with the same id applies once.
    pub request_id: String,
    pub command: Command,
    /// W3C `traceparent` of the proposal, so that every controller's `raft.apply` continues
    /// the writer's trace. Set by the proposer when traces are exported; it never changes
    /// what the command does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
}

impl Request {
    /// The resources this request writes (or refuses to write), as (kind, name); a
    /// `Batch` or `PutStatuses` names several.
    pub fn resources(&self) -> Vec<(Kind, &str)> {
        self.command.resources()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteMode {
    /// Create if absent, else update.
    Upsert,
    Create,
    Update,
    /// A node agent's registration of its own Node: create, or update an existing one
    /// whose address and instance type stay as first registered (only an admin's write
    /// changes them). Without it a node could point its address, and so the endpoints it
    /// reports, at another host, or claim a larger instance type.
    NodeRegistration,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    Put {
        name: String,
        tenant: String,
        spec: Spec,
        mode: WriteMode,
        /// 0 = unconditional; otherwise the resource must be at exactly this version.
        expected_version: u64,
    },
    PutStatus {
        kind: Kind,
        name: String,
        status: crate::resources::StatusJson,
        expected_version: u64,
    },
    /// Observed states of several resources of one kind in one Raft entry, each written on
    /// its own: a resource deleted meanwhile is skipped, not an error for the others (the
    /// outcome's `batch` lists those written). The leader's status writer groups agents'
    /// reports this way, so a fleet-wide re-plan costs an entry per group, not per host.
    /// 1 to [`crate::resources::limits::MAX_STATUSES_PER_ENTRY`]; unconditional.
    PutStatuses {
        kind: Kind,
        statuses: Vec<StatusPut>,
    },
    Delete {
        kind: Kind,
        name: String,
        expected_version: u64,
    },
    /// `Put`s applied together, in order, each seeing those before it: all of them or, if
    /// one is refused, none (its error names it as `puts[i]`). One Raft entry, so one
    /// manifest costs one commit and one provisioning pass. At most
    /// [`crate::resources::limits::MAX_BATCH_PUTS`]; Plans are not batched.
    Batch {
        puts: Vec<Command>,
    },
    /// Changes part of an existing Plan (see `resources::PlanPatch`).
    PatchPlan {
        name: String,
        patch: PlanPatch,
        /// As for `Put`; the patch was computed from this version.
        expected_version: u64,
    },
}

impl Command {
    /// See [`Request::resources`].
    pub fn resources(&self) -> Vec<(Kind, &str)> {
        match self {
            Command::Put { name, spec, .. } => vec![(spec.kind(), name.as_str())],
            Command::PutStatus { kind, name, .. } | Command::Delete { kind, name, .. } => vec![(*kind, name.as_str())],
            Command::PutStatuses { kind, statuses } => statuses.iter().map(|s| (*kind, s.name.as_str())).collect(),
            Command::Batch { puts } => puts.iter().flat_map(Command::resources).collect(),
            Command::PatchPlan { name, .. } => vec![(Kind::Plan, name.as_str())],
        }
    }
}

/// One resource's new status in a [`Command::PutStatuses`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusPut {
    pub name: String,
    /// Shared with the stored resource once applied (see `StoredResource::status`).
    pub status: crate::resources::StatusJson,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandOutcome {
    /// The resource after the change (for a delete: as it was before), shared with the
    /// state, the change's event and the de-duplication record (each held a copy).
    pub resource: std::sync::Arc<StoredResource>,
    /// True when the request id had been applied before and this is the recorded outcome.
    pub deduplicated: bool,
    /// For a `Batch`: each put's resource and its version after the write, in order
    /// (`resource` is the last one). Names only, so that a de-duplication record stays small.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<BatchItem>,
}

/// One put of a batch, as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    pub kind: Kind,
    pub name: String,
    pub resource_version: u64,
    /// Whether the batch created it (absent in outcomes recorded before this field).
    #[serde(default)]
    pub created: bool,
}

pub type CommandResult = Result<CommandOutcome, FieldError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One change to the state, as watchers see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChangeEvent {
    pub revision: u64,
    pub change_type: ChangeType,
    pub resource: std::sync::Arc<StoredResource>,
    /// The trace of the `raft.apply` that made this change (see `Request::trace_parent`),
    /// for the loops it triggers; local to this controller, never sent to watchers.
    #[serde(skip)]
    pub trace_parent: Option<String>,
}

impl ChangeEvent {
    pub fn kind(&self) -> Kind {
        self.resource.kind()
    }
}
