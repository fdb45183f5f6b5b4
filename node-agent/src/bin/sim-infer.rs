//! `sim-infer`: a simulated inference server (see `node_agent::sim_infer`). Drains on
//! SIGTERM or Ctrl-C: in-flight requests complete, new ones get UNAVAILABLE.

use clap::Parser;
use node_agent::sim_infer::{server::serve, Placement, SimInferConfig};
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(about = "Simulated inference server speaking gpuplane's Inference gRPC API")]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SIM_INFER_LISTEN", default_value = "127.0.0.1:50151")]
    listen: String,
    /// Model shape (planner::perf::synthetic::example_models).
    #[arg(long, env = "SIM_INFER_MODEL", default_value = "resnet50")]
    model: String,
    /// MIG instance size in GPCs; 0 = the whole GPU.
    #[arg(long, env = "SIM_INFER_MIG_GPCS", default_value_t = 0)]
    mig_gpcs: u8,
    /// MPS active-thread percentage.
    #[arg(long, env = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", default_value_t = 100)]
    mps_percent: u32,
    /// Most samples per executed batch.
    #[arg(long, env = "SIM_INFER_MAX_BATCH", default_value_t = 8)]
    max_batch: u32,
    /// Dynamic batching window after a batch's first request, µs.
    #[arg(long, env = "SIM_INFER_BATCH_WINDOW_US", default_value_t = 1000)]
    batch_window_us: u64,
    /// Sum of the co-located processes' busy fractions (iGniter-style interference).
    #[arg(long, env = "SIM_INFER_COLOCATED_LOAD", default_value_t = 0.0)]
    colocated_load: f64,
    /// σ of the log-normal latency noise.
    #[arg(long, env = "SIM_INFER_NOISE_SIGMA", default_value_t = 0.1)]
    noise_sigma: f64,
    /// Noise seed.
    #[arg(long, env = "SIM_INFER_SEED", default_value_t = 1)]
    seed: u64,
    /// Multiplies every service time.
    #[arg(long, env = "SIM_INFER_TIME_SCALE", default_value_t = 1.0)]
    time_scale: f64,
    /// The simulated GPU's product or model name: its speed relative to an A100 divides
    /// every service time (planner::perf::synthetic::gpu_speed).
    #[arg(long, env = "SIM_INFER_GPU", default_value = "A100")]
    gpu: String,
    /// Reported as `served_by`; default `<model>@<gpcs>g:<port>`.
    #[arg(long, env = "SIM_INFER_ID", default_value = "")]
    id: String,
}

async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; draining on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("draining: finishing in-flight requests, refusing new ones");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    let args = Args::parse();
    let speed = planner::perf::synthetic::gpu_speed(&args.gpu)
        .ok_or_else(|| anyhow::anyhow!("--gpu {:?}: not a GPU the simulation knows (A100, H100, H200, V100, A10, L4, T4)", args.gpu))?;
    let config = SimInferConfig {
        id: args.id,
        model: args.model,
        placement: Placement {
            mig_gpcs: args.mig_gpcs,
            mps_percent: args.mps_percent,
            colocated_load: args.colocated_load,
            noise_sigma: args.noise_sigma,
            time_scale: args.time_scale / speed,
        },
        max_batch: args.max_batch,
        batch_window: Duration::from_micros(args.batch_window_us),
        seed: args.seed,
    };
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, model = %config.model, "sim-infer serving");
    serve(&config, listener, terminated()).await?;
    tracing::info!("drained; exiting");
    Ok(())
}
