//! Exact MIG provisioning: never worse than the ParvaGPU heuristic.
//!
//! Two exact steps replace ParvaGPU's greedy ones:
//! 1. per service, the segment mix of minimum total GPCs whose throughput covers the request
//!    rate (ParvaGPU's Demand Matching takes `floor(rate / OptSeg)` optimal segments plus the
//!    smallest sufficient one, which is not always minimal: Sec. III-D, Eq. 2);
//! 2. the packing of all segments of one GPU type onto the fewest GPUs, as an integer covering
//!    program over the maximal MIG layouts: choose how many GPUs use each layout so that every
//!    segment size has enough slots. Every feasible GPU is a sub-layout of some maximal layout
//!    (`mig::maximal_layouts`), so covering the size counts is exactly packing.
//!
//! 3. for GPU types with few services, both at once: the joint choice of
//!    [`super::joint`], which must beat the better of step 2's packings.
//!
//! Steps 1 and 2 are solved by depth-first branch and bound. The crate has no clock, so the "time bound"
//! is a budget of search nodes; when it runs out the best solution found so far is used. The
//! result is then compared with the ParvaGPU plan for the same input and the better one (fewer
//! GPUs, then fewer GPCs) is returned, so this mode is never worse than the heuristic.

use super::joint::{self, ServiceChoice};
use super::parvagpu::{self, configure, to_gpu_plans, ParvaConfig};
use super::segments::{Allocator, GpuSlots, OptimalTriplets, Segment, Triplet, SIZES};
use crate::input::PlanningInput;
use crate::mig::{maximal_layouts, MigProfile, Occupancy, Placement};
use crate::plan::{predictions_from_gpus, Plan};
use serde::{Deserialize, Serialize};

/// Parameters of the exact planner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExactConfig {
    /// Latency budget, process limit and the heuristic used as the fall-back.
    pub parva: ParvaConfig,
    /// Search nodes allowed per service mix and per GPU-type packing before the best
    /// solution found so far is taken (deterministic stand-in for a time limit).
    pub node_budget: u64,
    /// GPU types with at most this many services also get the joint choice of mixes
    /// ([`joint`]); larger ones keep the two-step result, whose cost grows linearly.
    pub joint_max_services: usize,
    /// Search nodes allowed to the joint choice per GPU type.
    pub joint_node_budget: u64,
}

impl Default for ExactConfig {
    fn default() -> Self {
        ExactConfig { parva: ParvaConfig::default(), node_budget: 2_000_000, joint_max_services: 64, joint_node_budget: 2_000_000 }
    }
}

/// How the exact search went; returned beside the plan for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchReport {
    /// Every search finished within its budget, so the packing is optimal for the chosen
    /// segment mixes.
    pub proven_optimal: bool,
    /// The ParvaGPU plan was at least as good and was returned instead.
    pub used_heuristic: bool,
    /// The joint choice of mixes ran to completion on every GPU type: no choice of segment
    /// mixes packs onto fewer GPUs.
    pub joint_proven_optimal: bool,
    pub nodes: u64,
}

/// Size counts indexed like [`SIZES`] without the 7 (a 7g segment always takes a whole GPU).
type SizeCounts = [u32; 4];

/// The segment mix of minimum total GPCs covering `rate` from the optimal triplets of each
/// size (ties: fewer segments). Returns `None` when the service has no feasible triplet, and
/// whether the search completed within `budget` nodes.
pub fn min_gpc_mix(tri: &OptimalTriplets, rate: f64, budget: u64) -> Option<(Vec<Triplet>, bool)> {
    let mut options: Vec<Triplet> = tri.iter().flatten().copied().collect();
    if options.is_empty() {
        return None;
    }
    // Most efficient first, so the first dive is Demand Matching's answer or better.
    options.sort_by(|a, b| b.per_gpc().total_cmp(&a.per_gpc()));
    let best_per_gpc = options[0].per_gpc();
    let heuristic = parvagpu_mix(tri, rate)?;
    let mut search = MixSearch {
        options: &options,
        best_per_gpc,
        best: mix_cost(&heuristic),
        best_counts: None,
        counts: vec![0; options.len()],
        nodes: 0,
        budget,
    };
    search.dive(0, rate, 0, 0);
    let complete = search.nodes <= budget;
    let mix = match search.best_counts {
        Some(counts) => counts.iter().zip(&options).flat_map(|(&n, t)| std::iter::repeat_n(*t, n as usize)).collect(),
        None => heuristic,
    };
    Some((mix, complete))
}

fn parvagpu_mix(tri: &OptimalTriplets, rate: f64) -> Option<Vec<Triplet>> {
    super::segments::demand_matching(tri, rate)
}

/// (total GPCs, segments): the order in which mixes are compared.
fn mix_cost(mix: &[Triplet]) -> (u32, u32) {
    (mix.iter().map(|t| u32::from(t.gpcs)).sum(), mix.len() as u32)
}

struct MixSearch<'a> {
    options: &'a [Triplet],
    best_per_gpc: f64,
    best: (u32, u32),
    best_counts: Option<Vec<u32>>,
    counts: Vec<u32>,
    nodes: u64,
    budget: u64,
}

impl MixSearch<'_> {
    fn dive(&mut self, i: usize, left: f64, gpcs: u32, segs: u32) {
        self.nodes += 1;
        if self.nodes > self.budget {
            return;
        }
        if left <= 1e-9 {
            if (gpcs, segs) < self.best {
                self.best = (gpcs, segs);
                self.best_counts = Some(self.counts.clone());
            }
            return;
        }
        if i == self.options.len() {
            return;
        }
        // No mix covers `left` with fewer GPCs than at the best throughput per GPC.
        let bound = gpcs + (left / self.best_per_gpc - 1e-9).ceil().max(0.0) as u32;
        if (bound, 0) >= self.best {
            return;
        }
        let t = self.options[i];
        let most = (left / t.throughput - 1e-9).ceil().max(0.0) as u32;
        for n in (0..=most).rev() {
            self.counts[i] = n;
            self.dive(
                i + 1,
                left - f64::from(n) * t.throughput,
                gpcs.saturating_add(n.saturating_mul(u32::from(t.gpcs))),
                segs.saturating_add(n),
            );
        }
        self.counts[i] = 0;
    }
}

/// A maximal layout as slot counts per size, with the placements that realise it.
#[derive(Debug, Clone)]
struct LayoutKind {
    slots: SizeCounts,
    placements: Vec<Placement>,
}

fn size_slot(gpcs: u8) -> Option<usize> {
    SIZES[..4].iter().position(|&s| s == gpcs)
}

/// The maximal layouts without 7g, deduplicated by slot counts and without any layout whose
/// counts another layout dominates (it could always be swapped for the dominating one).
fn layout_kinds() -> Vec<LayoutKind> {
    let mut kinds: Vec<LayoutKind> = Vec::new();
    for layout in maximal_layouts(&MigProfile::PARVA) {
        if layout.iter().any(|p| p.profile == MigProfile::G7) {
            continue;
        }
        let mut slots = [0u32; 4];
        for p in &layout {
            slots[size_slot(p.profile.compute()).expect("PARVA sizes")] += 1;
        }
        if !kinds.iter().any(|k| k.slots == slots) {
            kinds.push(LayoutKind { slots, placements: layout });
        }
    }
    let dominated = |a: &SizeCounts, b: &SizeCounts| a != b && a.iter().zip(b).all(|(x, y)| x <= y);
    let all = kinds.clone();
    kinds.retain(|k| !all.iter().any(|o| dominated(&k.slots, &o.slots)));
    // Layouts with big slots first: they are the scarce ones, so the search fixes them early.
    kinds.sort_by_key(|k| std::cmp::Reverse((k.slots[3], k.slots[2], k.slots[1], k.slots[0])));
    kinds
}

/// Lower bound on GPUs for the remaining demand: compute (7 GPCs), memory (8 slices; 1g, 2g,
/// 3g and 4g take 1, 2, 4 and 4), one 4g per GPU, two 3g-or-4g per GPU.
fn gpus_lower_bound(d: &SizeCounts) -> u32 {
    let gpcs = d[0] + 2 * d[1] + 3 * d[2] + 4 * d[3];
    let mem = d[0] + 2 * d[1] + 4 * d[2] + 4 * d[3];
    gpcs.div_ceil(7).max(mem.div_ceil(8)).max(d[3]).max((d[2] + d[3]).div_ceil(2))
}

struct PackSearch<'a> {
    kinds: &'a [LayoutKind],
    best: u32,
    best_counts: Option<Vec<u32>>,
    counts: Vec<u32>,
    nodes: u64,
    budget: u64,
}

impl PackSearch<'_> {
    fn dive(&mut self, i: usize, left: SizeCounts, gpus: u32) {
        self.nodes += 1;
        if self.nodes > self.budget {
            return;
        }
        if left == [0; 4] {
            if gpus < self.best {
                self.best = gpus;
                self.best_counts = Some(self.counts.clone());
            }
            return;
        }
        if i == self.kinds.len() || gpus + gpus_lower_bound(&left) >= self.best {
            return;
        }
        let slots = self.kinds[i].slots;
        // More copies of this layout than the most any size needs never help.
        let most = (0..4).filter(|&s| slots[s] > 0 && left[s] > 0).map(|s| left[s].div_ceil(slots[s])).max().unwrap_or(0);
        for n in (0..=most).rev() {
            let rest = std::array::from_fn(|s| left[s].saturating_sub(n * slots[s]));
            self.counts[i] = n;
            self.dive(i + 1, rest, gpus + n);
        }
        self.counts[i] = 0;
    }
}

/// Packs segments (none of size 7) onto the fewest GPUs. Returns the placements per GPU and
/// whether the search completed.
fn pack(segments: Vec<Segment>, budget: u64, nodes: &mut u64) -> (Vec<GpuSlots>, bool) {
    let kinds = layout_kinds();
    let mut demand = [0u32; 4];
    for s in &segments {
        demand[size_slot(s.triplet.gpcs).expect("no 7g here")] += 1;
    }
    // Upper bound from the ParvaGPU allocator on the same segments.
    let mut greedy = Allocator::new();
    greedy.allocate(segments.clone());
    let mut search = PackSearch {
        kinds: &kinds,
        best: greedy.nonempty_gpus() as u32 + 1,
        best_counts: None,
        counts: vec![0; kinds.len()],
        nodes: 0,
        budget,
    };
    search.dive(0, demand, 0);
    *nodes += search.nodes;
    let complete = search.nodes <= budget;
    let Some(counts) = search.best_counts else {
        return (greedy.gpus, complete);
    };
    // Fill the chosen layouts: larger segments first, each into a free slot of its size.
    let mut queues: [Vec<Segment>; 4] = Default::default();
    for s in segments {
        queues[size_slot(s.triplet.gpcs).expect("no 7g here")].push(s);
    }
    let mut gpus = Vec::new();
    for (kind, &n) in kinds.iter().zip(&counts) {
        for _ in 0..n {
            let mut g = GpuSlots::default();
            let mut placements = kind.placements.clone();
            placements.sort_by_key(|p| std::cmp::Reverse(p.profile.compute()));
            for p in placements {
                if let Some(seg) = queues[size_slot(p.profile.compute()).expect("PARVA sizes")].pop() {
                    g.occ.add(p);
                    g.segments.push((p, seg));
                }
            }
            if !g.segments.is_empty() {
                gpus.push(g);
            }
        }
    }
    debug_assert!(queues.iter().all(Vec::is_empty), "the covering leaves no segment unplaced");
    (gpus, complete)
}

/// Packs one GPU type's segments (7g ones on whole GPUs) onto the fewest GPUs, slots
/// numbered from `slot_base`.
fn pack_group(segments: Vec<Segment>, slot_base: u32, budget: u64, report: &mut SearchReport) -> Vec<GpuSlots> {
    let (whole, small): (Vec<Segment>, Vec<Segment>) = segments.into_iter().partition(|s| s.triplet.gpcs == 7);
    let (mut packed, complete) = pack(small, budget, &mut report.nodes);
    report.proven_optimal &= complete;
    for seg in whole {
        let p = Placement::new(MigProfile::G7, 0);
        packed.push(GpuSlots { occ: Occupancy::of(&[p]), segments: vec![(p, seg)], slot: 0 });
    }
    for (k, slots) in packed.iter_mut().enumerate() {
        slots.slot = slot_base + k as u32;
    }
    packed
}

/// The joint choice of mixes for one GPU type ([`joint::best_mixes`]), if it beats
/// `current`, realised by the exact packer.
fn joint_plan(
    input: &PlanningInput,
    services: &[(usize, OptimalTriplets, Vec<Triplet>)],
    current: &[GpuSlots],
    slot_base: u32,
    cfg: &ExactConfig,
    report: &mut SearchReport,
) -> Option<Vec<GpuSlots>> {
    let choices: Vec<ServiceChoice<'_>> =
        services.iter().map(|(i, tri, _)| ServiceChoice { triplets: tri, rate: input.services[*i].request_rate }).collect();
    let incumbent = (current.len() as u32, current.iter().map(GpuSlots::gpcs).sum());
    let found = joint::best_mixes(&choices, incumbent, cfg.joint_node_budget);
    // No answer means nothing beats the incumbent, which is proof only if the search ended.
    report.joint_proven_optimal &= found.as_ref().is_none_or(|j| j.complete);
    let found = found?;
    let segments = services
        .iter()
        .zip(found.mixes)
        .flat_map(|((i, _, _), mix)| mix.into_iter().map(move |t| Segment { service: *i, triplet: t }))
        .collect();
    Some(pack_group(segments, slot_base, cfg.node_budget, report))
}

/// Exact MIG provisioning (see the module doc). Per GPU type, both the minimum-GPC segment
/// mixes and Demand Matching's mixes are packed exactly (fewer GPCs do not always pack onto
/// fewer GPUs), and the better packing is kept. Returns the plan and how the search went.
pub fn plan(input: &PlanningInput, cfg: &ExactConfig) -> (Plan, SearchReport) {
    let (groups, infeasible) = configure(input, &cfg.parva);
    let mut report = SearchReport { proven_optimal: true, joint_proven_optimal: true, ..SearchReport::default() };
    let mut gpus = Vec::new();
    let mut slot_base = 0;
    for g in &groups {
        let mut min_gpc = Vec::new();
        let mut matched = Vec::new();
        for (i, tri, demand_matched) in &g.services {
            let rate = input.services[*i].request_rate;
            let (mix, complete) = min_gpc_mix(tri, rate, cfg.node_budget).expect("configured services have a triplet");
            report.proven_optimal &= complete;
            min_gpc.extend(mix.into_iter().map(|t| Segment { service: *i, triplet: t }));
            matched.extend(demand_matched.iter().map(|t| Segment { service: *i, triplet: *t }));
        }
        let a = pack_group(min_gpc, slot_base, cfg.node_budget, &mut report);
        let b = pack_group(matched, slot_base, cfg.node_budget, &mut report);
        let gpcs = |p: &[GpuSlots]| p.iter().map(GpuSlots::gpcs).sum::<u32>();
        let mut packed = if (b.len(), gpcs(&b)) < (a.len(), gpcs(&a)) { b } else { a };
        if g.services.len() > cfg.joint_max_services {
            report.joint_proven_optimal = false;
        } else {
            if let Some(joint) = joint_plan(input, &g.services, &packed, slot_base, cfg, &mut report) {
                if (joint.len(), gpcs(&joint)) < (packed.len(), gpcs(&packed)) {
                    packed = joint;
                }
            }
        }
        slot_base += packed.len() as u32;
        let alloc = Allocator::from_gpus(packed, slot_base);
        gpus.extend(to_gpu_plans(&alloc, &g.gpu_type.name, &input.services));
    }
    let exact = Plan { strategy: "exact".into(), predictions: predictions_from_gpus(&gpus, &input.services), gpus, infeasible };
    let heuristic = parvagpu::plan(input, &cfg.parva);
    if (heuristic.gpus_used(), heuristic.gpcs_used()) < (exact.gpus_used(), exact.gpcs_used()) {
        report.used_heuristic = true;
        return (Plan { strategy: "exact(parvagpu)".into(), ..heuristic }, report);
    }
    (exact, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::validate;

    fn tri(points: &[(u8, f64)]) -> OptimalTriplets {
        let mut t: OptimalTriplets = [None; 5];
        for &(gpcs, tp) in points {
            let i = SIZES.iter().position(|&s| s == gpcs).unwrap();
            t[i] = Some(Triplet { gpcs, batch: 8, processes: 1, throughput: tp, latency_ms: 5.0 });
        }
        t
    }

    #[test]
    fn min_gpc_mix_beats_demand_matching_when_the_tail_is_wasteful() {
        // OptSeg is the 4g (30 req/s per GPC). At 180 req/s Demand Matching takes one 4g and,
        // for the remaining 60, the smallest single segment that serves it: another 4g
        // (the 2g's 50 is not enough), 8 GPCs. 4g + 2g + 1g = 198 req/s in 7 GPCs; no 6-GPC
        // mix reaches 180 (4g + 2g = 170, 4g + 2 × 1g = 176).
        let t = tri(&[(1, 28.0), (2, 50.0), (4, 120.0)]);
        let dm = parvagpu_mix(&t, 180.0).unwrap();
        assert_eq!(mix_cost(&dm), (8, 2));
        let (mix, complete) = min_gpc_mix(&t, 180.0, 1_000_000).unwrap();
        assert!(complete);
        assert_eq!(mix_cost(&mix), (7, 3), "{mix:?}");
        assert!(mix.iter().map(|t| t.throughput).sum::<f64>() >= 180.0);
        // Where Demand Matching is already minimal the exact mix costs the same.
        let (mix, _) = min_gpc_mix(&t, 240.0, 1_000_000).unwrap();
        assert_eq!(mix_cost(&mix), mix_cost(&parvagpu_mix(&t, 240.0).unwrap()));
    }

    #[test]
    fn layout_kinds_cover_every_non_7g_maximal_layout() {
        let kinds = layout_kinds();
        for layout in maximal_layouts(&MigProfile::PARVA) {
            if layout.iter().any(|p| p.profile == MigProfile::G7) {
                continue;
            }
            let mut slots = [0u32; 4];
            for p in &layout {
                slots[size_slot(p.profile.compute()).unwrap()] += 1;
            }
            assert!(kinds.iter().any(|k| k.slots.iter().zip(&slots).all(|(a, b)| a >= b)), "{layout:?} not covered");
        }
        for k in &kinds {
            validate(&k.placements).unwrap();
        }
    }

    fn seg(gpcs: u8) -> Segment {
        Segment { service: 0, triplet: Triplet { gpcs, batch: 1, processes: 1, throughput: 1.0, latency_ms: 1.0 } }
    }

    #[test]
    fn packing_finds_the_optimum_where_first_fit_does_not() {
        // Segment Relocation puts every 3g at slot 4 of its own GPU (so that Allocation
        // Optimization can fill slots 0-3): 3 × 3g + 2 × 1g take three GPUs. Two suffice:
        // 3g@0 + 3g@4, and 3g@4 + 1g@0 + 1g@1.
        let mut segs: Vec<Segment> = [3, 3, 3].iter().map(|&g| seg(g)).collect();
        segs.extend((0..2).map(|_| seg(1)));
        let mut greedy = Allocator::new();
        greedy.allocate(segs.clone());
        assert_eq!(greedy.nonempty_gpus(), 3);
        let mut nodes = 0;
        let (gpus, complete) = pack(segs.clone(), 1_000_000, &mut nodes);
        assert!(complete);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus.iter().map(|g| g.segments.len()).sum::<usize>(), segs.len());
        for g in &gpus {
            let layout: Vec<Placement> = g.segments.iter().map(|(p, _)| *p).collect();
            validate(&layout).unwrap();
        }
    }

    proptest::proptest! {
        #[test]
        fn packing_is_valid_complete_and_never_worse_than_first_fit(c1 in 0usize..12, c2 in 0usize..8, c3 in 0usize..6, c4 in 0usize..5) {
            let mut segs = Vec::new();
            for (n, g) in [(c1, 1), (c2, 2), (c3, 3), (c4, 4)] {
                segs.extend((0..n).map(|_| seg(g)));
            }
            let mut greedy = Allocator::new();
            greedy.allocate(segs.clone());
            let mut nodes = 0;
            let (gpus, complete) = pack(segs.clone(), 1_000_000, &mut nodes);
            proptest::prop_assert!(complete);
            proptest::prop_assert!(gpus.len() <= greedy.nonempty_gpus());
            let demand = [c1 as u32, c2 as u32, c3 as u32, c4 as u32];
            proptest::prop_assert!(gpus.len() as u32 >= gpus_lower_bound(&demand));
            let mut placed = [0u32; 4];
            for g in &gpus {
                let layout: Vec<Placement> = g.segments.iter().map(|(p, _)| *p).collect();
                proptest::prop_assert!(validate(&layout).is_ok(), "{layout:?}");
                for (p, s) in &g.segments {
                    proptest::prop_assert_eq!(p.profile.compute(), s.triplet.gpcs);
                    placed[size_slot(s.triplet.gpcs).unwrap()] += 1;
                }
            }
            proptest::prop_assert_eq!(placed, demand);
        }
    }
}
