//! Strategy-independent invariants every [`Plan`] must satisfy, shared by the tests of all
//! provisioning strategies.

use crate::input::PlanningInput;
use crate::mig::validate;
use crate::plan::{Plan, Sharing};
use std::collections::{BTreeMap, BTreeSet};

/// Relative tolerance for the floating-point comparisons below (sums of MPS percentages
/// and of predicted throughputs are accumulated in a different order than the strategies
/// compared them).
const TOL: f64 = 1e-9;

fn within(value: f64, limit: f64) -> bool {
    value <= limit + TOL * limit.abs().max(1.0)
}

/// Checks a plan against its input:
///
/// * every GPU names a known GPU type and a unique slot;
/// * MPS-only GPUs: no workload names a MIG instance and the MPS percentages of all
///   processes plus the shadow reserves sum to at most 100;
/// * MIG GPUs: the type is MIG-capable, the layout passes [`crate::mig::validate`], every
///   workload names an existing instance, and per instance the MPS percentages plus shadow
///   reserves sum to at most 100;
/// * sharing a GPU or instance between several processes requires an MPS-capable type;
/// * every workload belongs to a known service, has batch and processes ≥ 1, a positive
///   MPS share and finite positive predictions;
/// * every service is either planned or named in `infeasible` (exactly one of the two);
///   services with a non-positive rate or SLO are infeasible;
/// * every planned service's predicted capacity (sum of its workloads' throughput) is at
///   least its request rate and its worst predicted batch latency at most half its SLO
///   (iGniter Eq. 13-14), and `plan.predictions` agrees with the workloads.
pub fn check_invariants(plan: &Plan, input: &PlanningInput) -> Result<(), String> {
    let services: BTreeMap<&str, _> = input.services.iter().map(|s| (s.name.as_str(), s)).collect();
    if services.len() != input.services.len() {
        return Err("duplicate service names in the input".into());
    }
    let mut slots = BTreeSet::new();
    let mut capacity: BTreeMap<&str, f64> = BTreeMap::new();
    let mut latency: BTreeMap<&str, f64> = BTreeMap::new();
    for g in &plan.gpus {
        let ctx = format!("GPU slot {} ({})", g.slot, g.gpu_type);
        if !slots.insert(g.slot) {
            return Err(format!("{ctx}: duplicate slot"));
        }
        let ty = input.gpu_types.iter().find(|t| t.name == g.gpu_type).ok_or_else(|| format!("{ctx}: unknown GPU type"))?;
        if g.workloads.is_empty() {
            return Err(format!("{ctx}: GPU without workloads"));
        }
        for w in &g.workloads {
            let s = services.get(w.service.as_str()).ok_or_else(|| format!("{ctx}: workload of unknown service `{}`", w.service))?;
            if w.batch_size == 0 || w.processes == 0 {
                return Err(format!("{ctx}: `{}` has batch {} and {} processes", s.name, w.batch_size, w.processes));
            }
            let share_ok = w.mps_percent > 0.0 && w.mps_percent <= 100.0 + TOL && w.shadow_percent >= 0.0;
            if !share_ok {
                return Err(format!("{ctx}: `{}` has MPS {}% and shadow {}%", s.name, w.mps_percent, w.shadow_percent));
            }
            let finite_pos = |v: f64| v.is_finite() && v > 0.0;
            if !finite_pos(w.predicted_throughput) || !finite_pos(w.predicted_latency_ms) {
                return Err(format!("{ctx}: `{}` predicts {} req/s at {} ms", s.name, w.predicted_throughput, w.predicted_latency_ms));
            }
            *capacity.entry(s.name.as_str()).or_insert(0.0) += w.predicted_throughput;
            let l = latency.entry(s.name.as_str()).or_insert(0.0);
            *l = l.max(w.predicted_latency_ms);
        }
        let share = |w: &crate::plan::Workload| w.mps_percent * f64::from(w.processes) + w.shadow_percent;
        let shared = |ws: &[&crate::plan::Workload]| ws.len() > 1 || ws.iter().any(|w| w.processes > 1 || w.mps_percent < 100.0 - TOL);
        match &g.sharing {
            Sharing::MpsOnly => {
                if let Some(w) = g.workloads.iter().find(|w| w.mig_instance.is_some()) {
                    return Err(format!("{ctx}: MPS-only GPU but `{}` names a MIG instance", w.service));
                }
                let used: f64 = g.workloads.iter().map(share).sum();
                if !within(used, 100.0) {
                    return Err(format!("{ctx}: MPS shares incl. shadow reserve sum to {used}% > 100%"));
                }
                let all: Vec<_> = g.workloads.iter().collect();
                if shared(&all) && !ty.mps {
                    return Err(format!("{ctx}: MPS sharing on a type without MPS"));
                }
            }
            Sharing::Mig { instances } => {
                if !ty.mig() {
                    return Err(format!("{ctx}: MIG layout on a type without MIG"));
                }
                if instances.is_empty() {
                    return Err(format!("{ctx}: MIG enabled without instances"));
                }
                let layout: Vec<_> = instances.iter().map(|i| i.placement()).collect();
                validate(&layout).map_err(|e| format!("{ctx}: invalid MIG layout: {e}"))?;
                for (k, _) in instances.iter().enumerate() {
                    let mine: Vec<_> = g.workloads.iter().filter(|w| w.mig_instance == Some(k)).collect();
                    let used: f64 = mine.iter().map(|w| share(w)).sum();
                    if !within(used, 100.0) {
                        return Err(format!("{ctx}: instance {k}: MPS shares incl. shadow sum to {used}% > 100%"));
                    }
                    if shared(&mine) && !ty.mps {
                        return Err(format!("{ctx}: instance {k}: MPS sharing on a type without MPS"));
                    }
                }
                if let Some(w) = g.workloads.iter().find(|w| w.mig_instance.is_none_or(|k| k >= instances.len())) {
                    return Err(format!("{ctx}: `{}` names MIG instance {:?} of {}", w.service, w.mig_instance, instances.len()));
                }
            }
        }
    }
    let mut refused = BTreeSet::new();
    for f in &plan.infeasible {
        if !services.contains_key(f.service.as_str()) {
            return Err(format!("infeasible entry for unknown service `{}`", f.service));
        }
        if !refused.insert(f.service.as_str()) {
            return Err(format!("service `{}` named infeasible twice", f.service));
        }
        if capacity.contains_key(f.service.as_str()) {
            return Err(format!("service `{}` is both planned and infeasible ({})", f.service, f.reason));
        }
    }
    for s in &input.services {
        let name = s.name.as_str();
        let valid = s.request_rate > 0.0 && s.request_rate.is_finite() && s.slo_ms > 0.0 && s.slo_ms.is_finite();
        if !valid && !refused.contains(name) {
            return Err(format!("service `{name}` has an invalid demand but is not named infeasible"));
        }
        if refused.contains(name) {
            continue;
        }
        let Some(&cap) = capacity.get(name) else {
            return Err(format!("service `{name}` is neither planned nor named infeasible"));
        };
        let lat = latency[name];
        if !within(s.request_rate, cap) {
            return Err(format!("service `{name}`: capacity {cap} req/s < request rate {}", s.request_rate));
        }
        if !within(lat, s.slo_ms / 2.0) {
            return Err(format!("service `{name}`: predicted latency {lat} ms > SLO/2 = {} ms", s.slo_ms / 2.0));
        }
        let p = plan.prediction(name).ok_or_else(|| format!("service `{name}` has no prediction"))?;
        if (p.capacity_rps - cap).abs() > TOL * cap.max(1.0) || (p.latency_ms - lat).abs() > TOL * lat.max(1.0) {
            return Err(format!("service `{name}`: prediction {p:?} disagrees with its workloads ({cap} req/s, {lat} ms)"));
        }
    }
    if let Some(p) = plan.predictions.iter().find(|p| !capacity.contains_key(p.service.as_str())) {
        return Err(format!("prediction for unplanned service `{}`", p.service));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{GpuType, ServiceDemand};
    use crate::mig::{GpuModel, MigProfile};
    use crate::plan::{predictions_from_gpus, GpuPlan, Infeasible, InfeasibleReason, MigInstance, Workload};

    fn input() -> PlanningInput {
        PlanningInput {
            gpu_types: vec![GpuType { name: "a100".into(), model: GpuModel::A100_80GB, price_per_hour: 1.0, mps: true, igniter: None }],
            services: vec![
                ServiceDemand { name: "a".into(), model: "m".into(), slo_ms: 20.0, request_rate: 100.0 },
                ServiceDemand { name: "b".into(), model: "m".into(), slo_ms: 20.0, request_rate: 100.0 },
            ],
            ..Default::default()
        }
    }

    fn wl(service: &str, inst: Option<usize>, mps: f64, shadow: f64, tp: f64, lat: f64) -> Workload {
        Workload {
            service: service.into(),
            mig_instance: inst,
            mps_percent: mps,
            batch_size: 4,
            processes: 1,
            shadow_percent: shadow,
            predicted_throughput: tp,
            predicted_latency_ms: lat,
        }
    }

    fn plan(gpus: Vec<GpuPlan>, infeasible: Vec<Infeasible>) -> Plan {
        let inp = input();
        Plan { strategy: "test".into(), predictions: predictions_from_gpus(&gpus, &inp.services), gpus, infeasible }
    }

    fn mps_gpu(slot: u32, workloads: Vec<Workload>) -> GpuPlan {
        GpuPlan { slot, gpu_type: "a100".into(), sharing: Sharing::MpsOnly, workloads }
    }

    #[test]
    fn accepts_a_good_plan_and_rejects_each_violation() {
        let inp = input();
        let good = plan(vec![mps_gpu(0, vec![wl("a", None, 40.0, 10.0, 100.0, 9.0), wl("b", None, 40.0, 10.0, 120.0, 10.0)])], vec![]);
        check_invariants(&good, &inp).unwrap();

        // MPS over 100% only because of the shadow reserve.
        let p = plan(vec![mps_gpu(0, vec![wl("a", None, 45.0, 10.0, 100.0, 9.0), wl("b", None, 40.0, 10.0, 120.0, 10.0)])], vec![]);
        assert!(check_invariants(&p, &inp).unwrap_err().contains("shadow"));
        // Capacity short of the rate.
        let p = plan(vec![mps_gpu(0, vec![wl("a", None, 40.0, 0.0, 99.0, 9.0), wl("b", None, 40.0, 0.0, 120.0, 10.0)])], vec![]);
        assert!(check_invariants(&p, &inp).unwrap_err().contains("capacity"));
        // Latency above SLO/2.
        let p = plan(vec![mps_gpu(0, vec![wl("a", None, 40.0, 0.0, 100.0, 10.5), wl("b", None, 40.0, 0.0, 120.0, 10.0)])], vec![]);
        assert!(check_invariants(&p, &inp).unwrap_err().contains("latency"));
        // A service silently dropped.
        let p = plan(vec![mps_gpu(0, vec![wl("a", None, 40.0, 0.0, 100.0, 9.0)])], vec![]);
        assert!(check_invariants(&p, &inp).unwrap_err().contains("neither planned"));
        // ... but naming it infeasible is fine.
        let p = plan(
            vec![mps_gpu(0, vec![wl("a", None, 40.0, 0.0, 100.0, 9.0)])],
            vec![Infeasible { service: "b".into(), reason: InfeasibleReason::NoProfile { model: "m".into() } }],
        );
        check_invariants(&p, &inp).unwrap();

        // MIG: an overlapping layout is rejected; a valid one with full instances accepted.
        let mig = |instances: Vec<MigInstance>| GpuPlan {
            slot: 0,
            gpu_type: "a100".into(),
            sharing: Sharing::Mig { instances },
            workloads: vec![wl("a", Some(0), 100.0, 0.0, 100.0, 9.0), wl("b", Some(1), 100.0, 0.0, 100.0, 9.0)],
        };
        let ok = plan(
            vec![mig(vec![MigInstance { profile: MigProfile::G4, start: 0 }, MigInstance { profile: MigProfile::G3, start: 4 }])],
            vec![],
        );
        check_invariants(&ok, &inp).unwrap();
        let bad = plan(
            vec![mig(vec![MigInstance { profile: MigProfile::G4, start: 0 }, MigInstance { profile: MigProfile::G2, start: 2 }])],
            vec![],
        );
        assert!(check_invariants(&bad, &inp).unwrap_err().contains("invalid MIG layout"));
    }
}
