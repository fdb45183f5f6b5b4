//! Simulated node agents, in-process: each registers its Node, watches its desired state and
//! reports once a second echoing it, as `node-agent` does, over a shared pool of gRPC
//! connections (one `Client`, so one HTTP/2 connection per controller, per group of agents).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controlplane::client::{Client, RetryPolicy};

/// What one agent has received.
#[derive(Clone, Debug, Default)]
pub struct Held {
    pub version: u64,
    /// When the latest desired state arrived.
    pub at: Option<Instant>,
    pub has_work: bool,
    /// Desired states received in all.
    pub received: u64,
}

/// Everything the agents observed, shared with the measuring side.
pub struct Observed {
    pub held: Mutex<BTreeMap<String, Held>>,
    pub registered: Mutex<Vec<Instant>>,
    /// Report round trips (ms) and failures.
    pub report_ms: Mutex<Vec<f64>>,
    /// When each of those reports was sent, and whether it carried the agent's GPUs, in
    /// the same order.
    pub report_sent: Mutex<Vec<(Instant, bool)>>,
    pub reports_failed: std::sync::atomic::AtomicU64,
    /// Reports answered that carried the agent's GPUs (its observed state had changed since
    /// the controllers last wrote it); the others left them out.
    pub reports_with_gpus: std::sync::atomic::AtomicU64,
    /// Failed reports by gRPC code and the start of the message.
    pub report_errors: Mutex<BTreeMap<String, u64>>,
    /// Agents killed: they drop their stream and stop reporting, as a host that dies.
    pub dead: tokio::sync::watch::Sender<BTreeSet<String>>,
    /// How late a task of the simulator's runtime woke from a 10 ms timer (ms), and when:
    /// what the agents' watches wait for in this process.
    pub runtime_lag_ms: Lags,
    /// The same on the runtime the reports are sent and timed on: the part of a report's
    /// round trip the simulator itself adds.
    pub report_runtime_lag_ms: Lags,
}

/// A runtime's wake-up lags (ms) and when each was measured.
pub type Lags = Mutex<Vec<(Instant, f64)>>;

impl Default for Observed {
    fn default() -> Self {
        Observed {
            held: Mutex::default(),
            registered: Mutex::default(),
            report_ms: Mutex::default(),
            report_sent: Mutex::default(),
            reports_failed: Default::default(),
            reports_with_gpus: Default::default(),
            report_errors: Mutex::default(),
            dead: tokio::sync::watch::Sender::new(BTreeSet::new()),
            runtime_lag_ms: Mutex::default(),
            report_runtime_lag_ms: Mutex::default(),
        }
    }
}

impl Observed {
    /// Kills the agents `names` at once.
    pub fn kill(&self, names: &[String]) {
        self.dead.send_modify(|dead| dead.extend(names.iter().cloned()));
    }

    fn is_dead(&self, name: &str) -> bool {
        self.dead.borrow().contains(name)
    }
}

pub use devcluster::synthetic_fleet::node_name;
use devcluster::synthetic_fleet::node_resource;

/// The report an agent that applied `desired` sends: the GPUs as configured, its workloads
/// running, and a window of metrics per service placed on it.
fn report(node: &str, watch_session: u64, desired: Option<&proto::DesiredState>) -> proto::ReportRequest {
    let mut r = proto::ReportRequest { node: node.into(), watch_session, ..Default::default() };
    let Some(d) = desired else { return r };
    r.applied_version = d.version;
    let mut services = std::collections::BTreeSet::new();
    for g in &d.gpus {
        r.gpus.push(proto::ObservedGpu {
            gpu_uuid: g.gpu_uuid.clone(),
            model: "A100-80GB".into(),
            mig_enabled: true,
            instances: g.mig_layout.clone(),
            workloads: g
                .workloads
                .iter()
                .map(|w| proto::ObservedWorkload {
                    service: w.service.clone(),
                    mig_instance: w.mig_instance,
                    mps_percent: w.mps_percent,
                    batch: w.batch,
                    state: "ready".into(),
                    ..Default::default()
                })
                .collect(),
        });
        services.extend(g.workloads.iter().map(|w| w.service.clone()));
    }
    r.metrics = services
        .into_iter()
        .map(|service| proto::ServiceMetrics { service, p99_ms: 20.0, throughput_rps: 100.0, arrival_rps: 100.0, ..Default::default() })
        .collect();
    r
}

/// The clients of a group of agents: watches and registration on this runtime, reports on
/// `reports` (a runtime of their own, with connections of their own, so that a report's
/// round trip is not timed behind the thousands of watches this process also serves: a
/// real agent has a host of its own).
pub struct GroupClients {
    pub watches: Arc<Client>,
    pub reports: Arc<Client>,
    pub report_runtime: tokio::runtime::Handle,
}

/// Starts agents `range`; they run until the runtimes stop.
pub fn spawn_group(clients: GroupClients, range: std::ops::Range<usize>, observed: Arc<Observed>) {
    let clients = Arc::new(clients);
    for i in range {
        let clients = clients.clone();
        let client = clients.watches.clone();
        let observed = observed.clone();
        tokio::spawn(async move {
            let name = node_name(i);
            // Agents start within the first second, as a fleet restarting does.
            tokio::time::sleep(Duration::from_millis((i as u64 * 7919) % 1000)).await;
            while client.put(node_resource(&name), proto::WriteMode::Unspecified).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            observed.registered.lock().unwrap().push(Instant::now());
            let link = Arc::new(Link::default());
            clients.report_runtime.spawn(report_loop(clients.reports.clone(), name.clone(), link.clone(), observed.clone()));
            watch_loop(client, name, link, observed).await;
        });
    }
}

/// What an agent's watch shares with its reports.
#[derive(Default)]
struct Link {
    latest: Mutex<Option<proto::DesiredState>>,
    /// The session of the stream held now, reported at once when it is new (as `node-agent`).
    session: std::sync::atomic::AtomicU64,
    report_now: tokio::sync::Notify,
}

async fn watch_loop(client: Arc<Client>, name: String, link: Arc<Link>, observed: Arc<Observed>) {
    let mut dead = observed.dead.subscribe();
    let mut sessions = 0u64;
    loop {
        let from = link.latest.lock().unwrap().as_ref().map_or(0, |d| d.version);
        // Unique per agent and stream, never 0.
        sessions += 1;
        let session = (sessions << 20) | (name_number(&name) + 1);
        let Ok(mut stream) = client.watch_desired(&name, from, session).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        link.session.store(session, std::sync::atomic::Ordering::Relaxed);
        link.report_now.notify_one();
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                // A dead host: the stream is dropped (reset) and nothing more is sent.
                _ = dead.wait_for(|d| d.contains(&name)) => return,
            };
            let Ok(Some(d)) = message else { break };
            let now = Instant::now();
            {
                let mut held = observed.held.lock().unwrap();
                let h = held.entry(name.clone()).or_default();
                h.version = d.version;
                h.at = Some(now);
                h.has_work = !d.gpus.is_empty();
                h.received += 1;
            }
            *link.latest.lock().unwrap() = Some(d);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn name_number(name: &str) -> u64 {
    name.trim_start_matches("host-").parse().unwrap_or(0)
}

async fn report_loop(client: Arc<Client>, name: String, link: Arc<Link>, observed: Arc<Observed>) {
    // Like the node agent: once a second, or at the longer interval the controllers ask
    // for (at most a minute), and at once on a new stream.
    let mut schedule = proto::report_pace::ReportSchedule::new(Duration::from_secs(1));
    let mut wait = schedule.interval();
    // Which reports leave the GPUs out, as `node-agent`.
    let mut change_only = proto::ChangeOnlyReports::default();
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = link.report_now.notified() => schedule.sent_out_of_schedule(),
        }
        wait = schedule.interval();
        if observed.is_dead(&name) {
            return;
        }
        let mut r = report(&name, link.session.load(std::sync::atomic::Ordering::Relaxed), link.latest.lock().unwrap().as_ref());
        change_only.prepare(&mut r);
        let with_gpus = !r.gpus_unchanged;
        let sent = Instant::now();
        match client.report(r.clone()).await {
            Ok(answer) => {
                let mut ms = observed.report_ms.lock().unwrap();
                ms.push(sent.elapsed().as_secs_f64() * 1e3);
                observed.report_sent.lock().unwrap().push((sent, with_gpus));
                observed.reports_with_gpus.fetch_add(u64::from(with_gpus), std::sync::atomic::Ordering::Relaxed);
                change_only.answered(&r, answer.observed_digest);
                wait = schedule.answered(answer.report_interval_ms, rand::random());
            }
            Err(status) => {
                observed.reports_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let key = format!("{:?}: {}", status.code(), status.message().chars().take(80).collect::<String>());
                *observed.report_errors.lock().unwrap().entry(key).or_default() += 1;
            }
        }
    }
}

/// Records, until the runtime stops, how late this runtime wakes a task from a timer into
/// `lags` (one of `observed`'s), with when.
pub async fn probe_runtime_lag(observed: Arc<Observed>, lags: fn(&Observed) -> &Lags) {
    controlplane::telemetry::probe_runtime_lag(move |late| {
        lags(&observed).lock().unwrap().push((Instant::now(), late.as_secs_f64() * 1e3));
    })
    .await
}

/// One client (one connection per controller) per group of agents, starting on a different
/// controller per group so that watches spread over the three.
pub fn group_client(servers: &[String], group: usize) -> Arc<Client> {
    let mut rotated = servers.to_vec();
    rotated.rotate_left(group % servers.len());
    Arc::new(Client::new(rotated).with_retry(RetryPolicy {
        attempts: 5,
        timeout: Duration::from_secs(10),
        backoff: Duration::from_millis(200),
    }))
}
