//! The tuner's shares through a re-plan. The GSLICE tuner (`crate::tuning`) moves MPS shares
//! in the committed plan; a re-plan places the planner's content, whose shares are the ones
//! the tuner moved away from. Placed as they are, every tuned GPU would match no planned one
//! (its shares differ), so a change to one service restarted the tuned workloads of every
//! other: in fleet-sim's day (seed 1, the defaults) about 500 restarts of services nothing
//! happened to (issue 59).
//!
//! So the provisioner remembers the placement it last committed, as planned. A GPU of the
//! committed plan that differs from it in its workloads' MPS shares alone was tuned since:
//! the placement looks at it as planned (so the unchanged planned GPU lands on it again),
//! and a workload that it gets again exactly as placed keeps its tuned share while the
//! GPU's shares fit. New or re-planned workloads get the planner's shares. Pure.

use std::collections::{BTreeMap, HashMap};

use planner::plan::Plan;

use super::assign::{assign_to_nodes, FleetGpu};
use crate::resources::{GpuAssignment, PlanSpec, WorkloadAssignment};

/// `plan` placed on `fleet` over the `committed` plan (`assign_to_nodes`), the tuned GPUs
/// of which are told by `placed_before` (the provisioner's last committed placement, as
/// planned) and matched as placed: the GPUs with the planner's shares, the services left
/// without a GPU, and the tuned GPUs for [`TunedGpus::keep_tuned`] once the caller has
/// completed the assignments.
pub fn assign_over_tuned(
    plan: &Plan,
    fleet: &[FleetGpu],
    committed: Option<&PlanSpec>,
    placed_before: Option<&PlanSpec>,
) -> (Vec<GpuAssignment>, BTreeMap<String, String>, TunedGpus) {
    let tuned = match (placed_before, committed) {
        (Some(placed), Some(committed)) => TunedGpus::between(placed, committed),
        _ => TunedGpus::default(),
    };
    let as_placed = committed.filter(|_| !tuned.is_empty()).map(|c| tuned.as_placed(c));
    let (gpus, unplaced) = assign_to_nodes(plan, fleet, as_placed.as_ref().or(committed));
    (gpus, unplaced, tuned)
}

/// The GPUs of the committed plan the tuner changed since the provisioner placed it.
#[derive(Debug, Default)]
pub struct TunedGpus {
    /// By GPU uuid: the assignment as placed (the planner's shares) and as tuned.
    gpus: HashMap<String, (GpuAssignment, GpuAssignment)>,
}

impl TunedGpus {
    /// The GPUs of `committed` that differ from `placed` (the placement the provisioner
    /// committed, as planned) in their MPS shares only. None when `committed` is not that
    /// placement at all (another inputs digest: a plan written otherwise, or a commit that
    /// failed): then no GPU counts as tuned. O(GPUs): both are in (node, uuid) order.
    ///
    /// Retiring workloads (`super::handover`) are the committed plan's alone: GPUs that
    /// hold nothing else are passed over, and the others are compared without them.
    pub fn between(placed: &PlanSpec, committed: &PlanSpec) -> TunedGpus {
        let mut gpus = HashMap::new();
        let working = |p: &PlanSpec| p.gpus.iter().filter(|g| !g.workloads.is_empty()).count();
        if placed.inputs_digest != committed.inputs_digest || working(placed) != working(committed) {
            return TunedGpus { gpus };
        }
        let committed_working = committed.gpus.iter().filter(|g| !g.workloads.is_empty());
        for (was, now) in placed.gpus.iter().filter(|g| !g.workloads.is_empty()).zip(committed_working) {
            if was.workloads != now.workloads && shares_alone_differ(was, now) {
                let now = GpuAssignment { retiring: Vec::new(), ..now.clone() };
                gpus.insert(now.gpu_uuid.clone(), (was.clone(), now));
            }
        }
        TunedGpus { gpus }
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// `committed` with each tuned GPU as placed: what the placement matches the new plan's
    /// GPUs against. Shares `committed`'s chunks but the tuned GPUs'.
    pub fn as_placed(&self, committed: &PlanSpec) -> PlanSpec {
        let mut out = committed.clone();
        for (placed, _) in self.gpus.values() {
            if let Some(i) = position(&out.gpus, placed) {
                out.gpus.set(i, placed.clone());
            }
        }
        out
    }

    /// Gives the workloads of `assigned` (in (node, uuid) order, as a Plan keeps them) that
    /// run on a tuned GPU exactly as they were placed their tuned shares back: the whole GPU
    /// when it gets exactly what it was placed with; else each such workload, when the
    /// GPU's shares still fit ([`fits`]), while its new neighbours get the planner's.
    /// O(tuned GPUs · log GPUs).
    pub fn keep_tuned(&self, assigned: &mut imbl::Vector<GpuAssignment>) {
        for (placed, tuned) in self.gpus.values() {
            let Some(i) = position(assigned, placed) else { continue };
            if assigned[i] == *placed {
                assigned.set(i, tuned.clone());
                continue;
            }
            if !assigned[i].mig_layout.is_empty() {
                continue;
            }
            let mut kept = assigned[i].clone();
            let mut taken = vec![false; placed.workloads.len()];
            for w in &mut kept.workloads {
                let same = (0..placed.workloads.len()).find(|&j| !taken[j] && same_process(&placed.workloads[j], w));
                if let Some(j) = same {
                    taken[j] = true;
                    w.mps_percent = tuned.workloads[j].mps_percent;
                }
            }
            if kept != assigned[i] && fits(&kept) {
                assigned.set(i, kept);
            }
        }
    }
}

/// Whether `new` runs the very process `placed` was placed as: the same service, instance,
/// planned share, batch and processes. Its warm shadow's share is the new plan's (the
/// free share left beside its neighbours, iGniter's `min(10%, free)`), which the active
/// process does not depend on.
fn same_process(placed: &WorkloadAssignment, new: &WorkloadAssignment) -> bool {
    WorkloadAssignment { shadow_mps_percent: new.shadow_mps_percent, ..placed.clone() } == *new
}

/// Whether an MPS-only GPU's shares fit it: `Σ mps_percent × processes + shadow_mps_percent`
/// at most 100, the sum the tuner, the plan's validation and the agents bound.
fn fits(gpu: &GpuAssignment) -> bool {
    gpu.workloads.iter().chain(&gpu.retiring).map(|w| w.mps_percent * f64::from(w.processes) + w.shadow_mps_percent).sum::<f64>()
        <= 100.0 + 1e-9
}

/// Where the GPU of `gpu` (its node and uuid) is in `gpus`, which are in (node, uuid) order.
fn position(gpus: &imbl::Vector<GpuAssignment>, gpu: &GpuAssignment) -> Option<usize> {
    let key = (gpu.node.as_str(), gpu.gpu_uuid.as_str());
    gpus.binary_search_by(|g| (g.node.as_str(), g.gpu_uuid.as_str()).cmp(&key)).ok()
}

/// Whether `a` and `b` are one GPU with the same workloads but for their MPS shares (what
/// the tuner changes, on MPS-only GPUs alone).
fn shares_alone_differ(a: &GpuAssignment, b: &GpuAssignment) -> bool {
    let same_but_share =
        |x: &WorkloadAssignment, y: &WorkloadAssignment| WorkloadAssignment { mps_percent: y.mps_percent, ..x.clone() } == *y;
    a.node == b.node
        && a.gpu_uuid == b.gpu_uuid
        && a.mig_layout.is_empty()
        && b.mig_layout.is_empty()
        && a.workloads.len() == b.workloads.len()
        && a.workloads.iter().zip(&b.workloads).all(|(x, y)| same_but_share(x, y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::plan::{GpuPlan, Sharing, Workload};

    fn workload(service: &str, mps_percent: f64) -> Workload {
        Workload {
            service: service.into(),
            mig_instance: None,
            mps_percent,
            batch_size: 4,
            processes: 1,
            shadow_percent: 0.0,
            predicted_throughput: 100.0,
            predicted_latency_ms: 10.0,
        }
    }

    fn plan(gpus: Vec<Vec<Workload>>) -> Plan {
        let gpus = gpus
            .into_iter()
            .enumerate()
            .map(|(i, workloads)| GpuPlan { slot: i as u32, gpu_type: "T4".into(), sharing: Sharing::MpsOnly, workloads })
            .collect();
        Plan { strategy: "igniter".into(), gpus, predictions: vec![], infeasible: vec![] }
    }

    fn fleet(n: u32) -> Vec<FleetGpu> {
        (0..n).map(|i| FleetGpu { node: format!("host-{i}"), uuid: format!("GPU-{i}"), model: "T4".into(), autoscaled: false }).collect()
    }

    fn spec(gpus: Vec<GpuAssignment>) -> PlanSpec {
        PlanSpec { strategy: "igniter".into(), gpus: gpus.into(), inputs_digest: "d".into(), ..PlanSpec::default() }
    }

    /// `next` placed over `committed` on `n` GPUs, the tuned shares kept.
    fn placed_keeping(tuned: &TunedGpus, next: &Plan, committed: &PlanSpec, n: u32) -> Vec<GpuAssignment> {
        let (gpus, _) = assign_to_nodes(next, &fleet(n), Some(&tuned.as_placed(committed)));
        let mut gpus: imbl::Vector<GpuAssignment> = gpus.into();
        tuned.keep_tuned(&mut gpus);
        gpus.into_iter().collect()
    }

    fn on<'a>(gpus: &'a [GpuAssignment], service: &str) -> &'a GpuAssignment {
        gpus.iter().find(|g| g.workloads.iter().any(|w| w.service == service)).expect("placed")
    }

    #[test]
    fn a_re_plan_keeps_the_tuned_shares_of_gpus_whose_planned_content_stays() {
        let first = plan(vec![vec![workload("a", 30.0), workload("b", 30.0)], vec![workload("c", 50.0)]]);
        let (placed, _) = assign_to_nodes(&first, &fleet(3), None);
        let placed = spec(placed);
        // The tuner gives "a" 40% on its GPU.
        let mut committed = placed.clone();
        for g in committed.gpus.iter_mut() {
            for w in g.workloads.iter_mut().filter(|w| w.service == "a") {
                w.mps_percent = 40.0;
            }
        }
        let tuned = TunedGpus::between(&placed, &committed);
        assert!(!tuned.is_empty());
        // "c" is re-planned at 60%: its GPU changes; a's and b's stays as planned.
        let next = plan(vec![vec![workload("a", 30.0), workload("b", 30.0)], vec![workload("c", 60.0)]]);
        let gpus = placed_keeping(&tuned, &next, &committed, 3);
        let was = on(&committed.gpus.iter().cloned().collect::<Vec<_>>(), "a").clone();
        assert_eq!(*on(&gpus, "a"), was, "a's GPU is where it was, with the tuner's 40%");
        assert_eq!(on(&gpus, "c").workloads[0].mps_percent, 60.0);
        // Without the memory, the tuned GPU would get the planner's 30% back (a restart).
        let (reverted, _) = assign_to_nodes(&next, &fleet(3), Some(&committed));
        assert_eq!(on(&reverted, "a").workloads[0].mps_percent, 30.0);
    }

    #[test]
    fn on_a_gpu_whose_planned_content_changed_the_unchanged_workloads_keep_their_tuned_shares() {
        let first = plan(vec![vec![workload("a", 30.0), workload("b", 30.0)]]);
        let (placed, _) = assign_to_nodes(&first, &fleet(2), None);
        let placed = spec(placed);
        let mut committed = placed.clone();
        committed.gpus[0].workloads[0].mps_percent = 40.0;
        let tuned = TunedGpus::between(&placed, &committed);
        // The planner resizes "b" on the same GPU: "a" keeps the tuner's 40%, "b" gets 45%.
        let next = plan(vec![vec![workload("a", 30.0), workload("b", 45.0)]]);
        let shares = |gpus: &[GpuAssignment]| on(gpus, "a").workloads.iter().map(|w| w.mps_percent).collect::<Vec<_>>();
        assert_eq!(shares(&placed_keeping(&tuned, &next, &committed, 2)), [40.0, 45.0]);
        // Where the tuned share no longer fits beside the new one, the planner's shares stand.
        let next = plan(vec![vec![workload("a", 30.0), workload("b", 70.0)]]);
        assert_eq!(shares(&placed_keeping(&tuned, &next, &committed, 2)), [30.0, 70.0]);
    }

    #[test]
    fn a_committed_plan_of_other_inputs_or_other_content_counts_nothing_as_tuned() {
        let (placed, _) = assign_to_nodes(&plan(vec![vec![workload("a", 30.0)]]), &fleet(1), None);
        let placed = spec(placed);
        let mut committed = placed.clone();
        committed.gpus[0].workloads[0].mps_percent = 40.0;
        committed.inputs_digest = "other".into();
        assert!(TunedGpus::between(&placed, &committed).is_empty(), "a plan the provisioner did not place");
        let mut batch = placed.clone();
        batch.gpus[0].workloads[0].batch = 8;
        batch.gpus[0].workloads[0].mps_percent = 40.0;
        assert!(TunedGpus::between(&placed, &batch).is_empty(), "more than the shares moved");
    }
}
