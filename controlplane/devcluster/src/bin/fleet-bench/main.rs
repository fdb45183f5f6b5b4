//! Fleet-scale benchmark: 3 controller processes on loopback and N simulated agents in this
//! process (8 A100-80GB GPUs each; 100 agents per gRPC connection to each controller). Each
//! agent registers its Node, watches its desired state and reports once a second echoing it.
//! Then one resnet50 Service per 4 hosts is applied, one Service's rate is raised by 25%,
//! and every Service's by 10% (a fleet-wide re-plan), each time waiting for the agents to
//! go quiet; then 1% of the agents die at once, and a controller is replaced. Prints a table per N and, with `--report-json FILE`, a JSON list (one object
//! per N).
//!
//!   cargo build --release --bins && target/release/fleet-bench [--agents 1000] [--report-json FILE]
//!
//! Latencies are measured by this process's clock from the sending of the first write to
//! the arrival of the desired state at the agent; the agents share the machine's cores
//! with the controllers, so figures include that contention. The controllers run at a
//! lower CPU priority (`--controllers-nice`, default 8), so that the agents, which stand in
//! for hosts of their own, are not the ones kept waiting.

mod agents;
mod measure;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use controlplane::client::Client;
use devcluster::local::{LocalCluster, LoopTimings};
use devcluster::synthetic_fleet::service;
use devcluster::Binaries;

use agents::Observed;
use measure::{percentile, ControllerProbe, Row};

/// mimalloc, not glibc's malloc: see the dependency's comment in Cargo.toml.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Run one fleet size (default: 100, 1,000 and 10,000).
    #[arg(long)]
    agents: Option<usize>,
    /// Write the results as a JSON list to this file.
    #[arg(long)]
    report_json: Option<PathBuf>,
    /// Request rate of each Service (req/s).
    #[arg(long, default_value_t = 30_000.0)]
    rate: f64,
    /// Hosts per Service.
    #[arg(long, default_value_t = 4)]
    hosts_per_service: usize,
    /// Agents per client connection (each group of agents has a connection to each
    /// controller, so fewer per connection need more open files: at 1, 10,000 agents need
    /// about 30,000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    agents_per_connection: u64,
    /// Seconds without any new desired state that end a fan-out measurement.
    #[arg(long, default_value_t = 4.0)]
    quiet_s: f64,
    /// Give up waiting for a phase after this many seconds.
    #[arg(long, default_value_t = 300.0)]
    phase_timeout_s: f64,
    /// Keep each run's directory (the controllers' data and logs) and print where it is.
    #[arg(long)]
    keep_dir: bool,
    /// CPU nice value of the controller processes (0: the simulator's own). The simulated
    /// agents stand in for hosts with CPUs of their own; on this machine they share its
    /// cores with the controllers, and at the same priority their reports' round trips
    /// counted their own waits for a core (report p99 57-531 ms over 12 runs at 10,000 hosts,
    /// 23 and 50 ms in 2 runs with the controllers at nice 8, every other figure alike). A
    /// lower priority for the controllers can only make their own figures worse.
    #[arg(long, default_value_t = 8)]
    controllers_nice: i32,
    /// Before the one-Service change, a second tenant without a quota (the default one)
    /// applies this many of the hardest Services the API admits for it
    /// (`HOSTILE_RATE` req/s of resnet50 each, about 950 GPUs): the passes, the leader's
    /// memory and the other tenant's change after it show what such a tenant costs.
    #[arg(long, default_value_t = 0)]
    hostile: usize,
}

/// The largest rate of resnet50 the admission check lets a tenant with the default quota
/// (1,000 GPUs-worth) create: one such Service planned alone needs about 950 GPUs.
const HOSTILE_RATE: f64 = 7_500_000.0;

fn main() {
    let args = Args::parse();
    let sizes = args.agents.map_or(vec![100, 1_000, 10_000], |n| vec![n]);
    let bins = match Binaries::beside_current_exe("fleet-bench") {
        Ok(b) => b,
        Err(e) => {
            eprintln!("fleet-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = open_files_for(sizes.iter().copied().max().unwrap_or(0), args.agents_per_connection) {
        eprintln!("fleet-bench: {e}");
        std::process::exit(2);
    }
    let mut rows = Vec::new();
    for n in sizes {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
        let row = rt.block_on(run(n, &args, bins.clone()));
        rt.shutdown_timeout(Duration::from_secs(1));
        measure::print_table(std::slice::from_ref(&row));
        rows.push(row);
    }
    println!();
    measure::print_table(&rows);
    if let Some(path) = &args.report_json {
        let list: Vec<serde_json::Value> = rows.iter().map(Row::to_json).collect();
        std::fs::write(path, serde_json::to_string_pretty(&list).expect("JSON")).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Files the controllers and this process may hold open beside the agents' connections.
const OTHER_OPEN_FILES: u64 = 1_024;

/// Raises the open-file limit for `agents` in groups of `per_connection` (a connection to
/// each of the 3 controllers per group, in this process and in the controllers, which
/// inherit the limit); the reason when this machine's hard limit is too low. Run out of
/// files, agents' connections fail with "tcp open error" and healthy nodes are marked.
fn open_files_for(agents: usize, per_connection: u64) -> Result<(), String> {
    let groups = (agents as u64).div_ceil(per_connection);
    // Saturating: `--agents` is the operator's number, unbounded here.
    let needed = groups.saturating_mul(3).saturating_add(OTHER_OPEN_FILES);
    let limit = controlplane::os_limits::raise_open_files_to_hard().unwrap_or(u64::MAX);
    if needed <= limit {
        return Ok(());
    }
    let fewest = (agents as u64).saturating_mul(3).div_ceil(limit.saturating_sub(OTHER_OPEN_FILES).max(1));
    Err(format!(
        "--agents-per-connection {per_connection}: {agents} agents in {groups} groups need about {needed} open files (a \
         connection to each of 3 controllers per group), over this machine's limit of {limit} (ulimit -Hn); use \
         --agents-per-connection {fewest} or more"
    ))
}

/// The leader's log is settled when it grows by less than this in a second: reports
/// change no status, only a handful of writes go through.
const SETTLED_BYTES_PER_S: u64 = 256 * 1024;

async fn run(n: usize, args: &Args, bins: Binaries) -> Row {
    let dir = tempfile::tempdir().expect("temporary directory");
    let timings = LoopTimings {
        provision_interval_s: 30.0,
        heartbeat_ms: 1000,
        missed_heartbeats: 5,
        scale_window_s: 3600.0,
        cooldown_s: 3600.0,
        launch_time_scale: 1.0,
    };
    let mut cluster = LocalCluster::new(dir.path(), bins, Default::default(), timings).expect("ports for the controllers");
    let nice = args.controllers_nice;
    cluster.controllers.set_prepare(move |_, cmd| {
        devcluster::process::run_at_nice(cmd, nice);
        Ok(())
    });
    for id in 1..=3 {
        cluster.start_controller(id).expect("starting a controller");
    }
    let servers = cluster.servers();
    let admin = Client::new(servers.clone());
    // The demo's GPU models, instance types and profiles, and a tenant for the Services.
    for r in devcluster::synthetic_fleet::base_resources() {
        while let Err(e) = admin.put(r.clone(), proto::WriteMode::Unspecified).await {
            eprintln!("seeding {} {}: {e}; retrying", r.kind, r.name);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let probe = ControllerProbe::new(&cluster);
    let start_terms = probe.terms().await;
    let cpu_start = probe.cpu_seconds();
    let wall_start = Instant::now();
    let nodes_seen = measure::NodeWatch::watch(probe.followers_first().await);

    // 1. Registration.
    let observed = Arc::new(Observed::default());
    let started = Instant::now();
    let machine = measure::MachineBusy::start();
    // One thread of its own: 2,000 reports a second at most (paced) are little work, and
    // it runs nothing else.
    let report_runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("reports").enable_all().build().expect("tokio runtime");
    tokio::spawn(agents::probe_runtime_lag(observed.clone(), |o| &o.runtime_lag_ms));
    report_runtime.spawn(agents::probe_runtime_lag(observed.clone(), |o| &o.report_runtime_lag_ms));
    for (g, chunk) in (0..n).collect::<Vec<_>>().chunks(args.agents_per_connection as usize).enumerate() {
        let clients = agents::GroupClients {
            watches: agents::group_client(&servers, g),
            reports: agents::group_client(&servers, g),
            report_runtime: report_runtime.handle().clone(),
        };
        agents::spawn_group(clients, chunk[0]..chunk[chunk.len() - 1] + 1, observed.clone());
    }
    let timeout = Duration::from_secs_f64(args.phase_timeout_s);
    let registered_all_s = loop {
        let done = observed.registered.lock().unwrap().len();
        if done == n {
            break observed.registered.lock().unwrap().iter().max().map(|t| t.duration_since(started).as_secs_f64());
        }
        if started.elapsed() > timeout {
            eprintln!("registration: {done} of {n} after {timeout:?}");
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reports_from = observed.report_ms.lock().unwrap().len();
    let with_gpus_from = observed.reports_with_gpus.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "[{:>6.1} s] {n} hosts: registered in {registered_all_s:?} s; applying {} services",
        started.elapsed().as_secs_f64(),
        n.div_ceil(args.hosts_per_service)
    );

    // 2. The Services: every agent with work holds it.
    let services = n.div_ceil(args.hosts_per_service);
    let (applied, apply_puts_s) = put_all(&admin, (0..services).map(|i| service(i, args.rate))).await;
    let apply = measure::fan_out(&observed, applied, args.quiet_s, timeout, true).await;
    let with_work = observed.held.lock().unwrap().values().filter(|h| h.has_work).count();
    eprintln!("[{:>6.1} s] applied: {with_work} agents with work, last after {:?} s", started.elapsed().as_secs_f64(), apply.last_s);

    if args.hostile > 0 {
        let (_, put_s) = put_all(&admin, devcluster::synthetic_fleet::hostile_resources(args.hostile, HOSTILE_RATE)).await;
        eprintln!("[{:>6.1} s] a hostile tenant applied {} services in {put_s:.1} s", started.elapsed().as_secs_f64(), args.hostile);
    }

    // 3. One Service +25%, once the agents' status writes after the apply are through.
    let settled_one = probe.settle(SETTLED_BYTES_PER_S, timeout).await;
    let metrics_after_apply = probe.scrape_all().await;
    let bytes_before = probe.leader_log_bytes().await;
    let (one, _) = put_all(&admin, [service(0, args.rate * 1.25)]).await;
    let one_service = measure::fan_out(&observed, one, args.quiet_s, timeout, false).await;
    let bytes_after = probe.leader_log_bytes().await;
    eprintln!(
        "[{:>6.1} s] one service changed: {} agents, max {:?} s",
        started.elapsed().as_secs_f64(),
        one_service.agents,
        one_service.last_s
    );

    // 4. Every Service +10%: a fleet-wide re-plan.
    let settled_replan = probe.settle(SETTLED_BYTES_PER_S, timeout).await;
    let (all, replan_puts_s) = put_all(&admin, (0..services).map(|i| service(i, args.rate * if i == 0 { 1.25 } else { 1.1 }))).await;
    let replan = measure::fan_out(&observed, all, args.quiet_s, timeout, false).await;
    let held: BTreeMap<String, u64> = observed.held.lock().unwrap().iter().map(|(n, h)| (n.clone(), h.version)).collect();
    let replan_statuses_s = nodes_seen.statuses_written(&held, all, timeout).await;

    // 5. Dead hosts: 1% of the agents (at least 5) die at once, as hosts that lose power
    // (their streams end; the controllers relay that to the leader's failure detector).
    let settle_dead = probe.settle(SETTLED_BYTES_PER_S, timeout).await;
    let k = (n / 100).clamp(5.min(n), n);
    let step = n / k.max(1);
    let victims: BTreeSet<String> = (0..k).map(|j| agents::node_name(j * step)).collect();
    let killed = Instant::now();
    observed.kill(&victims.iter().cloned().collect::<Vec<_>>());
    let detected = nodes_seen.detected(&victims, killed, timeout).await;
    eprintln!(
        "[{:>6.1} s] {} hosts killed (after {settle_dead:.1} s of settling): marked unhealthy after {:?} s (max)",
        started.elapsed().as_secs_f64(),
        victims.len(),
        detected.as_ref().and_then(|d| d.iter().copied().reduce(f64::max))
    );

    let reports: Vec<f64> = observed.report_ms.lock().unwrap()[reports_from..].to_vec();
    // Where the slow reports are: p99 per 5 s of the run.
    let sent: Vec<(Instant, bool)> = observed.report_sent.lock().unwrap()[reports_from..].to_vec();
    let per_window = |timed: &mut dyn Iterator<Item = (Instant, f64)>| {
        let mut windows: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for (at, ms) in timed {
            windows.entry(at.duration_since(started).as_secs() / 5 * 5).or_default().push(ms);
        }
        windows
    };
    let windows = per_window(&mut sent.iter().map(|(at, _)| *at).zip(reports.iter().copied()));
    // The same, of the reports that carried the agent's GPUs (an observed state to check
    // and write) and of those that did not (a heartbeat with metrics).
    let windows_of = |with_gpus: bool| {
        per_window(&mut sent.iter().zip(reports.iter()).filter(|((_, g), _)| *g == with_gpus).map(|((at, _), ms)| (*at, *ms)))
    };
    let (full, slim) = (windows_of(true), windows_of(false));
    let lags = per_window(&mut observed.runtime_lag_ms.lock().unwrap().iter().copied());
    let report_lags = per_window(&mut observed.report_runtime_lag_ms.lock().unwrap().iter().copied());
    let busy = per_window(&mut machine.samples().into_iter());
    let p99 = |windows: &BTreeMap<u64, Vec<f64>>, from| windows.get(from).and_then(|l| percentile(l, 99.0)).unwrap_or(0.0);
    let count = |windows: &BTreeMap<u64, Vec<f64>>, from| windows.get(from).map_or(0, Vec::len);
    for (from, ms) in &windows {
        eprintln!(
            "  reports sent {from:>4}-{:<4} s: {:>6} p50 {:>6.1} p99 {:>6.1} ms ({} with GPUs: p99 {:.1}; {} without: {:.1}); the simulator's own wake-up lag p99 {:>6.1} ms (watches), {:>6.1} ms (reports); the machine's cores busy {:.2}",
            from + 5,
            ms.len(),
            percentile(ms, 50.0).unwrap_or(0.0),
            percentile(ms, 99.0).unwrap_or(0.0),
            count(&full, from),
            p99(&full, from),
            count(&slim, from),
            p99(&slim, from),
            p99(&lags, from),
            p99(&report_lags, from),
            busy.get(from).map_or(0.0, |c| c.iter().sum::<f64>() / c.len().max(1) as f64),
        );
    }
    for (error, count) in observed.report_errors.lock().unwrap().iter() {
        eprintln!("reports failed ×{count}: {error}");
    }
    let wall = wall_start.elapsed().as_secs_f64();
    let cpu_end = probe.cpu_seconds();
    let end_terms = probe.terms().await;
    // Each controller's, then this process's.
    let cores: Vec<f64> = cpu_end.iter().zip(&cpu_start).map(|(e, s)| (e - s) / wall).collect();
    let planning = probe.planning().await;
    let metrics = probe.scrape_all().await;
    let report_handler_p99_ms = measure::report_handler_p99_ms(&metrics);
    let runtime_lag_p99_ms = measure::runtime_lag_p99_ms(&metrics);
    let report_age_max_s = measure::report_age_max_s(&metrics);
    let report_age_max_after_apply_s = measure::report_age_max_between(&metrics_after_apply, &metrics);
    let row = Row {
        agents: n,
        services,
        registered_all_s,
        agents_with_work: with_work,
        apply_fanout_s: apply.last_s,
        apply_puts_s,
        one_service: one_service.clone(),
        replan_fanout_s: replan.last_s,
        replan_puts_s,
        replan_statuses_s,
        agents_changed_one_service: one_service.agents,
        agents_changed_replan: replan.agents,
        provision_pass_s: planning,
        report_p50_ms: percentile(&reports, 50.0),
        report_p99_ms: percentile(&reports, 99.0),
        report_handler_p99_ms,
        runtime_lag_p99_ms,
        report_age_max_s,
        report_age_max_after_apply_s,
        reports: reports.len(),
        reports_with_gpus: observed.reports_with_gpus.load(std::sync::atomic::Ordering::Relaxed) - with_gpus_from,
        reports_failed: observed.reports_failed.load(std::sync::atomic::Ordering::Relaxed),
        leader_changes: end_terms.iter().max().copied().unwrap_or(0).saturating_sub(start_terms.iter().max().copied().unwrap_or(0)),
        unhealthy_marked: nodes_seen.of_healthy(&victims),
        dead_hosts: victims.len(),
        dead_host_detected_p50_s: detected.as_deref().and_then(|d| percentile(d, 50.0)),
        dead_host_detected_max_s: detected.as_deref().and_then(|d| d.iter().copied().reduce(f64::max)),
        dead_host_at_leader_change_max_s: None,
        controller_cpu: cores[..cores.len() - 1].to_vec(),
        simulator_cpu: cores[cores.len() - 1],
        leader_rss_mib: probe.leader_rss_mib().await,
        raft_bytes_one_service_change: bytes_after.zip(bytes_before).map(|(a, b)| a.saturating_sub(b)),
        settled_s: [settled_one, settled_replan],
        catch_up: Default::default(),
    };
    // 6. Dead hosts around a leader change (after the count of leader changes, which this
    // one would spoil): as many others die, and the leader hands over at once, so their
    // streams' ends reach the old leader or none, and the new one learns of them only as
    // the controllers send them again.
    let row = if step >= 2 {
        let settle_transfer = probe.settle(SETTLED_BYTES_PER_S, timeout).await;
        let victims: BTreeSet<String> = (0..k).map(|j| agents::node_name(j * step + step / 2)).collect();
        let killed = Instant::now();
        observed.kill(&victims.iter().cloned().collect::<Vec<_>>());
        if let Err(e) = admin.transfer_leader(0).await {
            eprintln!("leader transfer: {}", e.message());
        }
        let detected = nodes_seen.detected(&victims, killed, timeout).await;
        let max = detected.as_deref().and_then(|d| d.iter().copied().reduce(f64::max));
        eprintln!(
            "[{:>6.1} s] {} more hosts killed and the leader handed over (after {settle_transfer:.1} s of settling): marked unhealthy after {max:?} s (max)",
            started.elapsed().as_secs_f64(),
            victims.len(),
        );
        Row { dead_host_at_leader_change_max_s: max, ..row }
    } else {
        row
    };

    // 7. Last, as it restarts a controller: a replaced controller catches up.
    let catch_up = probe.replaced_controller_catch_up(&mut cluster, &admin, timeout).await;
    eprintln!("[{:>6.1} s] a replaced controller caught up: {catch_up:?}", started.elapsed().as_secs_f64());
    let row = Row { catch_up, ..row };
    cluster.shutdown();
    report_runtime.shutdown_background();
    if args.keep_dir {
        eprintln!("kept {}", dir.keep().display());
    }
    row
}

/// Puts `resources` as `gpuctl apply` does (in batches, one after the other); returns when
/// the first was sent and how long until the last was acknowledged. Fan-out is measured
/// from the first send: what a user applying a manifest sees.
async fn put_all(client: &Client, resources: impl IntoIterator<Item = proto::Resource>) -> (Instant, f64) {
    let first_sent = Instant::now();
    for batch in controlplane::client::batches(resources.into_iter().collect()) {
        while let Err(refused) = client.put_batch(&batch).await {
            eprintln!("put of {} resources from {}: {}; retrying", batch.len(), batch[0].name, refused.status);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    (first_sent, first_sent.elapsed().as_secs_f64())
}
