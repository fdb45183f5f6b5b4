//! provision-bench: what one provisioning pass costs, phase by phase, at 100, 1,000 and
//! 10,000 hosts, in-process (no Raft, no network, no other load): the first pass over
//! fleet-bench's fleet, then the pass after one Service's rate +25% (the pass fleet-bench's
//! "one service +25%" waits for), then the periodic pass after it, which weighs a full plan
//! against the change's minimal re-plan (consolidation). The phases are the provisioner's
//! (`loops::provisioner`), called in its order through the same public functions.
//!
//! With `--hostile N`, a second tenant that sets no quota (so has the default one) adds N of
//! the hardest Services it may create (`HOSTILE_RATE` req/s of resnet50 each, about 700 GPUs
//! at least, just under the planner's per-service bound): the first pass then shows what
//! such a tenant costs a pass, and the table the process's peak memory.
//!
//!   provision-bench [--hosts N] [--runs R] [--hostile N]

use std::time::Instant;

use clap::Parser;
use controlplane::provision::offline::{put_resource, state_from_resources};
use controlplane::provision::{fleet_capacity, gather, inputs_digest, place, plan_inputs, MigStrategy, PoolPlans, Previous};
use controlplane::resources::PlanSpec;
use controlplane::state::ClusterState;
use devcluster::synthetic_fleet::{base_resources, node_name, node_resource, service};

/// The controller's allocator (`controlplane`'s binary): the pass allocates a great deal,
/// and glibc's malloc would make it another pass.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "One provisioning pass's phases at fleet scale, in-process")]
struct Args {
    /// One fleet size (default: 100, 1,000 and 10,000 hosts).
    #[arg(long)]
    hosts: Option<usize>,
    /// Runs of each pass; the table shows their medians.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Request rate of each Service (req/s), as fleet-bench's default.
    #[arg(long, default_value_t = 30_000.0)]
    rate: f64,
    /// Hosts per Service, as fleet-bench's default.
    #[arg(long, default_value_t = 4)]
    hosts_per_service: usize,
    /// Services of a second tenant without a quota, each the hardest it may create.
    #[arg(long, default_value_t = 0)]
    hostile: usize,
}

/// The hostile tenant's Services' rate: resnet50 on A100-80GB needs about 700 GPUs for it
/// at least (1,141 planned), within the planner's bound of 14,000 instances a service. (The
/// API's admission would refuse it, one alone being past the default quota: fleet-bench's
/// `--hostile` uses the largest rate it admits.)
const HOSTILE_RATE: f64 = 9_000_000.0;

/// This process's peak resident memory so far (Linux's VmHWM), MiB.
fn peak_rss_mib() -> Option<f64> {
    devcluster::process::memory_mib("self", "VmHWM")
}

const PHASES: [&str; 7] =
    ["gather inputs", "fleet capacity", "inputs digest", "plan (pools, quotas)", "place on the fleet", "diff with committed", "whole pass"];

/// Seconds since `since`, which then starts again.
fn lap(since: &mut Instant) -> f64 {
    let seconds = since.elapsed().as_secs_f64();
    *since = Instant::now();
    seconds
}

/// One pass as the provisioner makes it, with each phase's seconds.
fn pass(state: &ClusterState, committed: Option<&PlanSpec>, previous: Option<Previous>) -> ([f64; 7], PlanSpec, PoolPlans) {
    let mut seconds = [0.0; 7];
    let started = Instant::now();
    let mut since = Instant::now();
    let mut inputs = gather(state);
    // The committed plan: what the state machine holds once the last pass's plan committed.
    inputs.current = committed.cloned();
    seconds[0] = lap(&mut since);
    inputs.capacity = Some(fleet_capacity(state, &inputs.fleet, &inputs.input.gpu_types, false));
    seconds[1] = lap(&mut since);
    let digest = inputs_digest(&inputs, MigStrategy::Parvagpu);
    seconds[2] = lap(&mut since);
    let (plan, pools) = plan_inputs(&inputs, MigStrategy::Parvagpu, previous, &|| false).expect("never stopped");
    seconds[3] = lap(&mut since);
    let mut plan = place(&inputs, &plan, digest, None, &|_| false).spec;
    seconds[4] = lap(&mut since);
    plan.normalise();
    if let Some(current) = &inputs.current {
        std::hint::black_box(current.diff(&plan));
    }
    seconds[5] = lap(&mut since);
    seconds[6] = started.elapsed().as_secs_f64();
    (seconds, plan, pools)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Measured {
    hosts: usize,
    first: [f64; 7],
    one_service: [f64; 7],
    /// The periodic pass after the change: planning alone (minimal and full, weighed).
    consolidation_s: f64,
    consolidated: bool,
    gpus_planned: usize,
    gpus_moved: usize,
    /// Services the first pass refused (the hostile tenant's, over its quota).
    refused: usize,
    peak_rss_mib: Option<f64>,
}

fn measure(hosts: usize, args: &Args) -> Measured {
    let services = hosts.div_ceil(args.hosts_per_service);
    let mut resources = base_resources();
    resources.extend((0..hosts).map(|i| node_resource(&node_name(i))));
    resources.extend((0..services).map(|i| service(i, args.rate)));
    if args.hostile > 0 {
        resources.extend(devcluster::synthetic_fleet::hostile_resources(args.hostile, HOSTILE_RATE));
    }
    let mut state = state_from_resources(&resources).unwrap_or_else(|e| panic!("the synthetic fleet: {e}"));
    let runs = args.runs.max(1);
    let mut firsts = Vec::new();
    let mut first = None;
    for _ in 0..runs {
        let (seconds, plan, pools) = pass(&state, None, None);
        firsts.push(seconds);
        first = Some((plan, pools));
    }
    let (committed, pools) = first.expect("at least one run");
    let revision = state.revision() + 1;
    put_resource(&mut state, revision, &service(0, args.rate * 1.25)).expect("Service 0 at +25%");
    let mut ones = Vec::new();
    let mut moved = 0;
    let mut after_change = None;
    for _ in 0..runs {
        // A pass a change woke: minimal re-planning, consolidation owed.
        let (seconds, plan, next) = pass(&state, Some(&committed), Some(Previous { plans: &pools, consolidate: false }));
        let patch = committed.diff(&plan);
        moved = patch.set_gpus.len() + patch.remove_gpus.len();
        ones.push(seconds);
        after_change = Some((plan, next));
    }
    let (changed, owing) = after_change.expect("at least one run");
    // The periodic pass on the same inputs: the planning the provisioner does before it
    // knows whether anything is to be placed.
    let mut inputs = gather(&state);
    inputs.current = Some(changed);
    inputs.capacity = Some(fleet_capacity(&state, &inputs.fleet, &inputs.input.gpu_types, false));
    let mut weighs = Vec::new();
    let mut consolidated = false;
    for _ in 0..runs {
        let started = Instant::now();
        let (_, weighed) = plan_inputs(&inputs, MigStrategy::Parvagpu, Some(Previous { plans: &owing, consolidate: true }), &|| false)
            .expect("never stopped");
        weighs.push(started.elapsed().as_secs_f64());
        consolidated = !weighed.incremental;
    }
    let phase = |all: &[[f64; 7]], i: usize| median(all.iter().map(|s| s[i]).collect());
    Measured {
        hosts,
        first: std::array::from_fn(|i| phase(&firsts, i)),
        one_service: std::array::from_fn(|i| phase(&ones, i)),
        consolidation_s: median(weighs),
        consolidated,
        refused: committed.services.iter().filter(|p| p.infeasible_reason.is_some()).count(),
        gpus_planned: committed.gpus.len(),
        gpus_moved: moved,
        peak_rss_mib: peak_rss_mib(),
    }
}

fn main() {
    let args = Args::parse();
    let sizes = args.hosts.map_or(vec![100, 1_000, 10_000], |n| vec![n]);
    let rows: Vec<Measured> = sizes.iter().map(|&n| measure(n, &args)).collect();
    println!("provisioning pass, median of {} runs (seconds; one process, no other load)", args.runs.max(1));
    print!("{:<34}", "");
    for r in &rows {
        print!("{:>14}", format!("{} hosts", r.hosts));
    }
    println!();
    for (title, pick) in [("first pass", 0), ("after one Service +25%", 1)] {
        println!("{title}");
        for (i, name) in PHASES.iter().enumerate() {
            print!("  {name:<32}");
            for r in &rows {
                let s = if pick == 0 { r.first[i] } else { r.one_service[i] };
                print!("{s:>14.4}");
            }
            println!();
        }
    }
    print!("{:<34}", "planned GPUs / moved by the change");
    for r in &rows {
        print!("{:>14}", format!("{} / {}", r.gpus_planned, r.gpus_moved));
    }
    println!();
    print!("{:<34}", "services refused by the first pass");
    for r in &rows {
        print!("{:>14}", r.refused);
    }
    println!();
    print!("{:<34}", "peak memory so far (MiB)");
    for r in &rows {
        print!("{:>14}", r.peak_rss_mib.map_or("-".to_string(), |m| format!("{m:.0}")));
    }
    println!();
    print!("{:<34}", "periodic pass: weigh a full plan");
    for r in &rows {
        print!("{:>14.4}", r.consolidation_s);
    }
    println!();
    print!("{:<34}", "  full plan taken (saves >= 2%)");
    for r in &rows {
        print!("{:>14}", if r.consolidated { "yes" } else { "no" });
    }
    println!();
}
