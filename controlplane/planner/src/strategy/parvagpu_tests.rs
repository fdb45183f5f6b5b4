use super::*;
use crate::mig::GpuModel;
use crate::perf::synthetic::example_models;

fn a100() -> GpuType {
    GpuType { name: "a100".into(), model: GpuModel::A100_80GB, price_per_hour: 4.0, mps: true, igniter: None }
}

fn input(services: &[(&str, &str, f64, f64)]) -> PlanningInput {
    let mut input = PlanningInput { gpu_types: vec![a100()], ..Default::default() };
    let tables = example_models().into_iter().map(|m| (m.name.clone(), m.table(3))).collect();
    input.profiles.tables.insert("a100".into(), tables);
    input.services = services
        .iter()
        .map(|&(name, model, slo_ms, request_rate)| ServiceDemand { name: name.into(), model: model.into(), slo_ms, request_rate })
        .collect();
    input
}

fn instance_gpcs(g: &GpuPlan, w: &Workload) -> u8 {
    match &g.sharing {
        Sharing::Mig { instances } => instances[w.mig_instance.unwrap()].profile.compute(),
        Sharing::MpsOnly => panic!("ParvaGPU plans only MIG GPUs"),
    }
}

/// (GPU slot, start, GPCs, batch, processes) of every segment of `service`.
fn placements_of(plan: &Plan, service: &str) -> Vec<(u32, u8, u8, u32, u32)> {
    let mut out: Vec<_> = plan
        .gpus
        .iter()
        .flat_map(|g| {
            g.workloads.iter().filter(|w| w.service == service).map(move |w| {
                let Sharing::Mig { instances } = &g.sharing else { unreachable!() };
                let inst = instances[w.mig_instance.unwrap()];
                (g.slot, inst.start, inst.profile.compute(), w.batch_size, w.processes)
            })
        })
        .collect();
    out.sort_unstable();
    out
}

fn mixed() -> PlanningInput {
    input(&[
        ("vision-a", "resnet50", 40.0, 6000.0),
        ("vision-b", "inception", 60.0, 3000.0),
        ("edge", "mobilenet", 20.0, 9000.0),
        ("search", "bert-base", 80.0, 1500.0),
        ("archive", "vgg19", 100.0, 700.0),
    ])
}

#[test]
fn plan_serves_every_service_within_half_the_slo_on_valid_layouts() {
    let input = mixed();
    let cfg = ParvaConfig::default();
    let plan = plan(&input, &cfg);
    assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
    for s in &input.services {
        let p = plan.prediction(&s.name).unwrap();
        assert!(p.capacity_rps >= s.request_rate, "{}: {} < {}", s.name, p.capacity_rps, s.request_rate);
        assert!(p.latency_ms < cfg.budget_ms(s.slo_ms), "{}: {} ms", s.name, p.latency_ms);
    }
    for g in &plan.gpus {
        let Sharing::Mig { instances } = &g.sharing else { panic!("MIG expected") };
        crate::mig::validate(&instances.iter().map(MigInstance::placement).collect::<Vec<_>>()).unwrap();
        for w in &g.workloads {
            assert!(w.processes <= cfg.max_processes);
            assert!((w.mps_percent * f64::from(w.processes) - 100.0).abs() < 1e-9);
            assert!(instance_gpcs(g, w) > 0);
        }
    }
    // Slots are unique: the controller maps them to physical GPUs.
    let mut slots: Vec<u32> = plan.gpus.iter().map(|g| g.slot).collect();
    slots.dedup();
    assert_eq!(slots.len(), plan.gpus.len());
}

#[test]
fn allocation_optimization_fills_the_slots_that_relocation_leaves_free() {
    // Relocation gives every 3g its own GPU at slot 4; Optimization splits the GPUs with at
    // most 4 GPCs into 1g/2g segments and moves them into those GPUs' free slots 0-3.
    let input = mixed();
    let on = plan(&input, &ParvaConfig::default());
    let off = plan(&input, &ParvaConfig { optimize: false, ..ParvaConfig::default() });
    assert!(on.gpus_used() < off.gpus_used(), "optimised {} vs unoptimised {}", on.gpus_used(), off.gpus_used());
    for s in &input.services {
        assert!(on.prediction(&s.name).unwrap().capacity_rps >= s.request_rate, "{} lost capacity when split", s.name);
    }
    // The threshold matters: with 0 nothing is split.
    let none = plan(&input, &ParvaConfig { optimization_threshold_gpcs: 0, ..ParvaConfig::default() });
    assert_eq!(none.gpus_used(), off.gpus_used());
}

#[test]
fn changing_one_service_keeps_every_other_segment_where_it_was() {
    // Sec. III-F: only the changed service's segments are recomputed and relocated, and
    // Optimization runs only on the GPUs it occupied before or after. Every other GPU keeps
    // its instances (same slot, start, size, batch, processes).
    let input = mixed();
    let cfg = ParvaConfig::default();
    let before = plan(&input, &cfg);
    let total: usize = before.gpus.iter().map(|g| g.workloads.len()).sum();
    for (rate, slo) in [(9000.0, 40.0), (600.0, 40.0), (6000.0, 32.0)] {
        let changed = ServiceDemand { request_rate: rate, slo_ms: slo, ..input.services[0].clone() };
        let after = replan_service(&before, &input, &changed, &cfg);
        let touched: Vec<u32> =
            placements_of(&before, &changed.name).into_iter().chain(placements_of(&after, &changed.name)).map(|(slot, ..)| slot).collect();
        let mut moved = 0;
        for s in &input.services[1..] {
            let new = placements_of(&after, &s.name);
            for seg in placements_of(&before, &s.name) {
                if new.contains(&seg) {
                    continue;
                }
                moved += 1;
                assert!(touched.contains(&seg.0), "{}: {seg:?} moved off GPU {} that {} never used", s.name, seg.0, changed.name);
            }
            let cap = after.prediction(&s.name).unwrap().capacity_rps;
            assert!(cap >= s.request_rate, "{}: {cap}", s.name);
        }
        assert!(moved * 4 < total, "{moved} of {total} segments moved for one service's change");
        let p = after.prediction(&changed.name).unwrap_or_else(|| panic!("{rate} req/s, {slo} ms: {:?}", after.infeasible));
        assert!(p.capacity_rps >= rate && p.latency_ms < cfg.budget_ms(slo), "{p:?}");
    }
}

#[test]
fn infeasible_services_are_named_with_the_reason() {
    let mut input = mixed();
    input.services.push(ServiceDemand { name: "impossible".into(), model: "vgg19".into(), slo_ms: 1.0, request_rate: 10.0 });
    input.services.push(ServiceDemand { name: "unknown".into(), model: "gpt-9".into(), slo_ms: 100.0, request_rate: 10.0 });
    input.services.push(ServiceDemand { name: "zero".into(), model: "resnet50".into(), slo_ms: 100.0, request_rate: 0.0 });
    let plan = plan(&input, &ParvaConfig::default());
    let reason = |name: &str| plan.infeasible.iter().find(|f| f.service == name).map(|f| f.reason.clone());
    assert!(matches!(reason("impossible"), Some(InfeasibleReason::SloTooTight { .. })), "{plan:?}");
    assert_eq!(reason("unknown"), Some(InfeasibleReason::NoProfile { model: "gpt-9".into() }));
    assert!(matches!(reason("zero"), Some(InfeasibleReason::InvalidDemand { .. })));
    assert!(plan.prediction("vision-a").is_some(), "the others are still planned");
    let no_mig = PlanningInput { gpu_types: vec![GpuType { model: GpuModel::NoMig, ..a100() }], ..mixed() };
    let plan = super::plan(&no_mig, &ParvaConfig::default());
    assert_eq!(plan.infeasible.len(), no_mig.services.len());
    assert!(plan.infeasible.iter().all(|f| matches!(f.reason, InfeasibleReason::NoGpuType { .. })));
}
