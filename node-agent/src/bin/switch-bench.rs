//! `switch-bench`: the router with two sim-infer backends under load from concurrent
//! clients; performs N active-set switches back and forth and prints the switch gap
//! (decision → first response served by the new backend), the pointer-swap time and the
//! drain time of the old backend, p50/p99/max, plus failed requests. GSLICE reports under
//! 100 µs of idle time for its switch-over (gslice.txt Sec. 3.2.4); this prints ours.

use anyhow::Context;
use clap::Parser;
use hdrhistogram::Histogram;
use node_agent::router::{serve, Backend, BackendSpec, Router, RouterConfig};
use node_agent::sim_infer::{self, model_shape, Placement, ShapeServiceTime, SimInferConfig};
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use proto::open_inference;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

#[derive(Debug, Parser)]
#[command(about = "Measures the router's active/shadow switch under load")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    switches: u32,
    #[arg(long, default_value_t = 8)]
    clients: u32,
    #[arg(long, default_value = "mobilenet")]
    model: String,
    /// Multiplies the sim backends' service times.
    #[arg(long, default_value_t = 0.25)]
    time_scale: f64,
    /// Pause after each switch completes (drained), µs.
    #[arg(long, default_value_t = 200)]
    pause_us: u64,
}

/// The switch waiting for its first response from the new backend.
struct Pending {
    target: String,
    decided: Instant,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Option<Pending>>,
    first_served: Mutex<Option<Duration>>,
    served: Notify,
    ok: AtomicU64,
    failed: AtomicU64,
    mismatched: AtomicU64,
    stop: AtomicBool,
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000_000, 3)?)
}

fn row(name: &str, h: &Histogram<u64>) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    format!(
        "{name:<44} {:>10.1} {:>10.1} {:>10.1} {:>8}",
        us(h.value_at_quantile(0.5)),
        us(h.value_at_quantile(0.99)),
        us(h.max()),
        h.len()
    )
}

async fn client(addr: String, id_base: u64, shared: Arc<Shared>) -> anyhow::Result<()> {
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.context("client connect")?;
    let mut n = 0u64;
    while !shared.stop.load(Relaxed) {
        let request_id = id_base + n;
        n += 1;
        let req = open_inference::fp32_request("bench", &request_id.to_string(), 1, 1, 0.0);
        match c.model_infer(req).await {
            Ok(r) => {
                let r = r.into_inner();
                if r.id != request_id.to_string() {
                    shared.mismatched.fetch_add(1, Relaxed);
                }
                shared.ok.fetch_add(1, Relaxed);
                let mut pending = shared.pending.lock().unwrap_or_else(|p| p.into_inner());
                if pending.as_ref().is_some_and(|p| p.target == open_inference::served_by(&r)) {
                    if let Some(p) = pending.take() {
                        *shared.first_served.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.decided.elapsed());
                        shared.served.notify_one();
                    }
                }
            }
            Err(status) => {
                shared.failed.fetch_add(1, Relaxed);
                eprintln!("request {request_id} failed: {status}");
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shape = model_shape(&args.model).map_err(anyhow::Error::msg)?;
    let sim = |id: &str, gpcs: u8, seed| SimInferConfig {
        id: id.into(),
        model: args.model.clone(),
        placement: Placement { mig_gpcs: gpcs, time_scale: args.time_scale, ..Placement::default() },
        max_batch: 8,
        batch_window: Duration::from_micros(500),
        seed,
    };
    let a = sim_infer::spawn(sim("a@3g", 3, 1), "127.0.0.1:0").await?;
    let b = sim_infer::spawn(sim("b@4g", 4, 2), "127.0.0.1:0").await?;
    let backend = |id: &str, addr: std::net::SocketAddr, gpcs| {
        Backend::connect_lazy(BackendSpec { id: id.into(), addr: addr.to_string(), gpcs, max_batch: 8, model: args.model.clone() })
    };
    let (ba, bb) = (backend("a@3g", a.addr, 3)?, backend("b@4g", b.addr, 4)?);
    let config = RouterConfig::new("bench", 100.0);
    let model = Arc::new(ShapeServiceTime { shape, time_scale: args.time_scale });
    let router = Router::new(config, model, vec![Arc::clone(&ba)])?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let router_addr = listener.local_addr()?.to_string();
    let (stop_router, router_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(router.clone(), listener, async {
        let _ = router_stopped.await;
    }));

    let shared = Arc::new(Shared::default());
    let clients: Vec<_> =
        (0..args.clients).map(|i| tokio::spawn(client(router_addr.clone(), u64::from(i) << 40, Arc::clone(&shared)))).collect();
    // Warm up: every client connected and both backends' channels open.
    tokio::time::sleep(Duration::from_millis(300)).await;
    router.set_active(vec![Arc::clone(&bb)]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    router.set_active(vec![Arc::clone(&ba)]);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (mut swap_h, mut gap_h, mut drain_h) = (histogram()?, histogram()?, histogram()?);
    let mut unresolved = 0u32;
    let started = Instant::now();
    for i in 0..args.switches {
        let target = if i % 2 == 0 { &bb } else { &ba };
        let decided = Instant::now();
        *shared.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(Pending { target: target.id().to_string(), decided });
        let swap = router.set_active(vec![Arc::clone(target)]);
        swap_h.saturating_record(u64::try_from(swap.store_time.as_nanos()).unwrap_or(u64::MAX).max(1));
        if tokio::time::timeout(Duration::from_secs(5), shared.served.notified()).await.is_err() {
            unresolved += 1;
            shared.pending.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        if let Some(gap) = shared.first_served.lock().unwrap_or_else(|p| p.into_inner()).take() {
            gap_h.saturating_record(u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX).max(1));
        }
        for old in swap.retired() {
            old.drained().await;
        }
        drain_h.saturating_record(u64::try_from(decided.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1));
        tokio::time::sleep(Duration::from_micros(args.pause_us)).await;
    }
    let elapsed = started.elapsed();
    shared.stop.store(true, Relaxed);
    for c in clients {
        c.await??;
    }
    let _ = stop_router.send(());
    server.await??;
    a.drain_and_stop().await?;
    b.drain_and_stop().await?;

    println!(
        "switch-bench: {} switches between a@3g and b@4g ({}, time scale {}), {} clients, {:.1} s",
        args.switches,
        args.model,
        args.time_scale,
        args.clients,
        elapsed.as_secs_f64()
    );
    println!("{:<44} {:>10} {:>10} {:>10} {:>8}", "metric (µs)", "p50", "p99", "max", "count");
    println!("{}", row("pointer swap (ArcSwap store)", &swap_h));
    println!("{}", row("decision -> first response from new backend", &gap_h));
    println!("{}", row("decision -> old backend drained", &drain_h));
    println!(
        "requests: {} ok, {} failed, {} answered with a wrong id; switches without a response from the new backend within 5 s: {}",
        shared.ok.load(Relaxed),
        shared.failed.load(Relaxed),
        shared.mismatched.load(Relaxed),
        unresolved
    );
    Ok(())
}
