//! Planning without a cluster (`gpuctl plan -f FILE`): the manifests are applied to an
//! in-memory state machine (the same validation and reference checks as the controllers),
//! then a strategy runs on it.

use super::{planning_input, MigStrategy};
use crate::api::spec_from_proto;
use crate::resources::validate_spec;
use crate::state::{ClusterState, Command, Request, WriteMode};
use planner::input::PlanningInput;
use planner::plan::Plan;
use planner::strategy::{exact, parvagpu};

/// The state the manifests describe, or the first refusal as one line.
pub fn state_from_resources(resources: &[proto::Resource]) -> Result<ClusterState, String> {
    let mut state = ClusterState::default();
    for (i, r) in resources.iter().enumerate() {
        let what = format!("{} {:?}", r.kind, r.name);
        let spec = spec_from_proto(r).map_err(|e| format!("{what}: {e}"))?;
        validate_spec(&spec).map_err(|e| format!("{what}: {e}"))?;
        let request = Request {
            request_id: format!("offline-{i}"),
            command: Command::Put { name: r.name.clone(), tenant: r.tenant.clone(), spec, mode: WriteMode::Upsert, expected_version: 0 },
        };
        state.check(&request).map_err(|e| format!("{what}: {e}"))?;
        let (result, _) = state.apply(i as u64 + 1, &request);
        result.map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(state)
}

/// Runs `strategy` on the state's services and GPU models (the fleet's nodes are not
/// needed: the plan says how many GPUs of each model it takes).
pub fn plan_offline(state: &ClusterState, strategy: MigStrategy) -> (Plan, PlanningInput) {
    let input = planning_input(state);
    let plan = match strategy {
        MigStrategy::Parvagpu => parvagpu::plan(&input, &parvagpu::ParvaConfig::default()),
        MigStrategy::ExactMig => exact::plan(&input, &exact::ExactConfig::default()).0,
    };
    (plan, input)
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

    #[test]
    fn a_dangling_reference_is_refused_with_the_resource() {
        let text = FLEET.replace("model: resnet50, slo", "model: vgg19, slo");
        let err = state_from_resources(&resources(&text)).unwrap_err();
        assert!(err.starts_with("Service \"web\"") && err.contains("vgg19"), "{err}");
    }
}
