//! The demo's load generator: open-loop Open Inference Protocol requests (ModelInfer
//! naming the service) to every service at its rate, spread over
//! the router endpoints the controllers publish (the service's address book, refreshed
//! twice a second), with client-side latency measured per one-second window. A request
//! that fails or times out counts as a latency above any SLO. Each window also counts the
//! requests over the SLO, for the request-level attainment HetSev reports ("SLO
//! violations", the share of requests that missed: Sec. 6, Figure 6). A stall of a
//! fraction of a second moves that by the fraction, not by a whole window.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use controlplane::client::Client;

/// FP32 values of one request's one sample: the simulated servers' time does not depend on
/// them, so they are few (the real cost of a request is the model's, which sim-infer plays).
const FEATURES: u32 = 16;

/// Latency recorded for a failed request: above every SLO.
const FAILED_MS: u64 = 60_000;

/// One service's one-second window.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// Seconds since the load started.
    pub second: u64,
    pub sent: u64,
    pub failed: u64,
    /// Requests slower than the SLO, failed ones included. Counted as they finish rather
    /// than read from the histogram, whose buckets near an SLO of 80 ms are 64 µs wide.
    pub over_slo: u64,
    pub p99_ms: f64,
    pub met: bool,
}

struct Target {
    slo_ms: f64,
    /// Requests per second, as f64 bits (changed while running).
    rate: AtomicU64,
}

/// One second of one service's requests.
struct Second {
    latencies_us: Histogram<u64>,
    sent: u64,
    failed: u64,
    over_slo: u64,
}

#[derive(Default)]
struct Windows {
    by_service: BTreeMap<String, BTreeMap<u64, Second>>,
}

/// The running load.
pub struct Load {
    started: Instant,
    targets: BTreeMap<String, Arc<Target>>,
    endpoints: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    windows: Arc<Mutex<Windows>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts sending to `services` (name, SLO ms, rate) through the endpoints published in
    /// the Nodes' status.
    pub fn start(client: Client, services: &[(String, f64, f64)]) -> Load {
        let started = Instant::now();
        let endpoints: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
        let windows: Arc<Mutex<Windows>> = Arc::default();
        let mut tasks = vec![tokio::spawn(refresh_endpoints(client, endpoints.clone()))];
        let mut targets = BTreeMap::new();
        for (name, slo_ms, rate) in services {
            let target = Arc::new(Target { slo_ms: *slo_ms, rate: AtomicU64::new(rate.to_bits()) });
            targets.insert(name.clone(), target.clone());
            tasks.push(tokio::spawn(drive(name.clone(), target, endpoints.clone(), windows.clone(), started)));
        }
        Load { started, targets, endpoints, windows, tasks }
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub fn set_rate(&self, service: &str, rate: f64) {
        if let Some(t) = self.targets.get(service) {
            t.rate.store(rate.to_bits(), Ordering::Relaxed);
        }
    }

    pub fn rate(&self, service: &str) -> f64 {
        self.targets.get(service).map_or(0.0, |t| f64::from_bits(t.rate.load(Ordering::Relaxed)))
    }

    /// The endpoints the load generator currently sends to, per service.
    pub fn endpoints(&self) -> BTreeMap<String, Vec<String>> {
        self.endpoints.lock().expect("endpoints lock").clone()
    }

    /// The completed windows of every service (the current second is still filling).
    pub fn windows(&self) -> BTreeMap<String, Vec<Window>> {
        let now = self.started.elapsed().as_secs();
        let w = self.windows.lock().expect("windows lock");
        w.by_service
            .iter()
            .map(|(service, secs)| {
                let slo = self.targets.get(service).map_or(f64::INFINITY, |t| t.slo_ms);
                let list = secs
                    .iter()
                    // A window is complete once its second and the longest timeout are over.
                    .filter(|(&s, _)| s + 3 < now)
                    .map(|(&second, s)| {
                        let p99_ms = s.latencies_us.value_at_quantile(0.99) as f64 / 1000.0;
                        let met = s.failed == 0 && p99_ms <= slo;
                        Window { second, sent: s.sent, failed: s.failed, over_slo: s.over_slo, p99_ms, met }
                    })
                    .collect();
                (service.clone(), list)
            })
            .collect()
    }

    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Keeps the per-service endpoint lists current: every router of a healthy node.
async fn refresh_endpoints(client: Client, endpoints: Arc<Mutex<BTreeMap<String, Vec<String>>>>) {
    loop {
        // Stale reads are fine (any controller answers, also during an election).
        if let Ok(list) = client.list("Node", "", true).await {
            let mut by_service: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (service, _node, addr) in controlplane::agents::endpoints::service_endpoints(&list.resources) {
                by_service.entry(service).or_default().push(addr);
            }
            *endpoints.lock().expect("endpoints lock") = by_service;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sends to one service at its target rate (fixed spacing), round-robin over its endpoints.
async fn drive(
    service: String,
    target: Arc<Target>,
    endpoints: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    windows: Arc<Mutex<Windows>>,
    started: Instant,
) {
    let mut channels: BTreeMap<String, Channel> = BTreeMap::new();
    let timeout = Duration::from_secs_f64((target.slo_ms * 4.0 / 1000.0).max(1.0));
    let slo_us = (target.slo_ms * 1000.0) as u64;
    let mut next = tokio::time::Instant::now();
    let mut sent: u64 = 0;
    loop {
        let rate = f64::from_bits(target.rate.load(Ordering::Relaxed));
        if rate <= 0.0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            next = tokio::time::Instant::now();
            continue;
        }
        next += Duration::from_secs_f64(1.0 / rate);
        let now = tokio::time::Instant::now();
        // Behind by more than a second (a stalled machine): do not burst to catch up.
        if next + Duration::from_secs(1) < now {
            next = now;
        }
        tokio::time::sleep_until(next).await;
        sent += 1;
        let second = started.elapsed().as_secs();
        let addrs = endpoints.lock().expect("endpoints lock").get(&service).cloned().unwrap_or_default();
        let channel = if addrs.is_empty() {
            None
        } else {
            let addr = &addrs[(sent as usize) % addrs.len()];
            let ch = channels.entry(addr.clone()).or_insert_with(|| {
                Channel::from_shared(format!("http://{addr}")).expect("endpoint URI").connect_timeout(timeout).connect_lazy()
            });
            Some(ch.clone())
        };
        let (service, windows) = (service.clone(), windows.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            let ok = match channel {
                None => false,
                Some(ch) => {
                    let mut client = proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient::new(ch);
                    let request = proto::open_inference::fp32_request(&service, &sent.to_string(), 1, FEATURES, 1.0);
                    matches!(tokio::time::timeout(timeout, client.model_infer(request)).await, Ok(Ok(_)))
                }
            };
            let micros = if ok { t0.elapsed().as_micros() as u64 } else { FAILED_MS * 1000 };
            let mut w = windows.lock().expect("windows lock");
            let s = w.by_service.entry(service).or_default().entry(second).or_insert_with(|| Second {
                latencies_us: Histogram::new_with_bounds(1, FAILED_MS * 1000, 3).expect("histogram bounds"),
                sent: 0,
                failed: 0,
                over_slo: 0,
            });
            let _ = s.latencies_us.record(micros.max(1));
            s.sent += 1;
            s.failed += u64::from(!ok);
            s.over_slo += u64::from(micros > slo_us);
        });
    }
}

/// SLO compliance of windows in `[from_s, to_s)`: (windows met, windows).
pub fn compliance(windows: &[Window], from_s: f64, to_s: f64) -> (usize, usize) {
    let within: Vec<&Window> = windows.iter().filter(|w| (w.second as f64) >= from_s && (w.second as f64) < to_s).collect();
    (within.iter().filter(|w| w.met).count(), within.len())
}
