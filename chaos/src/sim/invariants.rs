//! The invariants checked while a run goes on: at most one leader per term (Election
//! Safety), controllers that applied the same index hold the same state (State Machine
//! Safety), every committed plan legal, and after the faults heal, every agent holding the
//! latest plan.

use std::collections::{BTreeMap, BTreeSet};

use controlplane::agents::desired_state;
use controlplane::controller::Controller;
use controlplane::raft::LogId;
use controlplane::resources::{Kind, Spec};
use controlplane::state::ClusterState;
use planner::mig::GpuModel;

use super::agents::AgentViews;

/// The leader seen per term, from every controller's Raft metrics (its own state when it
/// leads, and whom it follows). openraft runs with `single-term-leader`: a term has at most
/// one leader, as in the Raft paper (Election Safety, §5.2) and etcd.
#[derive(Default)]
pub struct LeadersPerTerm {
    leaders: BTreeMap<u64, u64>,
}

impl LeadersPerTerm {
    /// Notes what `controller` believes now (the term and leader, when new); an error names
    /// the term that had two leaders.
    pub fn observe(&mut self, controller: &Controller) -> Result<Option<(u64, u64)>, String> {
        let metrics = controller.raft.metrics().borrow().clone();
        let Some(leader) = metrics.current_leader else { return Ok(None) };
        let term = metrics.current_term;
        match self.leaders.get(&term) {
            Some(&first) if first == leader => Ok(None),
            Some(&first) => Err(format!(
                "Election Safety: term {term} has two leaders, {first} and then {leader} (reported by controller {})",
                controller.id
            )),
            None => {
                self.leaders.insert(term, leader);
                Ok(Some((term, leader)))
            }
        }
    }

    /// Terms that had a leader.
    pub fn terms(&self) -> usize {
        self.leaders.len()
    }
}

/// State Machine Safety (Raft §5.4.3): a controller that applied index `i` applied the same
/// entry there as every other controller that applied `i`, so their states after it are
/// equal. The first state seen at each index is kept (persistent maps: clones share
/// structure) and every later one is compared with it.
#[derive(Default)]
pub struct AppliedStates {
    /// Index -> the controller that first applied it, the entry's id and the state after it.
    at: BTreeMap<u64, (u64, LogId, ClusterState)>,
    /// The index each controller was last checked at (its state changes only by applying).
    checked: BTreeMap<u64, u64>,
}

impl AppliedStates {
    pub fn observe(&mut self, controller: &Controller) -> Result<(), String> {
        let (applied, state) = controller.read(|d| (d.last_applied, d.cluster.clone()));
        let Some(applied) = applied else { return Ok(()) };
        if self.checked.insert(controller.id, applied.index) == Some(applied.index) {
            return Ok(());
        }
        let Some((first, id, expected)) = self.at.get(&applied.index) else {
            self.at.insert(applied.index, (controller.id, applied, state));
            return Ok(());
        };
        if *id != applied {
            return Err(format!(
                "State Machine Safety: at index {} controller {} applied {applied}, controller {first} applied {id}",
                applied.index, controller.id
            ));
        }
        if *expected != state {
            return Err(format!(
                "State Machine Safety: controllers {first} and {} applied the same entry at index {} but hold different states",
                controller.id, applied.index
            ));
        }
        Ok(())
    }
}

/// Checks the committed plan of `cluster`, if any, the way an agent checks its desired state
/// before applying it (legal MIG layouts, existing instances, MPS shares of at most 100%),
/// plus what only the whole state shows: every assignment names a registered node, one of
/// its GPUs, each GPU once, and services that exist. Returns the plan's revision.
pub fn check_plan(cluster: &ClusterState) -> Result<Option<u64>, String> {
    let Some(plan) = cluster.get(Kind::Plan, "current") else { return Ok(None) };
    let Spec::Plan(spec) = &plan.spec else { return Err("Plan \"current\" does not hold a plan spec".into()) };
    let at = |what: String| format!("plan at revision {}: {what}", plan.mod_revision);
    let mut nodes: BTreeMap<&str, BTreeMap<String, GpuModel>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (i, g) in spec.gpus.iter().enumerate() {
        let node = cluster.get(Kind::Node, &g.node).ok_or_else(|| at(format!("gpus[{i}].node: {:?} is not registered", g.node)))?;
        let Spec::Node(node_spec) = &node.spec else { return Err(at(format!("node {:?} holds no node spec", g.node))) };
        if !node_spec.gpus.iter().any(|n| n.uuid == g.gpu_uuid) {
            return Err(at(format!("gpus[{i}].gpu_uuid: {:?} is not a GPU of node {:?}", g.gpu_uuid, g.node)));
        }
        if !seen.insert(g.gpu_uuid.as_str()) {
            return Err(at(format!("gpus[{i}].gpu_uuid: {:?} is assigned twice", g.gpu_uuid)));
        }
        for (wi, w) in g.workloads.iter().enumerate() {
            if cluster.get(Kind::Service, &w.service).is_none() {
                return Err(at(format!("gpus[{i}].workloads[{wi}].service: {:?} does not exist", w.service)));
            }
        }
        let models = node_spec.gpus.iter().filter_map(|n| GpuModel::for_name(&n.model).map(|m| (n.uuid.clone(), m))).collect();
        nodes.insert(g.node.as_str(), models);
    }
    for (node, models) in &nodes {
        node_agent::desired::decode(&desired_state(cluster, node), node, models).map_err(|e| at(format!("node {node}: {e}")))?;
    }
    let mut services = BTreeSet::new();
    for s in &spec.services {
        if !services.insert(s.service.as_str()) {
            return Err(at(format!("services: {:?} predicted twice", s.service)));
        }
    }
    Ok(Some(plan.mod_revision))
}

/// Why the controllers have not settled under `leader` yet (`None`: every one of the
/// `members` runs, follows `leader` and has applied what `leader` has).
pub fn unsettled(leader: &Controller, running: &[Controller], members: u64) -> Option<String> {
    if running.len() as u64 != members {
        return Some(format!("{} of {members} controllers running", running.len()));
    }
    let applied = |c: &Controller| c.raft.metrics().borrow().last_applied.map(|l| l.index);
    let target = applied(leader);
    running.iter().find_map(|c| {
        let m = c.raft.metrics().borrow().clone();
        if m.current_leader != Some(leader.id) {
            return Some(format!("controller {} follows {:?}, not {}", c.id, m.current_leader, leader.id));
        }
        (applied(c) != target).then(|| format!("controller {} applied {:?}, the leader {target:?}", c.id, applied(c)))
    })
}

/// Why the agents have not converged to `leader`'s latest plan yet (`None`: they have).
pub fn unconverged(leader: &Controller, agents: &[String], views: &AgentViews) -> Option<String> {
    let views = views.lock().unwrap();
    leader.read(|d| {
        agents.iter().find_map(|node| {
            let want = desired_state(&d.cluster, node);
            let has = views.get(node).and_then(|v| v.desired.as_ref());
            // A node that nothing was ever planned on is sent nothing.
            let holds_latest = has.map_or(want.version == 0 && want.gpus.is_empty(), |h| *h == want);
            (!holds_latest)
                .then(|| format!("agent {node} holds version {:?}, the latest plan gives version {}", has.map(|h| h.version), want.version))
        })
    })
}

/// Agents whose desired state puts work on at least one GPU.
pub fn agents_with_work(views: &AgentViews) -> usize {
    views.lock().unwrap().values().filter(|v| v.desired.as_ref().is_some_and(|d| d.gpus.iter().any(|g| !g.workloads.is_empty()))).count()
}
