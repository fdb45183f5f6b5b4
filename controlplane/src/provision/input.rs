//! The planner's input from the committed resources. Pure.

use std::collections::BTreeMap;

use crate::resources::{BatchDistribution as BatchDistributionSpec, GpuModelSpec, InstanceTypeSpec, Kind, ServiceStatus, Spec};
use crate::state::ClusterState;
use planner::input::{BatchDistribution, GpuType, PlanningInput, ServiceDemand, UtilPoint};
use planner::mig::GpuModel;
use planner::perf::igniter::HardwareCoeffs;
use planner::perf::table::ProfilePoint;

/// The price of one GPU of `model` per hour: the cheapest instance type that carries it,
/// per GPU (what the planner, the quotas and the metering count); `None` when no instance
/// type does.
pub fn gpu_price(cluster: &ClusterState, model: &str) -> Option<f64> {
    cluster
        .list(Kind::InstanceType)
        .filter_map(|i| match &i.spec {
            Spec::InstanceType(it) if it.gpu_model == model && it.gpu_count > 0 => Some(it.price_per_hour / f64::from(it.gpu_count)),
            _ => None,
        })
        .reduce(f64::min)
}

/// Every InstanceType, by name.
pub fn instance_types(cluster: &ClusterState) -> BTreeMap<String, InstanceTypeSpec> {
    cluster
        .list(Kind::InstanceType)
        .filter_map(|r| match &r.spec {
            Spec::InstanceType(t) => Some((r.name.clone(), t.clone())),
            _ => None,
        })
        .collect()
}

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
        // A GPU no instance type offers can still be planned on (nodes may exist), last.
        let price_per_hour = gpu_price(cluster, &r.name).unwrap_or(1e9);
        input.gpu_types.push(GpuType { name: r.name.clone(), model, price_per_hour, mps: spec.mps, igniter: igniter_hardware(spec) });
    }
    // (model key, model, allowed GPU models) of the services restricted to some GPU models.
    let mut restricted = Vec::new();
    for r in cluster.list(Kind::Service) {
        let Spec::Service(spec) = &r.spec else { continue };
        // An autoscaling service is planned for the rate the autoscaler set in its status
        // (within its range), else for the floor of its range.
        let rate = match (&spec.slo.request_rate, &spec.slo.autoscaling) {
            (Some(r), _) => *r,
            (None, Some(a)) => ServiceStatus::provisioned_rps(&r.status).map_or(a.min_rps, |v| v.clamp(a.min_rps, a.max_rps)),
            (None, None) => 0.0,
        };
        let key = model_key(&spec.model, &spec.allowed_gpu_models);
        if key != spec.model {
            restricted.push((key.clone(), spec.model.clone(), spec.allowed_gpu_models.clone()));
        }
        input.services.push(ServiceDemand { name: r.name.clone(), model: key, slo_ms: spec.slo.latency_ms, request_rate: rate });
        if let Some(BatchDistributionSpec::LogNormal { mu, sigma, max_batch }) = &spec.batch_distribution {
            input
                .profiles
                .batch_distributions
                .insert(r.name.clone(), BatchDistribution::LogNormal { mu: *mu, sigma: *sigma, max_batch: *max_batch });
        }
    }
    let mut profiled = std::collections::BTreeSet::new();
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
        let utilisation: Vec<UtilPoint> = spec
            .points
            .iter()
            .filter(|p| p.gpcs > 0)
            .filter_map(|p| p.utilisation.map(|u| UtilPoint { gpcs: p.gpcs, batch: p.batch, utilisation: u }))
            .collect();
        // One profile per (model, GPU model) is admitted; should a log from before that rule
        // hold two, the first by name counts (never a merge of both).
        if !profiled.insert((spec.gpu_model.as_str(), spec.model.as_str())) {
            continue;
        }
        if !points.is_empty() {
            input.profiles.tables.entry(spec.gpu_model.clone()).or_default().entry(spec.model.clone()).or_default().points.extend(points);
        }
        if !utilisation.is_empty() {
            input
                .profiles
                .utilisation
                .entry(spec.gpu_model.clone())
                .or_default()
                .entry(spec.model.clone())
                .or_default()
                .extend(utilisation);
        }
        if let Some(coeffs) = &spec.igniter {
            input.profiles.igniter.entry(spec.gpu_model.clone()).or_default().insert(spec.model.clone(), coeffs.clone());
        }
    }
    restrict_to_allowed_models(&mut input, &restricted);
    input
}

/// The planner's model key of a service: the model itself, or, for a service restricted to
/// some GPU models, a key of its own (also readable in refusals) whose profiles exist only
/// on the allowed GPU models. The strategies choose GPU types per model, so this is how a
/// per-service restriction reaches them without changing them.
fn model_key(model: &str, allowed: &[String]) -> String {
    if allowed.is_empty() {
        model.to_string()
    } else {
        format!("{model} (allowed: {})", allowed.join(", "))
    }
}

/// Copies each restricted service's profiles, on its allowed GPU models only, to its key.
fn restrict_to_allowed_models(input: &mut PlanningInput, restricted: &[(String, String, Vec<String>)]) {
    let p = &mut input.profiles;
    for (key, model, allowed) in restricted {
        for gpu in allowed {
            if let Some(t) = p.tables.get(gpu).and_then(|m| m.get(model)).cloned() {
                p.tables.entry(gpu.clone()).or_default().insert(key.clone(), t);
            }
            if let Some(c) = p.igniter.get(gpu).and_then(|m| m.get(model)).cloned() {
                p.igniter.entry(gpu.clone()).or_default().insert(key.clone(), c);
            }
            if let Some(u) = p.utilisation.get(gpu).and_then(|m| m.get(model)).cloned() {
                p.utilisation.entry(gpu.clone()).or_default().insert(key.clone(), u);
            }
        }
    }
}

/// iGniter's hardware coefficients of a GPU model, when its resource carries them (the
/// validation made sure the power, frequency and bandwidth figures are there too).
fn igniter_hardware(spec: &GpuModelSpec) -> Option<HardwareCoeffs> {
    let hw = spec.igniter.as_ref()?;
    Some(HardwareCoeffs {
        max_power_w: spec.max_power_w?,
        max_freq_mhz: spec.max_frequency_mhz?,
        idle_power_w: spec.idle_power_w?,
        // GB/s to bytes per ms.
        pcie_bytes_per_ms: spec.pcie_gbps? * 1e6,
        alpha_f: hw.alpha_f,
        alpha_sch: hw.alpha_sch,
        beta_sch: hw.beta_sch,
        r_unit_pct: hw.r_unit_pct,
        r_max_pct: hw.r_max_pct,
    })
}
