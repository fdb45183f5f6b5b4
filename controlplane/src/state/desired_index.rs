//! Per node, what the committed Plans place on it and the log index at which that last
//! changed: the desired-state index the agent API serves from. Maintained by `apply`, so a
//! watcher or a report reads one node's entry instead of scanning the plan, and a plan
//! commit tells exactly which nodes it changed.
//!
//! A node's version is the index of the last entry that changed its projection (its GPU
//! assignments in any Plan, or the model or SLO of a Service it runs). It is part of the
//! replicated state (snapshots carry it), so every controller gives an agent the same
//! version for the same content, and it never goes down.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::resources::{GpuAssignment, PlanPatch, PlanSpec, ServiceSpec, Spec, StoredResource};

/// One node's GPU assignments, per Plan name (each shared, so that a change to one plan's
/// copies the others' as pointers).
type NodePlans = BTreeMap<String, Arc<Vec<GpuAssignment>>>;

#[derive(Clone, Debug, Default)]
pub struct DesiredIndex {
    /// node -> index of the entry that last changed its projection. Persisted (a persistent
    /// map, copied in O(1) by a snapshot).
    versions: imbl::OrdMap<String, u64>,
    /// node -> plan name -> that plan's GPU assignments on the node. Derived. Persistent
    /// maps, like the rest of the state: `apply` works on a copy taken in O(1) and swaps it
    /// in, so readers never wait for an entry being applied. A node's entry is shared
    /// (`Arc`): a change copies the map's path to it, and the siblings on that path are
    /// copied as pointers, not as their nodes' assignments (at 10,000 hosts, deep copies of
    /// siblings were most of applying a plan's parts).
    by_node: imbl::HashMap<String, Arc<NodePlans>>,
    /// service -> the nodes with a workload of it. Derived.
    by_service: imbl::HashMap<String, imbl::OrdSet<String>>,
    /// Nodes whose projection changed since the last `take_touched`. Local, not state.
    touched: BTreeSet<String>,
}

/// Only the versions are state; the rest is rebuilt from the resources.
impl PartialEq for DesiredIndex {
    fn eq(&self, other: &Self) -> bool {
        self.versions == other.versions
    }
}

impl Serialize for DesiredIndex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.versions.serialize(s)
    }
}

impl DesiredIndex {
    /// The index over `plans`, with the persisted `versions`. A node with assignments but no
    /// version (a snapshot from before versions were kept) gets its plan's revision.
    pub fn rebuild<'a>(versions: imbl::OrdMap<String, u64>, plans: impl Iterator<Item = &'a StoredResource>) -> Self {
        let mut index = DesiredIndex { versions, ..DesiredIndex::default() };
        for plan in plans {
            let Spec::Plan(spec) = &plan.spec else { continue };
            for (node, gpus) in group_by_node(spec) {
                index.versions.entry(node.to_string()).or_insert(plan.mod_revision);
                index.set(node, &plan.name, gpus.into_iter().cloned().collect());
            }
        }
        index.touched.clear();
        index
    }

    /// Every node's version (what snapshots persist).
    pub fn versions(&self) -> &imbl::OrdMap<String, u64> {
        &self.versions
    }

    pub fn version(&self, node: &str) -> u64 {
        self.versions.get(node).copied().unwrap_or(0)
    }

    /// The node's GPU assignments, per Plan name.
    pub fn assignments(&self, node: &str) -> impl Iterator<Item = (&str, &GpuAssignment)> {
        self.by_node
            .get(node)
            .into_iter()
            .flat_map(|plans| plans.iter())
            .flat_map(|(plan, gpus)| gpus.iter().map(move |g| (plan.as_str(), g)))
    }

    /// The nodes whose projection changed since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// Resource `name` changed from `old` to `new` at `index`; only Plans and Services matter.
    pub fn spec_changed(&mut self, index: u64, name: &str, old: Option<&Spec>, new: Option<&Spec>) {
        if as_plan(old).is_some() || as_plan(new).is_some() {
            self.plan_changed(index, name, as_plan(old), as_plan(new));
        }
        if as_service(old).is_some() || as_service(new).is_some() {
            self.service_changed(index, name, as_service(old), as_service(new));
        }
    }

    /// Plan `name` changed from `old` to `new` at `index` (either absent: created or deleted).
    /// O(size of both plans); only nodes whose assignments differ get a new version.
    pub fn plan_changed(&mut self, index: u64, name: &str, old: Option<&PlanSpec>, new: Option<&PlanSpec>) {
        let old_nodes: BTreeSet<&str> = old.into_iter().flat_map(|p| p.gpus.iter().map(|g| g.node.as_str())).collect();
        let mut new_by_node = new.map(group_by_node).unwrap_or_default();
        let nodes: BTreeSet<&str> = old_nodes.iter().copied().chain(new_by_node.keys().copied()).collect();
        for node in nodes {
            let wanted = new_by_node.remove(node).unwrap_or_default();
            let held = self.by_node.get(node).and_then(|plans| plans.get(name));
            if held.map_or(wanted.is_empty(), |h| h.iter().eq(wanted.iter().copied())) {
                continue;
            }
            self.set(node, name, wanted.into_iter().cloned().collect());
            self.bump(node, index);
        }
    }

    /// Plan `name` (now `plan`) was patched at `index`: only the nodes the patch names are
    /// looked at, O(their GPUs × log n).
    pub fn plan_patched(&mut self, index: u64, name: &str, plan: &PlanSpec, patch: &PlanPatch) {
        for node in patch.nodes() {
            let held = self.by_node.get(node).and_then(|plans| plans.get(name));
            if held.map_or(plan.gpus_of(node).next().is_none(), |h| h.iter().eq(plan.gpus_of(node))) {
                continue;
            }
            let wanted = plan.gpus_of(node).cloned().collect();
            self.set(node, name, wanted);
            self.bump(node, index);
        }
    }

    /// A Service changed: its nodes get a new version if what agents are told about it (the
    /// model, the SLO, the callers its endpoints accept, its runtime and model location) changed, or it was deleted. Without
    /// the callers, a token removed from a Service kept working until the plan next changed.
    pub fn service_changed(&mut self, index: u64, name: &str, old: Option<&ServiceSpec>, new: Option<&ServiceSpec>) {
        let same = match (old, new) {
            (Some(a), Some(b)) => {
                a.model == b.model
                    && a.slo.latency_ms.to_bits() == b.slo.latency_ms.to_bits()
                    && a.inference_tokens == b.inference_tokens
                    && a.runtime == b.runtime
                    && a.model_uri == b.model_uri
            }
            _ => false,
        };
        if same {
            return;
        }
        let nodes: Vec<String> = self.by_service.get(name).into_iter().flatten().cloned().collect();
        for node in nodes {
            self.bump(&node, index);
        }
    }

    fn bump(&mut self, node: &str, index: u64) {
        self.versions.insert(node.to_string(), index);
        self.touched.insert(node.to_string());
    }

    /// Replaces plan `plan`'s assignments on `node`, keeping `by_service` in step.
    fn set(&mut self, node: &str, plan: &str, gpus: Vec<GpuAssignment>) {
        let before = self.services_of(node);
        let mut plans: NodePlans = self.by_node.get(node).map(|p| NodePlans::clone(p)).unwrap_or_default();
        if gpus.is_empty() {
            plans.remove(plan);
        } else {
            plans.insert(plan.to_string(), Arc::new(gpus));
        }
        if plans.is_empty() {
            self.by_node.remove(node);
        } else {
            self.by_node.insert(node.to_string(), Arc::new(plans));
        }
        let after = self.services_of(node);
        for gone in before.difference(&after) {
            if let Some(nodes) = self.by_service.get_mut(gone) {
                nodes.remove(node);
                if nodes.is_empty() {
                    self.by_service.remove(gone);
                }
            }
        }
        for added in after.difference(&before) {
            self.by_service.entry(added.clone()).or_default().insert(node.to_string());
        }
    }

    fn services_of(&self, node: &str) -> BTreeSet<String> {
        self.assignments(node).flat_map(|(_, g)| g.workloads.iter().map(|w| w.service.clone())).collect()
    }
}

fn group_by_node(plan: &PlanSpec) -> BTreeMap<&str, Vec<&GpuAssignment>> {
    let mut out: BTreeMap<&str, Vec<&GpuAssignment>> = BTreeMap::new();
    for g in &plan.gpus {
        out.entry(g.node.as_str()).or_default().push(g);
    }
    out
}

fn as_plan(spec: Option<&Spec>) -> Option<&PlanSpec> {
    match spec {
        Some(Spec::Plan(p)) => Some(p),
        _ => None,
    }
}

fn as_service(spec: Option<&Spec>) -> Option<&ServiceSpec> {
    match spec {
        Some(Spec::Service(s)) => Some(s),
        _ => None,
    }
}
