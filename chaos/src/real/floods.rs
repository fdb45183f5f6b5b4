//! The `hostile` scenario's floods, each measured while it runs: a tenant's Watch streams
//! that are never read, a connection flood without credentials from a node's host, and an
//! anonymous (and a greedy authenticated) data-plane flood against another tenant's
//! service; and the leader's memory and pass time, read from the leader process and its
//! `/metrics`. Each returns what it saw and the problems, if any; the bounds it checks are
//! the controllers' and routers' defaults.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use controlplane::client::Client;
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::json;
use tonic::Code;

/// What the floods measured, for the report.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Figures {
    pub leader: LeaderLoad,
    pub watches: UnreadWatches,
    pub connections: ConnectionFlood,
    pub data_plane: DataPlaneFlood,
}

impl Figures {
    /// The report's lines.
    pub fn lines(&self) -> Vec<String> {
        let (l, w, c, d) = (&self.leader, &self.watches, &self.connections, &self.data_plane);
        let mut lines = vec![format!(
            "tenant at its quota: leader RSS {:.0} -> peak {:.0} MiB, {} provisioning passes, mean {:.3} s",
            l.rss_before_mib, l.rss_peak_mib, l.passes, l.mean_pass_s
        )];
        lines.extend(l.outcomes.iter().map(|(s, why)| format!("  {s}: {}", if why.is_empty() { "planned" } else { why })));
        lines.extend([
            format!(
                "unread watches: {} held, the next answered {}; {} writes meanwhile; follower RSS {:.0} -> {:.0} MiB",
                w.opened, w.past_the_bound, w.writes_meanwhile, w.follower_rss_before_mib, w.follower_rss_after_mib
            ),
            format!(
                "connection flood: {} of {} connected, {} closed at once, {} by the handshake timeout, {} still open; API answered during it: {}",
                c.connected, c.attempted, c.closed_at_once, c.closed_by_timeout, c.still_open, c.api_answered_during
            ),
            format!(
                "data plane: victim p50 {:.1} ms, p99 {:.1} ms (alone {:.1} ms; SLO {:.0} ms: {}), {} of {} failed; anonymous {} of {} refused; greedy {} of {} shed",
                d.victim_p50_ms,
                d.victim_p99_ms,
                d.victim_alone_p99_ms,
                d.slo_ms,
                if d.within_slo() { "met" } else { "MISSED" },
                d.victim_failed,
                d.victim_sent,
                d.anonymous_refused,
                d.anonymous_sent,
                d.greedy_shed,
                d.greedy_sent
            ),
        ]);
        lines
    }
}

/// A process's resident memory now (Linux's VmRSS), MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    devcluster::process::memory_mib(&pid.to_string(), "VmRSS")
}

/// The provisioner's passes so far on the controller whose `/metrics` is at `addr`:
/// (count, total seconds), from `gpuplane_loop_pass_duration_seconds`.
pub async fn provisioner_passes(addr: SocketAddr) -> Option<(f64, f64)> {
    let (status, text) = tokio::time::timeout(Duration::from_secs(5), telemetry_http::get(addr, "/metrics")).await.ok()?.ok()?;
    if status != 200 {
        return None;
    }
    let value = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)).and_then(|rest| rest.split_whitespace().next()).and_then(|v| v.parse().ok())
    };
    Some((
        value("gpuplane_loop_pass_duration_seconds_count{loop=\"provisioner\"}")?,
        value("gpuplane_loop_pass_duration_seconds_sum{loop=\"provisioner\"}")?,
    ))
}

/// The leader while one tenant holds its quota of the hardest services it may create.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LeaderLoad {
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
    /// Provisioning passes during the load and their mean duration.
    pub passes: f64,
    pub mean_pass_s: f64,
    /// What the plan says of the tenant's services at its quota (empty: planned).
    pub outcomes: Vec<(String, String)>,
}

/// Samples the leader (`pid`, `/metrics` at `metrics`) every 200 ms for `during`.
pub async fn watch_leader(pid: u32, metrics: SocketAddr, during: Duration) -> LeaderLoad {
    let before = provisioner_passes(metrics).await.unwrap_or_default();
    let rss_before_mib = rss_mib(pid).unwrap_or(0.0);
    let mut rss_peak_mib = rss_before_mib;
    let started = Instant::now();
    while started.elapsed() < during {
        tokio::time::sleep(Duration::from_millis(200)).await;
        rss_peak_mib = rss_peak_mib.max(rss_mib(pid).unwrap_or(0.0));
    }
    let after = provisioner_passes(metrics).await.unwrap_or(before);
    let passes = after.0 - before.0;
    let mean_pass_s = if passes > 0.0 { (after.1 - before.1) / passes } else { 0.0 };
    LeaderLoad { rss_before_mib, rss_peak_mib, passes, mean_pass_s, outcomes: Vec::new() }
}

/// Unread Watch streams of one tenant on one follower.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct UnreadWatches {
    pub opened: usize,
    /// How the watch past `[limits] watches_per_principal` was answered.
    pub past_the_bound: String,
    pub writes_meanwhile: usize,
    pub follower_rss_before_mib: f64,
    pub follower_rss_after_mib: f64,
}

/// The controllers' default `[limits] watches_per_principal`.
pub const WATCHES_PER_PRINCIPAL: usize = 16;

/// Opens as many Watch streams as the bound allows on the follower `follower` (a client
/// holding only that address) and one more, reads none of them while the tenant (`writer`)
/// changes its own service `service` `writes` times, and measures the follower (`pid`).
pub async fn unread_watches(follower: &Client, writer: &Client, pid: u32, service: proto::Resource, writes: usize) -> UnreadWatches {
    let follower_rss_before_mib = rss_mib(pid).unwrap_or(0.0);
    let mut held = Vec::new();
    for _ in 0..WATCHES_PER_PRINCIPAL {
        if let Ok(stream) = follower.watch("", 0).await {
            held.push(stream);
        }
    }
    let past_the_bound = match follower.watch("", 0).await {
        Ok(_) => "accepted".to_string(),
        Err(e) => format!("{:?}", e.code()),
    };
    let mut writes_meanwhile = 0;
    for i in 0..writes {
        let mut r = service.clone();
        // A change the plan does not depend on: a caller token added, so only the watchers
        // (and the routers) see it.
        let digest = controlplane::security::hash_token(&format!("unread-watch-{i}"));
        if let Ok(mut spec) = serde_json::from_str::<serde_json::Value>(&r.spec_json) {
            spec["inference_tokens"] = json!([digest]);
            r.spec_json = spec.to_string();
        }
        if writer.put(r, proto::WriteMode::Unspecified).await.is_ok() {
            writes_meanwhile += 1;
        }
    }
    // Give the follower time to apply what was written and queue it for every watcher.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let follower_rss_after_mib = rss_mib(pid).unwrap_or(0.0);
    let opened = held.len();
    drop(held);
    UnreadWatches { opened, past_the_bound, writes_meanwhile, follower_rss_before_mib, follower_rss_after_mib }
}

/// Idle TCP connections without a TLS handshake from one host.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConnectionFlood {
    pub attempted: usize,
    pub connected: usize,
    /// Closed by the controller within a second (past `[limits] connections_per_ip`).
    pub closed_at_once: usize,
    /// Closed by the controller before the end (the TLS handshake timeout).
    pub closed_by_timeout: usize,
    /// Still open at the end: must be 0.
    pub still_open: usize,
    /// The flooded controller answered the runner (another host) during the flood.
    pub api_answered_during: bool,
}

/// The controllers' default `[limits] connections_per_ip` and handshake timeout.
pub const CONNECTIONS_PER_IP: usize = 1024;
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the peer has closed `s` (a non-blocking read sees the end of the stream or a
/// reset).
fn closed(s: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Opens `count` connections to `target` from network namespace `namespace` (a thread
/// joins it: sockets belong to the namespace they are made in), sends nothing, and watches
/// the controller close them. `probe` is polled meanwhile from the runner's own host.
pub async fn connection_flood<F, Fut>(namespace: &str, target: SocketAddr, count: usize, probe: F) -> Result<ConnectionFlood, String>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let path = format!("/run/netns/{namespace}");
    let ns = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let flood = std::thread::spawn(move || -> Result<ConnectionFlood, String> {
        // SAFETY: setns changes only this thread's network namespace; the file stays open.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        let mut conns: Vec<TcpStream> = Vec::with_capacity(count);
        for _ in 0..count {
            if let Ok(s) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
                let _ = s.set_nonblocking(true);
                conns.push(s);
            }
        }
        let connected = conns.len();
        std::thread::sleep(Duration::from_secs(1));
        let mut open: Vec<TcpStream> = conns.into_iter().filter_map(|mut s| (!closed(&mut s)).then_some(s)).collect();
        let closed_at_once = connected - open.len();
        std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_secs(2));
        let before = open.len();
        open.retain_mut(|s| !closed(s));
        Ok(ConnectionFlood {
            attempted: count,
            connected,
            closed_at_once,
            closed_by_timeout: before - open.len(),
            still_open: open.len(),
            api_answered_during: false,
        })
    });
    // While the flood holds its connections: does the controller still serve another host?
    tokio::time::sleep(Duration::from_secs(3)).await;
    let answered = probe().await;
    let mut result = tokio::task::spawn_blocking(move || flood.join().map_err(|_| "the flood thread panicked".to_string()))
        .await
        .map_err(|e| format!("the flood thread: {e}"))???;
    result.api_answered_during = answered;
    Ok(result)
}

/// A service's latency from its own caller while others flood its endpoint.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DataPlaneFlood {
    pub victim_sent: usize,
    pub victim_failed: usize,
    pub victim_p50_ms: f64,
    pub victim_p99_ms: f64,
    pub victim_alone_p99_ms: f64,
    pub slo_ms: f64,
    pub anonymous_sent: usize,
    /// Anonymous requests answered UNAUTHENTICATED (must be all of them).
    pub anonymous_refused: usize,
    pub greedy_sent: usize,
    /// The greedy caller's requests shed with RESOURCE_EXHAUSTED (its share is full).
    pub greedy_shed: usize,
}

impl DataPlaneFlood {
    pub fn within_slo(&self) -> bool {
        self.victim_failed == 0 && self.victim_p99_ms <= self.slo_ms
    }
}

/// The `p`-th percentile of `values`, 0 when there are none (nothing answered).
fn percentile(values: &[f64], p: f64) -> f64 {
    devcluster::stats::percentile(values, p).unwrap_or(0.0)
}

/// One sample of 256 FP32 values (1 KiB) for `service`.
fn infer(service: &str, id: u64, token: Option<&str>) -> tonic::Request<proto::oip::ModelInferRequest> {
    let mut r = tonic::Request::new(proto::open_inference::fp32_request(service, &id.to_string(), 1, 256, 1.0));
    if let Some(t) = token {
        r.metadata_mut().insert(proto::meta::AUTHORIZATION, format!("Bearer {t}").parse().expect("a token is ASCII"));
    }
    r.set_timeout(Duration::from_secs(2));
    r
}

/// The victim's latencies (ms; failed requests as `None`) at `rate` for `during`.
async fn victim_calls(channel: tonic::transport::Channel, service: &str, token: &str, rate: f64, during: Duration) -> Vec<Option<f64>> {
    let mut client = GrpcInferenceServiceClient::new(channel);
    let mut out = Vec::new();
    let started = Instant::now();
    let mut next = tokio::time::Instant::now();
    let mut id = 0;
    while started.elapsed() < during {
        next += Duration::from_secs_f64(1.0 / rate);
        tokio::time::sleep_until(next).await;
        id += 1;
        let t0 = Instant::now();
        let ok = client.model_infer(infer(service, id, Some(token))).await.is_ok();
        out.push(ok.then(|| t0.elapsed().as_secs_f64() * 1000.0));
    }
    out
}

/// `callers` concurrent callers sending back to back for `during`: (sent, answered `code`).
async fn flood_calls(
    channel: tonic::transport::Channel,
    service: &str,
    token: Option<String>,
    callers: usize,
    during: Duration,
    code: Code,
) -> (usize, usize) {
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (channel, service, token) = (channel.clone(), service.to_string(), token.clone());
            tokio::spawn(async move {
                let mut client = GrpcInferenceServiceClient::new(channel);
                let (mut sent, mut matched) = (0usize, 0usize);
                let started = Instant::now();
                while started.elapsed() < during {
                    sent += 1;
                    let got = client.model_infer(infer(&service, (c * 1_000_000 + sent) as u64, token.as_deref())).await;
                    matched += usize::from(got.err().is_some_and(|e| e.code() == code));
                }
                (sent, matched)
            })
        })
        .collect();
    let mut total = (0, 0);
    for t in tasks {
        if let Ok((s, m)) = t.await {
            total = (total.0 + s, total.1 + m);
        }
    }
    total
}

/// A data-plane flood: where, whose service, and how hard.
pub struct DataPlaneAttack<'a> {
    pub endpoint: &'a str,
    pub service: &'a str,
    pub slo_ms: f64,
    /// The victim's own caller, at `rate` requests/s.
    pub victim_token: &'a str,
    pub rate: f64,
    /// Listed too: a caller of the same service that sends as fast as it can.
    pub greedy_token: &'a str,
    /// Anonymous and greedy callers each, sending back to back for `during`.
    pub callers: usize,
    pub during: Duration,
}

/// The victim at its rate alone, then with the anonymous and the greedy callers flooding
/// its endpoint.
pub async fn data_plane_flood(a: DataPlaneAttack<'_>) -> Result<DataPlaneFlood, String> {
    let DataPlaneAttack { endpoint, service, slo_ms, victim_token, rate, greedy_token, callers, during } = a;
    let channel = tonic::transport::Channel::from_shared(format!("http://{endpoint}"))
        .map_err(|e| format!("endpoint {endpoint}: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("connecting to {endpoint}: {e}"))?;
    let alone = victim_calls(channel.clone(), service, victim_token, rate, Duration::from_secs(5)).await;
    let alone: Vec<f64> = alone.into_iter().flatten().collect();
    // The floods on connections of their own, as other clients' would be.
    let flood_channel = tonic::transport::Channel::from_shared(format!("http://{endpoint}"))
        .map_err(|e| format!("endpoint {endpoint}: {e}"))?
        .connect_lazy();
    let anonymous = flood_calls(flood_channel.clone(), service, None, callers, during, Code::Unauthenticated);
    let greedy = flood_calls(flood_channel, service, Some(greedy_token.to_string()), callers, during, Code::ResourceExhausted);
    let victim = victim_calls(channel, service, victim_token, rate, during);
    let (victim, (anonymous_sent, anonymous_refused), (greedy_sent, greedy_shed)) = tokio::join!(victim, anonymous, greedy);
    let victim_failed = victim.iter().filter(|v| v.is_none()).count();
    let latencies: Vec<f64> = victim.iter().flatten().copied().collect();
    Ok(DataPlaneFlood {
        victim_sent: victim.len(),
        victim_failed,
        victim_p50_ms: percentile(&latencies, 50.0),
        victim_p99_ms: percentile(&latencies, 99.0),
        victim_alone_p99_ms: percentile(&alone, 99.0),
        slo_ms,
        anonymous_sent,
        anonymous_refused,
        greedy_sent,
        greedy_shed,
    })
}

/// What the floods must show; problems, if any.
pub fn check(watches: &UnreadWatches, conns: &ConnectionFlood, data: &DataPlaneFlood, leader: &LeaderLoad) -> Vec<String> {
    let mut problems = Vec::new();
    if watches.opened != WATCHES_PER_PRINCIPAL || watches.past_the_bound != "ResourceExhausted" {
        problems.push(format!(
            "unread watches: {} opened of {WATCHES_PER_PRINCIPAL}, the one past the bound answered {}",
            watches.opened, watches.past_the_bound
        ));
    }
    if conns.connected < conns.attempted.min(CONNECTIONS_PER_IP) || conns.closed_at_once + CONNECTIONS_PER_IP < conns.connected {
        problems.push(format!(
            "connection flood: {} connected, {} closed at once; at most {CONNECTIONS_PER_IP} may stay",
            conns.connected, conns.closed_at_once
        ));
    }
    if conns.still_open > 0 {
        problems.push(format!("connection flood: {} connections without a handshake still open after the timeout", conns.still_open));
    }
    if !conns.api_answered_during {
        problems.push("connection flood: the controller did not answer another host during the flood".into());
    }
    if data.anonymous_refused != data.anonymous_sent || data.anonymous_sent == 0 {
        problems.push(format!("data plane: {} of {} anonymous requests refused", data.anonymous_refused, data.anonymous_sent));
    }
    // Its p99 against the SLO is reported (`within_slo`), not failed on: a latency on a
    // shared machine is a benchmark's figure, not a check's.
    if data.victim_failed > 0 || data.victim_sent == 0 {
        problems.push(format!("data plane: {} of the victim's {} requests failed under the flood", data.victim_failed, data.victim_sent));
    }
    if leader.rss_peak_mib > 2048.0 {
        problems.push(format!("the leader's RSS reached {:.0} MiB under the tenant at its quota", leader.rss_peak_mib));
    }
    problems
}
