//! What fleet-bench measures and how it prints it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controlplane::client::Client;
use devcluster::local::LocalCluster;
use devcluster::process::cpu_seconds_of;
use serde_json::json;

use crate::agents::Observed;

pub use devcluster::stats::percentile;

/// How a change reached the agents: how many got a new desired state, and when.
#[derive(Clone, Debug, Default)]
pub struct FanOut {
    pub agents: usize,
    pub p50_s: Option<f64>,
    pub p99_s: Option<f64>,
    pub last_s: Option<f64>,
}

/// Waits until agents stop receiving desired states after `since` (no new one for `quiet_s`
/// after at least one arrived, or `timeout`), and returns the latencies from `since`. With
/// `work_only`, desired states with nothing placed do not count (agents whose watch opened
/// late still receive their first, empty one after `since`).
pub async fn fan_out(observed: &Observed, since: Instant, quiet_s: f64, timeout: Duration, work_only: bool) -> FanOut {
    let quiet = Duration::from_secs_f64(quiet_s);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let latencies: Vec<f64> = observed
            .held
            .lock()
            .unwrap()
            .values()
            .filter(|h| h.has_work || !work_only)
            .filter_map(|h| h.at.filter(|&at| at > since).map(|at| at.duration_since(since).as_secs_f64()))
            .collect();
        let last = latencies.iter().copied().fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.max(l))));
        let settled = last.is_some_and(|l| since.elapsed().as_secs_f64() - l > quiet.as_secs_f64());
        if settled || since.elapsed() > timeout {
            if !settled {
                eprintln!("fan-out: still arriving (or nothing arrived) after {timeout:?}");
            }
            return FanOut {
                agents: latencies.len(),
                p50_s: percentile(&latencies, 50.0),
                p99_s: percentile(&latencies, 99.0),
                last_s: last,
            };
        }
    }
}

/// How many times the Node watch resumes after its stream ends or breaks.
const MAX_WATCH_RESUMES: u32 = 5;

/// What a Node watch saw, from now on: when nodes' statuses turned unhealthy, and when each
/// node's status last showed a new applied version.
#[derive(Default)]
pub struct NodeWatch {
    marks: Mutex<Vec<(String, Instant)>>,
    applied: Mutex<std::collections::HashMap<String, (u64, Instant)>>,
}

impl NodeWatch {
    /// The watch decodes every Node change of the fleet (thousands per roll-out): it runs
    /// on a thread and runtime of its own, so that the measuring does not delay the
    /// simulated agents' reports it measures.
    pub fn watch(servers: Vec<String>) -> Arc<Self> {
        let marks = Arc::new(NodeWatch::default());
        let m = marks.clone();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for the Node watch");
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let client = Client::new(servers);
                let mut unhealthy = std::collections::HashSet::new();
                // The watched controller may be the one the last step replaces: the watch
                // then resumes on another from the last revision it saw, as a client does.
                let (mut from, mut resumes) = (0, 0);
                loop {
                    let mut stream = match client.watch("Node", from).await {
                        Ok(stream) => stream,
                        Err(e) => return eprintln!("the Node watch for unhealthy marks failed: {e}"),
                    };
                    let ended = loop {
                        match stream.message().await {
                            Ok(Some(ev)) => {
                                from = from.max(ev.revision);
                                if let Some(r) = ev.resource {
                                    m.note(r, &mut unhealthy);
                                }
                            }
                            ended => break ended,
                        }
                    };
                    if resumes == MAX_WATCH_RESUMES {
                        return match ended {
                            Err(e) => eprintln!("the Node watch for unhealthy marks failed: {e}"),
                            Ok(_) => eprintln!("the Node watch for unhealthy marks ended"),
                        };
                    }
                    resumes += 1;
                }
            })
        });
        marks
    }

    /// One Node as the watch saw it: when its status showed a new applied version, and when
    /// it turned unhealthy (`unhealthy`: the nodes seen unhealthy last).
    fn note(&self, r: proto::Resource, unhealthy: &mut std::collections::HashSet<String>) {
        let status: serde_json::Value = serde_json::from_str(&r.status_json).unwrap_or_default();
        let version = status.get("applied_version").and_then(serde_json::Value::as_u64).unwrap_or(0);
        {
            let mut applied = self.applied.lock().unwrap();
            let seen = applied.entry(r.name.clone()).or_insert((version, Instant::now()));
            if seen.0 != version {
                *seen = (version, Instant::now());
            }
        }
        let is = controlplane::resources::NodeStatus::is_unhealthy(&status);
        if is && unhealthy.insert(r.name.clone()) {
            self.marks.lock().unwrap().push((r.name, Instant::now()));
        } else if !is {
            unhealthy.remove(&r.name);
        }
    }

    /// Seconds from `since` until the status of every agent in `held` showed the version
    /// the agent holds (the observed state written, which trails the desired state; `None`:
    /// not within `timeout`).
    pub async fn statuses_written(&self, held: &std::collections::BTreeMap<String, u64>, since: Instant, timeout: Duration) -> Option<f64> {
        loop {
            let (mut behind, mut last) = (0usize, since);
            {
                let applied = self.applied.lock().unwrap();
                for (node, version) in held {
                    match applied.get(node) {
                        Some((v, at)) if v >= version => last = last.max(*at),
                        _ => behind += 1,
                    }
                }
            }
            if behind == 0 {
                return Some(last.duration_since(since).as_secs_f64());
            }
            if since.elapsed() > timeout {
                eprintln!("statuses: {behind} of {} not written after {timeout:?}", held.len());
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Marks of nodes other than `dead`.
    pub fn of_healthy(&self, dead: &BTreeSet<String>) -> u64 {
        self.marks.lock().unwrap().iter().filter(|(n, _)| !dead.contains(n)).count() as u64
    }

    /// Seconds from `since` until each of `nodes` was marked, once all were (`None`: not
    /// all within `timeout`).
    pub async fn detected(&self, nodes: &BTreeSet<String>, since: Instant, timeout: Duration) -> Option<Vec<f64>> {
        loop {
            let seen: Vec<f64> = self
                .marks
                .lock()
                .unwrap()
                .iter()
                .filter(|(n, at)| nodes.contains(n) && *at >= since)
                .map(|(_, at)| at.duration_since(since).as_secs_f64())
                .collect();
            if seen.len() >= nodes.len() {
                return Some(seen);
            }
            if since.elapsed() > timeout {
                eprintln!("dead hosts: {} of {} marked unhealthy after {timeout:?}", seen.len(), nodes.len());
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The controllers' processes, their status (the admin API's `ClusterStatus`, a few
/// hundred bytes) and, once at the end, their `/metrics`: polling the leader's `/metrics`
/// every second would render 10,000 hosts' series each time, a tenth of its CPU in the
/// very seconds this bench measures.
pub struct ControllerProbe {
    metrics: Vec<std::net::SocketAddr>,
    /// gRPC addresses, by controller id - 1.
    addrs: Vec<String>,
    pids: Vec<u32>,
    admin: Client,
}

fn series(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// The buckets of histogram `name` in an exposition text: (upper bound, cumulative count).
fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `q` of histograms with the same buckets,
/// summed (`None`: no observation).
pub fn histogram_quantile(histograms: &[Vec<(f64, f64)>], q: f64) -> Option<f64> {
    let first = histograms.iter().find(|h| !h.is_empty())?;
    let summed: Vec<(f64, f64)> =
        first.iter().enumerate().map(|(i, &(le, _))| (le, histograms.iter().filter_map(|h| h.get(i)).map(|b| b.1).sum())).collect();
    let total = summed.last()?.1;
    (total > 0.0).then(|| summed.iter().find(|b| b.1 >= q * total).map_or(f64::INFINITY, |b| b.0))
}

/// p99 of the time reports spent in the controllers' handlers (`None`: none answered),
/// from each controller's `gpuplane_agent_report_duration_seconds` (bucket bounds).
pub fn report_handler_p99_ms(texts: &[Option<String>]) -> Option<f64> {
    let histograms: Vec<_> = texts.iter().flatten().map(|text| histogram_buckets(text, "gpuplane_agent_report_duration_seconds")).collect();
    histogram_quantile(&histograms, 0.99).map(|s| s * 1e3)
}

/// The largest age of the oldest live node's report the leader saw over the run (its
/// failure detector's passes, once a second): the upper bound of the bucket of
/// `gpuplane_agent_report_age_max_seconds` that holds the largest observation (followers
/// observe none). How stale the metrics the loops read got.
pub fn report_age_max_s(texts: &[Option<String>]) -> Option<f64> {
    report_age_max_between(&[], texts)
}

/// The same over the observations made between two scrapes of the same controllers
/// (`before` empty: since they started): the cumulative counts of `before` taken from
/// those of `after`, controller by controller.
pub fn report_age_max_between(before: &[Option<String>], after: &[Option<String>]) -> Option<f64> {
    const AGE: &str = "gpuplane_agent_report_age_max_seconds";
    let histograms: Vec<Vec<(f64, f64)>> = after
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let earlier = before.get(i).and_then(Option::as_deref).map(|t| histogram_buckets(t, AGE)).unwrap_or_default();
            let mut buckets = histogram_buckets(text.as_deref()?, AGE);
            for (bucket, (_, seen)) in buckets.iter_mut().zip(earlier) {
                bucket.1 -= seen;
            }
            Some(buckets)
        })
        .collect();
    histogram_quantile(&histograms, 1.0)
}

/// Each controller's p99 of how late its API runtime woke a task
/// (`gpuplane_runtime_wake_lag_seconds`, bucket bounds): the wait for a worker that every
/// report arriving there shares.
pub fn runtime_lag_p99_ms(texts: &[Option<String>]) -> Vec<Option<f64>> {
    texts
        .iter()
        .map(|text| {
            let buckets = text.as_deref().map(|t| histogram_buckets(t, "gpuplane_runtime_wake_lag_seconds")).unwrap_or_default();
            histogram_quantile(&[buckets], 0.99).map(|s| s * 1e3)
        })
        .collect()
}

impl ControllerProbe {
    pub fn new(cluster: &LocalCluster) -> Self {
        let ids = cluster.controllers.ids();
        ControllerProbe {
            metrics: cluster.metrics_addrs.values().map(|a| a.parse().expect("a socket address")).collect(),
            addrs: ids.iter().map(|&id| cluster.controllers.addr(id).to_string()).collect(),
            pids: cluster.controllers.pids(),
            admin: Client::new(cluster.servers()),
        }
    }

    async fn scrape(&self, i: usize) -> Option<String> {
        match tokio::time::timeout(Duration::from_secs(10), telemetry_http::get(self.metrics[i], "/metrics")).await {
            Ok(Ok((200, text))) => Some(text),
            _ => None,
        }
    }

    async fn status(&self, i: usize) -> Option<proto::ClusterStatusResponse> {
        tokio::time::timeout(Duration::from_secs(10), self.admin.node_status(&self.addrs[i])).await.ok()?.ok()
    }

    /// The leading controller's index (id - 1) and status.
    async fn leader(&self) -> Option<(usize, proto::ClusterStatusResponse)> {
        for i in 0..self.addrs.len() {
            if let Some(s) = self.status(i).await {
                if s.node_id != 0 && s.leader_id == s.node_id {
                    return Some((i, s));
                }
            }
        }
        None
    }

    /// The controllers' addresses, a follower first and the leader last: where a client
    /// of the measuring (a watch of every Node change) adds no work to the leader, whose
    /// queue the agents' reports wait in.
    pub async fn followers_first(&self) -> Vec<String> {
        let mut addrs = self.addrs.clone();
        if let Some((leader, _)) = self.leader().await {
            addrs.rotate_left(leader + 1);
        }
        addrs
    }

    pub async fn terms(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..self.addrs.len() {
            out.push(self.status(i).await.map_or(0, |s| s.term));
        }
        out
    }

    /// Each controller's `/metrics` (`None`: not answered), read once at the end of a run.
    pub async fn scrape_all(&self) -> Vec<Option<String>> {
        let mut texts = Vec::new();
        for i in 0..self.metrics.len() {
            texts.push(self.scrape(i).await);
        }
        texts
    }

    /// Waits until the leader's log grows by less than `quiet_bytes` in a second (the
    /// agents' status writes after the last change have gone through), at most `timeout`;
    /// returns how long that took. So each phase measures its own change, not the tail of
    /// the one before.
    pub async fn settle(&self, quiet_bytes: u64, timeout: Duration) -> f64 {
        let started = Instant::now();
        let mut last = self.leader_log_bytes().await;
        while started.elapsed() < timeout {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = self.leader_log_bytes().await;
            if let (Some(a), Some(b)) = (last, now) {
                if b.saturating_sub(a) < quiet_bytes {
                    break;
                }
            }
            last = now;
        }
        started.elapsed().as_secs_f64()
    }

    /// A controller replaced: a follower other than controller 1 (which bootstraps the
    /// cluster) is removed from the membership, killed, loses its data and joins again as a
    /// learner, as an operator replaces a failed controller (Raft does not let a voter
    /// come back without its log). How long until it has applied everything the leader
    /// had applied when it rejoined, and whether it got there through a snapshot (the
    /// leader keeps `keep_logs_after_snapshot` entries behind its snapshot, so a short log
    /// is sent as it is), with how long installing the snapshot took (decoding and saving
    /// it, from its log); then it is a voter again. `None` seconds: not within `timeout`.
    /// Replaces a follower with an empty controller after the leader compacted its log
    /// (`gpuctl cluster compact`), so that it can only catch up from a snapshot: the path
    /// a new or long-lagging member takes at this fleet size.
    pub async fn replaced_controller_catch_up(&self, cluster: &mut LocalCluster, admin: &Client, timeout: Duration) -> CatchUp {
        let mut result = CatchUp::default();
        let Some((leader, _)) = self.leader().await else { return result };
        let Some(id) = (2..=self.metrics.len() as u64).find(|&id| id as usize - 1 != leader) else { return result };
        if let Err(e) = admin.remove_member(id).await {
            eprintln!("catch-up: removing controller {id}: {e}");
            return result;
        }
        cluster.controllers.kill9(id);
        let data = cluster.dir.join(format!("controller-{id}"));
        if let Err(e) = std::fs::remove_dir_all(&data) {
            eprintln!("catch-up: cannot remove {}: {e}", data.display());
            return result;
        }
        let leader_address = cluster.controllers.addr(leader as u64 + 1).to_string();
        let terms_before = self.terms().await;
        match admin.compact(&leader_address).await {
            Ok(c) => {
                result.snapshot_build_s = Some(c.build_seconds);
                result.snapshot_mib = Some(c.snapshot_bytes as f64 / (1024.0 * 1024.0));
            }
            Err(e) => eprintln!("catch-up: compacting the leader's log: {e}"),
        }
        // This start's own log (a restarted controller logs to a new file).
        let log = match cluster.start_controller(id) {
            Ok(log) => log,
            Err(e) => {
                eprintln!("catch-up: {e}");
                return result;
            }
        };
        // Compacting can cost an election at this size (a leader that has just taken over
        // still streams its log tail to the follower while it builds the snapshot): wait
        // for the next leader, and say so.
        let waited = Instant::now();
        let target = loop {
            match self.leader().await {
                Some((_, status)) => break status.applied_index,
                None if waited.elapsed() < Duration::from_secs(30) => tokio::time::sleep(Duration::from_millis(100)).await,
                None => {
                    eprintln!("catch-up: no leader 30 s after compacting (terms {:?})", self.terms().await);
                    return result;
                }
            }
        };
        let terms_after = self.terms().await;
        if terms_after != terms_before {
            eprintln!(
                "catch-up: an election after compacting; a leader after {:.1} s (terms {terms_before:?} → {terms_after:?})",
                waited.elapsed().as_secs_f64()
            );
        }
        let started = Instant::now();
        let address = cluster.controllers.addr(id).to_string();
        let peer_address = cluster.controllers.members[&id].peer_addr.clone();
        while let Err(e) = admin.add_member_with_peer_address(id, &address, peer_address.as_deref(), false).await {
            if started.elapsed() > timeout {
                eprintln!("catch-up: adding controller {id} back: {e}");
                return result;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let installed = || std::fs::read_to_string(&log).ok().and_then(|l| installed_seconds(&l));
        while started.elapsed() < timeout {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let applied = self.status(id as usize - 1).await.map_or(0, |s| s.applied_index);
            if applied >= target {
                result.catch_up_s = Some(started.elapsed().as_secs_f64());
                if let Err(e) = admin.add_member_with_peer_address(id, &address, peer_address.as_deref(), true).await {
                    eprintln!("catch-up: promoting controller {id} again: {e}");
                }
                break;
            }
        }
        result.snapshot_install_s = installed();
        result
    }

    pub async fn leader_log_bytes(&self) -> Option<u64> {
        self.leader().await.map(|(_, s)| s.log_appended_bytes)
    }

    /// Mean duration of the leader's provisioning passes that planned.
    pub async fn planning(&self) -> Option<f64> {
        let (i, _) = self.leader().await?;
        let text = self.scrape(i).await?;
        let sum = series(&text, "gpuplane_provision_planning_duration_seconds_sum")?;
        let count = series(&text, "gpuplane_provision_planning_duration_seconds_count")?;
        (count > 0.0).then(|| sum / count)
    }

    pub async fn leader_rss_mib(&self) -> Option<f64> {
        let (i, _) = self.leader().await?;
        devcluster::process::memory_mib(&self.pids.get(i)?.to_string(), "VmRSS")
    }

    /// User + system CPU seconds used so far by each controller, then by this process (the
    /// simulated agents).
    pub fn cpu_seconds(&self) -> Vec<f64> {
        self.pids.iter().map(|pid| cpu_seconds_of(&pid.to_string())).chain([cpu_seconds_of("self")]).collect()
    }
}

/// The whole machine's busy and total CPU ticks so far, summed over its CPUs (`/proc/stat`'s
/// first line; idle and iowait count as idle).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat.lines().next()?.strip_prefix("cpu ")?.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is inside user's).
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some((busy, busy + at(3) + at(4)))
}

/// How many of the machine's cores were busy, once a second while it lives, as (end of the
/// second, cores): whether the controllers and the simulator together wanted more than the
/// machine has when reports were slow.
pub struct MachineBusy {
    samples: Arc<Mutex<Vec<(Instant, f64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MachineBusy {
    pub fn start() -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let out = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last = machine_ticks();
            loop {
                tick.tick().await;
                let now = machine_ticks();
                if let (Some((b0, t0)), Some((b1, t1))) = (last, now) {
                    if t1 > t0 {
                        out.lock().unwrap().push((Instant::now(), b1.saturating_sub(b0) as f64 / (t1 - t0) as f64 * cores));
                    }
                }
                last = now;
            }
        });
        Self { samples, task }
    }

    pub fn samples(&self) -> Vec<(Instant, f64)> {
        self.samples.lock().unwrap().clone()
    }
}

impl Drop for MachineBusy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `seconds` field of the "snapshot installed" line in a controller's log (its fields
/// may be coloured: escape sequences are dropped first).
fn installed_seconds(log: &str) -> Option<f64> {
    let line = log.lines().find(|l| l.contains("snapshot installed"))?;
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain.split_whitespace().find_map(|w| w.strip_prefix("seconds="))?.parse().ok()
}

/// How a replaced controller caught up (`None`: not measured or did not happen).
#[derive(Clone, Debug, Default)]
pub struct CatchUp {
    /// The leader's snapshot on request: how long it took and its size.
    pub snapshot_build_s: Option<f64>,
    pub snapshot_mib: Option<f64>,
    /// From adding the empty controller to it having applied the leader's index then.
    pub catch_up_s: Option<f64>,
    /// Of which decoding and saving the snapshot on it (its log says).
    pub snapshot_install_s: Option<f64>,
}

/// One fleet size's results.
#[derive(Clone, Debug)]
pub struct Row {
    pub agents: usize,
    pub services: usize,
    pub registered_all_s: Option<f64>,
    pub agents_with_work: usize,
    pub apply_fanout_s: Option<f64>,
    /// Of which putting the Services took (in batches, as `gpuctl apply` sends them, from
    /// the first sent to the last acknowledged): the API's write rate under the run's load.
    pub apply_puts_s: f64,
    pub one_service: FanOut,
    pub replan_fanout_s: Option<f64>,
    pub replan_puts_s: f64,
    /// From the re-plan's puts until every agent's status showed the version it holds
    /// (statuses are written at `[loops] status_write_kib_per_s`).
    pub replan_statuses_s: Option<f64>,
    pub agents_changed_one_service: usize,
    pub agents_changed_replan: usize,
    pub provision_pass_s: Option<f64>,
    pub report_p50_ms: Option<f64>,
    pub report_p99_ms: Option<f64>,
    /// The same reports' p99 inside the controllers' handlers (a histogram bucket's upper
    /// bound): the rest of `report_p99_ms` is the wait for a core, in the controllers'
    /// runtimes, the kernel and this process, which share the machine's cores.
    pub report_handler_p99_ms: Option<f64>,
    /// Each controller's p99 wait for a worker of its API runtime (bucket upper bounds).
    pub runtime_lag_p99_ms: Vec<Option<f64>>,
    /// The oldest live node's report at the leader, the largest age over the run (a bucket's
    /// upper bound, [`report_age_max_s`]).
    pub report_age_max_s: Option<f64>,
    /// The same from when the agents' status writes after the apply were through to the
    /// end of the run: without the seconds in which the agents' first plan went out.
    pub report_age_max_after_apply_s: Option<f64>,
    pub reports: usize,
    /// Of those, the reports that carried the agent's GPUs (the others left them out).
    pub reports_with_gpus: u64,
    pub reports_failed: u64,
    pub leader_changes: u64,
    pub unhealthy_marked: u64,
    /// Agents killed at once, and seconds until each was marked unhealthy (p50, max).
    pub dead_hosts: usize,
    pub dead_host_detected_p50_s: Option<f64>,
    pub dead_host_detected_max_s: Option<f64>,
    /// As many others killed, the leader handed over at once: seconds until the last was
    /// marked.
    pub dead_host_at_leader_change_max_s: Option<f64>,
    /// Cores used by each controller over the run.
    pub controller_cpu: Vec<f64>,
    /// Cores used by this process (the simulated agents) over the run.
    pub simulator_cpu: f64,
    pub leader_rss_mib: Option<f64>,
    pub raft_bytes_one_service_change: Option<u64>,
    /// Seconds until the log stopped growing before the one-Service change and before the
    /// re-plan.
    pub settled_s: [f64; 2],
    /// A replaced controller (joined again with no data, the leader's log compacted).
    pub catch_up: CatchUp,
}

impl Row {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "agents": self.agents,
            "services": self.services,
            "registered_all_s": self.registered_all_s,
            "agents_with_work": self.agents_with_work,
            "apply_fanout_s": self.apply_fanout_s,
            "apply_puts_s": self.apply_puts_s,
            "one_service_fanout_p50_s": self.one_service.p50_s,
            "one_service_fanout_p99_s": self.one_service.p99_s,
            "one_service_fanout_max_s": self.one_service.last_s,
            "replan_fanout_s": self.replan_fanout_s,
            "replan_puts_s": self.replan_puts_s,
            "replan_statuses_s": self.replan_statuses_s,
            "agents_changed_one_service": self.agents_changed_one_service,
            "agents_changed_replan": self.agents_changed_replan,
            "provision_pass_s": self.provision_pass_s,
            "report_p50_ms": self.report_p50_ms,
            "report_p99_ms": self.report_p99_ms,
            "report_handler_p99_ms": self.report_handler_p99_ms,
            "runtime_lag_p99_ms": self.runtime_lag_p99_ms,
            "metrics_staleness_max_s": self.report_age_max_s,
            "metrics_staleness_after_apply_max_s": self.report_age_max_after_apply_s,
            "reports": self.reports,
            "reports_with_gpus": self.reports_with_gpus,
            "reports_failed": self.reports_failed,
            "leader_changes": self.leader_changes,
            "unhealthy_marked": self.unhealthy_marked,
            "dead_hosts": self.dead_hosts,
            "dead_host_detected_p50_s": self.dead_host_detected_p50_s,
            "dead_host_detected_max_s": self.dead_host_detected_max_s,
            "dead_host_at_leader_change_max_s": self.dead_host_at_leader_change_max_s,
            "controller_cpu_cores": self.controller_cpu,
            "simulator_cpu_cores": self.simulator_cpu,
            "leader_rss_mib": self.leader_rss_mib,
            "raft_bytes_one_service_change": self.raft_bytes_one_service_change,
            "settled_before_one_service_s": self.settled_s[0],
            "settled_before_replan_s": self.settled_s[1],
            "snapshot_build_s": self.catch_up.snapshot_build_s,
            "snapshot_mib": self.catch_up.snapshot_mib,
            "replaced_controller_catch_up_s": self.catch_up.catch_up_s,
            "snapshot_install_s": self.catch_up.snapshot_install_s,
        })
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |v| format!("{v:.digits$}"))
}

pub fn print_table(rows: &[Row]) {
    // Wide enough for the widest cell (controllers' and simulator's CPU), so that columns
    // never run into each other.
    const CELL: usize = 22;
    let header: Vec<String> = rows.iter().map(|r| format!("{} hosts", r.agents)).collect();
    println!("{:<44} {}", "", header.iter().map(|h| format!("{h:>CELL$}")).collect::<String>());
    let line = |name: &str, cells: Vec<String>| println!("{name:<44} {}", cells.iter().map(|c| format!("{c:>CELL$}")).collect::<String>());
    line("services", rows.iter().map(|r| r.services.to_string()).collect());
    line("all registered (s)", rows.iter().map(|r| opt(r.registered_all_s, 2)).collect());
    line("services applied → last agent has work (s)", rows.iter().map(|r| opt(r.apply_fanout_s, 2)).collect());
    line("  of which putting the services (s)", rows.iter().map(|r| format!("{:.2}", r.apply_puts_s)).collect());
    line("agents with work", rows.iter().map(|r| r.agents_with_work.to_string()).collect());
    line(
        "one service +25%: p50/p99/max (s)",
        rows.iter()
            .map(|r| format!("{}/{}/{}", opt(r.one_service.p50_s, 2), opt(r.one_service.p99_s, 2), opt(r.one_service.last_s, 2)))
            .collect(),
    );
    line("one service +25%: agents changed", rows.iter().map(|r| r.agents_changed_one_service.to_string()).collect());
    line(
        "one service +25%: Raft bytes (leader log)",
        rows.iter().map(|r| r.raft_bytes_one_service_change.map_or("—".into(), |b| b.to_string())).collect(),
    );
    line("all services +10% → last agent (s)", rows.iter().map(|r| opt(r.replan_fanout_s, 2)).collect());
    line("  of which putting the services (s)", rows.iter().map(|r| format!("{:.2}", r.replan_puts_s)).collect());
    line("all services +10%: agents changed", rows.iter().map(|r| r.agents_changed_replan.to_string()).collect());
    line("  … every agent's status written (s)", rows.iter().map(|r| opt(r.replan_statuses_s, 2)).collect());
    line("provisioning pass that planned, mean (s)", rows.iter().map(|r| opt(r.provision_pass_s, 3)).collect());
    line("reports p50/p99 (ms)", rows.iter().map(|r| format!("{}/{}", opt(r.report_p50_ms, 1), opt(r.report_p99_ms, 1))).collect());
    line("  p99 in the controllers' handlers (ms, ≤)", rows.iter().map(|r| opt(r.report_handler_p99_ms, 1)).collect());
    line(
        "  controllers' runtime wake-up lag p99 (ms, ≤)",
        rows.iter().map(|r| r.runtime_lag_p99_ms.iter().map(|v| opt(*v, 1)).collect::<Vec<_>>().join("/")).collect(),
    );
    line("oldest live node's report, max age (s, ≤)", rows.iter().map(|r| opt(r.report_age_max_s, 1)).collect());
    line("  … after the apply settled (s, ≤)", rows.iter().map(|r| opt(r.report_age_max_after_apply_s, 1)).collect());
    line("reports sent/failed", rows.iter().map(|r| format!("{}/{}", r.reports, r.reports_failed)).collect());
    line("  of which carried the agent's GPUs", rows.iter().map(|r| r.reports_with_gpus.to_string()).collect());
    line("leader changes", rows.iter().map(|r| r.leader_changes.to_string()).collect());
    line("healthy nodes marked unhealthy", rows.iter().map(|r| r.unhealthy_marked.to_string()).collect());
    line(
        "hosts killed: marked unhealthy p50/max (s)",
        rows.iter()
            .map(|r| format!("{}: {}/{}", r.dead_hosts, opt(r.dead_host_detected_p50_s, 1), opt(r.dead_host_detected_max_s, 1)))
            .collect(),
    );
    line("… with a leader change at once: max (s)", rows.iter().map(|r| opt(r.dead_host_at_leader_change_max_s, 1)).collect());
    line(
        "CPU (cores): controllers; agents' simulator",
        rows.iter()
            .map(|r| {
                format!("{}; {:.2}", r.controller_cpu.iter().map(|c| format!("{c:.2}")).collect::<Vec<_>>().join("/"), r.simulator_cpu)
            })
            .collect(),
    );
    line("leader RSS (MiB)", rows.iter().map(|r| opt(r.leader_rss_mib, 0)).collect());
    line(
        "leader's snapshot on request: MiB, built (s)",
        rows.iter().map(|r| format!("{}, {}", opt(r.catch_up.snapshot_mib, 0), opt(r.catch_up.snapshot_build_s, 1))).collect(),
    );
    line(
        "controller replaced: caught up (installing) s",
        rows.iter()
            .map(|r| match r.catch_up.snapshot_install_s {
                Some(s) => format!("{} ({s:.1})", opt(r.catch_up.catch_up_s, 1)),
                None => format!("{} (log)", opt(r.catch_up.catch_up_s, 1)),
            })
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_controllers_runtime_lag_p99_is_read_from_its_own_page() {
        let page = |name: &str, counts: [u32; 3]| {
            format!(
                "# TYPE {name} histogram\n{name}_bucket{{le=\"0.0001\"}} {}\n{name}_bucket{{le=\"0.0002\"}} {}\n{name}_bucket{{le=\"+Inf\"}} {}\n",
                counts[0], counts[1], counts[2]
            )
        };
        let lag = "gpuplane_runtime_wake_lag_seconds";
        let texts = [Some(page(lag, [100, 100, 100])), None, Some(page(lag, [0, 98, 100]))];
        assert_eq!(super::runtime_lag_p99_ms(&texts), [Some(0.1), None, Some(f64::INFINITY)]);
        let handler = "gpuplane_agent_report_duration_seconds";
        let texts = [Some(page(handler, [0, 99, 100])), None, Some(page(handler, [0, 100, 100]))];
        assert_eq!(super::report_handler_p99_ms(&texts), Some(0.2), "the controllers' histograms summed");
        assert_eq!(super::report_handler_p99_ms(&[None, None]), None);
        let age = "gpuplane_agent_report_age_max_seconds";
        let texts = [Some(page(age, [0, 0, 0])), None, Some(page(age, [3, 4, 4]))];
        assert_eq!(super::report_age_max_s(&texts), Some(0.0002), "the largest observation's bucket");
        // Between two scrapes: only what was observed after the first counts.
        let before = [Some(page(age, [0, 0, 0])), None, Some(page(age, [3, 4, 4]))];
        let after = [Some(page(age, [0, 0, 0])), None, Some(page(age, [9, 11, 11]))];
        assert_eq!(super::report_age_max_between(&before, &after), Some(0.0002));
        let after = [Some(page(age, [0, 0, 0])), None, Some(page(age, [9, 10, 10]))];
        assert_eq!(super::report_age_max_between(&before, &after), Some(0.0001), "the later observations all in the first bucket");
        assert_eq!(super::report_age_max_between(&before, &before), None, "none since");
    }

    #[test]
    fn the_install_time_is_read_from_a_coloured_log_line() {
        let line = "2026-11-24T15:02:15Z \u{1b}[32m INFO\u{1b}[0m snapshot installed \u{1b}[3mbytes\u{1b}[0m\u{1b}[2m=\u{1b}[0m76623057 \u{1b}[3mseconds\u{1b}[0m\u{1b}[2m=\u{1b}[0m2.98 \u{1b}[3msnapshot\u{1b}[0m\u{1b}[2m=\u{1b}[0mT1";
        assert_eq!(super::installed_seconds(&format!("other\n{line}\n")), Some(2.98));
        assert_eq!(super::installed_seconds("snapshot installed bytes=1 seconds=0.5"), Some(0.5));
        assert_eq!(super::installed_seconds("snapshot built seconds=3"), None);
    }
}
