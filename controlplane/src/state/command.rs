use serde::{Deserialize, Serialize};

use crate::resources::{FieldError, Kind, Spec, StoredResource};

/// The application data of one Raft log entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Client-chosen idempotency key; a retried request with the same id applies once.
    pub request_id: String,
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteMode {
    /// Create if absent, else update.
    Upsert,
    Create,
    Update,
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
        status: serde_json::Value,
        expected_version: u64,
    },
    Delete {
        kind: Kind,
        name: String,
        expected_version: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandOutcome {
    /// The resource after the change (for a delete: as it was before).
    pub resource: StoredResource,
    /// True when the request id had been applied before and this is the recorded outcome.
    pub deduplicated: bool,
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
    pub resource: StoredResource,
}

impl ChangeEvent {
    pub fn kind(&self) -> Kind {
        self.resource.kind()
    }
}
