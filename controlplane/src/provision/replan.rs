//! Minimal re-planning (ParvaGPU Sec. III-F): when only the rates or SLOs of some services
//! changed since the last pass, only their segments are recomputed and relocated into the
//! previous deployment map (`parvagpu::replan_service`), so every other service keeps its
//! GPUs, MIG instances and starts, and its agents are not reconfigured. iGniter's pool does
//! the same on its own rules (`igniter::replan_service`: the service's replicas leave and
//! are placed again by Alg. 1). A new rate can make the other pool the cheaper one: the
//! service leaves its old group's plan (`Plan::without_service`) and is placed into the
//! new group's. A group whose strategy has no minimal re-planning (exact MIG, PARIS) is
//! planned again alone when a member changed, left or joined; the other groups keep their
//! plans. Consolidation: a pass that is asked to ([`Previous::consolidate`]) also plans
//! everything again and takes that plan when it saves at least [`CONSOLIDATION_SAVING`] of
//! the GPU cost and its saving over [`CONSOLIDATION_HORIZON_H`] pays for the restarts it
//! makes ([`consolidation_pays`]: each restarted process's cold start, priced at a second of
//! the dearest GPU). When it does not, a repack in small steps is weighed the same way
//! (`parvagpu::compact`: the sparsest MIG GPUs emptied into the others' free slots, so only
//! their services move); one that is not leaves the check owed ([`PoolPlans::owes_consolidation`])
//! to a later pass, so that a change costs what it changes and not a full plan too (the
//! provisioner consolidates on its periodic pass only). Anything else (a new service, a model, a
//! profile, a GPU type, a strategy, or more than [`MAX_INCREMENTAL_CHANGES`] changes at
//! once) plans everything again. Pure.

use std::collections::BTreeMap;

use planner::input::PlanningInput;
use planner::plan::Plan;
use planner::strategy::{igniter, parvagpu};

use super::kept::restart_process_seconds;
use super::pools::{guarded, members, merge, plan_each_pool, plan_isolated, pool_input, Group, Members, Pool};
use super::{MigStrategy, ServiceRules};

/// Most changed services re-planned one by one; past this a full pass is planned alone
/// (relocating each costs a planning of its own).
pub const MAX_INCREMENTAL_CHANGES: usize = 64;

/// Share of the GPU cost per hour a full re-plan must save over the incremental one to be
/// taken instead. Relocating services one by one keeps every other workload running but
/// leaves GPUs part-used as rates fall; a full re-plan repacks them and restarts most of
/// the fleet's workloads. In the fleet simulator's day (`fleet-sim --target-saturation 0.7`)
/// 2% costs 0.3% more than always re-planning in full and restarts a third as many
/// workloads (24,254 reconfigurations instead of 69,496); 5% costs 1.3% more for 10,164.
/// Weighed on the provisioner's periodic pass only, rather than on every change's, 2% costs
/// 0.2% more again, for 24,750 reconfigurations.
pub const CONSOLIDATION_SAVING: f64 = 0.02;

/// Seconds a restarted process of a service without a ServingRuntime takes to serve again
/// (the host template's server; fleet-sim's default cold start).
pub const DEFAULT_RESTART_S: f64 = 10.0;

/// Hours a consolidation's saving is counted over against its restarts: about how long a
/// repacked fleet lasts before the day's traffic moves it again.
pub const CONSOLIDATION_HORIZON_H: f64 = 1.0;

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
    /// Whether a consolidating pass took a repack in small steps (`parvagpu::compact`): an
    /// incremental plan that moves services although no input changed.
    pub compacted: bool,
    /// Services were re-planned minimally since a full plan was last weighed against the
    /// minimal one: a consolidating pass should weigh it.
    owes_consolidation: bool,
}

/// Where a pass starts from: the previous pass's pool plans.
#[derive(Clone, Copy, Debug)]
pub struct Previous<'a> {
    pub plans: &'a PoolPlans,
    /// Whether to weigh a full plan against the minimal re-plan now (a whole planning pass
    /// more: at 10,000 hosts a quarter to a third of a one-Service change's pass,
    /// `provision-bench`).
    /// When false and services were re-planned minimally, the check is owed.
    pub consolidate: bool,
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

    /// Whether services were re-planned minimally since a full plan was last weighed
    /// against the minimal one ([`Previous::consolidate`]).
    pub fn owes_consolidation(&self) -> bool {
        self.owes_consolidation
    }
}

/// Plans every service, from `previous` when only a few services' rates or SLOs changed.
/// `stop` is asked before each pool and each service re-planned: `None` when it said to.
pub fn plan_pools_from(
    input: &PlanningInput,
    rules: &ServiceRules,
    strategy: MigStrategy,
    previous: Option<Previous>,
    stop: &dyn Fn() -> bool,
) -> Option<(Plan, PoolPlans)> {
    let step = previous.map_or(Incremental::NotApplicable(None), |p| incremental(p.plans, input, rules, strategy, stop));
    // Services re-planned minimally since a full plan was last weighed: by this pass or one before.
    let owed = previous.is_some_and(|p| p.plans.owes_consolidation || p.plans.input.services != input.services);
    let consolidate = previous.is_some_and(|p| p.consolidate);
    let mut compacted = false;
    let (members, plans, is_incremental, owes_consolidation) = match step {
        Incremental::Planned(members, plans) if owed && consolidate => {
            // Consolidation: relocating services one by one leaves GPUs part-used as rates
            // fall; when planning everything again saves enough, that plan is taken.
            let full = plan_each_pool(input, &members, stop)?;
            let cost = |plans: &BTreeMap<Group, Plan>| plans.values().map(|p| p.cost_per_hour(&input.gpu_types)).sum::<f64>();
            let restart_s = |service: &str| rules.restart_s.get(service).copied().unwrap_or(DEFAULT_RESTART_S);
            // Two placements, made only for a plan that saves enough to be weighed further.
            let restarts =
                || restart_process_seconds(&merge(input, plans.clone(), strategy), &merge(input, full.clone(), strategy), &restart_s);
            if consolidation_pays(cost(&plans), cost(&full), restart_price_per_s(input), restarts) {
                (members, full, false, false)
            } else {
                // A repack in small steps: only the services on the GPUs it empties move.
                let repacked = compact(input, &members, &plans);
                let restarts = || {
                    restart_process_seconds(&merge(input, plans.clone(), strategy), &merge(input, repacked.clone(), strategy), &restart_s)
                };
                if consolidation_pays(cost(&plans), cost(&repacked), restart_price_per_s(input), restarts) {
                    compacted = true;
                    (members, repacked, true, false)
                } else {
                    (members, plans, true, false)
                }
            }
        }
        Incremental::Planned(members, plans) => (members, plans, true, owed),
        Incremental::Stopped => return None,
        Incremental::NotApplicable(known) => {
            let members = known.unwrap_or_else(|| members(input, rules, strategy));
            let plans = plan_each_pool(input, &members, stop)?;
            (members, plans, false, false)
        }
    };
    let plan = merge(input, plans.clone(), strategy);
    let pools = PoolPlans {
        input: input.clone(),
        rules: rules.clone(),
        strategy,
        members,
        plans,
        incremental: is_incremental,
        compacted,
        owes_consolidation,
    };
    Some((plan, pools))
}

/// Dollars one second of one restarting process costs: a second of the dearest GPU type
/// the plan may use. Make-before-break holds capacity for the new process, up to a whole
/// GPU, while the old one serves, and the restart puts its service's windows at risk; WPM
/// (arXiv 2409.06646) prices migrations against GPUs used the same way.
pub fn restart_price_per_s(input: &PlanningInput) -> f64 {
    input.gpu_types.iter().map(|t| t.price_per_hour).filter(|p| p.is_finite() && *p > 0.0).fold(0.0, f64::max) / 3600.0
}

/// Whether a full plan costing `full_per_h` replaces the minimal re-plan costing
/// `minimal_per_h`: it must save [`CONSOLIDATION_SAVING`] of the cost, and its saving over
/// [`CONSOLIDATION_HORIZON_H`] must pay for the process-seconds of restarts moving to it
/// makes (`restart_process_s`, asked only when the saving is enough) at `price_per_s`.
pub fn consolidation_pays(minimal_per_h: f64, full_per_h: f64, price_per_s: f64, restart_process_s: impl FnOnce() -> f64) -> bool {
    let saving = minimal_per_h - full_per_h;
    saving > minimal_per_h * CONSOLIDATION_SAVING && saving * CONSOLIDATION_HORIZON_H >= restart_process_s() * price_per_s
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
        && prev.rules.plans_as(rules)
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
    // A rate can move a service to the other pool (the cheaper one for it alone): it leaves
    // the plan of the group it left (`Plan::without_service`: the others stay put) and is
    // placed in the group it joined as a changed service is. A group whose strategy has no
    // minimal re-planning is planned again instead. Every other group keeps its plan.
    let members = members(input, rules, strategy);
    let mut plans: BTreeMap<Group, Plan> = BTreeMap::new();
    let mut replanned: Vec<&Group> = Vec::new();
    let mut relocate = changed;
    for (group, services) in &members {
        let before = prev.members.get(group);
        match prev.plans.get(group) {
            Some(plan) if before == Some(services) => {
                plans.insert(group.clone(), plan.clone());
            }
            Some(plan) if relocates(group.pool) => {
                let before = before.map_or(&[][..], Vec::as_slice);
                let mut plan = plan.clone();
                for &left in before.iter().filter(|i| !services.contains(i)) {
                    plan = plan.without_service(&input.services[left].name);
                }
                relocate.extend(services.iter().filter(|i| !before.contains(i)));
                plans.insert(group.clone(), plan);
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
    relocate.sort_unstable();
    relocate.dedup();
    if relocate.is_empty() {
        return Planned(members, plans);
    }
    let cfg = parvagpu::ParvaConfig::default();
    for &i in &relocate {
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
        let Some(plan) = plans.get(group) else { return NotApplicable(Some(members)) };
        let pool = pool_input(input, group.pool, services);
        let demand = &input.services[i];
        let relocated = match group.pool {
            // A failure here plans everything again, where each service is isolated.
            Pool::Parvagpu => match guarded(|| parvagpu::replan_service(plan, &pool, demand, &cfg)) {
                Ok(p) => Some(p),
                Err(_) => return NotApplicable(Some(members)),
            },
            // `None`: the previous plan does not read back; the group is planned again.
            Pool::Igniter => {
                guarded(|| igniter::replan_service(plan, &pool, &demand.name, &igniter::IgniterConfig::default())).ok().flatten()
            }
            Pool::ExactMig | Pool::Paris => None,
        };
        match relocated {
            Some(p) => {
                plans.insert(group.clone(), p);
            }
            None => {
                // No minimal re-planning in this strategy: its group is planned again (once
                // for all its changed services), and only its group's services can move.
                plans.insert(group.clone(), plan_isolated(input, group.pool, services));
                replanned.push(group);
            }
        }
    }
    Planned(members, plans)
}

/// Each ParvaGPU group's plan repacked in small steps (`parvagpu::compact`: its sparsest
/// GPUs emptied into the others' free slots); the other groups' plans as they are.
fn compact(input: &PlanningInput, members: &Members, plans: &BTreeMap<Group, Plan>) -> BTreeMap<Group, Plan> {
    let cfg = parvagpu::ParvaConfig::default();
    plans
        .iter()
        .map(|(group, plan)| {
            let compacted = match (group.pool, members.get(group)) {
                (Pool::Parvagpu, Some(services)) => {
                    guarded(|| parvagpu::compact(plan, &pool_input(input, group.pool, services), &cfg)).unwrap_or_else(|_| plan.clone())
                }
                _ => plan.clone(),
            };
            (group.clone(), compacted)
        })
        .collect()
}

/// Whether a pool's strategy re-plans one service into its previous plan.
fn relocates(pool: Pool) -> bool {
    matches!(pool, Pool::Parvagpu | Pool::Igniter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::FleetGpu;
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

    /// From `memory`, weighing a full plan as well (the provisioner's periodic pass).
    fn consolidating(memory: &PoolPlans) -> Option<Previous<'_>> {
        Some(Previous { plans: memory, consolidate: true })
    }

    /// From `memory`, without weighing a full plan (a pass a change woke).
    fn minimal(memory: &PoolPlans) -> Option<Previous<'_>> {
        Some(Previous { plans: memory, consolidate: false })
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
            plan_pools_from(&input(&raised), &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false).unwrap();
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

    /// The services with a workload that starts or stops between `before` and `after`, by
    /// the agents' rule (`provision::kept`), slot by slot (slots are the GPUs' identities
    /// across minimal re-plans).
    fn restarted(before: &Plan, after: &Plan) -> BTreeSet<String> {
        let by_slot = |p: &Plan| p.gpus.iter().map(|g| (g.slot, super::super::assign::planned_assignment(g))).collect::<BTreeMap<_, _>>();
        let (a, b) = (by_slot(before), by_slot(after));
        let slots: BTreeSet<&u32> = a.keys().chain(b.keys()).collect();
        slots.into_iter().flat_map(|s| super::super::kept::restarted_services(a.get(s), b.get(s))).map(str::to_string).collect()
    }

    #[test]
    fn a_rate_change_in_the_igniter_pool_moves_that_service_alone() {
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
            plan_pools_from(&two_pools(&raised), &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false)
                .unwrap();
        assert!(next.incremental, "one rate in the iGniter pool is not a reason to plan everything");
        assert_eq!(on(&after, "A100-80GB"), on(&before, "A100-80GB"), "the MIG pool keeps its plan");
        let capacity = |p: &Plan, s: &str| p.predictions.iter().find(|x| x.service == s).map_or(0.0, |x| x.capacity_rps);
        assert!(capacity(&after, "small1") >= 36.0);
        assert_eq!(restarted(&before, &after), BTreeSet::from(["small1".to_string()]));
    }

    /// The fleet's physical GPUs with what each runs, from `gpus` (in (node, uuid) order).
    fn running_on(gpus: &imbl::Vector<crate::resources::GpuAssignment>) -> BTreeMap<String, crate::resources::GpuAssignment> {
        gpus.iter().map(|g| (g.gpu_uuid.clone(), g.clone())).collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// Issue 59: a change re-planned minimally restarts only the services that changed.
        /// Every other service keeps every process where it runs, on both pools, with the
        /// shares the tuner gave it since the last placement (the agents' rule,
        /// `kept::restarted_services`, on every physical GPU).
        #[test]
        fn an_incremental_re_plan_restarts_only_the_services_whose_demand_changed(
            rates in proptest::collection::vec(5.0f64..2000.0, 2..16),
            changes in proptest::collection::vec((0usize..64, 0.05f64..10.0), 1..6),
            tuned_gpus in proptest::collection::vec(0usize..64, 0..4),
        ) {
            use crate::provision::tuned::assign_over_tuned;
            use crate::resources::PlanSpec;
            let rules = ServiceRules::default();
            let before = two_pools(&rates);
            let (plan, memory) = plan_pools_from(&before, &rules, MigStrategy::Parvagpu, None, &|| false).unwrap();
            let mut after = before.clone();
            let mut changed = BTreeSet::new();
            for &(k, factor) in &changes {
                let s = &mut after.services[k % before.services.len()];
                s.request_rate = (s.request_rate * factor).max(1.0);
                changed.insert(s.name.clone());
            }
            let (next_plan, next) =
                plan_pools_from(&after, &rules, MigStrategy::Parvagpu, minimal(&memory), &|| false).unwrap();
            proptest::prop_assert!(next.incremental);
            // Room for whatever either plan needs.
            let fleet: Vec<FleetGpu> = ["A100-80GB", "T4"]
                .iter()
                .flat_map(|&model| {
                    let n = [&plan, &next_plan].iter().map(|p| p.gpus.iter().filter(|g| g.gpu_type == model).count()).max().unwrap_or(0) + 8;
                    (0..n).map(move |i| FleetGpu { node: format!("{model}-{i:03}"), uuid: format!("{model}/{i}"), model: model.into(), autoscaled: false })
                })
                .collect();
            let (placed, unplaced, _) = assign_over_tuned(&plan, &fleet, None, None);
            proptest::prop_assert!(unplaced.is_empty());
            let as_planned = PlanSpec { gpus: placed.into(), ..PlanSpec::default() };
            // The tuner lowers a share here and there on the MPS-only GPUs.
            let mut committed = as_planned.clone();
            let mps: Vec<usize> = (0..committed.gpus.len()).filter(|&i| committed.gpus[i].mig_layout.is_empty()).collect();
            for k in tuned_gpus.iter().filter(|_| !mps.is_empty()).map(|k| mps[k % mps.len()]) {
                let mut g = committed.gpus[k].clone();
                if let Some(w) = g.workloads.first_mut().filter(|w| w.mps_percent >= 2.0) {
                    w.mps_percent -= 1.0;
                }
                committed.gpus.set(k, g);
            }
            let (gpus, unplaced, tuned) = assign_over_tuned(&next_plan, &fleet, Some(&committed), Some(&as_planned));
            proptest::prop_assert!(unplaced.is_empty());
            let mut gpus: imbl::Vector<_> = gpus.into();
            tuned.keep_tuned(&mut gpus);
            let (was, now) = (running_on(&committed.gpus), running_on(&gpus));
            let restarted: BTreeSet<String> = fleet
                .iter()
                .flat_map(|f| super::super::kept::restarted_services(was.get(&f.uuid), now.get(&f.uuid)))
                .map(str::to_string)
                .collect();
            proptest::prop_assert!(restarted.is_subset(&changed), "restarted {:?}, changed {:?}", restarted, changed);
        }
    }

    #[test]
    fn a_service_that_changes_pool_moves_alone() {
        let rates = [20.0, 30.0, 25.0, 15.0];
        let (before, memory) =
            plan_pools_from(&two_pools(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        let mut raised = rates;
        // Far more than T4s serve cheaply: small1 goes to the A100s.
        raised[1] = 3000.0;
        let inp = two_pools(&raised);
        let (after, next) =
            plan_pools_from(&inp, &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false).unwrap();
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
        assert!(after.predictions.iter().find(|p| p.service == "small1").unwrap().capacity_rps >= 3000.0);
        // It left the T4s and joined the A100s. Nothing else starts or stops but on the GPUs
        // it joined, which ParvaGPU's segment optimization may repack (Sec. III-F). Slots are
        // renumbered when the pools' plans merge: compare each pool's own plan.
        for (group, plan) in &next.plans {
            if let Some(was) = memory.plans.get(group) {
                let neighbours: BTreeSet<String> = plan
                    .gpus
                    .iter()
                    .filter(|g| g.workloads.iter().any(|w| w.service == "small1"))
                    .flat_map(|g| g.workloads.iter().map(|w| w.service.clone()))
                    .collect();
                let moved = restarted(was, plan);
                assert!(moved.is_subset(&neighbours) || moved.iter().all(|s| s == "small1"), "{group:?}: {moved:?}");
            }
        }
        assert!(restarted(&before, &after).contains("small1"));
    }

    #[test]
    fn a_full_plan_is_taken_when_it_saves_enough() {
        let rates: Vec<f64> = (0..12).map(|i| 2000.0 + 300.0 * f64::from(i)).collect();
        let (_, memory) = plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        let cost = |p: &Plan| p.cost_per_hour(&input(&rates).gpu_types);
        let mut consolidated = 0;
        for fall in [0.9, 0.5, 0.2] {
            let fallen: Vec<f64> = rates.iter().map(|r| r * fall).collect();
            let inp = input(&fallen);
            let (taken, next) =
                plan_pools_from(&inp, &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false).unwrap();
            let full = super::super::plan_pools(&inp, &ServiceRules::default(), MigStrategy::Parvagpu);
            assert!(
                cost(&taken) <= cost(&full) / (1.0 - CONSOLIDATION_SAVING) + 1e-9,
                "rates x{fall}: {} per hour taken, {} in full (incremental: {})",
                cost(&taken),
                cost(&full),
                next.incremental
            );
            if !next.incremental {
                assert_eq!(taken, full);
                consolidated += 1;
            }
        }
        assert!(consolidated > 0, "rates that fall to a fifth leave a plan worth repacking");
    }

    #[test]
    fn a_pass_that_does_not_consolidate_owes_it_to_one_that_does() {
        let rates: Vec<f64> = (0..12).map(|i| 2000.0 + 300.0 * f64::from(i)).collect();
        let rules = ServiceRules::default();
        let plan =
            |inp: &PlanningInput, from: Option<Previous>| plan_pools_from(inp, &rules, MigStrategy::Parvagpu, from, &|| false).unwrap();
        let (_, memory) = plan(&input(&rates), None);
        assert!(!memory.owes_consolidation(), "a full plan owes nothing");
        // Rates fall to a fifth: planning everything again would save far more than the bar.
        let types = input(&rates).gpu_types;
        let cost = |p: &Plan| p.cost_per_hour(&types);
        let inp = input(&rates.iter().map(|r| r * 0.2).collect::<Vec<_>>());
        let full = super::super::plan_pools(&inp, &rules, MigStrategy::Parvagpu);

        let (changed, owing) = plan(&inp, minimal(&memory));
        assert!(owing.incremental && owing.owes_consolidation(), "the change is re-planned minimally and the check left owed");
        assert!(cost(&full) < cost(&changed) * (1.0 - CONSOLIDATION_SAVING), "{} in full, {} minimally", cost(&full), cost(&changed));
        // Another pass that does not consolidate (nothing changed): the same plan, still owing.
        let (again, still) = plan(&inp, minimal(&owing));
        assert_eq!(again, changed);
        assert!(still.incremental && still.owes_consolidation());
        // The periodic pass, on the same inputs: the full plan, and nothing owed after it.
        let (consolidated, paid) = plan(&inp, consolidating(&still));
        assert!(!paid.incremental && !paid.owes_consolidation());
        assert_eq!(consolidated, full);

        // When the full plan does not save enough, the consolidating pass keeps the plan.
        let (_, memory) = plan(&input(&rates), None);
        let mut raised = rates.clone();
        raised[3] *= 1.25;
        let inp = input(&raised);
        let (changed, owing) = plan(&inp, minimal(&memory));
        assert!(owing.owes_consolidation());
        let full = super::super::plan_pools(&inp, &rules, MigStrategy::Parvagpu);
        assert!(cost(&full) >= cost(&changed) * (1.0 - CONSOLIDATION_SAVING), "one service +25% is not worth a repack here");
        let (kept, paid) = plan(&inp, consolidating(&owing));
        assert!(paid.incremental && !paid.owes_consolidation());
        assert_eq!(kept, changed, "weighed and kept: nothing moves");
    }

    #[test]
    fn a_consolidation_whose_saving_does_not_pay_for_its_restarts_is_not_made() {
        let rates: Vec<f64> = (0..12).map(|i| 2000.0 + 300.0 * f64::from(i)).collect();
        let plan = |inp: &PlanningInput, rules: &ServiceRules, from: Option<Previous>| {
            plan_pools_from(inp, rules, MigStrategy::Parvagpu, from, &|| false).unwrap()
        };
        let quick = ServiceRules::default();
        let (_, memory) = plan(&input(&rates), &quick, None);
        // Rates fall to a fifth: a repack saves GPUs at the default cold start (10 s) ...
        let inp = input(&rates.iter().map(|r| r * 0.2).collect::<Vec<_>>());
        let (repacked_not, owing) = plan(&inp, &quick, minimal(&memory));
        let (_, paid) = plan(&inp, &quick, consolidating(&owing));
        assert!(!paid.incremental, "worth repacking when restarts are quick");
        let full = super::super::plan_pools(&inp, &quick, MigStrategy::Parvagpu);
        let types = &inp.gpu_types;
        let saving = repacked_not.cost_per_hour(types) - full.cost_per_hour(types);
        // ... but not when each restart takes an hour: the saving over the horizon pays for
        // a fraction of one restart.
        let slow = ServiceRules { restart_s: inp.services.iter().map(|s| (s.name.clone(), 3600.0)).collect(), ..Default::default() };
        let (_, memory) = plan(&input(&rates), &slow, None);
        let (kept_minimal, owing) = plan(&inp, &slow, minimal(&memory));
        let restarts = restart_process_seconds(&kept_minimal, &full, &|_| 3600.0);
        assert!(saving * CONSOLIDATION_HORIZON_H < restarts * restart_price_per_s(&inp), "{saving} per hour against {restarts} s");
        let (kept, weighed) = plan(&inp, &slow, consolidating(&owing));
        assert!(weighed.incremental && !weighed.owes_consolidation(), "weighed, and not worth it");
        assert_eq!(kept, kept_minimal, "nothing moves");
    }

    #[test]
    fn other_restart_seconds_keep_a_pass_incremental() {
        let rates: Vec<f64> = (0..12).map(|i| 2000.0 + 300.0 * f64::from(i)).collect();
        let (_, memory) = plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        // s03 moved to a runtime that starts in 60 s: nothing to plan again.
        let moved = ServiceRules { restart_s: [("s03".to_string(), 60.0)].into(), ..Default::default() };
        let (_, next) = plan_pools_from(&input(&rates), &moved, MigStrategy::Parvagpu, minimal(&memory), &|| false).unwrap();
        assert!(next.incremental);
    }

    #[test]
    fn anything_but_a_few_rates_plans_everything_again() {
        let rates: Vec<f64> = (0..MAX_INCREMENTAL_CHANGES + 1).map(|i| 2000.0 + 100.0 * (i % 12) as f64).collect();
        let (_, memory) = plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap();
        let all_up: Vec<f64> = rates.iter().map(|r| r * 1.1).collect();
        assert!(
            !plan_pools_from(&input(&all_up), &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false)
                .unwrap()
                .1
                .incremental
        );
        let mut more = rates.clone();
        more.push(500.0);
        assert!(
            !plan_pools_from(&input(&more), &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false)
                .unwrap()
                .1
                .incremental
        );
        assert!(
            !plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::ExactMig, consolidating(&memory), &|| false)
                .unwrap()
                .1
                .incremental
        );
        let (same, again) =
            plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, consolidating(&memory), &|| false).unwrap();
        assert!(again.incremental);
        assert_eq!(same, plan_pools_from(&input(&rates), &ServiceRules::default(), MigStrategy::Parvagpu, None, &|| false).unwrap().0);
    }
}
