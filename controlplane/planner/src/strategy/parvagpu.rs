//! ParvaGPU (parvagpu.txt Sec. III): Segment Configurator (Alg. 1: Optimal Triplet Decision,
//! Demand Matching), Segment Allocator (Alg. 2: Segment Relocation, Allocation Optimization)
//! and minimal reconfiguration when one service's SLO changes (Sec. III-F).

use super::segments::{demand_matching, optimal_triplets, small_segments, Allocator, GpuSlots, OptimalTriplets, Segment, Triplet};
use crate::input::{GpuType, PlanningInput, ServiceDemand};
use crate::mig::Placement;
use crate::plan::{predictions_from_gpus, GpuPlan, Infeasible, InfeasibleReason, MigInstance, Plan, Sharing, Workload};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// ParvaGPU parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParvaConfig {
    /// Batch latency budget = `latency_margin × SLO / 2`. The paper sets the internal latency
    /// to half the SLO (Sec. IV); the published scheduler additionally keeps a 10% margin, so
    /// a segment is accepted when its profiled latency < 0.9 × SLO / 2.
    pub latency_margin: f64,
    /// Most MPS processes per segment. Sec. III-C suggests profiling up to three, but the
    /// published deployments run 4 and 5 (e.g. mobilenetv2 on 4g at batch 64 with 4
    /// processes in scenario 6), so the scheduler takes whatever the profile holds: 5 by
    /// default, which reproduces every published map.
    pub max_processes: u32,
    /// Allocation Optimization splits GPUs with at most this many GPCs (Sec. III-E2: 4).
    pub optimization_threshold_gpcs: u32,
    /// Whether to run Allocation Optimization at all.
    pub optimize: bool,
}

impl Default for ParvaConfig {
    fn default() -> Self {
        ParvaConfig { latency_margin: 0.9, max_processes: 5, optimization_threshold_gpcs: 4, optimize: true }
    }
}

impl ParvaConfig {
    pub fn budget_ms(&self, slo_ms: f64) -> f64 {
        self.latency_margin * slo_ms / 2.0
    }
}

/// Services grouped by the MIG GPU type they will run on, with their optimal triplets.
pub(crate) struct Configured<'a> {
    pub gpu_type: &'a GpuType,
    /// (index into input.services, triplets, segments from Demand Matching)
    pub services: Vec<(usize, OptimalTriplets, Vec<Triplet>)>,
}

pub(crate) fn check_demand(s: &ServiceDemand) -> Option<InfeasibleReason> {
    if !(s.request_rate > 0.0 && s.request_rate.is_finite()) {
        return Some(InfeasibleReason::InvalidDemand { detail: format!("request rate {} must be positive", s.request_rate) });
    }
    if !(s.slo_ms > 0.0 && s.slo_ms.is_finite()) {
        return Some(InfeasibleReason::InvalidDemand { detail: format!("SLO {} ms must be positive", s.slo_ms) });
    }
    None
}

/// Segment Configurator (Alg. 1) for every service, on the cheapest MIG type that has a
/// profile for its model. Services that cannot be served get a reason.
pub(crate) fn configure<'a>(input: &'a PlanningInput, cfg: &ParvaConfig) -> (Vec<Configured<'a>>, Vec<Infeasible>) {
    let mut types: Vec<&GpuType> = input.gpu_types.iter().filter(|t| t.mig()).collect();
    types.sort_by(|a, b| a.price_per_hour.total_cmp(&b.price_per_hour));
    let mut groups: Vec<Configured<'a>> = types.iter().map(|t| Configured { gpu_type: t, services: Vec::new() }).collect();
    let mut infeasible = Vec::new();
    for (i, s) in input.services.iter().enumerate() {
        if let Some(reason) = check_demand(s) {
            infeasible.push(Infeasible { service: s.name.clone(), reason });
            continue;
        }
        if types.is_empty() {
            infeasible.push(Infeasible { service: s.name.clone(), reason: InfeasibleReason::NoGpuType { needed: "MIG".into() } });
            continue;
        }
        let mut reason = InfeasibleReason::NoProfile { model: s.model.clone() };
        let mut placed = false;
        for (gi, t) in types.iter().enumerate() {
            let Some(table) = input.profiles.table(&t.name, &s.model) else { continue };
            let tri = optimal_triplets(table, cfg.budget_ms(s.slo_ms), cfg.max_processes);
            // In units of its slowest optimal segment, so every mix the strategies try
            // (Demand Matching, the exact and joint searches) stays within the bound.
            let slowest = tri.iter().flatten().map(|t| t.throughput).fold(f64::INFINITY, f64::min);
            if slowest.is_finite() {
                if let Err(too_large) = crate::bounds::check_instances(s.request_rate, slowest, "segment") {
                    reason = too_large;
                    continue;
                }
            }
            match demand_matching(&tri, s.request_rate) {
                Some(segs) => {
                    groups[gi].services.push((i, tri, segs));
                    placed = true;
                    break;
                }
                None => {
                    let best = table
                        .points
                        .iter()
                        .filter(|p| p.processes <= cfg.max_processes)
                        .map(|p| p.latency_s * 1000.0)
                        .fold(f64::INFINITY, f64::min);
                    reason = InfeasibleReason::SloTooTight { slo_ms: s.slo_ms, best_latency_ms: best };
                }
            }
        }
        if !placed {
            infeasible.push(Infeasible { service: s.name.clone(), reason });
        }
    }
    groups.retain(|g| !g.services.is_empty());
    (groups, infeasible)
}

/// Allocation Optimization (Alg. 2 lines 10-30), applied to the GPUs in `candidates`
/// (visited from the last). A GPU with at most `threshold` GPCs has its segments freed and
/// replaced by size-1/2 segments of the same services (SmallSegments), which Allocation
/// re-places from the first GPU on. Surplus throughput of the small segments is carried per
/// service to the next GPU (`freed_rate`).
///
/// Guard (ours, not in the paper): a step is kept only if it empties the GPU without opening
/// a new one; otherwise it is undone. Without the guard a split can land back on the same GPU
/// or spill onto a new one, adding GPCs and reconfiguration for no saved GPU.
pub(crate) fn allocation_optimization(alloc: &mut Allocator, tris: &HashMap<usize, OptimalTriplets>, threshold: u32, candidates: &[usize]) {
    let mut freed_rate: HashMap<usize, f64> = HashMap::new();
    for &i in candidates.iter().rev() {
        if i >= alloc.gpus.len() {
            continue;
        }
        let g = &alloc.gpus[i];
        if g.segments.is_empty() || g.gpcs() > threshold {
            continue;
        }
        // Only GPUs whose every service has small triplets can be emptied.
        if g.segments.iter().any(|(_, s)| tris.get(&s.service).is_none_or(|t| t[0].is_none() && t[1].is_none())) {
            continue;
        }
        let saved_rates = freed_rate.clone();
        let n_before = alloc.gpus.len();
        let freed = alloc.free_gpu(i);
        let mut queue = Vec::new();
        // Small segments that cannot cover a freed rate (e.g. beyond the planner's bound per
        // service) undo the step: emptying the GPU then would drop the service's capacity.
        let mut covered = true;
        for (_, seg) in &freed {
            let r = freed_rate.entry(seg.service).or_insert(0.0);
            *r += seg.triplet.throughput;
            let Some(small) = small_segments(&tris[&seg.service], *r) else {
                covered = false;
                break;
            };
            for t in small {
                *r -= t.throughput;
                queue.push(Segment { service: seg.service, triplet: t });
            }
        }
        let placed = alloc.allocate(queue);
        let ok = covered && alloc.gpus[i].segments.is_empty() && alloc.gpus.len() == n_before;
        if !ok {
            for (g, p) in placed {
                alloc.remove(g, p);
            }
            alloc.gpus.truncate(n_before);
            for (p, s) in freed {
                alloc.put(i, p, s);
            }
            freed_rate = saved_rates;
        }
    }
    alloc.truncate_empty_tail();
}

/// Converts a deployment map into GPU plans (empty GPUs dropped).
pub(crate) fn to_gpu_plans(alloc: &Allocator, type_name: &str, services: &[ServiceDemand]) -> Vec<GpuPlan> {
    alloc
        .gpus
        .iter()
        .filter(|g| !g.segments.is_empty())
        .map(|g| {
            let mut segs = g.segments.clone();
            segs.sort_by_key(|(p, _)| p.start);
            GpuPlan {
                gpu_type: type_name.to_string(),
                slot: g.slot,
                sharing: Sharing::Mig { instances: segs.iter().map(|(p, _)| MigInstance { profile: p.profile, start: p.start }).collect() },
                workloads: segs.iter().enumerate().map(|(k, (_, s))| segment_workload(k, s, services)).collect(),
            }
        })
        .collect()
}

fn segment_workload(instance: usize, s: &Segment, services: &[ServiceDemand]) -> Workload {
    let t = s.triplet;
    Workload {
        service: services[s.service].name.clone(),
        mig_instance: Some(instance),
        // Identical processes split the instance evenly.
        mps_percent: 100.0 / f64::from(t.processes),
        batch_size: t.batch,
        processes: t.processes,
        shadow_percent: 0.0,
        predicted_throughput: t.throughput,
        predicted_latency_ms: t.latency_ms,
    }
}

/// ParvaGPU provisioning: Alg. 1 then Alg. 2 (Relocation + Optimization).
pub fn plan(input: &PlanningInput, cfg: &ParvaConfig) -> Plan {
    let (groups, infeasible) = configure(input, cfg);
    let mut gpus = Vec::new();
    let mut slot_base = 0;
    for g in &groups {
        let mut alloc = relocate(g);
        if cfg.optimize {
            let tris: HashMap<usize, OptimalTriplets> = g.services.iter().map(|(i, t, _)| (*i, *t)).collect();
            let all: Vec<usize> = (0..alloc.gpus.len()).collect();
            allocation_optimization(&mut alloc, &tris, cfg.optimization_threshold_gpcs, &all);
        }
        let mut plans = to_gpu_plans(&alloc, &g.gpu_type.name, &input.services);
        for p in &mut plans {
            p.slot += slot_base;
        }
        slot_base += alloc.gpus.len() as u32;
        gpus.extend(plans);
    }
    Plan { strategy: "parvagpu".into(), predictions: predictions_from_gpus(&gpus, &input.services), gpus, infeasible }
}

/// Segment Relocation (Alg. 2 lines 1-9): enqueue every service's segments, then Allocation.
pub(crate) fn relocate(g: &Configured<'_>) -> Allocator {
    let mut alloc = Allocator::new();
    let queue: Vec<Segment> =
        g.services.iter().flat_map(|(i, _, segs)| segs.iter().map(move |t| Segment { service: *i, triplet: *t })).collect();
    alloc.allocate(queue);
    alloc
}

/// Minimal reconfiguration after the SLO or rate of `changed` (matched by name) changes
/// (Sec. III-F): only that service's segments are recomputed (no re-profiling), removed from
/// the map and relocated into free space first-fit; Allocation Optimization then runs only on
/// the GPUs that hosted the service before or after and hold nothing else, so every other
/// service's instances keep their GPU, profile and start and need no reconfiguration. `previous` must be a ParvaGPU /
/// exact plan for `input` (minus the change).
pub fn replan_service(previous: &Plan, input: &PlanningInput, changed: &ServiceDemand, cfg: &ParvaConfig) -> Plan {
    let mut services = input.services.clone();
    let idx = match services.iter().position(|s| s.name == changed.name) {
        Some(i) => {
            services[i] = changed.clone();
            i
        }
        None => {
            services.push(changed.clone());
            services.len() - 1
        }
    };
    let by_name: HashMap<&str, usize> = services.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let input2 = PlanningInput { gpu_types: input.gpu_types.clone(), services: services.clone(), profiles: input.profiles.clone() };
    let (groups, mut infeasible) = configure(&input2, cfg);
    // Only the changed service may newly become infeasible; keep other refusals as they were.
    infeasible.retain(|f| f.service == changed.name || previous.infeasible.iter().any(|p| p.service == f.service));

    // Rebuild one allocator per GPU type from the previous plan.
    let mut per_type: Vec<(String, Allocator, Vec<usize>)> = Vec::new();
    let mut type_of: HashMap<String, usize> = HashMap::new();
    let mut next_slot = 0;
    let prev_max = previous.gpus.iter().map(|g| g.slot + 1).max().unwrap_or(0);
    // The changed service's segments, which stay held while its new ones are placed: the
    // new ones go beside them, so that the old keep serving until the new serve
    // (make-before-break; the controller's `provision::handover` keeps them there as
    // retiring). Their slices are free again for the next change.
    let mut old: Vec<(usize, usize, Placement)> = Vec::new();
    for (name, a) in deployment_maps(previous, &by_name) {
        let k = per_type.len();
        type_of.insert(name.clone(), k);
        let mut touched = Vec::new();
        for gi in 0..a.gpus.len() {
            let mine = a.gpus[gi].segments.iter().filter(|(_, s)| s.service == idx).map(|(p, _)| (k, gi, *p));
            let before = old.len();
            old.extend(mine);
            if old.len() > before {
                touched.push(gi);
            }
        }
        per_type.push((name, a, touched));
    }
    let mut tris: HashMap<usize, OptimalTriplets> = HashMap::new();
    for g in &groups {
        for (i, t, segs) in &g.services {
            tris.insert(*i, *t);
            if *i != idx {
                continue;
            }
            let k = *type_of.entry(g.gpu_type.name.clone()).or_insert_with(|| {
                per_type.push((g.gpu_type.name.clone(), Allocator::from_gpus(Vec::new(), prev_max), Vec::new()));
                per_type.len() - 1
            });
            let (_, a, touched) = &mut per_type[k];
            // A segment the new sizing has again stays where it runs: nothing restarts.
            let mut queue = Vec::new();
            for t in segs {
                let same = |&(ok, gi, p): &(usize, usize, Placement)| {
                    ok == k && a.gpus[gi].segments.iter().any(|(q, s)| *q == p && s.service == idx && same_process(&s.triplet, t))
                };
                match old.iter().position(same) {
                    Some(j) => {
                        let (_, gi, p) = old.swap_remove(j);
                        if let Some(seg) = a.gpus[gi].segments.iter_mut().find(|(q, _)| *q == p) {
                            seg.1.triplet = *t;
                        }
                    }
                    None => queue.push(Segment { service: idx, triplet: *t }),
                }
            }
            for (gi, _) in a.allocate(queue) {
                touched.push(gi);
            }
        }
    }
    for (k, gi, p) in old {
        per_type[k].1.remove(gi, p);
    }
    let mut gpus = Vec::new();
    for (name, mut a, mut touched) in per_type {
        // New GPUs got slots >= prev_max from their own allocator; renumber them globally so
        // two GPU types never share a slot.
        for g in a.gpus.iter_mut().filter(|g| g.slot >= prev_max) {
            g.slot = prev_max + next_slot;
            next_slot += 1;
        }
        if cfg.optimize {
            touched.sort_unstable();
            touched.dedup();
            // Only GPUs that hold the changed service alone: emptying one moves that service
            // and no other, whose demand did not change (issue 59: a change restarts only
            // what must move). A GPU shared with others waits for a consolidation, which
            // repacks when its saving pays for the restarts.
            touched.retain(|&gi| a.gpus.get(gi).is_some_and(|g| g.segments.iter().all(|(_, s)| s.service == idx)));
            allocation_optimization(&mut a, &tris, cfg.optimization_threshold_gpcs, &touched);
        }
        gpus.extend(to_gpu_plans(&a, &name, &services));
    }
    gpus.sort_by_key(|g| g.slot);
    Plan { strategy: previous.strategy.clone(), predictions: predictions_from_gpus(&gpus, &services), gpus, infeasible }
}

/// Whether two triplets run the same processes (instance size, batch, process count): the
/// throughput figures may differ between a plan read back and a new sizing.
fn same_process(a: &Triplet, b: &Triplet) -> bool {
    (a.gpcs, a.batch, a.processes) == (b.gpcs, b.batch, b.processes)
}

/// The deployment map of each GPU type of `previous` (a ParvaGPU or exact plan), in type
/// name order (new GPUs are numbered type by type, and a plan must not depend on a hash
/// seed); `by_name` gives each service's index in the input. New GPUs get slots from the
/// previous plan's highest on.
fn deployment_maps(previous: &Plan, by_name: &HashMap<&str, usize>) -> Vec<(String, Allocator)> {
    let mut maps: std::collections::BTreeMap<String, Vec<GpuSlots>> = std::collections::BTreeMap::new();
    let prev_max = previous.gpus.iter().map(|g| g.slot + 1).max().unwrap_or(0);
    for g in &previous.gpus {
        let Sharing::Mig { instances } = &g.sharing else { continue };
        let mut slots = GpuSlots { slot: g.slot, ..GpuSlots::default() };
        for w in &g.workloads {
            let (Some(k), Some(&si)) = (w.mig_instance, by_name.get(w.service.as_str())) else { continue };
            let inst = instances[k];
            let p = Placement::new(inst.profile, inst.start);
            slots.occ.add(p);
            slots.segments.push((
                p,
                Segment {
                    service: si,
                    triplet: Triplet {
                        gpcs: inst.profile.compute(),
                        batch: w.batch_size,
                        processes: w.processes,
                        throughput: w.predicted_throughput,
                        latency_ms: w.predicted_latency_ms,
                    },
                },
            ));
        }
        maps.entry(g.gpu_type.clone()).or_default().push(slots);
    }
    maps.into_iter().map(|(name, gpus)| (name, Allocator::from_gpus(gpus, prev_max))).collect()
}

/// Consolidation in small steps (ours; GRMU, arXiv 2502.01909, repacks by migrating a few
/// MIG instances rather than replanning): Allocation Optimization (Alg. 2 lines 10-30) over
/// every GPU of `previous`, which empties each GPU using at most the threshold's GPCs into
/// the free slots of the others, its segments split into small ones, and keeps a step only
/// when it frees the GPU without opening one. Only the services on the emptied GPUs move;
/// every other segment keeps its GPU, profile and start. `input` holds the services'
/// current demands, which `previous` was planned for.
pub fn compact(previous: &Plan, input: &PlanningInput, cfg: &ParvaConfig) -> Plan {
    let by_name: HashMap<&str, usize> = input.services.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let (groups, _) = configure(input, cfg);
    let tris: HashMap<usize, OptimalTriplets> = groups.iter().flat_map(|g| g.services.iter().map(|(i, t, _)| (*i, *t))).collect();
    let mut gpus = Vec::new();
    for (name, mut a) in deployment_maps(previous, &by_name) {
        let all: Vec<usize> = (0..a.gpus.len()).collect();
        allocation_optimization(&mut a, &tris, cfg.optimization_threshold_gpcs, &all);
        gpus.extend(to_gpu_plans(&a, &name, &input.services));
    }
    gpus.sort_by_key(|g| g.slot);
    Plan {
        strategy: previous.strategy.clone(),
        predictions: predictions_from_gpus(&gpus, &input.services),
        gpus,
        infeasible: previous.infeasible.clone(),
    }
}

/// Lower bound on GPUs for a set of segment sizes: compute (7 per GPU) and memory slices
/// (8 per GPU; a 3g takes 4).
pub fn gpu_lower_bound(gpcs: u32) -> u32 {
    gpcs.div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;
    use crate::perf::synthetic::example_models;

    fn a100() -> GpuType {
        GpuType { name: "a100".into(), model: GpuModel::A100_80GB, price_per_hour: 4.0, mps: true, igniter: None }
    }

    fn input(services: &[(&str, &str, f64, f64)]) -> PlanningInput {
        let mut input = PlanningInput { gpu_types: vec![a100()], ..Default::default() };
        let tables = example_models().into_iter().map(|m| (m.name.clone(), m.table(3))).collect();
        input.profiles.tables.insert("a100".into(), tables);
        input.services = services
            .iter()
            .map(|&(name, model, slo_ms, request_rate)| ServiceDemand { name: name.into(), model: model.into(), slo_ms, request_rate })
            .collect();
        input
    }

    fn instance_gpcs(g: &GpuPlan, w: &Workload) -> u8 {
        match &g.sharing {
            Sharing::Mig { instances } => instances[w.mig_instance.unwrap()].profile.compute(),
            Sharing::MpsOnly => panic!("ParvaGPU plans only MIG GPUs"),
        }
    }

    /// (GPU slot, start, GPCs, batch, processes) of every segment of `service`.
    fn placements_of(plan: &Plan, service: &str) -> Vec<(u32, u8, u8, u32, u32)> {
        let mut out: Vec<_> = plan
            .gpus
            .iter()
            .flat_map(|g| {
                g.workloads.iter().filter(|w| w.service == service).map(move |w| {
                    let Sharing::Mig { instances } = &g.sharing else { unreachable!() };
                    let inst = instances[w.mig_instance.unwrap()];
                    (g.slot, inst.start, inst.profile.compute(), w.batch_size, w.processes)
                })
            })
            .collect();
        out.sort_unstable();
        out
    }

    fn mixed() -> PlanningInput {
        input(&[
            ("vision-a", "resnet50", 40.0, 6000.0),
            ("vision-b", "inception", 60.0, 3000.0),
            ("edge", "mobilenet", 20.0, 9000.0),
            ("search", "bert-base", 80.0, 1500.0),
            ("archive", "vgg19", 100.0, 700.0),
        ])
    }

    #[test]
    fn plan_serves_every_service_within_half_the_slo_on_valid_layouts() {
        let input = mixed();
        let cfg = ParvaConfig::default();
        let plan = plan(&input, &cfg);
        assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
        for s in &input.services {
            let p = plan.prediction(&s.name).unwrap();
            assert!(p.capacity_rps >= s.request_rate, "{}: {} < {}", s.name, p.capacity_rps, s.request_rate);
            assert!(p.latency_ms < cfg.budget_ms(s.slo_ms), "{}: {} ms", s.name, p.latency_ms);
        }
        for g in &plan.gpus {
            let Sharing::Mig { instances } = &g.sharing else { panic!("MIG expected") };
            crate::mig::validate(&instances.iter().map(MigInstance::placement).collect::<Vec<_>>()).unwrap();
            for w in &g.workloads {
                assert!(w.processes <= cfg.max_processes);
                assert!((w.mps_percent * f64::from(w.processes) - 100.0).abs() < 1e-9);
                assert!(instance_gpcs(g, w) > 0);
            }
        }
        // Slots are unique: the controller maps them to physical GPUs.
        let mut slots: Vec<u32> = plan.gpus.iter().map(|g| g.slot).collect();
        slots.dedup();
        assert_eq!(slots.len(), plan.gpus.len());
    }

    #[test]
    fn allocation_optimization_fills_the_slots_that_relocation_leaves_free() {
        // Relocation gives every 3g its own GPU at slot 4; Optimization splits the GPUs with at
        // most 4 GPCs into 1g/2g segments and moves them into those GPUs' free slots 0-3.
        let input = mixed();
        let on = plan(&input, &ParvaConfig::default());
        let off = plan(&input, &ParvaConfig { optimize: false, ..ParvaConfig::default() });
        assert!(on.gpus_used() < off.gpus_used(), "optimised {} vs unoptimised {}", on.gpus_used(), off.gpus_used());
        for s in &input.services {
            assert!(on.prediction(&s.name).unwrap().capacity_rps >= s.request_rate, "{} lost capacity when split", s.name);
        }
        // The threshold matters: with 0 nothing is split.
        let none = plan(&input, &ParvaConfig { optimization_threshold_gpcs: 0, ..ParvaConfig::default() });
        assert_eq!(none.gpus_used(), off.gpus_used());
    }

    #[test]
    fn compacting_empties_sparse_gpus_and_moves_nothing_else() {
        // Without Allocation Optimization every 3g has a GPU of its own: sparse GPUs, as
        // minimal re-plans leave them.
        let input = mixed();
        let sparse = plan(&input, &ParvaConfig { optimize: false, ..ParvaConfig::default() });
        let compacted = compact(&sparse, &input, &ParvaConfig::default());
        assert!(compacted.gpus_used() < sparse.gpus_used(), "{} GPUs, was {}", compacted.gpus_used(), sparse.gpus_used());
        for s in &input.services {
            assert!(compacted.prediction(&s.name).unwrap().capacity_rps >= s.request_rate, "{} lost capacity", s.name);
        }
        // A GPU that is still used keeps every segment it had; the emptied GPUs' services
        // went to free slots.
        let content = |p: &Plan, slot: u32| {
            p.gpus.iter().find(|g| g.slot == slot).map(|g| {
                let Sharing::Mig { instances } = &g.sharing else { unreachable!("ParvaGPU plans MIG GPUs") };
                g.workloads.iter().map(|w| (w.service.clone(), instances[w.mig_instance.unwrap()], w.batch_size)).collect::<Vec<_>>()
            })
        };
        for g in &sparse.gpus {
            if let Some(now) = content(&compacted, g.slot) {
                for kept in content(&sparse, g.slot).unwrap() {
                    assert!(now.contains(&kept), "slot {}: {kept:?} moved", g.slot);
                }
            }
        }
        // An already compact plan stays as it is.
        let optimized = plan(&input, &ParvaConfig::default());
        assert_eq!(compact(&optimized, &input, &ParvaConfig::default()).gpus, optimized.gpus);
    }

    #[test]
    fn changing_one_service_keeps_every_other_segment_where_it_was() {
        // Sec. III-F: only the changed service's segments are recomputed and relocated, and
        // Optimization runs only on the GPUs it occupied before or after. Every other GPU keeps
        // its instances (same slot, start, size, batch, processes).
        let input = mixed();
        let cfg = ParvaConfig::default();
        let before = plan(&input, &cfg);
        let total: usize = before.gpus.iter().map(|g| g.workloads.len()).sum();
        for (rate, slo) in [(9000.0, 40.0), (600.0, 40.0), (6000.0, 32.0)] {
            let changed = ServiceDemand { request_rate: rate, slo_ms: slo, ..input.services[0].clone() };
            let after = replan_service(&before, &input, &changed, &cfg);
            let touched: Vec<u32> = placements_of(&before, &changed.name)
                .into_iter()
                .chain(placements_of(&after, &changed.name))
                .map(|(slot, ..)| slot)
                .collect();
            let mut moved = 0;
            for s in &input.services[1..] {
                let new = placements_of(&after, &s.name);
                for seg in placements_of(&before, &s.name) {
                    if new.contains(&seg) {
                        continue;
                    }
                    moved += 1;
                    assert!(touched.contains(&seg.0), "{}: {seg:?} moved off GPU {} that {} never used", s.name, seg.0, changed.name);
                }
                let cap = after.prediction(&s.name).unwrap().capacity_rps;
                assert!(cap >= s.request_rate, "{}: {cap}", s.name);
            }
            assert!(moved * 4 < total, "{moved} of {total} segments moved for one service's change");
            let p = after.prediction(&changed.name).unwrap_or_else(|| panic!("{rate} req/s, {slo} ms: {:?}", after.infeasible));
            assert!(p.capacity_rps >= rate && p.latency_ms < cfg.budget_ms(slo), "{p:?}");
        }
    }

    #[test]
    fn infeasible_services_are_named_with_the_reason() {
        let mut input = mixed();
        input.services.push(ServiceDemand { name: "impossible".into(), model: "vgg19".into(), slo_ms: 1.0, request_rate: 10.0 });
        input.services.push(ServiceDemand { name: "unknown".into(), model: "gpt-9".into(), slo_ms: 100.0, request_rate: 10.0 });
        input.services.push(ServiceDemand { name: "zero".into(), model: "resnet50".into(), slo_ms: 100.0, request_rate: 0.0 });
        let plan = plan(&input, &ParvaConfig::default());
        let reason = |name: &str| plan.infeasible.iter().find(|f| f.service == name).map(|f| f.reason.clone());
        assert!(matches!(reason("impossible"), Some(InfeasibleReason::SloTooTight { .. })), "{plan:?}");
        assert_eq!(reason("unknown"), Some(InfeasibleReason::NoProfile { model: "gpt-9".into() }));
        assert!(matches!(reason("zero"), Some(InfeasibleReason::InvalidDemand { .. })));
        assert!(plan.prediction("vision-a").is_some(), "the others are still planned");
        let no_mig = PlanningInput { gpu_types: vec![GpuType { model: GpuModel::NoMig, ..a100() }], ..mixed() };
        let plan = super::plan(&no_mig, &ParvaConfig::default());
        assert_eq!(plan.infeasible.len(), no_mig.services.len());
        assert!(plan.infeasible.iter().all(|f| matches!(f.reason, InfeasibleReason::NoGpuType { .. })));
    }
}
