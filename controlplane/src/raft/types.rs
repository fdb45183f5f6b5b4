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
        // Standard Raft terms: one leader per term, as in the Raft paper and etcd (issue 18).
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
        // tokio, with openraft's random draws (election timeouts, the first tick) from a
        // seed: `RaftSettings::random_seed`.
        AsyncRuntime = SeededRuntime,
);

/// The async runtime openraft runs on (see [`TypeConfig`]).
pub type SeededRuntime = openraft_rt::deterministic_rng::DeterministicRng<openraft::TokioRuntime>;

pub type NodeId = u64;
pub type Node = super::member::Member;
pub type Raft = openraft::Raft<TypeConfig, super::state_machine::StateMachineStore>;
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type StorageError = openraft::StorageError<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type SnapshotData = std::io::Cursor<Vec<u8>>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;
pub type ServerState = openraft::ServerState;
pub type ClientWriteError = openraft::error::ClientWriteError<TypeConfig>;
pub type ClientWriteResponse = openraft::raft::ClientWriteResponse<TypeConfig>;
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<TypeConfig, E>;
pub type CheckIsLeaderError = openraft::error::LinearizableReadError<TypeConfig>;
pub type ForwardToLeader = openraft::error::ForwardToLeader<TypeConfig>;
pub use openraft::ChangeMembers;
pub use openraft::EntryPayload;

/// The id of the entry at `index` written in `term` (for code outside this module, which
/// does not name openraft's types: tests that forge a log). With one leader per term, a log
/// id records only the term: the leader is implied, and not stored.
pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(openraft::type_config::alias::CommittedLeaderIdOf::<TypeConfig>::new(term), index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a data dir of format 6 holds, as openraft 0.9.25 (`single-term-leader`) wrote
    /// it: the vote, log entries, the committed id and the snapshot's metadata. 0.10 reads
    /// each the same and writes it back the same (the metadata with 0.9's snapshot id left
    /// empty: 0.10 has none), so the data dir's format does not change with the upgrade.
    #[test]
    fn what_openraft_0_9_stored_reads_back_the_same() {
        fn same<T: serde::Serialize + serde::de::DeserializeOwned>(json: &str) -> T {
            let value: T = serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(serde_json::to_string(&value).unwrap(), json);
            value
        }
        let vote: Vote = same(r#"{"leader_id":{"term":7,"voted_for":2},"committed":true}"#);
        assert_eq!(vote, Vote::new_committed(7, 2));
        let uncommitted: Vote = same(r#"{"leader_id":{"term":7,"voted_for":2},"committed":false}"#);
        assert_eq!(uncommitted, Vote::new(7, 2));
        let id: LogId = same(r#"{"leader_id":3,"index":42}"#);
        assert_eq!(id, log_id(3, 42));
        let blank: Entry = same(r#"{"log_id":{"leader_id":3,"index":42},"payload":"Blank"}"#);
        assert_eq!(blank.log_id, id);
        let membership = r#"{"configs":[[1,2]],"nodes":{"1":{"addr":"a:1"},"2":{"addr":"b:2"}}}"#;
        let entry: Entry = same(&format!(r#"{{"log_id":{{"leader_id":3,"index":42}},"payload":{{"Membership":{membership}}}}}"#));
        assert!(matches!(entry.payload, EntryPayload::Membership(ref m) if m.voter_ids().collect::<Vec<_>>() == [1, 2]));
        let committed: Option<LogId> = same(r#"{"leader_id":3,"index":42}"#);
        assert_eq!(committed, Some(id));
        let stored = format!(
            r#"{{"last_log_id":{{"leader_id":3,"index":42}},"last_membership":{{"log_id":{{"leader_id":3,"index":42}},"membership":{membership}}}"#
        );
        let meta: SnapshotMeta = serde_json::from_str(&format!(r#"{stored},"snapshot_id":"3-1-42-1"}}"#)).unwrap();
        assert_eq!(serde_json::to_string(&meta).unwrap(), format!(r#"{stored},"snapshot_id":""}}"#));
        assert_eq!(meta.last_membership.log_id(), &Some(id));
    }
}
