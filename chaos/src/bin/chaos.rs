//! The chaos runner.
//!
//!   chaos real --scenario ci|kills [--kills 50] [--settle-seconds 2] [--report-json FILE]
//!
//! `real` starts real controller and node-agent processes (they must be next to this
//! binary: `cargo build --release` builds them all), each in its own network namespace
//! (needs root), runs a recorded client workload and injects faults; it prints a report and
//! exits 1 when an acknowledged write was lost, the history is not linearizable, or a fault
//! did not play out as it must.

use std::path::PathBuf;
use std::process::ExitCode;

use chaos::real::scenario::{self, Options, Scenario};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "chaos", about = "Chaos testing of gpuplane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Real controller and agent processes under faults.
    Real(RealArgs),
}

#[derive(clap::Args)]
struct RealArgs {
    #[arg(long, value_enum, default_value = "ci")]
    scenario: Scenario,
    /// Leader kills (`--scenario kills`).
    #[arg(long, default_value_t = 50)]
    kills: usize,
    /// Steady seconds between two faults.
    #[arg(long, default_value_t = 2.0)]
    settle_seconds: f64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Keys (registers) the clients share.
    #[arg(long, default_value_t = 4)]
    keys: usize,
    /// Keep logs and data dirs here (default: a temporary dir, kept only when the run fails).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    report_json: Option<PathBuf>,
}

fn real(args: RealArgs) -> Result<bool, String> {
    if args.clients == 0 || args.keys == 0 {
        return Err("--clients and --keys: must be at least 1".into());
    }
    if !(args.settle_seconds >= 0.0 && args.settle_seconds.is_finite()) {
        return Err(format!("--settle-seconds: must be a finite number ≥ 0, got {}", args.settle_seconds));
    }
    let opts = Options {
        scenario: args.scenario,
        kills: args.kills,
        settle_s: args.settle_seconds,
        clients: args.clients,
        keys: args.keys,
        dir: args.dir,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(|e| format!("tokio runtime: {e}"))?;
    let report = runtime.block_on(scenario::run(&opts))?;
    print!("{}", report.table());
    if let Some(path) = args.report_json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("--report-json {}: {e}", path.display()))?;
    }
    Ok(report.passed())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Real(args) => real(args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}
