//! Fleet autoscaling decisions about nodes, pure (the services' rates are HetSev's
//! `decide_rate`, in `loops::autoscaler`): when the plan
//! needs more GPUs of a model than the healthy fleet (and launches in flight) has, nodes are
//! launched of the instance type with the least HetSev objective `C_i (X_i + λ O_i X_i)`
//! (price and launch latency); a launched node that holds nothing for the cool-down is
//! terminated.

use std::collections::BTreeMap;

use planner::policy::hetsev::launch_objective;

use crate::resources::InstanceTypeSpec;

/// A launch decision: `count` nodes of `instance_type`.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub instance_type: String,
    pub count: u32,
    pub objective: f64,
}

/// For each GPU model short of GPUs, the cheapest way (HetSev's objective) to cover the
/// shortfall: one instance type where one can cover it within its `room` (instances it may
/// still launch; a type absent from `room` has no limit), else, one after another, each
/// type's whole room, cheapest per GPU first. Models no instance type offers, or whose
/// types have no room left, are left out, as is what no room covers.
pub fn launches_for(
    shortfall: &BTreeMap<String, u32>,
    types: &BTreeMap<String, InstanceTypeSpec>,
    room: &BTreeMap<String, u32>,
    lambda_per_s: f64,
) -> Vec<Launch> {
    let mut out = Vec::new();
    for (model, &missing) in shortfall {
        let mut missing = missing;
        let mut left: BTreeMap<&str, u32> = types
            .iter()
            .filter(|(_, t)| t.gpu_model == *model && t.gpu_count > 0)
            .map(|(name, _)| (name.as_str(), room.get(name).copied().unwrap_or(u32::MAX)))
            .collect();
        // Each round covers the rest or uses up a type's room: at most one per type.
        while missing > 0 {
            let best = left
                .iter()
                .filter(|(_, &r)| r > 0)
                .map(|(&name, &r)| {
                    let t = &types[name];
                    let count = missing.div_ceil(t.gpu_count).min(r);
                    let objective = launch_objective(t.price_per_hour, t.launch_latency_s, count, lambda_per_s);
                    let covers = count * t.gpu_count >= missing;
                    // Whole covers by their objective; partial ones by it per GPU launched.
                    let rank = if covers { objective } else { objective / f64::from(count * t.gpu_count) };
                    ((!covers, rank), Launch { instance_type: name.to_string(), count, objective })
                })
                .min_by(|(a, la), (b, lb)| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then_with(|| la.instance_type.cmp(&lb.instance_type)));
            let Some((_, launch)) = best else { break };
            let t = &types[&launch.instance_type];
            *left.get_mut(launch.instance_type.as_str()).expect("a candidate") -= launch.count;
            missing = missing.saturating_sub(launch.count * t.gpu_count);
            out.push(launch);
        }
    }
    out
}

/// Instances each limited type (`max_instances`) may still launch, given how many of each
/// type exist or are launching; unlimited types are absent.
pub fn launch_room(types: &BTreeMap<String, InstanceTypeSpec>, instances: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
    types
        .iter()
        .filter_map(|(name, t)| t.max_instances.map(|max| (name.clone(), max.saturating_sub(instances.get(name).copied().unwrap_or(0)))))
        .collect()
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
            max_instances: None,
        }
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
        let l = launches_for(&short, &types, &BTreeMap::new(), 0.001);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].instance_type.as_str(), l[0].count), ("small", 2));
        // Sixteen: the big ones are cheaper per GPU.
        let short: BTreeMap<String, u32> = [("A100-80GB".to_string(), 16)].into();
        assert_eq!(launches_for(&short, &types, &BTreeMap::new(), 0.001)[0].instance_type, "big");
        // A slow launch tips a tie: same price, the faster type wins.
        let mut tie = BTreeMap::new();
        tie.insert("slow".to_string(), it("T4-16GB", 1, 1.0, 600.0));
        tie.insert("fast".to_string(), it("T4-16GB", 1, 1.0, 60.0));
        let short: BTreeMap<String, u32> = [("T4-16GB".to_string(), 1)].into();
        assert_eq!(launches_for(&short, &tie, &BTreeMap::new(), 0.001)[0].instance_type, "fast");
        // Nothing offers the model: no launch.
        let short: BTreeMap<String, u32> = [("V100-16GB".to_string(), 1)].into();
        assert!(launches_for(&short, &types, &BTreeMap::new(), 0.001).is_empty());
    }

    #[test]
    fn launches_stop_at_each_types_limit_and_go_on_with_the_next_cheapest() {
        let mut types = BTreeMap::new();
        types.insert("big".to_string(), InstanceTypeSpec { max_instances: Some(3), ..it("A100-80GB", 8, 24.0, 180.0) });
        types.insert("small".to_string(), InstanceTypeSpec { max_instances: Some(10), ..it("A100-80GB", 1, 4.0, 120.0) });
        // 2 big ones exist already, 1 small one is launching.
        let instances: BTreeMap<String, u32> = [("big".to_string(), 2), ("small".to_string(), 1)].into();
        let room = launch_room(&types, &instances);
        assert_eq!(room, [("big".to_string(), 1), ("small".to_string(), 9)].into());
        // 16 GPUs: the big type is cheaper per GPU but has room for one (8 GPUs); 8 small
        // ones cover the rest.
        let short: BTreeMap<String, u32> = [("A100-80GB".to_string(), 16)].into();
        let l = launches_for(&short, &types, &room, 0.001);
        let picked: Vec<(&str, u32)> = l.iter().map(|l| (l.instance_type.as_str(), l.count)).collect();
        assert_eq!(picked, [("big", 1), ("small", 8)]);
        // More than all the room: every type's room, and no more.
        let short: BTreeMap<String, u32> = [("A100-80GB".to_string(), 100)].into();
        let l = launches_for(&short, &types, &room, 0.001);
        let picked: Vec<(&str, u32)> = l.iter().map(|l| (l.instance_type.as_str(), l.count)).collect();
        assert_eq!(picked, [("big", 1), ("small", 9)]);
        // No room left: nothing.
        let full = launch_room(&types, &[("big".to_string(), 3), ("small".to_string(), 12)].into());
        assert!(launches_for(&short, &types, &full, 0.001).is_empty());
        // A type without a limit has no entry in the room: it covers everything.
        types.insert("open".to_string(), it("A100-80GB", 8, 24.0, 180.0));
        let room = launch_room(&types, &instances);
        assert!(!room.contains_key("open"));
        let l = launches_for(&short, &types, &room, 0.001);
        assert_eq!((l[0].instance_type.as_str(), l[0].count, l.len()), ("open", 13, 1));
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
