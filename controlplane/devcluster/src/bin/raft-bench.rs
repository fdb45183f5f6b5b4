//! Benchmark of the replicated controller: 3 controller processes on loopback, each with its own data dir.
//!
//!   cargo run --release -p devcluster --bin raft-bench -- [--seconds 5] [--kills 20] [--transfers 20] [--restarts 10]
//!
//! Prints committed writes per second, write latency (p50, p99) and the controllers' CPU
//! per write with 1 and 64 concurrent clients, then the leader failover time (SIGKILL of the leader process to the
//! first successful write), as the median and maximum over `--kills` kills, and how many of
//! the writes a background client had acknowledged across the kills were lost (must be 0),
//! then planned leader transfers (`gpuctl cluster transfer`, as a rolling upgrade does one
//! controller at a time): how long the call takes and the longest pause in a writer's
//! acknowledgements around it, as the median and maximum over `--transfers` transfers; and
//! last, a rolling restart's steps: the leader stopped with SIGTERM and started again, how
//! long it took to exit and the writer's longest pause, over `--restarts` restarts.
//! The load's clients run on a runtime with as many threads as compare-etcd.sh gives wrk
//! against etcd: one for 1 client, two for 64.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use controlplane::client::{Client, RetryPolicy};
use devcluster::Controllers;

#[derive(Parser)]
struct Args {
    /// Seconds of load per concurrency level.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Leader kills for the failover measurement.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Planned leader transfers for the hand-over measurement.
    #[arg(long, default_value_t = 20)]
    transfers: usize,
    /// Leader restarts (SIGTERM, then started again) for the rolling-restart measurement.
    #[arg(long, default_value_t = 10)]
    restarts: usize,
    /// Concurrency levels to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Run the controllers in this directory and leave it (data dirs, and logs at openraft's
    /// info level, which names every vote), to look into a slow failover.
    #[arg(long)]
    keep: Option<std::path::PathBuf>,
}

/// The three controllers' CPU seconds so far.
fn controllers_cpu_seconds(cluster: &Controllers) -> f64 {
    cluster.pids().iter().map(|pid| devcluster::process::cpu_seconds_of(&pid.to_string())).sum()
}

/// A failover slower than this is printed on its own, with its election's share.
const SLOW_FAILOVER: Duration = Duration::from_secs(1);
/// A transfer whose call or pause takes longer than this is printed on its own.
const SLOW_TRANSFER: Duration = Duration::from_millis(100);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn service(name: &str, rate: f64) -> proto::Resource {
    proto::Resource {
        kind: "Service".into(),
        name: name.into(),
        tenant: "bench".into(),
        spec_json: serde_json::json!({"model": "resnet50", "slo": {"latency_ms": 50, "request_rate": rate}}).to_string(),
        ..Default::default()
    }
}

async fn seed(client: &Client) {
    let docs = [
        ("Tenant", "bench", "{}".to_string()),
        ("GpuModel", "A100-80GB", r#"{"sm_count":108,"memory_gib":80}"#.to_string()),
        ("ModelProfile", "resnet50-a100", r#"{"model":"resnet50","gpu_model":"A100-80GB"}"#.to_string()),
    ];
    for (kind, name, spec) in docs {
        let r = proto::Resource { kind: kind.into(), name: name.into(), spec_json: spec, ..Default::default() };
        client.put(r, proto::WriteMode::Unspecified).await.expect("seeding");
    }
}

async fn leader_of(client: &Client) -> u64 {
    loop {
        if let Ok(s) = client.cluster_status().await {
            if s.leader_id != 0 {
                return s.leader_id;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes per second, p50, p99, errors and the writes acknowledged, from `clients` writers
/// on a runtime of their own with wrk's threads in compare-etcd.sh (`-t1` for one
/// connection, `-t2` for 64): one client on one thread, so that its request and the
/// answer's wake-up stay on that thread as in wrk's event loop, and the load generator's
/// own hand-offs are not counted against the controllers.
async fn throughput(endpoints: Vec<String>, clients: usize, seconds: u64) -> (f64, Duration, Duration, usize, usize) {
    let runtime = if clients == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
    }
    .expect("the load's runtime");
    tokio::task::spawn_blocking(move || runtime.block_on(load(endpoints, clients, seconds))).await.expect("the load")
}

async fn load(endpoints: Vec<String>, clients: usize, seconds: u64) -> (f64, Duration, Duration, usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Arc::new(Client::new(endpoints.clone()));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                match client.put(service(&format!("c{c}-{}", i % 50), 1.0 + i as f64), proto::WriteMode::Unspecified).await {
                    Ok(_) => latencies.push(t.elapsed()),
                    Err(_) => errors += 1,
                }
                i += 1;
            }
            (latencies, errors)
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64().max(seconds as f64);
    all.sort();
    (all.len() as f64 / elapsed, percentile(&all, 0.5), percentile(&all, 0.99), errors, all.len())
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let exe = std::env::current_exe().unwrap();
    let bin = exe.with_file_name("controlplane");
    if !bin.exists() {
        eprintln!("raft-bench: {} not found; build it first: cargo build --release -p controlplane --bin controlplane", bin.display());
        std::process::exit(2);
    }
    let temporary = tempfile::tempdir().expect("a temporary directory");
    let (dir, log_level) = match &args.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("creating --keep's directory");
            (dir.as_path(), "warn,openraft=info")
        }
        None => (temporary.path(), "error"),
    };
    let mut cluster = Controllers::three_on_loopback(&bin, dir).with_env("RUST_LOG", log_level);
    cluster.start_all().expect("starting the controllers");
    let endpoints = cluster.servers();
    let client = Client::new(endpoints.clone());
    leader_of(&client).await;
    seed(&client).await;

    println!("3 controllers on loopback (separate processes, fdatasync of the Raft log per append batch)");
    println!("{:<10} {:>14} {:>12} {:>12} {:>8} {:>12}", "clients", "writes/s", "p50", "p99", "errors", "CPU/write");
    for &n in &args.clients {
        let cpu_before = controllers_cpu_seconds(&cluster);
        let (rate, p50, p99, errors, acknowledged) = throughput(endpoints.clone(), n, args.seconds).await;
        let cpu = controllers_cpu_seconds(&cluster) - cpu_before;
        let per_write_ms = cpu * 1e3 / acknowledged.max(1) as f64;
        println!(
            "{n:<10} {rate:>14.0} {:>10.2}ms {:>10.2}ms {errors:>8} {per_write_ms:>10.3}ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    println!("(CPU/write: the three controllers' user and system CPU over the level, per acknowledged write)");

    // Failover: kill -9 the leader, then time the first write that succeeds. Meanwhile a
    // background writer keeps writing distinct resources and records which were
    // acknowledged; after the last kill every acknowledged one must be there.
    let fast = RetryPolicy { attempts: 10_000, backoff: Duration::from_millis(5), timeout: Duration::from_millis(300) };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let (stop, writer) = (stop.clone(), Client::new(endpoints.clone()).with_retry(fast.clone()));
        tokio::spawn(async move {
            let (mut attempted, mut acked) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                attempted += 1;
                let name = format!("ack-{attempted}");
                let tenant = proto::Resource { kind: "Tenant".into(), name: name.clone(), spec_json: "{}".into(), ..Default::default() };
                if writer.put(tenant, proto::WriteMode::Create).await.is_ok() {
                    acked.push(name);
                }
                // ~50 writes/s: continuous, and the read-back stays one message.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (attempted, acked)
        })
    };
    let (mut times, mut elections) = (Vec::new(), Vec::new());
    for k in 0..args.kills {
        let leader = leader_of(&client).await;
        let writer = Client::new(endpoints.clone()).with_retry(fast.clone());
        writer.put(service("failover", 1.0), proto::WriteMode::Unspecified).await.expect("write before kill");
        let survivors: Vec<String> = cluster.servers().into_iter().filter(|a| a != cluster.addr(leader)).collect();
        let (killed_at, killed_wall) = (Instant::now(), std::time::SystemTime::now());
        cluster.kill9(leader);
        // When a survivor first names another leader: the election's share of the
        // failover, the rest being the new leader's first commit and the client finding it.
        let elected = tokio::spawn(async move {
            let watcher = Client::new(survivors.clone());
            loop {
                for addr in &survivors {
                    if let Ok(s) = watcher.node_status(addr).await {
                        if s.leader_id != 0 && s.leader_id != leader {
                            return killed_at.elapsed();
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        writer.put(service("failover", 2.0 + k as f64), proto::WriteMode::Unspecified).await.expect("write after kill");
        let (failover, election) = (killed_at.elapsed(), elected.await.expect("election watcher"));
        if failover > SLOW_FAILOVER {
            let unix = killed_wall.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            println!(
                "  kill {} (controller-{leader}, at Unix time {:.3}): failover {:.0}ms, of which the election {:.0}ms",
                k + 1,
                unix.as_secs_f64(),
                failover.as_secs_f64() * 1e3,
                election.as_secs_f64() * 1e3
            );
        }
        times.push(failover);
        elections.push(election);
        cluster.start(leader, leader == 1).expect("restarting the killed controller");
        // Let the restarted node catch up before the next kill.
        caught_up(&cluster, &client, leader).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (attempted, acked) = background.await.expect("background writer");
    let present: std::collections::BTreeSet<String> =
        client.list("Tenant", "", false).await.expect("reading back").resources.into_iter().map(|r| r.name).collect();
    let lost = acked.iter().filter(|n| !present.contains(*n)).count();
    if args.kills > 0 {
        println!(
            "continuous writes across the {} kills: {attempted} attempted, {} acknowledged, {lost} acknowledged writes lost",
            args.kills,
            acked.len()
        );
    }
    times.sort();
    if !times.is_empty() {
        println!(
            "leader failover (SIGKILL to first successful write), {} kills: median {:.0}ms, min {:.0}ms, max {:.0}ms",
            times.len(),
            percentile(&times, 0.5).as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3
        );
        elections.sort();
        println!(
            "  of which the election (SIGKILL until a survivor names the new leader): median {:.0}ms, max {:.0}ms",
            percentile(&elections, 0.5).as_secs_f64() * 1e3,
            elections[elections.len() - 1].as_secs_f64() * 1e3
        );
    }
    transfers(&client, &endpoints, args.transfers).await;
    restarts(&mut cluster, &client, &endpoints, args.restarts).await;
}

/// One writer writing one resource after another, recording when each write was
/// acknowledged; [`PauseWriter::pause_since`] is the longest gap between two of them that
/// spans a moment (a write at 1.3 ms takes the place of none).
struct PauseWriter {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Instant>>,
}

impl PauseWriter {
    fn start(endpoints: &[String]) -> PauseWriter {
        let fast = RetryPolicy { attempts: 10_000, backoff: Duration::from_millis(2), timeout: Duration::from_millis(300) };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (until, writer) = (stop.clone(), Client::new(endpoints.to_vec()).with_retry(fast));
        let task = tokio::spawn(async move {
            let mut acks = Vec::new();
            let mut i = 0u64;
            while !until.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                if writer.put(service("pause", 1.0 + i as f64), proto::WriteMode::Unspecified).await.is_ok() {
                    acks.push(Instant::now());
                }
            }
            acks
        });
        PauseWriter { stop, task }
    }

    /// Stops the writer; its longest pause that ends after `since` (to now, when nothing
    /// was acknowledged after `since`).
    async fn pause_since(self, since: Instant) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut acks = self.task.await.expect("the writer");
        if acks.last().is_none_or(|last| *last < since) {
            acks.push(Instant::now());
        }
        acks.windows(2).filter(|w| w[1] >= since).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// Planned transfers: the leader is asked to hand over while a [`PauseWriter`] writes.
async fn transfers(client: &Client, endpoints: &[String], count: usize) {
    let (mut calls, mut pauses) = (Vec::new(), Vec::new());
    for k in 0..count {
        let before = leader_of(client).await;
        let writer = PauseWriter::start(endpoints);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        let outcome = client.transfer_leader(0).await;
        let call = asked.elapsed();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pause = writer.pause_since(asked).await;
        if let Err(e) = outcome {
            println!("  transfer {}: refused: {}", k + 1, e.message());
            continue;
        }
        let after = leader_of(client).await;
        if after == before || call > SLOW_TRANSFER || pause > SLOW_TRANSFER {
            println!(
                "  transfer {} (ended at Unix time {:.3}): controller-{before} to controller-{after}, the call {:.0}ms, the pause {:.0}ms",
                k + 1,
                unix_now(),
                ms(call),
                ms(pause)
            );
        }
        calls.push(call);
        pauses.push(pause);
    }
    if calls.is_empty() {
        return;
    }
    println!(
        "planned leader transfer, {} transfers: the call {}; a writer's longest pause {}",
        calls.len(),
        median_and_max(calls),
        median_and_max(pauses)
    );
}

/// "median Nms, max Nms" of `times` (not empty).
fn median_and_max(mut times: Vec<Duration>) -> String {
    times.sort();
    format!("median {:.0}ms, max {:.0}ms", ms(percentile(&times, 0.5)), ms(times[times.len() - 1]))
}

/// A rolling restart's step: the leader is stopped with SIGTERM, as an orchestrator stops
/// it, while a [`PauseWriter`] writes, and is started again once it has exited.
async fn restarts(cluster: &mut Controllers, client: &Client, endpoints: &[String], count: usize) {
    let (mut stops, mut pauses, mut unclean) = (Vec::new(), Vec::new(), 0);
    for k in 0..count {
        let leader = leader_of(client).await;
        let writer = PauseWriter::start(endpoints);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        let exited = tokio::task::block_in_place(|| cluster.terminate(leader, Duration::from_secs(10)));
        let stop = asked.elapsed();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pause = writer.pause_since(asked).await;
        if !exited.is_some_and(|s| s.success()) {
            unclean += 1;
            println!("  restart {}: controller-{leader} did not exit cleanly within 10 s: {exited:?}", k + 1);
        }
        if pause > SLOW_TRANSFER {
            println!("  restart {} (ended at Unix time {:.3}): controller-{leader}, the pause {:.0}ms", k + 1, unix_now(), ms(pause));
        }
        stops.push(stop);
        pauses.push(pause);
        cluster.start(leader, leader == 1).expect("restarting the stopped controller");
        caught_up(cluster, client, leader).await;
    }
    if stops.is_empty() {
        return;
    }
    println!(
        "leader stopped with SIGTERM and restarted, {} times: SIGTERM to exit {}; a writer's longest pause {}; {unclean} not clean",
        stops.len(),
        median_and_max(stops),
        median_and_max(pauses)
    );
}

/// Waits until restarted controller `id` knows the leader and has applied what it committed.
async fn caught_up(cluster: &Controllers, client: &Client, id: u64) {
    let restarted = Client::new(vec![cluster.addr(id).to_string()]);
    loop {
        if let (Ok(s), Ok(l)) = (restarted.node_status(cluster.addr(id)).await, client.cluster_status().await) {
            if s.leader_id != 0 && s.applied_index >= l.commit_index {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
