//! Tenant quotas at planning: no plan gives a tenant more than its `max_gpus` (GPUs-worth:
//! each workload's MIG instance GPCs/7, or its MPS share of the GPU, `GpuPlan::occupancy`)
//! or its `max_cost_per_hour` (that times the GPU's price per hour). A tenant over either
//! keeps its services in order of priority, then admission (oldest first), while they fit,
//! and the rest are refused, the quota named: a new service cannot push out one that runs
//! unless its priority is higher. Pure.

use std::collections::{BTreeMap, BTreeSet};

use planner::input::{GpuType, PlanningInput};
use planner::plan::{Infeasible, InfeasibleReason, Plan};
use planner::policy::fair_share::{fair_share, Claim};
use serde::Serialize;

use super::{plan_pools, plan_pools_from, planning_input, service_rules, MigStrategy, PoolPlans, Previous, ServiceRules};
use crate::resources::limits::DEFAULT_TENANT_MAX_GPUS;
use crate::resources::{ErrorCode, FieldError, TenantSpec};
use crate::state::ClusterState;

/// A tenant's limits on what the plan gives it; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Quota {
    pub max_gpus: Option<f64>,
    pub max_cost_per_hour: Option<f64>,
}

/// What a plan gives a service or a tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Usage {
    /// GPUs-worth: MIG GPCs/7 plus MPS shares.
    pub gpus: f64,
    /// `gpus` of each GPU times its type's price per hour.
    pub cost_per_hour: f64,
}

impl Usage {
    fn plus(self, other: Usage) -> Usage {
        Usage { gpus: self.gpus + other.gpus, cost_per_hour: self.cost_per_hour + other.cost_per_hour }
    }
}

/// Relative slack for sums of shares taken in different orders.
const SLACK: f64 = 1e-9;

impl Quota {
    /// The quota a Tenant's spec declares, with [`DEFAULT_TENANT_MAX_GPUS`] for a tenant
    /// that sets no `max_gpus`: no tenant's demand is unbounded by default (one without a
    /// quota could make every pass plan 2,000-GPU services by the hundred).
    pub fn of(spec: &TenantSpec) -> Quota {
        Quota { max_gpus: Some(spec.max_gpus.unwrap_or(DEFAULT_TENANT_MAX_GPUS)), max_cost_per_hour: spec.max_cost_per_hour }
    }

    pub fn is_limited(&self) -> bool {
        self.max_gpus.is_some() || self.max_cost_per_hour.is_some()
    }

    /// The limit `usage` would pass, named as in the Tenant's spec, with the limit.
    pub fn exceeded_by(&self, usage: Usage) -> Option<(&'static str, f64)> {
        let over = |max: Option<f64>, used: f64| max.filter(|&m| used > m * (1.0 + SLACK) + SLACK);
        over(self.max_gpus, usage.gpus)
            .map(|m| ("max_gpus", m))
            .or_else(|| over(self.max_cost_per_hour, usage.cost_per_hour).map(|m| ("max_cost_per_hour", m)))
    }
}

/// What `plan` gives each service it places.
pub fn usage_by_service(plan: &Plan, types: &[GpuType]) -> BTreeMap<String, Usage> {
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    for g in &plan.gpus {
        let price = types.iter().find(|t| t.name == g.gpu_type).map_or(0.0, |t| t.price_per_hour);
        for w in &g.workloads {
            let gpus = g.occupancy(w);
            let u = usage.entry(w.service.clone()).or_default();
            *u = u.plus(Usage { gpus, cost_per_hour: gpus * price });
        }
    }
    usage
}

/// The services of `plan` to refuse so that every tenant stays within its quota, each with
/// the quota it would pass. Per limited tenant, its planned services in keeping order
/// (`ServiceRules::keep_order`: priority, then admission, then name) are kept while the
/// running sum fits; one that does not is refused and the next is tried.
pub fn over_quota(plan: &Plan, input: &PlanningInput, rules: &ServiceRules) -> Vec<Infeasible> {
    if rules.quotas.is_empty() {
        // No tenant is limited: nothing to count (a walk over every planned workload, 7% of
        // `provision-bench`'s samples at 10,000 hosts, perf).
        return Vec::new();
    }
    let usage = usage_by_service(plan, &input.gpu_types);
    let mut by_tenant: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in &input.services {
        let Some(b) = rules.boundaries.get(&s.name) else { continue };
        if usage.contains_key(&s.name) && rules.quotas.get(&b.tenant).is_some_and(Quota::is_limited) {
            by_tenant.entry(b.tenant.as_str()).or_default().push(&s.name);
        }
    }
    let mut refused = Vec::new();
    for (tenant, mut services) in by_tenant {
        let quota = rules.quotas[tenant];
        services.sort_unstable_by_key(|name| rules.keep_order(name));
        let mut kept = Usage::default();
        for name in services {
            let needs = usage[name];
            match quota.exceeded_by(kept.plus(needs)) {
                None => kept = kept.plus(needs),
                Some((limit, max)) => refused.push(Infeasible {
                    service: name.to_string(),
                    reason: InfeasibleReason::OverQuota {
                        detail: format!(
                            "tenant {tenant:?}'s {limit} is {max}: its services kept before it (by priority, then age) use {:.2} GPUs at {:.2}/h, this one needs {:.2} GPUs at {:.2}/h",
                            kept.gpus, kept.cost_per_hour, needs.gpus, needs.cost_per_hour
                        ),
                    },
                }),
            }
        }
    }
    refused
}

/// Plans every service (from `previous` where only a few changed, `replan`), then, while
/// some tenant is over its quota ([`over_quota`]) or over its fair share of a GPU type the
/// plan needs more of than the fleet can hold (`capacity`, [`over_fair_share`]), refuses what they name and plans the rest again. Each round
/// refuses at least one service, so there are at most as many rounds as services; without
/// limits there is one. Quotas are kept whatever the rounds; shares for at most
/// [`MAX_SHARE_ROUNDS`] rounds, past which what the plan still holds beyond the fleet is
/// left to the placement (which names what finds no GPU). `None` when `stop` said to stop.
pub fn plan_within_limits(
    input: &PlanningInput,
    rules: &ServiceRules,
    strategy: MigStrategy,
    previous: Option<Previous>,
    stop: &dyn Fn() -> bool,
    capacity: Option<&Capacity>,
) -> Option<(Plan, PoolPlans)> {
    // What the quotas and the plan's budget refuse by lower bounds, before any strategy
    // runs (`budget`): the passes below plan at most that much.
    let mut refused = super::budget::over_budget(input, rules);
    let budgeted;
    let (input, previous) = if refused.is_empty() {
        (input, previous)
    } else {
        let out: BTreeSet<&str> = refused.iter().map(|r| r.service.as_str()).collect();
        budgeted = PlanningInput {
            services: input.services.iter().filter(|s| !out.contains(s.name.as_str())).cloned().collect(),
            ..input.clone()
        };
        (&budgeted, previous)
    };
    let (mut plan, mut pools) = plan_pools_from(input, rules, strategy, previous, stop)?;
    let mut share_rounds = 0;
    loop {
        let mut over = over_quota(&plan, input, rules);
        if let (true, Some(capacity), true) = (over.is_empty(), capacity, share_rounds < MAX_SHARE_ROUNDS) {
            over = over_fair_share(&plan, input, rules, capacity);
            share_rounds += 1;
        }
        if over.is_empty() {
            break;
        }
        refused.extend(over);
        let out: BTreeSet<&str> = refused.iter().map(|r| r.service.as_str()).collect();
        let within = PlanningInput {
            services: input.services.iter().filter(|s| !out.contains(s.name.as_str())).cloned().collect(),
            ..input.clone()
        };
        // From the previous pass's plans too: the services refused are left out of them
        // as deleted ones are, and the others keep their places (with a default quota, a
        // tenant over it is common, and a full re-plan each pass moved 10,416 of 44,862
        // GPUs for one Service's change at 10,000 hosts, `provision-bench --hostile`).
        (plan, pools) = plan_pools_from(&within, rules, strategy, previous, stop)?;
    }
    plan.infeasible.extend(refused);
    Some((plan, pools))
}

/// Most re-planning rounds of one pass for the fair share: each is a whole planning pass
/// (0.3 s at 10,000 hosts), and one round usually refuses all it must.
pub const MAX_SHARE_ROUNDS: usize = 4;

/// GPUs of each model the fleet can hold (`super::fleet_capacity`); a model absent has no
/// limit. See [`over_fair_share`].
pub type Capacity = BTreeMap<String, u32>;

/// When the plan needs more GPUs of a type than the fleet can hold (`capacity`): the
/// services to refuse so that every tenant keeps within its weighted max-min fair share of
/// that type (`planner::policy::fair_share`, GSLICE's and HetSev's weighted fairness), each
/// named "fleet full". Per short type, the capacity in GPUs-worth is what the plan's
/// services use there scaled by `capacity / GPUs planned` (the plan's packing); each tenant
/// claims what its services use there, weighted by its `weight`.
///
/// Services are whole, so shares are met within one service: each tenant first keeps, in
/// keeping order (`ServiceRules::keep_order`: priority, then admission), the services that
/// fit its share. What that leaves of the capacity then goes, one service at a time, to
/// the tenant furthest below its weighted share whose next service still fits (work
/// conserving: no capacity idles while a service that fits it is refused, and a service
/// larger than its tenant's share runs only on room the others leave). A tenant alone on the
/// type keeps its first service whatever its size; the placement then places what fits and
/// names the rest.
pub fn over_fair_share(plan: &Plan, input: &PlanningInput, rules: &ServiceRules, capacity: &Capacity) -> Vec<Infeasible> {
    let mut planned: BTreeMap<&str, u32> = BTreeMap::new();
    for g in &plan.gpus {
        *planned.entry(g.gpu_type.as_str()).or_default() += 1;
    }
    let tenant_of = |name: &str| rules.boundaries.get(name).map_or("", |b| b.tenant.as_str());
    let mut refused = Vec::new();
    for (gpu_type, &n) in &planned {
        let Some(&held) = capacity.get(*gpu_type) else { continue };
        if n <= held {
            continue;
        }
        // What each service uses on this type, and per tenant its services.
        let mut used: BTreeMap<&str, f64> = BTreeMap::new();
        for g in plan.gpus.iter().filter(|g| g.gpu_type == *gpu_type) {
            for w in &g.workloads {
                *used.entry(w.service.as_str()).or_default() += g.occupancy(w);
            }
        }
        let mut tenants: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for s in input.services.iter().filter(|s| used.contains_key(s.name.as_str())) {
            tenants.entry(tenant_of(&s.name)).or_default().push(s.name.as_str());
        }
        // Claims and capacity in percent of what the plan uses here (fair_share's scale):
        // the capacity is the share of the planned GPUs the fleet holds.
        let total: f64 = used.values().sum();
        if total <= 0.0 {
            continue;
        }
        let weight = |t: &str| rules.weights.get(t).copied().unwrap_or(1.0);
        let claims: Vec<Claim> = tenants
            .iter()
            .map(|(t, services)| Claim { weight: weight(t), demand_pct: 100.0 * services.iter().map(|s| used[s]).sum::<f64>() / total })
            .collect();
        let shares_pct = match fair_share(100.0 * f64::from(held) / f64::from(n), &claims) {
            Ok(f) => f.shares_pct,
            // No GPU of this type at all: no share for anyone.
            Err(_) => vec![0.0; claims.len()],
        };
        let fits = |kept: f64, needs: f64, room: f64| kept + needs <= room * (1.0 + SLACK) + SLACK;
        // 1. Each tenant keeps what fits its share; the rest wait for what is left. A tenant
        // alone on the type has no one to be fair to: its first service is kept even when
        // larger than the fleet, to be placed in part (serving some of its load beats none).
        let alone = tenants.len() == 1;
        let mut ledgers: Vec<Ledger> = Vec::with_capacity(tenants.len());
        for ((tenant, mut services), share_pct) in tenants.into_iter().zip(shares_pct) {
            let share = share_pct * total / 100.0;
            services.sort_unstable_by_key(|name| rules.keep_order(name));
            let mut ledger = Ledger { tenant, weight: weight(tenant), share, kept: 0.0, waiting: Vec::new() };
            for name in services {
                if fits(ledger.kept, used[name], share) || (alone && ledger.kept == 0.0) {
                    ledger.kept += used[name];
                } else {
                    ledger.waiting.push(name);
                }
            }
            ledger.waiting.reverse(); // popped from the end, in keeping order
            ledgers.push(ledger);
        }
        // 2. What is left, a service at a time, to the tenant with the least kept per weight.
        // A service that does not fit now never will (what is left only shrinks): refused.
        // Each round keeps or refuses one service, so it ends.
        let mut left = total * f64::from(held) / f64::from(n) - ledgers.iter().map(|l| l.kept).sum::<f64>();
        while let Some(l) =
            ledgers.iter_mut().filter(|l| !l.waiting.is_empty()).min_by(|a, b| (a.kept / a.weight).total_cmp(&(b.kept / b.weight)))
        {
            let name = l.waiting.pop().expect("a tenant with services waiting");
            let needs = used[name];
            if fits(0.0, needs, left) {
                l.kept += needs;
                left -= needs;
                continue;
            }
            let (tenant, share, kept) = (l.tenant, l.share, l.kept);
            refused.push(Infeasible {
                service: name.to_string(),
                reason: InfeasibleReason::FleetFull {
                    detail: format!(
                        "the fleet can hold {held} {gpu_type} GPUs; tenant {tenant:?}'s weighted fair share of them is {share:.2} GPUs-worth, its services kept before it (by priority, then age) use {kept:.2}, this one needs {needs:.2}, and the other tenants leave {:.2}",
                        left.max(0.0)
                    ),
                },
            });
        }
    }
    refused
}

/// One tenant's account in [`over_fair_share`].
struct Ledger<'a> {
    tenant: &'a str,
    weight: f64,
    share: f64,
    kept: f64,
    /// Services not within its share, last to be tried first.
    waiting: Vec<&'a str>,
}

/// Admission: service `name` of `cluster` (holding it as it would be written, see
/// `ClusterState::resources_with`; the catalogue alone is enough, `catalogue_only`) planned alone, as the provisioner would at its minimum
/// rate, against its tenant's quota. A service that cannot fit even with nothing else of its
/// tenant's is refused with the quota named; one the planner cannot place at all is left to
/// the plan, which names why.
pub fn admits(cluster: &ClusterState, name: &str, strategy: MigStrategy) -> Result<(), FieldError> {
    let rules = service_rules(cluster);
    let Some(tenant) = rules.boundaries.get(name).map(|b| b.tenant.clone()) else { return Ok(()) };
    let Some(quota) = rules.quotas.get(&tenant).copied() else { return Ok(()) };
    let mut alone = planning_input(cluster);
    alone.services.retain(|s| s.name == name);
    let plan = plan_pools(&alone, &rules, strategy);
    let Some(needs) = usage_by_service(&plan, &alone.gpu_types).get(name).copied() else { return Ok(()) };
    match quota.exceeded_by(needs) {
        None => Ok(()),
        Some((limit, max)) => Err(FieldError::new(
            ErrorCode::ResourceExhausted,
            "spec.slo",
            format!(
                "service {name:?} alone needs {:.2} GPUs at {:.2}/h at its minimum rate; tenant {tenant:?}'s spec.{limit} is {max}",
                needs.gpus, needs.cost_per_hour
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::input::{Profiles, ServiceDemand};
    use planner::isolation::{Boundary, Isolation};
    use planner::mig::GpuModel;
    use planner::perf::synthetic::example_models;

    fn input(services: Vec<ServiceDemand>) -> PlanningInput {
        let mut profiles = Profiles::default();
        for m in example_models() {
            profiles.tables.entry("A100-80GB".into()).or_default().insert(m.name.clone(), m.table(3));
        }
        PlanningInput {
            gpu_types: vec![GpuType {
                name: "A100-80GB".into(),
                model: GpuModel::A100_80GB,
                price_per_hour: 7.0,
                mps: true,
                igniter: None,
            }],
            services,
            profiles,
        }
    }

    fn service(name: &str, rate: f64) -> ServiceDemand {
        ServiceDemand { name: name.into(), model: "resnet50".into(), slo_ms: 100.0, request_rate: rate }
    }

    /// Services of tenant t1 admitted in the given order, under `quota`.
    fn rules(order: &[&str], quota: Quota) -> ServiceRules {
        let mut rules = ServiceRules::default();
        for (i, s) in order.iter().enumerate() {
            rules.boundaries.insert(s.to_string(), Boundary { tenant: "t1".into(), isolation: Isolation::Mig });
            rules.admitted.insert(s.to_string(), i as u64 + 1);
        }
        rules.quotas.insert("t1".into(), quota);
        rules
    }

    #[test]
    fn usage_counts_instance_gpcs_and_prices_them() {
        let inp = input(vec![service("a", 300.0)]);
        let plan = super::super::plan_pools(&inp, &ServiceRules::default(), super::super::MigStrategy::Parvagpu);
        let u = usage_by_service(&plan, &inp.gpu_types)["a"];
        let gpcs: u32 = plan.gpus.iter().map(|g| g.gpcs_used()).sum();
        assert!((u.gpus - f64::from(gpcs) / 7.0).abs() < 1e-9, "{u:?} vs {gpcs} GPCs");
        assert!((u.cost_per_hour - 7.0 * u.gpus).abs() < 1e-9);
    }

    /// Services a, b and c of 300 req/s each, planned, and the GPUs-worth each uses.
    fn three_equal_services() -> (PlanningInput, Plan, f64) {
        let inp = input(vec![service("a", 300.0), service("b", 300.0), service("c", 300.0)]);
        let plan = super::super::plan_pools(&inp, &ServiceRules::default(), super::super::MigStrategy::Parvagpu);
        let each = usage_by_service(&plan, &inp.gpu_types)["a"].gpus;
        (inp, plan, each)
    }

    #[test]
    fn the_newest_services_past_a_quota_are_refused_with_the_quota_named() {
        let (inp, plan, each) = three_equal_services();
        // Room for two of the three: the one admitted last is refused, whatever its name.
        let quota = Quota { max_gpus: Some(2.5 * each), max_cost_per_hour: None };
        let refused = over_quota(&plan, &inp, &rules(&["c", "a", "b"], quota));
        assert_eq!(refused.iter().map(|r| r.service.as_str()).collect::<Vec<_>>(), ["b"]);
        let InfeasibleReason::OverQuota { detail } = &refused[0].reason else { panic!("{:?}", refused[0]) };
        assert!(detail.starts_with("tenant \"t1\"'s max_gpus is"), "{detail}");
        // A cost quota counts the price: room for one.
        let quota = Quota { max_gpus: None, max_cost_per_hour: Some(7.0 * each * 1.5) };
        let refused = over_quota(&plan, &inp, &rules(&["a", "b", "c"], quota));
        assert_eq!(refused.iter().map(|r| r.service.as_str()).collect::<Vec<_>>(), ["b", "c"]);
        assert!(refused.iter().all(|r| r.reason.to_string().contains("max_cost_per_hour")));
        // Unlimited, or another tenant's quota: nothing refused.
        assert!(over_quota(&plan, &inp, &rules(&["a", "b", "c"], Quota::default())).is_empty());
        let mut other = rules(&["a", "b", "c"], Quota::default());
        other.quotas.insert("t2".into(), Quota { max_gpus: Some(0.0), max_cost_per_hour: None });
        assert!(over_quota(&plan, &inp, &other).is_empty());
    }

    #[test]
    fn a_higher_priority_keeps_its_place_before_older_services() {
        let (inp, plan, each) = three_equal_services();
        let quota = Quota { max_gpus: Some(2.5 * each), max_cost_per_hour: None };
        // Admitted a, b, c; c, the newest, has the highest priority, b one above a's 0: the
        // quota holds c and b, and a, the oldest, is refused.
        let mut rules = rules(&["a", "b", "c"], quota);
        rules.priorities.insert("c".into(), 10);
        rules.priorities.insert("b".into(), 1);
        let refused = over_quota(&plan, &inp, &rules);
        assert_eq!(refused.iter().map(|r| r.service.as_str()).collect::<Vec<_>>(), ["a"]);
        assert!(refused[0].reason.to_string().contains("kept before it (by priority, then age)"), "{}", refused[0].reason);
        // Equal priorities fall back to age.
        rules.priorities.insert("a".into(), 10);
        let refused = over_quota(&plan, &inp, &rules);
        assert_eq!(refused.iter().map(|r| r.service.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn a_fleet_that_cannot_grow_is_shared_by_weight_and_frees_to_everyone() {
        // Two tenants, weights 2 and 1, each with 14 equal services: a fleet with half the
        // GPUs the plan needs.
        let names: Vec<String> = (0..28).map(|i| format!("s{i:02}")).collect();
        let inp = input(names.iter().map(|n| service(n, 300.0)).collect());
        let mut rules = ServiceRules::default();
        for (i, n) in names.iter().enumerate() {
            let tenant = if i % 2 == 0 { "heavy" } else { "light" };
            rules.boundaries.insert(n.clone(), Boundary { tenant: tenant.into(), isolation: Isolation::Mig });
            rules.admitted.insert(n.clone(), i as u64);
        }
        rules.weights.insert("heavy".into(), 2.0);
        rules.weights.insert("light".into(), 1.0);
        let strategy = super::super::MigStrategy::Parvagpu;
        let (all, _) = plan_within_limits(&inp, &rules, strategy, None, &|| false, None).unwrap();
        let needed = all.gpus.len() as u32;
        assert!(needed >= 2, "{needed}");
        let half = Capacity::from([("A100-80GB".to_string(), needed / 2)]);
        let (plan, _) = plan_within_limits(&inp, &rules, strategy, None, &|| false, Some(&half)).unwrap();
        assert_eq!(planner::invariants::check_invariants(&plan, &inp), Ok(()));
        assert!(plan.gpus.len() as u32 <= needed / 2, "{} GPUs on a fleet of {}", plan.gpus.len(), needed / 2);
        let kept = |t: &str| plan.predictions.iter().filter(|p| rules.boundaries[&p.service].tenant == t).count() as f64;
        let (heavy, light) = (kept("heavy"), kept("light"));
        assert!(light >= 1.0 && (heavy - 2.0 * light).abs() <= 2.0, "heavy {heavy}, light {light}: not 2:1 within a service");
        assert!(plan.infeasible.iter().all(|f| matches!(f.reason, InfeasibleReason::FleetFull { .. })), "{:?}", plan.infeasible);
        assert!(plan.infeasible.iter().any(|f| f.reason.to_string().contains("tenant \"heavy\"'s weighted fair share")));
        // The oldest services of each tenant are the ones kept.
        let light_kept: Vec<&str> = names.iter().skip(1).step_by(2).map(String::as_str).filter(|n| plan.prediction(n).is_some()).collect();
        let light_oldest: Vec<&str> = names.iter().skip(1).step_by(2).take(light_kept.len()).map(String::as_str).collect();
        assert_eq!(light_kept, light_oldest);
        // Capacity frees: everything is planned again.
        let room = Capacity::from([("A100-80GB".to_string(), needed)]);
        let (again, _) = plan_within_limits(&inp, &rules, strategy, None, &|| false, Some(&room)).unwrap();
        assert!(again.infeasible.is_empty(), "{:?}", again.infeasible);
    }

    #[test]
    fn a_service_larger_than_its_tenants_share_runs_only_on_room_the_others_leave() {
        // "big" has one service larger than "small"'s six together; equal weights.
        let mut services = vec![service("big", 3000.0)];
        let names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        services.extend(names.iter().map(|n| service(n, 300.0)));
        let inp = input(services);
        let mut rules = ServiceRules::default();
        rules.boundaries.insert("big".into(), Boundary { tenant: "big".into(), isolation: Isolation::Mig });
        for n in &names {
            rules.boundaries.insert(n.clone(), Boundary { tenant: "small".into(), isolation: Isolation::Mig });
        }
        let strategy = super::super::MigStrategy::Parvagpu;
        let (all, _) = plan_within_limits(&inp, &rules, strategy, None, &|| false, None).unwrap();
        let needed = all.gpus.len() as u32;
        let usage = usage_by_service(&all, &inp.gpu_types);
        let (big, small): (f64, f64) = (usage["big"].gpus, names.iter().map(|n| usage[n].gpus).sum());
        // One GPU fewer than the plan needs: room for all of "small", not for "big" beside
        // it, and "big" alone is larger than its share (half of what the fleet holds).
        let held = needed - 1;
        let room = (big + small) * f64::from(held) / f64::from(needed);
        assert!(small <= room && big > room / 2.0, "big {big}, small {small}, room {room}: the premise");
        let short = Capacity::from([("A100-80GB".to_string(), held)]);
        let (plan, _) = plan_within_limits(&inp, &rules, strategy, None, &|| false, Some(&short)).unwrap();
        assert_eq!(plan.infeasible.iter().map(|f| f.service.as_str()).collect::<Vec<_>>(), ["big"], "{:?}", plan.infeasible);
        assert!(plan.infeasible[0].reason.to_string().contains("the other tenants leave"), "{}", plan.infeasible[0].reason);
        assert!(plan.gpus.len() as u32 <= held, "{} GPUs on a fleet of {held}", plan.gpus.len());
        // With room for it beside the others, it runs.
        let room = Capacity::from([("A100-80GB".to_string(), needed)]);
        let (plan, _) = plan_within_limits(&inp, &rules, strategy, None, &|| false, Some(&room)).unwrap();
        assert!(plan.infeasible.is_empty(), "{:?}", plan.infeasible);
        // A model the capacity does not list has no limit: no share.
        let unlimited = Capacity::new();
        assert!(over_fair_share(&all, &inp, &rules, &unlimited).is_empty());
        // One the fleet holds none of: everything on it is refused, as fleet full.
        let none = Capacity::from([("A100-80GB".to_string(), 0)]);
        let refused = over_fair_share(&all, &inp, &rules, &none);
        assert_eq!(refused.len(), 7, "{refused:?}");
        assert!(refused.iter().all(|f| matches!(f.reason, InfeasibleReason::FleetFull { .. })));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        #[test]
        fn no_plan_gives_a_tenant_more_than_its_quota(
            rates in proptest::collection::vec((1.0f64..3000.0, 0..3usize), 1..8),
            max_gpus in proptest::array::uniform3(0.05f64..2.0),
        ) {
            let inp = input(rates.iter().enumerate().map(|(i, (r, _))| service(&format!("s{i}"), *r)).collect());
            let mut rules = ServiceRules::default();
            for (i, (_, t)) in rates.iter().enumerate() {
                rules.boundaries.insert(format!("s{i}"), Boundary { tenant: format!("t{t}"), isolation: Isolation::Mig });
                rules.admitted.insert(format!("s{i}"), i as u64);
            }
            for (t, max) in max_gpus.iter().enumerate() {
                rules.quotas.insert(format!("t{t}"), Quota { max_gpus: Some(*max), max_cost_per_hour: None });
            }
            let (plan, _) = plan_within_limits(&inp, &rules, super::super::MigStrategy::Parvagpu, None, &|| false, None).unwrap();
            proptest::prop_assert_eq!(planner::invariants::check_invariants(&plan, &inp), Ok(()));
            let mut per_tenant: BTreeMap<String, f64> = BTreeMap::new();
            for (service, u) in usage_by_service(&plan, &inp.gpu_types) {
                *per_tenant.entry(rules.boundaries[&service].tenant.clone()).or_default() += u.gpus;
            }
            for (tenant, used) in per_tenant {
                let max = rules.quotas[&tenant].max_gpus.unwrap();
                proptest::prop_assert!(used <= max + 1e-6, "tenant {} uses {} GPUs over its quota {}", tenant, used, max);
            }
        }
    }
}
