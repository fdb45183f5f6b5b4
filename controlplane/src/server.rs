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
use tokio_stream::wrappers::TcpListenerStream;

use crate::agents::AgentReports;
use crate::api::{AdminService, AgentService, ResourceService};
use crate::controller::Controller;
use crate::loops::{self, LoopSettings};
use crate::raft::{self, Node, NodeId, PeerChannels, RaftPeerService, RaftSettings, MAX_PEER_MESSAGE};
use crate::storage::{open_data_dir, MemBackend, Watermark};
use crate::telemetry::{serve_controller, ControllerMetrics};

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
}

pub struct RunningNode {
    pub controller: Controller,
    pub addr: SocketAddr,
    /// The bound address of `/metrics`, `/healthz` and `/readyz`, when served.
    pub metrics_addr: Option<SocketAddr>,
    metrics: Option<JoinHandle<()>>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    loops: Option<JoinHandle<()>>,
}

impl RunningNode {
    /// Resolves with a message when Raft stops on a fatal error (e.g. a storage fault);
    /// the process must then exit rather than serve from a node that can no longer persist.
    pub async fn fatal(&self) -> String {
        let mut metrics = self.controller.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow().running_state {
                return format!("raft stopped: {fatal}");
            }
            if metrics.changed().await.is_err() {
                return "raft stopped".into();
            }
        }
    }

    /// Stops serving and shuts Raft down (the data dir stays as it is).
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
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
    }
}

impl Drop for RunningNode {
    fn drop(&mut self) {
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
    let advertise = opts.advertise.clone().unwrap_or_else(|| addr.to_string());
    let channels = PeerChannels::default();
    let handle = match &opts.storage {
        StorageChoice::DataDir(dir) => {
            let backend = Arc::new(open_data_dir(dir, opts.id)?);
            raft::start(opts.id, backend, Watermark::in_dir(dir), &opts.raft, channels.clone()).await?
        }
        StorageChoice::Memory => {
            raft::start(opts.id, Arc::new(MemBackend::new()), Watermark::disabled(), &opts.raft, channels.clone()).await?
        }
    };
    let controller = Controller {
        id: opts.id,
        advertise_addr: advertise.clone(),
        raft: handle.raft.clone(),
        sm: handle.state.clone(),
        committed: handle.committed.clone(),
        channels,
        reports: AgentReports::default(),
        telemetry: ControllerMetrics::default(),
    };
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        .add_service(
            RaftServiceServer::new(RaftPeerService::new(handle.raft.clone()))
                .max_decoding_message_size(MAX_PEER_MESSAGE)
                .max_encoding_message_size(MAX_PEER_MESSAGE),
        )
        .add_service(ControlPlaneServer::new(ResourceService::new(controller.clone())))
        .add_service(AdminServer::new(AdminService::new(controller.clone())))
        .add_service(AgentServer::new(AgentService::new(controller.clone())));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
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
    tracing::info!(id = opts.id, %addr, metrics = ?metrics_addr, "controller serving");
    Ok(RunningNode { controller, addr, metrics_addr, metrics, shutdown: Some(shutdown_tx), server: Some(server), loops: Some(loops) })
}

/// [`start_node`] over a stream of accepted connections and a given storage backend, for the
/// deterministic simulation: it serves over its simulated network and keeps `backend` across
/// a crash of the node, as a disk would. `opts.listen`, `opts.storage` and
/// `opts.metrics_listen` are not used; `addr` is the address the node serves at and
/// `channels` opens its connections to peers. Everything else is as in [`start_node`]
/// (kept as a separate function so that `start_node`'s TCP set-up stays as it is).
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
    let advertise = opts.advertise.clone().unwrap_or_else(|| addr.to_string());
    let handle = raft::start(opts.id, backend, Watermark::disabled(), &opts.raft, channels.clone()).await?;
    let controller = Controller {
        id: opts.id,
        advertise_addr: advertise.clone(),
        raft: handle.raft.clone(),
        sm: handle.state.clone(),
        committed: handle.committed.clone(),
        channels,
        reports: AgentReports::default(),
        telemetry: ControllerMetrics::default(),
    };
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        .add_service(
            RaftServiceServer::new(RaftPeerService::new(handle.raft.clone()))
                .max_decoding_message_size(MAX_PEER_MESSAGE)
                .max_encoding_message_size(MAX_PEER_MESSAGE),
        )
        .add_service(ControlPlaneServer::new(ResourceService::new(controller.clone())))
        .add_service(AdminServer::new(AdminService::new(controller.clone())))
        .add_service(AgentServer::new(AgentService::new(controller.clone())));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = shutdown_rx.await;
    }));
    if let Some(members) = &opts.bootstrap {
        if !handle.raft.is_initialized().await? {
            let nodes: BTreeMap<NodeId, Node> = members.iter().map(|(id, a)| (*id, Node::new(a.clone()))).collect();
            handle.raft.initialize(nodes).await?;
        }
    }
    let loops = loops::spawn(controller.clone(), opts.loops.clone());
    Ok(RunningNode {
        controller,
        addr,
        metrics_addr: None,
        metrics: None,
        shutdown: Some(shutdown_tx),
        server: Some(server),
        loops: Some(loops),
    })
}
