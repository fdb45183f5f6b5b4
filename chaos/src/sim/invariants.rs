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
/// leads, and whom it follows). openraft runs with standard leader ids (`leader_id_std`, 0.9's
/// `single-term-leader`): a term has at most
/// one leader, as in the Raft paper (Election Safety, §5.2) and etcd.
#[derive(Default)]
pub struct LeadersPerTerm {
    leaders: BTreeMap<u64, u64>,
}

impl LeadersPerTerm {
    /// Notes what `controller` believes now (the term and leader, when new); an error names
    /// the term that had two leaders.
    pub fn observe(&mut self, controller: &Controller) -> Result<Option<(u64, u64)>, String> {
        let metrics = controlplane::raft::consensus::metrics(&controller.raft);
        let Some(leader) = metrics.current_leader else { return Ok(None) };
        self.note(controller.id, metrics.current_term, leader)
    }

    /// Notes that controller `reporter` sees `leader` lead `term`.
    fn note(&mut self, reporter: u64, term: u64, leader: u64) -> Result<Option<(u64, u64)>, String> {
        match self.leaders.get(&term) {
            Some(&first) if first == leader => Ok(None),
            Some(&first) => {
                Err(format!("Election Safety: term {term} has two leaders, {first} and then {leader} (reported by controller {reporter})"))
            }
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
        self.note(controller.id, applied, state)
    }

    /// Notes that controller `reporter` holds `state` after applying `applied`.
    fn note(&mut self, reporter: u64, applied: LogId, state: ClusterState) -> Result<(), String> {
        if self.checked.insert(reporter, applied.index) == Some(applied.index) {
            return Ok(());
        }
        let Some((first, id, expected)) = self.at.get(&applied.index) else {
            self.at.insert(applied.index, (reporter, applied, state));
            return Ok(());
        };
        if *id != applied {
            return Err(format!(
                "State Machine Safety: at index {} controller {reporter} applied {applied}, controller {first} applied {id}",
                applied.index
            ));
        }
        if *expected != state {
            return Err(format!(
                "State Machine Safety: controllers {first} and {reporter} applied the same entry at index {} but hold different states",
                applied.index
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
    let applied = |c: &Controller| controlplane::raft::consensus::metrics(&c.raft).last_applied.map(|l| l.index);
    let target = applied(leader);
    running.iter().find_map(|c| {
        let m = controlplane::raft::consensus::metrics(&c.raft);
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

#[cfg(test)]
mod tests {
    use super::*;
    use controlplane::raft::log_id;
    use controlplane::state::{Command, Request, WriteMode};

    #[test]
    fn election_safety_fails_on_a_forged_trace_with_two_leaders_in_one_term() {
        let mut leaders = LeadersPerTerm::default();
        // A real trace: each controller names the one leader of each term.
        assert_eq!(leaders.note(1, 1, 1), Ok(Some((1, 1))));
        assert_eq!(leaders.note(2, 1, 1), Ok(None));
        assert_eq!(leaders.note(3, 2, 3), Ok(Some((2, 3))));
        assert_eq!(leaders.terms(), 2);
        // Forged: controller 2 reports another leader for term 2.
        let err = leaders.note(2, 2, 2).unwrap_err();
        assert_eq!(err, "Election Safety: term 2 has two leaders, 3 and then 2 (reported by controller 2)");
    }

    fn state_with_tenant(name: &str, index: u64) -> ClusterState {
        let mut state = ClusterState::default();
        let put = Request {
            request_id: String::new(),
            command: Command::Put {
                name: name.into(),
                tenant: String::new(),
                spec: Spec::Tenant(Default::default()),
                mode: WriteMode::Create,
                expected_version: 0,
            },
            trace_parent: None,
        };
        state.apply(index, &put).0.expect("a tenant is written");
        state
    }

    #[test]
    fn state_machine_safety_fails_on_forged_traces_of_another_entry_or_another_state() {
        let mut applied = AppliedStates::default();
        // A real trace: three controllers apply the same entry at index 5 and reach one state.
        for id in 1..=3 {
            applied.note(id, log_id(1, 5), state_with_tenant("acme", 5)).unwrap();
        }
        // Forged: a fourth controller applied another entry (another leader's) at index 5.
        let err = applied.note(4, log_id(2, 5), state_with_tenant("acme", 5)).unwrap_err();
        assert!(err.starts_with("State Machine Safety: at index 5 controller 4 applied"), "{err}");
        // Forged: the same entry, yet another state.
        let mut applied = AppliedStates::default();
        applied.note(1, log_id(1, 6), state_with_tenant("acme", 6)).unwrap();
        let err = applied.note(3, log_id(1, 6), state_with_tenant("globex", 6)).unwrap_err();
        assert_eq!(err, "State Machine Safety: controllers 1 and 3 applied the same entry at index 6 but hold different states");
    }
}
