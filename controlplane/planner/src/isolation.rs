//! Tenant isolation boundaries. The clients of one MPS server share a fault domain (a fatal
//! fault in one client kills every client of that server) and, on GPUs before Volta, memory
//! protection; MIG instances are isolated in hardware. So the unit of sharing is the MPS
//! server: one per MIG instance, or one for an MPS-only GPU as a whole. A tenant declares
//! how far its workloads may share:
//!
//! * `shared`: an MPS server with other `shared` tenants' workloads;
//! * `mig` (the default): a GPU with other tenants only through separate MIG instances,
//!   never an MPS server (an MPS-only GPU is then its own);
//! * `dedicated`: whole GPUs of its own.
//!
//! Strategies know nothing of tenants. They honour the boundaries by planning each
//! isolation [`Domain`] alone (its GPUs are its own): every `dedicated` tenant is a domain,
//! and so is every `mig` tenant under a strategy that puts several services under one MPS
//! server (iGniter); the rest share the pooled domain. [`check_isolation`] is the
//! invariant, for the tests of every strategy and for the node agent.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use crate::plan::Plan;

/// What a tenant's workloads may share with other tenants'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// An MPS server with other `shared` tenants.
    Shared,
    /// A GPU only through separate MIG instances.
    #[default]
    Mig,
    /// Nothing: whole GPUs of its own.
    Dedicated,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Shared => "shared",
            Isolation::Mig => "mig",
            Isolation::Dedicated => "dedicated",
        }
    }

    /// The inverse of [`Isolation::as_str`].
    pub fn parse(s: &str) -> Option<Isolation> {
        [Isolation::Shared, Isolation::Mig, Isolation::Dedicated].into_iter().find(|i| i.as_str() == s)
    }
}

/// A service's tenant and the isolation that tenant declared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Boundary {
    pub tenant: String,
    pub isolation: Isolation,
}

/// Per service name, its boundary. A service absent from it belongs to no tenant and is
/// pooled (the planner's own benchmarks and tests).
pub type Boundaries = BTreeMap<String, Boundary>;

/// A set of services planned together, on GPUs no other domain uses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Domain {
    Pooled,
    Tenant(String),
}

impl Boundary {
    /// The domain of a service of this boundary under a strategy that may put several
    /// services under one MPS server (`shares_mps_servers`) or never does.
    pub fn domain(&self, shares_mps_servers: bool) -> Domain {
        match self.isolation {
            Isolation::Shared => Domain::Pooled,
            Isolation::Mig if !shares_mps_servers => Domain::Pooled,
            Isolation::Mig | Isolation::Dedicated => Domain::Tenant(self.tenant.clone()),
        }
    }
}

/// The domain of service `name` (pooled when it has no boundary).
pub fn domain_of(boundaries: &Boundaries, name: &str, shares_mps_servers: bool) -> Domain {
    boundaries.get(name).map_or(Domain::Pooled, |b| b.domain(shares_mps_servers))
}

/// Checks that `plan` keeps every boundary: no MPS server holds the workloads of two tenants
/// unless both are `shared`, and no GPU holding a `dedicated` tenant's workload holds
/// another tenant's. Services without a boundary are not checked. The error names the GPU
/// slot, the server and the tenants.
pub fn check_isolation(plan: &Plan, boundaries: &Boundaries) -> Result<(), String> {
    for g in &plan.gpus {
        let held = g.workloads.iter().filter_map(|w| Some((w.mig_instance, boundaries.get(&w.service)?)));
        let server =
            |instance: &Option<usize>| instance.map_or("the GPU's MPS server".to_string(), |k| format!("MIG instance {k}'s MPS server"));
        check_gpu(held, server).map_err(|e| format!("GPU slot {}: {e}", g.slot))?;
    }
    Ok(())
}

/// The rules on one GPU whose workloads are given as (MPS server, boundary): by MIG
/// instance, or the whole GPU. `server` names a server for the error. Shared with the node
/// agent, which checks every desired state it is sent.
pub fn check_gpu<'a, K: Ord>(workloads: impl IntoIterator<Item = (K, &'a Boundary)>, server: impl Fn(&K) -> String) -> Result<(), String> {
    let mut servers: BTreeMap<K, BTreeSet<&Boundary>> = BTreeMap::new();
    for (k, b) in workloads {
        servers.entry(k).or_default().insert(b);
    }
    let on_gpu: BTreeSet<&str> = servers.values().flatten().map(|b| b.tenant.as_str()).collect();
    for (k, held) in &servers {
        let tenants: BTreeSet<&str> = held.iter().map(|b| b.tenant.as_str()).collect();
        if let Some(b) = held.iter().find(|b| b.isolation == Isolation::Dedicated && on_gpu.len() > 1) {
            return Err(format!("dedicated tenant {:?} shares the GPU with tenants {on_gpu:?}", b.tenant));
        }
        if let Some(b) = held.iter().find(|b| b.isolation != Isolation::Shared && tenants.len() > 1) {
            return Err(format!("{} holds tenants {tenants:?}, and {:?} is {}", server(k), b.tenant, b.isolation.as_str()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::MigProfile;
    use crate::plan::tests::workload;
    use crate::plan::{GpuPlan, MigInstance, Sharing, Workload};

    fn plan_of(gpus: Vec<(Sharing, Vec<Workload>)>) -> Plan {
        Plan {
            strategy: "test".into(),
            gpus: gpus
                .into_iter()
                .enumerate()
                .map(|(i, (sharing, workloads))| GpuPlan { slot: i as u32, gpu_type: "t".into(), sharing, workloads })
                .collect(),
            predictions: vec![],
            infeasible: vec![],
        }
    }

    fn two_instances() -> Sharing {
        let i = |start| MigInstance { profile: MigProfile::G3, start };
        Sharing::Mig { instances: vec![i(0), i(4)] }
    }

    fn boundaries(of: &[(&str, &str, Isolation)]) -> Boundaries {
        of.iter().map(|(s, t, i)| (s.to_string(), Boundary { tenant: t.to_string(), isolation: *i })).collect()
    }

    #[test]
    fn only_shared_tenants_share_an_mps_server() {
        let one_server = plan_of(vec![(Sharing::MpsOnly, vec![workload("a", None), workload("b", None)])]);
        let shared = boundaries(&[("a", "t1", Isolation::Shared), ("b", "t2", Isolation::Shared)]);
        assert_eq!(check_isolation(&one_server, &shared), Ok(()));
        let mig = boundaries(&[("a", "t1", Isolation::Shared), ("b", "t2", Isolation::Mig)]);
        let err = check_isolation(&one_server, &mig).unwrap_err();
        assert!(err.contains("GPU slot 0: the GPU's MPS server holds tenants {\"t1\", \"t2\"}, and \"t2\" is mig"), "{err}");
        // One tenant's own services may share its server, whatever its isolation.
        let same = boundaries(&[("a", "t1", Isolation::Mig), ("b", "t1", Isolation::Mig)]);
        assert_eq!(check_isolation(&one_server, &same), Ok(()));
    }

    #[test]
    fn mig_tenants_share_a_gpu_through_separate_instances_and_dedicated_ones_do_not() {
        let apart = plan_of(vec![(two_instances(), vec![workload("a", Some(0)), workload("b", Some(1))])]);
        let mig = boundaries(&[("a", "t1", Isolation::Mig), ("b", "t2", Isolation::Mig)]);
        assert_eq!(check_isolation(&apart, &mig), Ok(()));
        let together = plan_of(vec![(two_instances(), vec![workload("a", Some(0)), workload("b", Some(0))])]);
        assert!(check_isolation(&together, &mig).unwrap_err().contains("MIG instance 0's MPS server"));

        let dedicated = boundaries(&[("a", "t1", Isolation::Dedicated), ("b", "t2", Isolation::Shared)]);
        let err = check_isolation(&apart, &dedicated).unwrap_err();
        assert!(err.contains("dedicated tenant \"t1\" shares the GPU"), "{err}");
        let own = boundaries(&[("a", "t1", Isolation::Dedicated), ("b", "t1", Isolation::Dedicated)]);
        assert_eq!(check_isolation(&together, &own), Ok(()));
    }

    #[test]
    fn domains_separate_what_a_strategy_could_put_under_one_server() {
        let b = |isolation| Boundary { tenant: "t1".into(), isolation };
        assert_eq!(b(Isolation::Shared).domain(true), Domain::Pooled);
        assert_eq!(b(Isolation::Mig).domain(false), Domain::Pooled, "one service per MPS server: no two tenants meet in one");
        assert_eq!(b(Isolation::Mig).domain(true), Domain::Tenant("t1".into()));
        assert_eq!(b(Isolation::Dedicated).domain(false), Domain::Tenant("t1".into()));
        assert_eq!(domain_of(&Boundaries::new(), "no-tenant", true), Domain::Pooled);
        for i in [Isolation::Shared, Isolation::Mig, Isolation::Dedicated] {
            assert_eq!(Isolation::parse(i.as_str()), Some(i));
        }
        assert_eq!(Isolation::parse("none"), None);
    }
}
