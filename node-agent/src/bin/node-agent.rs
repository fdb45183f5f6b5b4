//! gpuplane node agent: registers its GPUs with the controllers, applies the desired MIG
//! layout, MPS shares and workload processes, and reports what it observes.
//!
//!   node-agent --config agent.toml

use clap::Parser;
use node_agent::config::AgentConfig;
use node_agent::runtime::Agent;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(version, about = "gpuplane node agent")]
struct Args {
    /// Agent configuration file (TOML).
    #[arg(long, short)]
    config: PathBuf,
    /// Plaintext to the controllers, no certificate (development only).
    #[arg(long)]
    insecure: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let mut cfg = match AgentConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent: {e}");
            return ExitCode::from(2);
        }
    };
    cfg.insecure |= args.insecure;
    if cfg.insecure {
        tracing::warn!("node-agent runs with --insecure: PLAINTEXT to the controllers, no certificate. Development only.");
    }
    let agent = match Agent::open(cfg) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("node-agent: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = agent.start_telemetry().await {
        eprintln!("node-agent: {e}");
        return ExitCode::from(1);
    }
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down; workload processes keep running");
    };
    agent.run(shutdown).await;
    ExitCode::SUCCESS
}
