//! Projection of the committed Plans onto one node: the GPUs of that node and what runs on
//! them. Pure: the same applied state gives the same answer on every controller.

use std::collections::{BTreeMap, BTreeSet};

use crate::resources::{Kind, ServiceSpec, Spec};
use crate::state::ClusterState;

/// The desired state of `node`: every GPU assignment naming it, across all Plans, with each
/// workload's model and SLO taken from its Service. `version` is the index of the entry that
/// last changed this projection (`state::DesiredIndex`), so equal versions mean equal
/// content. O(the node's GPUs): read from the index, never by scanning a plan.
pub fn desired_state(cluster: &ClusterState, node: &str) -> proto::DesiredState {
    let index = cluster.desired();
    let mut gpus = Vec::new();
    // The trace of the write that committed the newest plan with work here, for the agent's
    // reconcile.
    let mut newest_plan = 0;
    let mut trace_parent = String::new();
    let mut runtimes = BTreeSet::new();
    for (plan_name, g) in index.assignments(node) {
        if let Some(plan) = cluster.get(Kind::Plan, plan_name) {
            if let (true, Spec::Plan(spec)) = (plan.mod_revision > newest_plan, &plan.spec) {
                newest_plan = plan.mod_revision;
                trace_parent.clone_from(&spec.trace_parent);
            }
        }
        let listed = g.workloads.iter().map(|w| (w, false));
        let workloads = listed
            .chain(g.retiring.iter().map(|w| (w, true)))
            .map(|(w, retiring)| {
                let service = service_spec(cluster, &w.service);
                let (model, slo_ms, inference_tokens) =
                    service.map_or((String::new(), 0.0, Vec::new()), |s| (s.model.clone(), s.slo.latency_ms, s.inference_tokens.clone()));
                let runtime = service.and_then(|s| s.runtime.clone()).unwrap_or_default();
                if !runtime.is_empty() {
                    runtimes.insert(runtime.clone());
                }
                proto::AgentWorkload {
                    service: w.service.clone(),
                    model,
                    mig_instance: w.mig_instance.and_then(|i| i32::try_from(i).ok()).unwrap_or(-1),
                    mps_percent: w.mps_percent,
                    batch: w.batch,
                    processes: w.processes,
                    shadow_mps_percent: w.shadow_mps_percent,
                    slo_ms,
                    tenant: w.tenant.clone(),
                    isolation: if w.tenant.is_empty() { String::new() } else { w.isolation.as_str().to_string() },
                    batch_ms: w.batch_ms,
                    inference_tokens,
                    runtime,
                    model_uri: service.and_then(|s| s.model_uri.clone()).unwrap_or_default(),
                    retiring,
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
    gpus.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
    // A Service names only a runtime that exists, and a runtime in use can neither change
    // nor go (`state::references`), so the node's version covers what is sent here.
    let runtimes = runtimes
        .into_iter()
        .filter_map(|name| match cluster.get(Kind::ServingRuntime, &name).map(|r| &r.spec) {
            Some(spec @ Spec::ServingRuntime(_)) => Some(proto::AgentRuntime { name, spec_json: spec.to_json() }),
            _ => None,
        })
        .collect();
    proto::DesiredState { node: node.to_string(), version: index.version(node), gpus, trace_parent, runtimes }
}

/// What the committed plans place on one node, as a report is checked against it: the
/// node's version and each service with a workload there. Borrowed from the applied state,
/// O(the node's GPUs): a report is checked without building the desired state it would be
/// sent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Placement<'a> {
    pub version: u64,
    pub services: BTreeMap<&'a str, Placed<'a>>,
}

/// A service placed on the node: its tenant, and its SLO as agents are told it (0 for a
/// deleted Service, as in [`desired_state`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed<'a> {
    pub tenant: &'a str,
    pub slo_ms: f64,
}

/// The placement of `node` (see [`Placement`]); it names the same services, tenants and SLOs
/// as [`desired_state`] does.
pub fn placement<'a>(cluster: &'a ClusterState, node: &str) -> Placement<'a> {
    // A node runs dozens of workloads of a few services: each service's spec is looked up
    // once (a lookup per workload was half of checking a report, perf at 10,000 hosts).
    let mut services = BTreeMap::new();
    for w in cluster.desired().assignments(node).flat_map(|(_, g)| g.workloads.iter().chain(&g.retiring)) {
        services.entry(w.service.as_str()).or_insert_with(|| {
            let slo_ms = service_spec(cluster, &w.service).map_or(0.0, |s| s.slo.latency_ms);
            Placed { tenant: w.tenant.as_str(), slo_ms }
        });
    }
    Placement { version: cluster.desired().version(node), services }
}

/// What one desired-state watch has sent. Versions only go up, on every controller alike:
/// a state is sent when it is newer than what the agent holds (`from_version` when it
/// resumes from another controller). A watch from 0 always gets the current state first,
/// even an empty one at version 0, and never the same version twice.
#[derive(Debug)]
pub struct SentVersions {
    last: u64,
    first: bool,
}

impl From<u64> for SentVersions {
    fn from(from_version: u64) -> Self {
        SentVersions { last: from_version, first: from_version == 0 }
    }
}

impl SentVersions {
    /// Whether the state at `version` is to be sent; if so, it counts as sent.
    pub fn is_new(&mut self, version: u64) -> bool {
        let new = std::mem::take(&mut self.first) || version > self.last;
        if new {
            self.last = version;
        }
        new
    }
}

/// The spec of Service `name`. A deleted Service leaves its workloads in a Plan until the
/// provisioner re-plans; the agent still needs a model name to keep them running, so it gets
/// an empty one (and an SLO of 0) and keeps what runs.
fn service_spec<'a>(cluster: &'a ClusterState, name: &str) -> Option<&'a ServiceSpec> {
    match cluster.get(Kind::Service, name).map(|s| &s.spec) {
        Some(Spec::Service(s)) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::{plan, put, seeded, service};
    use crate::state::WriteMode;

    /// A report is checked against `placement`, the agent is sent `desired_state`: both must
    /// name the same services, with the same tenants and SLOs, at the same version.
    #[test]
    fn a_nodes_placement_names_what_its_desired_state_carries() {
        let (mut s, _) = seeded();
        s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
        s.apply(11, &put("s2", "api", "acme", service("resnet50", 30.0), WriteMode::Create, 0)).0.unwrap();
        let mut two = plan(&[("n1", "G1", "web", 8), ("n1", "G2", "api", 8), ("n2", "G3", "web", 8)]);
        if let Spec::Plan(p) = &mut two {
            p.gpus[1].workloads[0].tenant = "acme".into();
        }
        s.apply(20, &put("p1", "current", "", two, WriteMode::Upsert, 0)).0.unwrap();
        // A deleted Service keeps its workloads in the plan until the next pass: an SLO of 0.
        let delete = crate::state::Request {
            request_id: "d".into(),
            command: crate::state::Command::Delete { kind: Kind::Service, name: "web".into(), expected_version: 0 },
            trace_parent: None,
        };
        s.apply(21, &delete).0.unwrap();

        for node in ["n1", "n2", "n3"] {
            let sent = desired_state(&s, node);
            let from_sent: BTreeMap<&str, Placed> = sent
                .gpus
                .iter()
                .flat_map(|g| &g.workloads)
                .map(|w| (w.service.as_str(), Placed { tenant: w.tenant.as_str(), slo_ms: w.slo_ms }))
                .collect();
            assert_eq!(placement(&s, node), Placement { version: sent.version, services: from_sent }, "node {node}");
        }
        let n1 = placement(&s, "n1");
        assert_eq!(n1.services["api"], Placed { tenant: "acme", slo_ms: 30.0 });
        assert_eq!(n1.services["web"].slo_ms, 0.0, "deleted");
        assert_eq!(placement(&s, "n3"), Placement::default(), "nothing placed");
    }

    #[test]
    fn a_watch_from_zero_gets_the_current_state_once_then_only_newer_ones() {
        let mut empty_first = SentVersions::from(0);
        assert!(empty_first.is_new(0), "the current state, even empty at 0");
        assert!(!empty_first.is_new(0));
        assert!(empty_first.is_new(7));
        assert!(!empty_first.is_new(7));

        // The first state is already newer than 0: sent once, and not again on the next
        // wake-up that changes nothing for this node.
        let mut placed_first = SentVersions::from(0);
        assert!(placed_first.is_new(11));
        assert!(!placed_first.is_new(11));
        assert!(placed_first.is_new(12));
    }

    #[test]
    fn a_resumed_watch_sends_only_what_is_newer_than_the_agent_holds() {
        let mut resumed = SentVersions::from(9);
        assert!(!resumed.is_new(9), "the agent holds 9 already");
        assert!(!resumed.is_new(5), "a controller behind the agent sends nothing older");
        assert!(resumed.is_new(10));
    }
}
