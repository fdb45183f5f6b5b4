//! What-if fleet simulator: a day of traffic through gpuplane's own decision code in
//! simulated time (no processes, no clock), against the baselines, on the same traffic.
//!
//! * [`scenario`]: the fleet and services (manifests, or the built-in scenario);
//! * [`traffic`]: offered load per service and second (a seeded diurnal generator or a CSV);
//! * [`planning`]: the provisioner (pools, strategies, incremental re-planning);
//! * [`placement`]: the node assignment and the GSLICE tuner on the placed plan;
//! * [`policies`]: whole GPUs for the peak, ParvaGPU for the peak, homogeneous autoscaling,
//!   and gpuplane (HetSev's controller per service, the provisioner, the cheapest launches);
//! * [`fleet`]: instances, their launch latencies, failures and what they cost;
//! * [`serving`]: whether a second of load meets the SLO on what a policy gives it;
//! * [`report`] and [`plot`]: the table, the JSON and the SVG plots.

pub mod fleet;
pub mod placement;
pub mod planning;
pub mod plot;
pub mod policies;
pub mod report;
pub mod scenario;
pub mod serving;
pub mod traffic;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use policies::{Gpuplane, HomogeneousAutoscale, ParvaGpuPeak, Policy, WholeGpuPeak};
use report::{MissedWindows, PolicyReport, Report, Sample};
use scenario::Scenario;
use traffic::Traffic;

/// How a run is set up besides its scenario and traffic.
#[derive(Clone, Debug)]
pub struct Options {
    /// The instance type of the homogeneous-autoscaling baseline.
    pub homogeneous_type: String,
    /// Seed of the serving noise (the traffic has its own).
    pub seed: u64,
    /// Seconds between the samples kept for the plots.
    pub sample_every_s: u32,
    pub gpuplane: policies::GpuplaneSettings,
}

impl Default for Options {
    fn default() -> Self {
        Options { homogeneous_type: "a100-1x".into(), seed: 1, sample_every_s: 300, gpuplane: Default::default() }
    }
}

/// Runs every policy over the traffic; the report of each.
pub fn run(scenario: &Scenario, traffic: &Traffic, options: &Options) -> Result<Report, String> {
    let started = std::time::Instant::now();
    let zero = vec![0.0; traffic.seconds as usize];
    let rates: Vec<&Vec<f64>> = scenario.services.iter().map(|s| traffic.rates.get(&s.name).unwrap_or(&zero)).collect();
    let peaks: Vec<f64> = scenario.services.iter().map(|s| traffic.peak(&s.name)).collect();
    let initial: Vec<f64> = rates.iter().map(|r| r.first().copied().unwrap_or(0.0)).collect();
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(WholeGpuPeak::new(scenario, &peaks)),
        Box::new(ParvaGpuPeak::new(scenario, &peaks)),
        Box::new(HomogeneousAutoscale::new(scenario, &options.homogeneous_type, &initial)?),
        Box::new(Gpuplane::new(scenario, &initial, options.gpuplane.clone())),
    ];
    let mut reports = Vec::new();
    for policy in &mut policies {
        reports.push(simulate(policy.as_mut(), scenario, &rates, traffic.seconds, options));
    }
    Ok(Report { services: scenario.services.len(), seconds: traffic.seconds, policies: reports, wall_s: started.elapsed().as_secs_f64() })
}

/// One policy through every second.
fn simulate(policy: &mut dyn Policy, scenario: &Scenario, rates: &[&Vec<f64>], seconds: u32, options: &Options) -> PolicyReport {
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let n = scenario.services.len();
    let (mut windows, mut met) = (vec![0u64; n], vec![0u64; n]);
    let mut missed = MissedWindows::default();
    let mut arrivals = vec![0.0; n];
    let mut p99_ms = vec![0.0; n];
    let mut samples = Vec::new();
    let mut failures = scenario.failures_at_s.clone();
    failures.sort_unstable();
    let mut next_failure = failures.into_iter().peekable();
    for t in 0..seconds {
        while next_failure.next_if(|&f| f <= t).is_some() {
            policy.fleet().fail_one(t);
        }
        policy.step(t, &arrivals);
        let (mut demand, mut capacity) = (0.0, 0.0);
        for (i, s) in scenario.services.iter().enumerate() {
            let load = rates[i][t as usize];
            let serving = policy.serving(i, t);
            p99_ms[i] = 0.0;
            if load > 0.0 {
                windows[i] += 1;
                p99_ms[i] = serving::window_p99(load, &serving, &mut rng);
                let within = p99_ms[i] <= s.slo_ms;
                met[i] += u64::from(within);
                if !within {
                    missed.count(policy.condition(i));
                }
            }
            arrivals[i] = load;
            demand += load;
            capacity += serving.capacity_rps;
        }
        policy.observe(t, &arrivals, &p99_ms);
        policy.fleet().bill_second();
        if t.is_multiple_of(options.sample_every_s.max(1)) {
            let fleet = policy.fleet();
            samples.push(Sample { t_s: t, cost_per_hour: fleet.cost_per_hour(), demand_rps: demand, capacity_rps: capacity });
        }
    }
    let reconfigurations = policy.reconfigurations();
    let replanning = policy.replanning();
    let name = policy.name().to_string();
    let fleet = policy.fleet();
    PolicyReport {
        name,
        cost: fleet.cost,
        gpu_hours: fleet.gpu_hours,
        windows: windows.iter().sum(),
        windows_met: met.iter().sum(),
        reconfigurations,
        launches: fleet.launches,
        replanning,
        missed,
        per_service: scenario.services.iter().enumerate().map(|(i, s)| (s.name.clone(), windows[i], met[i])).collect(),
        samples,
    }
}
