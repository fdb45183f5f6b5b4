//! Forwarding of requests that only the leader can serve.

use std::future::Future;
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Request, Status};

use super::errors::not_leader_status;
use crate::controller::{Controller, NoLeaderChannel};
use crate::raft::NodeId;
use crate::security::Principal;

/// How long a forwarded request may take at the leader.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

pub fn was_forwarded<T>(req: &Request<T>) -> bool {
    req.metadata().contains_key(proto::meta::FORWARDED)
}

/// Wraps `message` for the leader, marked so that the leader never forwards it again, and
/// carrying the original caller, whom the leader authorizes again (it trusts that only
/// because this controller authenticates to it with a controller certificate).
pub fn forwarded_request<T>(message: T, caller: &Principal) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut().insert(proto::meta::FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    if let Ok(value) = tonic::metadata::MetadataValue::try_from(caller.to_meta()) {
        req.metadata_mut().insert(proto::meta::PRINCIPAL, value);
    }
    // The leader continues the caller's trace.
    crate::telemetry::tracing::inject(req.metadata_mut());
    req.set_timeout(FORWARD_TIMEOUT);
    req
}

/// Sends a request to the leader with `call`, or answers "not leader" (with the leader's
/// address when known) when it cannot be forwarded: no leader known, or this request was
/// itself forwarded (the sender's view of the leader is stale; let the client retry).
pub async fn to_leader<R, F, Fut>(
    controller: &Controller,
    already_forwarded: bool,
    leader: Option<(NodeId, String)>,
    call: F,
) -> Result<R, Status>
where
    F: FnOnce(Channel) -> Fut,
    Fut: Future<Output = Result<R, Status>>,
{
    match controller.leader_channel(leader.filter(|_| !already_forwarded)) {
        Ok((_, channel)) => call(channel).await,
        Err(NoLeaderChannel::Unknown) => Err(not_leader_status(controller.leader())),
        Err(NoLeaderChannel::ThisNode) => Err(Status::unavailable("leadership is changing; retry")),
        Err(NoLeaderChannel::Channel(e)) => Err(Status::internal(e)),
    }
}
