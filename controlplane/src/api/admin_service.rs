use std::collections::BTreeMap;
use std::time::Duration;

use proto::admin_client::AdminClient;
use proto::admin_server::Admin;
use tonic::{Request, Response, Status};

use super::access::require_admin;
use super::errors::ApiError;
use super::forward::{forwarded_request, to_leader, was_forwarded};
use crate::controller::Controller;
use crate::raft::Node;
use crate::resources::{ErrorCode, FieldError};
use crate::security::caller;

/// How long a forwarded AddMember may take at the leader: the probe of the new node and
/// its catch-up (`controller::PROBE_TIMEOUT`, `controller::CATCH_UP_TIMEOUT`), with room.
const ADD_MEMBER_FORWARD_TIMEOUT: Duration =
    Duration::from_secs(crate::controller::PROBE_TIMEOUT.as_secs() + crate::controller::CATCH_UP_TIMEOUT.as_secs() + 10);

/// Membership administration: bootstrap, add / remove members, leader transfer.
pub struct AdminService {
    controller: Controller,
}

impl AdminService {
    pub fn new(controller: Controller) -> Self {
        Self { controller }
    }

    fn membership_response(&self) -> Response<proto::MembershipResponse> {
        Response::new(proto::MembershipResponse { status: Some(self.controller.status()) })
    }
}

fn check_address(field: &str, addr: &str) -> Result<(), FieldError> {
    crate::raft::check_host_port(addr).map_err(|why| FieldError::invalid(field, why))
}

/// A member's addresses from a request's `{prefix}address` and `{prefix}peer_address`
/// (empty: none).
fn member_of(prefix: &str, address: &str, peer_address: &str) -> Result<Node, FieldError> {
    check_address(&format!("{prefix}address"), address)?;
    if peer_address.is_empty() {
        return Ok(Node::new(address));
    }
    check_address(&format!("{prefix}peer_address"), peer_address)?;
    Ok(Node::with_peer_addr(address, Some(peer_address.to_string())))
}

#[tonic::async_trait]
impl Admin for AdminService {
    /// Members, their addresses and log positions: for admins and controllers (a controller
    /// probes a node being added with it), not for tenants or node agents (README,
    /// "Security"). Agents never call it: they report to any controller, which relays.
    async fn cluster_status(
        &self,
        request: Request<proto::ClusterStatusRequest>,
    ) -> Result<Response<proto::ClusterStatusResponse>, Status> {
        require_admin(&caller(&request)?, "ClusterStatus")?;
        Ok(Response::new(self.controller.status()))
    }

    async fn initialize(&self, request: Request<proto::InitializeRequest>) -> Result<Response<proto::MembershipResponse>, Status> {
        require_admin(&caller(&request)?, "Initialize")?;
        let req = request.into_inner();
        if req.members.is_empty() {
            return Err(ApiError::from(FieldError::invalid("members", "at least one member is required")).into());
        }
        let mut members = BTreeMap::new();
        for (i, m) in req.members.iter().enumerate() {
            let member = member_of(&format!("members[{i}]."), &m.address, &m.peer_address).map_err(ApiError::from)?;
            if members.insert(m.node_id, member).is_some() {
                return Err(ApiError::from(FieldError::invalid(
                    format!("members[{i}].node_id"),
                    format!("duplicate node id {}", m.node_id),
                ))
                .into());
            }
        }
        if !members.contains_key(&self.controller.id) {
            return Err(ApiError::from(FieldError::invalid("members", format!("must include this node ({})", self.controller.id))).into());
        }
        self.controller.initialize(members).await?;
        Ok(self.membership_response())
    }

    async fn add_member(&self, request: Request<proto::AddMemberRequest>) -> Result<Response<proto::MembershipResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        require_admin(&caller, "AddMember")?;
        let req = request.into_inner();
        let member = member_of("", &req.address, &req.peer_address).map_err(ApiError::from)?;
        match self.controller.add_member(req.node_id, member, req.promote).await {
            Ok(()) => Ok(self.membership_response()),
            Err(ApiError::NotLeader { leader }) => {
                to_leader(&self.controller, forwarded, leader, |ch| async move {
                    // The leader probes the node and may wait for it to catch up.
                    let mut forwarded = forwarded_request(req, &caller);
                    forwarded.set_timeout(ADD_MEMBER_FORWARD_TIMEOUT);
                    AdminClient::new(ch).add_member(forwarded).await
                })
                .await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn remove_member(&self, request: Request<proto::RemoveMemberRequest>) -> Result<Response<proto::MembershipResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        require_admin(&caller, "RemoveMember")?;
        let req = request.into_inner();
        // Removing a node that is not a member changed nothing and answered OK. The leader's
        // membership decides (a follower's may be behind); others forward to it.
        if req.node_id == 0 {
            return Err(ApiError::from(FieldError::invalid("node_id", "0 is not a node id (node ids start at 1)")).into());
        }
        if self.controller.is_leader() {
            let members = self.controller.raft_status().members;
            if !members.contains_key(&req.node_id) {
                let ids: Vec<String> = members.keys().map(u64::to_string).collect();
                return Err(ApiError::from(FieldError::new(
                    ErrorCode::NotFound,
                    "node_id",
                    format!(
                        "node {} is not a member of the cluster (its members are {}); nothing was changed",
                        req.node_id,
                        ids.join(", ")
                    ),
                ))
                .into());
            }
        }
        match self.controller.remove_member(req.node_id).await {
            Ok(()) => Ok(self.membership_response()),
            Err(ApiError::NotLeader { leader }) => {
                to_leader(&self.controller, forwarded, leader, |ch| async move {
                    AdminClient::new(ch).remove_member(forwarded_request(req, &caller)).await
                })
                .await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Leader transfer to the named voter, or to the most caught-up one
    /// (`consensus::transfer_leadership`).
    async fn transfer_leader(&self, request: Request<proto::TransferLeaderRequest>) -> Result<Response<proto::MembershipResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        require_admin(&caller, "TransferLeader")?;
        let req = request.into_inner();
        let c = &self.controller;
        if !c.is_leader() {
            let leader = c.leader();
            return to_leader(c, forwarded, leader, |ch| async move {
                AdminClient::new(ch).transfer_leader(forwarded_request(req, &caller)).await
            })
            .await;
        }
        if req.to_node_id == c.id {
            return Ok(self.membership_response());
        }
        let Some(target) = c.transfer_target(req.to_node_id) else {
            return Err(ApiError::from(FieldError::new(ErrorCode::FailedPrecondition, "to_node_id", "no such voter to transfer to")).into());
        };
        c.transfer_leadership(target).await?;
        Ok(self.membership_response())
    }

    async fn compact(&self, request: Request<proto::CompactRequest>) -> Result<Response<proto::CompactResponse>, Status> {
        require_admin(&caller(&request)?, "Compact")?;
        Ok(Response::new(self.controller.compact().await?))
    }
}
