//! A change to a committed Plan: the GPUs and service predictions that differ, not the
//! whole plan. The provisioner and the tuner propose patches, so the Raft bytes of a change
//! to one service are proportional to the GPUs it moves, not to the fleet.

use serde::{Deserialize, Serialize};

use super::{GpuAssignment, PlanSpec, ServicePrediction};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanPatch {
    pub strategy: String,
    #[serde(default)]
    pub inputs_digest: String,
    /// GPUs new to the plan or whose assignment changed.
    #[serde(default)]
    pub set_gpus: Vec<GpuAssignment>,
    /// GPUs (node, gpu_uuid) no longer in the plan.
    #[serde(default)]
    pub remove_gpus: Vec<(String, String)>,
    #[serde(default)]
    pub set_services: Vec<ServicePrediction>,
    #[serde(default)]
    pub remove_services: Vec<String>,
    /// Set when the entry is applied, as for a whole Plan (see `PlanSpec::trace_parent`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trace_parent: String,
}

/// Changes (GPUs set or removed, predictions set or removed) in one proposed patch. A bigger
/// plan change is committed as several patches in a row, so that no Raft entry grows with the
/// fleet: the first plan of a 10,000-host fleet is ~50 MB of JSON, which no AppendEntries
/// message can carry within its heartbeat-long timeout. 256 GPUs are ~300 KB.
pub const MAX_PATCH_CHANGES: usize = 256;

fn gpu_key(g: &GpuAssignment) -> (&str, &str) {
    (g.node.as_str(), g.gpu_uuid.as_str())
}

impl PlanPatch {
    /// Whether it changes no GPU and no prediction (its strategy, digest and trace aside:
    /// the same placement, whichever pass and inputs produced it).
    pub fn moves_nothing(&self) -> bool {
        self.set_gpus.is_empty() && self.remove_gpus.is_empty() && self.set_services.is_empty() && self.remove_services.is_empty()
    }

    /// The changes this patch makes.
    fn len(&self) -> usize {
        self.set_gpus.len() + self.remove_gpus.len() + self.set_services.len() + self.remove_services.len()
    }

    /// Splits it into patches of at most `max_changes` changes (at least one patch), which
    /// applied in order give what it gives. GPUs are set first (a service's new capacity
    /// arrives before its old goes), then removed, then the predictions change. Only the last
    /// part carries the inputs digest: a plan part-way through a change was planned from no
    /// inputs, so a provisioner that finds one (its proposer stopped half-way) plans again and
    /// patches the rest.
    pub fn split(self, max_changes: usize) -> Vec<PlanPatch> {
        let max_changes = max_changes.max(1);
        if self.len() <= max_changes {
            return vec![self];
        }
        let PlanPatch { strategy, inputs_digest, set_gpus, remove_gpus, set_services, remove_services, trace_parent: _ } = self;
        let empty = PlanPatch { strategy, ..PlanPatch::default() };
        let mut parts = vec![empty.clone()];
        fn room<'a>(parts: &'a mut Vec<PlanPatch>, empty: &PlanPatch, max_changes: usize) -> &'a mut PlanPatch {
            if parts.last().is_some_and(|p| p.len() >= max_changes) {
                parts.push(empty.clone());
            }
            parts.last_mut().expect("never empty")
        }
        for g in set_gpus {
            room(&mut parts, &empty, max_changes).set_gpus.push(g);
        }
        for g in remove_gpus {
            room(&mut parts, &empty, max_changes).remove_gpus.push(g);
        }
        for p in set_services {
            room(&mut parts, &empty, max_changes).set_services.push(p);
        }
        for s in remove_services {
            room(&mut parts, &empty, max_changes).remove_services.push(s);
        }
        parts.last_mut().expect("never empty").inputs_digest = inputs_digest;
        parts
    }

    /// The nodes whose GPUs it sets or removes.
    pub fn nodes(&self) -> std::collections::BTreeSet<&str> {
        self.set_gpus.iter().map(|g| g.node.as_str()).chain(self.remove_gpus.iter().map(|(n, _)| n.as_str())).collect()
    }
}

impl PlanSpec {
    /// Sorts the GPUs by (node, gpu_uuid) and the predictions by service, the order
    /// [`PlanSpec::apply_patch`] relies on.
    pub fn normalise(&mut self) {
        // A plan usually comes sorted (the provisioner's placement sorts it): checking is
        // one pass, while sorting a persistent vector costs a lookup per comparison.
        if !self.gpus.iter().is_sorted_by_key(gpu_key) {
            self.gpus.sort_by(|a, b| gpu_key(a).cmp(&gpu_key(b)));
        }
        if !self.services.iter().is_sorted_by_key(|s| s.service.as_str()) {
            self.services.sort_by(|a, b| a.service.cmp(&b.service));
        }
    }

    /// The patch that turns `self` into `next` (both normalised). O(both plans), once, by
    /// the proposer; never on the apply path.
    pub fn diff(&self, next: &PlanSpec) -> PlanPatch {
        let (mut set_gpus, mut remove_gpus) = (Vec::new(), Vec::new());
        merge(self.gpus.iter(), next.gpus.iter(), gpu_key, |old, new| match (old, new) {
            (Some(o), None) => remove_gpus.push((o.node.clone(), o.gpu_uuid.clone())),
            (old, Some(n)) if old != Some(n) => set_gpus.push(n.clone()),
            _ => {}
        });
        let (mut set_services, mut remove_services) = (Vec::new(), Vec::new());
        merge(
            self.services.iter(),
            next.services.iter(),
            |s| s.service.as_str(),
            |old, new| match (old, new) {
                (Some(o), None) => remove_services.push(o.service.clone()),
                (old, Some(n)) if old != Some(n) => set_services.push(n.clone()),
                _ => {}
            },
        );
        PlanPatch {
            strategy: next.strategy.clone(),
            inputs_digest: next.inputs_digest.clone(),
            set_gpus,
            remove_gpus,
            set_services,
            remove_services,
            trace_parent: String::new(),
        }
    }

    /// Applies `patch` to a normalised plan, keeping it normalised. O(k log n) for k changes.
    pub fn apply_patch(&mut self, patch: &PlanPatch) {
        self.strategy.clone_from(&patch.strategy);
        self.inputs_digest.clone_from(&patch.inputs_digest);
        self.trace_parent.clone_from(&patch.trace_parent);
        for (node, uuid) in &patch.remove_gpus {
            if let Ok(i) = self.gpus.binary_search_by(|g| gpu_key(g).cmp(&(node.as_str(), uuid.as_str()))) {
                self.gpus.remove(i);
            }
        }
        for g in &patch.set_gpus {
            match self.gpus.binary_search_by(|x| gpu_key(x).cmp(&gpu_key(g))) {
                Ok(i) => {
                    self.gpus.set(i, g.clone());
                }
                Err(i) => self.gpus.insert(i, g.clone()),
            }
        }
        for name in &patch.remove_services {
            if let Ok(i) = self.services.binary_search_by(|s| s.service.as_str().cmp(name)) {
                self.services.remove(i);
            }
        }
        for s in &patch.set_services {
            match self.services.binary_search_by(|x| x.service.cmp(&s.service)) {
                Ok(i) => {
                    self.services.set(i, s.clone());
                }
                Err(i) => self.services.insert(i, s.clone()),
            }
        }
    }

    /// The GPUs of `node` (in a normalised plan): O(log n + its GPUs).
    pub fn gpus_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a GpuAssignment> + 'a {
        let start =
            self.gpus.binary_search_by(|g| if g.node.as_str() < node { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater });
        let start = start.unwrap_or_else(|i| i);
        (start..self.gpus.len()).map(move |i| &self.gpus[i]).take_while(move |g| g.node == node)
    }
}

/// Walks two sorted sequences by key, calling `each(old, new)` for every key in either.
fn merge<'a, T: 'a, K: Ord + 'a>(
    old: impl Iterator<Item = &'a T>,
    new: impl Iterator<Item = &'a T>,
    key: impl Fn(&'a T) -> K,
    mut each: impl FnMut(Option<&'a T>, Option<&'a T>),
) {
    let (mut old, mut new) = (old.peekable(), new.peekable());
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => return,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(o), Some(n)) => key(o).cmp(&key(n)),
        };
        match order {
            std::cmp::Ordering::Less => each(old.next(), None),
            std::cmp::Ordering::Greater => each(None, new.next()),
            std::cmp::Ordering::Equal => each(old.next(), new.next()),
        }
    }
}

/// A GPU of `node` running one MPS workload of `service` at `batch` (for tests).
#[cfg(any(test, feature = "test-fixtures"))]
pub fn test_gpu(node: &str, uuid: &str, service: &str, batch: u32) -> GpuAssignment {
    GpuAssignment {
        node: node.into(),
        gpu_uuid: uuid.into(),
        mig_layout: vec![],
        workloads: vec![super::WorkloadAssignment {
            service: service.into(),
            mig_instance: None,
            mps_percent: 50.0,
            batch,
            processes: 1,
            shadow_mps_percent: 0.0,
            tenant: String::new(),
            isolation: crate::Isolation::default(),
            batch_ms: 0.0,
        }],
        retiring: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::test_gpu as gpu;
    use super::*;

    fn prediction(service: &str, capacity_rps: f64) -> ServicePrediction {
        ServicePrediction { service: service.into(), capacity_rps, latency_ms: 10.0, infeasible_reason: None }
    }

    fn plan(gpus: Vec<GpuAssignment>, services: Vec<ServicePrediction>) -> PlanSpec {
        let mut p = PlanSpec { strategy: "t".into(), gpus: gpus.into(), services: services.into(), ..PlanSpec::default() };
        p.normalise();
        p
    }

    #[test]
    fn a_patch_holds_only_what_changed_and_applying_it_gives_the_new_plan() {
        let old = plan(
            (0..100).map(|i| gpu(&format!("n{:03}", i / 4), &format!("G{i}"), "web", 8)).collect(),
            vec![prediction("web", 100.0), prediction("api", 50.0), prediction("gone", 1.0)],
        );
        let mut next = old.clone();
        next.gpus.set(5, gpu("n001", "G5", "api", 16));
        next.gpus.remove(40);
        next.gpus.push_back(gpu("n999", "G-new", "api", 8));
        next.services = vec![prediction("api", 60.0), prediction("new", 5.0), prediction("web", 100.0)].into();
        next.inputs_digest = "fnv1a64:2".into();
        next.normalise();

        let patch = old.diff(&next);
        assert_eq!(patch.set_gpus.iter().map(|g| g.gpu_uuid.as_str()).collect::<Vec<_>>(), vec!["G5", "G-new"]);
        assert_eq!(patch.remove_gpus.len(), 1);
        assert_eq!(patch.set_services.iter().map(|s| s.service.as_str()).collect::<Vec<_>>(), vec!["api", "new"]);
        assert_eq!(patch.remove_services, vec!["gone".to_string()]);
        assert_eq!(patch.nodes().into_iter().collect::<Vec<_>>(), vec!["n001", "n010", "n999"]);

        let mut patched = old.clone();
        patched.apply_patch(&patch);
        assert_eq!(patched, next);
        assert!(old.diff(&old).moves_nothing());
        // Another trace or another inputs digest is no move.
        let retraced = PlanSpec { trace_parent: "00-cc-dd-01".into(), inputs_digest: "fnv1a64:9".into(), ..old.clone() };
        assert!(old.diff(&retraced).moves_nothing());
        assert!(!old.diff(&next).moves_nothing());
    }

    #[test]
    fn normalising_sorts_a_plan_in_any_order_and_keeps_a_sorted_one() {
        let sorted = plan(
            vec![gpu("a", "G1", "web", 8), gpu("a", "G2", "web", 8), gpu("b", "G0", "api", 8)],
            vec![prediction("api", 1.0), prediction("web", 2.0)],
        );
        let mut shuffled = PlanSpec {
            gpus: sorted.gpus.iter().rev().cloned().collect(),
            services: sorted.services.iter().rev().cloned().collect(),
            ..sorted.clone()
        };
        assert_ne!(shuffled, sorted);
        shuffled.normalise();
        assert_eq!(shuffled, sorted);
        let mut again = sorted.clone();
        again.normalise();
        assert_eq!(again, sorted);
    }

    #[test]
    fn a_patch_for_one_gpu_of_a_fleet_sized_plan_is_the_size_of_that_gpu() {
        let old =
            plan((0..20_000).map(|i| gpu(&format!("n{:05}", i / 8), &format!("G{i}"), "web", 8)).collect(), vec![prediction("web", 1e5)]);
        let mut next = old.clone();
        next.gpus.set(12_345, gpu(&old.gpus[12_345].node, &old.gpus[12_345].gpu_uuid, "web", 16));
        let whole = serde_json::to_vec(&old).unwrap().len();
        let patch = serde_json::to_vec(&old.diff(&next)).unwrap().len();
        assert!(whole > 2_000_000, "{whole}");
        assert!(patch < 400, "the patch is {patch} bytes");
    }

    #[test]
    fn the_gpus_of_one_node_are_found_without_a_scan() {
        let p = plan(vec![gpu("b", "G2", "web", 8), gpu("a", "G1", "web", 8), gpu("b", "G3", "web", 8), gpu("c", "G4", "web", 8)], vec![]);
        let uuids = |n: &str| p.gpus_of(n).map(|g| g.gpu_uuid.clone()).collect::<Vec<_>>();
        assert_eq!(uuids("b"), vec!["G2", "G3"]);
        assert_eq!(uuids("a"), vec!["G1"]);
        assert!(uuids("zz").is_empty());
        assert!(uuids("").is_empty());
    }

    #[test]
    fn a_big_change_split_into_parts_applies_to_the_same_plan_and_only_the_last_part_claims_the_inputs() {
        let old = plan(
            (0..1_000).map(|i| gpu(&format!("n{:03}", i / 8), &format!("G{i}"), "web", 8)).collect(),
            (0..30).map(|i| prediction(&format!("s{i:02}"), 10.0)).collect(),
        );
        let mut next = plan(
            (300..1_700).map(|i| gpu(&format!("n{:03}", i / 8), &format!("G{i}"), "api", 8)).collect(),
            (10..50).map(|i| prediction(&format!("s{i:02}"), 20.0)).collect(),
        );
        next.inputs_digest = "fnv1a64:new".into();
        let patch = old.diff(&next);
        let parts = patch.clone().split(256);
        assert!(parts.len() > 1 && parts.iter().all(|p| p.len() <= 256), "{:?}", parts.iter().map(PlanPatch::len).collect::<Vec<_>>());
        assert_eq!(parts.iter().map(PlanPatch::len).sum::<usize>(), patch.len());
        assert!(parts[..parts.len() - 1].iter().all(|p| p.inputs_digest.is_empty() && p.strategy == next.strategy));
        assert_eq!(parts.last().unwrap().inputs_digest, "fnv1a64:new");
        // New GPUs arrive before old ones go.
        let first_removal = parts.iter().position(|p| !p.remove_gpus.is_empty()).unwrap();
        assert!(parts[..=first_removal].iter().map(|p| p.set_gpus.len()).sum::<usize>() == patch.set_gpus.len());

        let mut patched = old.clone();
        for (i, part) in parts.iter().enumerate() {
            patched.apply_patch(part);
            if i + 1 < parts.len() {
                assert!(patched.inputs_digest.is_empty(), "part {i} claims the inputs");
            }
        }
        assert_eq!(patched, next);

        // A small change stays whole; an empty one is still one (its strategy and digest).
        assert_eq!(old.diff(&next).split(100_000).len(), 1);
        assert_eq!(old.diff(&old).split(256).len(), 1);
    }
}
