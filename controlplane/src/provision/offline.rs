//! Planning without a cluster (`gpuctl plan -f FILE`): the manifests are applied to an
//! in-memory state machine (the same validation and reference checks as the controllers),
//! then a strategy runs on it.

use super::{planning_input, service_rules, MigStrategy};
use crate::api::spec_from_proto;
use crate::resources::limits::MAX_PLAN_GPUS;
use crate::resources::validate_spec;
use crate::state::{ClusterState, Command, Request, WriteMode};
use planner::input::PlanningInput;
use planner::plan::Plan;

/// The state the manifests describe, or the first refusal as one line.
pub fn state_from_resources(resources: &[proto::Resource]) -> Result<ClusterState, String> {
    let mut state = ClusterState::default();
    for (i, r) in resources.iter().enumerate() {
        put_resource(&mut state, i as u64 + 1, r)?;
    }
    Ok(state)
}

/// Puts `r` into `state` at `revision`, with the controllers' validation and reference
/// checks, or says why not in one line.
pub fn put_resource(state: &mut ClusterState, revision: u64, r: &proto::Resource) -> Result<(), String> {
    let what = format!("{} {:?}", r.kind, r.name);
    let spec = spec_from_proto(r).map_err(|e| format!("{what}: {e}"))?;
    validate_spec(&spec).map_err(|e| format!("{what}: {e}"))?;
    let request = Request {
        request_id: format!("offline-{revision}"),
        command: Command::Put { name: r.name.clone(), tenant: r.tenant.clone(), spec, mode: WriteMode::Upsert, expected_version: 0 },
        trace_parent: None,
    };
    state.check(&request).map_err(|e| format!("{what}: {e}"))?;
    let (result, _) = state.apply(revision, &request);
    result.map(|_| ()).map_err(|e| format!("{what}: {e}"))
}

/// Runs `strategy` on the state's services and GPU models (the fleet's nodes are not
/// needed: the plan says how many GPUs of each model it takes). `gpuctl plan` takes it
/// through [`plan_offline_bounded`].
pub fn plan_offline(state: &ClusterState, strategy: MigStrategy) -> (Plan, PlanningInput) {
    let input = planning_input(state);
    let plan = super::quota::plan_within_limits(&input, &service_rules(state), strategy, None, &|| false, None).expect("never stopped").0;
    (plan, input)
}

/// [`plan_offline`], refusing a plan the controllers would not write ([`check_plan_size`]).
pub fn plan_offline_bounded(state: &ClusterState, strategy: MigStrategy) -> Result<(Plan, PlanningInput), String> {
    let (plan, input) = plan_offline(state, strategy);
    check_plan_size(&plan)?;
    Ok((plan, input))
}

/// Refuses a plan of more GPUs than one Plan may hold ([`MAX_PLAN_GPUS`], the bound the
/// controllers check on every Plan and patch they write), before it is shown: offline, 300
/// services of ~2,000 GPUs each printed a 543,772-GPU plan.
pub fn check_plan_size(plan: &Plan) -> Result<(), String> {
    let gpus = plan.gpus.len();
    if gpus > MAX_PLAN_GPUS {
        return Err(format!(
            "the plan takes {gpus} GPUs, more than one Plan may hold (MAX_PLAN_GPUS = {MAX_PLAN_GPUS}): the controllers would not write it, so it is not shown"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLEET: &str = r#"
kind: GpuModel
name: A100-80GB
spec:
  sm_count: 108
  memory_gib: 80
  mig:
    compute_slices: 7
    memory_slices: 8
    profiles:
      - {name: 3g, compute_slices: 3, memory_slices: 4, starts: [0, 4]}
---
kind: InstanceType
name: a2
spec: {gpu_model: A100-80GB, gpu_count: 1, price_per_hour: 4, launch_latency_s: 60}
---
kind: ModelProfile
name: r50
spec:
  model: resnet50
  gpu_model: A100-80GB
  points:
    - {gpcs: 3, batch: 8, throughput_rps: 300, latency_ms: 10}
    - {gpcs: 7, batch: 8, throughput_rps: 650, latency_ms: 8}
---
kind: Tenant
name: acme
spec: {}
---
kind: Service
name: web
tenant: acme
spec: {model: resnet50, slo: {latency_ms: 100, request_rate: 500}}
"#;

    fn resources(text: &str) -> Vec<proto::Resource> {
        crate::manifest::parse("fleet.yaml", text, crate::manifest::Format::Yaml).unwrap()
    }

    #[test]
    fn a_manifest_plans_offline_with_its_cost() {
        let state = state_from_resources(&resources(FLEET)).unwrap();
        let (plan, input) = plan_offline(&state, MigStrategy::Parvagpu);
        assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
        assert!(plan.prediction("web").unwrap().capacity_rps >= 500.0);
        assert_eq!(plan.cost_per_hour(&input.gpu_types), 4.0 * plan.gpus_used() as f64);
    }

    fn resource(kind: &str, name: &str, tenant: &str, spec: serde_json::Value) -> proto::Resource {
        proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
    }

    /// The fleet above plus T4s that carry iGniter coefficients for resnet50.
    fn with_t4(services: Vec<proto::Resource>) -> Vec<proto::Resource> {
        let shape = planner::perf::synthetic::example_models().into_iter().find(|m| m.name == "resnet50").unwrap();
        let mut all = resources(FLEET);
        all.retain(|r| r.kind != "Service");
        all.push(resource(
            "GpuModel",
            "T4-16GB",
            "",
            serde_json::json!({"sm_count": 40, "memory_gib": 16, "idle_power_w": 10, "max_power_w": 70, "max_frequency_mhz": 1590,
                "pcie_gbps": 16, "igniter": {"alpha_f": 0.0, "alpha_sch": 0.0, "beta_sch": 0.0}}),
        ));
        all.push(resource(
            "InstanceType",
            "g4dn",
            "",
            serde_json::json!({"gpu_model": "T4-16GB", "gpu_count": 1, "price_per_hour": 0.5, "launch_latency_s": 60}),
        ));
        all.push(resource(
            "ModelProfile",
            "r50-t4",
            "",
            serde_json::json!({"model": "resnet50", "gpu_model": "T4-16GB",
                "igniter": planner::perf::synthetic::igniter_workload(&shape, 0.25)}),
        ));
        all.extend(services);
        all
    }

    #[test]
    fn an_mps_only_gpu_with_igniter_coefficients_is_planned_by_igniter() {
        let svc = |name: &str, rate: f64, allowed: &[&str]| {
            resource(
                "Service",
                name,
                "acme",
                serde_json::json!({"model": "resnet50", "slo": {"latency_ms": 400, "request_rate": rate}, "allowed_gpu_models": allowed}),
            )
        };
        let state =
            state_from_resources(&with_t4(vec![svc("pinned", 300.0, &["T4-16GB"]), svc("on-a100", 300.0, &["A100-80GB"])])).unwrap();
        let (plan, input) = plan_offline(&state, MigStrategy::Parvagpu);
        assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
        let t4 = input.gpu_types.iter().find(|t| t.name == "T4-16GB").unwrap();
        assert_eq!(t4.igniter.as_ref().map(|h| h.pcie_bytes_per_ms), Some(16e6), "GB/s become bytes per ms");
        for g in &plan.gpus {
            let services: Vec<&str> = g.workloads.iter().map(|w| w.service.as_str()).collect();
            match g.gpu_type.as_str() {
                "T4-16GB" => assert_eq!(services, ["pinned"]),
                _ => assert_eq!(services, ["on-a100"]),
            }
        }
        assert_eq!(plan.strategy, "parvagpu+igniter");
        // A restriction to a GPU model the cluster does not know is refused when applied.
        let state = state_from_resources(&with_t4(vec![svc("nowhere", 100.0, &["H100-80GB"])]));
        assert!(state.is_err(), "an unknown GPU model in allowed_gpu_models is refused at apply time");
    }

    #[test]
    fn a_hostile_manifest_is_refused_offline_as_the_controllers_refuse_it() {
        // `gpuctl plan -f` on this manifest aborted the process on a huge allocation.
        let mut all = resources(FLEET);
        all.push(resource(
            "Service",
            "bomb",
            "acme",
            serde_json::json!({"model": "resnet50", "slo": {"latency_ms": 100, "request_rate": 10}, "strategy": "paris",
                               "batch_distribution": {"type": "log-normal", "mu": 1.0, "sigma": 0.5, "max_batch": 4_000_000_000u32}}),
        ));
        let err = state_from_resources(&all).unwrap_err();
        assert!(err.contains("Service \"bomb\": spec.batch_distribution.max_batch: must be 1-1024 (got 4000000000)"), "{err}");
    }

    #[test]
    fn a_plan_larger_than_a_plan_may_hold_is_refused_not_shown() {
        let state = state_from_resources(&resources(FLEET)).unwrap();
        let (mut plan, _) = plan_offline_bounded(&state, MigStrategy::Parvagpu).unwrap();
        let gpu = plan.gpus[0].clone();
        plan.gpus = vec![gpu; MAX_PLAN_GPUS];
        assert_eq!(check_plan_size(&plan), Ok(()));
        plan.gpus.push(plan.gpus[0].clone());
        let err = check_plan_size(&plan).unwrap_err();
        assert_eq!(
            err,
            format!("the plan takes {} GPUs, more than one Plan may hold (MAX_PLAN_GPUS = {MAX_PLAN_GPUS}): the controllers would not write it, so it is not shown", MAX_PLAN_GPUS + 1)
        );
    }

    #[test]
    fn a_dangling_reference_is_refused_with_the_resource() {
        let text = FLEET.replace("model: resnet50, slo", "model: vgg19, slo");
        let err = state_from_resources(&resources(&text)).unwrap_err();
        assert!(err.starts_with("Service \"web\"") && err.contains("vgg19"), "{err}");
    }
}
