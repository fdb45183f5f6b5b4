//! `fleet-sim`: a day of traffic on a fleet, through gpuplane's own planning and
//! autoscaling code in simulated time, against three baselines (README, "What-if fleet
//! simulator").
//!
//!   fleet-sim                                   the built-in scenario (200 services, 20 tenants, 24 h)
//!   fleet-sim -f fleet.yaml [--trace t.csv]     your manifests, with a trace or the built-in curves

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fleetsim::scenario::Scenario;
use fleetsim::traffic::Traffic;
use fleetsim::Options;

#[derive(Parser)]
#[command(name = "fleet-sim", about = "What-if fleet simulator: gpuplane against the baselines over a day of traffic")]
struct Args {
    /// Manifests (as `gpuctl apply -f`); without, the built-in scenario.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Traffic trace, `time_s,service,rate_rps` lines; without, each service's built-in curve.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Simulated hours.
    #[arg(long, default_value_t = 24.0)]
    hours: f64,
    /// Services of the built-in scenario.
    #[arg(long, default_value_t = 200)]
    services: usize,
    /// Tenants of the built-in scenario.
    #[arg(long, default_value_t = 20)]
    tenants: usize,
    /// Seed of the built-in scenario, its traffic and the serving noise.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A host failure at this simulated second (repeatable).
    #[arg(long = "fail-at")]
    fail_at: Vec<u32>,
    /// Host failures per simulated day across the fleet, at random times from the seed.
    #[arg(long, default_value_t = 0.0)]
    failures_per_day: f64,
    /// gpuplane: seconds a changed workload takes to serve in its new configuration (the
    /// old one serves meanwhile).
    #[arg(long, default_value_t = 10)]
    reconfigure_s: u32,
    /// Instance type of the homogeneous-autoscaling baseline.
    #[arg(long, default_value = "a100-1x")]
    homogeneous_type: String,
    /// gpuplane's autoscaler: how long saturation must last before a service is sized up, s.
    #[arg(long, default_value_t = 60.0)]
    scale_window_s: f64,
    /// gpuplane's autoscaler: how long lower load must last before a service is sized down, s.
    #[arg(long, default_value_t = 300.0)]
    cooldown_s: f64,
    /// gpuplane's autoscaler: the saturation capacity is sized to (HetSev's 0.8).
    #[arg(long, default_value_t = 0.8)]
    target_saturation: f64,
    /// Writes the report as JSON here.
    #[arg(long)]
    report_json: Option<PathBuf>,
    /// Writes cost.svg, capacity.svg and attainment.svg into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Services a run simulates at most: each holds a rate per simulated second.
const MAX_SERVICES: usize = 2000;
/// Services times simulated seconds at most: the rates held (8 bytes each), 1.4 GB at this
/// bound (2,000 services for a day, or 200 for 10 days).
const MAX_SERVICE_SECONDS: u64 = 2000 * 86_400;
/// Host failures a run injects at most.
const MAX_FAILURES: usize = 1000;

fn within_service_seconds(services: usize, seconds: u32, hours: f64) -> Result<(), String> {
    if services as u64 * u64::from(seconds) > MAX_SERVICE_SECONDS {
        return Err(format!(
            "{services} services for {hours} simulated hours is over the bound of {MAX_SERVICE_SECONDS} service-seconds (2,000 services for a day); shorten --hours"
        ));
    }
    Ok(())
}

fn run(args: Args) -> Result<(), String> {
    if args.fail_at.len() > MAX_FAILURES {
        return Err(format!("at most {MAX_FAILURES} --fail-at, got {}", args.fail_at.len()));
    }
    if args.file.is_none() && !(1..=MAX_SERVICES).contains(&args.services) {
        return Err(format!("--services must be in 1..={MAX_SERVICES}, got {}", args.services));
    }
    if args.tenants == 0 || args.tenants > args.services.max(1) {
        return Err(format!("--tenants must be in 1..={} (the services), got {}", args.services, args.tenants));
    }
    if !(args.hours > 0.0 && args.hours <= 24.0 * 7.0) {
        return Err(format!("--hours must be in (0, 168], got {}", args.hours));
    }
    if !(args.failures_per_day >= 0.0 && args.failures_per_day <= 1000.0) {
        return Err(format!("--failures-per-day must be in [0, 1000], got {}", args.failures_per_day));
    }
    if args.reconfigure_s > 3600 {
        return Err(format!("--reconfigure-s must be at most 3600, got {}", args.reconfigure_s));
    }
    if !(args.target_saturation > 0.0 && args.target_saturation <= 1.0) {
        return Err(format!("--target-saturation must be in (0, 1], got {}", args.target_saturation));
    }
    if !(args.scale_window_s > 0.0 && args.scale_window_s <= 86_400.0) {
        return Err(format!("--scale-window-s must be in (0, 86400], got {}", args.scale_window_s));
    }
    if !(args.cooldown_s >= 0.0 && args.cooldown_s <= 86_400.0) {
        return Err(format!("--cooldown-s must be in [0, 86400], got {}", args.cooldown_s));
    }
    let seconds = (args.hours * 3600.0).round() as u32;
    // The built-in scenario's size is known before it is built; a manifest's after.
    if args.file.is_none() {
        within_service_seconds(args.services, seconds, args.hours)?;
    }
    let mut scenario = match &args.file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let name = path.display().to_string();
            let format = controlplane::manifest::Format::from_path(&name);
            let resources = controlplane::manifest::parse(&name, &text, format).map_err(|e| e.to_string())?;
            Scenario::from_resources(&resources)?
        }
        None => Scenario::builtin(args.services, args.tenants, args.seed)?,
    };
    if scenario.services.is_empty() || scenario.services.len() > MAX_SERVICES {
        return Err(format!("a scenario needs 1 to {MAX_SERVICES} services with a rate, this one has {}", scenario.services.len()));
    }
    within_service_seconds(scenario.services.len(), seconds, args.hours)?;
    scenario.failures_at_s = args.fail_at.clone();
    let left = MAX_FAILURES - scenario.failures_at_s.len();
    scenario.failures_at_s.extend(fleetsim::scenario::failure_times(args.failures_per_day, seconds, args.seed, left));
    let traffic = match &args.trace {
        Some(path) => {
            let known = scenario.services.iter().map(|s| s.name.clone()).collect();
            Traffic::from_csv(&std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?, seconds, &known)?
        }
        None => Traffic::generate(&scenario.shapes, seconds, args.seed),
    };
    let mut options = Options { homogeneous_type: args.homogeneous_type.clone(), seed: args.seed, ..Options::default() };
    options.gpuplane.autoscale.window_s = args.scale_window_s;
    options.gpuplane.autoscale.cooldown_s = args.cooldown_s;
    options.gpuplane.autoscale.saturation_threshold = args.target_saturation;
    options.gpuplane.reconfigure_s = args.reconfigure_s;
    let report = fleetsim::run(&scenario, &traffic, &options)?;
    print!("{}", report.table());
    if let Some(path) = &args.report_json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(dir) = &args.plots {
        for p in fleetsim::plot::write_plots(&report, dir)? {
            println!("wrote {}", p.display());
        }
    }
    Ok(())
}
