//! What an agent keeps running when its GPU's assignment changes, by the agent's own rule
//! (`node-agent`'s reconcile): a workload keeps its processes when the GPU already runs one
//! of the same service in the same slot (the same MIG instance, which `plan_transition`
//! never touches when its profile and start stay, or the whole GPU) with the same process
//! configuration (MPS share, batch, processes). Everything else starts, and what is no
//! longer wanted stops. Pure.
//!
//! The node assignment uses it to put a changed GPU where most of its workloads already
//! run, and the fleet simulator to count restarts as the agents make them.

use std::collections::{BTreeMap, BTreeSet};

use planner::plan::Plan;

use super::assign::{assign_to_nodes, FleetGpu};
use crate::resources::{GpuAssignment, PlanSpec, WorkloadAssignment};

/// A workload as the agent runs it: what decides whether its processes are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunningWorkload<'a> {
    pub service: &'a str,
    /// The MIG instance's profile and start, `None` for the whole GPU (or an instance index
    /// the layout does not have, which no agent runs).
    pub slot: Option<(&'a str, u8)>,
    pub mps_percent_bits: u64,
    pub batch: u32,
    pub processes: u32,
}

/// The workloads of `gpu`, sorted (a multiset: equal ones stay). Retiring workloads
/// ([`super::handover`]) are not part of it: the agents keep them as they run.
pub fn running(gpu: &GpuAssignment) -> Vec<RunningWorkload<'_>> {
    let mut out: Vec<RunningWorkload<'_>> = gpu.workloads.iter().map(|w| running_workload(gpu, w)).collect();
    out.sort_unstable();
    out
}

/// Workload `w` of `gpu` as the agent runs it.
pub fn running_workload<'a>(gpu: &'a GpuAssignment, w: &'a WorkloadAssignment) -> RunningWorkload<'a> {
    RunningWorkload {
        service: &w.service,
        slot: w.mig_instance.and_then(|i| gpu.mig_layout.get(i)).map(|p| (p.profile.as_str(), p.start)),
        // Agents compare shares within 1e-9; plans carry whole or planner-computed shares,
        // and an equal share is the same bits.
        mps_percent_bits: w.mps_percent.to_bits(),
        batch: w.batch,
        processes: w.processes,
    }
}

/// The weight of `after`'s workloads (sorted) that keep running from `before` (sorted):
/// `weight` summed over the two multisets' intersection (with a weight of 1, its size).
pub fn kept_weight<T: Ord>(before: &[T], after: &[T], weight: impl Fn(&T) -> u64) -> u64 {
    let (mut i, mut j, mut total) = (0, 0, 0);
    while i < before.len() && j < after.len() {
        match before[i].cmp(&after[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                total += weight(&after[j]);
                i += 1;
                j += 1;
            }
        }
    }
    total
}

/// The services with a workload that starts or stops on this GPU when its assignment goes
/// from `before` to `after` (`None`: the GPU runs nothing of the plan).
pub fn restarted_services<'a>(before: Option<&'a GpuAssignment>, after: Option<&'a GpuAssignment>) -> BTreeSet<&'a str> {
    let old = before.map(running).unwrap_or_default();
    let new = after.map(running).unwrap_or_default();
    let (removed, added) = unmatched(&old, &new);
    removed.into_iter().chain(added).map(|w| w.service).collect()
}

/// Per service with a workload that stops on this GPU, the capacity that stops before its
/// replacement serves (break-before-make), by the agent's rule: a workload whose service
/// gets a new configuration in the same slot (the same MIG instance, or the whole GPU)
/// starts it as the warm standby and switches when it is ready, so the old one serves
/// until then, as does one that stays as retiring (`super::handover`); any other workload
/// that goes drains at once, while what replaces it (on a new instance, another GPU or
/// another host) starts cold. Capacity is
/// [`capacity_weight`]: a share of the GPU, not req/s.
pub fn stopped_before_replaced<'a>(before: Option<&'a GpuAssignment>, after: Option<&'a GpuAssignment>) -> BTreeMap<&'a str, f64> {
    let old = before.map(running).unwrap_or_default();
    let new = after.map(running).unwrap_or_default();
    let (removed, added) = unmatched(&old, &new);
    let retiring: Vec<RunningWorkload<'_>> = after.map(|g| g.retiring.iter().map(|w| running_workload(g, w)).collect()).unwrap_or_default();
    let mut out: BTreeMap<&str, f64> = BTreeMap::new();
    for r in removed {
        let promoted = added.iter().any(|a| a.service == r.service && a.slot == r.slot);
        if !promoted && !retiring.contains(r) {
            *out.entry(r.service).or_default() += capacity_weight(r);
        }
    }
    out
}

/// The share of a GPU a workload's processes hold: the MIG instance's compute slices out of
/// seven (NVIDIA's profile names start with them, "3g.40gb"), or the whole GPU, times the
/// MPS share and the process count. A proxy for capacity that needs no profile: it compares
/// a service's workloads, which run one model.
pub fn capacity_weight(w: &RunningWorkload<'_>) -> f64 {
    let slices = w.slot.and_then(|(profile, _)| profile.split('g').next()?.parse::<u32>().ok()).unwrap_or(7).min(7);
    f64::from(slices) / 7.0 * f64::from_bits(w.mps_percent_bits).clamp(0.0, 100.0) / 100.0 * f64::from(w.processes)
}

/// The workloads of `before` and of `after` (both sorted) that the other does not have.
fn unmatched<'a, 'b>(
    before: &'b [RunningWorkload<'a>],
    after: &'b [RunningWorkload<'a>],
) -> (Vec<&'b RunningWorkload<'a>>, Vec<&'b RunningWorkload<'a>>) {
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < before.len() || j < after.len() {
        match (before.get(i), after.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                removed.push(a);
                i += 1;
            }
            (Some(a), None) => {
                removed.push(a);
                i += 1;
            }
            (_, Some(b)) => {
                added.push(b);
                j += 1;
            }
            (None, None) => unreachable!("the loop runs while one side has workloads"),
        }
    }
    (removed, added)
}

/// Process-seconds of restarts that moving from plan `from` to plan `to` makes, as
/// placement makes them: `from` placed on GPUs of its own, then `to` placed over it
/// (`assign_to_nodes`, which keeps what it can), with as many more GPUs of each type as `to`
/// needs. Each service with a workload that starts or stops on some GPU restarts every
/// process it has in `to`, and its warm standbys, for `restart_s(service)` each. O(GPUs ·
/// log) and two placements: for the provisioner's periodic pass, not for every change.
pub fn restart_process_seconds(from: &Plan, to: &Plan, restart_s: &dyn Fn(&str) -> f64) -> f64 {
    let mut per_type: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for g in &from.gpus {
        per_type.entry(&g.gpu_type).or_default().0 += 1;
    }
    for g in &to.gpus {
        per_type.entry(&g.gpu_type).or_default().1 += 1;
    }
    let fleet: Vec<FleetGpu> = per_type
        .iter()
        .flat_map(|(model, &(a, b))| {
            (0..a.max(b)).map(move |i| FleetGpu {
                node: String::new(),
                uuid: format!("{model}/{i}"),
                model: model.to_string(),
                autoscaled: false,
            })
        })
        .collect();
    let (before, _) = assign_to_nodes(from, &fleet, None);
    let current = PlanSpec { gpus: before.into(), ..PlanSpec::default() };
    let (after, _) = assign_to_nodes(to, &fleet, Some(&current));
    let before: BTreeMap<&str, &GpuAssignment> = current.gpus.iter().map(|g| (g.gpu_uuid.as_str(), g)).collect();
    let after: BTreeMap<&str, &GpuAssignment> = after.iter().map(|g| (g.gpu_uuid.as_str(), g)).collect();
    let mut restarted = BTreeSet::new();
    for f in &fleet {
        restarted.extend(restarted_services(before.get(f.uuid.as_str()).copied(), after.get(f.uuid.as_str()).copied()));
    }
    let mut processes: BTreeMap<&str, u32> = BTreeMap::new();
    for w in to.gpus.iter().flat_map(|g| &g.workloads).filter(|w| restarted.contains(w.service.as_str())) {
        // Each workload keeps a warm standby (the agent's shadow policy), restarted with it.
        *processes.entry(&w.service).or_default() += w.processes + 1;
    }
    processes.into_iter().map(|(service, n)| f64::from(n) * restart_s(service)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{MigPlacement, WorkloadAssignment};

    fn w(service: &str, mig_instance: Option<usize>, mps_percent: f64, batch: u32) -> WorkloadAssignment {
        WorkloadAssignment {
            service: service.into(),
            mig_instance,
            mps_percent,
            batch,
            processes: 1,
            shadow_mps_percent: 10.0,
            tenant: String::new(),
            isolation: Default::default(),
            batch_ms: 5.0,
        }
    }

    fn gpu(layout: &[(&str, u8)], workloads: Vec<WorkloadAssignment>) -> GpuAssignment {
        GpuAssignment {
            node: "n".into(),
            gpu_uuid: "GPU-0".into(),
            mig_layout: layout.iter().map(|&(p, start)| MigPlacement { profile: p.into(), start }).collect(),
            workloads,
            retiring: vec![],
        }
    }

    fn planned(service: &str, batch: u32, processes: u32) -> planner::plan::Workload {
        planner::plan::Workload {
            service: service.into(),
            mig_instance: None,
            mps_percent: 50.0,
            batch_size: batch,
            processes,
            shadow_percent: 0.0,
            predicted_throughput: 100.0,
            predicted_latency_ms: 5.0,
        }
    }

    fn plan_of(gpus: Vec<Vec<planner::plan::Workload>>) -> Plan {
        let gpus = gpus
            .into_iter()
            .enumerate()
            .map(|(i, workloads)| planner::plan::GpuPlan {
                slot: i as u32,
                gpu_type: "T4".into(),
                sharing: planner::plan::Sharing::MpsOnly,
                workloads,
            })
            .collect();
        Plan { strategy: "t".into(), gpus, predictions: vec![], infeasible: vec![] }
    }

    #[test]
    fn restarts_are_the_processes_and_standbys_of_the_services_whose_workloads_change() {
        let restart_s = |s: &str| if s == "b" { 30.0 } else { 10.0 };
        let from = plan_of(vec![vec![planned("a", 8, 2), planned("b", 8, 1)], vec![planned("c", 4, 1)]]);
        assert_eq!(restart_process_seconds(&from, &from, &restart_s), 0.0);
        // b's batch changes: its one process and its standby restart, at its 30 s.
        let to = plan_of(vec![vec![planned("a", 8, 2), planned("b", 16, 1)], vec![planned("c", 4, 1)]]);
        assert_eq!(restart_process_seconds(&from, &to, &restart_s), 2.0 * 30.0);
        // The GPUs in another order change nothing; a new service beside c starts its own
        // process and standby (2 x 10 s) and c keeps running.
        let reordered = plan_of(vec![vec![planned("c", 4, 1)], vec![planned("b", 8, 1), planned("a", 8, 2)]]);
        assert_eq!(restart_process_seconds(&from, &reordered, &restart_s), 0.0);
        let moved = plan_of(vec![vec![planned("a", 8, 2), planned("b", 8, 1)], vec![planned("c", 4, 1), planned("d", 4, 1)]]);
        assert_eq!(restart_process_seconds(&from, &moved, &restart_s), 20.0);
    }

    #[test]
    fn a_workload_whose_instance_stays_is_kept_when_its_neighbour_changes() {
        // 4g@0 + 3g@4 → 4g@0 + 2g@4 + 1g@6: "a" keeps its instance (now listed second).
        let before = gpu(&[("4g.40gb", 0), ("3g.40gb", 4)], vec![w("a", Some(0), 100.0, 8), w("b", Some(1), 100.0, 4)]);
        let after = gpu(
            &[("2g.20gb", 4), ("4g.40gb", 0), ("1g.10gb", 6)],
            vec![w("b", Some(0), 100.0, 4), w("a", Some(1), 100.0, 8), w("c", Some(2), 100.0, 2)],
        );
        assert_eq!(restarted_services(Some(&before), Some(&after)), BTreeSet::from(["b", "c"]));
        assert_eq!(kept_weight(&running(&before), &running(&after), |_| 1), 1);
    }

    #[test]
    fn a_new_share_batch_or_process_count_restarts_but_the_shadow_and_prediction_do_not() {
        let before = gpu(&[], vec![w("a", None, 30.0, 4), w("b", None, 30.0, 4)]);
        let mut after = before.clone();
        after.workloads[0].shadow_mps_percent = 5.0;
        after.workloads[0].batch_ms = 9.0;
        assert!(restarted_services(Some(&before), Some(&after)).is_empty());
        let changes: [fn(&mut WorkloadAssignment); 3] = [|w| w.mps_percent = 40.0, |w| w.batch = 8, |w| w.processes = 2];
        for change in changes {
            let mut after = before.clone();
            change(&mut after.workloads[1]);
            assert_eq!(restarted_services(Some(&before), Some(&after)), BTreeSet::from(["b"]));
        }
    }

    #[test]
    fn a_gpu_that_empties_or_fills_restarts_all_it_ran_or_runs() {
        let g = gpu(&[("7g.80gb", 0)], vec![w("a", Some(0), 100.0, 8)]);
        assert_eq!(restarted_services(Some(&g), None), BTreeSet::from(["a"]));
        assert_eq!(restarted_services(None, Some(&g)), BTreeSet::from(["a"]));
        assert!(restarted_services(Some(&g), Some(&g)).is_empty());
        assert!(restarted_services(None, None).is_empty());
    }

    #[test]
    fn a_new_configuration_in_the_same_slot_serves_through_the_switch_and_a_move_does_not() {
        // a is resized in its instance (standby, then switch); b's instance is replaced by
        // two smaller ones; c moves off this GPU; d is unchanged.
        let before = gpu(
            &[("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)],
            vec![w("a", Some(0), 100.0, 8), w("b", Some(1), 100.0, 4), w("c", Some(2), 50.0, 2)],
        );
        let after = gpu(
            &[("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)],
            vec![w("a", Some(0), 100.0, 16), w("b", Some(1), 100.0, 4), w("b", Some(2), 100.0, 4)],
        );
        let stopped = stopped_before_replaced(Some(&before), Some(&after));
        assert_eq!(stopped.keys().copied().collect::<Vec<_>>(), ["b", "c"]);
        assert!((stopped["b"] - 2.0 / 7.0).abs() < 1e-12, "{stopped:?}");
        assert!((stopped["c"] - 0.5 / 7.0).abs() < 1e-12, "{stopped:?}");
        // On an MPS-only GPU a new share of the same service switches through the standby.
        let mps = gpu(&[], vec![w("a", None, 30.0, 4), w("d", None, 30.0, 4)]);
        let tuned = gpu(&[], vec![w("a", None, 40.0, 4), w("d", None, 30.0, 4)]);
        assert!(stopped_before_replaced(Some(&mps), Some(&tuned)).is_empty());
        assert!((stopped_before_replaced(Some(&mps), None)["d"] - 0.3).abs() < 1e-12);
    }

    #[test]
    fn equal_workloads_count_as_many_times_as_they_run() {
        let two = gpu(&[], vec![w("a", None, 30.0, 4), w("a", None, 30.0, 4)]);
        let one = gpu(&[], vec![w("a", None, 30.0, 4)]);
        assert_eq!(kept_weight(&running(&two), &running(&one), |_| 1), 1);
        assert_eq!(restarted_services(Some(&two), Some(&one)), BTreeSet::from(["a"]));
    }
}
