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

mod connections;
mod watch_slots;

pub use connections::{Bounds, Connections};
use connections::{Incoming, RequestLayer};
pub use connections::{MAX_PEER_CONNECTIONS, UNREADY_FOR};
pub use watch_slots::{WatchBounds, WatchSlot, WatchSlots};

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
    /// Where to serve Raft's peer RPCs on a listener of their own (on Raft's runtime when it
    /// has one); none: peers use `listen`, which serves them too.
    pub peer_listen: Option<SocketAddr>,
    /// Address peers reach `peer_listen` at; defaults to its bound address.
    pub peer_advertise: Option<String>,
    pub storage: StorageChoice,
    pub raft: RaftSettings,
    /// When set and the node has never been initialised, initialise the cluster with these
    /// members. Set it on exactly one node.
    pub bootstrap: Option<BTreeMap<NodeId, Node>>,
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
    /// The bound address of the peer listener, when there is one.
    pub peer_addr: Option<SocketAddr>,
    /// The bound address of `/metrics`, `/healthz` and `/readyz`, when served.
    pub metrics_addr: Option<SocketAddr>,
    metrics: Option<JoinHandle<()>>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    /// The peer listener's server (`NodeOptions::peer_listen`).
    peer_server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
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

    /// As [`Self::shutdown`], but a leader first hands leadership to the most caught-up
    /// other voter (as etcd's leader does when it stops), so that a rolling restart pauses
    /// writes for the transfer (milliseconds) instead of a failover (the followers' lease
    /// and election timeout). Still serving meanwhile; if the transfer does not complete
    /// within ten election timeouts, it stops anyway.
    pub async fn hand_over_and_shutdown(self) {
        let c = &self.controller;
        if c.is_leader() {
            match c.transfer_target(0) {
                None => tracing::info!("stopping as leader: no other voter to hand over to"),
                Some(to) => match c.transfer_leadership(to).await {
                    Ok(leader) => tracing::info!(to, leader, "handed leadership over before stopping"),
                    Err(e) => tracing::warn!(to, error = %e, "stopping as leader: the hand-over did not complete"),
                },
            }
        }
        self.shutdown().await;
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
        for server in [self.server.take(), self.peer_server.take()].into_iter().flatten() {
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
        for server in [self.server.take(), self.peer_server.take()].into_iter().flatten() {
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
    // A std listener: the runtime that serves it registers it (`serve`), so that its
    // connections are driven by Raft's threads, not the workers it exists to avoid.
    let peer_listener = match opts.peer_listen {
        Some(at) => {
            let l = std::net::TcpListener::bind(at).map_err(|e| anyhow::anyhow!("peer_listen: cannot listen on {at}: {e}"))?;
            l.set_nonblocking(true)?;
            Some(l)
        }
        None => None,
    };
    let channels = PeerChannels::with_tls(opts.security.tls.as_ref().map(|t| t.client_config()));
    // No Nagle on accepted connections (`Incoming` sets it): with it, a small answer written
    // after a large request (a follower's AppendEntries answer, a client's write answer)
    // waited for the peer's delayed ACK, 40 ms, and a new leader re-sending its log tail to a
    // follower took 40 ms per 512 KiB batch (the clients' and peers' own ends already set it).
    // The connections are bounded (`[limits]`: in all, per client address, a handshake and an
    // idle deadline; `server::connections`).
    let telemetry = ControllerMetrics::default();
    let api = Connections::new("api", Bounds::api(&opts.security.limits), telemetry.clone());
    let incoming = Incoming::new(listener, api.clone());
    let listeners = Listeners { metrics: metrics_listener, peers: peer_listener, api: Some(api), telemetry: Some(telemetry) };
    match opts.storage.clone() {
        StorageChoice::DataDir(dir) => {
            let backend = Arc::new(open_data_dir(&dir, opts.id)?);
            serve(opts, backend, Watermark::in_dir(&dir), incoming, addr, channels, listeners).await
        }
        StorageChoice::Memory => serve(opts, Arc::new(MemBackend::new()), Watermark::disabled(), incoming, addr, channels, listeners).await,
    }
}

/// [`start_node`] over a stream of accepted connections and a given storage backend, for the
/// deterministic simulation: it serves over its simulated network and keeps `backend` across
/// a crash of the node, as a disk would. `opts.listen`, `opts.storage`, `opts.metrics_listen`
/// and `opts.peer_listen` are not used; `addr` is the address the node serves at and
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
    serve(opts, backend, Watermark::disabled(), incoming, addr, channels, Listeners::default()).await
}

/// Warns when the membership sends this node's Raft RPCs somewhere other than its peer
/// listener: they then still arrive, at the API's listener, but without what the peer
/// listener is for.
async fn warn_if_peers_look_elsewhere(raft: raft::Raft, id: NodeId, serving_at: String) {
    let Some(member) = raft::consensus::member_once_known(&raft, id).await else { return };
    if member.peer_addr.as_deref() != Some(serving_at.as_str()) {
        tracing::warn!(
            "this node serves its peers at {serving_at}, but the membership records it as {member}, so peers send it Raft's RPCs \
             at {}; to move them, remove the node and add it again with `gpuctl cluster add --peer-address {serving_at}`",
            member.raft_addr()
        );
    }
}

/// The listeners a node has besides its API's, and what `start_node` bounds the API's
/// connections with (none in the simulation, whose connections are its own).
#[derive(Default)]
struct Listeners {
    /// `/metrics`, `/healthz` and `/readyz`.
    metrics: Option<TcpListener>,
    /// Raft's peer RPCs (`NodeOptions::peer_listen`).
    peers: Option<std::net::TcpListener>,
    /// The API's connections (`/readyz` reads what its listener saw).
    api: Option<Arc<Connections>>,
    /// The series `api` counts in, the controller's.
    telemetry: Option<ControllerMetrics>,
}

/// gRPC server settings shared by the API's server and the peers'. HTTP/2 pings on idle
/// connections: a host that dies without closing its connection (power, kernel, network)
/// ends its agent's stream within 3 s, which the failure detector takes as the host's end
/// (`agents::watch_ends`); without them the connection would linger until TCP gives up,
/// minutes later. At most `[limits] streams_per_connection` streams per connection
/// (SETTINGS_MAX_CONCURRENT_STREAMS: a client past it waits for one of its own to end), so
/// that one connection cannot hold requests and their answers without bound.
fn server_builder(security: &Security) -> anyhow::Result<tonic::transport::Server> {
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(security.limits.streams_per_connection);
    if let Some(tls) = &security.tls {
        builder = builder.tls_config(tls.server_config()?)?;
    }
    Ok(builder)
}

fn raft_peer_server(
    raft: &raft::Raft,
    gates: &Arc<Gatekeeper>,
) -> InterceptedService<RaftServiceServer<RaftPeerService>, crate::security::Gate> {
    InterceptedService::new(
        RaftServiceServer::new(RaftPeerService::new(raft.clone()))
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE),
        gates.gate(Api::Raft),
    )
}

/// Serves Raft's peer RPCs alone over `listener`, on `runtime` (Raft's own when it has
/// one), within `conns`' bounds. No Nagle, as on the API's listener (see `start_node`).
fn serve_peers(
    listener: std::net::TcpListener,
    runtime: &tokio::runtime::Handle,
    service: InterceptedService<RaftServiceServer<RaftPeerService>, crate::security::Gate>,
    builder: tonic::transport::Server,
    conns: Arc<Connections>,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let _in_runtime = runtime.enter();
    let incoming = Incoming::new(TcpListener::from_std(listener)?, conns.clone());
    Ok(runtime.spawn(
        builder
            .layer(crate::telemetry::tracing::TraceContextLayer)
            .layer(RequestLayer::new(Some(conns), None))
            .add_service(service)
            .serve_with_incoming(incoming),
    ))
}

/// Starts Raft over `backend` and serves the gRPC services over `incoming`.
async fn serve<B, I, IO, IE>(
    opts: NodeOptions,
    backend: Arc<B>,
    watermark: Watermark,
    incoming: I,
    addr: SocketAddr,
    channels: PeerChannels,
    listeners: Listeners,
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
        telemetry: listeners.telemetry.clone().unwrap_or_default(),
        proposer: handle.proposer.clone(),
        elections: handle.elections.clone(),
    };
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let members = handle.raft.clone();
    let gates = Gatekeeper::new(&opts.security, Arc::new(move |id| raft::consensus::is_member(&members, id)));
    let (peer_server, peer_bound) = match listeners.peers {
        Some(listener) => {
            let bound = listener.local_addr()?;
            let runtime = raft_runtime.as_ref().map_or_else(tokio::runtime::Handle::current, |r| r.handle().clone());
            let conns = Connections::new("peer", Bounds::peers(&opts.security.limits), controller.telemetry.clone());
            let server = serve_peers(listener, &runtime, raft_peer_server(&handle.raft, &gates), server_builder(&opts.security)?, conns)?;
            (Some(server), Some(bound))
        }
        None => (None, None),
    };
    // Where peers reach this node's peer listener, if it has one.
    let peer_advertise = peer_bound.map(|bound| opts.peer_advertise.clone().unwrap_or_else(|| bound.to_string()));
    // The API's listener serves Raft's RPCs too: for members without a peer address, and
    // for peers whose membership does not have this node's yet. Every request carries the
    // controller's Watch slots (`[limits] watches_per_principal`), for `ResourceService::watch`.
    let watch_slots = WatchSlots::new(WatchBounds::of(&opts.security.limits), controller.telemetry.clone());
    let router = server_builder(&opts.security)?
        .layer(crate::telemetry::tracing::TraceContextLayer)
        .layer(RequestLayer::new(listeners.api.clone(), Some(watch_slots)))
        .add_service(raft_peer_server(&handle.raft, &gates))
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
            let mut nodes = members.clone();
            let own = nodes.entry(opts.id).or_insert_with(|| Node::new(advertise.clone()));
            if own.peer_addr.is_none() {
                own.peer_addr.clone_from(&peer_advertise);
            }
            tracing::info!(members = ?nodes.keys().collect::<Vec<_>>(), "initializing a new cluster");
            handle.raft.initialize(nodes).await?;
        }
    }
    let metrics_addr = listeners.metrics.as_ref().map(TcpListener::local_addr).transpose()?;
    let metrics = listeners.metrics.map(|l| tokio::spawn(serve_controller(l, controller.clone(), listeners.api.clone())));
    let loops = loops::spawn(controller.clone(), opts.loops.clone());
    let mut relays = vec![
        tokio::spawn(crate::agents::watch_ends::relay(controller.clone())),
        tokio::spawn(crate::agents::report_relay::relay(controller.clone())),
        tokio::spawn({
            let telemetry = controller.telemetry.clone();
            crate::telemetry::probe_runtime_lag(move |late| telemetry.observe_runtime_lag(late))
        }),
    ];
    if let Some(serving_at) = peer_advertise {
        relays.push(tokio::spawn(warn_if_peers_look_elsewhere(handle.raft.clone(), opts.id, serving_at)));
    }
    tracing::info!(id = opts.id, %addr, peers = ?peer_bound, metrics = ?metrics_addr, "controller serving");
    Ok(RunningNode {
        controller,
        addr,
        peer_addr: peer_bound,
        peer_server,
        metrics_addr,
        metrics,
        shutdown: Some(shutdown_tx),
        server: Some(server),
        loops: Some(loops),
        relays,
        raft_runtime,
    })
}
