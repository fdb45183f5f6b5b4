//! The planning budget, checked before any strategy runs: what a pass plans is bounded by
//! the tenants' quotas and by [`MAX_PLAN_GPUS`] for the whole fleet, not only service by
//! service. A strategy's memory and time grow with the instances it plans; without this a
//! tenant with services each just under the per-service bound made every pass plan them
//! all (600 services: 2.3 GB and 2.7 s a pass, then the leader died, and the next) before
//! the quota check, which reads the finished plan, refused them.
//!
//! Each service is charged a lower bound of the GPUs it needs ([`lower_bound_gpus`]: its
//! rate over the best throughput per GPU any profile of its model shows, whatever the
//! latency), so a service the budget refuses would have been refused by the quota on the
//! finished plan too; the exact quota check (`quota::over_quota`) still runs after. Pure.

use std::collections::BTreeMap;

use planner::input::{PlanningInput, ServiceDemand};
use planner::plan::{Infeasible, InfeasibleReason};
use planner::policy::fair_share::{fair_share, Claim};

use super::pools::ServiceRules;
use crate::resources::limits::MAX_PLAN_GPUS;

/// GPUs-worth `service` needs at least: its request rate over the highest throughput per
/// GPU-worth (a MIG instance of `g` GPCs is `g/7` of a GPU, a point of 0 GPCs a whole GPU) that any profile point of its
/// model on any GPU type shows, at any batch and latency. 0 when no table profiles its model
/// (iGniter-only and unprofiled services are bounded by the per-service bound alone).
/// `best` caches the best throughput per model.
pub fn lower_bound_gpus(input: &PlanningInput, service: &ServiceDemand, best: &mut BTreeMap<String, f64>) -> f64 {
    let per_gpu = *best.entry(service.model.clone()).or_insert_with(|| {
        input
            .gpu_types
            .iter()
            .filter_map(|t| input.profiles.table(&t.name, &service.model))
            .flat_map(|table| &table.points)
            // A point of 0 GPCs is a whole GPU without MIG.
            .map(|p| p.segment_throughput() * if p.gpcs == 0 { 1.0 } else { 7.0 / f64::from(p.gpcs.min(7)) })
            .filter(|tp| tp.is_finite() && *tp > 0.0)
            .fold(0.0, f64::max)
    });
    if per_gpu > 0.0 && service.request_rate.is_finite() {
        service.request_rate.max(0.0) / per_gpu
    } else {
        0.0
    }
}

/// The services of `input` to refuse before planning, each with why: per tenant with a GPU
/// or cost quota, those past it in keeping order (`ServiceRules::keep_order`) by their lower
/// bounds; then, if what is left still needs more than [`MAX_PLAN_GPUS`], each tenant keeps
/// its weighted max-min fair share of that budget (as the fleet's fair share does) and the
/// rest is refused. O(services + profile points).
pub fn over_budget(input: &PlanningInput, rules: &ServiceRules) -> Vec<Infeasible> {
    let cheapest = input.gpu_types.iter().map(|t| t.price_per_hour).filter(|p| p.is_finite() && *p >= 0.0).fold(f64::INFINITY, f64::min);
    let cheapest = if cheapest.is_finite() { cheapest } else { 0.0 };
    let mut best = BTreeMap::new();
    let mut by_tenant: BTreeMap<&str, Vec<(&str, f64)>> = BTreeMap::new();
    for s in &input.services {
        let tenant = rules.boundaries.get(&s.name).map_or("", |b| b.tenant.as_str());
        by_tenant.entry(tenant).or_default().push((s.name.as_str(), lower_bound_gpus(input, s, &mut best)));
    }
    let mut refused = Vec::new();
    // 1. Each tenant's quota, by lower bounds.
    let mut kept: BTreeMap<&str, Vec<(&str, f64)>> = BTreeMap::new();
    for (tenant, mut services) in by_tenant {
        services.sort_unstable_by_key(|(name, _)| rules.keep_order(name));
        let quota = rules.quotas.get(tenant).copied().unwrap_or_default();
        let mut sum = 0.0;
        let mut within = Vec::with_capacity(services.len());
        for (name, needs) in services {
            let over = quota.exceeded_by(super::quota::Usage { gpus: sum + needs, cost_per_hour: (sum + needs) * cheapest });
            match over {
                None => {
                    sum += needs;
                    within.push((name, needs));
                }
                Some((limit, max)) => refused.push(Infeasible {
                    service: name.to_string(),
                    reason: InfeasibleReason::OverQuota {
                        detail: format!(
                            "tenant {tenant:?}'s {limit} is {max}: its services kept before it (by priority, then age) need at least {sum:.2} GPUs, this one at least {needs:.2} (refused before planning)"
                        ),
                    },
                }),
            }
        }
        kept.insert(tenant, within);
    }
    // 2. The whole plan's budget, shared by weight.
    let total: f64 = kept.values().flatten().map(|(_, needs)| needs).sum();
    let budget = MAX_PLAN_GPUS as f64;
    if total <= budget {
        return refused;
    }
    let weight = |t: &str| rules.weights.get(t).copied().filter(|w| w.is_finite() && *w > 0.0).unwrap_or(1.0);
    let claims: Vec<Claim> = kept
        .iter()
        .map(|(t, services)| Claim { weight: weight(t), demand_pct: 100.0 * services.iter().map(|(_, n)| n).sum::<f64>() / total })
        .collect();
    let shares_pct = fair_share(100.0 * budget / total, &claims).map(|f| f.shares_pct).unwrap_or_else(|_| vec![0.0; claims.len()]);
    for ((tenant, services), share_pct) in kept.into_iter().zip(shares_pct) {
        let share = share_pct * total / 100.0;
        let mut sum = 0.0;
        for (name, needs) in services {
            if sum + needs <= share {
                sum += needs;
                continue;
            }
            refused.push(Infeasible {
                service: name.to_string(),
                reason: InfeasibleReason::FleetFull {
                    detail: format!(
                        "the planning budget is {MAX_PLAN_GPUS} GPUs a plan and the services need at least {total:.0}; tenant {tenant:?}'s weighted fair share of it is {share:.2} GPUs, its services kept before it need at least {sum:.2}, this one at least {needs:.2} (refused before planning)"
                    ),
                },
            });
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::quota::Quota;
    use planner::input::{GpuType, Profiles};
    use planner::isolation::{Boundary, Isolation};
    use planner::mig::GpuModel;
    use planner::perf::synthetic::example_models;

    fn input(services: Vec<ServiceDemand>) -> PlanningInput {
        let mut profiles = Profiles::default();
        for m in example_models() {
            profiles.tables.entry("A100-80GB".into()).or_default().insert(m.name.clone(), m.table(3));
        }
        let gpu = GpuType { name: "A100-80GB".into(), model: GpuModel::A100_80GB, price_per_hour: 4.0, mps: true, igniter: None };
        PlanningInput { gpu_types: vec![gpu], services, profiles }
    }

    fn service(name: &str, rate: f64) -> ServiceDemand {
        ServiceDemand { name: name.into(), model: "resnet50".into(), slo_ms: 100.0, request_rate: rate }
    }

    fn rules(tenants: &[(&str, &str)], quota: Option<Quota>) -> ServiceRules {
        let mut rules = ServiceRules::default();
        for (i, (service, tenant)) in tenants.iter().enumerate() {
            rules.boundaries.insert(service.to_string(), Boundary { tenant: tenant.to_string(), isolation: Isolation::Mig });
            rules.admitted.insert(service.to_string(), i as u64 + 1);
            if let Some(q) = quota {
                rules.quotas.insert(tenant.to_string(), q);
            }
        }
        rules
    }

    #[test]
    fn the_lower_bound_is_below_what_the_planner_gives() {
        let inp = input(vec![service("a", 3000.0)]);
        let plan = super::super::plan_pools(&inp, &ServiceRules::default(), super::super::MigStrategy::Parvagpu);
        let planned = super::super::quota::usage_by_service(&plan, &inp.gpu_types)["a"].gpus;
        let bound = lower_bound_gpus(&inp, &inp.services[0], &mut BTreeMap::new());
        assert!(bound > 0.0 && bound <= planned + 1e-9, "bound {bound}, planned {planned}");
        // No table for the model: no bound.
        let unprofiled = ServiceDemand { model: "no-such-model".into(), ..service("b", 1000.0) };
        assert_eq!(lower_bound_gpus(&inp, &unprofiled, &mut BTreeMap::new()), 0.0);
    }

    #[test]
    fn a_tenants_services_past_its_quota_are_refused_before_planning_oldest_kept() {
        let inp = input((0..10).map(|i| service(&format!("s{i}"), 3000.0)).collect());
        let each = lower_bound_gpus(&inp, &inp.services[0], &mut BTreeMap::new());
        let names: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        let pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "acme")).collect();
        let quota = Quota { max_gpus: Some(3.5 * each), max_cost_per_hour: None };
        let refused = over_budget(&inp, &rules(&pairs, Some(quota)));
        let names: Vec<&str> = refused.iter().map(|r| r.service.as_str()).collect();
        assert_eq!(names, ["s3", "s4", "s5", "s6", "s7", "s8", "s9"]);
        assert!(refused[0].reason.to_string().starts_with("over quota: tenant \"acme\"'s max_gpus is"), "{}", refused[0].reason);
        // Without a quota and within the plan's budget, nothing.
        assert!(over_budget(&inp, &rules(&pairs, None)).is_empty());
    }

    #[test]
    fn demand_beyond_the_plan_budget_is_shared_by_weight_between_tenants() {
        // Each service needs about a fifth of the budget at least; two tenants of eight
        // each, weights 3 and 1: the heavy one keeps about three quarters.
        let inp0 = input(vec![service("x", 1000.0)]);
        let per_rps = lower_bound_gpus(&inp0, &inp0.services[0], &mut BTreeMap::new()) / 1000.0;
        let rate = MAX_PLAN_GPUS as f64 / 5.0 / per_rps;
        let names: Vec<String> = (0..16).map(|i| format!("s{i:02}")).collect();
        let inp = input(names.iter().map(|n| service(n, rate)).collect());
        let pairs: Vec<(&str, &str)> =
            names.iter().enumerate().map(|(i, n)| (n.as_str(), if i % 2 == 0 { "heavy" } else { "light" })).collect();
        let mut rules = rules(&pairs, None);
        rules.weights.insert("heavy".into(), 3.0);
        let refused = over_budget(&inp, &rules);
        let kept = |t: &str| pairs.iter().filter(|(n, tenant)| *tenant == t && !refused.iter().any(|r| r.service == *n)).count();
        assert_eq!((kept("heavy"), kept("light")), (3, 1), "{refused:?}");
        assert!(refused.iter().all(|r| r.reason.to_string().contains("the planning budget is")), "{refused:?}");
        let kept_need: f64 = (kept("heavy") + kept("light")) as f64 * rate * per_rps;
        assert!(kept_need <= MAX_PLAN_GPUS as f64, "{kept_need}");
    }
}
