//! Minimal re-planning (ParvaGPU Sec. III-F): when only the rate or SLO of a few services
//! changed since the last pass, only their segments are recomputed and relocated into the
//! previous deployment map (`parvagpu::replan_service`), so every other service keeps its
//! GPUs, MIG instances and starts, and its agents are not reconfigured. A changed service in
//! a pool whose strategy has no minimal re-planning (iGniter, exact MIG, PARIS) re-plans its
//! own group alone, as does a group a service left or joined (a new rate can make the other
//! pool the cheaper one); the other groups keep their plans. Anything else (a new service, a
//! model, a profile, a GPU type, a strategy, or many changes at once) plans everything
//! again. Pure.

use std::collections::BTreeMap;

use planner::input::PlanningInput;
use planner::plan::Plan;
use planner::strategy::parvagpu;

use super::pools::{guarded, members, merge, plan_each_pool, plan_isolated, pool_input, Group, Members, Pool};
use super::{MigStrategy, ServiceRules};

/// Most changed services re-planned one by one; past this a full pass is cheaper than
/// relocating each (every relocation reconfigures all services) and moves little more.
pub const MAX_INCREMENTAL_CHANGES: usize = 8;

/// What a pass planned, per pool, for the next pass to start from. Leader memory: a new
/// leader plans in full once.
#[derive(Clone, Debug)]
pub struct PoolPlans {
    input: PlanningInput,
    rules: ServiceRules,
    strategy: MigStrategy,
    members: Members,
    plans: BTreeMap<Group, Plan>,
    /// Whether this plan was made incrementally (for tests and logs).
    pub incremental: bool,
}

impl PoolPlans {
    /// GPUs of each model these plans use: what the services need before the plan meets
    /// the fleet (the pools' GPUs are the merged plan's).
    pub fn gpus_by_model(&self) -> BTreeMap<String, u32> {
        let mut out: BTreeMap<String, u32> = BTreeMap::new();
        for g in self.plans.values().flat_map(|p| &p.gpus) {
            *out.entry(g.gpu_type.clone()).or_default() += 1;
        }
        out
    }
}

/// Plans every service, from `previous` when only a few services' rates or SLOs changed.
/// `stop` is asked before each pool and each service re-planned: `None` when it said to.
pub fn plan_pools_from(
    input: &PlanningInput,
    rules: &ServiceRules,
    strategy: MigStrategy,
    previous: Option<&PoolPlans>,
    stop: &dyn Fn() -> bool,
) -> Option<(Plan, PoolPlans)> {
    let step = previous.map_or(Incremental::NotApplicable(None), |p| incremental(p, input, rules, strategy, stop));
    let (members, plans, is_incremental) = match step {
        Incremental::Planned(members, plans) => (members, plans, true),
        Incremental::Stopped => return None,
        Incremental::NotApplicable(known) => {
            let members = known.unwrap_or_else(|| members(input, rules, strategy));
            let plans = plan_each_pool(input, &members, stop)?;
            (members, plans, false)
        }
    };
    let plan = merge(input, plans.clone(), strategy);
    Some((plan, PoolPlans { input: input.clone(), rules: rules.clone(), strategy, members, plans, incremental: is_incremental }))
}

enum Incremental {
    Planned(Members, BTreeMap<Group, Plan>),
    /// Not a case for minimal re-planning (or it failed): plan everything, with the pools'
    /// members when they were already worked out.
    NotApplicable(Option<Members>),
    Stopped,
}

fn incremental(
    prev: &PoolPlans,
    input: &PlanningInput,
    rules: &ServiceRules,
    strategy: MigStrategy,
    stop: &dyn Fn() -> bool,
) -> Incremental {
    use Incremental::*;
    let same_ground = prev.strategy == strategy
        && prev.rules == *rules
        && prev.input.gpu_types == input.gpu_types
        && prev.input.profiles == input.profiles
        && prev.input.services.len() == input.services.len();
    if !same_ground {
        return NotApplicable(None);
    }
    let mut changed = Vec::new();
    for (i, (before, now)) in prev.input.services.iter().zip(&input.services).enumerate() {
        if before.name != now.name || before.model != now.model {
            return NotApplicable(None);
        }
        if before != now {
            changed.push(i);
        }
    }
    if changed.len() > MAX_INCREMENTAL_CHANGES {
        return NotApplicable(None);
    }
    // A rate can move a service to the other pool (the cheaper one for it alone): the groups
    // it left and joined are planned again; every other group keeps its plan.
    let members = members(input, rules, strategy);
    let mut plans: BTreeMap<Group, Plan> = BTreeMap::new();
    let mut replanned: Vec<&Group> = Vec::new();
    for (group, services) in &members {
        match prev.plans.get(group) {
            Some(plan) if prev.members.get(group) == Some(services) => {
                plans.insert(group.clone(), plan.clone());
            }
            _ => {
                if stop() {
                    return Stopped;
                }
                plans.insert(group.clone(), plan_isolated(input, group.pool, services));
                replanned.push(group);
            }
        }
    }
    if changed.is_empty() {
        return Planned(members, plans);
    }
    let cfg = parvagpu::ParvaConfig::default();
    for &i in &changed {
        if stop() {
            return Stopped;
        }
        // Re-planned within its own group (its pool and isolation domain), on that group's
        // GPUs alone.
        let Some((group, services)) = members.iter().find(|(_, services)| services.contains(&i)) else {
            return NotApplicable(Some(members));
        };
        if replanned.contains(&group) {
            continue; // planned again from scratch above, at its new rate
        }
        if group.pool != Pool::Parvagpu {
            // No minimal re-planning in this strategy: its group is planned again (once for
            // all its changed services), and only its group's services can move.
            if !replanned.contains(&group) {
                plans.insert(group.clone(), plan_isolated(input, group.pool, services));
                replanned.push(group);
            }
            continue;
        }
        let Some(plan) = plans.get(group) else { return NotApplicable(Some(members)) };
        let pool = pool_input(input, Pool::Parvagpu, services);
        let demand = &input.services[i];
        // A failure here plans everything again, where each service is isolated.
        match guarded(|| parvagpu::replan_service(plan, &pool, demand, &cfg)) {
            Ok(p) => {
                plans.insert(group.clone(), p);
            }
            Err(_) => return NotApplicable(Some(members)),
        }
    }
    Planned(members, plans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::input::{GpuType, Profiles, ServiceDemand};
    use planner::mig::GpuModel;
    use planner::perf::synthetic::example_models;
    use std::collections::BTreeSet;

    fn input(rates: &[f64]) -> PlanningInput {
        let mut profiles = Profiles::default();
        let resnet = example_models().into_iter().find(|m| m.name == "resnet50").unwrap();
        profiles.tables.entry("A100-80GB".into()).or_default().insert("resnet50".into(), resnet.table(3));
        PlanningInput {
            gpu_types: vec![GpuType {
                name: "A100-80GB".into(),
                model: GpuModel::A100_80GB,
                price_per_hour: 4.0,
                mps: true,
                igniter: None,
            }],
            services: rates
                .iter()
                .enumerate()
                .map(|(i, &r)| ServiceDemand { name: format!("s{i:02}"), model: "resnet50".into(), slo_ms: 50.0, request_rate: r })
                .collect(),
            profiles,
        }
    }

    /// Each GPU's content, so two plans can be compared GPU by GPU whatever their order.
    fn contents(plan: &Plan) -> BTreeSet<String> {
        plan.gpus.iter().map(|g| format!("{:?}{:?}", g.sharing, g.workloads)).collect()
    }

    #[test]
    fn one_services_new_rate_moves_only_that_service() {
        let rates: Vec<f64> = (0..30).map(|i| 3000.0 + 700.0 * f64::from(i % 7)).collect();
        let (before, memory) = plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        assert!(!memory.incremental);
        let mut raised = rates.clone();
        raised[4] *= 1.25;
        let (after, next) =
            plan_pools_from(&input(&raised), &ServiceRules::default(), MigStrategy::Parvagpu, Some(&memory), &|| false).unwrap();
        assert!(next.incremental);
        assert!(after.infeasible.is_empty(), "{:?}", after.infeasible);
        let capacity = |p: &Plan, s: &str| p.predictions.iter().find(|x| x.service == s).map_or(0.0, |x| x.capacity_rps);
        assert!(capacity(&after, "s04") >= raised[4], "the raised service is sized for its new rate");
        // Every GPU that does not hold s04 now is exactly as it was.
        let was = contents(&before);
        let moved: Vec<_> = after
            .gpus
            .iter()
            .filter(|g| !was.contains(&format!("{:?}{:?}", g.sharing, g.workloads)))
            .filter(|g| g.workloads.iter().all(|w| w.service != "s04"))
            .collect();
        assert!(moved.is_empty(), "GPUs of other services changed: {moved:?}");
        // A full pass on the same input repacks far more.
        let full = super::super::plan_pools(&input(&raised), &ServiceRules::default(), MigStrategy::Parvagpu);
        let changed = |p: &Plan| contents(p).difference(&was).count();
        assert!(changed(&after) < changed(&full), "incremental {} vs full {}", changed(&after), changed(&full));
    }

    /// A100s with ParvaGPU tables; T4s (MPS only) with iGniter coefficients for resnet50.
    fn two_pools(rates: &[f64]) -> PlanningInput {
        let mut inp = input(&[]);
        let shapes = example_models();
        let bert = shapes.iter().find(|m| m.name == "bert-base").unwrap();
        let resnet = shapes.iter().find(|m| m.name == "resnet50").unwrap();
        inp.profiles.tables.entry("A100-80GB".into()).or_default().insert("bert-base".into(), bert.table(3));
        inp.profiles
            .igniter
            .entry("T4".into())
            .or_default()
            .insert("resnet50".into(), planner::perf::synthetic::igniter_workload(resnet, 0.25));
        inp.gpu_types.push(GpuType {
            name: "T4".into(),
            model: GpuModel::NoMig,
            // Per request a T4 (a quarter of an A100's speed) costs more than an A100: a large
            // service is cheaper on A100s, a small one on a share of a T4.
            price_per_hour: 1.5,
            mps: true,
            igniter: Some(planner::perf::synthetic::igniter_hardware()),
        });
        // Small resnet50 services go to the cheap T4s; BERT has no T4 coefficients.
        for (i, &r) in rates.iter().enumerate() {
            inp.services.push(ServiceDemand { name: format!("small{i}"), model: "resnet50".into(), slo_ms: 200.0, request_rate: r });
            inp.services.push(ServiceDemand {
                name: format!("bert{i}"),
                model: "bert-base".into(),
                slo_ms: 200.0,
                request_rate: 100.0 + r,
            });
        }
        inp
    }

    #[test]
    fn a_rate_change_in_a_pool_without_minimal_replanning_replans_that_pool_alone() {
        let rates = [20.0, 30.0, 25.0, 15.0];
        let (before, memory) =
            plan_pools_from(&two_pools(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        let on = |p: &Plan, ty: &str| -> BTreeSet<String> {
            p.gpus.iter().filter(|g| g.gpu_type == ty).map(|g| format!("{:?}{:?}", g.sharing, g.workloads)).collect()
        };
        assert!(!on(&before, "T4").is_empty() && !on(&before, "A100-80GB").is_empty(), "both pools plan something");
        let mut raised = rates;
        raised[1] = 36.0;
        let (after, next) =
            plan_pools_from(&two_pools(&raised), &ServiceRules::default(), MigStrategy::Parvagpu, Some(&memory), &|| false).unwrap();
        assert!(next.incremental, "one rate in the iGniter pool is not a reason to plan everything");
        assert_eq!(on(&after, "A100-80GB"), on(&before, "A100-80GB"), "the MIG pool keeps its plan");
        let capacity = |p: &Plan, s: &str| p.predictions.iter().find(|x| x.service == s).map_or(0.0, |x| x.capacity_rps);
        assert!(capacity(&after, "small1") >= 36.0);
        // And the result is what planning that pool from scratch gives.
        let full = super::super::plan_pools(&two_pools(&raised), &ServiceRules::default(), MigStrategy::Parvagpu);
        assert_eq!(on(&after, "T4"), on(&full, "T4"));
    }

    #[test]
    fn a_service_that_changes_pool_replans_the_groups_it_left_and_joined() {
        let rates = [20.0, 30.0, 25.0, 15.0];
        let (_, memory) = plan_pools_from(&two_pools(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        let mut raised = rates;
        // Far more than T4s serve cheaply: small1 goes to the A100s.
        raised[1] = 3000.0;
        let inp = two_pools(&raised);
        let (after, next) = plan_pools_from(&inp, &ServiceRules::default(), MigStrategy::Parvagpu, Some(&memory), &|| false).unwrap();
        assert_ne!(next.members, memory.members, "small1 changed pool");
        assert!(next.incremental);
        assert!(after.infeasible.is_empty(), "{:?}", after.infeasible);
        let a100 = |p: &Plan| {
            p.gpus
                .iter()
                .filter(|g| g.gpu_type == "A100-80GB")
                .flat_map(|g| g.workloads.iter().map(|w| w.service.clone()))
                .collect::<BTreeSet<_>>()
        };
        assert!(a100(&after).contains("small1"));
        // Both groups it touched are planned as a full pass plans them.
        assert_eq!(contents(&after), contents(&super::super::plan_pools(&inp, &ServiceRules::default(), MigStrategy::Parvagpu)));
    }

    #[test]
    fn anything_but_a_few_rates_plans_everything_again() {
        let rates: Vec<f64> = (0..12).map(|i| 2000.0 + 100.0 * f64::from(i)).collect();
        let (_, memory) = plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        let all_up: Vec<f64> = rates.iter().map(|r| r * 1.1).collect();
        assert!(
            !plan_pools_from(&input(&all_up), &ServiceRules::default(), MigStrategy::Parvagpu, Some(&memory), &|| false)
                .unwrap()
                .1
                .incremental
        );
        let mut more = rates.clone();
        more.push(500.0);
        assert!(
            !plan_pools_from(&input(&more), &ServiceRules::default(), MigStrategy::Parvagpu, Some(&memory), &|| false)
                .unwrap()
                .1
                .incremental
        );
        assert!(
            !plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::ExactMig, Some(&memory), &|| false)
                .unwrap()
                .1
                .incremental
        );
        let (same, again) =
            plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, Some(&memory), &|| false).unwrap();
        assert!(again.incremental);
        assert_eq!(same, plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap().0);
    }
}
