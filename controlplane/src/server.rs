//! Assembles and runs one controller node: data dir, Raft, gRPC services, bootstrap.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use proto::admin_server::AdminServer;
use proto::agent_server::AgentServer;
use proto::control_plane_server::ControlPlaneServer;
use proto::raft_service_server::RaftServiceServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::agents::AgentReports;
use crate::api::{AdminService, AgentService, ResourceService};
use crate::controller::Controller;
use crate::loops::{self, LoopSettings};
use crate::raft::{self, Node, NodeId, PeerChannels, RaftPeerService, RaftSettings, MAX_PEER_MESSAGE};
use crate::scrape::serve_controller;
use crate::security::{Api, Gatekeeper, Security};
use crate::storage::{open_data_dir, MemBackend, Watermark};
use crate::telemetry::ControllerMetrics;

/// Where a node keeps its state.
#[derive(Clone, Debug)]
pub enum StorageChoice {
    /// sled in this directory (production).
    DataDir(PathBuf),
    /// In memory, lost on exit (tests, simulation).
    Memory,
}

#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub id: NodeId,
    pub listen: SocketAddr,
    /// Address peers and clients use; defaults to the bound listen address.
    pub advertise: Option<String>,
    pub storage: StorageChoice,
    pub raft: RaftSettings,
    /// When set and the node has never been initialised, initialise the cluster with these
    /// members. Set it on exactly one node.
    pub bootstrap: Option<BTreeMap<NodeId, String>>,
    /// The leader-only loops (provisioner).
    pub loops: LoopSettings,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` over HTTP; none when unset.
    pub metrics_listen: Option<SocketAddr>,
    /// mTLS, tokens and rate limits; `Security::insecure()` for plaintext development runs.
    pub security: Security,
}

/// See `serve`: how often an idle connection is pinged, and how long the ping may go
/// unanswered before the connection is closed.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub struct RunningNode {
    pub controller: Controller,
    pub addr: SocketAddr,
    /// The bound address of `/metrics`, `/healthz` and `/readyz`, when served.
    pub metrics_addr: Option<SocketAddr>,
    metrics: Option<JoinHandle<()>>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    loops: Option<JoinHandle<()>>,
    /// Relays ended agent streams and reports to the leader; the runtime-lag probe.
    relays: Vec<JoinHandle<()>>,
    /// Where Raft runs (`RaftSettings::own_runtime`); declared last, so dropped last.
    raft_runtime: Option<raft::RaftRuntime>,
}

impl RunningNode {
    /// Resolves with a message when Raft stops on a fatal error (e.g. a storage fault);
    /// the process must then exit rather than serve from a node that can no longer persist.
    pub async fn fatal(&self) -> String {
        raft::consensus::stopped(&self.controller.raft).await
    }

    fn stop_relays(&mut self) {
        self.controller.watch_ends.stop();
        self.controller.report_relay.stop();
        for r in self.relays.drain(..) {
            r.abort();
        }
    }

    /// Stops serving and shuts Raft down (the data dir stays as it is).
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        // Agents' streams end from here on because this controller stops, not their agents.
        self.stop_relays();
        if let Some(l) = self.loops.take() {
            l.abort();
        }
        if let Some(m) = self.metrics.take() {
            m.abort();
        }
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        let _ = self.controller.raft.shutdown().await;
        drop(self.raft_runtime.take());
    }
}

impl Drop for RunningNode {
    fn drop(&mut self) {
        self.stop_relays();
        if let Some(l) = self.loops.take() {
            l.abort();
        }
        if let Some(m) = self.metrics.take() {
            m.abort();
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

pub async fn start_node(opts: NodeOptions) -> anyhow::Result<RunningNode> {
    let listener = TcpListener::bind(opts.listen).await.map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.listen))?;
    let metrics_listener = match opts.metrics_listen {
        Some(at) => Some(TcpListener::bind(at).await.map_err(|e| anyhow::anyhow!("metrics_listen: cannot listen on {at}: {e}"))?),
        None => None,
    };
    let addr = listener.local_addr()?;
    let channels = PeerChannels::with_tls(opts.security.tls.as_ref().map(|t| t.client_config()));
    // No Nagle on accepted connections: with it, a small answer written after a large
    // request (a follower's AppendEntries answer, a client's write answer) waited for the
    // peer's delayed ACK, 40 ms, and a new leader re-sending its log tail to a follower
    // took 40 ms per 512 KiB batch (the clients' and peers' own ends already set it).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    match opts.storage.clone() {
        StorageChoice::DataDir(dir) => {
            let backend = Arc::new(open_data_dir(&dir, opts.id)?);
            serve(opts, backend, Watermark::in_dir(&dir), incoming, addr, channels, metrics_listener).await
        }
        StorageChoice::Memory => {
            serve(opts, Arc::new(MemBackend::new()), Watermark::disabled(), incoming, addr, channels, metrics_listener).await
        }
    }
}

/// [`start_node`] over a stream of accepted connections and a given storage backend, for the
/// deterministic simulation: it serves over its simulated network and keeps `backend` across
/// a crash of the node, as a disk would. `opts.listen`, `opts.storage` and
/// `opts.metrics_listen` are not used; `addr` is the address the node serves at and
/// `channels` opens its connections to peers. Everything else is as in [`start_node`].
pub async fn start_node_with_incoming<B, I, IO, IE>(
    opts: NodeOptions,
    backend: Arc<B>,
    incoming: I,
    addr: SocketAddr,
    channels: PeerChannels,
) -> anyhow::Result<RunningNode>
where
    B: crate::storage::KvBackend,
    I: tokio_stream::Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    serve(opts, backend, Watermark::disabled(), incoming, addr, channels, None).await
}

/// Starts Raft over `backend` and serves the gRPC services over `incoming`.
async fn serve<B, I, IO, IE>(
    opts: NodeOptions,
    backend: Arc<B>,
    watermark: Watermark,
    incoming: I,
    addr: SocketAddr,
    channels: PeerChannels,
    metrics_listener: Option<TcpListener>,
) -> anyhow::Result<RunningNode>
where
    B: crate::storage::KvBackend,
    I: tokio_stream::Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let advertise = opts.advertise.clone().unwrap_or_else(|| addr.to_string());
    let raft_runtime = if opts.raft.own_runtime { Some(raft::RaftRuntime::new(opts.id)?) } else { None };
    let channels = match &raft_runtime {
        Some(runtime) => channels.spawning_on(runtime.handle().clone()),
        None => channels,
    };
    let handle = match &raft_runtime {
        // Started there, openraft spawns its core, replication and state machine tasks there.
        Some(runtime) => {
            let (id, settings, channels) = (opts.id, opts.raft.clone(), channels.clone());
            runtime.handle().spawn(async move { raft::start(id, backend, watermark, &settings, channels).await }).await??
        }
        None => raft::start(opts.id, backend, watermark, &opts.raft, channels.clone()).await?,
    };
    let controller = Controller {
        id: opts.id,
        advertise_addr: advertise.clone(),
        raft: handle.raft.clone(),
        sm: handle.state.clone(),
        committed: handle.committed.clone(),
        log_bytes: handle.appended_bytes.clone(),
        channels,
        reports: AgentReports::default(),
        watch_ends: Default::default(),
        slo_tally: Default::default(),
        report_relay: Default::default(),
        status_writer: crate::agents::StatusWriter::new(crate::agents::StatusPace::new(opts.loops.status_write_kib_per_s)),
        planned_demand: Default::default(),
        report_pace: opts.loops.report_pace(),
        telemetry: ControllerMetrics::default(),
        proposer: handle.proposer.clone(),
        elections: handle.elections.clone(),
    };
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    // HTTP/2 pings on idle connections: a host that dies without closing its connection
    // (power, kernel, network) ends its agent's stream within 3 s, which the failure
    // detector takes as the host's end (`agents::watch_ends`); without them the connection
    // would linger until TCP gives up, minutes later.
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    if let Some(tls) = &opts.security.tls {
        builder = builder.tls_config(tls.server_config()?)?;
    }
    let gates = Gatekeeper::new(&opts.security);
    let router = builder
        .layer(crate::telemetry::tracing::TraceContextLayer)
        .add_service(InterceptedService::new(
            RaftServiceServer::new(RaftPeerService::new(handle.raft.clone()))
                .max_decoding_message_size(MAX_PEER_MESSAGE)
                .max_encoding_message_size(MAX_PEER_MESSAGE),
            gates.gate(Api::Raft),
        ))
        .add_service(InterceptedService::new(
            ControlPlaneServer::new(ResourceService::new(controller.clone(), opts.loops.clone())),
            gates.gate(Api::Client),
        ))
        .add_service(InterceptedService::new(AdminServer::new(AdminService::new(controller.clone())), gates.gate(Api::Admin)))
        .add_service(InterceptedService::new(AgentServer::new(AgentService::new(controller.clone())), gates.gate(Api::Agent)));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = shutdown_rx.await;
    }));
    if let Some(members) = &opts.bootstrap {
        if !handle.raft.is_initialized().await? {
            let mut nodes: BTreeMap<NodeId, Node> = members.iter().map(|(id, a)| (*id, Node::new(a.clone()))).collect();
            nodes.entry(opts.id).or_insert_with(|| Node::new(advertise.clone()));
            tracing::info!(members = ?nodes.keys().collect::<Vec<_>>(), "initializing a new cluster");
            handle.raft.initialize(nodes).await?;
        }
    }
    let metrics_addr = metrics_listener.as_ref().map(TcpListener::local_addr).transpose()?;
    let metrics = metrics_listener.map(|l| tokio::spawn(serve_controller(l, controller.clone())));
    let loops = loops::spawn(controller.clone(), opts.loops.clone());
    let relays = vec![
        tokio::spawn(crate::agents::watch_ends::relay(controller.clone())),
        tokio::spawn(crate::agents::report_relay::relay(controller.clone())),
        tokio::spawn({
            let telemetry = controller.telemetry.clone();
            crate::telemetry::probe_runtime_lag(move |late| telemetry.observe_runtime_lag(late))
        }),
    ];
    tracing::info!(id = opts.id, %addr, metrics = ?metrics_addr, "controller serving");
    Ok(RunningNode {
        controller,
        addr,
        metrics_addr,
        metrics,
        shutdown: Some(shutdown_tx),
        server: Some(server),
        loops: Some(loops),
        relays,
        raft_runtime,
    })
}
