//! `router-bench`: what gpuplane's router adds in front of a real inference server. For real
//! NVIDIA Triton and real MLServer (deploy/real-servers/README.md), it runs the same closed-loop
//! gRPC ModelInfer clients twice at each concurrency, once against the server directly and once
//! through a router (in this process, on a router thread of its own as in an agent, one
//! backend: that server), and prints p50/p99 latency, throughput and the router's CPU time
//! per request for both, then what the router added. The goal it is held to: at most 100 µs
//! added at p50 and at least 0.9× the direct throughput; below that, the router costs more than
//! a partition's batching can win back.
//!
//! Each client has its own HTTP/2 connection on both paths, so the comparison differs only by
//! the router's hop (its one connection to the server included). Answers are checked on a
//! sample (each client's first request and every 100th); a failed request or a wrong answer,
//! in warm-up or measurement, makes the exit code non-zero.

use anyhow::Context;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use node_agent::router::{serve, Backend, BackendSpec, Router, RouterConfig, RouterError, RouterThreads, ROUTER_THREAD};
use planner::policy::elsa::ServiceTimeModel;
use proto::fixture_models::FixtureModel;
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use proto::oip::{ModelInferRequest, ModelInferResponse, ModelReadyRequest, ServerMetadataRequest};
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// The goal for the router's cost.
const GOAL_ADDED_P50_US: f64 = 100.0;
const GOAL_THROUGHPUT_RATIO: f64 = 0.9;
/// A cold machine imports Triton's and MLServer's Python for far longer than the 2 s seen warm.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// SIGTERM, then this long for the server to exit, then SIGKILL to its whole group.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Every n-th answer of a client is checked (and its first).
const CHECK_EVERY: u64 = 100;
/// Failures and mismatches each client prints to stderr, at most (the counts are exact).
const SHOWN_PER_CLIENT: u32 = 3;
/// The router's backend: the fixtures' max batch (Triton's `double` is 64). The router holds
/// 4 batches of it in flight (admission), 256, so 64 clients are never shed.
const ROUTER_MAX_BATCH: u32 = 64;
/// Far above any latency here: ELSA (unused with one backend) never sees a missed SLO.
const ROUTER_SLO_MS: f64 = 60_000.0;

#[derive(Debug, Parser)]
#[command(about = "Latency and throughput the router adds in front of real Triton and MLServer")]
struct Args {
    /// Measured seconds per cell (server × path × clients × round).
    #[arg(long, default_value_t = 5.0)]
    duration_s: f64,
    /// Unmeasured seconds before each cell's measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup_s: f64,
    /// Concurrent closed-loop clients, one cell each.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 64])]
    clients: Vec<u32>,
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Kind::Triton, Kind::Mlserver])]
    servers: Vec<Kind>,
    /// Where deploy/real-servers/install.sh installs (default: ~/.cache/gpuplane/real-servers).
    #[arg(long, env = "GPUPLANE_REAL_SERVERS")]
    real_servers_root: Option<PathBuf>,
    /// Rounds of (direct, router) per concurrency, alternating which goes first; a row sums them.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Writes the rows and the summary here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The real servers, with the fixture model each serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    Triton,
    Mlserver,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Triton => "triton",
            Kind::Mlserver => "mlserver",
        }
    }

    /// The fixture model the server serves.
    fn fixture(self) -> FixtureModel {
        match self {
            Kind::Triton => FixtureModel::TritonDouble,
            Kind::Mlserver => FixtureModel::MlserverLin,
        }
    }

    /// The model the server serves (the router's backend model).
    fn model(self) -> &'static str {
        self.fixture().model()
    }

    /// The router's service: the model name requests through it give.
    fn service(self) -> &'static str {
        match self {
            Kind::Triton => "triton-svc",
            Kind::Mlserver => "mlserver-svc",
        }
    }

    fn request(self, model_name: &str) -> ModelInferRequest {
        self.fixture().request(model_name)
    }

    fn check(self, response: &ModelInferResponse) -> Result<(), String> {
        self.fixture().check(response)
    }
}

/// The two paths a cell's clients take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Direct,
    Router,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Router => "router",
        }
    }
}

type Client = GrpcInferenceServiceClient<Channel>;

/// One HTTP/2 connection, opened now (not lazily: connecting stays out of the measurement).
async fn connect(addr: &str) -> anyhow::Result<Client> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("address {addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(GrpcInferenceServiceClient::new(channel))
}

async fn model_ready(addr: &str, model: &str) -> anyhow::Result<bool> {
    let mut client = connect(addr).await?;
    let request = ModelReadyRequest { name: model.into(), version: String::new() };
    Ok(client.model_ready(request).await?.into_inner().ready)
}

/// `name version` from the server's ServerMetadata.
async fn server_version(addr: &str) -> anyhow::Result<String> {
    let mut client = connect(addr).await?;
    let metadata = client.server_metadata(ServerMetadataRequest {}).await.context("ServerMetadata")?.into_inner();
    Ok(format!("{} {}", metadata.name, metadata.version))
}

/// A server process, in a process group of its own (Triton's python stubs are its children);
/// the group is stopped on drop, so an error or a panic leaves nothing running.
struct ServerProcess {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl ServerProcess {
    fn spawn(name: &'static str, mut command: Command, log: PathBuf) -> anyhow::Result<Self> {
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        command.stdin(Stdio::null()).stdout(out.try_clone().context("log file")?).stderr(out).process_group(0);
        let child = command.spawn().with_context(|| format!("starting {name}: {command:?}"))?;
        Ok(ServerProcess { name, child: Some(child), log })
    }

    fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child.try_wait().with_context(|| format!("waiting for {}", self.name)),
            None => Ok(None),
        }
    }

    /// The end of its log, for an error message (the log goes with the work directory).
    fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGTERM to the group, up to [`STOP_GRACE`] for the server to exit, then SIGKILL to
    /// whatever of the group is left.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let Ok(group) = libc::pid_t::try_from(child.id()) else { return };
        signal_group(group, libc::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(group, libc::SIGKILL);
        let _ = child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; the group is the one spawned with
    // process_group(0) (its id is the leader's pid, not reaped before this call).
    unsafe {
        libc::kill(-group, signal);
    }
}

/// The scratch directory of this run (model repositories, logs), removed on drop: after the
/// servers, which are dropped first.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("router-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `$GPUPLANE_REAL_SERVERS` (through clap), else `${XDG_CACHE_HOME:-$HOME/.cache}/gpuplane/real-servers`, as install.sh.
fn real_servers_root(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(root) = flag {
        return Ok(root);
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set: pass --real-servers-root")?).join(".cache"),
    };
    Ok(cache.join("gpuplane").join("real-servers"))
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("deploy").join("real-servers")
}

/// Runs install.sh unless an install is complete (its stamp is written last); its output goes
/// to stderr, keeping stdout for the report.
fn ensure_installed(root: &Path, deploy: &Path) -> anyhow::Result<()> {
    let stamp = root.join("current").join("stamp");
    if stamp.is_file() {
        return Ok(());
    }
    let script = deploy.join("install.sh");
    eprintln!("router-bench: no install in {}; running {}", root.display(), script.display());
    let status = Command::new(&script)
        .env("GPUPLANE_REAL_SERVERS", root)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(status.success(), "{} failed ({status})", script.display());
    anyhow::ensure!(stamp.is_file(), "{} succeeded but {} is missing", script.display(), stamp.display());
    Ok(())
}

/// Runs a fixture script with the virtualenv's python.
fn run_fixture(root: &Path, script: &Path, args: &[String]) -> anyhow::Result<()> {
    let python = root.join("venv").join("bin").join("python");
    let out = Command::new(&python)
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    anyhow::ensure!(out.status.success(), "{} failed ({}): {}", script.display(), out.status, String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// `n` free loopback ports: all bound at once so they differ, then released for the server.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>().context("binding a free port")?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>().context("reading a bound port")
}

/// A started server and its gRPC address.
struct Server {
    process: ServerProcess,
    grpc: String,
}

fn start_server(kind: Kind, root: &Path, deploy: &Path, work: &Path) -> anyhow::Result<Server> {
    let ports = free_ports(3)?;
    let (http, grpc, metrics) = (ports[0], ports[1], ports[2]);
    let log = work.join(format!("{}.log", kind.name()));
    let fixtures = deploy.join("fixtures");
    let command = match kind {
        Kind::Triton => {
            let repo = work.join("triton-repo");
            run_fixture(root, &fixtures.join("triton_model.py"), &[path_arg(&repo), "--name".into(), kind.model().into()])?;
            let mut command = Command::new(root.join("bin").join("tritonserver"));
            command.args([
                format!("--model-repository={}", repo.display()),
                format!("--http-port={http}"),
                format!("--grpc-port={grpc}"),
                format!("--metrics-port={metrics}"),
                "--http-address=127.0.0.1".into(),
                "--grpc-address=127.0.0.1".into(),
                "--metrics-address=127.0.0.1".into(),
                "--exit-timeout-secs=10".into(),
                "--model-control-mode=explicit".into(),
                format!("--load-model={}", kind.model()),
            ]);
            command
        }
        Kind::Mlserver => {
            let model_dir = work.join("mlserver-models");
            let fixture_args = [
                path_arg(&model_dir),
                "--name".into(),
                kind.model().into(),
                "--http-port".into(),
                http.to_string(),
                "--grpc-port".into(),
                grpc.to_string(),
                "--metrics-port".into(),
                metrics.to_string(),
            ];
            run_fixture(root, &fixtures.join("mlserver_model.py"), &fixture_args)?;
            let venv_bin = root.join("venv").join("bin");
            // `mlserver start` runs the venv's tools by name.
            let mut paths = vec![venv_bin.clone()];
            paths.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
            let mut command = Command::new(venv_bin.join("mlserver"));
            command.arg("start").arg(&model_dir).current_dir(&model_dir).env("PATH", std::env::join_paths(paths).context("PATH")?);
            command
        }
    };
    let process = ServerProcess::spawn(kind.name(), command, log)?;
    Ok(Server { process, grpc: format!("127.0.0.1:{grpc}") })
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Polls gRPC ModelReady until the model is ready, the server exits, or [`READY_TIMEOUT`].
async fn wait_ready(server: &mut Server, model: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = server.process.exited()? {
            anyhow::bail!(
                "{} exited ({status}) before model {model} was ready; its log ends:\n{}",
                server.process.name,
                server.process.log_tail()
            );
        }
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_secs(2), model_ready(&server.grpc, model)).await {
            eprintln!("router-bench: {} ready in {:.1} s", server.process.name, started.elapsed().as_secs_f64());
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!(
                "{}: model {model} not ready after {} s; its log ends:\n{}",
                server.process.name,
                READY_TIMEOUT.as_secs(),
                server.process.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A router serving on a loopback port, its one backend the server.
struct RouterHandle {
    addr: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), RouterError>>,
    /// The router's thread, as an agent runs its routers (apart from the clients' runtime).
    threads: RouterThreads,
}

async fn start_router(kind: Kind, server_addr: &str) -> anyhow::Result<RouterHandle> {
    let threads = RouterThreads::start(1).context("the router's thread")?;
    let runtime = threads.assign();
    // The backend's channel starts its tasks where it is made: on the router's thread.
    let _on_router_thread = runtime.enter();
    let backend = Backend::connect_lazy(BackendSpec {
        id: format!("{}-0", kind.name()),
        addr: server_addr.into(),
        gpcs: 7,
        max_batch: ROUTER_MAX_BATCH,
        model: kind.model().into(),
    })?;
    let config = RouterConfig::new(kind.service(), ROUTER_SLO_MS);
    // ELSA prices batches only to choose among several backends; with one it is never asked.
    let model: Arc<dyn ServiceTimeModel + Send + Sync> = Arc::new(|_gpcs: u32, _batch: u32| Some(1.0_f64));
    let router = Router::new(config, model, vec![backend])?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding the router")?;
    listener.set_nonblocking(true).context("router listener")?;
    let addr = listener.local_addr().context("router address")?.to_string();
    let listener = TcpListener::from_std(listener).context("router listener")?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = runtime.spawn(serve(router, listener, async move {
        let _ = stopped.await;
    }));
    drop(_on_router_thread);
    Ok(RouterHandle { addr, stop, task, threads })
}

/// CPU time so far of this process's threads named [`ROUTER_THREAD`], from the scheduler's
/// own accounting (`/proc/self/task/*/schedstat`, ns). None where the kernel has no schedstat.
fn router_cpu() -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != ROUTER_THREAD.get(..15).unwrap_or(ROUTER_THREAD) {
            continue;
        }
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
        total += schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

impl RouterHandle {
    async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        let served = tokio::time::timeout(STOP_GRACE, self.task).await.context("router did not stop")?;
        drop(self.threads);
        served.context("router task panicked")?.context("router")?;
        Ok(())
    }
}

/// What a cell's clients send and where.
struct Target {
    kind: Kind,
    addr: String,
    request: ModelInferRequest,
}

/// One client's or one cell's counts.
struct Tally {
    /// Successful requests sent within the measurement, ns.
    latencies_ns: Histogram<u64>,
    failed: u64,
    mismatched: u64,
    checked: u64,
    /// CPU time of the router's threads during the measurement (zero on the direct path,
    /// whose router is idle).
    router_cpu: Duration,
}

impl Tally {
    fn new() -> anyhow::Result<Self> {
        Ok(Tally {
            latencies_ns: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
            failed: 0,
            mismatched: 0,
            checked: 0,
            router_cpu: Duration::ZERO,
        })
    }

    fn merge(&mut self, other: &Tally) -> anyhow::Result<()> {
        self.latencies_ns.add(&other.latencies_ns).map_err(|e| anyhow::anyhow!("merging latency histograms: {e:?}"))?;
        self.failed += other.failed;
        self.mismatched += other.mismatched;
        self.checked += other.checked;
        self.router_cpu += other.router_cpu;
        Ok(())
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// When a cell's clients start measuring and when they stop sending.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    measure_from: Instant,
    end: Instant,
}

/// One client: the next request as soon as the last is answered, until `schedule.end`.
async fn closed_loop(mut client: Client, target: Arc<Target>, schedule: Schedule) -> anyhow::Result<Tally> {
    let mut tally = Tally::new()?;
    let mut shown = 0u32;
    let mut show = |what: String| {
        if shown < SHOWN_PER_CLIENT {
            shown += 1;
            eprintln!("router-bench: {what}");
        }
    };
    for n in 0u64.. {
        let sent = Instant::now();
        if sent >= schedule.end {
            break;
        }
        match client.model_infer(target.request.clone()).await {
            Ok(response) => {
                if sent >= schedule.measure_from {
                    tally.latencies_ns.saturating_record(nanos(sent.elapsed()));
                }
                if n.is_multiple_of(CHECK_EVERY) {
                    tally.checked += 1;
                    if let Err(why) = target.kind.check(response.get_ref()) {
                        tally.mismatched += 1;
                        show(format!("{} via {}: wrong answer: {why}", target.kind.name(), target.addr));
                    }
                }
            }
            Err(status) => {
                tally.failed += 1;
                show(format!("{} via {}: request failed: {status}", target.kind.name(), target.addr));
            }
        }
    }
    Ok(tally)
}

/// `clients` closed loops against `target`: connected first, then warm-up, then measured.
async fn run_cell(target: &Arc<Target>, clients: u32, warmup: Duration, duration: Duration) -> anyhow::Result<Tally> {
    let mut connections = Vec::new();
    for _ in 0..clients {
        connections.push(connect(&target.addr).await?);
    }
    let measure_from = Instant::now() + warmup;
    let schedule = Schedule { measure_from, end: measure_from + duration };
    let tasks: Vec<_> = connections.into_iter().map(|c| tokio::spawn(closed_loop(c, Arc::clone(target), schedule))).collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_from = router_cpu();
    tokio::time::sleep_until(schedule.end.into()).await;
    let cpu_to = router_cpu();
    let mut cell = Tally::new()?;
    for task in tasks {
        cell.merge(&task.await.context("a client task panicked")??)?;
    }
    if let (Some(from), Some(to)) = (cpu_from, cpu_to) {
        cell.router_cpu += to.saturating_sub(from);
    }
    Ok(cell)
}

/// One line of the report.
#[derive(Debug, Serialize)]
struct Row {
    server: &'static str,
    path: &'static str,
    clients: u32,
    p50_us: f64,
    p99_us: f64,
    requests_per_s: f64,
    /// CPU time of the router's threads per request measured, µs (0 on the direct path).
    router_cpu_us: f64,
    /// Successful requests measured.
    requests: u64,
    failed: u64,
    mismatched: u64,
    checked: u64,
}

impl Row {
    fn new(kind: Kind, via: Via, clients: u32, tally: &Tally, measured: Duration) -> Self {
        let us = |q: f64| tally.latencies_ns.value_at_quantile(q) as f64 / 1000.0;
        let requests = tally.latencies_ns.len();
        Row {
            server: kind.name(),
            path: via.name(),
            clients,
            p50_us: us(0.5),
            p99_us: us(0.99),
            requests_per_s: requests as f64 / measured.as_secs_f64(),
            router_cpu_us: if requests > 0 { tally.router_cpu.as_secs_f64() * 1e6 / requests as f64 } else { 0.0 },
            requests,
            failed: tally.failed,
            mismatched: tally.mismatched,
            checked: tally.checked,
        }
    }
}

#[derive(Debug, Serialize)]
struct Summary {
    server: &'static str,
    clients: u32,
    added_p50_us: f64,
    throughput_ratio: f64,
    goal_met: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    nproc: usize,
    versions: BTreeMap<&'static str, String>,
    router_version: &'static str,
    warmup_s: f64,
    duration_s: f64,
    rounds: u32,
    rows: Vec<Row>,
    summary: Vec<Summary>,
}

/// How long each cell runs, checked once.
struct Settings {
    warmup: Duration,
    duration: Duration,
    clients: Vec<u32>,
    rounds: u32,
}

impl Settings {
    fn from_args(args: &Args) -> anyhow::Result<Self> {
        let warmup = Duration::try_from_secs_f64(args.warmup_s).context("--warmup-s")?;
        let duration = Duration::try_from_secs_f64(args.duration_s).context("--duration-s")?;
        anyhow::ensure!(!duration.is_zero(), "--duration-s must be above 0");
        anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
        anyhow::ensure!(!args.clients.is_empty() && !args.clients.contains(&0), "--clients: each at least 1");
        Ok(Settings { warmup, duration, clients: args.clients.clone(), rounds: args.rounds })
    }
}

/// Starts `kind`, measures every concurrency direct and through a router, stops it. Returns
/// its version and its rows.
async fn bench_server(kind: Kind, root: &Path, deploy: &Path, work: &Path, settings: &Settings) -> anyhow::Result<(String, Vec<Row>)> {
    let mut server = start_server(kind, root, deploy, work)?;
    wait_ready(&mut server, kind.model()).await?;
    let version = server_version(&server.grpc).await?;
    let router = start_router(kind, &server.grpc).await?;
    anyhow::ensure!(model_ready(&router.addr, kind.service()).await?, "the router in front of {} is not ready", kind.name());
    let targets = [
        (Via::Direct, Arc::new(Target { kind, addr: server.grpc.clone(), request: kind.request(kind.model()) })),
        (Via::Router, Arc::new(Target { kind, addr: router.addr.clone(), request: kind.request(kind.service()) })),
    ];
    let mut rows = Vec::new();
    for &clients in &settings.clients {
        let mut tallies = [Tally::new()?, Tally::new()?];
        for round in 0..settings.rounds {
            // Alternating the order so that neither path always runs on a warmer server.
            let order = if round.is_multiple_of(2) { [0, 1] } else { [1, 0] };
            for i in order {
                let (via, target) = &targets[i];
                eprintln!("router-bench: {} {} {clients} clients, round {}", kind.name(), via.name(), round + 1);
                let cell = run_cell(target, clients, settings.warmup, settings.duration).await?;
                tallies[i].merge(&cell)?;
            }
        }
        let measured = settings.duration * settings.rounds;
        for (i, (via, _)) in targets.iter().enumerate() {
            rows.push(Row::new(kind, *via, clients, &tallies[i], measured));
        }
    }
    router.shutdown().await?;
    server.process.stop();
    Ok((version, rows))
}

fn summarize(rows: &[Row]) -> Vec<Summary> {
    rows.iter()
        .filter(|d| d.path == Via::Direct.name())
        .filter_map(|d| {
            let r = rows.iter().find(|r| r.path == Via::Router.name() && r.server == d.server && r.clients == d.clients)?;
            let added_p50_us = r.p50_us - d.p50_us;
            let throughput_ratio = if d.requests_per_s > 0.0 { r.requests_per_s / d.requests_per_s } else { 0.0 };
            let goal_met = added_p50_us <= GOAL_ADDED_P50_US && throughput_ratio >= GOAL_THROUGHPUT_RATIO;
            Some(Summary { server: d.server, clients: d.clients, added_p50_us, throughput_ratio, goal_met })
        })
        .collect()
}

fn print_report(report: &Report) {
    let versions: Vec<String> = report.versions.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("# router-bench: gpuplane's router in front of real servers vs. the same clients direct");
    println!();
    println!(
        "machine: {} CPUs (available_parallelism); {}; router: gpuplane-router {}",
        report.nproc,
        versions.join("; "),
        report.router_version
    );
    println!(
        "each cell: {:.1} s warm-up + {:.1} s measured, {} round(s); closed loop, gRPC ModelInfer, one HTTP/2 connection per client; the router on a thread of its own",
        report.warmup_s, report.duration_s, report.rounds
    );
    println!();
    println!("| server | path | clients | p50 µs | p99 µs | req/s | router CPU µs/req | failed |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &report.rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.0} | {:.1} | {} |",
            r.server,
            r.path,
            r.clients,
            r.p50_us,
            r.p99_us,
            r.requests_per_s,
            r.router_cpu_us,
            r.failed + r.mismatched
        );
    }
    println!();
    println!("goal: at most {GOAL_ADDED_P50_US} µs added at p50, at least {GOAL_THROUGHPUT_RATIO}× the direct throughput");
    println!();
    println!("| server | clients | added p50 µs | throughput ratio | goal met |");
    println!("|---|---:|---:|---:|---|");
    for s in &report.summary {
        let met = if s.goal_met { "yes" } else { "no" };
        println!("| {} | {} | {:+.1} | {:.3} | {met} |", s.server, s.clients, s.added_p50_us, s.throughput_ratio);
    }
    println!();
    println!("failed counts failed requests and wrong answers, warm-up included; answers checked on a sample:");
    for r in &report.rows {
        println!(
            "- {} {} {} clients: {} measured requests, {} answers checked, {} wrong, {} failed",
            r.server, r.path, r.clients, r.requests, r.checked, r.mismatched, r.failed
        );
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let settings = Settings::from_args(&args)?;
    let root = real_servers_root(args.real_servers_root.clone())?;
    let deploy = deploy_dir();
    ensure_installed(&root, &deploy)?;
    // Declared before the servers start (in bench_server), so removed after they stop.
    let work = WorkDir::create()?;
    let mut versions = BTreeMap::new();
    let mut rows = Vec::new();
    // One server at a time: on a small machine the other's idle threads would still cost.
    for &kind in &args.servers {
        let (version, server_rows) = bench_server(kind, &root, &deploy, &work.0, &settings).await?;
        versions.insert(kind.name(), version);
        rows.extend(server_rows);
    }
    let summary = summarize(&rows);
    let report = Report {
        nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        versions,
        router_version: env!("CARGO_PKG_VERSION"),
        warmup_s: args.warmup_s,
        duration_s: args.duration_s,
        rounds: settings.rounds,
        rows,
        summary,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("encoding the report")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let failed: u64 = report.rows.iter().map(|r| r.failed).sum();
    let mismatched: u64 = report.rows.iter().map(|r| r.mismatched).sum();
    anyhow::ensure!(failed == 0 && mismatched == 0, "{failed} requests failed and {mismatched} answers were wrong");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Ctrl-C drops `run`, and with it the servers' guards, which stop their process groups
    // (they are not in ours, so the terminal's SIGINT does not reach them).
    tokio::select! {
        result = run(args) => result,
        signal = tokio::signal::ctrl_c() => {
            signal.context("listening for Ctrl-C")?;
            anyhow::bail!("interrupted; servers stopped")
        }
    }
}
