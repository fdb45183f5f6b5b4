//! One [`ShadowPolicy`] per workload on the node (a service's processes in one slot of one
//! GPU), kept in step with what the supervisor runs. Pure: the reconcile loop hands it what
//! it observed, the standbys' readiness and the routers' windows; it answers with the
//! policies' actions, which the executor carries out (`Executor::carry_out`).

use super::{Action, BackendId, Event, FailoverConfig, ShadowPolicy};
use crate::desired::Slot;
use crate::reconcile::{NodeObserved, Role, Running};
use crate::router::WindowStats;
use std::collections::{BTreeMap, BTreeSet};

/// Windows in a row with p99 over the SLO before a failover (iGniter Sec. 4.2 acts on a
/// violation; two windows keep one slow second from causing a switch).
pub const VIOLATION_WINDOWS: u32 = 2;

/// A workload: a service's processes in one slot of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub gpu: String,
    pub service: String,
    pub slot: Slot,
}

#[derive(Debug, Default)]
pub struct ShadowPolicies {
    policies: BTreeMap<WorkloadKey, ShadowPolicy>,
}

impl ShadowPolicies {
    /// Brings the policies in step with what runs. A workload with an active process gets a
    /// policy; one whose active process is no longer active (a resize promoted its standby,
    /// the process was stopped, the agent restarted) or whose SLO changed starts afresh from
    /// what runs; processes a policy knew that are gone are forgotten; the standby of the
    /// active process's configuration is the policy's standby. Policies of workloads that no
    /// longer run are dropped.
    pub fn observe(&mut self, observed: &NodeObserved) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut seen = BTreeSet::new();
        for (gpu, g) in &observed.gpus {
            let mut by_workload: BTreeMap<WorkloadKey, Vec<&Running>> = BTreeMap::new();
            for r in &g.running {
                let key = WorkloadKey { gpu: gpu.clone(), service: r.spec.service.clone(), slot: r.spec.slot };
                by_workload.entry(key).or_default().push(r);
            }
            for (key, running) in by_workload {
                let actives: Vec<&Running> = running.iter().copied().filter(|r| r.role == Role::Active).collect();
                let Some(first) = actives.first() else { continue };
                let config = FailoverConfig { slo_ms: first.spec.slo_ms, consecutive_windows: VIOLATION_WINDOWS };
                let policy = self.policies.entry(key.clone()).or_insert_with(|| ShadowPolicy::new(config.clone(), first.id.clone()));
                if policy.config() != &config || !actives.iter().any(|r| r.id == policy.active()) {
                    *policy = ShadowPolicy::new(config, first.id.clone());
                }
                let runs = |id: &str| running.iter().any(|r| r.id == id);
                let known: Vec<BackendId> =
                    policy.standby().map(|(id, _)| id.to_string()).into_iter().chain(policy.draining().iter().cloned()).collect();
                for id in known.into_iter().filter(|id| !runs(id)) {
                    actions.extend(policy.on_event(Event::Gone(id)));
                }
                let active = actives.iter().find(|r| r.id == policy.active()).unwrap_or(first);
                let standbys: Vec<&&Running> =
                    running.iter().filter(|r| r.role == Role::Standby && r.spec.same_config(&active.spec)).collect();
                let current = policy.standby().map(|(id, _)| id.to_string());
                if !standbys.iter().any(|s| Some(&s.id) == current.as_ref()) {
                    if let Some(s) = standbys.first() {
                        actions.extend(policy.on_event(Event::ShadowStarted(s.id.clone())));
                    }
                }
                for r in running.iter().filter(|r| observed.exited.contains(&r.id)) {
                    actions.extend(policy.on_event(Event::Exited(r.id.clone())));
                }
                seen.insert(key);
            }
        }
        self.policies.retain(|key, _| seen.contains(key));
        actions
    }

    /// A window of `service`'s router closed: each of the service's workloads on this node
    /// hears it (the router measures the service, not a workload).
    pub fn on_window(&mut self, service: &str, stats: &WindowStats) -> Vec<Action> {
        let mut actions = Vec::new();
        for (_, policy) in self.policies.iter_mut().filter(|(key, _)| key.service == service) {
            actions.extend(policy.on_event(Event::Window(stats.clone())));
        }
        actions
    }

    /// An event about one process (ready, drained, gone): process ids are unique on the
    /// node, so the policy that knows it acts and the others ignore it.
    pub fn on_process(&mut self, event: &Event) -> Vec<Action> {
        self.policies.values_mut().flat_map(|policy| policy.on_event(event.clone())).collect()
    }

    /// The standbys that have not answered Ready yet, to probe.
    pub fn unready_standbys(&self) -> Vec<BackendId> {
        self.policies.values().filter_map(|p| p.standby().filter(|(_, ready)| !ready).map(|(id, _)| id.to_string())).collect()
    }

    /// The policy of a workload (for tests and diagnostics).
    pub fn get(&self, key: &WorkloadKey) -> Option<&ShadowPolicy> {
        self.policies.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::WorkloadSpec;
    use crate::reconcile::GpuObserved;
    use crate::shadow::SwitchReason;

    fn spec(service: &str, batch: u32, slo_ms: f64) -> WorkloadSpec {
        WorkloadSpec {
            service: service.into(),
            model: "resnet50".into(),
            slot: Slot::WholeGpu,
            mps_percent: 50.0,
            batch,
            processes: 1,
            shadow_mps_percent: 10.0,
            slo_ms,
            batch_ms: 0.0,
            runtime: None,
            model_uri: String::new(),
            retiring: false,
        }
    }

    fn on_gpu0(running: Vec<(&str, WorkloadSpec, Role)>) -> NodeObserved {
        let running = running.into_iter().map(|(id, spec, role)| Running { id: id.into(), spec, role }).collect();
        NodeObserved { gpus: [("GPU-0".to_string(), GpuObserved { layout: vec![], running })].into(), ..Default::default() }
    }

    fn key(service: &str) -> WorkloadKey {
        WorkloadKey { gpu: "GPU-0".into(), service: service.into(), slot: Slot::WholeGpu }
    }

    fn slow(index: u64) -> WindowStats {
        WindowStats { index, length_ms: 1000, p99_ms: Some(80.0), p50_ms: Some(60.0), completed: 10, failed: 0, arrivals: 10 }
    }

    #[test]
    fn a_ready_standby_takes_over_after_two_slow_windows_of_its_service() {
        let mut p = ShadowPolicies::default();
        let node = on_gpu0(vec![
            ("web-a-1", spec("web", 4, 50.0), Role::Active),
            ("web-s-2", spec("web", 4, 50.0), Role::Standby),
            ("db-a-3", spec("db", 4, 50.0), Role::Active),
        ]);
        assert_eq!(p.observe(&node), vec![Action::ProbeReady("web-s-2".into())]);
        assert_eq!(p.unready_standbys(), vec!["web-s-2".to_string()]);
        assert_eq!(p.observe(&node), vec![], "the same processes change nothing");
        assert_eq!(p.on_process(&Event::Ready("web-s-2".into())), vec![]);
        assert!(p.unready_standbys().is_empty());
        // Slow windows of another service do not count for this one.
        assert_eq!(p.on_window("db", &slow(0)), vec![]);
        assert_eq!(p.on_window("db", &slow(1)), vec![Action::WantShadow], "db has no standby to switch to");
        assert_eq!(p.on_window("web", &slow(0)), vec![]);
        let actions = p.on_window("web", &slow(1));
        assert_eq!(
            actions[0],
            Action::Switch {
                from: "web-a-1".into(),
                to: "web-s-2".into(),
                reason: SwitchReason::SloViolation { p99_ms: 80.0, windows: 2 }
            }
        );
        assert_eq!(p.on_process(&Event::Drained("web-a-1".into())), vec![Action::Stop("web-a-1".into())]);
        // After the switch the former standby is the active one, and the policy stays.
        let after = on_gpu0(vec![("web-s-2", spec("web", 4, 50.0), Role::Active), ("db-a-3", spec("db", 4, 50.0), Role::Active)]);
        assert_eq!(p.observe(&after), vec![]);
        assert_eq!(p.get(&key("web")).unwrap().active(), "web-s-2");
    }

    #[test]
    fn an_active_process_seen_exited_fails_over_to_its_ready_standby() {
        let mut p = ShadowPolicies::default();
        let mut node = on_gpu0(vec![("web-a-1", spec("web", 4, 50.0), Role::Active), ("web-s-2", spec("web", 4, 50.0), Role::Standby)]);
        p.observe(&node);
        p.on_process(&Event::Ready("web-s-2".into()));
        node.exited.insert("web-a-1".into());
        let actions = p.observe(&node);
        assert_eq!(actions[0], Action::Switch { from: "web-a-1".into(), to: "web-s-2".into(), reason: SwitchReason::ActiveExited });
    }

    #[test]
    fn a_standby_of_another_configuration_is_not_a_failover_target() {
        // During a resize the reconcile plan starts the new size as the standby and promotes
        // it itself; the shadow policy must not switch to it on a slow window.
        let mut p = ShadowPolicies::default();
        let node = on_gpu0(vec![("web-a-1", spec("web", 4, 50.0), Role::Active), ("web-s-2", spec("web", 8, 50.0), Role::Standby)]);
        assert_eq!(p.observe(&node), vec![]);
        assert_eq!(p.get(&key("web")).unwrap().standby(), None);
    }

    #[test]
    fn a_new_active_process_or_slo_starts_the_workload_afresh_and_gone_processes_are_forgotten() {
        let mut p = ShadowPolicies::default();
        p.observe(&on_gpu0(vec![("web-a-1", spec("web", 4, 50.0), Role::Active), ("web-s-2", spec("web", 4, 50.0), Role::Standby)]));
        p.on_window("web", &slow(0));
        assert_eq!(p.get(&key("web")).unwrap().violations(), 1);
        // The standby crashed: it is forgotten, and the streak goes on.
        assert_eq!(p.observe(&on_gpu0(vec![("web-a-1", spec("web", 4, 50.0), Role::Active)])), vec![]);
        assert_eq!(p.get(&key("web")).unwrap().standby(), None);
        assert_eq!(p.get(&key("web")).unwrap().violations(), 1);
        // A tighter SLO: a fresh policy.
        p.observe(&on_gpu0(vec![("web-a-1", spec("web", 4, 20.0), Role::Active)]));
        assert_eq!(p.get(&key("web")).unwrap().violations(), 0);
        assert_eq!(p.get(&key("web")).unwrap().config().slo_ms, 20.0);
        // Another process is active now (a resize promoted it): a fresh policy for it.
        p.observe(&on_gpu0(vec![("web-a-7", spec("web", 8, 20.0), Role::Active)]));
        assert_eq!(p.get(&key("web")).unwrap().active(), "web-a-7");
        // Nothing of the workload runs any more: its policy goes.
        p.observe(&on_gpu0(vec![]));
        assert!(p.get(&key("web")).is_none());
    }
}
