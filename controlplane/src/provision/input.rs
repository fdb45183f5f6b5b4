//! The planner's input from the committed resources. Pure.

use crate::resources::{Kind, Spec};
use crate::state::ClusterState;
use planner::input::{GpuType, PlanningInput, ServiceDemand};
use planner::mig::GpuModel;
use planner::perf::table::ProfilePoint;

/// GPU types from the GpuModel resources (priced per GPU-hour by the cheapest instance
/// type that carries them), services with a fixed rate (or the floor of their autoscaling
/// range), and ParvaGPU-style tables from the ModelProfiles.
pub fn planning_input(cluster: &ClusterState) -> PlanningInput {
    let mut input = PlanningInput::default();
    for r in cluster.list(Kind::GpuModel) {
        let Spec::GpuModel(spec) = &r.spec else { continue };
        let Some(model) = GpuModel::for_name(&r.name) else { continue };
        // MIG geometry needs the resource to declare MIG; otherwise the GPU is used whole.
        let model = if spec.mig.is_some() { model } else { GpuModel::NoMig };
        let price = cluster
            .list(Kind::InstanceType)
            .filter_map(|i| match &i.spec {
                Spec::InstanceType(it) if it.gpu_model == r.name && it.gpu_count > 0 => Some(it.price_per_hour / f64::from(it.gpu_count)),
                _ => None,
            })
            .fold(f64::INFINITY, f64::min);
        // A GPU no instance type offers can still be planned on (nodes may exist), last.
        let price_per_hour = if price.is_finite() { price } else { 1e9 };
        input.gpu_types.push(GpuType { name: r.name.clone(), model, price_per_hour, mps: spec.mps, igniter: None });
    }
    for r in cluster.list(Kind::Service) {
        let Spec::Service(spec) = &r.spec else { continue };
        // An autoscaling service is planned for the rate the autoscaler set in its status
        // (within its range), else for the floor of its range.
        let rate = match (&spec.slo.request_rate, &spec.slo.autoscaling) {
            (Some(r), _) => *r,
            (None, Some(a)) => {
                r.status.get("provisioned_rps").and_then(|v| v.as_f64()).map_or(a.min_rps, |v| v.clamp(a.min_rps, a.max_rps))
            }
            (None, None) => 0.0,
        };
        input.services.push(ServiceDemand {
            name: r.name.clone(),
            model: spec.model.clone(),
            slo_ms: spec.slo.latency_ms,
            request_rate: rate,
        });
    }
    for r in cluster.list(Kind::ModelProfile) {
        let Spec::ModelProfile(spec) = &r.spec else { continue };
        let points: Vec<ProfilePoint> = spec
            .points
            .iter()
            .filter(|p| p.gpcs > 0)
            .map(|p| ProfilePoint {
                gpcs: p.gpcs,
                batch: p.batch,
                processes: p.processes,
                throughput_per_process: p.throughput_rps,
                latency_s: p.latency_ms / 1000.0,
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        let table = input.profiles.tables.entry(spec.gpu_model.clone()).or_default().entry(spec.model.clone()).or_default();
        table.points.extend(points);
    }
    input
}
