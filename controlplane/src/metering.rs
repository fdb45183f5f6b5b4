//! What the committed plan gives each tenant and service: GPUs-worth (a MIG instance's
//! GPCs / 7 of its GPU, or an MPS workload's share of the GPU with its shadow's reserve)
//! and cost per hour (that share of the GPU's price, its node's instance price per GPU).
//! The same measure the quotas count (`GpuPlan::occupancy`), read from the stored plan.
//! Pure: the plan and the prices in, the usage out.

use std::collections::BTreeMap;

use crate::resources::{GpuAssignment, PlanSpec, WorkloadAssignment};

/// What a tenant or a service occupies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Occupied {
    pub gpus: f64,
    pub cost_per_hour: f64,
}

impl Occupied {
    fn add(&mut self, gpus: f64, price: f64) {
        self.gpus += gpus;
        self.cost_per_hour += gpus * price;
    }
}

/// Compute slices of a MIG profile, from its name (`3g`, `1g.10gb`, `1g.2m`).
pub fn profile_gpcs(profile: &str) -> u32 {
    profile.split('g').next().and_then(|d| d.parse().ok()).unwrap_or(1)
}

/// The share of its GPU `w` occupies (1.0 is the whole GPU).
pub fn occupancy(g: &GpuAssignment, w: &WorkloadAssignment) -> f64 {
    let gpcs = w.mig_instance.map(|k| g.mig_layout.get(k).map_or(0, |i| profile_gpcs(&i.profile)));
    planner::plan::occupied_share(gpcs, w.mps_percent, w.processes, w.shadow_mps_percent)
}

/// Per tenant (workloads without one under ""), what the plan gives it; `price_of_node` is
/// the price per GPU-hour on a node.
pub fn by_tenant(plan: &PlanSpec, price_of_node: impl Fn(&str) -> f64) -> BTreeMap<String, Occupied> {
    let mut out: BTreeMap<&str, Occupied> = BTreeMap::new();
    for g in &plan.gpus {
        let price = price_of_node(&g.node);
        for w in &g.workloads {
            out.entry(w.tenant.as_str()).or_default().add(occupancy(g, w), price);
        }
    }
    out.into_iter().map(|(t, o)| (t.to_string(), o)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Isolation, MigPlacement};

    fn workload(service: &str, tenant: &str, mig_instance: Option<usize>, mps_percent: f64, shadow: f64) -> WorkloadAssignment {
        WorkloadAssignment {
            service: service.into(),
            mig_instance,
            mps_percent,
            batch: 8,
            processes: 1,
            shadow_mps_percent: shadow,
            tenant: tenant.into(),
            isolation: Isolation::default(),
        }
    }

    #[test]
    fn tenants_are_charged_their_instances_and_shares_at_their_nodes_prices() {
        let mig = GpuAssignment {
            node: "a100".into(),
            gpu_uuid: "GPU-0".into(),
            mig_layout: vec![MigPlacement { profile: "3g".into(), start: 0 }, MigPlacement { profile: "1g.10gb".into(), start: 4 }],
            workloads: vec![workload("web", "acme", Some(0), 100.0, 0.0), workload("api", "globex", Some(1), 100.0, 0.0)],
        };
        let mps = GpuAssignment {
            node: "t4".into(),
            gpu_uuid: "GPU-1".into(),
            mig_layout: vec![],
            workloads: vec![workload("ocr", "globex", None, 40.0, 10.0)],
        };
        let plan = PlanSpec {
            strategy: "test".into(),
            gpus: vec![mig, mps].into(),
            services: Default::default(),
            inputs_digest: String::new(),
            trace_parent: String::new(),
        };
        let usage = by_tenant(&plan, |node| if node == "a100" { 7.0 } else { 1.0 });
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(usage["acme"].gpus, 3.0 / 7.0) && close(usage["acme"].cost_per_hour, 3.0), "{usage:?}");
        assert!(close(usage["globex"].gpus, 1.0 / 7.0 + 0.5), "{usage:?}");
        assert!(close(usage["globex"].cost_per_hour, 1.0 + 0.5), "{usage:?}");
    }
}
