//! The price of tenant isolation: GPUs used on the synthetic 1,000-service fleet when its
//! 20 tenants are all `shared`, all `mig` or all `dedicated` (`planner::isolation`). Each
//! isolation domain is planned alone on GPUs of its own, as the controller's provisioner
//! does, and the merged plan is checked against the boundaries.

use crate::fleet::{fleet_input, services, SEED};
use planner::input::PlanningInput;
use planner::isolation::{check_isolation, domain_of, Boundaries, Boundary, Domain, Isolation};
use planner::perf::synthetic::example_models;
use planner::plan::Plan;
use planner::strategy::igniter::{self, IgniterConfig};
use planner::strategy::parvagpu::{self, ParvaConfig};
use std::collections::BTreeMap;

const SERVICES: usize = 1_000;
const TENANTS: usize = 20;

/// A strategy's name, whether it puts several services under one MPS server, and the strategy.
type Planner<'a> = (&'a str, bool, &'a dyn Fn(&PlanningInput) -> Plan);

/// Plans each domain of `input` with `plan` and merges the domain plans (slots renumbered).
fn plan_by_domain(input: &PlanningInput, boundaries: &Boundaries, shares_mps_servers: bool, plan: impl Fn(&PlanningInput) -> Plan) -> Plan {
    let mut domains: BTreeMap<Domain, Vec<usize>> = BTreeMap::new();
    for (i, s) in input.services.iter().enumerate() {
        domains.entry(domain_of(boundaries, &s.name, shares_mps_servers)).or_default().push(i);
    }
    let mut merged = Plan { strategy: String::new(), gpus: Vec::new(), predictions: Vec::new(), infeasible: Vec::new() };
    for members in domains.values() {
        let part = PlanningInput { services: members.iter().map(|&i| input.services[i].clone()).collect(), ..input.clone() };
        let p = plan(&part);
        merged.strategy = p.strategy;
        for mut g in p.gpus {
            g.slot = merged.gpus.len() as u32;
            merged.gpus.push(g);
        }
        merged.predictions.extend(p.predictions);
        merged.infeasible.extend(p.infeasible);
    }
    merged
}

pub fn run() {
    let models = example_models();
    let mut input = fleet_input(&models);
    input.services = services(&models, SERVICES, SEED);
    println!("\nThe price of tenant isolation: the synthetic {SERVICES}-service fleet, service i of tenant i mod {TENANTS}; each isolation domain planned alone on its own GPUs");
    println!("{:<9} {:<10} {:>6} {:>9} {:>8} {:>12}", "strategy", "isolation", "GPUs", "vs shared", "refused", "boundaries");
    let strategies: [Planner; 2] = [
        ("parvagpu", false, &|i| parvagpu::plan(i, &ParvaConfig::default())),
        ("igniter", true, &|i| igniter::plan(i, &IgniterConfig::default())),
    ];
    for (name, shares_mps_servers, plan) in strategies {
        let mut shared_gpus = 0;
        for isolation in [Isolation::Shared, Isolation::Mig, Isolation::Dedicated] {
            let boundaries: Boundaries = input
                .services
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.clone(), Boundary { tenant: format!("tenant-{:02}", i % TENANTS), isolation }))
                .collect();
            let p = plan_by_domain(&input, &boundaries, shares_mps_servers, plan);
            let gpus = p.gpus_used();
            if isolation == Isolation::Shared {
                shared_gpus = gpus;
            }
            let kept = match check_isolation(&p, &boundaries) {
                Ok(()) => "kept".to_string(),
                Err(e) => format!("BROKEN: {e}"),
            };
            let ratio = gpus as f64 / shared_gpus.max(1) as f64;
            println!("{:<9} {:<10} {:>6} {:>8.2}x {:>8} {:>12}", name, isolation.as_str(), gpus, ratio, p.infeasible.len(), kept);
        }
    }
    println!("mig: a GPU is shared only through separate MIG instances; ParvaGPU gives each instance one service, so mig costs nothing there; iGniter shares an MPS-only GPU's one MPS server, so each mig tenant gets GPUs of its own");
}
