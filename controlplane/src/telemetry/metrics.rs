//! The controller's series. Event figures (proposal latency, loop passes) are recorded as
//! they happen; state figures (Raft indexes, plan cost, agents' reports) are set from a
//! [`Snapshot`] taken at scrape time, so rendering is pure and testable without IO.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type FloatGauge = Gauge<f64, AtomicU64>;
use telemetry_http::{labels, Labels};
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// One node's Raft figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RaftFigures {
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub log_appended_bytes: u64,
    pub is_leader: bool,
    pub leader: Option<u64>,
}

/// One service's latest per-second window on one node, from that node's agent report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceSample {
    pub service: String,
    pub node: String,
    pub p99_ms: f64,
    pub throughput_rps: f64,
    pub arrival_rps: f64,
    pub failed: u64,
    /// What the service's servers on the node counted themselves, when they export it.
    pub server: Option<proto::ServerReading>,
}

/// The state figures of one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub raft: RaftFigures,
    /// Whole-GPU cost per hour of the committed Plan `current`; `None` before there is one.
    pub plan_cost_per_hour: Option<f64>,
    /// From the agents' reports: only the leader receives them.
    pub services: Vec<ServiceSample>,
    /// Each Tenant's usage as the leader last metered it (`metering`).
    pub tenants: Vec<(String, crate::resources::TenantStatus)>,
}

/// The registry and its series; cheap to clone (shared).
#[derive(Clone)]
pub struct ControllerMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    term: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    last_log_index: Gauge,
    log_appended_bytes: Gauge,
    is_leader: Gauge,
    planning_seconds: Histogram,
    proposal_seconds: Histogram,
    report_seconds: Histogram,
    runtime_lag_seconds: Histogram,
    report_age_max_seconds: Histogram,
    status_pace_wait_seconds: Histogram,
    proposals: Family<Labels, Counter>,
    loop_pass_seconds: HistogramFamily,
    loop_failures: Family<Labels, Counter>,
    reports_refused: Family<Labels, Counter>,
    gpu_claims_refused: Counter,
    /// Failed passes in a row per loop (0 after a good pass), for `/readyz`.
    loop_failure_streaks: Mutex<std::collections::BTreeMap<&'static str, u32>>,
    plan_cost: FloatGauge,
    service_p99_ms: Family<Labels, FloatGauge>,
    service_throughput: Family<Labels, FloatGauge>,
    service_arrival: Family<Labels, FloatGauge>,
    service_failed: Family<Labels, Gauge>,
    /// What the servers behind a service's router counted (`proto::ServerReading`).
    server_success: Family<Labels, FloatGauge>,
    server_failure: Family<Labels, FloatGauge>,
    server_queue_ms: Family<Labels, FloatGauge>,
    server_compute_ms: Family<Labels, FloatGauge>,
    tenant_gpus: Family<Labels, FloatGauge>,
    tenant_cost: Family<Labels, FloatGauge>,
    service_gpus: Family<Labels, FloatGauge>,
    service_cost: Family<Labels, FloatGauge>,
    slo_windows: Family<Labels, Counter>,
    slo_windows_met: Family<Labels, Counter>,
    /// Open connections per listener (`api`, `peer`).
    connections: Family<Labels, Gauge>,
    connections_refused: Family<Labels, Counter>,
    connections_closed: Family<Labels, Counter>,
    accept_errors: Family<Labels, Counter>,
    watch_streams: Gauge,
    watches_refused: Counter,
    watches_cut_off: Counter,
    /// Setting the state figures and encoding them is one step: two scrapes never mix.
    render: Mutex<()>,
}

fn seconds_buckets() -> Histogram {
    // 0.5 ms .. ~16 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("gpuplane");
        let inner = Inner {
            term: Gauge::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            last_log_index: Gauge::default(),
            log_appended_bytes: Gauge::default(),
            is_leader: Gauge::default(),
            planning_seconds: seconds_buckets(),
            proposal_seconds: seconds_buckets(),
            // From 0.1 ms: most reports are answered in well under the 0.5 ms of the others.
            report_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            runtime_lag_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            // Around the paced report interval (4 s at 10,000 hosts) and its multiples, in
            // half seconds near it: an interval's worth plus a report's delay lands in 4.5.
            report_age_max_seconds: Histogram::new([0.5, 1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 15.0, 30.0, 60.0, 120.0]),
            status_pace_wait_seconds: seconds_buckets(),
            proposals: Family::default(),
            loop_pass_seconds: Family::new_with_constructor(seconds_buckets),
            loop_failures: Family::default(),
            reports_refused: Family::default(),
            gpu_claims_refused: Counter::default(),
            loop_failure_streaks: Mutex::default(),
            plan_cost: FloatGauge::default(),
            service_p99_ms: Family::default(),
            service_throughput: Family::default(),
            service_arrival: Family::default(),
            service_failed: Family::default(),
            server_success: Family::default(),
            server_failure: Family::default(),
            server_queue_ms: Family::default(),
            server_compute_ms: Family::default(),
            tenant_gpus: Family::default(),
            tenant_cost: Family::default(),
            service_gpus: Family::default(),
            service_cost: Family::default(),
            slo_windows: Family::default(),
            slo_windows_met: Family::default(),
            connections: Family::default(),
            connections_refused: Family::default(),
            connections_closed: Family::default(),
            accept_errors: Family::default(),
            watch_streams: Gauge::default(),
            watches_refused: Counter::default(),
            watches_cut_off: Counter::default(),
            render: Mutex::new(()),
            registry: Registry::default(),
        };
        r.register("raft_term", "Current Raft term of this node", inner.term.clone());
        r.register("raft_commit_index", "Highest log index this node knows to be committed", inner.commit_index.clone());
        r.register("raft_applied_index", "Highest log index applied to this node's state machine", inner.applied_index.clone());
        r.register("raft_last_log_index", "Last index in this node's Raft log", inner.last_log_index.clone());
        r.register(
            "raft_log_appended_bytes",
            "Bytes of entries appended to this node's Raft log since it started (each is also sent to each follower once)",
            inner.log_appended_bytes.clone(),
        );
        r.register(
            "provision_planning_duration_seconds",
            "Provisioning passes that planned (inputs changed): the strategies and the placement on the fleet, off the async workers",
            inner.planning_seconds.clone(),
        );
        r.register("raft_is_leader", "1 while this node leads the cluster", inner.is_leader.clone());
        r.register(
            "raft_proposal_duration_seconds",
            "Client writes proposed by this node (leader): time from proposal to applied result",
            inner.proposal_seconds.clone(),
        );
        r.register(
            "agent_report_duration_seconds",
            "Agent reports answered by this controller: time in the handler, from the decoded request to the answer (the checks, the state read, the hand-off to the relay or the status writer)",
            inner.report_seconds.clone(),
        );
        r.register(
            "runtime_wake_lag_seconds",
            "How late a task of the runtime serving the API woke from a 10 ms timer, sampled every 10 ms: how long a request that arrives waits for a worker (agents' reports included) before its handler runs",
            inner.runtime_lag_seconds.clone(),
        );
        r.register(
            "agent_report_age_max_seconds",
            "Once a second on the leader (the failure detector's pass): how long ago the live node heard of least recently reported, the age of the oldest metrics the loops read (nodes marked unhealthy, or whose agent's stream ended, are not live)",
            inner.report_age_max_seconds.clone(),
        );
        r.register(
            "status_pace_wait_seconds",
            "How long each of the leader's status entries (agents' observed states) waited for the status pace ([loops] status_write_kib_per_s) before it was proposed",
            inner.status_pace_wait_seconds.clone(),
        );
        r.register(
            "raft_proposals",
            "Client writes proposed by this node, by result (ok, refused by the state machine, failed)",
            inner.proposals.clone(),
        );
        r.register(
            "loop_pass_duration_seconds",
            "Duration of one pass of a leader-only loop (provisioner, tuner, autoscaler)",
            inner.loop_pass_seconds.clone(),
        );
        r.register(
            "loop_failures",
            "Passes of a leader-only loop that failed (an error or a panic caught); the next tick retries",
            inner.loop_failures.clone(),
        );
        r.register(
            "agent_reports_refused",
            "Agent reports refused: for what is not the node's (not_the_nodes) or malformed and out of bounds (invalid)",
            inner.reports_refused.clone(),
        );
        r.register(
            "gpu_claims_refused",
            "Node writes refused at this controller because they list a GPU uuid another Node registered",
            inner.gpu_claims_refused.clone(),
        );
        r.register("plan_cost_per_hour", "Whole-GPU cost per hour of the committed plan", inner.plan_cost.clone());
        r.register("service_p99_ms", "p99 latency of a service's latest window on a node (leader only)", inner.service_p99_ms.clone());
        r.register(
            "service_throughput_rps",
            "Completed requests per second of a service's latest window on a node (leader only)",
            inner.service_throughput.clone(),
        );
        r.register(
            "service_arrival_rps",
            "Arrived requests per second of a service's latest window on a node (leader only)",
            inner.service_arrival.clone(),
        );
        r.register("service_failed", "Failed requests in a service's latest window on a node (leader only)", inner.service_failed.clone());
        for (name, help, family) in [
            (
                "service_server_success_rps",
                "Requests per second a service's inference servers on a node counted as succeeded, from their metrics pages (leader only)",
                &inner.server_success,
            ),
            (
                "service_server_failure_rps",
                "Requests per second a service's inference servers on a node counted as failed (leader only)",
                &inner.server_failure,
            ),
            (
                "service_server_queue_ms",
                "Mean time a request waited in the queue inside a service's inference servers on a node, ms (0: not exported; leader only)",
                &inner.server_queue_ms,
            ),
            (
                "service_server_compute_ms",
                "Mean time a request computed inside a service's inference servers on a node, ms (0: not exported; leader only)",
                &inner.server_compute_ms,
            ),
        ] {
            r.register(name, help, family.clone());
        }
        r.register(
            "tenant_gpus",
            "GPUs-worth the committed plan gives a tenant (MIG instance GPCs/7 plus MPS shares with the shadows' reserve)",
            inner.tenant_gpus.clone(),
        );
        r.register(
            "tenant_cost_per_hour",
            "Cost per hour of what the committed plan gives a tenant (its GPUs-worth at each GPU model's price per GPU, as its quota counts)",
            inner.tenant_cost.clone(),
        );
        r.register(
            "service_gpus",
            "GPUs-worth the committed plan gives a service, as its tenant's (leader only, set by the metering loop)",
            inner.service_gpus.clone(),
        );
        r.register(
            "service_cost_per_hour",
            "Cost per hour of what the committed plan gives a service, as its tenant's (leader only, set by the metering loop)",
            inner.service_cost.clone(),
        );
        r.register(
            "slo_windows",
            "Metrics windows of a service the leader received in agents' reports (with traffic, of services placed on the reporting node)",
            inner.slo_windows.clone(),
        );
        r.register(
            "slo_windows_met",
            "Of those windows, the ones whose p99 met the service's SLO without a failed request",
            inner.slo_windows_met.clone(),
        );
        r.register(
            "connections",
            "Connections open on a listener of this controller (api, peer), handshakes in progress included",
            inner.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed as soon as they were accepted: past [limits] connections_per_ip of one client address (per_ip), or past max_connections (max_connections)",
            inner.connections_refused.clone(),
        );
        r.register(
            "connections_closed",
            "Connections closed by this controller: no TLS handshake and first request within [limits] handshake_timeout_ms (handshake_timeout), or no request in flight for idle_timeout_ms (idle)",
            inner.connections_closed.clone(),
        );
        r.register(
            "accept_errors",
            "Failed accepts on a listener other than a connection that was gone already (e.g. EMFILE: out of open files); the listener retries after a pause and /readyz answers 503 meanwhile",
            inner.accept_errors.clone(),
        );
        r.register("watch_streams", "Watch streams open on this controller", inner.watch_streams.clone());
        r.register(
            "watches_refused",
            "Watch requests refused because their principal had [limits] watches_per_principal streams open on this controller",
            inner.watches_refused.clone(),
        );
        r.register(
            "watches_cut_off",
            "Watch streams ended with Aborted because they fell behind ([limits] watch_queue_events / watch_queue_kib, or too many changes while the state was being sent)",
            inner.watches_cut_off.clone(),
        );
        ControllerMetrics { inner: Arc::new(Inner { registry: r, ..inner }) }
    }
}

/// Observes the pass duration when dropped (see [`ControllerMetrics::time_loop_pass`]).
pub struct LoopPassTimer {
    metrics: ControllerMetrics,
    name: &'static str,
    started: std::time::Instant,
}

impl Drop for LoopPassTimer {
    fn drop(&mut self) {
        self.metrics.observe_loop_pass(self.name, self.started.elapsed());
    }
}

impl ControllerMetrics {
    /// The gauge of open connections on `listener` (shared: the listener moves it).
    pub fn open_connections(&self, listener: &str) -> Gauge {
        self.inner.connections.get_or_create(&labels(&[("listener", listener)])).clone()
    }

    /// A connection closed at accept; `reason` is `per_ip` or `max_connections`.
    pub fn observe_connection_refused(&self, listener: &str, reason: &str) {
        self.inner.connections_refused.get_or_create(&labels(&[("listener", listener), ("reason", reason)])).inc();
    }

    /// A connection closed by its deadline; `reason` is `handshake_timeout` or `idle`.
    pub fn observe_connection_closed(&self, listener: &str, reason: &str) {
        self.inner.connections_closed.get_or_create(&labels(&[("listener", listener), ("reason", reason)])).inc();
    }

    pub fn observe_accept_error(&self, listener: &str) {
        self.inner.accept_errors.get_or_create(&labels(&[("listener", listener)])).inc();
    }

    /// The gauge of open Watch streams (shared: each stream's slot moves it).
    pub fn watch_streams(&self) -> Gauge {
        self.inner.watch_streams.clone()
    }

    pub fn observe_watch_refused(&self) {
        self.inner.watches_refused.inc();
    }

    pub fn observe_watch_cut_off(&self) {
        self.inner.watches_cut_off.inc();
    }

    /// Records one proposal; `result` is `ok`, `refused` or `failed`.
    pub fn observe_proposal(&self, elapsed: Duration, result: &str) {
        self.inner.proposal_seconds.observe(elapsed.as_secs_f64());
        self.inner.proposals.get_or_create(&labels(&[("result", result)])).inc();
    }

    /// Records one provisioning pass that planned.
    pub fn observe_planning(&self, elapsed: Duration) {
        self.inner.planning_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records one pass of the leader-only loop `name`.
    pub fn observe_loop_pass(&self, name: &str, elapsed: Duration) {
        self.inner.loop_pass_seconds.get_or_create(&labels(&[("loop", name)])).observe(elapsed.as_secs_f64());
    }

    /// Records the outcome of one pass of the loop `name`: a failure is counted, and a run
    /// of them is what `/readyz` reports (see [`Self::failing_loops`]).
    pub fn observe_loop_outcome(&self, name: &'static str, failed: bool) {
        let mut streaks = self.inner.loop_failure_streaks.lock().unwrap_or_else(|p| p.into_inner());
        if failed {
            self.inner.loop_failures.get_or_create(&labels(&[("loop", name)])).inc();
            *streaks.entry(name).or_default() += 1;
        } else {
            streaks.remove(name);
        }
    }

    /// Records the time one agent report spent in its handler, answered or refused.
    pub fn observe_report(&self, elapsed: Duration) {
        self.inner.report_seconds.observe(elapsed.as_secs_f64());
    }

    pub fn observe_status_pace_wait(&self, waited: Duration) {
        self.inner.status_pace_wait_seconds.observe(waited.as_secs_f64());
    }

    /// Records the age of the oldest live node's last report (see
    /// `loops::failure_detector::oldest_live_report`).
    pub fn observe_report_age_max(&self, age: Duration) {
        self.inner.report_age_max_seconds.observe(age.as_secs_f64());
    }

    /// Records how late a task of the API's runtime woke (see `telemetry::probe_runtime_lag`).
    pub fn observe_runtime_lag(&self, late: Duration) {
        self.inner.runtime_lag_seconds.observe(late.as_secs_f64());
    }

    /// A report's window of `service` of `tenant`, met or not (leader only).
    pub fn observe_slo_window(&self, tenant: &str, service: &str, met: bool) {
        let l = labels(&[("tenant", tenant), ("service", service)]);
        self.inner.slo_windows.get_or_create(&l).inc();
        if met {
            self.inner.slo_windows_met.get_or_create(&l).inc();
        }
    }

    /// Counts an agent report refused for `reason` (see `agents::report_check`).
    pub fn observe_gpu_claim_refused(&self) {
        self.inner.gpu_claims_refused.inc();
    }

    pub fn observe_report_refused(&self, reason: &str) {
        self.inner.reports_refused.get_or_create(&labels(&[("reason", reason)])).inc();
    }

    /// What the committed plan gives each (tenant, service), as the leader's metering last
    /// found it; empty when this controller stops leading.
    pub fn set_service_usage(&self, usage: &std::collections::BTreeMap<(String, String), crate::metering::Occupied>) {
        let i = &self.inner;
        let _guard = i.render.lock().unwrap_or_else(|p| p.into_inner());
        i.service_gpus.clear();
        i.service_cost.clear();
        for ((tenant, service), used) in usage {
            let l = labels(&[("tenant", tenant), ("service", service)]);
            i.service_gpus.get_or_create(&l).set(used.gpus);
            i.service_cost.get_or_create(&l).set(used.cost_per_hour);
        }
    }

    /// Forgets every loop's failure streak (the loops stopped: leadership moved).
    pub fn reset_loop_outcomes(&self) {
        self.inner.loop_failure_streaks.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Loops whose last `at_least` passes or more all failed, with the length of the run.
    pub fn failing_loops(&self, at_least: u32) -> Vec<(&'static str, u32)> {
        let streaks = self.inner.loop_failure_streaks.lock().unwrap_or_else(|p| p.into_inner());
        streaks.iter().filter(|(_, &n)| n >= at_least).map(|(&name, &n)| (name, n)).collect()
    }

    /// Times a pass of the loop `name` until the returned guard drops; for loops whose
    /// passes end at several `continue`s.
    pub fn time_loop_pass(&self, name: &'static str) -> LoopPassTimer {
        LoopPassTimer { metrics: self.clone(), name, started: std::time::Instant::now() }
    }

    /// The exposition text with the state figures of `snap`.
    pub fn render(&self, snap: &Snapshot) -> String {
        let i = &self.inner;
        let _guard = i.render.lock().unwrap_or_else(|p| p.into_inner());
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        i.term.set(as_i64(snap.raft.term));
        i.commit_index.set(as_i64(snap.raft.commit_index));
        i.applied_index.set(as_i64(snap.raft.applied_index));
        i.last_log_index.set(as_i64(snap.raft.last_log_index));
        i.log_appended_bytes.set(as_i64(snap.raft.log_appended_bytes));
        i.is_leader.set(i64::from(snap.raft.is_leader));
        i.plan_cost.set(snap.plan_cost_per_hour.unwrap_or(0.0));
        // Only the services of this scrape: a node or service that stopped reporting goes.
        for f in [
            &i.service_p99_ms,
            &i.service_throughput,
            &i.service_arrival,
            &i.server_success,
            &i.server_failure,
            &i.server_queue_ms,
            &i.server_compute_ms,
        ] {
            f.clear();
        }
        i.service_failed.clear();
        for s in &snap.services {
            let l = labels(&[("service", &s.service), ("node", &s.node)]);
            i.service_p99_ms.get_or_create(&l).set(s.p99_ms);
            i.service_throughput.get_or_create(&l).set(s.throughput_rps);
            i.service_arrival.get_or_create(&l).set(s.arrival_rps);
            i.service_failed.get_or_create(&l).set(as_i64(s.failed));
            if let Some(server) = &s.server {
                i.server_success.get_or_create(&l).set(server.success_rps);
                i.server_failure.get_or_create(&l).set(server.failure_rps);
                i.server_queue_ms.get_or_create(&l).set(server.mean_queue_ms);
                i.server_compute_ms.get_or_create(&l).set(server.mean_compute_ms);
            }
        }
        i.tenant_gpus.clear();
        i.tenant_cost.clear();
        for (tenant, used) in &snap.tenants {
            let l = labels(&[("tenant", tenant)]);
            i.tenant_gpus.get_or_create(&l).set(used.gpus);
            i.tenant_cost.get_or_create(&l).set(used.cost_per_hour);
        }
        let mut out = String::new();
        encode(&mut out, &i.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn renders_raft_figures_plan_cost_and_per_service_series() {
        let m = ControllerMetrics::default();
        m.observe_proposal(Duration::from_millis(3), "ok");
        m.observe_proposal(Duration::from_millis(4), "refused");
        m.observe_loop_pass("provisioner", Duration::from_millis(20));
        m.observe_status_pace_wait(Duration::from_millis(250));
        let snap = Snapshot {
            raft: RaftFigures {
                term: 3,
                commit_index: 41,
                applied_index: 40,
                last_log_index: 42,
                log_appended_bytes: 4096,
                is_leader: true,
                leader: Some(1),
            },
            plan_cost_per_hour: Some(10.24),
            services: vec![ServiceSample {
                service: "chat".into(),
                node: "gpu-1".into(),
                p99_ms: 12.5,
                throughput_rps: 99.0,
                arrival_rps: 100.0,
                failed: 1,
                server: Some(proto::ServerReading { success_rps: 98.0, mean_queue_ms: 1.5, mean_compute_ms: 9.0, ..Default::default() }),
            }],
            tenants: vec![("acme".into(), crate::resources::TenantStatus { gpus: 0.5, cost_per_hour: 2.25, ..Default::default() })],
        };
        let text = m.render(&snap);
        assert_eq!(value(&text, "gpuplane_raft_term"), Some(3.0), "{text}");
        assert_eq!(value(&text, "gpuplane_raft_commit_index"), Some(41.0));
        assert_eq!(value(&text, "gpuplane_raft_applied_index"), Some(40.0));
        assert_eq!(value(&text, "gpuplane_raft_last_log_index"), Some(42.0));
        assert_eq!(value(&text, "gpuplane_raft_log_appended_bytes"), Some(4096.0));
        assert_eq!(value(&text, "gpuplane_raft_is_leader"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_plan_cost_per_hour"), Some(10.24));
        assert_eq!(value(&text, "gpuplane_raft_proposal_duration_seconds_count"), Some(2.0));
        assert_eq!(value(&text, "gpuplane_status_pace_wait_seconds_count"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_status_pace_wait_seconds_sum"), Some(0.25));
        assert_eq!(value(&text, "gpuplane_raft_proposals_total{result=\"refused\"}"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_loop_pass_duration_seconds_count{loop=\"provisioner\"}"), Some(1.0));
        assert!(!text.contains("loop=\"autoscaler\""), "no autoscaler pass yet: {text}");
        drop(m.time_loop_pass("autoscaler"));
        let text = m.render(&snap);
        assert_eq!(value(&text, "gpuplane_loop_pass_duration_seconds_count{loop=\"autoscaler\"}"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_service_p99_ms{service=\"chat\",node=\"gpu-1\"}"), Some(12.5));
        assert_eq!(value(&text, "gpuplane_service_arrival_rps{service=\"chat\",node=\"gpu-1\"}"), Some(100.0));
        assert_eq!(value(&text, "gpuplane_service_failed{service=\"chat\",node=\"gpu-1\"}"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_service_server_success_rps{service=\"chat\",node=\"gpu-1\"}"), Some(98.0));
        assert_eq!(value(&text, "gpuplane_service_server_queue_ms{service=\"chat\",node=\"gpu-1\"}"), Some(1.5));
        assert_eq!(value(&text, "gpuplane_service_server_compute_ms{service=\"chat\",node=\"gpu-1\"}"), Some(9.0));
        assert_eq!(value(&text, "gpuplane_tenant_gpus{tenant=\"acme\"}"), Some(0.5));
        assert_eq!(value(&text, "gpuplane_tenant_cost_per_hour{tenant=\"acme\"}"), Some(2.25));
        m.observe_slo_window("acme", "chat", true);
        m.observe_slo_window("acme", "chat", false);
        let text = m.render(&snap);
        assert_eq!(value(&text, "gpuplane_slo_windows_total{tenant=\"acme\",service=\"chat\"}"), Some(2.0), "{text}");
        assert_eq!(value(&text, "gpuplane_slo_windows_met_total{tenant=\"acme\",service=\"chat\"}"), Some(1.0));

        // The metering sets each service's usage, and clears it when this node stops leading.
        let usage = [(
            ("acme".to_string(), "chat".to_string()),
            crate::metering::Occupied { gpus: 0.25, cost_per_hour: 1.75, ..Default::default() },
        )];
        m.set_service_usage(&usage.into_iter().collect());
        let text = m.render(&snap);
        assert_eq!(value(&text, "gpuplane_service_gpus{tenant=\"acme\",service=\"chat\"}"), Some(0.25), "{text}");
        assert_eq!(value(&text, "gpuplane_service_cost_per_hour{tenant=\"acme\",service=\"chat\"}"), Some(1.75));
        m.set_service_usage(&Default::default());
        assert!(!m.render(&snap).contains("gpuplane_service_gpus{"));

        // A node that stopped reporting leaves the per-service series.
        let text = m.render(&Snapshot { services: vec![], ..snap });
        assert!(!text.contains("gpuplane_service_p99_ms{"), "{text}");
        assert_eq!(value(&text, "gpuplane_raft_proposals_total{result=\"ok\"}"), Some(1.0));
    }
}
