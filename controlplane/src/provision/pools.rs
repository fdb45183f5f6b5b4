//! Which strategy plans which service. The fleet has two kinds of GPU pool: MIG GPUs
//! (A100, H100), planned by ParvaGPU or the exact MIG planner, or by PARIS for services
//! that declare a batch-size distribution; and MPS-only GPUs with iGniter coefficients
//! (V100, T4), planned by iGniter. Each service goes to one pool, and within it to its
//! tenant's isolation domain (`planner::isolation`); each group is planned by its pool's
//! strategy on its own GPU types and its own GPUs, and the group plans are merged. Pure.

use std::collections::BTreeMap;

use planner::input::{GpuType, PlanningInput};
use planner::isolation::{domain_of, Boundaries, Domain};
use planner::plan::{Infeasible, InfeasibleReason, Plan};
use planner::strategy::{exact, igniter, paris, parvagpu};
use serde::Serialize;

use super::quota::Quota;
use super::MigStrategy;
use crate::resources::Strategy;

/// What the pools follow per service besides its demand: the strategy its Service names
/// (`spec.strategy`), its tenant's isolation boundary, and for the tenants' quotas
/// (`quota`) each limited tenant's quota and each service's admission order and priority.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServiceRules {
    pub strategies: BTreeMap<String, Strategy>,
    pub boundaries: Boundaries,
    /// Per tenant with a quota.
    pub quotas: BTreeMap<String, Quota>,
    /// Per service, the revision that created it: under a quota the oldest are kept first.
    pub admitted: BTreeMap<String, u64>,
    /// Per service with one above 0, its `priority`: kept before older services.
    pub priorities: BTreeMap<String, u32>,
    /// Per tenant, its weight in the fair share of a fleet that cannot grow (default 1).
    pub weights: BTreeMap<String, f64>,
    /// Per service with a ServingRuntime, the seconds one of its processes takes from launch
    /// to ready (the runtime's `cold_start_s`): what restarting it costs
    /// (`replan::DEFAULT_RESTART_S` for the others). It weighs a consolidation only, so it
    /// is neither in the inputs' digest nor compared by [`ServiceRules::plans_as`].
    #[serde(skip)]
    pub restart_s: BTreeMap<String, f64>,
}

impl ServiceRules {
    /// Whether `other` plans every service as these rules do: all but the restart seconds
    /// (a Service moved to another runtime is no reason to plan the fleet again).
    pub fn plans_as(&self, other: &ServiceRules) -> bool {
        let ServiceRules { strategies, boundaries, quotas, admitted, priorities, weights, restart_s: _ } = self;
        *strategies == other.strategies
            && *boundaries == other.boundaries
            && *quotas == other.quotas
            && *admitted == other.admitted
            && *priorities == other.priorities
            && *weights == other.weights
    }

    /// Where service `name` stands among its tenant's when a quota or a fair share holds
    /// only some: higher priority first, then admitted earlier, then by name (sort
    /// ascending).
    pub fn keep_order<'a>(&self, name: &'a str) -> (std::cmp::Reverse<u32>, u64, &'a str) {
        let priority = self.priorities.get(name).copied().unwrap_or(0);
        (std::cmp::Reverse(priority), self.admitted.get(name).copied().unwrap_or(u64::MAX), name)
    }
}

/// A group of services planned together by one strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pool {
    Parvagpu,
    ExactMig,
    Paris,
    Igniter,
}

impl Pool {
    fn of(strategy: Strategy) -> Pool {
        match strategy {
            Strategy::Parvagpu => Pool::Parvagpu,
            Strategy::ExactMig => Pool::ExactMig,
            Strategy::Paris => Pool::Paris,
            Strategy::Igniter => Pool::Igniter,
        }
    }

    fn default_mig(strategy: MigStrategy) -> Pool {
        match strategy {
            MigStrategy::Parvagpu => Pool::Parvagpu,
            MigStrategy::ExactMig => Pool::ExactMig,
        }
    }

    /// Whether this pool's strategy may put several services under one MPS server (iGniter
    /// shares an MPS-only GPU's server; the MIG strategies give each MIG instance one
    /// service, `tests::isolation` checks it).
    fn shares_mps_servers(self) -> bool {
        self == Pool::Igniter
    }

    /// The GPU types this pool's strategy plans on.
    fn serves(self, t: &GpuType) -> bool {
        match self {
            Pool::Parvagpu | Pool::ExactMig | Pool::Paris => t.mig(),
            Pool::Igniter => !t.mig() && t.mps && t.igniter.is_some(),
        }
    }

    fn plan(self, input: &PlanningInput) -> Plan {
        match self {
            Pool::Parvagpu => parvagpu::plan(input, &parvagpu::ParvaConfig::default()),
            Pool::ExactMig => exact::plan(input, &exact::ExactConfig::default()).0,
            // Services in this pool declared their distribution; the default only matters for
            // an explicit `strategy: paris` without one (PARIS Sec. V's log-normal over 1-32;
            // the paper gives no µ, σ: ours put the median at batch 2).
            Pool::Paris => paris::plan(input, &paris::ParisConfig::lognormal(2f64.ln(), 0.8, 32)),
            Pool::Igniter => igniter::plan(input, &igniter::IgniterConfig::default()),
        }
    }
}

/// The input restricted to one pool: its GPU types and the given services.
pub(super) fn pool_input(input: &PlanningInput, pool: Pool, services: &[usize]) -> PlanningInput {
    PlanningInput {
        gpu_types: input.gpu_types.iter().filter(|t| pool.serves(t)).cloned().collect(),
        services: services.iter().map(|&i| input.services[i].clone()).collect(),
        profiles: input.profiles.clone(),
    }
}

/// What a plan occupies, priced: the MIG instances' share of each GPU (GPCs / 7), or the MPS
/// shares with the shadows' reserve. Used to compare pools for one service, where whole-GPU
/// counts would favour neither fairly.
fn occupied_cost(plan: &Plan, types: &[GpuType]) -> f64 {
    super::quota::usage_by_service(plan, types).values().map(|u| u.cost_per_hour).sum()
}

/// The pool of service `i`: its override; else PARIS when it declared a batch-size
/// distribution and PARIS's utilisation curves exist for it; else the MIG pool or iGniter,
/// whichever occupies less cost for it alone (MIG on a tie; a service neither can plan goes
/// to the MIG pool, whose strategy then reports why).
fn choose(input: &PlanningInput, i: usize, rules: &ServiceRules, mig: Pool) -> Pool {
    let s = &input.services[i];
    if let Some(&o) = rules.strategies.get(&s.name) {
        return Pool::of(o);
    }
    let mig_types = input.gpu_types.iter().filter(|t| mig.serves(t));
    if input.profiles.batch_distributions.contains_key(&s.name)
        && mig_types.clone().any(|t| input.profiles.utilisation_curve(&t.name, &s.model).is_some())
    {
        return Pool::Paris;
    }
    let on_mig = mig_types.clone().any(|t| input.profiles.table(&t.name, &s.model).is_some());
    let on_mps = input.gpu_types.iter().any(|t| Pool::Igniter.serves(t) && input.profiles.coeffs(&t.name, &s.model).is_some());
    match (on_mig, on_mps) {
        (_, false) => mig,
        (false, true) => Pool::Igniter,
        (true, true) => {
            let cost = |pool: Pool| {
                let alone = pool_input(input, pool, &[i]);
                match guarded(|| pool.plan(&alone)) {
                    Ok(plan) if plan.infeasible.is_empty() => occupied_cost(&plan, &alone.gpu_types),
                    _ => f64::INFINITY,
                }
            };
            if cost(Pool::Igniter) < cost(mig) {
                Pool::Igniter
            } else {
                mig
            }
        }
    }
}

/// The services of one pool in one isolation domain: planned together, on GPUs no other
/// group uses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Group {
    pub pool: Pool,
    pub domain: Domain,
}

/// Services per group, as indices into the planning input's services.
pub(super) type Members = BTreeMap<Group, Vec<usize>>;

/// The group of every service: its pool, then its domain there.
pub(super) fn members(input: &PlanningInput, rules: &ServiceRules, mig_strategy: MigStrategy) -> Members {
    let mig = Pool::default_mig(mig_strategy);
    let mut members: Members = BTreeMap::new();
    for (i, s) in input.services.iter().enumerate() {
        let pool = choose(input, i, rules, mig);
        let domain = domain_of(&rules.boundaries, &s.name, pool.shares_mps_servers());
        members.entry(Group { pool, domain }).or_default().push(i);
    }
    members
}

/// Each group planned by its pool's strategy, alone; `None` when `stop` says so before one.
pub(super) fn plan_each_pool(input: &PlanningInput, members: &Members, stop: &dyn Fn() -> bool) -> Option<BTreeMap<Group, Plan>> {
    members.iter().map(|(group, services)| (!stop()).then(|| (group.clone(), plan_isolated(input, group.pool, services)))).collect()
}

/// Plans every service in its group and merges the group plans (GPU slots renumbered, the
/// strategy named after the pools that plan something, e.g. `parvagpu+igniter`).
pub fn plan_pools(input: &PlanningInput, rules: &ServiceRules, mig_strategy: MigStrategy) -> Plan {
    let pools = plan_each_pool(input, &members(input, rules, mig_strategy), &|| false).expect("never stopped");
    merge(input, pools, mig_strategy)
}

/// The group plans as one plan, every service of `input` placed or refused.
pub(super) fn merge(input: &PlanningInput, pools: BTreeMap<Group, Plan>, mig_strategy: MigStrategy) -> Plan {
    let mut merged = Plan { strategy: String::new(), gpus: Vec::new(), predictions: Vec::new(), infeasible: Vec::new() };
    let mut names: Vec<String> = Vec::new();
    for plan in pools.into_values() {
        if !names.contains(&plan.strategy) {
            names.push(plan.strategy.clone());
        }
        for mut g in plan.gpus {
            g.slot = merged.gpus.len() as u32;
            merged.gpus.push(g);
        }
        merged.predictions.extend(plan.predictions);
        merged.infeasible.extend(plan.infeasible);
    }
    // A strategy must place or refuse every service it was given; one it lost is named here
    // rather than left out of the plan without a word.
    let accounted: std::collections::BTreeSet<&str> =
        merged.predictions.iter().map(|p| p.service.as_str()).chain(merged.infeasible.iter().map(|i| i.service.as_str())).collect();
    let lost: Vec<Infeasible> = input
        .services
        .iter()
        .filter(|s| !accounted.contains(s.name.as_str()))
        .map(|s| Infeasible {
            service: s.name.clone(),
            reason: InfeasibleReason::PlannerFailure { detail: "the strategy returned neither a placement nor a reason".into() },
        })
        .collect();
    merged.infeasible.extend(lost);
    merged.strategy = if names.is_empty() { mig_strategy_name(mig_strategy) } else { names.join("+") };
    merged
}

/// Runs a strategy, turning a panic into its message. The strategies guard their own
/// arithmetic and allocations (see `planner::bounds`); this is the last line, so that a
/// defect one service's input reaches refuses that service instead of every plan.
pub(super) fn guarded<T>(plan: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(plan)).map_err(crate::loops::panic_message)
}

/// Plans the services of one pool together. Should the strategy fail, each service is
/// planned alone to find the ones it fails on; those are refused with the failure named and
/// the others are planned together again.
pub(super) fn plan_isolated(input: &PlanningInput, pool: Pool, services: &[usize]) -> Plan {
    let failure = match guarded(|| pool.plan(&pool_input(input, pool, services))) {
        Ok(plan) => return plan,
        Err(failure) => failure,
    };
    tracing::error!(?pool, services = services.len(), %failure, "a planning strategy failed; finding the services it fails on");
    let mut healthy = Vec::new();
    let mut refused = Vec::new();
    for &i in services {
        match guarded(|| pool.plan(&pool_input(input, pool, &[i]))) {
            Ok(_) => healthy.push(i),
            Err(detail) => {
                refused.push(Infeasible { service: input.services[i].name.clone(), reason: InfeasibleReason::PlannerFailure { detail } })
            }
        }
    }
    let empty = || Plan { strategy: String::new(), gpus: Vec::new(), predictions: Vec::new(), infeasible: Vec::new() };
    let mut plan = if healthy.is_empty() {
        empty()
    } else {
        // Together they may still fail where each alone did not: refuse them all then.
        guarded(|| pool.plan(&pool_input(input, pool, &healthy))).unwrap_or_else(|detail| {
            let mut plan = empty();
            plan.infeasible = healthy
                .iter()
                .map(|&i| Infeasible {
                    service: input.services[i].name.clone(),
                    reason: InfeasibleReason::PlannerFailure { detail: detail.clone() },
                })
                .collect();
            plan
        })
    };
    plan.infeasible.extend(refused);
    plan
}

fn mig_strategy_name(s: MigStrategy) -> String {
    match s {
        MigStrategy::Parvagpu => "parvagpu".into(),
        MigStrategy::ExactMig => "exact".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::input::{Profiles, ServiceDemand};
    use planner::mig::GpuModel;
    use planner::perf::synthetic::example_models;

    fn mps_type(name: &str, price: f64) -> GpuType {
        GpuType {
            name: name.into(),
            model: GpuModel::NoMig,
            price_per_hour: price,
            mps: true,
            igniter: Some(planner::perf::synthetic::igniter_hardware()),
        }
    }

    /// A100s with ParvaGPU tables for every example model; T4s with iGniter coefficients
    /// for resnet50 only.
    fn input(services: Vec<ServiceDemand>) -> PlanningInput {
        let mut profiles = Profiles::default();
        for m in example_models() {
            profiles.tables.entry("A100-80GB".into()).or_default().insert(m.name.clone(), m.table(3));
        }
        let resnet = example_models().into_iter().find(|m| m.name == "resnet50").unwrap();
        profiles
            .igniter
            .entry("T4".into())
            .or_default()
            .insert("resnet50".into(), planner::perf::synthetic::igniter_workload(&resnet, 0.25));
        PlanningInput {
            gpu_types: vec![
                GpuType { name: "A100-80GB".into(), model: GpuModel::A100_80GB, price_per_hour: 4.0, mps: true, igniter: None },
                mps_type("T4", 0.5),
            ],
            services,
            profiles,
        }
    }

    fn service(name: &str, model: &str, slo_ms: f64, rate: f64) -> ServiceDemand {
        ServiceDemand { name: name.into(), model: model.into(), slo_ms, request_rate: rate }
    }

    #[test]
    fn a_small_service_goes_to_the_cheap_mps_pool_and_a_model_without_coefficients_to_mig() {
        let inp = input(vec![service("small", "resnet50", 200.0, 20.0), service("bert", "bert-base", 200.0, 100.0)]);
        let plan = plan_pools(&inp, &ServiceRules::default(), MigStrategy::Parvagpu);
        assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
        let types_of = |svc: &str| -> Vec<&str> {
            plan.gpus.iter().filter(|g| g.workloads.iter().any(|w| w.service == svc)).map(|g| g.gpu_type.as_str()).collect()
        };
        assert_eq!(types_of("small"), ["T4"]);
        assert_eq!(types_of("bert"), ["A100-80GB"]);
        assert_eq!(plan.strategy, "parvagpu+igniter");
        // Slots are unique after the merge.
        let slots: std::collections::BTreeSet<u32> = plan.gpus.iter().map(|g| g.slot).collect();
        assert_eq!(slots.len(), plan.gpus.len());
        assert_eq!(plan.predictions.len(), 2);
    }

    #[test]
    fn an_override_wins_over_the_cost_choice() {
        let inp = input(vec![service("small", "resnet50", 200.0, 20.0)]);
        let overrides = ServiceRules { strategies: BTreeMap::from([("small".to_string(), Strategy::ExactMig)]), ..ServiceRules::default() };
        let plan = plan_pools(&inp, &overrides, MigStrategy::Parvagpu);
        assert!(plan.gpus.iter().all(|g| g.gpu_type == "A100-80GB"));
        assert_eq!(plan.strategy, "exact");
    }

    #[test]
    fn a_forced_pool_without_data_reports_the_service_instead_of_dropping_it() {
        let inp = input(vec![service("bert", "bert-base", 200.0, 100.0)]);
        let overrides = ServiceRules { strategies: BTreeMap::from([("bert".to_string(), Strategy::Igniter)]), ..ServiceRules::default() };
        let plan = plan_pools(&inp, &overrides, MigStrategy::Parvagpu);
        assert!(plan.gpus.is_empty());
        assert_eq!(plan.infeasible.len(), 1);
        assert_eq!(plan.infeasible[0].service, "bert");
    }

    #[test]
    fn a_service_with_a_batch_distribution_and_utilisation_curves_is_planned_by_paris() {
        let mut inp = input(vec![service("queries", "resnet50", 200.0, 50.0), service("plain", "resnet50", 200.0, 50.0)]);
        let resnet = example_models().into_iter().find(|m| m.name == "resnet50").unwrap();
        // Utilisation rises with the batch until the instance is saturated (the knee).
        let curve: Vec<planner::input::UtilPoint> = [1u8, 2, 3, 4, 7]
            .iter()
            .flat_map(|&g| {
                let sat = resnet.saturation_batch_per_gpc;
                (0..6).map(move |k| {
                    let b = 1u32 << k;
                    planner::input::UtilPoint { gpcs: g, batch: b, utilisation: (f64::from(b) / (sat * f64::from(g))).min(1.0) }
                })
            })
            .collect();
        inp.profiles.utilisation.entry("A100-80GB".into()).or_default().insert("resnet50".into(), curve);
        inp.profiles
            .batch_distributions
            .insert("queries".into(), planner::input::BatchDistribution::LogNormal { mu: 1.0, sigma: 0.8, max_batch: 32 });
        let plan = plan_pools(&inp, &ServiceRules::default(), MigStrategy::Parvagpu);
        assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
        assert!(plan.strategy.split('+').any(|s| s == "paris"), "{}", plan.strategy);
        // The service without a distribution stays out of PARIS's pool.
        let paris_gpus: Vec<&planner::plan::GpuPlan> =
            plan.gpus.iter().filter(|g| g.workloads.iter().any(|w| w.service == "queries")).collect();
        assert!(paris_gpus.iter().all(|g| g.workloads.iter().all(|w| w.service == "queries")));
    }

    #[test]
    fn every_service_is_planned_or_refused_exactly_once() {
        let services: Vec<ServiceDemand> = (0..12)
            .map(|i| {
                let model = ["resnet50", "bert-base", "vgg19", "no-such-model"][i % 4];
                service(&format!("s{i}"), model, 100.0 + 20.0 * i as f64, 30.0 * (i as f64 + 1.0))
            })
            .collect();
        let inp = input(services.clone());
        let plan = plan_pools(&inp, &ServiceRules::default(), MigStrategy::Parvagpu);
        for s in &services {
            let planned = plan.predictions.iter().filter(|p| p.service == s.name).count();
            let refused = plan.infeasible.iter().filter(|f| f.service == s.name).count();
            assert_eq!(planned + refused, 1, "{}", s.name);
        }
        assert!(plan.infeasible.iter().any(|f| f.service == "s3"));
    }

    /// Tenant boundaries through the pools: every strategy's plan keeps them
    /// (`planner::isolation::check_isolation`), as a property over random multi-tenant inputs.
    mod isolation {
        use std::collections::BTreeMap;

        use planner::input::{GpuType, PlanningInput, Profiles, ServiceDemand};
        use planner::invariants::check_invariants;
        use planner::isolation::{check_isolation, Boundaries, Boundary, Isolation};
        use planner::mig::GpuModel;
        use planner::perf::synthetic::{example_models, igniter_hardware, igniter_workload};
        use proptest::prelude::*;

        use crate::provision::{plan_pools, MigStrategy, ServiceRules};
        use crate::resources::Strategy as PoolStrategy;

        /// A100s with ParvaGPU tables and T4s with iGniter coefficients for every example model.
        fn fleet(services: Vec<ServiceDemand>) -> PlanningInput {
            let mut profiles = Profiles::default();
            for m in example_models() {
                profiles.tables.entry("A100-80GB".into()).or_default().insert(m.name.clone(), m.table(3));
                profiles.igniter.entry("T4".into()).or_default().insert(m.name.clone(), igniter_workload(&m, 0.25));
            }
            PlanningInput {
                gpu_types: vec![
                    GpuType { name: "A100-80GB".into(), model: GpuModel::A100_80GB, price_per_hour: 4.0, mps: true, igniter: None },
                    GpuType {
                        name: "T4".into(),
                        model: GpuModel::NoMig,
                        price_per_hour: 0.5,
                        mps: true,
                        igniter: Some(igniter_hardware()),
                    },
                ],
                services,
                profiles,
            }
        }

        fn rules(boundaries: &[(&str, &str, Isolation)]) -> ServiceRules {
            let boundaries: Boundaries =
                boundaries.iter().map(|(s, t, i)| (s.to_string(), Boundary { tenant: t.to_string(), isolation: *i })).collect();
            ServiceRules { boundaries, ..ServiceRules::default() }
        }

        fn small(name: &str) -> ServiceDemand {
            ServiceDemand { name: name.into(), model: "resnet50".into(), slo_ms: 200.0, request_rate: 20.0 }
        }

        #[test]
        fn igniter_puts_two_tenants_under_one_mps_server_only_when_both_are_shared() {
            let input = fleet(vec![small("a"), small("b")]);
            let gpus_of = |rules: &ServiceRules| {
                let plan = plan_pools(&input, rules, MigStrategy::Parvagpu);
                assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
                assert!(plan.gpus.iter().all(|g| g.gpu_type == "T4"), "small services go to the cheap MPS pool");
                assert_eq!(check_isolation(&plan, &rules.boundaries), Ok(()));
                plan.gpus.len()
            };
            assert_eq!(gpus_of(&rules(&[("a", "t1", Isolation::Shared), ("b", "t2", Isolation::Shared)])), 1);
            assert_eq!(gpus_of(&rules(&[("a", "t1", Isolation::Shared), ("b", "t2", Isolation::Mig)])), 2);
            // One tenant's own services still share, whatever its isolation.
            assert_eq!(gpus_of(&rules(&[("a", "t1", Isolation::Mig), ("b", "t1", Isolation::Mig)])), 1);
            assert_eq!(gpus_of(&rules(&[("a", "t1", Isolation::Dedicated), ("b", "t1", Isolation::Dedicated)])), 1);
        }

        #[test]
        fn mig_tenants_share_a_mig_gpu_and_a_dedicated_tenant_gets_its_own() {
            // Two services that each take a small slice of an A100.
            let slice = |name: &str| ServiceDemand { name: name.into(), model: "resnet50".into(), slo_ms: 100.0, request_rate: 300.0 };
            let input = fleet(vec![slice("a"), slice("b")]);
            let pinned = |r: ServiceRules| ServiceRules {
                strategies: BTreeMap::from([("a".into(), PoolStrategy::Parvagpu), ("b".into(), PoolStrategy::Parvagpu)]),
                ..r
            };
            let mig = pinned(rules(&[("a", "t1", Isolation::Mig), ("b", "t2", Isolation::Mig)]));
            let plan = plan_pools(&input, &mig, MigStrategy::Parvagpu);
            assert_eq!(check_isolation(&plan, &mig.boundaries), Ok(()));
            assert_eq!(plan.gpus.len(), 1, "separate MIG instances of one GPU: {:?}", plan.gpus);
            let dedicated = pinned(rules(&[("a", "t1", Isolation::Dedicated), ("b", "t2", Isolation::Mig)]));
            let plan = plan_pools(&input, &dedicated, MigStrategy::Parvagpu);
            assert_eq!(check_isolation(&plan, &dedicated.boundaries), Ok(()));
            assert_eq!(plan.gpus.len(), 2);
        }

        /// Up to 10 services of up to 4 tenants: (model, SLO, rate, tenant, pinned to iGniter).
        fn demands() -> impl Strategy<Value = Vec<(usize, f64, f64, usize, bool)>> {
            let models = example_models().len();
            prop::collection::vec((0..models, 20.0f64..300.0, 1.0f64..3000.0, 0..4usize, any::<bool>()), 1..10)
        }

        fn isolation() -> impl Strategy<Value = Isolation> {
            prop_oneof![Just(Isolation::Shared), Just(Isolation::Mig), Just(Isolation::Dedicated)]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn no_plan_crosses_a_tenant_boundary(services in demands(), isolations in prop::array::uniform4(isolation())) {
                let models: Vec<String> = example_models().into_iter().map(|m| m.name).collect();
                let mut rules = ServiceRules::default();
                let mut demands = Vec::new();
                for (i, (m, slo_ms, request_rate, tenant, on_igniter)) in services.into_iter().enumerate() {
                    let name = format!("svc-{i}");
                    rules.boundaries.insert(name.clone(), Boundary { tenant: format!("tenant-{tenant}"), isolation: isolations[tenant] });
                    if on_igniter {
                        rules.strategies.insert(name.clone(), PoolStrategy::Igniter);
                    }
                    demands.push(ServiceDemand { name, model: models[m].clone(), slo_ms, request_rate });
                }
                let input = fleet(demands);
                let plan = plan_pools(&input, &rules, MigStrategy::Parvagpu);
                prop_assert_eq!(check_isolation(&plan, &rules.boundaries), Ok(()));
                prop_assert_eq!(check_invariants(&plan, &input), Ok(()));
            }
        }
    }
}
