//! Tenant boundaries through the pools: every strategy's plan keeps them
//! (`planner::isolation::check_isolation`), as a property over random multi-tenant inputs.

use std::collections::BTreeMap;

use planner::input::{GpuType, PlanningInput, Profiles, ServiceDemand};
use planner::invariants::check_invariants;
use planner::isolation::{check_isolation, Boundaries, Boundary, Isolation};
use planner::mig::GpuModel;
use planner::perf::synthetic::{example_models, igniter_hardware, igniter_workload};
use proptest::prelude::*;

use super::{plan_pools, MigStrategy, ServiceRules};
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
            GpuType { name: "T4".into(), model: GpuModel::NoMig, price_per_hour: 0.5, mps: true, igniter: Some(igniter_hardware()) },
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
