//! Placing a plan's GPUs on the fleet's physical GPUs. Pure. A planned GPU goes preferably
//! to the physical GPU that already runs the same thing (no reconfiguration), then to one
//! with the same MIG layout, then to a free one of its model; what finds no GPU is reported
//! per service so that nothing is dropped silently.

use crate::resources::{GpuAssignment, MigPlacement, PlanSpec, WorkloadAssignment};
use planner::plan::{GpuPlan, Plan, Sharing};
use std::collections::{BTreeMap, BTreeSet};

/// One physical GPU of the fleet.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FleetGpu {
    pub node: String,
    pub uuid: String,
    /// Its GpuModel resource name (the plan's `gpu_type`).
    pub model: String,
    /// On a node the autoscaler launched: used last, so such nodes can empty and go.
    pub autoscaled: bool,
}

fn assignment(g: &GpuPlan, fleet: &FleetGpu) -> GpuAssignment {
    let mig_layout = match &g.sharing {
        Sharing::Mig { instances } => instances.iter().map(|i| MigPlacement { profile: i.profile.to_string(), start: i.start }).collect(),
        Sharing::MpsOnly => Vec::new(),
    };
    let workloads = g
        .workloads
        .iter()
        .map(|w| WorkloadAssignment {
            service: w.service.clone(),
            mig_instance: w.mig_instance,
            mps_percent: w.mps_percent,
            batch: w.batch_size,
            processes: w.processes,
            shadow_mps_percent: w.shadow_percent,
        })
        .collect();
    GpuAssignment { node: fleet.node.clone(), gpu_uuid: fleet.uuid.clone(), mig_layout, workloads }
}

/// How well a physical GPU's current assignment matches a planned one: identical (2),
/// same MIG layout (1), anything else (0).
fn affinity(planned: &GpuAssignment, current: Option<&GpuAssignment>) -> u8 {
    match current {
        Some(c) if c.mig_layout == planned.mig_layout && c.workloads == planned.workloads => 2,
        Some(c) if c.mig_layout == planned.mig_layout => 1,
        _ => 0,
    }
}

/// The plan's GPUs on the fleet, and the services (with the reason) that lost GPUs for
/// want of a physical one.
pub fn assign_to_nodes(plan: &Plan, fleet: &[FleetGpu], current: Option<&PlanSpec>) -> (Vec<GpuAssignment>, BTreeMap<String, String>) {
    let now: BTreeMap<&str, &GpuAssignment> =
        current.map(|c| c.gpus.iter().map(|g| (g.gpu_uuid.as_str(), g)).collect()).unwrap_or_default();
    let mut free: BTreeSet<usize> = (0..fleet.len()).collect();
    let mut out = Vec::new();
    let mut unplaced: BTreeMap<String, String> = BTreeMap::new();
    // Most constrained first: GPUs whose exact current match exists keep it.
    let mut order: Vec<(u8, usize)> = plan
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let best = fleet
                .iter()
                .filter(|f| f.model == g.gpu_type)
                .map(|f| affinity(&assignment(g, f), now.get(f.uuid.as_str()).copied()))
                .max()
                .unwrap_or(0);
            (best, i)
        })
        .collect();
    order.sort_by_key(|&(best, i)| (std::cmp::Reverse(best), i));
    for (_, i) in order {
        let g = &plan.gpus[i];
        let pick = free.iter().copied().filter(|&k| fleet[k].model == g.gpu_type).max_by_key(|&k| {
            let kept = affinity(&assignment(g, &fleet[k]), now.get(fleet[k].uuid.as_str()).copied());
            (kept, !fleet[k].autoscaled, std::cmp::Reverse(k))
        });
        match pick {
            Some(k) => {
                free.remove(&k);
                out.push(assignment(g, &fleet[k]));
            }
            None => {
                for w in &g.workloads {
                    unplaced.insert(
                        w.service.clone(),
                        format!("no free {} GPU in the fleet for part of its plan: the fleet needs more nodes", g.gpu_type),
                    );
                }
            }
        }
    }
    out.sort_by(|a, b| (a.node.as_str(), a.gpu_uuid.as_str()).cmp(&(b.node.as_str(), b.gpu_uuid.as_str())));
    (out, unplaced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::mig::MigProfile;
    use planner::plan::{MigInstance, Workload};

    fn gpu(slot: u32, layout: &[(MigProfile, u8)], service: &str) -> GpuPlan {
        GpuPlan {
            slot,
            gpu_type: "A100-80GB".into(),
            sharing: Sharing::Mig { instances: layout.iter().map(|&(profile, start)| MigInstance { profile, start }).collect() },
            workloads: vec![Workload {
                service: service.into(),
                mig_instance: Some(0),
                mps_percent: 100.0,
                batch_size: 8,
                processes: 1,
                shadow_percent: 0.0,
                predicted_throughput: 100.0,
                predicted_latency_ms: 10.0,
            }],
        }
    }

    fn fleet(n: usize) -> Vec<FleetGpu> {
        (0..n)
            .map(|i| FleetGpu { node: format!("n{}", i / 2), uuid: format!("GPU-{i}"), model: "A100-80GB".into(), autoscaled: false })
            .collect()
    }

    fn plan(gpus: Vec<GpuPlan>) -> Plan {
        Plan { strategy: "t".into(), gpus, predictions: vec![], infeasible: vec![] }
    }

    #[test]
    fn a_gpu_that_already_runs_the_planned_layout_keeps_it() {
        let first = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a"), gpu(1, &[(MigProfile::G4, 0), (MigProfile::G3, 4)], "b")]);
        let (now, unplaced) = assign_to_nodes(&first, &fleet(3), None);
        assert!(unplaced.is_empty());
        let current = PlanSpec {
            strategy: "t".into(),
            gpus: now.clone(),
            services: vec![],
            inputs_digest: String::new(),
            trace_parent: String::new(),
        };
        // The same plan with its GPUs in the other order lands on the same physical GPUs.
        let again = plan(vec![gpu(0, &[(MigProfile::G4, 0), (MigProfile::G3, 4)], "b"), gpu(1, &[(MigProfile::G7, 0)], "a")]);
        let (next, _) = assign_to_nodes(&again, &fleet(3), Some(&current));
        assert_eq!(next, now);
    }

    #[test]
    fn gpus_beyond_the_fleet_are_reported_per_service() {
        let p = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a"), gpu(1, &[(MigProfile::G7, 0)], "b")]);
        let (placed, unplaced) = assign_to_nodes(&p, &fleet(1), None);
        assert_eq!(placed.len(), 1);
        assert_eq!(unplaced.len(), 1);
        assert!(unplaced.values().next().unwrap().contains("needs more nodes"));
    }

    #[test]
    fn launched_nodes_are_used_last_so_they_can_empty() {
        let mut f = fleet(2);
        f[0].autoscaled = true;
        let p = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a")]);
        let (placed, _) = assign_to_nodes(&p, &f, None);
        assert_eq!(placed[0].gpu_uuid, "GPU-1");
    }

    #[test]
    fn only_gpus_of_the_planned_model_are_used() {
        let p = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a")]);
        let h100 = vec![FleetGpu { node: "n".into(), uuid: "GPU-h".into(), model: "H100-80GB".into(), autoscaled: false }];
        let (placed, unplaced) = assign_to_nodes(&p, &h100, None);
        assert!(placed.is_empty());
        assert!(unplaced.contains_key("a"));
    }
}
