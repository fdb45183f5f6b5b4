//! Fleet autoscaling decisions, pure. Services with an autoscaling range are provisioned
//! for their measured arrival rate at HetSev's saturation target (Sec. 4.1: act when load
//! exceeds 80% of capacity, so capacity = arrival / 0.8), clamped to the range; when the plan
//! needs more GPUs of a model than the healthy fleet (and launches in flight) has, nodes are
//! launched of the instance type with the least HetSev objective `C_i (X_i + λ O_i X_i)`
//! (price and launch latency); a launched node that holds nothing for the cool-down is
//! terminated.

use std::collections::BTreeMap;

use planner::policy::hetsev::launch_objective;

use crate::resources::InstanceTypeSpec;

/// The rate to provision an autoscaling service for.
pub fn provisioned_rate(arrival_rps: f64, target_saturation: f64, min_rps: f64, max_rps: f64) -> f64 {
    (arrival_rps / target_saturation).clamp(min_rps, max_rps)
}

/// A launch decision: `count` nodes of `instance_type`.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub instance_type: String,
    pub count: u32,
    pub objective: f64,
}

/// For each GPU model short of GPUs, the cheapest way (HetSev's objective) to cover the
/// shortfall with one instance type. Models no instance type offers are left out.
pub fn launches_for(shortfall: &BTreeMap<String, u32>, types: &BTreeMap<String, InstanceTypeSpec>, lambda_per_s: f64) -> Vec<Launch> {
    let mut out = Vec::new();
    for (model, &missing) in shortfall {
        if missing == 0 {
            continue;
        }
        let best = types
            .iter()
            .filter(|(_, t)| t.gpu_model == *model && t.gpu_count > 0)
            .map(|(name, t)| {
                let count = missing.div_ceil(t.gpu_count);
                Launch {
                    instance_type: name.clone(),
                    count,
                    objective: launch_objective(t.price_per_hour, t.launch_latency_s, count, lambda_per_s),
                }
            })
            .min_by(|a, b| a.objective.total_cmp(&b.objective).then_with(|| a.instance_type.cmp(&b.instance_type)));
        out.extend(best);
    }
    out
}

/// GPUs each model is short of: planned minus available (healthy plus launching).
pub fn shortfall(planned: &BTreeMap<String, u32>, available: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
    planned.iter().map(|(m, &n)| (m.clone(), n.saturating_sub(available.get(m).copied().unwrap_or(0)))).filter(|(_, n)| *n > 0).collect()
}

/// Launched nodes idle (no GPU in the plan) since longer than `cooldown_s` at `now_s`.
pub fn idle_nodes(idle_since: &BTreeMap<String, f64>, now_s: f64, cooldown_s: f64) -> Vec<String> {
    idle_since.iter().filter(|(_, &t)| now_s - t >= cooldown_s).map(|(n, _)| n.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(model: &str, gpus: u32, price: f64, launch_s: f64) -> InstanceTypeSpec {
        InstanceTypeSpec {
            gpu_model: model.into(),
            gpu_count: gpus,
            price_per_hour: price,
            launch_latency_s: launch_s,
            cpu_cores: 0,
            memory_gib: 0.0,
        }
    }

    #[test]
    fn the_rate_targets_80_percent_saturation_within_the_range() {
        assert_eq!(provisioned_rate(400.0, 0.8, 100.0, 1000.0), 500.0);
        assert_eq!(provisioned_rate(10.0, 0.8, 100.0, 1000.0), 100.0);
        assert_eq!(provisioned_rate(4000.0, 0.8, 100.0, 1000.0), 1000.0);
    }

    #[test]
    fn the_cheapest_adequate_type_wins_with_launch_latency_priced_in() {
        let mut types = BTreeMap::new();
        // 3 per GPU-hour in eights, 4 per GPU-hour singly.
        types.insert("big".to_string(), it("A100-80GB", 8, 24.0, 180.0));
        types.insert("small".to_string(), it("A100-80GB", 1, 4.0, 120.0));
        types.insert("h100".to_string(), it("H100-80GB", 8, 98.0, 240.0));
        let short: BTreeMap<String, u32> = [("A100-80GB".to_string(), 2)].into();
        // Two GPUs: two small ones (8/h) beat one big one (24/h).
        let l = launches_for(&short, &types, 0.001);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].instance_type.as_str(), l[0].count), ("small", 2));
        // Sixteen: the big ones are cheaper per GPU.
        let short: BTreeMap<String, u32> = [("A100-80GB".to_string(), 16)].into();
        assert_eq!(launches_for(&short, &types, 0.001)[0].instance_type, "big");
        // A slow launch tips a tie: same price, the faster type wins.
        let mut tie = BTreeMap::new();
        tie.insert("slow".to_string(), it("T4-16GB", 1, 1.0, 600.0));
        tie.insert("fast".to_string(), it("T4-16GB", 1, 1.0, 60.0));
        let short: BTreeMap<String, u32> = [("T4-16GB".to_string(), 1)].into();
        assert_eq!(launches_for(&short, &tie, 0.001)[0].instance_type, "fast");
        // Nothing offers the model: no launch.
        let short: BTreeMap<String, u32> = [("V100-16GB".to_string(), 1)].into();
        assert!(launches_for(&short, &types, 0.001).is_empty());
    }

    #[test]
    fn shortfall_counts_launches_in_flight_and_idle_nodes_wait_for_the_cooldown() {
        let planned: BTreeMap<String, u32> = [("A".to_string(), 5), ("B".to_string(), 1)].into();
        let available: BTreeMap<String, u32> = [("A".to_string(), 3), ("B".to_string(), 2)].into();
        assert_eq!(shortfall(&planned, &available), [("A".to_string(), 2)].into());
        let idle: BTreeMap<String, f64> = [("n1".to_string(), 10.0), ("n2".to_string(), 50.0)].into();
        assert_eq!(idle_nodes(&idle, 60.0, 30.0), vec!["n1".to_string()]);
    }
}
