//! Joint choice of every service's segment mix for the fewest GPUs.
//!
//! Choosing each service's minimum-GPC mix and packing afterwards is not optimal: GPCs that
//! cannot be filled are lost (a 3g segment on the left half of a GPU wastes one), so a mix
//! with a GPC more can pack onto a GPU less. This module searches the mixes of all services
//! of one GPU type together, scoring each combination with an exact closed-form count of the
//! GPUs its segments need ([`gpus_needed`]).
//!
//! The closed form rests on the A100/H100 MIG geometry (ARCHITECTURE.md): apart from 7g, every
//! instance lies within one half of the memory slices. The left half (slices 0-3) holds 4g, or
//! 3g (wasting a GPC), or 2g/1g up to 4 GPCs; the right half (slices 4-7) holds 3g, or 2g@4
//! plus 1g@6, or 1g at 4, 5, 6: 3 GPCs. Halves are independent, so `G` GPUs hold the demand
//! `(n1, n2, n3, n4)` iff, with `a` of the 3g segments on left halves,
//!
//! ```text
//! n4 + a ≤ G                        left halves taken whole
//! n3 − a ≤ G                        right halves taken whole
//! n2 ≤ 2(G − n4 − a) + (G − n3 + a) 2g: two per free left half, one per free right half
//! n1 + 2n2 + 3n3 + 4n4 + a ≤ 7G     every remaining GPC takes a 1g
//! ```
//!
//! and only the second constraint wants `a` large, so `a = max(0, n3 − G)` decides.
//!
//! Hand-written depth-first branch and bound rather than a general MILP solver: an ILP over
//! the layouts (tried with `microlp`) has a weak relaxation here and proved nothing within
//! 20,000 nodes on the published scenarios, while this search prunes with the exact count.

use super::segments::{OptimalTriplets, Triplet, SIZES};

/// Segment counts per size in the order of [`SIZES`]: 1g, 2g, 3g, 4g, 7g.
pub type Demand = [u32; 5];

/// The fewest GPUs (A100/H100 geometry) that hold `d` (see the module doc).
pub fn gpus_needed(d: &Demand) -> u32 {
    let [n1, n2, n3, n4, n7] = d.map(i64::from);
    let gpcs = n1 + 2 * n2 + 3 * n3 + 4 * n4;
    let mut g = n4.max((n3 + n4 + 1) / 2).max((gpcs + 6) / 7);
    loop {
        let a = (n3 - g).max(0);
        let fits = n4 + a <= g && n3 - a <= g && n2 <= 2 * (g - n4 - a) + (g - n3 + a) && gpcs + a <= 7 * g;
        if fits {
            return u32::try_from(g + n7).unwrap_or(u32::MAX);
        }
        g += 1;
    }
}

fn gpcs_of(d: &Demand) -> u32 {
    // Saturating: a sum past u32 is past every budget anyway.
    d.iter().zip(SIZES).fold(0u32, |sum, (&n, s)| sum.saturating_add(n.saturating_mul(u32::from(s))))
}

/// One service's choice: the optimal triplet per size and the rate to cover.
pub struct ServiceChoice<'a> {
    pub triplets: &'a OptimalTriplets,
    pub rate: f64,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct JointMixes {
    /// Per service (input order), its segments.
    pub mixes: Vec<Vec<Triplet>>,
    pub gpus: u32,
    pub gpcs: u32,
    /// The search finished within its node budget: no combination needs fewer GPUs.
    pub complete: bool,
}

/// Minimal covering mixes of one service (no segment can be dropped) with at most
/// `max_gpcs` GPCs, cheapest first; at most `limit` of them. The walk takes at most
/// [`WALK_STEPS_PER_SERVICE`] steps (the mix space is a product over the five sizes, vast
/// for a large rate over slow segments); `false` when it stopped there, so the caller knows
/// the list may lack mixes.
fn minimal_mixes(c: &ServiceChoice<'_>, max_gpcs: u32, limit: usize) -> (Vec<Demand>, bool) {
    struct Walk<'a, 'b> {
        c: &'a ServiceChoice<'b>,
        max_gpcs: u32,
        limit: usize,
        out: Vec<Demand>,
        steps: u64,
    }
    impl Walk<'_, '_> {
        fn done(&self) -> bool {
            self.out.len() >= self.limit || self.steps >= WALK_STEPS_PER_SERVICE
        }
        fn walk(&mut self, k: usize, left: f64, cur: &mut Demand) {
            self.steps += 1;
            if self.done() {
                return;
            }
            let c = self.c;
            if left <= 1e-9 {
                // Minimal: dropping any one segment uncovers the rate.
                let total: f64 = (0..5).filter_map(|i| c.triplets[i].map(|t| f64::from(cur[i]) * t.throughput)).sum();
                let minimal = (0..5).all(|i| cur[i] == 0 || c.triplets[i].is_none_or(|t| total - t.throughput < c.rate - 1e-9));
                if minimal {
                    self.out.push(*cur);
                }
                return;
            }
            if k == 5 {
                return;
            }
            let Some(t) = c.triplets[k] else { return self.walk(k + 1, left, cur) };
            let most = (left / t.throughput - 1e-9).ceil().max(0.0) as u32;
            for n in 0..=most {
                cur[k] = n;
                if self.done() || gpcs_of(cur) > self.max_gpcs {
                    break;
                }
                self.walk(k + 1, left - f64::from(n) * t.throughput, cur);
            }
            cur[k] = 0;
        }
    }
    let mut w = Walk { c, max_gpcs, limit, out: Vec::new(), steps: 0 };
    w.walk(0, c.rate, &mut [0; 5]);
    let complete = w.steps < WALK_STEPS_PER_SERVICE;
    let mut out = w.out;
    out.sort_by_key(|d| (gpcs_of(d), d.iter().sum::<u32>()));
    (out, complete)
}

/// Steps of one service's mix walk (a hostile-input property run found a walk of hours).
const WALK_STEPS_PER_SERVICE: u64 = 200_000;

/// Most minimal mixes considered per service; beyond it the search is marked incomplete.
const MIXES_PER_SERVICE: usize = 4096;

struct Search<'a> {
    /// Per service (in search order), its candidate mixes, cheapest first.
    mixes: &'a [Vec<Demand>],
    /// GPCs of the cheapest mix of services `i..`.
    rest_min_gpcs: &'a [u32],
    best: (u32, u32),
    best_choice: Option<Vec<usize>>,
    choice: Vec<usize>,
    nodes: u64,
    budget: u64,
}

impl Search<'_> {
    fn dive(&mut self, i: usize, d: Demand) {
        self.nodes += 1;
        if self.nodes > self.budget {
            return;
        }
        let gpcs = gpcs_of(&d) + self.rest_min_gpcs[i];
        // Both are lower bounds for any completion: the exact count is monotone in the
        // demand, and no GPU holds more than 7 GPCs.
        let bound = (gpus_needed(&d), gpcs.div_ceil(7));
        if (bound.0.max(bound.1), gpcs) >= self.best {
            return;
        }
        if i == self.mixes.len() {
            self.best = (gpus_needed(&d), gpcs_of(&d));
            self.best_choice = Some(self.choice.clone());
            return;
        }
        for (j, m) in self.mixes[i].iter().enumerate() {
            self.choice[i] = j;
            self.dive(i + 1, std::array::from_fn(|k| d[k] + m[k]));
        }
    }
}

/// The mixes of all `services` that need the fewest GPUs (then GPCs), if that beats
/// `incumbent` = (GPUs, GPCs) of a plan already in hand. `node_budget` bounds the search.
pub fn best_mixes(services: &[ServiceChoice<'_>], incumbent: (u32, u32), node_budget: u64) -> Option<JointMixes> {
    // A mix can exceed its service's minimum by at most the slack of the incumbent.
    let mins: Vec<u32> = services.iter().map(|c| minimal_mixes(c, u32::MAX, 1).0.first().map_or(0, gpcs_of)).collect();
    let total_min: u32 = mins.iter().sum();
    let slack = (7 * incumbent.0).saturating_sub(total_min);
    let mut complete = true;
    let mut order: Vec<usize> = (0..services.len()).collect();
    // Big services first: their choice moves the bound most.
    order.sort_by_key(|&i| std::cmp::Reverse(mins[i]));
    let mixes: Vec<Vec<Demand>> = order
        .iter()
        .map(|&i| {
            let (m, walked) = minimal_mixes(&services[i], mins[i].saturating_add(slack), MIXES_PER_SERVICE);
            complete &= walked && m.len() < MIXES_PER_SERVICE;
            m
        })
        .collect();
    if mixes.iter().any(Vec::is_empty) {
        return None;
    }
    let mut rest_min_gpcs = vec![0; order.len() + 1];
    for i in (0..order.len()).rev() {
        rest_min_gpcs[i] = rest_min_gpcs[i + 1] + gpcs_of(&mixes[i][0]);
    }
    let mut search = Search {
        mixes: &mixes,
        rest_min_gpcs: &rest_min_gpcs,
        best: incumbent,
        best_choice: None,
        choice: vec![0; order.len()],
        nodes: 0,
        budget: node_budget,
    };
    search.dive(0, [0; 5]);
    complete &= search.nodes <= node_budget;
    let choice = search.best_choice?;
    let mut result = vec![Vec::new(); services.len()];
    for (pos, &i) in order.iter().enumerate() {
        let d = mixes[pos][choice[pos]];
        result[i] =
            (0..5).filter_map(|k| Some((services[i].triplets[k]?, d[k]))).flat_map(|(t, n)| std::iter::repeat_n(t, n as usize)).collect();
    }
    Some(JointMixes { mixes: result, gpus: search.best.0, gpcs: search.best.1, complete })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{maximal_layouts, MigProfile};

    /// The closed form agrees with brute force over the maximal layouts: the fewest GPUs
    /// whose layouts (each a maximal layout, slots possibly left empty) cover the demand.
    #[test]
    fn closed_form_matches_brute_force_over_layouts() {
        let kinds: Vec<[u32; 4]> = maximal_layouts(&MigProfile::PARVA)
            .into_iter()
            .filter(|l| l.iter().all(|p| p.profile != MigProfile::G7))
            .map(|l| {
                let mut c = [0u32; 4];
                for p in l {
                    c[SIZES.iter().position(|&s| s == p.profile.compute()).expect("parva size")] += 1;
                }
                c
            })
            .collect();
        // Reachable demands with g GPUs: sums of g layouts, shrunk component-wise.
        let mut reach: Vec<std::collections::BTreeSet<[u32; 4]>> = vec![[[0; 4]].into_iter().collect()];
        for g in 1..=4 {
            let next = reach[g - 1].iter().flat_map(|d| kinds.iter().map(move |k| std::array::from_fn(|i| d[i] + k[i]))).collect();
            reach.push(next);
        }
        let fits = |g: usize, d: &[u32; 4]| reach[g].iter().any(|r| r.iter().zip(d).all(|(a, b)| a >= b));
        for n1 in 0..=10 {
            for n2 in 0..=6 {
                for n3 in 0..=5 {
                    for n4 in 0..=4 {
                        let d = [n1, n2, n3, n4];
                        let brute = (0..=4).find(|&g| fits(g, &d));
                        let closed = gpus_needed(&[n1, n2, n3, n4, 0]) as usize;
                        match brute {
                            Some(g) => assert_eq!(closed, g, "demand {d:?}"),
                            None => assert!(closed > 4, "demand {d:?}: closed form says {closed} GPUs"),
                        }
                    }
                }
            }
        }
        assert_eq!(gpus_needed(&[0, 0, 0, 0, 3]), 3, "7g segments take whole GPUs");
    }

    fn t(gpcs: u8, throughput: f64) -> Triplet {
        Triplet { gpcs, batch: 8, processes: 1, throughput, latency_ms: 1.0 }
    }

    fn demand(mixes: &[Vec<Triplet>]) -> Demand {
        let mut d = [0u32; 5];
        for t in mixes.iter().flatten() {
            d[SIZES.iter().position(|&s| s == t.gpcs).expect("size")] += 1;
        }
        d
    }

    /// Service A's cheapest mix is three 3g (9 GPCs), B's a 2g and a 3g (5 GPCs): four 3g
    /// and a 2g need 3 GPUs (only two 3g fit per GPU without starving the 2g). Other mixes
    /// of the same services fit on 2.
    #[test]
    fn joint_choice_beats_the_per_service_minimum() {
        let a: OptimalTriplets = [Some(t(1, 30.0)), None, Some(t(3, 90.0)), None, None];
        let b: OptimalTriplets = [Some(t(1, 20.0)), Some(t(2, 50.0)), Some(t(3, 100.0)), Some(t(4, 120.0)), None];
        let services = [ServiceChoice { triplets: &a, rate: 250.0 }, ServiceChoice { triplets: &b, rate: 150.0 }];
        let per_service: Vec<Demand> = services.iter().map(|s| minimal_mixes(s, u32::MAX, 100).0[0]).collect();
        assert_eq!(per_service, vec![[0, 0, 3, 0, 0], [0, 1, 1, 0, 0]]);
        assert_eq!(gpus_needed(&[0, 1, 4, 0, 0]), 3);
        let best = best_mixes(&services, (3, 14), 1_000_000).expect("a 2-GPU choice exists");
        assert!(best.complete);
        assert_eq!(best.gpus, 2);
        for (mix, s) in best.mixes.iter().zip(&services) {
            assert!(mix.iter().map(|t| t.throughput).sum::<f64>() >= s.rate, "every rate covered");
        }
        assert_eq!((gpus_needed(&demand(&best.mixes)), gpcs_of(&demand(&best.mixes))), (best.gpus, best.gpcs));
    }

    proptest::proptest! {
        /// The search finds what brute force over all combinations of minimal mixes finds.
        #[test]
        fn search_matches_brute_force(
            tri in proptest::collection::vec((0u8..3, 0u8..3, 0u8..3, 0u8..3), 1..4),
            rates in proptest::collection::vec(40u32..300, 3),
        ) {
            let options: Vec<OptimalTriplets> = tri.iter().map(|&(a, b, c, d)| {
                let pick = |on: u8, gpcs: u8, base: f64| (on > 0).then(|| t(gpcs, base + 10.0 * f64::from(on)));
                let mut o = [pick(a, 1, 15.0), pick(b, 2, 40.0), pick(c, 3, 80.0), pick(d, 4, 110.0), None];
                if o.iter().all(Option::is_none) { o[0] = Some(t(1, 25.0)); }
                o
            }).collect();
            let services: Vec<ServiceChoice<'_>> = options.iter().zip(&rates).map(|(o, &r)| ServiceChoice { triplets: o, rate: f64::from(r) }).collect();
            let all: Vec<Vec<Demand>> = services.iter().map(|s| minimal_mixes(s, u32::MAX, 100_000).0).collect();
            let mut brute = (u32::MAX, u32::MAX);
            let mut idx = vec![0usize; all.len()];
            loop {
                let d: Demand = std::array::from_fn(|k| idx.iter().enumerate().map(|(i, &j)| all[i][j][k]).sum());
                brute = brute.min((gpus_needed(&d), gpcs_of(&d)));
                let mut i = 0;
                while i < idx.len() { idx[i] += 1; if idx[i] < all[i].len() { break; } idx[i] = 0; i += 1; }
                if i == idx.len() { break; }
            }
            let found = best_mixes(&services, (u32::MAX / 8, u32::MAX), 10_000_000).expect("some choice");
            proptest::prop_assert!(found.complete);
            proptest::prop_assert_eq!((found.gpus, found.gpcs), brute);
        }
    }

    #[test]
    fn no_answer_when_the_incumbent_cannot_be_beaten() {
        let a: OptimalTriplets = [None, None, None, None, Some(t(7, 100.0))];
        let s = [ServiceChoice { triplets: &a, rate: 150.0 }];
        assert_eq!(best_mixes(&s, (2, 14), 1000), None);
        let better = best_mixes(&s, (3, 21), 1000).expect("two 7g beat three");
        assert_eq!((better.gpus, better.gpcs), (2, 14));
    }
}
