use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::raft::NodeId;
use crate::resources::{ErrorCode, FieldError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Field(#[from] FieldError),
    /// This node cannot serve the request; `leader` is the current leader if known.
    #[error("not the leader")]
    NotLeader { leader: Option<(NodeId, String)> },
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Status {
        match err {
            ApiError::Field(f) => {
                let code = match f.code {
                    ErrorCode::InvalidArgument => Code::InvalidArgument,
                    ErrorCode::FailedPrecondition => Code::FailedPrecondition,
                    ErrorCode::AlreadyExists => Code::AlreadyExists,
                    ErrorCode::NotFound => Code::NotFound,
                    ErrorCode::ResourceExhausted => Code::ResourceExhausted,
                };
                let mut status = Status::new(code, f.to_string());
                if let Ok(v) = MetadataValue::try_from(f.field.as_str()) {
                    status.metadata_mut().insert(proto::meta::FIELD, v);
                }
                status
            }
            ApiError::NotLeader { leader } => not_leader_status(leader),
            ApiError::Unavailable(msg) => Status::unavailable(msg),
            ApiError::Internal(msg) => Status::internal(msg),
        }
    }
}

/// `PermissionDenied` naming `field` in the message and in the field metadata, like every
/// other refusal.
pub fn permission_denied(field: &str, reason: impl std::fmt::Display) -> Status {
    let mut status = Status::permission_denied(format!("{field}: {reason}"));
    if let Ok(v) = MetadataValue::try_from(field) {
        status.metadata_mut().insert(proto::meta::FIELD, v);
    }
    status
}

/// `Unavailable` carrying the leader's id and address (when known) so clients can retry there.
pub fn not_leader_status(leader: Option<(NodeId, String)>) -> Status {
    match leader {
        Some((id, addr)) => {
            let mut status = Status::unavailable(format!("not the leader; the leader is node {id} at {addr}"));
            let md = status.metadata_mut();
            md.insert(proto::meta::LEADER_ID, MetadataValue::from(id));
            if let Ok(v) = MetadataValue::try_from(addr.as_str()) {
                md.insert(proto::meta::LEADER_ADDR, v);
            }
            status
        }
        None => Status::unavailable("not the leader, and no leader is known yet (election in progress?)"),
    }
}
