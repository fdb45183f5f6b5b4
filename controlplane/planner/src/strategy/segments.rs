//! ParvaGPU's building blocks: GPU segments (an MPS-enabled MIG instance running identical
//! processes of one model), the Optimal Triplet Decision and Demand Matching of the Segment
//! Configurator (ParvaGPU Sec. III-D, Alg. 1), and the Segment Relocation allocator with the
//! paper's slot preferences (Sec. III-E1, Alg. 2).

use crate::mig::{MigProfile, Occupancy, Placement};
use crate::perf::table::ProfileTable;
use serde::{Deserialize, Serialize};

/// The instance sizes ParvaGPU considers, in GPCs.
pub const SIZES: [u8; 5] = [1, 2, 3, 4, 7];

/// A (instance size, batch size, process count) triplet with its profiled performance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Triplet {
    pub gpcs: u8,
    pub batch: u32,
    pub processes: u32,
    /// Segment throughput (all processes), req/s.
    pub throughput: f64,
    pub latency_ms: f64,
}

impl Triplet {
    pub fn per_gpc(&self) -> f64 {
        self.throughput / f64::from(self.gpcs)
    }
}

/// The best triplet per instance size (index as in [`SIZES`]), `None` where no profiled
/// point meets the latency budget.
pub type OptimalTriplets = [Option<Triplet>; 5];

fn size_index(gpcs: u8) -> Option<usize> {
    SIZES.iter().position(|&s| s == gpcs)
}

/// Optimal Triplet Decision (Alg. 1 lines 3-12): for each instance size, the (batch,
/// processes) with maximum segment throughput among points whose latency is strictly below
/// `budget_ms` (line 6: `S[i].lat > P[j].lat`). Points with more than `max_processes`
/// processes are ignored (see `ParvaConfig::max_processes`).
pub fn optimal_triplets(table: &ProfileTable, budget_ms: f64, max_processes: u32) -> OptimalTriplets {
    let mut best: OptimalTriplets = [None; 5];
    for p in &table.points {
        let lat_ms = p.latency_s * 1000.0;
        if p.processes > max_processes || lat_ms >= budget_ms {
            continue;
        }
        let Some(i) = size_index(p.gpcs) else { continue };
        let t = Triplet { gpcs: p.gpcs, batch: p.batch, processes: p.processes, throughput: p.segment_throughput(), latency_ms: lat_ms };
        // UpdateMaxTriplets: keep the maximum throughput; on a tie the lower latency.
        let better = best[i].is_none_or(|b| t.throughput > b.throughput || (t.throughput == b.throughput && t.latency_ms < b.latency_ms));
        if better {
            best[i] = Some(t);
        }
    }
    best
}

/// OptSeg: the triplet maximising throughput per GPC (Eq. 2 shows this minimises GPCs).
pub fn opt_seg(tri: &OptimalTriplets) -> Option<Triplet> {
    tri.iter().flatten().copied().fold(None, |acc: Option<Triplet>, t| match acc {
        Some(a) if a.per_gpc() >= t.per_gpc() => Some(a),
        _ => Some(t),
    })
}

/// LastSeg: the smallest instance size whose optimal triplet serves `rate`.
pub fn last_seg(tri: &OptimalTriplets, rate: f64) -> Option<Triplet> {
    tri.iter().flatten().copied().find(|t| t.throughput >= rate)
}

/// Demand Matching (Alg. 1 lines 16-23): `floor(rate / opt.tp)` optimal segments plus, for
/// the remaining rate, the smallest segment that can serve it. Returns `None` when the service
/// has no feasible triplet at all.
pub fn demand_matching(tri: &OptimalTriplets, rate: f64) -> Option<Vec<Triplet>> {
    let opt = opt_seg(tri)?;
    // The callers refuse a service beyond the bound first; this keeps the allocation below
    // bounded should one not.
    crate::bounds::check_instances(rate, opt.throughput, "segment").ok()?;
    let n = (rate / opt.throughput).floor() as usize;
    let mut segs = vec![opt; n];
    let left = rate - n as f64 * opt.throughput;
    // GetLeftReqRate: the tree stops at a node whose remaining rate is <= 0.
    if left > 1e-9 {
        segs.push(last_seg(tri, left).unwrap_or(opt));
    }
    Some(segs)
}

/// SmallSegments (Alg. 2 line 22): segments of size 1 or 2 covering `rate`, using the same
/// optimal-then-last rule restricted to the small sizes. `None` if the service has no small
/// triplet.
pub fn small_segments(tri: &OptimalTriplets, rate: f64) -> Option<Vec<Triplet>> {
    let small: OptimalTriplets = [tri[0], tri[1], None, None, None];
    if rate <= 1e-9 {
        return opt_seg(&small).map(|_| Vec::new());
    }
    demand_matching(&small, rate)
}

/// Start-slot preferences of Segment Relocation (Sec. III-E1): 7g and 4g only at 0; 3g only
/// at 4 ("priority is given to allocating size 3 segments in slot 4": a 3g@0 blocks the 1g
/// at slot 3, so a second 3g opens a new GPU, whose free slots 0-3 Allocation Optimization
/// then fills with split segments; this is what the published deployments show, e.g. twelve
/// 3g, all at slot 4 of twelve GPUs, in scenario 5); 2g at 0 or 2 before 4 (leave room for
/// 3g); 1g in slots 0-3 before 4-6. The paper also lists slot 5 for size 2, which is not a legal 2g
/// start in NVIDIA's placement table, so it is not used.
pub fn preferred_starts(profile: MigProfile) -> &'static [u8] {
    match profile {
        MigProfile::G7 | MigProfile::G4 => &[0],
        MigProfile::G3 => &[4],
        MigProfile::G2 => &[0, 2, 4],
        MigProfile::G1 => &[0, 1, 2, 3, 4, 5, 6],
        MigProfile::G1Mem2 => &[0, 2, 4, 6],
    }
}

/// A segment placed (or to be placed) for a service.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Index of the service in the caller's service list.
    pub service: usize,
    pub triplet: Triplet,
}

/// One GPU of the deployment map.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSlots {
    pub occ: Occupancy,
    pub segments: Vec<(Placement, Segment)>,
    /// Stable identity of the GPU across re-plans.
    pub slot: u32,
}

impl GpuSlots {
    pub fn gpcs(&self) -> u32 {
        u32::from(self.occ.compute)
    }
}

/// The deployment map G with first-fit placement. `first_candidate[size]` is the first GPU
/// that may still fit a segment of that size: GPUs only fill up during relocation, so a GPU
/// that cannot take a size never can again until something is freed on it. This keeps
/// Allocation at O(segments + GPUs) instead of rescanning from GPU 0 every time.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    pub gpus: Vec<GpuSlots>,
    first_candidate: [usize; 8],
    next_slot: u32,
}

impl Allocator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds an allocator from an existing map (used by minimal re-planning).
    /// New GPUs get slots from `next_slot` on (at least past every slot in `gpus`).
    pub fn from_gpus(gpus: Vec<GpuSlots>, next_slot: u32) -> Self {
        let next_slot = gpus.iter().map(|g| g.slot + 1).max().unwrap_or(0).max(next_slot);
        Allocator { gpus, first_candidate: [0; 8], next_slot }
    }

    /// Places one segment on the first GPU that can host it at a preferred start, opening a
    /// new GPU if none can. Returns (GPU index, placement).
    pub fn place(&mut self, seg: Segment) -> (usize, Placement) {
        let profile = MigProfile::for_gpcs(seg.triplet.gpcs).expect("segment sizes are 1,2,3,4,7");
        let size = usize::from(seg.triplet.gpcs);
        let prefs = preferred_starts(profile);
        let mut i = self.first_candidate[size];
        while i < self.gpus.len() {
            if let Some(start) = self.gpus[i].occ.first_fit(profile, prefs) {
                let p = Placement::new(profile, start);
                self.gpus[i].occ.add(p);
                self.gpus[i].segments.push((p, seg));
                self.first_candidate[size] = i;
                return (i, p);
            }
            i += 1;
        }
        let mut g = GpuSlots { slot: self.next_slot, ..GpuSlots::default() };
        self.next_slot += 1;
        let start = g.occ.first_fit(profile, prefs).expect("an empty GPU fits every profile");
        let p = Placement::new(profile, start);
        g.occ.add(p);
        g.segments.push((p, seg));
        self.gpus.push(g);
        self.first_candidate[size] = self.gpus.len() - 1;
        (self.gpus.len() - 1, p)
    }

    /// Allocation (Alg. 2): places queued segments, larger sizes first.
    pub fn allocate(&mut self, mut queue: Vec<Segment>) -> Vec<(usize, Placement)> {
        // Stable sort keeps the enqueue order within one size queue.
        queue.sort_by_key(|s| std::cmp::Reverse(s.triplet.gpcs));
        queue.into_iter().map(|s| self.place(s)).collect()
    }

    /// Frees every segment of GPU `i` and returns them.
    pub fn free_gpu(&mut self, i: usize) -> Vec<(Placement, Segment)> {
        let segs = std::mem::take(&mut self.gpus[i].segments);
        self.gpus[i].occ = Occupancy::default();
        self.touch(i);
        segs
    }

    /// Removes one placed segment.
    pub fn remove(&mut self, gpu: usize, placement: Placement) -> Option<Segment> {
        let pos = self.gpus[gpu].segments.iter().position(|(p, _)| *p == placement)?;
        let (p, s) = self.gpus[gpu].segments.remove(pos);
        self.gpus[gpu].occ.remove(p);
        self.touch(gpu);
        Some(s)
    }

    /// Puts a segment back at an exact placement (undo of a tentative step).
    pub fn put(&mut self, gpu: usize, p: Placement, seg: Segment) {
        self.gpus[gpu].occ.add(p);
        self.gpus[gpu].segments.push((p, seg));
    }

    fn touch(&mut self, gpu: usize) {
        for c in &mut self.first_candidate {
            *c = (*c).min(gpu);
        }
    }

    /// Drops GPUs left empty at the end of the map.
    pub fn truncate_empty_tail(&mut self) {
        while self.gpus.last().is_some_and(|g| g.segments.is_empty()) {
            self.gpus.pop();
        }
        let n = self.gpus.len();
        for c in &mut self.first_candidate {
            *c = (*c).min(n);
        }
    }

    pub fn nonempty_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| !g.segments.is_empty()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::table::ProfilePoint;

    fn table(points: &[(u8, u32, u32, f64, f64)]) -> ProfileTable {
        ProfileTable {
            points: points
                .iter()
                .map(|&(gpcs, batch, processes, tp, lat)| ProfilePoint {
                    gpcs,
                    batch,
                    processes,
                    throughput_per_process: tp,
                    latency_s: lat,
                })
                .collect(),
            infeasible_rows: 0,
        }
    }

    fn t(gpcs: u8, tp: f64) -> Triplet {
        Triplet { gpcs, batch: 1, processes: 1, throughput: tp, latency_ms: 1.0 }
    }

    #[test]
    fn triplet_decision_respects_latency_and_process_limit() {
        let tab = table(&[
            (1, 1, 1, 100.0, 0.005),
            (1, 4, 1, 200.0, 0.012), // too slow for a 10 ms budget
            (1, 2, 2, 70.0, 0.008),  // 140 req/s segment: best for size 1
            (2, 8, 4, 500.0, 0.002), // 4 processes: ignored
            (2, 2, 1, 250.0, 0.006),
        ]);
        let tri = optimal_triplets(&tab, 10.0, 3);
        let one = tri[0].unwrap();
        assert_eq!((one.batch, one.processes, one.throughput), (2, 2, 140.0));
        assert_eq!(tri[1].unwrap().throughput, 250.0);
        assert!(tri[2].is_none() && tri[3].is_none() && tri[4].is_none());
        // Strictly below the budget: a point at exactly the budget is rejected.
        let tri = optimal_triplets(&tab, 8.0, 3);
        assert_eq!(tri[0].unwrap().throughput, 100.0);
    }

    #[test]
    fn demand_matching_uses_best_ratio_then_smallest_last_segment() {
        // per GPC: 1g 100, 2g 150, 3g 120, 4g 160 (best), 7g 140
        let tri = [Some(t(1, 100.0)), Some(t(2, 300.0)), Some(t(3, 360.0)), Some(t(4, 640.0)), Some(t(7, 980.0))];
        let segs = demand_matching(&tri, 1500.0).unwrap();
        // floor(1500/640) = 2 optimal 4g, remaining 220 -> smallest sufficient is 2g (300).
        let sizes: Vec<u8> = segs.iter().map(|s| s.gpcs).collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        // Small rate: a single last segment.
        let sizes: Vec<u8> = demand_matching(&tri, 90.0).unwrap().iter().map(|s| s.gpcs).collect();
        assert_eq!(sizes, vec![1]);
        // Exact multiple: no last segment.
        assert_eq!(demand_matching(&tri, 1280.0).unwrap().len(), 2);
        assert!(demand_matching(&[None; 5], 10.0).is_none());
        let small: Vec<u8> = small_segments(&tri, 450.0).unwrap().iter().map(|s| s.gpcs).collect();
        assert_eq!(small, vec![2, 2]);
        assert_eq!(small_segments(&[None, None, Some(t(3, 1.0)), None, None], 5.0), None);
    }

    #[test]
    fn relocation_follows_slot_preferences() {
        let mut a = Allocator::new();
        let seg = |g: u8| Segment { service: 0, triplet: t(g, 1.0) };
        let placed = a.allocate(vec![seg(1), seg(3), seg(2), seg(4), seg(3), seg(1)]);
        // Order: 4, 3, 3, 2, 1, 1. GPU0: 4g@0 + 3g@4. GPU1: 3g@4, 2g@0, 1g@2, 1g@3.
        let got: Vec<(usize, String)> = placed.iter().map(|(g, p)| (*g, p.to_string())).collect();
        assert_eq!(
            got,
            vec![(0, "4g@0".into()), (0, "3g@4".into()), (1, "3g@4".into()), (1, "2g@0".into()), (1, "1g@2".into()), (1, "1g@3".into()),]
        );
        for g in &a.gpus {
            let layout: Vec<Placement> = g.segments.iter().map(|s| s.0).collect();
            crate::mig::validate(&layout).unwrap();
        }
        // Freeing a GPU lets later segments go back to it.
        a.free_gpu(0);
        assert_eq!(a.place(seg(7)).0, 0);
    }
}
