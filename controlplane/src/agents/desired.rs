//! Projection of the committed Plans onto one node: the GPUs of that node and what runs on
//! them. Pure: the same applied state gives the same answer on every controller.

use crate::resources::{Kind, Spec, StoredResource};
use crate::state::ClusterState;

/// The desired state of `node`: every GPU assignment naming it, across all Plans, with each
/// workload's model and SLO taken from its Service. `version` is the highest mod_revision
/// among the resources read (every Plan, and the Services of this node's workloads), so
/// equal versions mean equal content.
pub fn desired_state(cluster: &ClusterState, node: &str) -> proto::DesiredState {
    let mut version = 0;
    let mut gpus = Vec::new();
    // The trace of the write that committed the newest plan, for the agent's reconcile.
    let mut newest_plan = 0;
    let mut trace_parent = String::new();
    for plan in cluster.list(Kind::Plan) {
        let Spec::Plan(spec) = &plan.spec else { continue };
        // Counted even when the plan has nothing for this node: a node whose work a plan
        // removed must see a newer version, or a watch resumed from its old one skips it.
        version = version.max(plan.mod_revision);
        if plan.mod_revision > newest_plan {
            newest_plan = plan.mod_revision;
            trace_parent.clone_from(&spec.trace_parent);
        }
        let mine: Vec<_> = spec.gpus.iter().filter(|g| g.node == node).collect();
        if mine.is_empty() {
            continue;
        }
        for g in mine {
            let workloads = g
                .workloads
                .iter()
                .map(|w| {
                    let service = cluster.get(Kind::Service, &w.service);
                    version = version.max(service.map_or(0, |s| s.mod_revision));
                    let (model, slo_ms) = service_model(service);
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
    }
    gpus.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
    proto::DesiredState { node: node.to_string(), version, gpus, trace_parent }
}

/// A deleted Service leaves its workloads in a Plan until the provisioner re-plans; the agent
/// still needs a model name to keep them running, so it gets an empty one and keeps what runs.
fn service_model(service: Option<&StoredResource>) -> (String, f64) {
    match service.map(|s| &s.spec) {
        Some(Spec::Service(s)) => (s.model.clone(), s.slo.latency_ms),
        _ => (String::new(), 0.0),
    }
}
