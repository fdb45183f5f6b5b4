//! What the committed plan gives each tenant and service: GPUs-worth (a MIG instance's
//! GPCs / 7 of its GPU, or an MPS workload's share of the GPU with its shadow's reserve)
//! and cost per hour (that share of its GPU model's price per GPU-hour, `provision::gpu_price`,
//! the price the planner and the quotas count, so usage and quota compare like with like),
//! and how many of their services' SLO windows the agents reported met. The leader writes it
//! per tenant into the Tenant's status (`loops::metering`), where a tenant reads its own and
//! no other's. Pure but for [`SloTally`], the leader's count between two writes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::resources::{GpuAssignment, Kind, PlanSpec, SloCount, Spec, TenantStatus, WorkloadAssignment};
use crate::state::ClusterState;

/// What a tenant or a service occupies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Occupied {
    /// GPUs-worth: `mig_gpcs / 7 + mps_gpus`.
    pub gpus: f64,
    pub cost_per_hour: f64,
    /// Of which in MIG instances: the instances' GPCs, times the MPS share of each the
    /// workload takes (a whole 3g instance is 3).
    pub mig_gpcs: f64,
    /// Of which MPS shares of GPUs used whole (no MIG), in GPUs.
    pub mps_gpus: f64,
}

impl Occupied {
    fn add(&mut self, gpus: f64, price: f64, in_mig_instance: bool) {
        self.gpus += gpus;
        self.cost_per_hour += gpus * price;
        if in_mig_instance {
            self.mig_gpcs += gpus * f64::from(planner::mig::COMPUTE_SLICES);
        } else {
            self.mps_gpus += gpus;
        }
    }

    fn plus(self, o: Occupied) -> Occupied {
        Occupied {
            gpus: self.gpus + o.gpus,
            cost_per_hour: self.cost_per_hour + o.cost_per_hour,
            mig_gpcs: self.mig_gpcs + o.mig_gpcs,
            mps_gpus: self.mps_gpus + o.mps_gpus,
        }
    }
}

/// Compute slices of a MIG profile, from its name (`3g`, `1g.10gb`, `1g.2m`).
pub fn profile_gpcs(profile: &str) -> u32 {
    profile.split('g').next().and_then(|d| d.parse().ok()).unwrap_or(1)
}

/// The share of its GPU `w` occupies (1.0 is the whole GPU).
pub fn occupancy(g: &GpuAssignment, w: &WorkloadAssignment) -> f64 {
    let gpcs = w.mig_instance.map(|k| g.mig_layout.get(k).map_or(0, |i| profile_gpcs(&i.profile)));
    planner::plan::occupied_share(gpcs, w.mps_percent, w.processes, w.shadow_mps_percent)
}

/// Per (tenant, service) (workloads without a tenant under ""), what the plan gives it;
/// `price_of_gpu` is a planned GPU's price per hour.
pub fn by_service(plan: &PlanSpec, price_of_gpu: impl Fn(&GpuAssignment) -> f64) -> BTreeMap<(String, String), Occupied> {
    let mut out: BTreeMap<(&str, &str), Occupied> = BTreeMap::new();
    for g in &plan.gpus {
        let price = price_of_gpu(g);
        for w in &g.workloads {
            out.entry((w.tenant.as_str(), w.service.as_str())).or_default().add(occupancy(g, w), price, w.mig_instance.is_some());
        }
    }
    out.into_iter().map(|((t, s), o)| ((t.to_string(), s.to_string()), o)).collect()
}

/// Per tenant, the sum of [`by_service`].
pub fn by_tenant(plan: &PlanSpec, price_of_gpu: impl Fn(&GpuAssignment) -> f64) -> BTreeMap<String, Occupied> {
    tenants_of(&by_service(plan, price_of_gpu))
}

fn tenants_of(services: &BTreeMap<(String, String), Occupied>) -> BTreeMap<String, Occupied> {
    let mut out: BTreeMap<String, Occupied> = BTreeMap::new();
    for ((tenant, _), o) in services {
        let t = out.entry(tenant.clone()).or_default();
        *t = t.plus(*o);
    }
    out
}

/// A planned GPU's price per hour in `cluster`: its model's (`provision::gpu_price`), the
/// model read from its node's spec; 0 for a GPU whose node, or model's price, is gone.
pub fn gpu_prices(cluster: &ClusterState) -> impl Fn(&GpuAssignment) -> f64 + '_ {
    let per_model: BTreeMap<&str, f64> =
        cluster.list(Kind::GpuModel).filter_map(|m| Some((m.name.as_str(), crate::provision::gpu_price(cluster, &m.name)?))).collect();
    move |g: &GpuAssignment| {
        let Some(Spec::Node(node)) = cluster.get(Kind::Node, &g.node).map(|n| &n.spec) else { return 0.0 };
        let model = node.gpus.iter().find(|d| d.uuid == g.gpu_uuid).map(|d| d.model.as_str());
        model.and_then(|m| per_model.get(m)).copied().unwrap_or(0.0)
    }
}

/// Rounds away the last bits a sum in another order would change, so that an unchanged plan
/// rewrites no status.
fn rounded(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The statuses to write: for each of `tenants` (name, as stored), its usage and services
/// in `services_usage` (what the plan gives each service, [`by_service`]), and its stored
/// SLO count plus `tally`'s, where that differs from what is stored.
pub fn changed_statuses(
    tenants: &[(String, TenantStatus)],
    services_usage: &BTreeMap<(String, String), Occupied>,
    tally: &BTreeMap<String, SloCount>,
) -> Vec<(String, TenantStatus)> {
    let usage = tenants_of(services_usage);
    let mut services: BTreeMap<&str, u32> = BTreeMap::new();
    for (tenant, _) in services_usage.keys() {
        *services.entry(tenant.as_str()).or_default() += 1;
    }
    tenants
        .iter()
        .filter_map(|(name, stored)| {
            let used = usage.get(name).copied().unwrap_or_default();
            let next = TenantStatus {
                gpus: rounded(used.gpus),
                cost_per_hour: rounded(used.cost_per_hour),
                mig_gpcs: rounded(used.mig_gpcs),
                mps_gpus: rounded(used.mps_gpus),
                services_planned: services.get(name.as_str()).copied().unwrap_or(0),
                slo: stored.slo.plus(tally.get(name).copied().unwrap_or_default()),
            };
            (next != *stored).then(|| (name.clone(), next))
        })
        .collect()
}

/// The SLO windows the leader counted since its last status write, per tenant. Bounded by
/// the tenants the plan names (the report check keeps only windows of placed services).
#[derive(Clone, Default)]
pub struct SloTally(Arc<Mutex<BTreeMap<String, SloCount>>>);

impl SloTally {
    pub fn add(&self, tenant: &str, met: bool) {
        if tenant.is_empty() {
            return;
        }
        let mut counts = self.0.lock().expect("slo tally lock");
        let c = counts.entry(tenant.to_string()).or_default();
        *c = c.plus(SloCount { windows: 1, met: u64::from(met) });
    }

    /// What was counted, leaving nothing.
    pub fn take(&self) -> BTreeMap<String, SloCount> {
        std::mem::take(&mut *self.0.lock().expect("slo tally lock"))
    }

    /// Counts whose write failed, to be written with the next.
    pub fn give_back(&self, counts: BTreeMap<String, SloCount>) {
        let mut mine = self.0.lock().expect("slo tally lock");
        for (tenant, c) in counts {
            let m = mine.entry(tenant).or_default();
            *m = m.plus(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Isolation, MigPlacement};

    fn workload(service: &str, tenant: &str, mig_instance: Option<usize>, mps_percent: f64, shadow: f64) -> WorkloadAssignment {
        WorkloadAssignment {
            service: service.into(),
            mig_instance,
            mps_percent,
            batch: 8,
            processes: 1,
            shadow_mps_percent: shadow,
            tenant: tenant.into(),
            isolation: Isolation::default(),
            batch_ms: 0.0,
        }
    }

    /// acme: a 3g instance of an A100; globex: a 1g instance beside it and 40% of a T4
    /// with a 10% shadow.
    fn two_tenants_plan() -> PlanSpec {
        let mig = GpuAssignment {
            node: "a100".into(),
            gpu_uuid: "GPU-0".into(),
            mig_layout: vec![MigPlacement { profile: "3g".into(), start: 0 }, MigPlacement { profile: "1g.10gb".into(), start: 4 }],
            workloads: vec![workload("web", "acme", Some(0), 100.0, 0.0), workload("api", "globex", Some(1), 100.0, 0.0)],
            retiring: vec![],
        };
        let mps = GpuAssignment {
            node: "t4".into(),
            gpu_uuid: "GPU-1".into(),
            mig_layout: vec![],
            workloads: vec![workload("ocr", "globex", None, 40.0, 10.0)],
            retiring: vec![],
        };
        PlanSpec {
            strategy: "test".into(),
            gpus: vec![mig, mps].into(),
            services: Default::default(),
            inputs_digest: String::new(),
            trace_parent: String::new(),
        }
    }

    fn price(g: &GpuAssignment) -> f64 {
        if g.node == "a100" {
            7.0
        } else {
            1.0
        }
    }

    #[test]
    fn tenants_are_charged_their_instances_and_shares_at_their_gpus_prices() {
        let plan = two_tenants_plan();
        let usage = by_tenant(&plan, price);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(usage["acme"].gpus, 3.0 / 7.0) && close(usage["acme"].cost_per_hour, 3.0), "{usage:?}");
        assert!(close(usage["globex"].gpus, 1.0 / 7.0 + 0.5), "{usage:?}");
        assert!(close(usage["globex"].cost_per_hour, 1.0 + 0.5), "{usage:?}");
        // Split into MIG GPCs and MPS shares of whole GPUs.
        assert!(close(usage["acme"].mig_gpcs, 3.0) && close(usage["acme"].mps_gpus, 0.0), "{usage:?}");
        assert!(close(usage["globex"].mig_gpcs, 1.0) && close(usage["globex"].mps_gpus, 0.5), "{usage:?}");
    }

    #[test]
    fn a_status_is_rewritten_only_when_the_usage_or_the_slo_count_moved() {
        let plan = two_tenants_plan();
        let stored =
            |slo: SloCount| TenantStatus { gpus: 0.428571, cost_per_hour: 3.0, mig_gpcs: 3.0, mps_gpus: 0.0, services_planned: 1, slo };
        let tenants = vec![
            ("acme".to_string(), stored(SloCount { windows: 10, met: 9 })),
            ("globex".to_string(), TenantStatus::default()),
            ("initech".to_string(), TenantStatus::default()),
        ];
        // acme's usage is as stored and no window came: only globex changes (initech has
        // nothing in the plan, as stored).
        let usage = by_service(&plan, price);
        let changed = changed_statuses(&tenants, &usage, &BTreeMap::new());
        assert_eq!(changed.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["globex"]);
        let globex = &changed[0].1;
        assert_eq!(
            (globex.gpus, globex.cost_per_hour, globex.mig_gpcs, globex.mps_gpus, globex.services_planned),
            (0.642857, 1.5, 1.0, 0.5, 2)
        );

        // Windows counted since add to the stored count, carried from leader to leader.
        let tally = SloTally::default();
        tally.add("acme", true);
        tally.add("acme", false);
        tally.add("", true);
        let counted = tally.take();
        assert!(tally.take().is_empty(), "taken");
        let changed = changed_statuses(&tenants[..1], &usage, &counted);
        assert_eq!(changed, [("acme".to_string(), stored(SloCount { windows: 12, met: 10 }))]);
        // A failed write gives its counts back for the next.
        tally.give_back(counted);
        tally.add("acme", true);
        assert_eq!(tally.take()["acme"], SloCount { windows: 3, met: 2 });

        // Without a plan a tenant uses nothing.
        let changed = changed_statuses(&tenants[..1], &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(
            changed,
            [("acme".to_string(), TenantStatus { services_planned: 0, slo: SloCount { windows: 10, met: 9 }, ..TenantStatus::default() })]
        );
    }
}
