//! Projection of the committed Plans onto one node: the GPUs of that node and what runs on
//! them. Pure: the same applied state gives the same answer on every controller.

use crate::resources::{Kind, Spec, StoredResource};
use crate::state::ClusterState;

/// The desired state of `node`: every GPU assignment naming it, across all Plans, with each
/// workload's model and SLO taken from its Service. `version` is the index of the entry that
/// last changed this projection (`state::DesiredIndex`), so equal versions mean equal
/// content. O(the node's GPUs): read from the index, never by scanning a plan.
pub fn desired_state(cluster: &ClusterState, node: &str) -> proto::DesiredState {
    let index = cluster.desired();
    let mut gpus = Vec::new();
    // The trace of the write that committed the newest plan with work here, for the agent's
    // reconcile.
    let mut newest_plan = 0;
    let mut trace_parent = String::new();
    for (plan_name, g) in index.assignments(node) {
        if let Some(plan) = cluster.get(Kind::Plan, plan_name) {
            if let (true, Spec::Plan(spec)) = (plan.mod_revision > newest_plan, &plan.spec) {
                newest_plan = plan.mod_revision;
                trace_parent.clone_from(&spec.trace_parent);
            }
        }
        let workloads = g
            .workloads
            .iter()
            .map(|w| {
                let (model, slo_ms) = service_model(cluster.get(Kind::Service, &w.service));
                proto::AgentWorkload {
                    service: w.service.clone(),
                    model,
                    mig_instance: w.mig_instance.and_then(|i| i32::try_from(i).ok()).unwrap_or(-1),
                    mps_percent: w.mps_percent,
                    batch: w.batch,
                    processes: w.processes,
                    shadow_mps_percent: w.shadow_mps_percent,
                    slo_ms,
                }
            })
            .collect();
        gpus.push(proto::AgentGpu {
            gpu_uuid: g.gpu_uuid.clone(),
            mig_layout: g
                .mig_layout
                .iter()
                .map(|p| proto::AgentMigInstance { profile: p.profile.clone(), start: u32::from(p.start) })
                .collect(),
            workloads,
        });
    }
    gpus.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
    proto::DesiredState { node: node.to_string(), version: index.version(node), gpus, trace_parent }
}

/// A deleted Service leaves its workloads in a Plan until the provisioner re-plans; the agent
/// still needs a model name to keep them running, so it gets an empty one and keeps what runs.
fn service_model(service: Option<&StoredResource>) -> (String, f64) {
    match service.map(|s| &s.spec) {
        Some(Spec::Service(s)) => (s.model.clone(), s.slo.latency_ms),
        _ => (String::new(), 0.0),
    }
}
