//! The agent's main loops: the controller link (register, watch the desired state, report)
//! and the reconcile loop. Static stability: with every controller unreachable the agent
//! keeps running its last desired state (also kept on disk across agent restarts) and
//! retries any controller with back-off and jitter.

use crate::backend::{select_backend, BackendOptions, GpuBackend};
use crate::config::AgentConfig;
use crate::desired::{decode, NodeDesired};
use crate::executor::Executor;
use crate::mps::{MpsControl, NvidiaMps, SimMps};
use crate::reconcile;
use crate::routing::Routers;
use crate::supervisor::Supervisor;
use crate::telemetry::{serve, AgentMetrics, AgentSnapshot, Response};
use prost::Message;
use proto::agent_client::AgentClient;
use proto::control_plane_client::ControlPlaneClient;
use rand::Rng;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// Per-call deadline on controller RPCs (the watch stream has none).
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Agent {
    cfg: AgentConfig,
    /// mTLS to the controllers with this node's certificate; plaintext when `insecure`.
    tls: Option<ClientTlsConfig>,
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
    /// Wakes the report loop at once: a new stream was opened, and the leader must hear of
    /// it before the end of the old one makes it take this node for dead.
    report_now: Notify,
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
        let routers = Arc::new(Routers::new(host, cfg.router_ports, cfg.state_dir.clone(), tokio::runtime::Handle::current()));
        let executor = Executor {
            backend,
            mps,
            supervisor,
            template: cfg.template.clone(),
            ports: cfg.port_range,
            gpus,
            routers: Some(routers.clone()),
        };
        let desired_file = cfg.state_dir.join("desired.pb");
        Ok(Agent {
            cfg,
            tls,
            executor: Arc::new(Mutex::new(executor)),
            models,
            desired_file,
            routers,
            last_report: Mutex::new(None),
            telemetry: AgentMetrics::default(),
            registered: AtomicBool::new(false),
            has_desired: AtomicBool::new(false),
            watch_session: AtomicU64::new(0),
            report_now: Notify::new(),
        })
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `metrics_listen`, if configured, for
    /// as long as the process runs; returns the bound address.
    pub async fn start_telemetry(self: &Arc<Self>) -> anyhow::Result<Option<std::net::SocketAddr>> {
        let Some(at) = self.cfg.metrics_listen else { return Ok(None) };
        let listener =
            tokio::net::TcpListener::bind(at).await.map_err(|e| anyhow::anyhow!("metrics_listen: cannot listen on {at}: {e}"))?;
        let addr = listener.local_addr()?;
        let me = self.clone();
        tokio::spawn(serve(listener, Arc::new(move |path: &str| me.probe(path))));
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        Ok(Some(addr))
    }

    fn probe(&self, path: &str) -> Response {
        match path {
            "/metrics" => {
                let observed = self.last_report.lock().expect("report lock").clone();
                Response::metrics(self.telemetry.render(&AgentSnapshot {
                    services: self.routers.metrics(),
                    observed,
                    busy: self.routers.busy_times(),
                }))
            }
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => match self.readiness() {
                Ok(()) => Response::text(200, "ready\n"),
                Err(reason) => Response::text(503, format!("not ready: {reason}\n")),
            },
            _ => Response::text(404, "not found (try /metrics, /healthz, /readyz)\n"),
        }
    }

    /// Ready once registered with a controller, or while holding a desired state to run
    /// (static stability: an agent cut off from every controller still serves its plan).
    fn readiness(&self) -> Result<(), &'static str> {
        if self.registered.load(Ordering::Relaxed) || self.has_desired.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("not registered with a controller and no desired state yet")
        }
    }

    /// The Node resource this agent registers.
    fn node_resource(&self) -> proto::Resource {
        let gpus = self
            .executor
            .lock()
            .expect("executor lock")
            .gpus
            .iter()
            .map(|g| model::NodeGpu { uuid: g.uuid.clone(), model: self.model_name(g), mig_enabled: g.mig_enabled })
            .collect();
        let spec = model::NodeSpec {
            address: self.cfg.advertise.clone(),
            instance_type: self.cfg.instance_type.clone(),
            gpus,
            labels: self.cfg.labels.clone(),
        };
        let spec_json = serde_json::to_string(&spec).expect("a NodeSpec is plain data");
        proto::Resource { kind: model::Kind::Node.to_string(), name: self.cfg.node.clone(), spec_json, ..Default::default() }
    }

    /// The GpuModel resource name of a GPU: the configured name for simulated GPUs (V100 and
    /// T4 share the planner's no-MIG geometry), else derived from the product.
    fn model_name(&self, g: &crate::backend::GpuInfo) -> String {
        match self.cfg.sim.gpus.get(g.index as usize) {
            Some(name) if self.cfg.gpu_backend == "sim" => name.clone(),
            _ => config_model_name(g.model, &g.name).to_string(),
        }
    }

    /// The last desired state this agent accepted, from disk.
    fn saved_desired(&self) -> Option<NodeDesired> {
        let bytes = std::fs::read(&self.desired_file).ok()?;
        let state = proto::DesiredState::decode(bytes.as_slice()).ok()?;
        decode(&state, &self.cfg.node, &self.models).ok()
    }

    fn save_desired(&self, state: &proto::DesiredState) {
        let tmp = self.desired_file.with_extension("tmp");
        let written = std::fs::write(&tmp, state.encode_to_vec()).and_then(|()| std::fs::rename(&tmp, &self.desired_file));
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not keep the desired state on disk");
        }
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let saved = self.saved_desired();
        self.has_desired.store(saved.is_some(), Ordering::Relaxed);
        let (tx, rx) = watch::channel(saved);
        let link = tokio::spawn(self.clone().link_loop(tx));
        let reconcile = tokio::spawn(self.clone().reconcile_loop(rx.clone()));
        let report = tokio::spawn(self.clone().report_loop(rx));
        shutdown.await;
        link.abort();
        reconcile.abort();
        report.abort();
    }

    async fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let endpoint = match &self.tls {
            Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.clone())?,
            None => Endpoint::from_shared(format!("http://{addr}"))?,
        };
        // HTTP/2 pings, as the controllers send theirs: a controller cut off from this host
        // without a reset ends the desired-state stream within 3 s, so the agent reconnects
        // elsewhere and reports its new stream before the leader's grace for the old one
        // runs out (the controller, seeing the same silence, relays the stream's end).
        endpoint
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true)
            .connect()
            .await
    }

    /// Registers and follows the desired state through any controller; on failure, backs
    /// off with jitter and tries the next one.
    async fn link_loop(self: Arc<Self>, tx: watch::Sender<Option<NodeDesired>>) {
        let mut attempt: u32 = 0;
        let mut k = 0usize;
        loop {
            let addr = self.cfg.controllers[k % self.cfg.controllers.len()].clone();
            k += 1;
            match self.follow(&addr, &tx).await {
                Ok(()) => attempt = 0,
                Err(e) => {
                    tracing::warn!(controller = %addr, error = format!("{e:#}"), "controller link lost");
                    attempt = attempt.saturating_add(1);
                }
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    async fn follow(&self, addr: &str, tx: &watch::Sender<Option<NodeDesired>>) -> anyhow::Result<()> {
        let channel = self.channel(addr).await?;
        let mut put = tonic::Request::new(proto::PutRequest { resource: Some(self.node_resource()), ..Default::default() });
        put.set_timeout(RPC_TIMEOUT);
        ControlPlaneClient::new(channel.clone()).put(put).await?;
        self.registered.store(true, Ordering::Relaxed);
        let from_version = tx.borrow().as_ref().map_or(0, |d| d.version);
        // Nonzero and new for every stream: the controllers tell this stream's end from the
        // end of the ones before it.
        let session = rand::rng().random_range(1..=u64::MAX);
        let mut stream = AgentClient::new(channel)
            .watch_desired(proto::WatchDesiredRequest { node: self.cfg.node.clone(), from_version, session })
            .await?
            .into_inner();
        self.watch_session.store(session, Ordering::Relaxed);
        self.report_now.notify_one();
        tracing::info!(controller = %addr, from_version, "registered; following the desired state");
        while let Some(state) = stream.message().await? {
            match decode(&state, &self.cfg.node, &self.models) {
                Ok(desired) => {
                    self.save_desired(&state);
                    tracing::info!(version = desired.version, "new desired state");
                    tx.send_replace(Some(desired));
                    self.has_desired.store(true, Ordering::Relaxed);
                }
                // Refused whole: nothing of it is applied, the previous state keeps running.
                Err(e) => tracing::error!(version = state.version, error = %e, "desired state refused"),
            }
        }
        anyhow::bail!("desired-state stream ended")
    }

    async fn reconcile_loop(self: Arc<Self>, mut rx: watch::Receiver<Option<NodeDesired>>) {
        let interval = Duration::from_millis(self.cfg.interval_ms);
        loop {
            let desired = rx.borrow_and_update().clone();
            if let Some(desired) = desired {
                let (executor, telemetry) = (self.executor.clone(), self.telemetry.clone());
                let result =
                    tokio::task::spawn_blocking(move || reconcile_once(&mut executor.lock().expect("executor lock"), &desired, &telemetry))
                        .await;
                match result {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => tracing::info!(steps = n, "reconciled"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "reconcile failed; retrying"),
                    Err(e) => tracing::error!(error = %e, "reconcile task panicked"),
                }
            }
            let _ = tokio::time::timeout(interval, rx.changed()).await;
        }
    }

    async fn report_loop(self: Arc<Self>, rx: watch::Receiver<Option<NodeDesired>>) {
        let own = Duration::from_millis(self.cfg.interval_ms);
        let mut interval = own;
        let mut k = 0usize;
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = self.report_now.notified() => {}
            }
            // The executor may be busy in a reconcile round (waiting for a process to be
            // ready): build the report off the async workers.
            let (me, watch) = (self.clone(), rx.clone());
            let Ok(report) = tokio::task::spawn_blocking(move || me.report(&watch)).await else { continue };
            for _ in 0..self.cfg.controllers.len() {
                let addr = &self.cfg.controllers[k % self.cfg.controllers.len()];
                let sent = async {
                    let mut req = tonic::Request::new(report.clone());
                    req.set_timeout(RPC_TIMEOUT);
                    AgentClient::new(self.channel(addr).await?).report(req).await.map_err(anyhow::Error::from)
                };
                match sent.await {
                    Ok(answer) => {
                        interval = proto::report_pace::next_report_in(own, answer.into_inner().report_interval_ms);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(controller = %addr, error = %e, "report not delivered");
                        k += 1;
                    }
                }
            }
        }
    }

    /// The report to send: built fresh when the executor is free; while a reconcile round
    /// holds it (a process may take seconds to become ready), the last observed state with
    /// fresh metrics, so the heartbeat never stalls behind a slow start.
    fn report(&self, rx: &watch::Receiver<Option<NodeDesired>>) -> proto::ReportRequest {
        let fresh = match self.executor.try_lock() {
            Ok(executor) => Some(self.build_report(&executor, rx)),
            Err(std::sync::TryLockError::WouldBlock) => None,
            Err(std::sync::TryLockError::Poisoned(p)) => Some(self.build_report(&p.into_inner(), rx)),
        };
        let mut last = self.last_report.lock().expect("report lock");
        let mut report = match fresh {
            Some(r) => {
                *last = Some(r.clone());
                r
            }
            None => last.clone().unwrap_or_else(|| proto::ReportRequest { node: self.cfg.node.clone(), ..Default::default() }),
        };
        report.metrics = self.routers.metrics();
        report.watch_session = self.watch_session.load(Ordering::Relaxed);
        // The controller accepts metrics only for services the committed plan places here;
        // a router of a service just planned away lingers until its workloads drain.
        if let Some(desired) = rx.borrow().as_ref() {
            let wanted: std::collections::BTreeSet<&str> =
                desired.gpus.values().flat_map(|g| g.workloads.iter().map(|w| w.service.as_str())).collect();
            report.metrics.retain(|m| wanted.contains(m.service.as_str()));
        }
        report
    }

    fn build_report(&self, executor: &Executor, rx: &watch::Receiver<Option<NodeDesired>>) -> proto::ReportRequest {
        let observed = executor.observe().unwrap_or_default();
        let desired = rx.borrow().clone();
        let converged = desired.as_ref().is_some_and(|d| reconcile::plan(d, &observed).is_ok_and(|s| s.is_empty()));
        let gpus = executor
            .gpus
            .iter()
            .map(|g| {
                let o = observed.gpus.get(&g.uuid).cloned().unwrap_or_default();
                proto::ObservedGpu {
                    gpu_uuid: g.uuid.clone(),
                    model: self.model_name(g),
                    mig_enabled: g.mig_enabled,
                    instances: o
                        .layout
                        .iter()
                        .map(|p| proto::AgentMigInstance { profile: p.profile.to_string(), start: u32::from(p.start) })
                        .collect(),
                    workloads: o
                        .running
                        .iter()
                        .map(|r| proto::ObservedWorkload {
                            service: r.spec.service.clone(),
                            mig_instance: match r.spec.slot {
                                crate::desired::Slot::WholeGpu => -1,
                                crate::desired::Slot::Mig(p) => o.layout.iter().position(|q| *q == p).map_or(-1, |i| i as i32),
                            },
                            mps_percent: r.spec.mps_percent,
                            batch: r.spec.batch,
                            state: "running".into(),
                            shadow: r.role == reconcile::Role::Standby,
                            pid: executor.supervisor.get(&r.id).map_or(0, |p| p.pid),
                            process: r.id.clone(),
                        })
                        .collect(),
                }
            })
            .collect();
        proto::ReportRequest {
            node: self.cfg.node.clone(),
            applied_version: if converged { desired.map_or(0, |d| d.version) } else { 0 },
            gpus,
            metrics: Vec::new(),
            watch_session: 0,
        }
    }
}

/// One reconcile round: observe, plan, execute in order. Returns the number of steps.
fn reconcile_once(executor: &mut Executor, desired: &NodeDesired, telemetry: &AgentMetrics) -> anyhow::Result<usize> {
    executor.supervisor.check(std::time::Instant::now())?;
    if let Some(routers) = executor.routers.clone() {
        for service in routers.take_violations() {
            let replaced = executor.failover(&service)?;
            if !replaced.is_empty() {
                telemetry.shadow_switch(&service);
            }
            tracing::info!(service, ?replaced, "switched to the standbys");
        }
    }
    let observed = executor.observe()?;
    let steps = reconcile::plan(desired, &observed)?;
    let round = (!steps.is_empty()).then(|| crate::telemetry::tracing::reconcile_span(desired, steps.len()));
    let _round = round.as_ref().map(tracing::Span::enter);
    for step in &steps {
        tracing::debug!(?step, "executing");
        crate::telemetry::tracing::action_span(step).in_scope(|| executor.execute(step))?;
    }
    executor.route_all()?;
    Ok(steps.len())
}

/// Reconnection delay: 200 ms doubling to 10 s, with ±50% jitter so that a fleet of agents
/// does not reconnect in lock-step after a controller outage.
fn backoff(attempt: u32) -> Duration {
    let base = 200u64.saturating_mul(1 << attempt.min(6)).min(10_000);
    Duration::from_millis(rand::rng().random_range(base / 2..=base + base / 2))
}

/// The GpuModel resource name for a GPU (what the controller's references expect).
fn config_model_name(model: planner::mig::GpuModel, product: &str) -> &'static str {
    use planner::mig::GpuModel::*;
    match model {
        A100_40GB => "A100-40GB",
        A100_80GB => "A100-80GB",
        H100_80GB => "H100-80GB",
        H200 => "H200",
        NoMig if product.contains("T4") => "T4",
        NoMig => "V100",
    }
}
