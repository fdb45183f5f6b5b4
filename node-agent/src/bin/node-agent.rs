//! gpuplane node agent: registers its GPUs with the controllers, applies the desired MIG
//! layout, MPS shares and workload processes, and reports what it observes.
//!
//!   node-agent --config agent.toml [--node NAME] [--advertise HOST:PORT]

use clap::Parser;
use node_agent::config::{AgentConfig, HostOverrides};
use node_agent::runtime::Agent;
use node_agent::telemetry::tracing::{init, otlp_endpoint};
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
    /// This node's name, replacing `node` of the file (one file for many hosts).
    #[arg(long, env = "GPUPLANE_NODE")]
    node: Option<String>,
    /// host:port registered for this node, replacing `advertise` of the file.
    #[arg(long, env = "GPUPLANE_ADVERTISE")]
    advertise: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let overrides = HostOverrides { node: args.node, advertise: args.advertise };
    let mut cfg = match AgentConfig::load_with(&args.config, &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let endpoint = otlp_endpoint(cfg.otlp_endpoint.as_deref());
    let _tracing = match init("gpuplane-agent", "info", endpoint.as_deref()) {
        Ok(guard) => guard,
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
