use std::pin::Pin;

use proto::control_plane_client::ControlPlaneClient;
use proto::control_plane_server::ControlPlane;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::access::{self, may_read_kind};
use super::convert::{parse_kind, resource_to_proto, spec_from_proto};
use super::errors::{permission_denied, ApiError};
use super::forward::{forwarded_request, to_leader, was_forwarded};
use super::paging;
use super::watch;
use crate::client::MAX_READ_MESSAGE;
use crate::controller::Controller;
use crate::loops::LoopSettings;
use crate::provision::quota::Quota;
use crate::resources::limits::{MAX_BATCH_BYTES, MAX_BATCH_PUTS};
use crate::resources::{validate_name, validate_spec, ErrorCode, FieldError, Kind, Spec};
use crate::security::{caller, Principal};
use crate::state::{Command, Request as SmRequest, WriteMode};

/// The resource API: create / update / get / list / delete / watch.
pub struct ResourceService {
    controller: Controller,
    /// The strategy and where planning runs, for the quota check at admission.
    loops: LoopSettings,
}

impl ResourceService {
    pub fn new(controller: Controller, loops: LoopSettings) -> Self {
        Self { controller, loops }
    }

    /// Each Service the command puts for a tenant with a quota is planned alone first
    /// (`provision::quota::admits`), off the runtime's workers: refused, naming the quota,
    /// when it cannot fit it even with nothing else of its tenant's. Services of tenants
    /// without a quota cost one lookup. Each is planned on the catalogue alone
    /// (`ClusterState::catalogue_only`), so a batch costs O(its services), not O(its
    /// services x the cluster's).
    async fn admit(&self, command: &Command) -> Result<(), ApiError> {
        let puts: Vec<(String, String, String, Spec)> = match command {
            Command::Put { name, tenant, spec: spec @ Spec::Service(_), .. } => {
                vec![(String::new(), name.clone(), tenant.clone(), spec.clone())]
            }
            Command::Batch { puts } => puts
                .iter()
                .enumerate()
                .filter_map(|(i, p)| match p {
                    Command::Put { name, tenant, spec: spec @ Spec::Service(_), .. } => {
                        Some((format!("puts[{i}]."), name.clone(), tenant.clone(), spec.clone()))
                    }
                    _ => None,
                })
                .collect(),
            _ => return Ok(()),
        };
        let limited = |d: &crate::raft::SmData, tenant: &str| matches!(d.cluster.get(Kind::Tenant, tenant).map(|t| &t.spec), Some(Spec::Tenant(t)) if Quota::of(t).is_limited());
        let (cluster, puts) = self.controller.read(|d| {
            let puts: Vec<_> = puts.into_iter().filter(|(_, _, tenant, _)| limited(d, tenant)).collect();
            (if puts.is_empty() { None } else { Some(d.cluster.catalogue_only()) }, puts)
        });
        let Some(cluster) = cluster else { return Ok(()) };
        let strategy = self.loops.mig_strategy;
        crate::loops::off_runtime(&self.loops, "the quota check", move |_cancel| {
            puts.into_iter().try_for_each(|(prefix, name, tenant, spec)| {
                let what_if = cluster.resources_with(&name, &tenant, spec);
                crate::provision::quota::admits(&what_if, &name, strategy)
                    .map_err(|e| FieldError { field: format!("{prefix}{}", e.field), ..e })
            })
        })
        .await?
        .map_err(ApiError::from)
    }
}

/// The state machine's request id of a client's `given` one: scoped by its principal, so
/// that de-duplication is keyed by (principal, request id): a tenant that reuses another's
/// id gets neither that tenant's answer nor its write swallowed. A forwarded request comes
/// with the id the first controller scoped, which is kept as it is. A client that gives
/// none gets a fresh one.
fn request_id(caller: &Principal, given: &str) -> Result<String, FieldError> {
    use crate::resources::limits::MAX_REQUEST_ID_LEN;
    let scope = format!("{caller}/");
    let given = given.strip_prefix(scope.as_str()).unwrap_or(given);
    if given.len() > MAX_REQUEST_ID_LEN {
        return Err(FieldError::invalid("request_id", format!("is {} bytes long; the limit is {MAX_REQUEST_ID_LEN}", given.len())));
    }
    if given.chars().any(char::is_control) {
        return Err(FieldError::invalid("request_id", "must not contain control characters"));
    }
    let id = if given.is_empty() { uuid::Uuid::new_v4().to_string() } else { given.to_string() };
    Ok(format!("{scope}{id}"))
}

/// Builds the state-machine command for a put, checking everything that needs no state.
fn put_command(caller: &Principal, req: &proto::PutRequest) -> Result<SmRequest, FieldError> {
    let r = req.resource.as_ref().ok_or_else(|| FieldError::invalid("resource", "required"))?;
    let command = if req.status_only {
        validate_name("name", &r.name)?;
        let kind = parse_kind("kind", &r.kind)?;
        let status = if r.status_json.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&r.status_json).map_err(|e| FieldError::invalid("status", format!("not valid JSON: {e}")))?
        };
        Command::PutStatus { kind, name: r.name.clone(), status: status.into(), expected_version: r.resource_version }
    } else {
        registration(caller, spec_command(r, req.mode)?)
    };
    Ok(SmRequest { request_id: request_id(caller, &req.request_id)?, command, trace_parent: None })
}

/// The `Put` of `r`'s spec in write mode `mode` (a `proto::WriteMode`), checked as far as
/// no state is needed.
fn spec_command(r: &proto::Resource, mode: i32) -> Result<Command, FieldError> {
    validate_name("name", &r.name)?;
    let spec = spec_from_proto(r)?;
    validate_spec(&spec)?;
    let mode = match proto::WriteMode::try_from(mode) {
        Ok(proto::WriteMode::Unspecified) => WriteMode::Upsert,
        Ok(proto::WriteMode::Create) => WriteMode::Create,
        Ok(proto::WriteMode::Update) => WriteMode::Update,
        Err(_) => return Err(FieldError::invalid("mode", format!("unknown write mode {mode}"))),
    };
    Ok(Command::Put { name: r.name.clone(), tenant: r.tenant.clone(), spec, mode, expected_version: r.resource_version })
}

/// A node's write of its own Node is its registration: its address and instance type stay
/// as first registered ([`WriteMode::NodeRegistration`]). Decided where the write is
/// applied, so a follower's stale view cannot let a change through.
fn registration(caller: &Principal, command: Command) -> Command {
    match (caller, command) {
        (Principal::Node(_), Command::Put { name, tenant, spec: spec @ Spec::Node(_), expected_version, .. }) => {
            Command::Put { name, tenant, spec, mode: WriteMode::NodeRegistration, expected_version }
        }
        (_, command) => command,
    }
}

/// Builds the state-machine command for a batch of puts, checking everything that needs no
/// state: its bounds ([`MAX_BATCH_PUTS`], [`MAX_BATCH_BYTES`]) and each put as a single
/// one is, its errors naming it as `puts[i]`.
fn batch_command(caller: &Principal, req: &proto::PutManyRequest) -> Result<SmRequest, FieldError> {
    let count = req.resources.len();
    if count == 0 || count > MAX_BATCH_PUTS {
        return Err(FieldError::invalid("resources", format!("{count} resources; a batch holds 1 to {MAX_BATCH_PUTS}")));
    }
    let bytes: usize = req.resources.iter().map(|r| r.spec_json.len()).sum();
    if bytes > MAX_BATCH_BYTES {
        return Err(FieldError::invalid(
            "resources",
            format!("{bytes} bytes of specs; a batch holds at most {MAX_BATCH_BYTES} (split it, as gpuctl apply does)"),
        ));
    }
    let puts = req
        .resources
        .iter()
        .enumerate()
        .map(|(i, r)| {
            spec_command(r, req.mode)
                .map(|c| registration(caller, c))
                .map_err(|e| FieldError { field: format!("puts[{i}].{}", e.field), ..e })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SmRequest { request_id: request_id(caller, &req.request_id)?, command: Command::Batch { puts }, trace_parent: None })
}

fn not_found(kind: Kind, name: &str) -> Status {
    ApiError::Field(FieldError::new(ErrorCode::NotFound, "name", format!("{kind} {name:?} does not exist"))).into()
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ControlPlane for ResourceService {
    async fn put(&self, request: Request<proto::PutRequest>) -> Result<Response<proto::PutResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        let mut req = request.into_inner();
        // A tenant's services belong to it: an empty tenant means "mine".
        if let (Principal::Tenant(t), Some(r)) = (&caller, req.resource.as_mut()) {
            if r.tenant.is_empty() && !req.status_only {
                r.tenant = t.clone();
            }
        }
        let sm_request = put_command(&caller, &req).map_err(ApiError::from)?;
        // Pin the generated id so that a forwarded retry stays idempotent.
        req.request_id = sm_request.request_id.clone();
        let r = req.resource.as_ref().expect("checked by put_command");
        let kind = parse_kind("kind", &r.kind).map_err(ApiError::from)?;
        self.controller.read(|d| access::may_write(&caller, kind, &r.name, &r.tenant, req.status_only, d.cluster.get(kind, &r.name)))?;
        if !req.status_only {
            self.admit(&sm_request.command).await?;
        }
        match self.controller.write(sm_request).await {
            Ok(outcome) => Ok(Response::new(proto::PutResponse {
                resource: Some(resource_to_proto(&outcome.resource)),
                deduplicated: outcome.deduplicated,
            })),
            Err(ApiError::NotLeader { leader }) => {
                to_leader(&self.controller, forwarded, leader, |ch| async move {
                    ControlPlaneClient::new(ch).put(forwarded_request(req, &caller)).await
                })
                .await
            }
            Err(ApiError::Field(f)) if f.code == ErrorCode::AlreadyExists && f.field.starts_with("spec.gpus[") => {
                self.controller.telemetry.observe_gpu_claim_refused();
                Err(ApiError::Field(f).into())
            }
            // The service changed hands between the check above and the write: the state
            // machine's message names the owner, which only admins may see.
            // (Only that refusal: a quota refusal on `tenant` is about the caller's own tenant.)
            Err(ApiError::Field(f)) if f.field == "tenant" && f.code == ErrorCode::InvalidArgument && !caller.is_admin() => {
                Err(permission_denied("name", "this Service belongs to another tenant"))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn put_many(&self, request: Request<proto::PutManyRequest>) -> Result<Response<proto::PutManyResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        let mut req = request.into_inner();
        if let Principal::Tenant(t) = &caller {
            for r in req.resources.iter_mut().filter(|r| r.tenant.is_empty()) {
                r.tenant = t.clone();
            }
        }
        let sm_request = batch_command(&caller, &req).map_err(ApiError::from)?;
        req.request_id = sm_request.request_id.clone();
        self.controller.read(|d| {
            req.resources.iter().enumerate().try_for_each(|(i, r)| {
                let kind = parse_kind("kind", &r.kind).map_err(ApiError::from)?;
                access::may_write(&caller, kind, &r.name, &r.tenant, false, d.cluster.get(kind, &r.name))
                    .map_err(|s| permission_denied(&format!("puts[{i}]"), s.message()))
            })
        })?;
        self.admit(&sm_request.command).await?;
        match self.controller.write(sm_request).await {
            Ok(outcome) => Ok(Response::new(proto::PutManyResponse {
                written: outcome
                    .batch
                    .iter()
                    .map(|w| proto::Written {
                        kind: w.kind.to_string(),
                        name: w.name.clone(),
                        resource_version: w.resource_version,
                        created: w.created,
                    })
                    .collect(),
                deduplicated: outcome.deduplicated,
            })),
            Err(ApiError::NotLeader { leader }) => {
                to_leader(&self.controller, forwarded, leader, |ch| async move {
                    ControlPlaneClient::new(ch).put_many(forwarded_request(req, &caller)).await
                })
                .await
            }
            // As for `put`: a service that changed hands, named only to admins.
            Err(ApiError::Field(f)) if f.field.ends_with(".tenant") && f.code == ErrorCode::InvalidArgument && !caller.is_admin() => {
                Err(permission_denied(f.field.trim_end_matches(".tenant"), "this Service belongs to another tenant"))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, request: Request<proto::DeleteRequest>) -> Result<Response<proto::DeleteResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        let mut req = request.into_inner();
        let kind = parse_kind("kind", &req.kind).map_err(ApiError::from)?;
        validate_name("name", &req.name).map_err(ApiError::from)?;
        req.request_id = request_id(&caller, &req.request_id).map_err(ApiError::from)?;
        if !caller.is_admin() {
            let Principal::Tenant(t) = &caller else {
                return Err(permission_denied("kind", format!("{caller} may not delete {kind} resources")));
            };
            if kind != Kind::Service {
                return Err(permission_denied("kind", format!("{caller} may not delete {kind} resources")));
            }
            // Ownership is checked where the delete is written: a follower may not have
            // applied the tenant's own latest writes yet.
            if !self.controller.is_leader() {
                let leader = self.controller.leader();
                return to_leader(&self.controller, forwarded, leader, |ch| async move {
                    ControlPlaneClient::new(ch).delete(forwarded_request(req, &caller)).await
                })
                .await;
            }
            let current = self.controller.read(|d| d.cluster.get(kind, &req.name).filter(|r| r.tenant == *t).map(|r| r.resource_version));
            // Another tenant's service looks exactly like a missing one; the version pins the
            // delete to the service checked here.
            let Some(version) = current else { return Err(not_found(kind, &req.name)) };
            if req.expected_version == 0 {
                req.expected_version = version;
            }
        }
        let sm_request = SmRequest {
            request_id: req.request_id.clone(),
            command: Command::Delete { kind, name: req.name.clone(), expected_version: req.expected_version },
            trace_parent: None,
        };
        match self.controller.write(sm_request).await {
            Ok(outcome) => Ok(Response::new(proto::DeleteResponse {
                resource: Some(resource_to_proto(&outcome.resource)),
                deduplicated: outcome.deduplicated,
            })),
            Err(ApiError::NotLeader { leader }) => {
                to_leader(&self.controller, forwarded, leader, |ch| async move {
                    ControlPlaneClient::new(ch).delete(forwarded_request(req, &caller)).await
                })
                .await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::Resource>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        let req = request.into_inner();
        let kind = parse_kind("kind", &req.kind).map_err(ApiError::from)?;
        // Before the name is echoed in any answer (100 KB of it ended in an HTTP/2 error).
        validate_name("name", &req.name).map_err(ApiError::from)?;
        let visible = may_read_kind(&caller, kind)?;
        if !req.stale {
            if let Err(e) = self.controller.read_barrier().await {
                return match e {
                    ApiError::NotLeader { leader } => {
                        to_leader(&self.controller, forwarded, leader, |ch| async move {
                            ControlPlaneClient::new(ch)
                                .max_decoding_message_size(MAX_READ_MESSAGE)
                                .get(forwarded_request(req, &caller))
                                .await
                        })
                        .await
                    }
                    other => Err(other.into()),
                };
            }
        }
        // What the caller may not see does not exist for it.
        let found = self.controller.read(|d| d.cluster.get(kind, &req.name).filter(|r| visible.allows(r)).map(resource_to_proto));
        found.map(Response::new).ok_or_else(|| not_found(kind, &req.name))
    }

    async fn list(&self, request: Request<proto::ListRequest>) -> Result<Response<proto::ListResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        let req = request.into_inner();
        let kind = parse_kind("kind", &req.kind).map_err(ApiError::from)?;
        let visible = may_read_kind(&caller, kind)?;
        if let (Principal::Tenant(t), false) = (&caller, req.tenant.is_empty()) {
            if req.tenant != *t {
                return Err(permission_denied("tenant", format!("{caller} may list only its own tenant's resources")));
            }
        }
        let limit = paging::page_limit(req.limit).map_err(ApiError::from)?;
        let after = paging::decode_token(&req.continue_token, kind, &req.tenant).map_err(ApiError::from)?;
        if !req.stale {
            if let Err(e) = self.controller.read_barrier().await {
                return match e {
                    ApiError::NotLeader { leader } => {
                        to_leader(&self.controller, forwarded, leader, |ch| async move {
                            ControlPlaneClient::new(ch)
                                .max_decoding_message_size(MAX_READ_MESSAGE)
                                .list(forwarded_request(req, &caller))
                                .await
                        })
                        .await
                    }
                    other => Err(other.into()),
                };
            }
        }
        // One page in name order, resuming after the token's name (a range query).
        let response = self.controller.read(|d| {
            let candidates = d
                .cluster
                .list_after(kind, after.as_deref())
                .filter(|r| (req.tenant.is_empty() || r.tenant == req.tenant) && visible.allows(r));
            let (resources, more) = paging::page(candidates, limit, paging::RESOURCE_BYTES);
            let continue_token = match resources.last() {
                Some(last) if more => paging::encode_token(kind, &req.tenant, &last.name),
                _ => String::new(),
            };
            proto::ListResponse { resources, revision: d.cluster.revision(), continue_token }
        });
        Ok(Response::new(response))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<proto::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let caller = caller(&request)?;
        // This controller's count of streams per principal (`[limits] watches_per_principal`),
        // which the server puts in every request.
        let slots = crate::server::WatchSlots::of(&request);
        let req = request.into_inner();
        if !req.kind.is_empty() {
            may_read_kind(&caller, parse_kind("kind", &req.kind).map_err(ApiError::from)?)?;
        }
        let filter = watch::Filter::from_request(&req).map_err(ApiError::from)?;
        let (bounds, slot) = match &slots {
            Some(slots) => (slots.bounds(), Some(slots.take(&caller)?)),
            None => (Default::default(), None),
        };
        let metrics = self.controller.telemetry.clone();
        Ok(Response::new(watch::start(self.controller.sm.clone(), filter.visible_to(caller), req.from_revision, bounds, metrics, slot)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, spec_json: String) -> proto::Resource {
        proto::Resource { kind: "Service".into(), name: name.into(), tenant: "acme".into(), spec_json, ..Default::default() }
    }

    fn valid(name: &str) -> proto::Resource {
        service(name, r#"{"model": "resnet50", "slo": {"latency_ms": 50.0, "request_rate": 10.0}}"#.into())
    }

    fn admin() -> Principal {
        Principal::Admin("ops".into())
    }

    fn refused(resources: Vec<proto::Resource>) -> String {
        batch_command(&admin(), &proto::PutManyRequest { resources, ..Default::default() }).unwrap_err().field
    }

    #[test]
    fn a_batch_is_refused_at_its_bounds_before_any_state_is_read() {
        assert_eq!(refused(vec![]), "resources");
        assert_eq!(refused((0..=MAX_BATCH_PUTS).map(|i| valid(&format!("s{i}"))).collect()), "resources");
        let ok = batch_command(
            &admin(),
            &proto::PutManyRequest { resources: (0..MAX_BATCH_PUTS).map(|i| valid(&format!("s{i}"))).collect(), ..Default::default() },
        );
        assert!(matches!(ok.unwrap().command, Command::Batch { puts } if puts.len() == MAX_BATCH_PUTS));
        // Specs of MAX_BATCH_BYTES in all pass the bound (and fail later, as JSON); one byte more does not.
        let sized = |total: usize| vec![service("a", "x".repeat(total / 2)), service("b", "x".repeat(total - total / 2))];
        assert_ne!(refused(sized(MAX_BATCH_BYTES)), "resources");
        assert_eq!(refused(sized(MAX_BATCH_BYTES + 1)), "resources");
    }

    #[test]
    fn a_bad_put_is_named_by_its_place_in_the_batch() {
        assert_eq!(refused(vec![valid("a"), service("b", "{not json".into())]), "puts[1].spec");
        assert_eq!(refused(vec![valid("a"), valid("Not A Name")]), "puts[1].name");
    }

    #[test]
    fn request_ids_are_scoped_by_principal_once_and_bounded() {
        let acme = Principal::Tenant("acme".into());
        let globex = Principal::Tenant("globex".into());
        assert_eq!(request_id(&acme, "r1").unwrap(), "tenant:acme/r1");
        assert_ne!(request_id(&acme, "r1").unwrap(), request_id(&globex, "r1").unwrap());
        // A forwarded request keeps the id its first controller scoped.
        assert_eq!(request_id(&acme, "tenant:acme/r1").unwrap(), "tenant:acme/r1");
        // Another principal's scope is just part of the id.
        assert_eq!(request_id(&acme, "tenant:globex/r1").unwrap(), "tenant:acme/tenant:globex/r1");
        assert!(request_id(&acme, "").unwrap().starts_with("tenant:acme/"));
        use crate::resources::limits::MAX_REQUEST_ID_LEN;
        assert!(request_id(&acme, &"x".repeat(MAX_REQUEST_ID_LEN)).is_ok());
        assert_eq!(request_id(&acme, &"x".repeat(MAX_REQUEST_ID_LEN + 1)).unwrap_err().field, "request_id");
        assert_eq!(request_id(&acme, "a\nb").unwrap_err().field, "request_id");
    }

    #[test]
    fn a_nodes_write_of_its_node_is_a_registration() {
        let node = proto::Resource {
            kind: "Node".into(),
            name: "h1".into(),
            spec_json: r#"{"address": "h1:9000", "instance_type": "a2"}"#.into(),
            ..Default::default()
        };
        let put = proto::PutRequest { resource: Some(node), ..Default::default() };
        let mode = |p: &Principal| match put_command(p, &put).unwrap().command {
            Command::Put { mode, .. } => mode,
            other => panic!("{other:?}"),
        };
        assert_eq!(mode(&Principal::Node("h1".into())), WriteMode::NodeRegistration);
        assert_eq!(mode(&admin()), WriteMode::Upsert);
    }
}
