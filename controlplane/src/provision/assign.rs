//! Placing a plan's GPUs on the fleet's physical GPUs. Pure. A planned GPU goes preferably
//! to the physical GPU that already runs the same thing (no reconfiguration), then to the
//! one where most of its workloads already run (only the others restart, by the agent's
//! rule in [`super::kept`]), then to one with the same MIG layout, then to a free one of its
//! model; what finds no GPU is reported per service so that nothing is dropped silently.

use super::kept;
use crate::resources::{GpuAssignment, MigPlacement, PlanSpec, WorkloadAssignment};
use planner::plan::{GpuPlan, Plan, Sharing};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher as _};

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

/// A planned GPU's content as an assignment placed on no GPU yet (node and uuid empty).
pub(super) fn planned_assignment(g: &GpuPlan) -> GpuAssignment {
    assignment(g, &FleetGpu::unplaced(&g.gpu_type))
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
            tenant: String::new(),
            isolation: crate::resources::Isolation::default(),
            batch_ms: planned_batch_ms(w.predicted_latency_ms),
        })
        .collect();
    GpuAssignment { node: fleet.node.clone(), gpu_uuid: fleet.uuid.clone(), mig_layout, workloads, retiring: Vec::new() }
}

/// The planner's latency prediction as the Plan carries it: within the bound validation
/// applies to a Plan, else 0 ("not known"), so a strategy's odd figure never makes a Plan
/// the state machine refuses.
fn planned_batch_ms(predicted_ms: f64) -> f64 {
    if predicted_ms.is_finite() && (0.0..=crate::resources::limits::MAX_LATENCY_MS).contains(&predicted_ms) {
        predicted_ms
    } else {
        0.0
    }
}

/// What a GPU runs, as a 64-bit digest: its MIG layout alone, or the layout with every
/// workload (shares by their bits). Digests rather than owned keys: copying every
/// workload's service name into a key for each of 80,000 GPUs was most of an assignment's
/// allocations at 10,000 hosts, and the assignment 40% of a provisioning pass (perf). A
/// collision (two contents with one digest: about 2^-64 a pair, 2e-10 over all the pairs
/// of 80,000 GPUs) could only pick a GPU that needs reconfiguring for a planned one, never
/// change what a GPU runs: the content of every assignment comes from the plan.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LayoutKey(u64);

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ContentKey(u64);

/// The hasher of the digests and of the maps keyed by them: foldhash with a fixed seed.
/// Digests are compared within one pass only, so no stability across builds is needed, and
/// SipHash (std's) was a quarter of the placement at 10,000 hosts (perf of
/// `provision-bench`). Its keys are as well known as SipHash's fixed ones were: a tenant
/// who made two contents collide could only cost a reconfiguration (above).
type Hashing = foldhash::fast::FixedState;
type Map<K, V> = HashMap<K, V, Hashing>;
type Hasher = foldhash::fast::FoldHasher<'static>;

/// The digest of `fields`.
fn digest(fields: impl FnOnce(&mut Hasher)) -> u64 {
    let mut h = Hashing::default().build_hasher();
    fields(&mut h);
    h.finish()
}

fn hash_layout(layout: &[MigPlacement], h: &mut Hasher) {
    layout.len().hash(h);
    for p in layout {
        (&p.profile, p.start).hash(h);
    }
}

fn layout_key(layout: &[MigPlacement]) -> LayoutKey {
    LayoutKey(digest(|h| hash_layout(layout, h)))
}

fn content_key(a: &GpuAssignment) -> ContentKey {
    ContentKey(digest(|h| {
        hash_layout(&a.mig_layout, h);
        a.workloads.len().hash(h);
        for w in &a.workloads {
            (&w.service, w.mig_instance, w.mps_percent.to_bits(), w.batch, w.processes, w.shadow_mps_percent.to_bits()).hash(h);
        }
    }))
}

/// Free physical GPUs in the order they are taken: nodes the operator runs before nodes the
/// autoscaler launched (so those can empty and go), then fleet order.
type FreeSet = BTreeSet<(bool, usize)>;

/// Free GPUs looked at per workload of a planned GPU when seeking the one where most of
/// its workloads run: bounds the search when one service runs alike on thousands of GPUs
/// (any of those keeps as much as another).
const CANDIDATES_PER_WORKLOAD: usize = 8;

/// The GPUs that already run exactly a content, per (model, content), each list in the
/// order GPUs are taken ([`FreeSet`]'s): the first round of an assignment, and at fleet
/// scale most of it (a change to one service leaves nearly every planned GPU as it is).
/// Built alone, before the other indices, which then hold only the GPUs this round left:
/// a GPU's workloads are digested and indexed only when it may be taken for a changed GPU.
fn exact_contents<'a>(fleet: &'a [FleetGpu], now: &Map<&str, &GpuAssignment>) -> Map<(&'a str, ContentKey), VecDeque<usize>> {
    let mut out: Map<(&str, ContentKey), VecDeque<usize>> = Map::default();
    // Operators' nodes first, then launched ones, each in fleet order.
    for launched in [false, true] {
        for (k, f) in fleet.iter().enumerate().filter(|(_, f)| f.autoscaled == launched) {
            if let Some(a) = now.get(f.uuid.as_str()) {
                out.entry((f.model.as_str(), content_key(a))).or_default().push_back(k);
            }
        }
    }
    out
}

/// The free GPUs of the fleet after the exact matches, indexed three ways: by model, by
/// (model, current MIG layout) and by (model, a workload it runs now). Taking a GPU removes
/// it from all three, so each lookup and removal is O(log n) (times its workloads) and a
/// whole assignment O(n log n) in the plan's and the fleet's size.
struct FreeGpus<'a> {
    fleet: &'a [FleetGpu],
    by_model: Map<&'a str, FreeSet>,
    by_layout: Map<(&'a str, LayoutKey), FreeSet>,
    by_workload: Map<(&'a str, u64), FreeSet>,
    current: Vec<Option<LayoutKey>>,
    /// Digests of the workloads each GPU runs now (sorted): `running[spans[k].0..spans[k].1]`,
    /// in one vector rather than one per GPU.
    running: Vec<u64>,
    spans: Vec<(usize, usize)>,
}

impl<'a> FreeGpus<'a> {
    /// The fleet's GPUs but those `taken`; `now`: what each GPU runs, by uuid.
    fn new(fleet: &'a [FleetGpu], now: &Map<&str, &GpuAssignment>, taken: &[bool]) -> Self {
        let mut free = FreeGpus {
            fleet,
            by_model: Map::default(),
            by_layout: Map::default(),
            by_workload: Map::default(),
            current: Vec::with_capacity(fleet.len()),
            running: Vec::new(),
            spans: Vec::with_capacity(fleet.len()),
        };
        for (k, f) in fleet.iter().enumerate() {
            let start = free.running.len();
            if taken[k] {
                free.current.push(None);
                free.spans.push((start, start));
                continue;
            }
            let slot = (f.autoscaled, k);
            free.by_model.entry(f.model.as_str()).or_default().insert(slot);
            let runs = now.get(f.uuid.as_str());
            let layout = runs.map(|a| layout_key(&a.mig_layout));
            if let Some(layout) = layout {
                free.by_layout.entry((f.model.as_str(), layout)).or_default().insert(slot);
            }
            free.current.push(layout);
            free.running.extend(runs.into_iter().flat_map(|a| workload_digests(a)));
            for &w in &free.running[start..] {
                free.by_workload.entry((f.model.as_str(), w)).or_default().insert(slot);
            }
            free.spans.push((start, free.running.len()));
        }
        free
    }

    fn running_on(&self, k: usize) -> &[u64] {
        let (start, end) = self.spans[k];
        &self.running[start..end]
    }

    /// The free GPU of `model` that already runs the most of `workloads` (digests, sorted),
    /// by [`Kept`]'s weights, if one runs any: ties go to one with `layout`, then in the
    /// free sets' order.
    fn most_kept(&self, model: &str, workloads: &[u64], layout: LayoutKey, kept: &Kept) -> Option<usize> {
        self.candidates(model, workloads, layout, kept)
            .into_iter()
            .max_by_key(|c| (c.kept, c.same_layout, std::cmp::Reverse(self.order(c.gpu))))
            .map(|c| c.gpu)
    }

    /// The free GPUs of `model` that run any of `workloads` (digests, sorted), each with the
    /// weight of those it keeps: at most [`CANDIDATES_PER_WORKLOAD`] per distinct workload.
    fn candidates(&self, model: &str, workloads: &[u64], layout: LayoutKey, kept: &Kept) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = Vec::new();
        let mut seen = workloads.to_vec();
        seen.dedup();
        for w in seen {
            for &(_, k) in self.by_workload.get(&(model, w)).into_iter().flatten().take(CANDIDATES_PER_WORKLOAD) {
                if out.iter().any(|c| c.gpu == k) {
                    continue;
                }
                out.push(Candidate {
                    gpu: k,
                    kept: kept.weight(self.running_on(k), workloads),
                    same_layout: self.current[k] == Some(layout),
                });
            }
        }
        out
    }

    /// A free GPU's place in the order GPUs are taken ([`FreeSet`]'s).
    fn order(&self, k: usize) -> (bool, usize) {
        (self.fleet[k].autoscaled, k)
    }

    fn first(set: Option<&FreeSet>) -> Option<usize> {
        set.and_then(|s| s.first()).map(|&(_, k)| k)
    }

    fn take(&mut self, k: usize) {
        let f = &self.fleet[k];
        let slot = (f.autoscaled, k);
        if let Some(s) = self.by_model.get_mut(f.model.as_str()) {
            s.remove(&slot);
        }
        if let Some(layout) = self.current[k].take() {
            if let Some(s) = self.by_layout.get_mut(&(f.model.as_str(), layout)) {
                s.remove(&slot);
            }
        }
        let (start, end) = self.spans[k];
        for w in &self.running[start..end] {
            if let Some(s) = self.by_workload.get_mut(&(f.model.as_str(), *w)) {
                s.remove(&slot);
            }
        }
    }
}

/// A free physical GPU a planned one may take: how many of its workloads it runs already.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    gpu: usize,
    kept: u64,
    same_layout: bool,
}

/// What keeping a workload running is worth. A service whose planned workloads are not
/// exactly those its GPUs run now (a new configuration, one more or one fewer: its demand
/// changed) restarts whatever else is kept of it, so its kept workloads weigh 1; a workload
/// of any other service weighs [`UNCHANGED_WEIGHT`]: keeping it may spare its service any
/// restart (issue 59: a service whose demand did not change is not restarted by a change
/// to others).
struct Kept {
    /// Digests of the planned workloads of services whose workloads stay as they run.
    unchanged: std::collections::HashSet<u64, Hashing>,
}

/// The weight of a kept workload of a service without a new configuration.
const UNCHANGED_WEIGHT: u64 = 64;

impl Kept {
    /// From the pending planned GPUs' workloads against what the GPUs not taken yet run
    /// (`now`, by uuid; `taken`, by fleet index): the GPUs taken in round one run exactly
    /// their planned content, so a service's workloads elsewhere stay as they are when the
    /// two multisets are equal.
    fn new(fleet: &[FleetGpu], now: &Map<&str, &GpuAssignment>, taken: &[bool], planned: &[GpuAssignment], pending: &[usize]) -> Kept {
        let mut want: Map<&str, Vec<u64>> = Map::default();
        for &i in pending {
            for w in kept::running(&planned[i]) {
                want.entry(w.service).or_default().push(digest(|h| w.hash(h)));
            }
        }
        let mut have: Map<&str, Vec<u64>> = Map::default();
        for (f, _) in fleet.iter().zip(taken).filter(|(_, &taken)| !taken) {
            for w in now.get(f.uuid.as_str()).map(|a| kept::running(a)).unwrap_or_default() {
                if want.contains_key(w.service) {
                    have.entry(w.service).or_default().push(digest(|h| w.hash(h)));
                }
            }
        }
        let mut unchanged = std::collections::HashSet::default();
        for (service, mut planned) in want {
            let mut running = have.remove(service).unwrap_or_default();
            planned.sort_unstable();
            running.sort_unstable();
            if planned == running {
                unchanged.extend(planned);
            }
        }
        Kept { unchanged }
    }

    /// The weight of the workloads of `after` (digests, sorted) that `before` (sorted) runs.
    fn weight(&self, before: &[u64], after: &[u64]) -> u64 {
        kept::kept_weight(before, after, |d| if self.unchanged.contains(d) { UNCHANGED_WEIGHT } else { 1 })
    }
}

/// Most planned GPUs of one group matched exactly (`kept_match`); a larger group (a full
/// re-plan's, where services run alike on many GPUs) is matched greedily in plan order.
/// Kuhn-Munkres is O(n³): 48 rows are about 10⁵ steps.
const MAX_EXACT_MATCH: usize = 48;

/// Round two of [`assign_to_nodes`]: each planned GPU of `pending` (indices into `planned`,
/// in plan order) takes the free GPU that runs most of its workloads, so that as few
/// workloads restart as can be. Planned and free GPUs form groups (connected by "runs some
/// of its workloads"); a group of at most [`MAX_EXACT_MATCH`] planned GPUs is matched to
/// keep the most weight of workloads ([`Kept`]) in all (a maximum-weight bipartite matching, SpotServe's
/// mapping of old instances onto a new plan, arXiv 2311.15566), the rest greedily. Greedy
/// alone could hand a GPU to the planned one that keeps three of its workloads and leave
/// the one that would keep five with none: in issue 59's property test, unchanged
/// services restarted that way.
fn kept_match(
    free: &mut FreeGpus<'_>,
    now: &Map<&str, &GpuAssignment>,
    taken: &[bool],
    planned: &[GpuAssignment],
    plan: &Plan,
    pending: &[usize],
    picked: &mut [Option<usize>],
) {
    let digests: Vec<Vec<u64>> = pending.iter().map(|&i| workload_digests(&planned[i])).collect();
    let layouts: Vec<LayoutKey> = pending.iter().map(|&i| layout_key(&planned[i].mig_layout)).collect();
    let kept = Kept::new(free.fleet, now, taken, planned, pending);
    let edges: Vec<Vec<Candidate>> =
        pending.iter().enumerate().map(|(r, &i)| free.candidates(plan.gpus[i].gpu_type.as_str(), &digests[r], layouts[r], &kept)).collect();
    // Groups: union-find over pending rows (0..n) and the free GPUs they may take (n..).
    let mut node_of: Map<usize, usize> = Map::default();
    for c in edges.iter().flatten() {
        let next = pending.len() + node_of.len();
        node_of.entry(c.gpu).or_insert(next);
    }
    let mut parent: Vec<usize> = (0..pending.len() + node_of.len()).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    for (r, cs) in edges.iter().enumerate() {
        for c in cs {
            let (a, b) = (root(&mut parent, r), root(&mut parent, node_of[&c.gpu]));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for r in 0..pending.len() {
        groups.entry(root(&mut parent, r)).or_default().push(r);
    }
    for rows in groups.into_values() {
        if rows.len() == 1 || rows.len() > MAX_EXACT_MATCH {
            for &r in &rows {
                let i = pending[r];
                if let Some(k) = free.most_kept(plan.gpus[i].gpu_type.as_str(), &digests[r], layouts[r], &kept) {
                    free.take(k);
                    picked[i] = Some(k);
                }
            }
            continue;
        }
        let mut columns: Vec<usize> = rows.iter().flat_map(|&r| edges[r].iter().map(|c| c.gpu)).collect();
        columns.sort_unstable_by_key(|&k| free.order(k));
        columns.dedup();
        // A workload kept outweighs any number of layouts kept (at most 48 of them).
        let weight = |c: &Candidate| (c.kept as i64) * 64 + i64::from(c.same_layout);
        const { assert!(MAX_EXACT_MATCH < 64) };
        let width = columns.len().max(rows.len());
        let mut weights = pathfinding::matrix::Matrix::new(rows.len(), width, 0i64);
        for (row, &r) in rows.iter().enumerate() {
            for c in &edges[r] {
                let col = columns.iter().position(|&k| k == c.gpu).expect("a column per candidate");
                weights[(row, col)] = weight(c);
            }
        }
        let (_, columns_of) = pathfinding::kuhn_munkres::kuhn_munkres(&weights);
        for (row, &col) in columns_of.iter().enumerate() {
            if col < columns.len() && weights[(row, col)] > 0 {
                free.take(columns[col]);
                picked[pending[rows[row]]] = Some(columns[col]);
            }
        }
    }
}

/// Digests of the workloads `a` runs, sorted.
fn workload_digests(a: &GpuAssignment) -> Vec<u64> {
    let mut out: Vec<u64> = kept::running(a).iter().map(|w| digest(|h| w.hash(h))).collect();
    out.sort_unstable();
    out
}

/// The plan's GPUs on the fleet, and the services (with the reason) that lost GPUs for
/// want of a physical one.
///
/// In four rounds over the planned GPUs, so that a GPU's current work moves as little as
/// possible: first each planned GPU takes a free physical GPU that already runs exactly it
/// (no reconfiguration), then the one that runs the most of its workloads (a GPU whose plan
/// changed in part: only the changed workloads restart), then one with the same MIG layout
/// (no repartitioning), then any free GPU of its model. Within a round, planned GPUs go in
/// plan order.
pub fn assign_to_nodes(plan: &Plan, fleet: &[FleetGpu], current: Option<&PlanSpec>) -> (Vec<GpuAssignment>, BTreeMap<String, String>) {
    let now: Map<&str, &GpuAssignment> = current.map(|c| c.gpus.iter().map(|g| (g.gpu_uuid.as_str(), g)).collect()).unwrap_or_default();
    // The planned content of each GPU, placed on no GPU yet (node and uuid are filled in).
    let planned: Vec<GpuAssignment> = plan.gpus.iter().map(planned_assignment).collect();
    let mut picked: Vec<Option<usize>> = vec![None; planned.len()];
    let mut taken = vec![false; fleet.len()];
    let mut exact = exact_contents(fleet, &now);
    for (i, p) in planned.iter().enumerate() {
        let model = plan.gpus[i].gpu_type.as_str();
        if let Some(k) = exact.get_mut(&(model, content_key(p))).and_then(VecDeque::pop_front) {
            taken[k] = true;
            picked[i] = Some(k);
        }
    }
    drop(exact);
    let mut free = FreeGpus::new(fleet, &now, &taken);
    let pending: Vec<usize> = (0..planned.len()).filter(|&i| picked[i].is_none() && !planned[i].workloads.is_empty()).collect();
    kept_match(&mut free, &now, &taken, &planned, plan, &pending, &mut picked);
    for (i, p) in planned.iter().enumerate() {
        if picked[i].is_some() {
            continue;
        }
        let model = plan.gpus[i].gpu_type.as_str();
        if let Some(k) = FreeGpus::first(free.by_layout.get(&(model, layout_key(&p.mig_layout)))) {
            free.take(k);
            picked[i] = Some(k);
        }
    }
    let mut out = Vec::with_capacity(planned.len());
    let mut unplaced: BTreeMap<String, String> = BTreeMap::new();
    for (i, mut p) in planned.into_iter().enumerate() {
        let g = &plan.gpus[i];
        let k = picked[i].or_else(|| {
            let k = FreeGpus::first(free.by_model.get(g.gpu_type.as_str()))?;
            free.take(k);
            Some(k)
        });
        match k {
            Some(k) => {
                p.node.clone_from(&fleet[k].node);
                p.gpu_uuid.clone_from(&fleet[k].uuid);
                out.push(p);
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

impl FleetGpu {
    fn unplaced(model: &str) -> FleetGpu {
        FleetGpu { node: String::new(), uuid: String::new(), model: model.to_string(), autoscaled: false }
    }
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
    fn the_planned_batch_time_goes_with_the_assignment_within_the_plan_bound() {
        let (placed, _) = assign_to_nodes(&plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a")]), &fleet(1), None);
        assert_eq!(placed[0].workloads[0].batch_ms, 10.0, "the planner's prediction for the agent's router");
        for odd in [f64::NAN, -3.0, 1e9] {
            assert_eq!(planned_batch_ms(odd), 0.0, "{odd}: not known, rather than a Plan the state machine refuses");
        }
    }

    #[test]
    fn a_gpu_that_already_runs_the_planned_layout_keeps_it() {
        let first = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a"), gpu(1, &[(MigProfile::G4, 0), (MigProfile::G3, 4)], "b")]);
        let (now, unplaced) = assign_to_nodes(&first, &fleet(3), None);
        assert!(unplaced.is_empty());
        let current = PlanSpec {
            strategy: "t".into(),
            gpus: now.clone().into(),
            services: Default::default(),
            inputs_digest: String::new(),
            trace_parent: String::new(),
        };
        // The same plan with its GPUs in the other order lands on the same physical GPUs.
        let again = plan(vec![gpu(0, &[(MigProfile::G4, 0), (MigProfile::G3, 4)], "b"), gpu(1, &[(MigProfile::G7, 0)], "a")]);
        let (next, _) = assign_to_nodes(&again, &fleet(3), Some(&current));
        assert_eq!(next, now);
    }

    #[test]
    fn a_change_to_one_gpu_of_a_large_plan_moves_only_that_gpu() {
        let layout = [(MigProfile::G4, 0), (MigProfile::G3, 4)];
        let gpus: Vec<GpuPlan> = (0..400).map(|i| gpu(i, &layout, &format!("s{}", i % 37))).collect();
        let f = fleet(600);
        let (now, _) = assign_to_nodes(&plan(gpus.clone()), &f, None);
        let current = PlanSpec { strategy: "t".into(), gpus: now.clone().into(), ..PlanSpec::default() };
        // The same plan, reordered, with one GPU's batch changed: 399 GPUs stay exactly where
        // they are and the changed one keeps its MIG layout (no repartitioning anywhere).
        let mut next_gpus: Vec<GpuPlan> = gpus.into_iter().rev().collect();
        next_gpus[17].workloads[0].batch_size = 16;
        let (next, unplaced) = assign_to_nodes(&plan(next_gpus), &f, Some(&current));
        assert!(unplaced.is_empty());
        let before: BTreeSet<_> = now.iter().map(|a| (a.gpu_uuid.clone(), format!("{a:?}"))).collect();
        let changed: Vec<_> = next.iter().filter(|a| !before.contains(&(a.gpu_uuid.clone(), format!("{a:?}")))).collect();
        assert_eq!(changed.len(), 1, "{changed:?}");
        let was = now.iter().find(|a| a.gpu_uuid == changed[0].gpu_uuid).expect("the changed GPU was in use");
        assert_eq!(was.mig_layout, changed[0].mig_layout);
    }

    fn mig_gpu(slot: u32, placed: &[(MigProfile, u8, &str)]) -> GpuPlan {
        let mut g = gpu(slot, &placed.iter().map(|&(p, start, _)| (p, start)).collect::<Vec<_>>(), "");
        g.workloads = placed
            .iter()
            .enumerate()
            .map(|(i, &(_, _, service))| Workload { service: service.into(), mig_instance: Some(i), ..g.workloads[0].clone() })
            .collect();
        g
    }

    #[test]
    fn a_gpu_whose_plan_changed_in_part_stays_where_its_other_workloads_run() {
        use MigProfile::*;
        let f = fleet(3);
        // GPU-0 runs "a" (4g) and "b" (3g); GPU-1 runs the services "d", "e", "f" in the
        // layout 4g + 2g + 1g, which the next plan no longer has.
        let first = plan(vec![mig_gpu(0, &[(G4, 0, "a"), (G3, 4, "b")]), mig_gpu(1, &[(G4, 0, "d"), (G2, 4, "e"), (G1, 6, "f")])]);
        let (now, _) = assign_to_nodes(&first, &f, None);
        let current = PlanSpec { strategy: "t".into(), gpus: now.clone().into(), ..PlanSpec::default() };
        let on = |placed: &[GpuAssignment], service: &str| {
            placed.iter().find(|g| g.workloads.iter().any(|w| w.service == service)).map(|g| g.gpu_uuid.clone())
        };
        // "b" shrinks to 2g and "c" takes the 1g left: GPU-1 has that layout, but "a" runs on
        // GPU-0, so the changed GPU stays there and only "b" and "c" start.
        let next = plan(vec![mig_gpu(0, &[(G4, 0, "a"), (G2, 4, "b"), (G1, 6, "c")]), mig_gpu(1, &[(G7, 0, "x")])]);
        let (placed, unplaced) = assign_to_nodes(&next, &f, Some(&current));
        assert!(unplaced.is_empty());
        assert_eq!(on(&placed, "a"), on(&now, "a"));
        let before: HashMap<&str, &GpuAssignment> = now.iter().map(|g| (g.gpu_uuid.as_str(), g)).collect();
        let restarted: BTreeSet<&str> =
            placed.iter().flat_map(|g| kept::restarted_services(before.get(g.gpu_uuid.as_str()).copied(), Some(g))).collect();
        assert!(!restarted.contains("a"), "{restarted:?}");
        assert!(restarted.is_superset(&BTreeSet::from(["b", "c", "x"])), "{restarted:?}");
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
    fn of_gpus_that_run_exactly_the_planned_content_a_launched_one_is_taken_last() {
        let p = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a")]);
        let (first, _) = assign_to_nodes(&p, &fleet(1), None);
        // Three GPUs run that very content now; the first of them is on a launched node.
        let mut f = fleet(3);
        f[0].autoscaled = true;
        let running = |uuid: &str| GpuAssignment { gpu_uuid: uuid.into(), ..first[0].clone() };
        let current = PlanSpec {
            strategy: "t".into(),
            gpus: vec![running("GPU-0"), running("GPU-1"), running("GPU-2")].into(),
            ..PlanSpec::default()
        };
        let two = plan(vec![gpu(0, &[(MigProfile::G7, 0)], "a"), gpu(1, &[(MigProfile::G7, 0)], "a")]);
        let (placed, unplaced) = assign_to_nodes(&two, &f, Some(&current));
        assert!(unplaced.is_empty());
        assert_eq!(placed.iter().map(|g| g.gpu_uuid.as_str()).collect::<Vec<_>>(), ["GPU-1", "GPU-2"]);
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
