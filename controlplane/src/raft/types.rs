use std::io::Cursor;

use crate::state::{CommandResult, Proposal};

openraft::declare_raft_types!(
    /// gpuplane's openraft type configuration.
    pub TypeConfig:
        D = Proposal,
        // One per request of the entry; none for entries that carry no command (blank,
        // membership).
        R = Vec<CommandResult>,
        NodeId = u64,
        Node = super::member::Member,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type NodeId = u64;
pub type Node = super::member::Member;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, Node>;
pub type ServerState = openraft::ServerState;
pub type ClientWriteError = openraft::error::ClientWriteError<NodeId, Node>;
pub type ClientWriteResponse = openraft::raft::ClientWriteResponse<TypeConfig>;
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
pub type CheckIsLeaderError = openraft::error::CheckIsLeaderError<NodeId, Node>;
pub type ForwardToLeader = openraft::error::ForwardToLeader<NodeId, Node>;
pub use openraft::ChangeMembers;
pub use openraft::EntryPayload;

/// The id of the entry at `index` written by `leader` in `term` (for code outside this
/// module, which does not name openraft's types: tests that forge a log).
pub fn log_id(term: u64, leader: NodeId, index: u64) -> LogId {
    LogId::new(openraft::CommittedLeaderId::new(term, leader), index)
}
