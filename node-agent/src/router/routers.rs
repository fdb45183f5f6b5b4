//! The agent's routers: one local endpoint per service with processes on this node. The
//! executor calls in from its blocking thread: after a start or a promotion the service's
//! active set becomes its ready active processes (one pointer swap); a process to stop is
//! first taken out of the set and drained, so no request reaches a stopped process.

use super::planned_times::PlannedBatch;
use super::threads::RouterThreads;
use super::{serve, Backend, BackendSpec, Callers, PlannedServiceTimes, Router, RouterConfig, RouterCounts, WindowStats};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long a new process may take to answer Ready before it is routed to anyway... never:
/// it stays out of the set and the next reconcile round tries again.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a retired process may take to finish its in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a Ready probe of a standby may take: a local process that is up answers in
/// well under a millisecond; one still loading its model is probed again next round.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Closed windows kept for the reconcile loop (which takes them every round, about once a
/// second): with a slow round (a process loading its model) the oldest go first, as a
/// violation streak is counted on the newest.
const MAX_QUEUED_WINDOWS: usize = 256;

/// One active process of a service, as the router sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveProcess {
    pub id: String,
    pub port: u16,
    /// Partition size (7 for a whole GPU).
    pub gpcs: u32,
    pub max_batch: u32,
    /// The planner's predicted time of one batch of `max_batch` here, ms (0: not known).
    pub batch_ms: f64,
    /// The name the process serves its model under.
    pub model: String,
}

struct ServiceRouter {
    router: Router,
    /// What ELSA prices the router's partitions with: the planned batch times of its
    /// active processes.
    times: Arc<PlannedServiceTimes>,
    port: u16,
    backends: BTreeMap<String, Arc<Backend>>,
    latest: Arc<Mutex<Option<WindowStats>>>,
    /// The router thread it runs on (its backends' connections too: a request's tasks
    /// never cross threads).
    runtime: Handle,
    _stop: oneshot::Sender<()>,
}

pub struct Routers {
    /// Every router's closed windows, oldest first, for the shadow policies
    /// (`crate::shadow::workloads`), which the reconcile loop feeds.
    windows: Arc<Mutex<VecDeque<(String, WindowStats)>>>,
    host: String,
    ports: [u16; 2],
    /// Service → port, kept across agent restarts so that clients keep their endpoint.
    ports_file: PathBuf,
    threads: RouterThreads,
    routers: Mutex<BTreeMap<String, ServiceRouter>>,
    /// Who may call each service, from the latest desired state (a router started later
    /// starts with its service's).
    callers: Mutex<BTreeMap<String, Callers>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    #[error("no free router port left in {0:?}")]
    NoPort([u16; 2]),
    #[error("router for {service} cannot listen on {addr}: {source}")]
    Listen { service: String, addr: String, source: std::io::Error },
    #[error("router for {service}: {message}")]
    Router { service: String, message: String },
}

impl Routers {
    pub fn new(host: String, ports: [u16; 2], state_dir: PathBuf, threads: RouterThreads) -> Self {
        Routers {
            windows: Arc::default(),
            host,
            ports,
            ports_file: state_dir.join("router-ports.json"),
            threads,
            routers: Mutex::new(BTreeMap::new()),
            callers: Mutex::default(),
        }
    }

    /// Who may call each service from now on (a service absent: open).
    pub fn set_callers(&self, callers: &BTreeMap<String, Callers>) {
        {
            // Not held with the routers' lock, which `sync` holds when it takes this one.
            let mut kept = self.callers.lock().expect("callers lock");
            if *kept == *callers {
                return;
            }
            kept.clone_from(callers);
        }
        for (service, r) in self.routers.lock().expect("routers lock").iter() {
            r.router.set_callers(callers.get(service).cloned().unwrap_or_default());
        }
    }

    fn saved_ports(&self) -> BTreeMap<String, u16> {
        std::fs::read(&self.ports_file).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn port_for(&self, service: &str, taken: &BTreeSet<u16>) -> Result<u16, RoutingError> {
        let mut saved = self.saved_ports();
        if let Some(&p) = saved.get(service) {
            return Ok(p);
        }
        let used: BTreeSet<u16> = saved.values().copied().chain(taken.iter().copied()).collect();
        // Skip ports another program holds; once chosen, a service keeps its port.
        let bindable = |p: u16| std::net::TcpListener::bind((self.host.as_str(), p)).is_ok();
        let port = (self.ports[0]..=self.ports[1]).find(|&p| !used.contains(&p) && bindable(p)).ok_or(RoutingError::NoPort(self.ports))?;
        saved.insert(service.to_string(), port);
        if let Err(e) = std::fs::write(&self.ports_file, serde_json::to_vec(&saved).expect("ports serialize")) {
            tracing::warn!(error = %e, "router ports not kept on disk");
        }
        Ok(port)
    }

    /// Makes the ready processes of `active` the active set of `service`'s router, starting
    /// the router if needed. Processes not ready yet stay out until a later call. Returns
    /// the processes this call found ready and added.
    pub fn sync(&self, service: &str, slo_ms: f64, active: &[ActiveProcess]) -> Result<Vec<String>, RoutingError> {
        // New processes are probed for readiness without holding the lock (a server may take
        // seconds to load its model), so metrics and other services are not held up.
        let (runtime, unknown): (Handle, Vec<&ActiveProcess>) = {
            let mut routers = self.routers.lock().expect("routers lock");
            if !routers.contains_key(service) {
                let taken: BTreeSet<u16> = routers.values().map(|r| r.port).collect();
                let port = self.port_for(service, &taken)?;
                let r = self.start_router(service, slo_ms, port)?;
                routers.insert(service.to_string(), r);
            }
            let r = &routers[service];
            if r.router.slo_ms().to_bits() != slo_ms.to_bits() {
                r.router.set_slo_ms(slo_ms);
            }
            (r.runtime.clone(), active.iter().filter(|p| !r.backends.contains_key(&p.id)).collect())
        };
        let mut ready: BTreeMap<String, Arc<Backend>> = BTreeMap::new();
        for p in unknown {
            let spec = BackendSpec {
                id: p.id.clone(),
                addr: format!("127.0.0.1:{}", p.port),
                gpcs: p.gpcs,
                max_batch: p.max_batch,
                model: p.model.clone(),
            };
            let b = {
                // The channel's tasks start on the runtime current where it is made.
                let _on_router_thread = runtime.enter();
                Backend::connect_lazy(spec).map_err(|e| RoutingError::Router { service: service.into(), message: e.to_string() })?
            };
            if wait_ready(&runtime, &b) {
                ready.insert(p.id.clone(), b);
            } else {
                tracing::info!(service, process = %p.id, "process not ready yet; not routed to");
            }
        }
        let mut routers = self.routers.lock().expect("routers lock");
        let Some(r) = routers.get_mut(service) else { return Ok(Vec::new()) };
        let added: Vec<String> = ready.keys().cloned().collect();
        r.backends.extend(ready);
        let next: Vec<Arc<Backend>> = active.iter().filter_map(|p| r.backends.get(&p.id).cloned()).collect();
        let now: Vec<String> = r.router.active().ids().into_iter().map(String::from).collect();
        let wanted: Vec<String> = next.iter().map(|b| b.id().to_string()).collect();
        let routed = active.iter().filter(|p| r.backends.contains_key(&p.id));
        r.times.set(routed.map(|p| PlannedBatch { gpcs: p.gpcs, batch: p.max_batch, batch_ms: p.batch_ms }));
        if now != wanted && !next.is_empty() {
            let swap = r.router.set_active(next);
            tracing::info!(service, active = ?wanted, swap_us = swap.store_time.as_micros() as u64, "router switched");
        }
        Ok(added)
    }

    fn start_router(&self, service: &str, slo_ms: f64, port: u16) -> Result<ServiceRouter, RoutingError> {
        let addr = format!("{}:{port}", self.host);
        let listener = std::net::TcpListener::bind(&addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| RoutingError::Listen { service: service.into(), addr: addr.clone(), source })?;
        let times = Arc::new(PlannedServiceTimes::default());
        let config = RouterConfig::new(service, slo_ms);
        let router = Router::new(config, times.clone(), Vec::new())
            .map_err(|e| RoutingError::Router { service: service.into(), message: e.to_string() })?;
        router.set_callers(self.callers.lock().expect("callers lock").get(service).cloned().unwrap_or_default());
        let latest = Arc::new(Mutex::new(None));
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = router.clone();
        let mut windows = router.subscribe_windows();
        let keep = latest.clone();
        let queue = self.windows.clone();
        let service_name = service.to_string();
        let runtime = self.threads.assign();
        let _guard = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| RoutingError::Listen {
            service: service.into(),
            addr: addr.clone(),
            source,
        })?;
        let name = service.to_string();
        runtime.spawn(async move {
            if let Err(e) = serve(serving, listener, async move {
                let _ = stopped.await;
            })
            .await
            {
                tracing::error!(service = %name, error = %e, "router stopped");
            }
        });
        runtime.spawn(async move {
            while let Ok(w) = windows.recv().await {
                {
                    let mut queue = queue.lock().expect("windows lock");
                    if queue.len() == MAX_QUEUED_WINDOWS {
                        queue.pop_front();
                    }
                    queue.push_back((service_name.clone(), w.clone()));
                }
                *keep.lock().expect("window lock") = Some(w);
            }
        });
        tracing::info!(service, %addr, "router listening");
        drop(_guard);
        Ok(ServiceRouter { router, times, port, backends: BTreeMap::new(), latest, runtime, _stop: stop })
    }

    /// Takes process `id` out of its router's active set and waits for its in-flight
    /// requests. A process that is its service's last is kept routed and not waited for:
    /// under steady load its in-flight count never reaches zero, so the wait would only
    /// stall the reconcile; the process itself finishes what it holds on SIGTERM, and what
    /// arrives after fails until the service's next process is up.
    pub fn retire(&self, id: &str) {
        // Out of the active set under the lock; the wait for in-flight requests without it.
        let retired: Vec<(String, Arc<Backend>)> = {
            let mut routers = self.routers.lock().expect("routers lock");
            routers
                .iter_mut()
                .filter_map(|(service, r)| {
                    let backend = r.backends.remove(id)?;
                    let rest: Vec<Arc<Backend>> = r.router.active().backends().iter().filter(|b| b.id() != id).cloned().collect();
                    if rest.is_empty() {
                        tracing::info!(service = %service, process = id, "stopping the service's last process on this node");
                        return None;
                    }
                    r.router.set_active(rest);
                    Some((service.clone(), backend))
                })
                .collect()
        };
        for (service, backend) in retired {
            let drained = self.threads.any().block_on(async { tokio::time::timeout(DRAIN_TIMEOUT, backend.drained()).await.is_ok() });
            if !drained {
                tracing::warn!(service = %service, process = id, "drain timed out");
            }
        }
    }

    /// The windows closed since the last call, by service, oldest first.
    pub fn take_windows(&self) -> Vec<(String, WindowStats)> {
        self.windows.lock().expect("windows lock").drain(..).collect()
    }

    /// Whether a router has process `id` among its backends.
    pub fn routes(&self, id: &str) -> bool {
        self.routers.lock().expect("routers lock").values().any(|r| r.backends.contains_key(id))
    }

    /// Whether the workload process listening on `port` answers that `model` is ready, asked
    /// once.
    pub fn probe_ready(&self, port: u16, model: &str) -> bool {
        let spec =
            BackendSpec { id: format!("probe-{port}"), addr: format!("127.0.0.1:{port}"), gpcs: 1, max_batch: 1, model: model.into() };
        let runtime = self.threads.any();
        let Ok(backend) = ({
            let _on_router_thread = runtime.enter();
            Backend::connect_lazy(spec)
        }) else {
            return false;
        };
        runtime.block_on(async move { tokio::time::timeout(PROBE_TIMEOUT, backend.ready()).await.is_ok_and(|r| r.unwrap_or(false)) })
    }

    /// Every router's counters, by service.
    pub fn counts(&self) -> BTreeMap<String, RouterCounts> {
        let routers = self.routers.lock().expect("routers lock");
        routers.iter().map(|(service, r)| (service.clone(), r.router.counts())).collect()
    }

    /// Busy time of every routed process, by process id (see [`Backend::busy_time`]).
    pub fn busy_times(&self) -> BTreeMap<String, Duration> {
        let routers = self.routers.lock().expect("routers lock");
        routers.values().flat_map(|r| r.backends.iter().map(|(id, b)| (id.clone(), b.busy_time()))).collect()
    }

    /// Per service: the router's address and its latest closed window.
    pub fn metrics(&self) -> Vec<proto::ServiceMetrics> {
        let routers = self.routers.lock().expect("routers lock");
        routers
            .iter()
            .map(|(service, r)| {
                let w = r.latest.lock().expect("window lock").clone();
                proto::ServiceMetrics {
                    service: service.clone(),
                    p99_ms: w.as_ref().and_then(|w| w.p99_ms).unwrap_or(0.0),
                    throughput_rps: w.as_ref().map_or(0.0, WindowStats::throughput_rps),
                    arrival_rps: w.as_ref().map_or(0.0, WindowStats::arrival_rps),
                    failed: w.as_ref().map_or(0, |w| w.failed),
                    endpoint: format!("{}:{}", self.host, r.port),
                    // The executor measures cold starts and the scrape loop reads the
                    // servers' pages; the report adds them.
                    cold_start_s: 0.0,
                    server: None,
                }
            })
            .collect()
    }
}

/// Polls `backend`'s readiness on its router thread until ready or [`READY_TIMEOUT`].
fn wait_ready(runtime: &Handle, backend: &Arc<Backend>) -> bool {
    let b = backend.clone();
    runtime.block_on(async move {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if b.ready().await.unwrap_or(false) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    })
}
