//! The agent's series: per service its router's latest window, shadow switches, processes
//! by role, and per GPU its MIG instances, the MPS share of each workload on them and the
//! time each workload kept its instance busy. State figures are set from an
//! [`AgentSnapshot`] at scrape time: rendering is pure.
//!
//! Utilisation per MIG instance. NVML reports no utilisation for a MIG device (only for a
//! whole GPU; per-instance activity needs DCGM's profiling counters), and the simulated GPUs
//! have none, so the agent measures what it can see on every backend: the time during which
//! its router had at least one request in flight on a workload's processes
//! (`gpuplane_agent_busy_seconds_total`). Its `rate()` is the instance's busy fraction, the
//! serving-side counterpart of NVML's utilisation (the share of time a kernel ran); it
//! counts queueing and transfer inside the server too, so it reads high, never low.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type FloatGauge = Gauge<f64, AtomicU64>;
use telemetry_http::{labels, Labels};

/// The state figures of one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentSnapshot {
    /// The routers' latest windows.
    pub services: Vec<proto::ServiceMetrics>,
    /// The last observed state the agent built (GPUs, MIG instances, processes).
    pub observed: Option<proto::ReportRequest>,
    /// Busy time of each routed process, by process id.
    pub busy: BTreeMap<String, Duration>,
    /// Each service's router's counters.
    pub routers: BTreeMap<String, crate::router::RouterCounts>,
}

/// The registry and its series; cheap to clone (shared).
#[derive(Clone)]
pub struct AgentMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    shadow_switches: Family<Labels, Counter>,
    service_p99_ms: Family<Labels, FloatGauge>,
    service_throughput: Family<Labels, FloatGauge>,
    service_arrival: Family<Labels, FloatGauge>,
    service_failed: Family<Labels, Gauge>,
    processes: Family<Labels, Gauge>,
    mig_instances: Family<Labels, Gauge>,
    workload_share: Family<Labels, FloatGauge>,
    busy_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    applied_version: Gauge,
    controller_connections: Counter,
    reports_answered: Counter,
    cold_starts: Family<Labels, Histogram>,
    server_pages: Family<Labels, Counter>,
    model_loads: Family<Labels, Counter>,
    router_resends: Family<Labels, Counter>,
    router_connections_refused: Family<Labels, Counter>,
    /// Per service, the newest cold start since the last report took them.
    recent_cold_starts: Mutex<BTreeMap<String, f64>>,
    render: Mutex<()>,
}

/// Cold starts, s: a simulated server is ready in milliseconds, Triton loading a model in
/// seconds, an LLM server in one or two minutes.
const COLD_START_BUCKETS: [f64; 12] = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0];

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut root = Registry::with_prefix("gpuplane");
        let cold_starts = Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(COLD_START_BUCKETS));
        root.register(
            "workload_cold_start_seconds",
            "Launch-to-ready time of a workload process (its server answered ModelReady), by service and ServingRuntime (host: the host's template)",
            cold_starts.clone(),
        );
        let r = root.sub_registry_with_prefix("agent");
        let shadow_switches = Family::<Labels, Counter>::default();
        let service_p99_ms = Family::<Labels, FloatGauge>::default();
        let service_throughput = Family::<Labels, FloatGauge>::default();
        let service_arrival = Family::<Labels, FloatGauge>::default();
        let service_failed = Family::<Labels, Gauge>::default();
        let processes = Family::<Labels, Gauge>::default();
        let mig_instances = Family::<Labels, Gauge>::default();
        let workload_share = Family::<Labels, FloatGauge>::default();
        let busy_seconds = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let applied_version = Gauge::default();
        let controller_connections = Counter::default();
        let reports_answered = Counter::default();
        let server_pages = Family::<Labels, Counter>::default();
        let model_loads = Family::<Labels, Counter>::default();
        let router_resends = Family::<Labels, Counter>::default();
        let router_connections_refused = Family::<Labels, Counter>::default();
        r.register("shadow_switches", "Switches of a service to its warm standbys (failovers)", shadow_switches.clone());
        r.register("service_p99_ms", "p99 latency of the service router's latest one-second window", service_p99_ms.clone());
        r.register("service_throughput_rps", "Completed requests per second in the router's latest window", service_throughput.clone());
        r.register("service_arrival_rps", "Arrived requests per second in the router's latest window", service_arrival.clone());
        r.register("service_failed", "Failed requests in the router's latest window", service_failed.clone());
        r.register("processes", "Workload processes running, by role (active, standby)", processes.clone());
        r.register("mig_instances", "MIG instances on a GPU (0: whole GPU)", mig_instances.clone());
        r.register(
            "workload_mps_percent",
            "MPS share of a workload's process on its MIG instance (-1: whole GPU), by role",
            workload_share.clone(),
        );
        r.register(
            "busy_seconds",
            "Seconds with at least one request in flight on a workload's processes on its MIG instance (-1: whole GPU); rate() is the instance's busy fraction",
            busy_seconds.clone(),
        );
        r.register("applied_version", "Desired-state version this node has converged to (0: none)", applied_version.clone());
        r.register(
            "controller_connections",
            "Controller connections opened (one per controller address, shared by the desired-state stream and the reports; reconnections after a failure are not counted)",
            controller_connections.clone(),
        );
        r.register("reports_answered", "Reports a controller answered", reports_answered.clone());
        r.register(
            "server_pages",
            "Metrics pages of a service's inference servers the agent read, by outcome: read (believed), unreachable (no answer, an error status or over the size bound in time) or refused (malformed)",
            server_pages.clone(),
        );
        r.register(
            "model_loads",
            "Loads of a service's model the agent asked its servers for through the repository API (a runtime with model_control = repository), by outcome: loaded, or refused (the server answered an error; tried again with back-off)",
            model_loads.clone(),
        );
        r.register(
            "router_resends",
            "Requests a service's router sent again to another backend after one failed under them (its process died, hung or answered garbage); each is a failure its callers did not see",
            router_resends.clone(),
        );
        r.register(
            "router_connections_refused",
            "Connections a service's router endpoint closed as it accepted them, holding MAX_ROUTER_CONNECTIONS already",
            router_connections_refused.clone(),
        );
        let inner = Inner {
            registry: root,
            shadow_switches,
            service_p99_ms,
            service_throughput,
            service_arrival,
            service_failed,
            processes,
            mig_instances,
            workload_share,
            busy_seconds,
            applied_version,
            controller_connections,
            reports_answered,
            cold_starts,
            server_pages,
            model_loads,
            router_resends,
            router_connections_refused,
            recent_cold_starts: Mutex::default(),
            render: Mutex::new(()),
        };
        AgentMetrics { inner: Arc::new(inner) }
    }
}

impl AgentMetrics {
    /// Counts one switch of `service` to its standbys.
    pub fn shadow_switch(&self, service: &str) {
        self.inner.shadow_switches.get_or_create(&labels(&[("service", service)])).inc();
    }

    /// Counts one connection opened to a controller.
    pub fn controller_connection(&self) {
        self.inner.controller_connections.inc();
    }

    /// A process of `service` run by `runtime` became ready `seconds` after its launch.
    pub fn cold_start(&self, service: &str, runtime: &str, seconds: f64) {
        self.inner.cold_starts.get_or_create(&labels(&[("service", service), ("runtime", runtime)])).observe(seconds);
        self.inner.recent_cold_starts.lock().unwrap_or_else(|p| p.into_inner()).insert(service.to_string(), seconds);
    }

    /// The newest cold start of each service since the last call, for the next report.
    pub fn take_recent_cold_starts(&self) -> BTreeMap<String, f64> {
        std::mem::take(&mut *self.inner.recent_cold_starts.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Counts one metrics page of `service`'s servers by what came of it.
    pub fn server_page(&self, service: &str, outcome: &str) {
        self.inner.server_pages.get_or_create(&labels(&[("service", service), ("outcome", outcome)])).inc();
    }

    /// Counts one model load a server of `service` answered, by outcome.
    pub fn model_load(&self, service: &str, outcome: &str) {
        self.inner.model_loads.get_or_create(&labels(&[("service", service), ("outcome", outcome)])).inc();
    }

    /// Counts one report a controller answered.
    pub fn report_answered(&self) {
        self.inner.reports_answered.inc();
    }

    /// The exposition text with the state figures of `snap`.
    pub fn render(&self, snap: &AgentSnapshot) -> String {
        let i = &self.inner;
        let _guard = i.render.lock().unwrap_or_else(|p| p.into_inner());
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        // Only what this scrape sees: a retired router or destroyed instance goes.
        for f in [&i.service_p99_ms, &i.service_throughput, &i.service_arrival, &i.workload_share] {
            f.clear();
        }
        for f in [&i.service_failed, &i.processes, &i.mig_instances] {
            f.clear();
        }
        // A process's busy time lives as long as its router backend; a replaced process
        // starts again from zero, which rate() reads as a counter reset.
        i.busy_seconds.clear();
        // A router's counts live as long as it does, like the busy time.
        i.router_resends.clear();
        i.router_connections_refused.clear();
        for (service, c) in &snap.routers {
            let l = labels(&[("service", service)]);
            i.router_resends.get_or_create(&l).inc_by(c.resends);
            i.router_connections_refused.get_or_create(&l).inc_by(c.connections_refused);
        }
        for s in &snap.services {
            let l = labels(&[("service", &s.service)]);
            i.service_p99_ms.get_or_create(&l).set(s.p99_ms);
            i.service_throughput.get_or_create(&l).set(s.throughput_rps);
            i.service_arrival.get_or_create(&l).set(s.arrival_rps);
            i.service_failed.get_or_create(&l).set(as_i64(s.failed));
        }
        let observed = snap.observed.as_ref();
        i.applied_version.set(as_i64(observed.map_or(0, |r| r.applied_version)));
        for role in ["active", "standby"] {
            i.processes.get_or_create(&labels(&[("role", role)])).set(0);
        }
        for gpu in observed.map_or(&[][..], |r| &r.gpus[..]) {
            i.mig_instances.get_or_create(&labels(&[("gpu", &gpu.gpu_uuid)])).set(gpu.instances.len() as i64);
            for w in &gpu.workloads {
                let role = if w.shadow { "standby" } else { "active" };
                i.processes.get_or_create(&labels(&[("role", role)])).inc();
                let instance = w.mig_instance.to_string();
                let l = labels(&[("gpu", &gpu.gpu_uuid), ("instance", &instance), ("service", &w.service), ("role", role)]);
                // Several processes of one workload hold the same share each; keep one.
                i.workload_share.get_or_create(&l).set(w.mps_percent);
                if let Some(busy) = snap.busy.get(&w.process) {
                    // ...but each keeps the instance busy: add them up.
                    i.busy_seconds.get_or_create(&l).inc_by(busy.as_secs_f64());
                }
            }
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
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    fn workload(process: &str, service: &str, instance: i32, share: f64, shadow: bool) -> proto::ObservedWorkload {
        proto::ObservedWorkload {
            process: process.into(),
            service: service.into(),
            mig_instance: instance,
            mps_percent: share,
            shadow,
            ..Default::default()
        }
    }

    #[test]
    fn renders_router_windows_switches_processes_and_mig_shares() {
        let m = AgentMetrics::default();
        let empty = m.render(&AgentSnapshot::default());
        assert_eq!(value(&empty, "gpuplane_agent_processes{role=\"active\"}"), Some(0.0), "{empty}");
        assert!(!empty.contains("gpuplane_agent_shadow_switches_total{"), "{empty}");

        m.shadow_switch("web");
        m.shadow_switch("web");
        m.server_page("web", "read");
        m.server_page("web", "refused");
        m.server_page("web", "read");
        let snap = AgentSnapshot {
            services: vec![proto::ServiceMetrics {
                service: "web".into(),
                p99_ms: 31.5,
                throughput_rps: 80.0,
                arrival_rps: 82.0,
                failed: 3,
                endpoint: "127.0.0.1:7200".into(),
                ..Default::default()
            }],
            observed: Some(proto::ReportRequest {
                node: "n1".into(),
                applied_version: 9,
                gpus: vec![proto::ObservedGpu {
                    gpu_uuid: "GPU-0".into(),
                    instances: vec![
                        proto::AgentMigInstance { profile: "4g".into(), start: 0 },
                        proto::AgentMigInstance { profile: "3g".into(), start: 4 },
                    ],
                    workloads: vec![
                        workload("w1", "web", 0, 50.0, false),
                        workload("w2", "web", 0, 50.0, false),
                        workload("w3", "web", 0, 60.0, true),
                        workload("c1", "chat", 1, 50.0, false),
                    ],
                    ..Default::default()
                }],
                metrics: vec![],
                ..Default::default()
            }),
            // The standby w3 is not routed to: no busy time.
            busy: [("w1", 1500), ("w2", 500), ("c1", 250), ("gone", 900)]
                .into_iter()
                .map(|(id, ms)| (id.to_string(), Duration::from_millis(ms)))
                .collect(),
            routers: [("web".to_string(), crate::router::RouterCounts { resends: 4, connections_refused: 7 })].into(),
        };
        let text = m.render(&snap);
        assert_eq!(value(&text, "gpuplane_agent_shadow_switches_total{service=\"web\"}"), Some(2.0), "{text}");
        assert_eq!(value(&text, "gpuplane_agent_service_p99_ms{service=\"web\"}"), Some(31.5));
        assert_eq!(value(&text, "gpuplane_agent_service_throughput_rps{service=\"web\"}"), Some(80.0));
        assert_eq!(value(&text, "gpuplane_agent_service_arrival_rps{service=\"web\"}"), Some(82.0));
        assert_eq!(value(&text, "gpuplane_agent_service_failed{service=\"web\"}"), Some(3.0));
        assert_eq!(value(&text, "gpuplane_agent_processes{role=\"active\"}"), Some(3.0));
        assert_eq!(value(&text, "gpuplane_agent_processes{role=\"standby\"}"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_agent_mig_instances{gpu=\"GPU-0\"}"), Some(2.0));
        assert_eq!(
            value(&text, "gpuplane_agent_workload_mps_percent{gpu=\"GPU-0\",instance=\"1\",service=\"chat\",role=\"active\"}"),
            Some(50.0)
        );
        assert_eq!(value(&text, "gpuplane_agent_applied_version"), Some(9.0));
        assert_eq!(value(&text, "gpuplane_agent_server_pages_total{service=\"web\",outcome=\"read\"}"), Some(2.0));
        assert_eq!(value(&text, "gpuplane_agent_server_pages_total{service=\"web\",outcome=\"refused\"}"), Some(1.0));
        assert_eq!(value(&text, "gpuplane_agent_router_resends_total{service=\"web\"}"), Some(4.0), "{text}");
        assert_eq!(value(&text, "gpuplane_agent_router_connections_refused_total{service=\"web\"}"), Some(7.0));
        let busy = |instance: &str, service: &str, role: &str| {
            value(
                &text,
                &format!(
                    "gpuplane_agent_busy_seconds_total{{gpu=\"GPU-0\",instance=\"{instance}\",service=\"{service}\",role=\"{role}\"}}"
                ),
            )
        };
        assert_eq!(busy("0", "web", "active"), Some(2.0), "both processes of the workload keep the instance busy: {text}");
        assert_eq!(busy("1", "chat", "active"), Some(0.25));
        assert_eq!(busy("0", "web", "standby"), None, "no router backend, no series");
        assert!(!text.contains("gone"), "a process no longer observed has no series: {text}");

        // The next scrape without the router: its series go, the switch count stays.
        let text = m.render(&AgentSnapshot { services: vec![], ..snap });
        assert!(!text.contains("gpuplane_agent_service_p99_ms{"), "{text}");
        assert_eq!(value(&text, "gpuplane_agent_shadow_switches_total{service=\"web\"}"), Some(2.0));
    }
}
