//! The simulator's behaviour on small scenarios whose outcome is known: costs by hand, a
//! load step, a host failure, and determinism.

use std::collections::BTreeMap;

use fleetsim::report::{PolicyReport, Report};
use fleetsim::scenario::Scenario;
use fleetsim::serving::whole_gpu;
use fleetsim::traffic::Traffic;
use fleetsim::Options;

/// The demo fleet's GPU models, instance types and profiles, and one resnet50 service
/// (SLO 100 ms) that may run on A100s only.
fn one_service() -> Scenario {
    let mut resources: Vec<proto::Resource> = devcluster::demo::scenario::resources()
        .into_iter()
        .filter(|r| matches!(r.kind.as_str(), "GpuModel" | "InstanceType" | "ModelProfile"))
        .collect();
    resources.push(proto::Resource { kind: "Tenant".into(), name: "acme".into(), spec_json: "{}".into(), ..Default::default() });
    let spec = r#"{"model": "resnet50", "slo": {"latency_ms": 100, "request_rate": 100}, "allowed_gpu_models": ["A100-80GB"]}"#;
    resources.push(proto::Resource {
        kind: "Service".into(),
        name: "web".into(),
        tenant: "acme".into(),
        spec_json: spec.into(),
        ..Default::default()
    });
    Scenario::from_resources(&resources).unwrap()
}

fn traffic(rates: Vec<f64>) -> Traffic {
    Traffic { seconds: rates.len() as u32, rates: BTreeMap::from([("web".to_string(), rates)]) }
}

fn every_second() -> Options {
    Options { sample_every_s: 1, ..Options::default() }
}

fn policy<'a>(report: &'a Report, name: &str) -> &'a PolicyReport {
    report.policies.iter().find(|p| p.name == name).unwrap()
}

fn capacity_at(p: &PolicyReport, t: u32) -> f64 {
    p.samples[t as usize].capacity_rps
}

/// a100-1x: one A100 at 3.67 per hour, serving 120 s after its launch.
const A100_PRICE: f64 = 3.67;
const A100_LAUNCH_S: u32 = 120;

#[test]
fn at_constant_load_every_policy_costs_what_its_gpus_cost() {
    let scenario = one_service();
    // 3,000 req/s for an hour: each policy keeps its fleet all hour.
    let report = fleetsim::run(&scenario, &traffic(vec![3000.0; 3600]), &Options::default()).unwrap();
    // Whole GPUs for the peak at 80%: ceil(3750 / per-GPU capacity) single-A100 hosts.
    let (per_gpu, _) = whole_gpu("resnet50", "A100-80GB", 100.0).unwrap();
    let whole = (3000.0 / 0.8 / per_gpu).ceil();
    assert!((policy(&report, "whole-gpu-peak").cost - whole * A100_PRICE).abs() < 1e-6);
    // Homogeneous autoscaling starts with as many replicas (a100-1x is its type) and has no
    // reason to change.
    let homogeneous = policy(&report, "homogeneous-autoscale");
    assert!((homogeneous.cost - whole * A100_PRICE).abs() < 1e-6);
    assert_eq!((homogeneous.launches, homogeneous.reconfigurations), (0, 0));
    // The planner's GPUs for 3,750 req/s, each an hour at its price, for both planned
    // policies (gpuplane starts from the first second's rate, the same here).
    let parva = policy(&report, "parvagpu-peak");
    let gpus = parva.gpu_hours.round();
    assert!(gpus >= 1.0 && gpus <= whole, "{gpus} planned GPUs, {whole} whole ones");
    assert!((parva.cost - gpus * A100_PRICE).abs() < 1e-6, "{} for {gpus} GPUs", parva.cost);
    let ours = policy(&report, "gpuplane");
    assert!((ours.cost - parva.cost).abs() < 1e-6 && ours.launches == 0);
    for p in &report.policies {
        assert_eq!(p.windows, 3600, "{}", p.name);
    }
}

#[test]
fn a_load_step_is_met_by_launches_that_serve_after_their_launch_latency() {
    let scenario = one_service();
    let mut rates = vec![100.0; 600];
    rates.extend(vec![3000.0; 1800]);
    let report = fleetsim::run(&scenario, &traffic(rates), &every_second()).unwrap();
    let ours = policy(&report, "gpuplane");
    assert!(ours.launches >= 1, "the step needs more GPUs");
    // HetSev's window (60 s) passes before the service is sized up and the launch asked for:
    // nothing launched can serve before 600 + 60 + 120 s.
    let before = capacity_at(ours, 599);
    // The first re-plan comes after the window, and the changed workload serves in its new
    // configuration only once its process has started (`reconfigure_s`, 10 s): until then
    // the old configuration serves, whatever the plan says.
    for t in 600..(600 + 60 + 10) {
        assert_eq!(capacity_at(ours, t), before, "t={t}");
    }
    // A launched host serves once it is up and the node assignment has placed workloads on
    // it and their processes have started (`reconfigure_s`).
    let reconfigure_s = fleetsim::policies::GpuplaneSettings::default().reconfigure_s;
    for t in 600..(600 + 60 + A100_LAUNCH_S + reconfigure_s) {
        assert!(capacity_at(ours, t) < 3000.0, "t={t}: {} before any launch serves", capacity_at(ours, t));
    }
    // Then the launches serve, sized for the new load at 80%.
    let after = capacity_at(ours, 600 + 60 + A100_LAUNCH_S + reconfigure_s + 2 * 2);
    assert!(after >= 3000.0 / 0.8 * 0.95 && after > before, "{before} -> {after}");
    assert!(ours.windows_met < ours.windows, "the step costs some windows");
    // Each missed window is told apart by what the service went through: the window before
    // the raise serves as planned, then the plan waits for its launches.
    let m = ours.missed;
    assert_eq!(m.steady + m.switching + m.switching_broken + m.short_of_plan, ours.windows - ours.windows_met, "{m:?}");
    assert!(m.steady > 0 && m.short_of_plan > 0, "{m:?}");
    // Every reconfiguration is told apart: of the service resized, or of another, as hosts
    // came (the launches), or by the tuner (none: this service is on MIG).
    let r = ours.replanning.expect("gpuplane re-plans");
    assert!(r.replans >= 1 && r.of_resized >= 1, "{r:?}");
    assert_eq!(r.of_resized + r.of_others + r.of_fleet_changes + r.of_tuner, ours.reconfigurations, "{r:?}");
    assert_eq!(r.of_tuner, 0, "{r:?}");
    assert!(r.full_replans <= r.replans && r.of_others_in_full <= r.of_others, "{r:?}");
    assert!(report.policies.iter().filter(|p| p.name != "gpuplane").all(|p| p.replanning.is_none()));
}

#[test]
fn a_host_failure_dips_attainment_until_its_replacement_serves() {
    let mut scenario = one_service();
    scenario.failures_at_s = vec![600];
    let report = fleetsim::run(&scenario, &traffic(vec![3000.0; 1800]), &every_second()).unwrap();
    // A fleet of a few hosts; detection is the same below thousands (fleet::detection_s).
    let recovered = 600 + fleetsim::fleet::detection_s(4) + A100_LAUNCH_S;
    for p in &report.policies {
        // gpuplane's workloads move to the replacement once it registers (its next decision,
        // within 2 s) and serve there once started.
        let restarted = if p.name == "gpuplane" { 2 + fleetsim::policies::GpuplaneSettings::default().reconfigure_s } else { 0 };
        let (before, during, after) = (capacity_at(p, 599), capacity_at(p, 601), capacity_at(p, recovered + restarted + 1));
        assert!(during < before, "{}: {before} -> {during}", p.name);
        assert!((after - before).abs() < 1e-6 * before, "{}: back to {before}, got {after}", p.name);
        assert!(p.launches >= 1, "{}: the replacement", p.name);
    }
    // With whole GPUs sized at 80%, losing one of a few GPUs overloads the rest.
    let whole = policy(&report, "whole-gpu-peak");
    assert!(whole.windows_met < whole.windows);
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let scenario = Scenario::builtin(12, 3, 5).unwrap();
    let traffic = Traffic::generate(&scenario.shapes, 2 * 3600, 5);
    let options = Options { seed: 5, ..Options::default() };
    let strip = |mut r: Report| {
        r.wall_s = 0.0;
        r
    };
    let one = strip(fleetsim::run(&scenario, &traffic, &options).unwrap());
    assert_eq!(one, strip(fleetsim::run(&scenario, &traffic, &options).unwrap()));
    let other = Options { seed: 6, ..Options::default() };
    assert_ne!(one, strip(fleetsim::run(&scenario, &traffic, &other).unwrap()), "the noise follows the seed");
}

#[test]
fn gpuplane_sizes_down_after_the_cool_down_the_run_is_given() {
    let scenario = one_service();
    let mut rates = vec![3000.0; 300];
    // A load that keeps moving a little: its history holds a sample per second.
    rates.extend((0..1500).map(|i| 300.0 + f64::from(i % 2) * 10.0));
    let mut options = every_second();
    options.gpuplane.autoscale.cooldown_s = 600.0;
    let report = fleetsim::run(&scenario, &traffic(rates), &options).unwrap();
    let ours = policy(&report, "gpuplane");
    let high = capacity_at(ours, 299);
    // Not before the 600 s cool-down (HetSev's default would be 300 s)...
    assert_eq!(capacity_at(ours, 300 + 599), high);
    // ...and then, once the reconfiguration (10 s) has happened, sized for 300 req/s.
    let low = capacity_at(ours, 300 + 600 + 10 + 2);
    assert!(low < high / 2.0, "{high} -> {low}");
}
