//! Plan invariants of the MIG strategies as properties over random demands on the project's
//! synthetic profiles (see `perf::synthetic`).

use super::{exact, parvagpu};
use crate::input::{GpuType, PlanningInput, ServiceDemand};
use crate::invariants::check_invariants;
use crate::mig::GpuModel;
use crate::perf::synthetic::example_models;
use proptest::prelude::*;

fn fleet() -> PlanningInput {
    let mut input = PlanningInput {
        gpu_types: vec![
            GpuType { name: "a100".into(), model: GpuModel::A100_80GB, price_per_hour: 4.1, mps: true, igniter: None },
            GpuType { name: "h100".into(), model: GpuModel::H100_80GB, price_per_hour: 6.9, mps: true, igniter: None },
        ],
        ..Default::default()
    };
    let tables = example_models().into_iter().map(|m| (m.name.clone(), m.table(3))).collect();
    input.profiles.tables.insert("a100".into(), tables);
    input
}

fn demands() -> impl Strategy<Value = Vec<ServiceDemand>> {
    let models: Vec<String> = example_models().into_iter().map(|m| m.name).collect();
    prop::collection::vec((0..models.len(), 5.0f64..300.0, 1.0f64..8000.0), 1..9).prop_map(move |v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (m, slo_ms, request_rate))| ServiceDemand {
                name: format!("svc-{i}"),
                model: models[m].clone(),
                slo_ms,
                request_rate,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn parvagpu_and_exact_plans_keep_the_invariants(services in demands()) {
        let input = PlanningInput { services, ..fleet() };
        let heuristic = parvagpu::plan(&input, &parvagpu::ParvaConfig::default());
        prop_assert!(check_invariants(&heuristic, &input).is_ok(), "{:?}", check_invariants(&heuristic, &input));
        // A smaller search budget keeps the debug-build test quick; the invariants and the
        // never-worse guarantee hold whatever the budget.
        let cfg = exact::ExactConfig { node_budget: 100_000, joint_node_budget: 20_000, ..exact::ExactConfig::default() };
        let (exact, _) = exact::plan(&input, &cfg);
        prop_assert!(check_invariants(&exact, &input).is_ok(), "{:?}", check_invariants(&exact, &input));
        // Never worse than the heuristic, and the same services refused for the same reasons.
        prop_assert!((exact.gpus_used(), exact.gpcs_used()) <= (heuristic.gpus_used(), heuristic.gpcs_used()));
        prop_assert_eq!(exact.infeasible, heuristic.infeasible);
    }

    #[test]
    fn replanning_one_service_keeps_the_invariants(services in demands(), rate in 1.0f64..8000.0, slo in 5.0f64..300.0) {
        let input = PlanningInput { services, ..fleet() };
        let cfg = parvagpu::ParvaConfig::default();
        let before = parvagpu::plan(&input, &cfg);
        let changed = ServiceDemand { request_rate: rate, slo_ms: slo, ..input.services[0].clone() };
        let after = parvagpu::replan_service(&before, &input, &changed, &cfg);
        let mut changed_input = input.clone();
        changed_input.services[0] = changed;
        prop_assert!(check_invariants(&after, &changed_input).is_ok(), "{:?}", check_invariants(&after, &changed_input));
    }
}
