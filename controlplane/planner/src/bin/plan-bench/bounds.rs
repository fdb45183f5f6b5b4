//! Lower bounds printed beside each plan.
//!
//! * MIG (ParvaGPU's segment model): per service, the minimum total GPCs of any multiset of
//!   segments whose profiled throughput covers its rate, using only profiled (size, batch,
//!   processes) points below ParvaGPU's latency budget (0.9 · SLO / 2): `exact::min_gpc_mix`
//!   over `segments::optimal_triplets` (for each size only the max-throughput point matters).
//!   Summed over services this is the fewest GPCs any plan of one-service segments can use;
//!   `Σ / 7` is therefore a lower bound on GPUs, reached only by a perfect packing. It is the
//!   bound of ParvaGPU's and exact's model; PARIS uses single-process partitions and a
//!   budget of SLO / 2 without the 10% margin, so it is a reference there, not a bound.
//! * MPS (iGniter): per service, Theorem 1's solo share `r_lower` (Eq. 17-18) over the fewest
//!   replicas whose `r_lower` fits in `r_max`, summed (`Σ r_lower`, the first term of
//!   Eq. 19), in GPUs (100% = 1). This is iGniter's interference-free and fragmentation-free
//!   floor: Alg. 2 only ever adds to `r_lower` (`r_inter` ≥ 0) and the shadows add more.

use planner::input::PlanningInput;
use planner::strategy::exact::min_gpc_mix;
use planner::strategy::igniter::{Grid, IgniterConfig, Job};
use planner::strategy::parvagpu::ParvaConfig;
use planner::strategy::segments::optimal_triplets;

/// Σ per-service minimum GPCs.
pub struct MigBound {
    pub gpcs: u32,
    /// Services no profiled point can serve within the budget (left out of the sum).
    pub infeasible: usize,
    /// Every per-service search finished within its node budget (else the sum is an upper
    /// estimate of the bound, marked `~`).
    pub complete: bool,
}

impl MigBound {
    pub fn gpus(&self) -> f64 {
        f64::from(self.gpcs) / 7.0
    }
}

/// See the module doc. Each service is bounded on the cheapest MIG type that has a profile
/// for its model and a feasible point, the type ParvaGPU's configurator picks.
pub fn mig(input: &PlanningInput, cfg: &ParvaConfig, node_budget: u64) -> MigBound {
    let mut types: Vec<_> = input.gpu_types.iter().filter(|t| t.mig()).collect();
    types.sort_by(|a, b| a.price_per_hour.total_cmp(&b.price_per_hour));
    let mut b = MigBound { gpcs: 0, infeasible: 0, complete: true };
    for s in &input.services {
        let found = types.iter().find_map(|t| {
            let table = input.profiles.table(&t.name, &s.model)?;
            let tri = optimal_triplets(table, cfg.budget_ms(s.slo_ms), cfg.max_processes);
            min_gpc_mix(&tri, s.request_rate, node_budget)
        });
        match found {
            Some((mix, complete)) => {
                b.gpcs += mix.iter().map(|t| u32::from(t.gpcs)).sum::<u32>();
                b.complete &= complete;
            }
            None => b.infeasible += 1,
        }
    }
    b
}

/// Σ r_lower in GPUs, and the services Theorem 1 cannot size on any type.
pub struct MpsBound {
    pub gpus: f64,
    pub infeasible: usize,
}

/// See the module doc; per service the type with the smallest total `r_lower`.
pub fn mps(input: &PlanningInput, cfg: &IgniterConfig) -> MpsBound {
    let mut b = MpsBound { gpus: 0.0, infeasible: 0 };
    for s in &input.services {
        let mut best: Option<f64> = None;
        for t in input.gpu_types.iter().filter(|t| t.mps) {
            let (Some(hw), Some(c)) = (t.igniter.as_ref(), input.profiles.coeffs(&t.name, &s.model)) else { continue };
            let Some(grid) = Grid::of(hw) else { continue };
            let share = (1..=cfg.max_replicas.max(1)).find_map(|n| {
                let job = Job::new(hw, grid, 0, c, s.slo_ms, s.request_rate / f64::from(n))?;
                (job.lower_units <= grid.max_units).then(|| f64::from(n) * grid.pct(job.lower_units))
            });
            if let Some(pct) = share {
                best = Some(best.map_or(pct, |b: f64| b.min(pct)));
            }
        }
        match best {
            Some(pct) => b.gpus += pct / 100.0,
            None => b.infeasible += 1,
        }
    }
    b
}
