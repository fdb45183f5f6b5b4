//! Benchmarks gpuplane's provisioning strategies and compares them with published plans.
//!
//!   cargo run --release -p planner --bin plan-bench -- [--anchors DIR] [--runs N] [--detail]
//!
//! Prints, per strategy: GPUs used, GPCs (MIG) or total MPS share (in GPUs) used, the lower
//! bound, the refused services and the median planning time over `--runs` runs, for
//!
//! 1. synthetic fleets of 10, 100, 1,000 and 10,000 services on a heterogeneous fleet
//!    (always; generated from the project's own example models, see `fleet.rs`), and the
//!    GPUs the 1,000-service fleet takes with its 20 tenants shared, mig or dedicated
//!    (`isolation.rs`);
//! 2. with the published reference data (`--anchors DIR`, `$GPUPLANE_ANCHORS`, or
//!    `../shared/anchors`; none of it is part of this repository):
//!    - every row of the ParvaGPU SLO files against the published deployment maps
//!      (`parva.rs`),
//!    - iGniter's motivation example against the paper's one-GPU plan (`igniter.rs`).
//!
//! Without the reference data the synthetic part still runs and the other sections are
//! skipped with a one-line notice (exit status 0). Targets (1,000 services by any strategy
//! in under 50 ms, 10,000 in under 1 s) are printed beside the timings, never asserted.

mod bounds;
mod fleet;
mod igniter;
mod isolation;
mod parva;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "plan-bench [--anchors DIR] [--runs N] [--detail]";

pub struct Args {
    anchors: PathBuf,
    runs: usize,
    /// Print each ParvaGPU scenario's segment mixes per service (published, ParvaGPU, exact).
    detail: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut anchors = std::env::var_os("GPUPLANE_ANCHORS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("../shared/anchors"));
    let mut runs = 21;
    let mut detail = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--anchors" => anchors = it.next().ok_or("--anchors: expected a directory")?.into(),
            "--runs" => {
                runs = it.next().and_then(|v| v.parse().ok()).filter(|&n: &usize| n > 0).ok_or("--runs: expected a positive integer")?
            }
            "--detail" => detail = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?} (usage: {USAGE})")),
        }
    }
    Ok(Args { anchors, runs, detail })
}

/// Median wall-clock time of `runs` calls of `f`.
pub fn median_time(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn run(args: &Args) -> Result<(), String> {
    fleet::run(args.runs);
    isolation::run();
    let parva_dir = args.anchors.join("parvagpu");
    let igniter_file = args.anchors.join("igniter/config.jsonl");
    if !parva_dir.is_dir() && !igniter_file.is_file() {
        println!(
            "\n{}: no published reference data there; ParvaGPU and iGniter sections skipped (pass --anchors DIR or set GPUPLANE_ANCHORS)",
            args.anchors.display()
        );
        return Ok(());
    }
    if parva_dir.is_dir() {
        parva::run(&parva_dir, args.runs, args.detail)?;
    } else {
        println!("\n{} not found: ParvaGPU scenarios skipped", parva_dir.display());
    }
    if igniter_file.is_file() {
        igniter::run(&args.anchors, args.runs)?;
    } else {
        println!("\n{} not found: iGniter motivation example skipped", igniter_file.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plan-bench: {e}");
            ExitCode::from(2)
        }
    }
}
