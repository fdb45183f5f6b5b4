//! `chaos`: the deterministic simulation of the controller cluster (`chaos sim`).

use std::process::ExitCode;
use std::time::Instant;

use chaos::sim::{run_seed, SimOptions, Totals};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Chaos testing of the gpuplane controllers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seeded simulations of 3 or 5 controllers, agents and clients under faults; a failing
    /// seed is printed with the command that replays it.
    Sim(SimArgs),
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
}

fn sim(args: SimArgs) -> ExitCode {
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

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Sim(args) => sim(args),
    }
}
