//! Authentication and rate limiting in front of every service (a tonic interceptor): finds
//! the caller's principal, checks that the service accepts it, applies its rate limit and
//! leaves the principal in the request's extensions for the services' own checks.

use std::sync::Arc;
use std::time::Duration;

use tonic_types::{ErrorDetails, StatusExt};

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::limits::Limiter;
use super::{Principal, Security, Tokens};

/// The services of a controller, as far as access control goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Raft peer RPCs: controllers only, never rate limited.
    Raft,
    /// Resources (`ControlPlane`).
    Client,
    /// Membership (`Admin`).
    Admin,
    /// Node agents (`Agent`).
    Agent,
}

/// The authenticated caller, in the request's extensions.
#[derive(Clone, Debug)]
struct Caller(Principal);

/// The principal the gate found for this request.
pub fn caller<T>(request: &Request<T>) -> Result<Principal, Status> {
    request.extensions().get::<Caller>().map(|c| c.0.clone()).ok_or_else(|| Status::unauthenticated("no authenticated caller"))
}

/// Whether controller `id` is a member of the cluster as this node knows it: `None` while
/// it knows no membership yet (a new node, before the leader's first entries reach it).
pub type MemberCheck = Arc<dyn Fn(u64) -> Option<bool> + Send + Sync>;

pub struct Gatekeeper {
    insecure: bool,
    tokens: Tokens,
    tenants: Limiter,
    nodes: Limiter,
    members: MemberCheck,
}

impl Gatekeeper {
    /// `members` tells which controller ids a controller certificate may carry.
    pub fn new(security: &Security, members: MemberCheck) -> Arc<Self> {
        let l = &security.limits;
        Arc::new(Self {
            insecure: security.is_insecure(),
            tokens: security.tokens.clone(),
            tenants: Limiter::new(l.tenant_rps, l.tenant_burst),
            nodes: Limiter::new(l.node_rps, l.node_burst),
            members,
        })
    }

    pub fn gate(self: &Arc<Self>, api: Api) -> Gate {
        Gate { keeper: self.clone(), api }
    }

    /// The identity of the client certificate, if one was presented: refused when the CA
    /// signed it but it is revoked (its serial is in the tokens file's
    /// `revoked_certificates`), when it names a tenant (tenants present tokens, which the
    /// tokens file lists and can withdraw), or when it names a controller id that is not a
    /// member (`controller/0`, or a member since removed).
    fn certificate_principal<T>(&self, request: &Request<T>) -> Result<Option<Principal>, Status> {
        let Some(certs) = request.peer_certs() else { return Ok(None) };
        let Some(leaf) = certs.first() else { return Ok(None) };
        let identity = Principal::from_certificate(leaf).ok_or_else(|| {
            Status::unauthenticated("the client certificate names no gpuplane identity (spiffe://gpuplane/<role>/<name>)")
        })?;
        if self.tokens.is_revoked(&identity.serial) {
            return Err(Status::unauthenticated(format!(
                "the client certificate of {} (serial {}) is revoked",
                identity.principal, identity.serial
            )));
        }
        match identity.principal {
            Principal::Tenant(t) => Err(Status::unauthenticated(format!(
                "the client certificate names tenant {t:?}: tenants authenticate with a bearer token, not a certificate"
            ))),
            Principal::Controller(id) if (self.members)(id) == Some(false) => Err(Status::permission_denied(format!(
                "the client certificate names controller {id}, which is not a member of this cluster"
            ))),
            p => Ok(Some(p)),
        }
    }

    fn token_principal<T>(&self, request: &Request<T>) -> Result<Option<Principal>, Status> {
        let Some(value) = request.metadata().get(proto::meta::AUTHORIZATION) else { return Ok(None) };
        let token =
            proto::meta::bearer_token(value).ok_or_else(|| Status::unauthenticated("authorization: expected \"Bearer <token>\""))?;
        self.tokens.lookup(token).cloned().map(Some).ok_or_else(|| Status::unauthenticated("authorization: unknown token"))
    }

    /// The caller's principal, and whether it came forwarded by a controller (already
    /// rate limited at the controller that received it).
    fn authenticate<T>(&self, request: &Request<T>, api: Api) -> Result<(Principal, bool), Status> {
        let from_cert = self.certificate_principal(request)?;
        if let Some(Principal::Controller(_)) = &from_cert {
            // Only a controller may speak for another caller.
            if let Some(forwarded) = request.metadata().get(proto::meta::PRINCIPAL) {
                let principal = forwarded
                    .to_str()
                    .ok()
                    .and_then(Principal::from_meta)
                    .ok_or_else(|| Status::invalid_argument(format!("{}: not a principal", proto::meta::PRINCIPAL)))?;
                return Ok((principal, true));
            }
        }
        if api == Api::Raft {
            return match from_cert {
                Some(p @ Principal::Controller(_)) => Ok((p, false)),
                Some(other) => {
                    Err(Status::permission_denied(format!("the Raft peer service accepts controller certificates only, not {other}")))
                }
                None => Err(Status::unauthenticated("the Raft peer service needs a controller certificate")),
            };
        }
        match (self.token_principal(request)?, from_cert) {
            (Some(p), _) | (None, Some(p)) => Ok((p, false)),
            (None, None) => Err(Status::unauthenticated("no credentials: present a client certificate or a bearer token")),
        }
    }

    fn rate_limit(&self, principal: &Principal) -> Result<(), Status> {
        let (limiter, what, key) = match principal {
            Principal::Tenant(t) => (&self.tenants, "tenant", t),
            Principal::Node(n) => (&self.nodes, "node", n),
            Principal::Admin(_) | Principal::Controller(_) => return Ok(()),
        };
        limiter.check(key).map_err(|wait| {
            let ms = wait.as_millis().max(1) as u64;
            let mut status = Status::with_error_details(
                tonic::Code::ResourceExhausted,
                format!("rate limit of {what} {key:?} exceeded; retry in {ms} ms"),
                ErrorDetails::with_retry_info(Some(Duration::from_millis(ms))),
            );
            status.metadata_mut().insert(proto::meta::RETRY_AFTER_MS, MetadataValue::from(ms));
            status
        })
    }

    fn admit(&self, mut request: Request<()>, api: Api) -> Result<Request<()>, Status> {
        let principal = if self.insecure {
            Principal::Admin("insecure".into())
        } else {
            let (principal, forwarded) = self.authenticate(&request, api)?;
            if api != Api::Raft && !forwarded {
                self.rate_limit(&principal)?;
            }
            principal
        };
        request.extensions_mut().insert(Caller(principal));
        Ok(request)
    }
}

/// The interceptor of one service.
#[derive(Clone)]
pub struct Gate {
    keeper: Arc<Gatekeeper>,
    api: Api,
}

impl Interceptor for Gate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.keeper.admit(request, self.api)
    }
}
