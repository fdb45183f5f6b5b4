//! The node agents' API: desired-state watch and reports, both served by any controller from
//! its applied state (a follower relays the reports it answered to the leader in batches,
//! `agents::report_relay`), and the controllers' relays to the leader.

use std::pin::Pin;

use prost::Message;
use tokio::time::Instant;

use proto::agent_client::AgentClient;
use proto::agent_server::Agent;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::errors::{not_leader_status, permission_denied, ApiError};
use super::forward::{forwarded_request, to_leader, was_forwarded};
use crate::agents::report_check::{check_report, slo_windows, ReportRefusal, SloWindow};
use crate::agents::report_relay::MAX_REPORTS_PER_BATCH;
use crate::agents::watch_ends::{self, MAX_ENDS_PER_RELAY};
use crate::agents::{desired_state, placement, SentVersions};
use crate::controller::Controller;
use crate::resources::{validate_name, ErrorCode, FieldError, Health, Kind, NodeStatus, ObservedGpu, ObservedWorkload, Spec, StatusJson};
use crate::security::{caller, Principal};
use crate::state::ClusterState;

/// What a controller makes of a report.
enum Checked {
    /// Judged here: the agent's answer, and the SLO windows the leader counts.
    Answered(proto::ReportResponse, Vec<SloWindow>),
    /// A follower behind the agent: the leader is to judge it.
    ToLeader,
}

pub struct AgentService {
    controller: Controller,
}

impl AgentService {
    pub fn new(controller: Controller) -> Self {
        Self { controller }
    }

    /// Checks `req` against this controller's applied state (one node's entry of the
    /// desired-state index, not a scan of the plan); drops the windows of services moved
    /// away from a lagging agent; the answer to the agent, with the report's SLO windows
    /// when `leading` (only the leader counts them). A follower that has not applied the
    /// node, or the version the agent reports, judges nothing: `Checked::ToLeader`.
    fn check(&self, req: &mut proto::ReportRequest, leading: bool) -> Result<Checked, Status> {
        self.controller.read(|d| self.check_against(&d.cluster, req, leading))
    }

    /// [`Self::check`] against `cluster`, borrowing from it (nothing of the state is copied).
    fn check_against(&self, cluster: &ClusterState, req: &mut proto::ReportRequest, leading: bool) -> Result<Checked, Status> {
        let node = cluster.get(Kind::Node, &req.node);
        let spec = node.and_then(|n| match &n.spec {
            Spec::Node(s) => Some(s),
            _ => None,
        });
        let placed = placement(cluster, &req.node);
        // Registered moments ago through the leader, or a desired state the agent got from
        // a controller further ahead: the leader is the one to judge the report.
        if !leading && spec.is_none_or(|_| req.applied_version > placed.version) {
            return Ok(Checked::ToLeader);
        }
        let Some(spec) = spec else {
            return Err(ApiError::Field(FieldError::new(
                ErrorCode::NotFound,
                "node",
                format!("node {:?} is not registered: put its Node resource first", req.node),
            ))
            .into());
        };
        let stale = match check_report(req, spec, &placed) {
            Ok(stale) => stale,
            Err(refusal) => {
                self.controller.telemetry.observe_report_refused(refusal.reason());
                tracing::warn!(node = %req.node, %refusal, "agent report refused");
                return Err(match refusal {
                    ReportRefusal::NotTheNodes(e) => permission_denied(&e.field, e.reason),
                    ReportRefusal::Invalid(e) => ApiError::Field(e).into(),
                });
            }
        };
        // Windows of services moved away from a lagging agent: never used (see check_report).
        for i in stale.into_iter().rev() {
            req.metrics.remove(i);
        }
        let report_interval_ms =
            u32::try_from(self.controller.report_pace.interval(cluster.count(Kind::Node)).as_millis()).unwrap_or(u32::MAX);
        let windows = if leading { slo_windows(req, &placed) } else { Vec::new() };
        let observed_digest = node.map_or(0, |n| NodeStatus::observed_digest(&n.status));
        Ok(Checked::Answered(proto::ReportResponse { desired_version: placed.version, report_interval_ms, observed_digest }, windows))
    }

    /// The leader keeps a checked report and counts its SLO windows; `answer` is what
    /// checking it answered (with the digest of the node's stored status).
    fn keep_counted(&self, req: proto::ReportRequest, answer: &proto::ReportResponse, windows: Vec<SloWindow>) {
        for w in windows {
            self.controller.telemetry.observe_slo_window(&w.tenant, &w.service, w.met);
            self.controller.slo_tally.add(&w.tenant, w.met);
        }
        self.keep(req, answer.observed_digest);
    }

    /// The leader keeps a checked report: observed state goes through Raft only when it
    /// differs from the status (whose report's digest is `stored`), written in the
    /// background (`StatusWriter`), so the report is answered without waiting for Raft;
    /// metrics stay in memory.
    ///
    /// A report without its GPUs writes nothing. Its observed state is the stored one; or,
    /// when its digest is not the stored one (the node was marked unhealthy, or a newer
    /// report written, since the agent was last answered), the answer named the stored
    /// digest and the agent's next report carries its GPUs.
    fn keep(&self, req: proto::ReportRequest, stored: u64) {
        if !req.gpus_unchanged {
            let digest = proto::observed_digest(&req);
            if !self.controller.status_writer.is_current(&req.node, stored, digest) {
                let status = observed_status(&req, digest);
                self.controller.status_writer.submit(&self.controller, &req.node, digest, status, req.encoded_len());
            }
        }
        self.controller.reports.record(req, Instant::now());
    }

    /// Checks and answers one agent report (see `Agent::report`).
    async fn answer_report(&self, request: Request<proto::ReportRequest>) -> Result<Response<proto::ReportResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let caller = caller(&request)?;
        let mut req = request.into_inner();
        validate_name("node", &req.node).map_err(ApiError::from)?;
        check_node(&caller, &req.node)?;
        let leading = self.controller.is_leader();
        if forwarded && !leading {
            // The sender's view of the leader is stale: let the agent retry.
            return Err(not_leader_status(self.controller.leader()));
        }
        let Checked::Answered(answer, windows) = self.check(&mut req, leading)? else {
            return to_leader(&self.controller, forwarded, self.controller.leader(), |ch| async move {
                AgentClient::new(ch).report(forwarded_request(req, &caller)).await
            })
            .await;
        };
        if leading {
            self.keep_counted(req, &answer, windows);
        } else {
            // Answered here from this controller's state; the leader gets it in a batch.
            self.controller.report_relay.submit(req).map_err(Status::unavailable)?;
        }
        Ok(Response::new(answer))
    }
}

/// An agent acts for its own node only; admins and controllers for any.
fn check_node(caller: &Principal, node: &str) -> Result<(), Status> {
    match caller {
        p if p.is_admin() => Ok(()),
        Principal::Node(own) if own == node => Ok(()),
        Principal::Node(own) => Err(permission_denied("node", format!("the certificate of node {own:?} does not speak for node {node:?}"))),
        other => Err(permission_denied("node", format!("{other} is not a node agent"))),
    }
}

/// A relay from another controller (admins may send one too): its message, once the caller
/// and the number of items in its `field` (at most `max`) are checked.
fn relayed<T>(request: Request<T>, field: &str, items: impl FnOnce(&T) -> usize, max: usize) -> Result<T, Status> {
    let caller = caller(&request)?;
    if !caller.is_admin() {
        return Err(permission_denied(field, format!("{caller} may not relay what agents did: controllers only")));
    }
    let message = request.into_inner();
    let n = items(&message);
    if n > max {
        return Err(ApiError::Field(FieldError::invalid(field, format!("{n} items in one request; at most {max}"))).into());
    }
    Ok(message)
}

type DesiredStream = Pin<Box<dyn Stream<Item = Result<proto::DesiredState, Status>> + Send>>;

/// The observed part of a report, whose digest is `digest`, as the Node's status (what
/// `gpuctl get node` shows).
fn observed_status(r: &proto::ReportRequest, digest: u64) -> StatusJson {
    let gpus = r
        .gpus
        .iter()
        .map(|g| ObservedGpu {
            gpu_uuid: g.gpu_uuid.clone(),
            model: g.model.clone(),
            mig_enabled: g.mig_enabled,
            instances: g.instances.iter().map(|i| format!("{}@{}", i.profile, i.start)).collect(),
            workloads: g
                .workloads
                .iter()
                .map(|w| ObservedWorkload {
                    service: w.service.clone(),
                    mig_instance: w.mig_instance,
                    mps_percent: w.mps_percent,
                    batch: w.batch,
                    state: w.state.clone(),
                    shadow: w.shadow,
                    pid: w.pid,
                })
                .collect(),
        })
        .collect();
    // The routers' addresses per service: what `gpuctl get endpoints` and load balancers
    // (watching Nodes) read. Only these stable fields go to the status, not the per-second
    // metrics, so reports do not churn the log.
    let endpoints = r.metrics.iter().filter(|m| !m.endpoint.is_empty()).map(|m| (m.service.clone(), m.endpoint.clone())).collect();
    NodeStatus { applied_version: r.applied_version, gpus, health: Health::Healthy, endpoints, observed_digest: digest }.to_status()
}

#[tonic::async_trait]
impl Agent for AgentService {
    type WatchDesiredStream = DesiredStream;

    async fn watch_desired(&self, request: Request<proto::WatchDesiredRequest>) -> Result<Response<DesiredStream>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        validate_name("node", &req.node).map_err(ApiError::from)?;
        check_node(&caller, &req.node)?;
        let sm = self.controller.sm.clone();
        // Subscribe before the first projection so that no change falls between the two.
        // Only this node's changes wake the stream (`state::DesiredIndex` knows which nodes
        // an entry changed), so a fleet of watchers costs nothing for a change elsewhere.
        let mut wake = sm.node_wakers.subscribe(&req.node);
        let (tx, rx) = mpsc::channel(16);
        let ends = self.controller.watch_ends.clone();
        ends.opened(&req.node, req.session);
        tokio::spawn(async move {
            let mut sent = SentVersions::from(req.from_version);
            loop {
                let desired = desired_state(&sm.data.load().cluster, &req.node);
                if sent.is_new(desired.version) && tx.send(Ok(desired)).await.is_err() {
                    return ends.ended(&req.node, req.session, tokio::time::Instant::now());
                }
                tokio::select! {
                    // The state machine is gone: this controller stops.
                    woken = wake.changed() => if woken.is_err() { return },
                    // The agent's side went away (its process, or its connection).
                    () = tx.closed() => return ends.ended(&req.node, req.session, tokio::time::Instant::now()),
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report(&self, request: Request<proto::ReportRequest>) -> Result<Response<proto::ReportResponse>, Status> {
        let started = std::time::Instant::now();
        let answer = self.answer_report(request).await;
        self.controller.telemetry.observe_report(started.elapsed());
        answer
    }

    async fn report_batch(&self, request: Request<proto::ReportBatchRequest>) -> Result<Response<proto::ReportBatchResponse>, Status> {
        let req = relayed(request, "reports", |r| r.reports.len(), MAX_REPORTS_PER_BATCH)?;
        if !self.controller.is_leader() {
            return Err(not_leader_status(self.controller.leader()));
        }
        for (i, report) in req.reports.into_iter().enumerate() {
            // Checked again against the leader's state: a refusal here drops this report
            // alone (the follower checked it against its own).
            let mut report = report;
            match validate_name("node", &report.node)
                .map_err(|e| Status::from(ApiError::from(e)))
                .and_then(|()| self.check(&mut report, true))
            {
                Ok(Checked::Answered(answer, windows)) => self.keep_counted(report, &answer, windows),
                // Not with `leading` set: the leader judges every report.
                Ok(Checked::ToLeader) => tracing::error!(report = i, "a relayed report was sent on from the leader"),
                Err(e) => tracing::warn!(report = i, error = %e.message(), "relayed report refused"),
            }
            // A batch is hundreds of reports: let the other tasks of this worker run.
            if i % 64 == 63 {
                tokio::task::yield_now().await;
            }
        }
        Ok(Response::new(proto::ReportBatchResponse {}))
    }

    async fn watches_ended(&self, request: Request<proto::WatchesEndedRequest>) -> Result<Response<proto::WatchesEndedResponse>, Status> {
        let req = relayed(request, "ended", |r| r.ended.len(), MAX_ENDS_PER_RELAY)?;
        for (i, e) in req.ended.iter().enumerate() {
            validate_name(&format!("ended[{i}].node"), &e.node).map_err(ApiError::from)?;
        }
        // Soft state of the leader alone: a follower (the sender's view of the leader is
        // stale) says so, and the sender drops the batch.
        if !self.controller.is_leader() {
            return Err(not_leader_status(self.controller.leader()));
        }
        watch_ends::record(&self.controller, &req.ended);
        Ok(Response::new(proto::WatchesEndedResponse {}))
    }

    async fn open_watches(&self, request: Request<proto::OpenWatchesRequest>) -> Result<Response<proto::OpenWatchesResponse>, Status> {
        let req = relayed(request, "nodes", |r| r.nodes.len(), MAX_ENDS_PER_RELAY)?;
        for (i, node) in req.nodes.iter().enumerate() {
            validate_name(&format!("nodes[{i}]"), node).map_err(ApiError::from)?;
        }
        Ok(Response::new(proto::OpenWatchesResponse { open: self.controller.watch_ends.open_of(&req.nodes) }))
    }
}
