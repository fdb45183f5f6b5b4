//! Make-before-break across slots (issue 59). A workload that leaves its slot for another
//! MIG instance, GPU or host would drain at once while its replacement starts cold (the
//! agents' rule, [`super::kept::stopped_before_replaced`]). Placed here, it stays in its slot
//! as *retiring* beside the GPU's new assignment when the GPU has room for both, so the
//! plan reserves what it holds: its MIG instance overlaps none of the new layout's (the
//! instance stays), or on an MPS-only GPU the shares of both fit within 100%; and the
//! tenants' boundaries hold with it. An agent keeps a retiring workload's processes
//! serving and starts nothing for it; the provisioner drops it once the service's new
//! workloads serve ([`replacements_ready`]) or after `[loops] handover_max_s`
//! ([`HANDOVER_MAX`] by default). Where there is no
//! room the move is break-before-make, and fleet-sim counts the gap. Pure.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use planner::isolation::{check_gpu, Boundary};
use planner::mig::{parse_profile, GpuModel, Occupancy, Placement};

use super::kept::{running_workload, RunningWorkload};
use super::FleetGpu;
use crate::resources::{GpuAssignment, ObservedGpu, PlanSpec, WorkloadAssignment};

/// Longest a retiring workload is kept, by default, when its replacements never report
/// ready (a server that cannot load its model): past the slowest cold starts reported for
/// LLM servers (30-90 s), with room for a retried model load (`[loops] handover_max_s`).
pub const HANDOVER_MAX: Duration = Duration::from_secs(300);

/// Places `current`'s workloads that leave their slots as retiring on the GPUs of `next`
/// (the new placement) that still hold room for them. A retiring workload of `current` is
/// carried over while `pending(service)`; a workload that leaves now is handed over when
/// `planned(service)` (the service runs elsewhere in the new plan: a service that goes has
/// nothing to hand over to). A GPU the new placement empties keeps its retiring workloads
/// in an assignment of their own, if it is still in `fleet`. O(GPUs of `current`).
pub fn hand_over_all(
    current: Option<&PlanSpec>,
    next: &mut imbl::Vector<GpuAssignment>,
    fleet: &[FleetGpu],
    pending: &dyn Fn(&str) -> bool,
    planned: &dyn Fn(&str) -> bool,
) {
    let Some(current) = current else { return };
    let models: HashMap<(&str, &str), &str> = fleet.iter().map(|g| ((g.node.as_str(), g.uuid.as_str()), g.model.as_str())).collect();
    let at: HashMap<(String, String), usize> = next.iter().enumerate().map(|(i, g)| ((g.node.clone(), g.gpu_uuid.clone()), i)).collect();
    let mut emptied = Vec::new();
    for before in &current.gpus {
        let Some(model) = models.get(&(before.node.as_str(), before.gpu_uuid.as_str())) else { continue };
        match at.get(&(before.node.clone(), before.gpu_uuid.clone())) {
            Some(&i) => {
                let after = &next[i];
                if before.retiring.is_empty() && before.workloads == after.workloads && before.mig_layout == after.mig_layout {
                    continue; // nothing leaves this GPU
                }
                let mut after = after.clone();
                hand_over(before, &mut after, model, pending, planned);
                if !after.retiring.is_empty() {
                    next.set(i, after);
                }
            }
            None => {
                let mut alone = GpuAssignment {
                    node: before.node.clone(),
                    gpu_uuid: before.gpu_uuid.clone(),
                    mig_layout: Vec::new(),
                    workloads: Vec::new(),
                    retiring: Vec::new(),
                };
                hand_over(before, &mut alone, model, pending, planned);
                if !alone.retiring.is_empty() {
                    emptied.push(alone);
                }
            }
        }
    }
    if !emptied.is_empty() {
        // A plan keeps its GPUs in (node, uuid) order.
        next.extend(emptied);
        next.sort_by(|a, b| (a.node.as_str(), a.gpu_uuid.as_str()).cmp(&(b.node.as_str(), b.gpu_uuid.as_str())));
    }
}

/// [`hand_over_all`] on one physical GPU of model `model`: `before` is what it ran,
/// `after` its new assignment.
pub fn hand_over(
    before: &GpuAssignment,
    after: &mut GpuAssignment,
    model: &str,
    pending: &dyn Fn(&str) -> bool,
    planned: &dyn Fn(&str) -> bool,
) {
    if before.workloads.is_empty() && before.retiring.is_empty() {
        return;
    }
    let mut staying: BTreeMap<RunningWorkload<'_>, usize> = BTreeMap::new();
    for w in &after.workloads {
        *staying.entry(running_workload(after, w)).or_default() += 1;
    }
    let mut leaving: Vec<(&WorkloadAssignment, bool)> = before.retiring.iter().filter(|w| pending(&w.service)).map(|w| (w, true)).collect();
    let owned: Vec<RunningWorkload<'_>> = before.workloads.iter().map(|w| running_workload(before, w)).collect();
    for (w, key) in before.workloads.iter().zip(&owned) {
        match staying.get_mut(key) {
            Some(n) if *n > 0 => *n -= 1,
            _ => leaving.push((w, false)),
        }
    }
    let gpu_model = GpuModel::for_name(model);
    for (w, carried) in leaving {
        if !carried && !planned(&w.service) {
            continue;
        }
        let slot = w.mig_instance.and_then(|i| before.mig_layout.get(i));
        // A new configuration in the same slot switches through the warm standby already.
        let same_slot = |v: &WorkloadAssignment| v.service == w.service && v.mig_instance.and_then(|i| after.mig_layout.get(i)) == slot;
        if !carried && after.workloads.iter().any(same_slot) {
            continue;
        }
        if let Some(retiring) = room_for(w, slot, after, gpu_model) {
            after.retiring.push(retiring);
        }
    }
}

/// `w` (in MIG instance `slot` of the GPU it ran on, `None` for the whole GPU) as a retiring
/// workload of `after`, if `after` has room for it; its instance is added to `after`'s layout
/// when the layout lacks it.
fn room_for(
    w: &WorkloadAssignment,
    slot: Option<&crate::resources::MigPlacement>,
    after: &mut GpuAssignment,
    gpu_model: Option<GpuModel>,
) -> Option<WorkloadAssignment> {
    let held = || after.workloads.iter().chain(&after.retiring);
    let mut retiring = WorkloadAssignment { shadow_mps_percent: 0.0, ..w.clone() };
    let mut add_instance = None;
    let mut shadow_cut = 0.0;
    match slot {
        None => {
            // The whole GPU's MPS server: the GPU must stay unpartitioned, with share left.
            // The warm shadows' extra shares (iGniter's min(10%, free)) give way to it: a
            // shadow's share is what its standby may use once switched to, and a smaller one
            // restarts nothing.
            if !after.mig_layout.is_empty() {
                return None;
            }
            let active: f64 = held().map(|v| v.mps_percent * f64::from(v.processes)).sum();
            let shadows: f64 = held().map(|v| v.shadow_mps_percent).sum();
            let need = w.mps_percent * f64::from(w.processes);
            if active + need > 100.0 + 1e-9 {
                return None;
            }
            shadow_cut = (active + shadows + need - 100.0).max(0.0);
            retiring.mig_instance = None;
        }
        Some(p) => {
            // A partitioned GPU that the new assignment runs whole cannot keep an instance.
            if after.mig_layout.is_empty() && !after.workloads.is_empty() {
                return None;
            }
            match after.mig_layout.iter().position(|q| q == p) {
                // The instance stays in the new layout: free of the new assignment's work.
                Some(j) => {
                    if held().any(|v| v.mig_instance == Some(j)) {
                        return None;
                    }
                    retiring.mig_instance = Some(j);
                }
                None => {
                    let model = gpu_model?;
                    let parse = |q: &crate::resources::MigPlacement| Some(Placement::new(parse_profile(model, &q.profile).ok()?, q.start));
                    let layout: Vec<Placement> = after.mig_layout.iter().map(parse).collect::<Option<_>>()?;
                    let own = parse(p)?;
                    if !Occupancy::of(&layout).fits(own) {
                        return None;
                    }
                    retiring.mig_instance = Some(after.mig_layout.len());
                    add_instance = Some(p.clone());
                }
            }
        }
    }
    let key = |v: &WorkloadAssignment| v.mig_instance;
    let bound = |v: &WorkloadAssignment| (!v.tenant.is_empty()).then(|| Boundary { tenant: v.tenant.clone(), isolation: v.isolation });
    let boundaries: Vec<(Option<usize>, Boundary)> =
        held().chain(std::iter::once(&retiring)).filter_map(|v| Some((key(v), bound(v)?))).collect();
    check_gpu(boundaries.iter().map(|(k, b)| (*k, b)), |_| String::new()).ok()?;
    after.mig_layout.extend(add_instance);
    for v in after.workloads.iter_mut().rev() {
        let cut = v.shadow_mps_percent.min(shadow_cut);
        v.shadow_mps_percent -= cut;
        shadow_cut -= cut;
    }
    Some(retiring)
}

/// `gpu` without the retiring workloads of the services `done` names, and without the MIG
/// instances only those held (the other workloads' indices follow their instances).
pub fn drop_retiring(gpu: &mut GpuAssignment, done: &dyn Fn(&str) -> bool) {
    if !gpu.retiring.iter().any(|w| done(&w.service)) {
        return;
    }
    gpu.retiring.retain(|w| !done(&w.service));
    let used: Vec<bool> =
        (0..gpu.mig_layout.len()).map(|i| gpu.workloads.iter().chain(&gpu.retiring).any(|w| w.mig_instance == Some(i))).collect();
    let mut renumber = Vec::with_capacity(used.len());
    let mut next = 0;
    for &u in &used {
        renumber.push(next);
        next += usize::from(u);
    }
    let mut i = 0;
    gpu.mig_layout.retain(|_| {
        i += 1;
        used[i - 1]
    });
    for w in gpu.workloads.iter_mut().chain(gpu.retiring.iter_mut()) {
        w.mig_instance = w.mig_instance.map(|j| renumber[j]);
    }
}

/// Whether the workloads of `service` that `gpu` assigns serve on it, by its agent's last
/// report (`observed`, of the node's status, which has applied `applied` of `wanted`):
/// every process of each is up and ready in its configuration (shadows aside).
pub fn replacements_ready(gpu: &GpuAssignment, service: &str, observed: Option<&ObservedGpu>, applied: u64, wanted: u64) -> bool {
    if applied < wanted {
        return false;
    }
    let Some(observed) = observed else { return false };
    gpu.workloads.iter().filter(|w| w.service == service).all(|w| {
        let ready = observed
            .workloads
            .iter()
            .filter(|o| {
                !o.shadow
                    && o.service == service
                    && o.state == "ready"
                    && o.batch == w.batch
                    && (o.mps_percent - w.mps_percent).abs() < 1e-6
            })
            .count();
        ready >= w.processes as usize
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Isolation, MigPlacement};

    fn w(service: &str, mig_instance: Option<usize>, mps_percent: f64) -> WorkloadAssignment {
        WorkloadAssignment {
            service: service.into(),
            mig_instance,
            mps_percent,
            batch: 8,
            processes: 1,
            shadow_mps_percent: 10.0,
            tenant: String::new(),
            isolation: Isolation::default(),
            batch_ms: 5.0,
        }
    }

    fn gpu(uuid: &str, layout: &[(&str, u8)], workloads: Vec<WorkloadAssignment>) -> GpuAssignment {
        GpuAssignment {
            node: "n".into(),
            gpu_uuid: uuid.into(),
            mig_layout: layout.iter().map(|&(p, start)| MigPlacement { profile: p.into(), start }).collect(),
            workloads,
            retiring: Vec::new(),
        }
    }

    const A100: &str = "A100-80GB";
    fn always(_: &str) -> bool {
        true
    }

    #[test]
    fn a_workload_moving_off_its_instance_retires_there_when_the_new_layout_leaves_it_free() {
        // a (3g@0) moves to another GPU; b (2g@4) stays; c arrives in 1g@6: 3g@0 overlaps
        // nothing new, so a keeps serving there.
        let before = gpu("G0", &[("3g.40gb", 0), ("2g.20gb", 4)], vec![w("a", Some(0), 100.0), w("b", Some(1), 100.0)]);
        let mut after = gpu("G0", &[("2g.20gb", 4), ("1g.10gb", 6)], vec![w("b", Some(0), 100.0), w("c", Some(1), 100.0)]);
        hand_over(&before, &mut after, A100, &always, &always);
        assert_eq!(after.mig_layout.len(), 3);
        assert_eq!(after.retiring, vec![WorkloadAssignment { shadow_mps_percent: 0.0, ..w("a", Some(2), 100.0) }]);
        assert_eq!(after.mig_layout[2], MigPlacement { profile: "3g.40gb".into(), start: 0 });
        // Dropped once its replacement serves: the instance goes with it, indices stay right.
        drop_retiring(&mut after, &|s| s == "a");
        assert_eq!(after, gpu("G0", &[("2g.20gb", 4), ("1g.10gb", 6)], vec![w("b", Some(0), 100.0), w("c", Some(1), 100.0)]));
    }

    #[test]
    fn no_room_no_partition_change_no_plan_and_no_boundary_crossing_means_break_before_make() {
        let before = gpu("G0", &[("3g.40gb", 0)], vec![w("a", Some(0), 100.0)]);
        // The new layout overlaps a's instance.
        let mut overlapped = gpu("G0", &[("4g.40gb", 0)], vec![w("c", Some(0), 100.0)]);
        hand_over(&before, &mut overlapped, A100, &always, &always);
        assert!(overlapped.retiring.is_empty());
        // The GPU runs whole now.
        let mut whole = gpu("G0", &[], vec![w("c", None, 30.0)]);
        hand_over(&before, &mut whole, A100, &always, &always);
        assert!(whole.retiring.is_empty());
        // a is no longer planned anywhere: nothing to hand over to.
        let mut empty = gpu("G0", &[], vec![]);
        hand_over(&before, &mut empty, A100, &always, &|s| s != "a");
        assert!(empty.retiring.is_empty());
        // MPS-only: 65 + 40 > 100.
        let mps = gpu("G1", &[], vec![w("a", None, 40.0)]);
        let mut full = gpu("G1", &[], vec![w("c", None, 65.0)]);
        hand_over(&mps, &mut full, A100, &always, &always);
        assert!(full.retiring.is_empty());
        // 55 + 40 fit when c's shadow gives up 5 of its 10.
        let mut roomy = gpu("G1", &[], vec![w("c", None, 55.0)]);
        hand_over(&mps, &mut roomy, A100, &always, &always);
        assert_eq!(roomy.retiring.len(), 1);
        assert_eq!(roomy.workloads[0].shadow_mps_percent, 5.0);
        // A dedicated tenant's new workload admits no other tenant's beside it.
        let tenant = |mut x: WorkloadAssignment, t: &str, i: Isolation| {
            x.tenant = t.into();
            x.isolation = i;
            x
        };
        let shared = gpu("G1", &[], vec![tenant(w("a", None, 40.0), "t1", Isolation::Shared)]);
        let mut dedicated = gpu("G1", &[], vec![tenant(w("c", None, 30.0), "t2", Isolation::Dedicated)]);
        hand_over(&shared, &mut dedicated, A100, &always, &always);
        assert!(dedicated.retiring.is_empty());
    }

    #[test]
    fn a_resize_in_its_own_slot_is_not_retired_and_a_pending_retiree_is_carried_over() {
        let before = gpu("G1", &[], vec![w("a", None, 30.0)]);
        let mut resized = gpu("G1", &[], vec![w("a", None, 40.0)]);
        hand_over(&before, &mut resized, A100, &always, &always);
        assert!(resized.retiring.is_empty(), "the standby switch covers it");
        let mut moved = gpu("G1", &[], vec![w("c", None, 30.0)]);
        hand_over(&before, &mut moved, A100, &always, &always);
        assert_eq!(moved.retiring.len(), 1);
        // The next placement carries it while pending, and not once done.
        let mut again = gpu("G1", &[], vec![w("c", None, 30.0)]);
        hand_over(&moved, &mut again, A100, &always, &always);
        assert_eq!(again.retiring, moved.retiring);
        let mut done = gpu("G1", &[], vec![w("c", None, 30.0)]);
        hand_over(&moved, &mut done, A100, &|_| false, &always);
        assert!(done.retiring.is_empty());
    }

    #[test]
    fn a_gpu_the_new_placement_empties_keeps_its_retirees_if_it_is_still_in_the_fleet() {
        let current = PlanSpec { gpus: vec![gpu("G0", &[], vec![w("a", None, 40.0)])].into(), ..PlanSpec::default() };
        let fleet = |uuid: &str| FleetGpu { node: "n".into(), uuid: uuid.into(), model: A100.into(), autoscaled: false };
        let mut next = imbl::Vector::from(vec![gpu("G1", &[], vec![w("a", None, 50.0)])]);
        hand_over_all(Some(&current), &mut next, &[fleet("G0"), fleet("G1")], &always, &always);
        assert_eq!(next.len(), 2);
        assert_eq!(next[0].gpu_uuid, "G0", "in (node, uuid) order");
        assert_eq!(next[0].retiring.len(), 1);
        // Its host is gone: nothing retires there.
        let mut next = imbl::Vector::from(vec![gpu("G1", &[], vec![w("a", None, 50.0)])]);
        hand_over_all(Some(&current), &mut next, &[fleet("G1")], &always, &always);
        assert_eq!(next.len(), 1);
    }

    #[test]
    fn replacements_are_ready_when_every_process_of_each_reports_ready_at_the_wanted_version() {
        let g = gpu("G0", &[], vec![WorkloadAssignment { processes: 2, ..w("a", None, 40.0) }, w("b", None, 20.0)]);
        let seen = |state: &str, n: usize| ObservedGpu {
            gpu_uuid: "G0".into(),
            workloads: (0..n)
                .map(|_| crate::resources::ObservedWorkload {
                    service: "a".into(),
                    mig_instance: -1,
                    mps_percent: 40.0,
                    batch: 8,
                    state: state.into(),
                    shadow: false,
                    pid: 1,
                })
                .collect(),
            ..ObservedGpu::default()
        };
        assert!(replacements_ready(&g, "a", Some(&seen("ready", 2)), 5, 5));
        assert!(!replacements_ready(&g, "a", Some(&seen("ready", 1)), 5, 5), "one of two");
        assert!(!replacements_ready(&g, "a", Some(&seen("starting", 2)), 5, 5));
        assert!(!replacements_ready(&g, "a", Some(&seen("ready", 2)), 4, 5), "not applied yet");
        assert!(!replacements_ready(&g, "a", None, 5, 5));
    }
}
