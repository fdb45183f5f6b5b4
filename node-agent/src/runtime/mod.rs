//! The agent's process: it opens the GPU backend, the supervisor and the routers, then runs
//! four loops: the controller link (`link`: register, follow the desired state), the
//! reconcile loop (`reconciling`: shadow failover, then the steps to the desired state) and
//! the report loop (`report`), with the servers' metrics pages read beside it
//! (`server_scrape`). Static stability: with every controller unreachable the
//! agent keeps running its last desired state (kept on disk across agent restarts,
//! `desired_file`) and retries any controller with back-off and jitter.

mod desired_file;
mod link;
mod node_resource;
mod probes;
mod reconciling;
mod report;
pub mod server_metrics;
mod server_scrape;
mod server_windows;

use crate::backend::{select_backend, BackendOptions, GpuBackend};
use crate::config::AgentConfig;
use crate::executor::Executor;
use crate::mps::{MpsControl, NvidiaMps, SimMps};
use crate::router::{RouterThreads, Routers};
use crate::supervisor::Supervisor;
use crate::telemetry::AgentMetrics;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tonic::transport::ClientTlsConfig;

/// Per-call deadline on controller RPCs (the watch stream has none).
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Agent {
    cfg: AgentConfig,
    /// mTLS to the controllers with this node's certificate; plaintext when `insecure`.
    tls: Option<ClientTlsConfig>,
    /// One connection per controller address (see `Agent::channel`).
    channels: Mutex<std::collections::HashMap<String, tonic::transport::Channel>>,
    executor: Arc<Mutex<Executor>>,
    models: BTreeMap<String, planner::mig::GpuModel>,
    desired_file: PathBuf,
    routers: Arc<Routers>,
    /// The last report built from the executor's view.
    last_report: Mutex<Option<proto::ReportRequest>>,
    telemetry: AgentMetrics,
    /// Registered its Node with a controller at least once since it started.
    registered: AtomicBool,
    /// Holds a desired state (from a controller or from disk).
    has_desired: AtomicBool,
    /// The session of the desired-state stream held now (0: none yet), named in reports.
    watch_session: AtomicU64,
    /// Which reports leave the GPUs out: what the controllers hold of this node's observed
    /// state, as far as the answers tell.
    change_only: Mutex<proto::ChangeOnlyReports>,
    /// Wakes the report loop at once: a new stream was opened, and the leader must hear of
    /// it before the end of the old one makes it take this node for dead.
    report_now: Notify,
    /// Each service's servers' own counters over the last interval (`server_scrape`).
    server_readings: Mutex<BTreeMap<String, proto::ServerReading>>,
}

impl Agent {
    /// Opens the backend and the supervisor's state (adopting running processes).
    pub fn open(cfg: AgentConfig) -> anyhow::Result<Agent> {
        let tls = cfg.client_tls().map_err(|e| anyhow::anyhow!(e.reason))?;
        std::fs::create_dir_all(&cfg.state_dir).map_err(|e| anyhow::anyhow!("state_dir {}: {e}", cfg.state_dir.display()))?;
        let backend: Arc<dyn GpuBackend> = if cfg.gpu_backend == "sim" {
            let models: Vec<_> = cfg.sim.gpus.iter().filter_map(|g| planner::mig::GpuModel::for_name(g)).collect();
            let file = cfg.state_dir.join("sim-gpus.json");
            let sim = crate::backend::sim::SimBackend::for_host(&models, cfg.sim.mig_enabled, &cfg.node, Some(file))?;
            sim.name_products(&cfg.sim.gpus);
            Arc::new(sim)
        } else {
            select_backend(&cfg.gpu_backend, &BackendOptions::default())?
        };
        let mps: Arc<dyn MpsControl> =
            if cfg.gpu_backend == "sim" { Arc::new(SimMps::new(&cfg.state_dir)) } else { Arc::new(NvidiaMps::new(&cfg.state_dir)) };
        let (supervisor, adopted) = Supervisor::open(&cfg.state_dir)?;
        let gpus = backend.inventory()?;
        tracing::info!(node = %cfg.node, backend = backend.name(), gpus = gpus.len(), adopted, "agent starting");
        let models = gpus.iter().map(|g| (g.uuid.clone(), g.model)).collect();
        let host = cfg.advertise.rsplit_once(':').map_or(cfg.advertise.as_str(), |(h, _)| h).to_string();
        let threads = RouterThreads::start(cfg.router_threads).map_err(|e| anyhow::anyhow!("starting the router threads: {e}"))?;
        let routers = Arc::new(Routers::new(host, cfg.router_ports, cfg.state_dir.clone(), threads));
        let telemetry = AgentMetrics::default();
        // Model loads run on the agent's runtime beside its other IO (`Agent::open` is called on it).
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| anyhow::anyhow!("the agent opens on its tokio runtime: {e}"))?;
        let model_loads = Some(crate::model_load::ModelLoads::new(runtime, telemetry.clone()));
        let executor = Executor {
            backend,
            mps,
            supervisor,
            template: cfg.template.clone(),
            runtimes: Default::default(),
            cold_starts: Vec::new(),
            ports: cfg.port_range,
            gpus,
            routers: Some(routers.clone()),
            model_loads,
        };
        let desired_file = cfg.state_dir.join("desired.pb");
        Ok(Agent {
            cfg,
            tls,
            channels: Mutex::default(),
            executor: Arc::new(Mutex::new(executor)),
            models,
            desired_file,
            routers,
            last_report: Mutex::new(None),
            telemetry,
            registered: AtomicBool::new(false),
            has_desired: AtomicBool::new(false),
            watch_session: AtomicU64::new(0),
            change_only: Mutex::default(),
            report_now: Notify::new(),
            server_readings: Mutex::default(),
        })
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let saved = self.saved_desired();
        self.has_desired.store(saved.is_some(), Ordering::Relaxed);
        let (tx, rx) = watch::channel(saved);
        let link = tokio::spawn(self.clone().link_loop(tx));
        let reconcile = tokio::spawn(self.clone().reconcile_loop(rx.clone()));
        let report = tokio::spawn(self.clone().report_loop(rx));
        let scrape = tokio::spawn(self.clone().scrape_loop());
        shutdown.await;
        link.abort();
        reconcile.abort();
        report.abort();
        scrape.abort();
    }
}
