//! Weighted max-min fair share of one GPU's (or one MIG instance's) 100% among MPS clients,
//! as GSLICE's resource allocation manager does (`gslice.txt`, Sec. 3.2.3):
//!
//! * "Resources (GPU%) are allocated to IFs based on demand, maximizing the minimum resource
//!   allocation for any IFs with unsatisfied demands. The unsatisfied IFs get resource shares
//!   in proportion to their normalized … weights."
//! * "No IF obtains a resource share larger than its demand, unless the GPU is underutilized."
//!
//! Water-filling: a level `λ` rises, each client holding `min(demand, λ · weight)`, until the
//! capacity is used up or every demand is met. Clients are visited in ascending
//! `demand / weight`, so "the demand of IFs requiring lowest GPU% [is] fulfilled first"
//! (Sec. 3.2.2) under equal weights.
//!
//! Choices:
//! * The paper's exception for an underutilized GPU (handing out more than the demand) is not
//!   taken: a share never exceeds its demand, and what is left is reported as `idle_pct` for
//!   the caller to place (e.g. as shadow headroom).
//! * GSLICE weighs each IF by its Algorithm 1 `newGPU%`, i.e. its demand; pass
//!   `weight = demand_pct` for that. Then every unsatisfied client is scaled by the same
//!   factor, `capacity / Σ demand`. Weights must be positive; a zero demand gets zero.

use super::validate::{in_range, non_negative, positive, InvalidField};
use serde::{Deserialize, Serialize};

/// Refusals of [`fair_share`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FairShareError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
}

/// One client's claim on the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub weight: f64,
    /// GPU% wanted (Algorithm 1's `newGPU%` in GSLICE).
    pub demand_pct: f64,
}

/// The allocation, per claim in input order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FairShare {
    pub shares_pct: Vec<f64>,
    /// Whether each claim got its whole demand.
    pub satisfied: Vec<bool>,
    /// The water level `λ` (share per unit weight of every unsatisfied claim); `None` when all
    /// demands are met.
    pub level: Option<f64>,
    /// Capacity no one asked for.
    pub idle_pct: f64,
}

/// Weighted max-min fair share of `capacity_pct` (`(0, 100]`) among `claims`.
pub fn fair_share(capacity_pct: f64, claims: &[Claim]) -> Result<FairShare, FairShareError> {
    positive("capacity_pct", capacity_pct)?;
    in_range("capacity_pct", capacity_pct, 0.0, 100.0)?;
    for (i, c) in claims.iter().enumerate() {
        positive(&format!("claims[{i}].weight"), c.weight)?;
        non_negative(&format!("claims[{i}].demand_pct"), c.demand_pct)?;
    }
    let mut order: Vec<usize> = (0..claims.len()).collect();
    let ratio = |i: usize| claims[i].demand_pct / claims[i].weight;
    order.sort_by(|&a, &b| ratio(a).total_cmp(&ratio(b)).then(a.cmp(&b)));

    let mut shares = vec![0.0; claims.len()];
    let mut satisfied = vec![true; claims.len()];
    let mut remaining = capacity_pct;
    let mut weight_left: f64 = claims.iter().map(|c| c.weight).sum();
    let mut level = None;
    for (k, &i) in order.iter().enumerate() {
        let fair = remaining / weight_left;
        if ratio(i) <= fair {
            shares[i] = claims[i].demand_pct;
            remaining -= claims[i].demand_pct;
            weight_left -= claims[i].weight;
            continue;
        }
        // Every later claim has a ratio at least as high: all stop at this level.
        for &j in &order[k..] {
            shares[j] = fair * claims[j].weight;
            satisfied[j] = false;
        }
        level = Some(fair);
        remaining = 0.0;
        break;
    }
    Ok(FairShare { shares_pct: shares, satisfied, level, idle_pct: remaining.max(0.0) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn equal(demands: &[f64]) -> Vec<Claim> {
        demands.iter().map(|&d| Claim { weight: 1.0, demand_pct: d }).collect()
    }

    #[test]
    fn the_classic_example() {
        // Bertsekas & Gallager's max-min example (capacity 10; demands 2, 2.6, 4, 5 →
        // 2, 2.6, 2.7, 2.7), in percent: 20 and 26 are met, 54 left for two: 27 each.
        let f = fair_share(100.0, &equal(&[40.0, 20.0, 50.0, 26.0])).unwrap();
        assert_eq!(f.shares_pct, vec![27.0, 20.0, 27.0, 26.0]);
        assert_eq!(f.satisfied, vec![false, true, false, true]);
        assert_eq!(f.level, Some(27.0));
        assert_eq!(f.idle_pct, 0.0);
    }

    #[test]
    fn weighted_by_hand() {
        // A (w 1, d 10), B (w 2, d 80), C (w 3, d 90). Ratios 10, 40, 30. A fits under
        // 100/6; then 90 over weight 5 is 18 per unit: C gets 54 < 90, B 36 < 80.
        let claims =
            [Claim { weight: 1.0, demand_pct: 10.0 }, Claim { weight: 2.0, demand_pct: 80.0 }, Claim { weight: 3.0, demand_pct: 90.0 }];
        let f = fair_share(100.0, &claims).unwrap();
        assert_eq!(f.shares_pct, vec![10.0, 36.0, 54.0]);
        assert_eq!(f.satisfied, vec![true, false, false]);
        assert_eq!(f.level, Some(18.0));
    }

    #[test]
    fn weights_equal_to_demands_scale_everyone_alike() {
        // GSLICE's weighting (weight = newGPU%): 30, 60, 50 over 100 → × 100/140 each.
        let claims: Vec<Claim> = [30.0, 60.0, 50.0].iter().map(|&d| Claim { weight: d, demand_pct: d }).collect();
        let f = fair_share(100.0, &claims).unwrap();
        for (s, c) in f.shares_pct.iter().zip(&claims) {
            assert!((s / c.demand_pct - 100.0 / 140.0).abs() < 1e-12, "{f:?}");
        }
        assert!((f.shares_pct.iter().sum::<f64>() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn an_underused_gpu_gives_everyone_their_demand_and_no_more() {
        let f = fair_share(100.0, &equal(&[20.0, 30.0, 0.0])).unwrap();
        assert_eq!(f.shares_pct, vec![20.0, 30.0, 0.0]);
        assert_eq!(f.satisfied, vec![true, true, true]);
        assert_eq!((f.level, f.idle_pct), (None, 50.0));
        let f = fair_share(40.0, &[]).unwrap();
        assert_eq!((f.shares_pct.len(), f.idle_pct), (0, 40.0));
    }

    #[test]
    fn a_smaller_capacity_such_as_a_mig_instance_share() {
        let f = fair_share(50.0, &equal(&[40.0, 40.0])).unwrap();
        assert_eq!(f.shares_pct, vec![25.0, 25.0]);
    }

    #[test]
    fn refuses_bad_input_naming_the_field() {
        let field = |r: Result<FairShare, FairShareError>| match r {
            Err(FairShareError::Invalid(f)) => (f.field, f.reason),
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(field(fair_share(0.0, &[])), ("capacity_pct".into(), "must be > 0, got 0".into()));
        assert_eq!(field(fair_share(100.1, &[])).0, "capacity_pct");
        assert_eq!(field(fair_share(f64::NAN, &[])).1, "is NaN");
        assert_eq!(field(fair_share(100.0, &[Claim { weight: 0.0, demand_pct: 1.0 }])).0, "claims[0].weight");
        let bad = [Claim { weight: 1.0, demand_pct: 1.0 }, Claim { weight: 1.0, demand_pct: -1.0 }];
        assert_eq!(field(fair_share(100.0, &bad)), ("claims[1].demand_pct".into(), "must be >= 0, got -1".into()));
        let nan = [Claim { weight: 1.0, demand_pct: f64::NAN }];
        assert_eq!(field(fair_share(100.0, &nan)), ("claims[0].demand_pct".into(), "is NaN".into()));
    }

    proptest! {
        /// Feasible, capped by demand, work-conserving, and max-min: every unsatisfied claim
        /// sits exactly at the level and no satisfied claim asked for more than it.
        #[test]
        fn max_min_properties(
            capacity in 1.0f64..=100.0,
            raw in proptest::collection::vec((0.1f64..10.0, 0.0f64..120.0), 0..8),
        ) {
            let claims: Vec<Claim> = raw.iter().map(|&(weight, demand_pct)| Claim { weight, demand_pct }).collect();
            let f = fair_share(capacity, &claims).unwrap();
            let tol = 1e-9;
            let total: f64 = f.shares_pct.iter().sum();
            prop_assert!(total <= capacity + tol);
            let demand: f64 = claims.iter().map(|c| c.demand_pct).sum();
            prop_assert!((total + f.idle_pct - capacity).abs() < tol);
            prop_assert_eq!(f.level.is_none(), demand <= capacity + tol || claims.is_empty());
            for (i, c) in claims.iter().enumerate() {
                prop_assert!(f.shares_pct[i] <= c.demand_pct + tol);
                match f.level {
                    Some(level) if !f.satisfied[i] => prop_assert!((f.shares_pct[i] - level * c.weight).abs() < tol),
                    Some(level) => prop_assert!(c.demand_pct / c.weight <= level + tol),
                    None => prop_assert!(f.satisfied[i] && f.shares_pct[i] == c.demand_pct),
                }
            }
        }
    }
}
