//! The gpuplane controller.
//!
//!   controlplane --dev                       a 3-node local cluster in one process, with
//!                                            the sample fleet applied (data in .gpuplane-dev/)
//!   controlplane --config controller.toml    one node of a real cluster

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use controlplane::cloud::sim::{SimCloud, SimCloudConfig};
use controlplane::cloud::NodeProvider;
use controlplane::config::{parse_peer_flag, ControllerConfig};
use controlplane::loops::LoopSettings;
use controlplane::raft::Member;
use controlplane::server::{start_node, NodeOptions, RunningNode, StorageChoice};
use controlplane::telemetry::tracing::{init as init_tracing, otlp_endpoint};

#[derive(Parser, Debug)]
#[command(name = "controlplane", version, about = "gpuplane controller (Raft-replicated GPU fleet state)")]
struct Args {
    /// TOML config file; flags override its values.
    #[arg(long, short)]
    config: Option<PathBuf>,
    #[arg(long)]
    node_id: Option<u64>,
    /// Listen address, e.g. 0.0.0.0:7400.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Address peers and clients use to reach this node.
    #[arg(long)]
    advertise: Option<String>,
    /// Serve Raft's peer RPCs here, on Raft's own threads, e.g. 0.0.0.0:7410 (default:
    /// peers use the listen address).
    #[arg(long)]
    peer_listen: Option<SocketAddr>,
    /// Address peers reach the peer listener at.
    #[arg(long)]
    peer_advertise: Option<String>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz over HTTP here, e.g. 127.0.0.1:9400.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Export traces over OTLP/gRPC here, e.g. http://collector:4317.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Initial member, ID=HOST:PORT, or ID=HOST:PORT,PEER_HOST:PEER_PORT for a member with
    /// a peer listener (repeat for each member, this node included).
    #[arg(long = "peer", value_parser = parse_peer_flag)]
    peers: Vec<(String, String)>,
    /// Initialise a new cluster from the peer list if this node has no state yet.
    /// Give it to exactly one node.
    #[arg(long)]
    bootstrap: bool,
    /// Start a local 3-node cluster on 127.0.0.1:7401-7403 with the sample fleet applied.
    #[arg(long)]
    dev: bool,
    /// With --dev: first port of the local cluster.
    #[arg(long, default_value_t = 7401)]
    dev_port: u16,
    /// Run without the leader-only loops (provisioner): for tests that write plans by hand.
    #[arg(long)]
    no_loops: bool,
    /// Plaintext, no authentication, every caller is an admin (development only; --dev
    /// implies it).
    #[arg(long)]
    insecure: bool,
    /// The cluster CA (PEM); overrides security.ca.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// This controller's certificate (PEM); overrides security.cert.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// This controller's private key (PEM); overrides security.key.
    #[arg(long)]
    key: Option<PathBuf>,
    /// Token digests of tenants and admins (TOML); overrides security.tokens.
    #[arg(long)]
    tokens: Option<PathBuf>,
}

/// mimalloc, not glibc's malloc: see the dependency's comment in Cargo.toml (fleet-bench).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The config is read twice (here for the endpoint, later in full) so that its errors
    // are reported through the subscriber like every other error.
    let configured = args
        .otlp_endpoint
        .clone()
        .or_else(|| args.config.as_deref().and_then(|p| ControllerConfig::load(p).ok()).and_then(|c| c.otlp_endpoint));
    let endpoint = otlp_endpoint(configured.as_deref());
    let _tracing = match init_tracing("gpuplane-controller", "info,openraft=warn", endpoint.as_deref()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("controlplane: {e}");
            return ExitCode::FAILURE;
        }
    };
    controlplane::os_limits::raise_and_report_open_files();
    let result = if args.dev { run_dev(&args).await } else { run_node(&args).await };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("controlplane: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_node(args: &Args) -> anyhow::Result<()> {
    let mut cfg = match &args.config {
        Some(path) => ControllerConfig::load(path).map_err(anyhow::Error::msg)?,
        None => ControllerConfig::default(),
    };
    cfg.node_id = args.node_id.or(cfg.node_id);
    cfg.listen = args.listen.or(cfg.listen);
    cfg.advertise = args.advertise.clone().or(cfg.advertise);
    cfg.peer_listen = args.peer_listen.or(cfg.peer_listen);
    cfg.peer_advertise = args.peer_advertise.clone().or(cfg.peer_advertise);
    cfg.data_dir = args.data_dir.clone().or(cfg.data_dir);
    cfg.metrics_listen = args.metrics_listen.or(cfg.metrics_listen);
    cfg.bootstrap |= args.bootstrap;
    cfg.security.insecure |= args.insecure;
    cfg.security.ca = args.ca.clone().or(cfg.security.ca);
    cfg.security.cert = args.cert.clone().or(cfg.security.cert);
    cfg.security.key = args.key.clone().or(cfg.security.key);
    cfg.security.tokens = args.tokens.clone().or(cfg.security.tokens);
    for (id, addr) in &args.peers {
        cfg.peers.insert(id.clone(), addr.clone());
    }
    let id = cfg.resolve_node_id().map_err(anyhow::Error::msg)?;
    let listen = cfg.listen.ok_or_else(|| anyhow::anyhow!("listen is required (--listen or listen in the config file)"))?;
    let data_dir =
        cfg.data_dir.clone().ok_or_else(|| anyhow::anyhow!("data_dir is required (--data-dir or data_dir in the config file)"))?;
    let peers = cfg.peer_map().map_err(anyhow::Error::msg)?;
    cfg.bootstrap = cfg.bootstraps(id);
    if cfg.bootstrap && !peers.is_empty() && !peers.contains_key(&id) {
        anyhow::bail!("peers: must include this node ({id}) when bootstrapping");
    }
    let security = cfg.security()?;
    if security.is_insecure() {
        controlplane::security::warn_insecure("controlplane");
    }
    let opts = NodeOptions {
        id,
        listen,
        advertise: cfg.advertise.clone(),
        peer_listen: cfg.peer_listen,
        peer_advertise: cfg.peer_advertise.clone().or_else(|| peers.get(&id).and_then(|m| m.peer_addr.clone())),
        storage: StorageChoice::DataDir(data_dir),
        raft: cfg.raft.settings(),
        loops: LoopSettings { provider: sim_cloud(&cfg, &peers)?, ..cfg.loops.settings(!args.no_loops).map_err(anyhow::Error::msg)? },
        bootstrap: cfg.bootstrap.then_some(peers),
        metrics_listen: cfg.metrics_listen,
        security,
    };
    let node = start_node(opts).await?;
    serve_until_signal(vec![node]).await
}

/// The node provider of `[cloud]`, if one is configured.
fn sim_cloud(cfg: &ControllerConfig, peers: &BTreeMap<u64, Member>) -> anyhow::Result<Option<Arc<dyn NodeProvider>>> {
    let c = &cfg.cloud;
    match c.provider.as_deref() {
        None => Ok(None),
        Some("sim") if !cfg.security.insecure => {
            // Launched agents would need node certificates made on the fly.
            anyhow::bail!("cloud.provider: \"sim\" launches agents without certificates; it runs only with --insecure")
        }
        Some("sim") => {
            let need = |v: &Option<PathBuf>, field: &str| {
                v.clone().ok_or_else(|| anyhow::anyhow!("cloud.{field}: required with provider = \"sim\""))
            };
            let mut controllers: Vec<String> = peers.values().map(|m| m.addr.clone()).collect();
            if controllers.is_empty() {
                controllers.extend(cfg.advertise.clone().or(cfg.listen.map(|l| l.to_string())));
            }
            let config = SimCloudConfig {
                agent_binary: need(&c.agent_binary, "agent_binary")?,
                workload_program: need(&c.workload_program, "workload_program")?,
                workload_args: c.workload_args.clone(),
                base_dir: need(&c.base_dir, "base_dir")?,
                controllers,
                first_port: c.first_port.unwrap_or(30000),
                time_scale: c.time_scale.unwrap_or(1.0),
            };
            Ok(Some(Arc::new(SimCloud::new(config))))
        }
        Some(other) => anyhow::bail!("cloud.provider: unknown provider {other:?} (known: sim)"),
    }
}

async fn run_dev(args: &Args) -> anyhow::Result<()> {
    let base = args.data_dir.clone().unwrap_or_else(|| PathBuf::from(".gpuplane-dev"));
    let addrs: BTreeMap<u64, String> = (1..=3u64).map(|id| (id, format!("127.0.0.1:{}", args.dev_port + id as u16 - 1))).collect();
    let members: BTreeMap<u64, Member> = addrs.iter().map(|(id, addr)| (*id, Member::new(addr.clone()))).collect();
    let mut nodes = Vec::new();
    controlplane::security::warn_insecure("controlplane --dev");
    for (id, addr) in &addrs {
        let opts = NodeOptions {
            id: *id,
            listen: addr.parse()?,
            advertise: Some(addr.clone()),
            peer_listen: None,
            peer_advertise: None,
            storage: StorageChoice::DataDir(base.join(format!("controller-{id}"))),
            raft: Default::default(),
            bootstrap: (*id == 1).then(|| members.clone()),
            loops: LoopSettings { enabled: !args.no_loops, ..Default::default() },
            // --metrics-listen serves node 1's figures in --dev.
            metrics_listen: args.metrics_listen.filter(|_| *id == 1),
            // A development cluster in one process: plaintext, like --insecure.
            security: controlplane::security::Security::insecure(),
        };
        nodes.push(start_node(opts).await?);
    }
    let client = controlplane::client::Client::new(addrs.values().cloned().collect());
    let sample = include_str!("../../../deploy/examples/sample-cluster.yaml");
    let resources = controlplane::manifest::parse("sample-cluster.yaml", sample, controlplane::manifest::Format::Yaml)?;
    for r in resources {
        client.put(r, proto::WriteMode::Unspecified).await.map_err(|s| anyhow::anyhow!("applying the sample fleet: {}", s.message()))?;
    }
    let servers = addrs.values().cloned().collect::<Vec<_>>().join(",");
    println!("gpuplane dev cluster: 3 controllers at {servers}, data in {}", base.display());
    println!("try:  cargo run -p gpuctl -- --server {servers} cluster status");
    println!("      cargo run -p gpuctl -- --server {servers} get services");
    serve_until_signal(nodes).await
}

/// Serves until SIGINT/SIGTERM (a lone controller that leads hands leadership over first),
/// or exits with an error when Raft stops on a fatal error such as a storage fault (a node
/// that cannot persist must not keep serving).
async fn serve_until_signal(nodes: Vec<RunningNode>) -> anyhow::Result<()> {
    let fatal = futures::future::select_all(nodes.iter().map(|n| Box::pin(n.fatal())));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        (msg, i, _) = fatal => {
            anyhow::bail!("node {} stopped: {msg}", nodes[i].controller.id);
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    // A controller of its own hands leadership over first; the development cluster's nodes
    // all stop together, so none would be left to take it.
    let hand_over = nodes.len() == 1;
    for n in nodes {
        if hand_over {
            n.hand_over_and_shutdown().await;
        } else {
            n.shutdown().await;
        }
    }
    Ok(())
}
