//! The chaos runner.
//!
//!   chaos sim [--seeds 200] [--from 0] | --seed S [--trace] [--soak]
//!   chaos real --scenario ci|kills|hostile [--kills 50] [--settle-seconds 2] [--report-json FILE]
//!
//! `sim` runs seeded deterministic simulations (turmoil) of 3 or 5 controllers, agents and
//! clients under faults; a failing seed is printed with the command that replays it.
//! `real` starts real controller and node-agent processes (they must be next to this
//! binary: `cargo build --release` builds them all), each in its own network namespace
//! (needs root), runs a recorded client workload and injects faults; it prints a report and
//! exits 1 when an acknowledged write was lost, the history is not linearizable, or a fault
//! did not play out as it must.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use chaos::real::scenario::{self, Options, Scenario};
use chaos::sim::{run_seed, SimOptions, Totals};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "chaos", about = "Chaos testing of gpuplane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seeded simulations of 3 or 5 controllers, agents and clients under faults; a failing
    /// seed is printed with the command that replays it.
    Sim(SimArgs),
    /// Real controller and agent processes under faults.
    Real(RealArgs),
}

#[derive(clap::Args)]
struct SimArgs {
    /// Run this one seed and print what happened (replays a failure).
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// How many seeds to run.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Longer runs: 5 controllers, 60 s of faults, 30 faults per seed.
    #[arg(long)]
    soak: bool,
    /// With --seed: print every event of the run's trace.
    #[arg(long, requires = "seed")]
    trace: bool,
    /// With --seed: write turmoil's network log (every segment sent, held, dropped and
    /// delivered, and every step) to this file, to find where two runs of a seed part.
    #[arg(long, requires = "seed")]
    net_log: Option<PathBuf>,
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
    /// Keys (registers) the clients share [default: 4 for `ci`, 256 for `kills`: the
    /// linearizability check's cost grows faster than linearly with one key's history, and
    /// a long run spreads its operations over more keys to keep each history short].
    #[arg(long)]
    keys: Option<usize>,
    /// Keep logs and data dirs here (default: a temporary dir, kept only when the run fails).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    report_json: Option<PathBuf>,
}

/// Sends turmoil's trace-level network events to `path`, without wall-clock timestamps so
/// that two runs of one seed can be compared line by line.
fn log_network_to(path: &std::path::Path) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("--net-log {}: {e}", path.display()))?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("turmoil=trace"))
        .without_time()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init()
        .map_err(|e| format!("--net-log: {e}"))
}

fn sim(args: SimArgs) -> ExitCode {
    if let Some(path) = &args.net_log {
        if let Err(e) = log_network_to(path) {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    }
    let mut opts = if args.soak { SimOptions::soak() } else { SimOptions::ci() };
    opts.keep_trace = args.trace;
    let seeds = match args.seed {
        Some(seed) => seed..seed + 1,
        None => args.from..args.from + args.seeds,
    };
    let started = Instant::now();
    let mut totals = Totals::default();
    for seed in seeds {
        match run_seed(seed, &opts) {
            Ok(report) => {
                if args.seed.is_some() {
                    println!("seed {seed}: passed after {:.1} s simulated", report.simulated.as_secs_f64());
                    for f in &report.faults {
                        println!("  fault {f}");
                    }
                    println!(
                        "  agents converged {:.1} s after healing ({} with work)",
                        report.converged_after.as_secs_f64(),
                        report.agents_with_work
                    );
                    println!("  {:?}", report.verdict);
                    println!("  trace: {} events, digest {:016x}", report.events, report.trace_digest);
                    for line in &report.trace {
                        println!("    {line}");
                    }
                }
                totals.add(&report);
                if totals.seeds % 20 == 0 {
                    eprintln!("{} seeds passed ({:.0} s)", totals.seeds, started.elapsed().as_secs_f64());
                }
            }
            Err(failure) => {
                eprintln!("{failure}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("{totals}");
    println!("wall time {:.1} s", started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn real(args: RealArgs) -> Result<bool, String> {
    let keys = args.keys.unwrap_or(match args.scenario {
        Scenario::Ci => 4,
        Scenario::Kills => 256,
        Scenario::Hostile => 16,
    });
    if args.clients == 0 || keys == 0 {
        return Err("--clients and --keys: must be at least 1".into());
    }
    if !(args.settle_seconds >= 0.0 && args.settle_seconds.is_finite()) {
        return Err(format!("--settle-seconds: must be a finite number ≥ 0, got {}", args.settle_seconds));
    }
    let opts =
        Options { scenario: args.scenario, kills: args.kills, settle_s: args.settle_seconds, clients: args.clients, keys, dir: args.dir };
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
    match Cli::parse().command {
        Command::Sim(args) => sim(args),
        Command::Real(args) => match real(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("chaos: {e}");
                ExitCode::from(2)
            }
        },
    }
}
