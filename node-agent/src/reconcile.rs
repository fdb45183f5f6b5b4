//! The reconcile plan: the ordered, idempotent steps that turn what runs on the node into
//! what the controller wants. Pure: the agent recomputes it from scratch every round
//! (level-triggered), so an agent killed between two steps resumes by planning again.
//!
//! Order (issue "node-agent", point 7): start standbys (shadows) → switch (promote a ready
//! standby, a pointer swap in the router) → drain and stop what goes → destroy the MIG
//! instances that change → create the new ones → start what runs on them. Instances whose
//! profile and start stay are never touched (`planner::mig::plan_transition`).

use crate::desired::{NodeDesired, Slot, WorkloadSpec};
use planner::mig::{plan_transition, MigError, MigOp, Placement};
use std::collections::{BTreeMap, BTreeSet};

/// A workload process's role: serving, or a warm standby with a larger share (iGniter
/// Sec. 4.2, GSLICE Sec. 3.2.4) ready to take over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Role {
    Active,
    Standby,
}

/// A workload process the agent observes.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    /// The supervisor's stable id for the process.
    pub id: String,
    pub spec: WorkloadSpec,
    pub role: Role,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuObserved {
    pub layout: Vec<Placement>,
    pub running: Vec<Running>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeObserved {
    pub gpus: BTreeMap<String, GpuObserved>,
    /// Processes that exited and were not restarted yet (they still count as running: the
    /// supervisor restarts them; the shadow policies fail over from an active one).
    pub exited: std::collections::BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Start a warm standby for the workload (its share plus the shadow share).
    StartStandby {
        gpu: String,
        spec: WorkloadSpec,
    },
    /// Make the ready standby of (service, slot) active; waits until it reports ready.
    Promote {
        gpu: String,
        service: String,
        slot: Slot,
    },
    /// Stop routing new requests to a process and wait for its in-flight ones.
    Drain {
        gpu: String,
        id: String,
    },
    Stop {
        gpu: String,
        id: String,
    },
    DestroyInstance {
        gpu: String,
        placement: Placement,
    },
    CreateInstance {
        gpu: String,
        placement: Placement,
    },
    /// Start an active process (nothing serves the workload yet).
    Start {
        gpu: String,
        spec: WorkloadSpec,
    },
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReconcileError {
    #[error("GPU {gpu}: {source}")]
    Layout { gpu: String, source: MigError },
    #[error("desired state names GPU {0}, which the agent does not observe")]
    UnknownGpu(String),
}

/// The steps from `observed` to `desired`, in execution order.
pub fn plan(desired: &NodeDesired, observed: &NodeObserved) -> Result<Vec<Step>, ReconcileError> {
    let mut phases: [Vec<Step>; 5] = Default::default(); // standby/switch, drain/stop, destroy, create, start
    let empty = Default::default();
    let gpus: BTreeSet<&String> = desired.gpus.keys().chain(observed.gpus.keys()).collect();
    for gpu in gpus {
        let want = desired.gpus.get(gpu).unwrap_or(&empty);
        let have = observed.gpus.get(gpu).ok_or_else(|| ReconcileError::UnknownGpu(gpu.clone()))?;
        plan_gpu(gpu, want, have, &mut phases)?;
    }
    Ok(phases.into_iter().flatten().collect())
}

fn plan_gpu(gpu: &str, want: &crate::desired::GpuDesired, have: &GpuObserved, phases: &mut [Vec<Step>; 5]) -> Result<(), ReconcileError> {
    let g = || gpu.to_string();
    let ops = plan_transition(&have.layout, &want.layout).map_err(|source| ReconcileError::Layout { gpu: g(), source })?;
    let destroyed: BTreeSet<Placement> = ops.iter().filter_map(|op| if let MigOp::Destroy(p) = op { Some(*p) } else { None }).collect();
    let gone = |slot: &Slot| matches!(slot, Slot::Mig(p) if destroyed.contains(p));
    let mut keep: BTreeSet<&str> = BTreeSet::new();
    for spec in &want.workloads {
        let here = |role: Role| {
            have.running
                .iter()
                .filter(move |r| r.role == role && r.spec.service == spec.service && r.spec.slot == spec.slot && !gone(&r.spec.slot))
        };
        // A workload runs `processes` identical active processes (ParvaGPU's MPS processes
        // per segment) and one warm standby.
        let wanted = spec.processes as usize;
        let fitting: Vec<&Running> = here(Role::Active).filter(|r| r.spec.same_config(spec)).take(wanted).collect();
        if spec.retiring {
            // It serves until its replacement elsewhere does: what runs of it stays, nothing
            // starts for it, and its standby goes.
            keep.extend(fitting.iter().map(|r| r.id.as_str()));
            continue;
        }
        let any_active = here(Role::Active).next().is_some();
        let standby = here(Role::Standby).find(|s| s.spec.same_config(spec));
        keep.extend(fitting.iter().map(|r| r.id.as_str()));
        let mut missing = wanted - fitting.len();
        let created = matches!(spec.slot, Slot::Mig(p) if !have.layout.contains(&p) || destroyed.contains(&p));
        // On a new instance after it is created; else at once, before anything old stops.
        let phase = if created { 4 } else { 0 };
        let mut new_standby = None;
        if fitting.is_empty() && any_active {
            // Resize: the new configuration starts as the standby and takes over when ready
            // (one pointer swap); the old processes drain and stop below. The next round
            // starts a fresh standby.
            match standby {
                Some(s) => {
                    keep.insert(&s.id);
                }
                None => phases[0].push(Step::StartStandby { gpu: g(), spec: spec.clone() }),
            }
            phases[0].push(Step::Promote { gpu: g(), service: spec.service.clone(), slot: spec.slot });
            missing -= 1;
        } else if let Some(s) = standby {
            keep.insert(&s.id);
        } else {
            new_standby = Some(Step::StartStandby { gpu: g(), spec: spec.clone() });
        }
        for _ in 0..missing {
            phases[phase].push(Step::Start { gpu: g(), spec: spec.clone() });
        }
        // The standby after the processes that serve: they come first.
        phases[phase].extend(new_standby);
    }
    for r in &have.running {
        if !keep.contains(r.id.as_str()) {
            phases[1].push(Step::Drain { gpu: g(), id: r.id.clone() });
            phases[1].push(Step::Stop { gpu: g(), id: r.id.clone() });
        }
    }
    for op in ops {
        match op {
            MigOp::Destroy(p) => phases[2].push(Step::DestroyInstance { gpu: g(), placement: p }),
            MigOp::Create(p) => phases[3].push(Step::CreateInstance { gpu: g(), placement: p }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::GpuDesired;
    use planner::mig::MigProfile::*;

    fn spec(service: &str, slot: Slot, pct: f64, batch: u32) -> WorkloadSpec {
        WorkloadSpec {
            service: service.into(),
            model: "resnet50".into(),
            slot,
            mps_percent: pct,
            batch,
            processes: 1,
            shadow_mps_percent: 10.0,
            slo_ms: 50.0,
            batch_ms: 0.0,
            runtime: None,
            model_uri: String::new(),
            retiring: false,
        }
    }

    fn mig(p: planner::mig::MigProfile, start: u8) -> Slot {
        Slot::Mig(Placement::new(p, start))
    }

    fn running(id: &str, spec: WorkloadSpec, role: Role) -> Running {
        Running { id: id.into(), spec, role }
    }

    fn one_gpu(layout: Vec<Placement>, workloads: Vec<WorkloadSpec>) -> NodeDesired {
        NodeDesired {
            version: 1,
            gpus: [("GPU-0".to_string(), GpuDesired { layout, workloads })].into(),
            callers: Default::default(),
            runtimes: Default::default(),
            trace_parent: String::new(),
        }
    }

    fn observed(layout: Vec<Placement>, running: Vec<Running>) -> NodeObserved {
        NodeObserved { gpus: [("GPU-0".to_string(), GpuObserved { layout, running })].into(), ..Default::default() }
    }

    fn kind(s: &Step) -> &'static str {
        match s {
            Step::StartStandby { .. } => "standby",
            Step::Promote { .. } => "promote",
            Step::Drain { .. } => "drain",
            Step::Stop { .. } => "stop",
            Step::DestroyInstance { .. } => "destroy",
            Step::CreateInstance { .. } => "create",
            Step::Start { .. } => "start",
        }
    }

    #[test]
    fn converged_node_needs_no_step() {
        let a = spec("a", mig(G4, 0), 100.0, 8);
        let want = one_gpu(vec![Placement::new(G4, 0)], vec![a.clone()]);
        let have = observed(vec![Placement::new(G4, 0)], vec![running("a1", a.clone(), Role::Active), running("a2", a, Role::Standby)]);
        assert_eq!(plan(&want, &have).unwrap(), vec![]);
    }

    #[test]
    fn empty_gpu_gets_instances_then_processes_then_standbys() {
        let a = spec("a", mig(G4, 0), 100.0, 8);
        let b = spec("b", mig(G3, 4), 100.0, 4);
        let want = one_gpu(vec![Placement::new(G4, 0), Placement::new(G3, 4)], vec![a.clone(), b.clone()]);
        let steps = plan(&want, &observed(vec![], vec![])).unwrap();
        let kinds: Vec<&str> = steps.iter().map(kind).collect();
        assert_eq!(kinds, ["create", "create", "start", "standby", "start", "standby"]);
        assert!(steps.contains(&Step::Start { gpu: "GPU-0".into(), spec: b }));
    }

    #[test]
    fn changing_one_instance_leaves_the_others_untouched() {
        // 4g@0 + 3g@4 → 4g@0 + 2g@4 + 1g@6: only the 3g goes; the 4g workload keeps running.
        let a = spec("a", mig(G4, 0), 100.0, 8);
        let b_old = spec("b", mig(G3, 4), 100.0, 4);
        let b_new = spec("b", mig(G2, 4), 100.0, 4);
        let c = spec("c", mig(G1, 6), 100.0, 2);
        let want = one_gpu(vec![Placement::new(G4, 0), Placement::new(G2, 4), Placement::new(G1, 6)], vec![a.clone(), b_new, c]);
        let have = observed(
            vec![Placement::new(G4, 0), Placement::new(G3, 4)],
            vec![
                running("a1", a.clone(), Role::Active),
                running("a2", a, Role::Standby),
                running("b1", b_old.clone(), Role::Active),
                running("b2", b_old, Role::Standby),
            ],
        );
        let steps = plan(&want, &have).unwrap();
        let kinds: Vec<&str> = steps.iter().map(kind).collect();
        assert_eq!(kinds, ["drain", "stop", "drain", "stop", "destroy", "create", "create", "start", "standby", "start", "standby"]);
        for s in &steps {
            if let Step::Drain { id, .. } | Step::Stop { id, .. } = s {
                assert!(id.starts_with('b'), "only b's processes stop, not {id}");
            }
        }
        assert!(steps.contains(&Step::DestroyInstance { gpu: "GPU-0".into(), placement: Placement::new(G3, 4) }));
        assert!(!steps.iter().any(|s| matches!(s, Step::DestroyInstance { placement, .. } if placement.profile == G4)));
    }

    #[test]
    fn resize_on_a_kept_slot_starts_a_standby_then_promotes_it_then_drains_the_old() {
        let old = spec("a", Slot::WholeGpu, 30.0, 8);
        let new = spec("a", Slot::WholeGpu, 40.0, 8);
        let want = one_gpu(vec![], vec![new.clone()]);
        let have = observed(vec![], vec![running("a1", old.clone(), Role::Active), running("a2", old, Role::Standby)]);
        let steps = plan(&want, &have).unwrap();
        assert_eq!(
            steps,
            vec![
                Step::StartStandby { gpu: "GPU-0".into(), spec: new },
                Step::Promote { gpu: "GPU-0".into(), service: "a".into(), slot: Slot::WholeGpu },
                Step::Drain { gpu: "GPU-0".into(), id: "a1".into() },
                Step::Stop { gpu: "GPU-0".into(), id: "a1".into() },
                Step::Drain { gpu: "GPU-0".into(), id: "a2".into() },
                Step::Stop { gpu: "GPU-0".into(), id: "a2".into() },
            ]
        );
    }

    #[test]
    fn a_retiring_workload_keeps_its_active_processes_starts_nothing_and_loses_its_standby() {
        let old = spec("a", mig(G3, 0), 100.0, 8);
        let layout = vec![Placement::new(G3, 0)];
        let have = || observed(layout.clone(), vec![running("p1", old.clone(), Role::Active), running("p2", old.clone(), Role::Standby)]);
        let retiring = WorkloadSpec { retiring: true, ..old.clone() };
        let want = one_gpu(vec![Placement::new(G3, 0), Placement::new(G2, 4)], vec![spec("b", mig(G2, 4), 100.0, 4), retiring.clone()]);
        let steps = plan(&want, &have()).unwrap();
        assert!(!steps.iter().any(|s| matches!(s, Step::Drain { id, .. } if id == "p1")), "{steps:?}");
        assert!(steps.iter().any(|s| matches!(s, Step::Stop { id, .. } if id == "p2")), "{steps:?}");
        assert!(!steps.iter().any(|s| matches!(s, Step::Start { spec, .. } | Step::StartStandby { spec, .. } if spec.service == "a")));
        // Gone (it crashed): it is not started again.
        let steps = plan(&one_gpu(layout.clone(), vec![retiring]), &observed(layout.clone(), vec![])).unwrap();
        assert!(steps.is_empty(), "{steps:?}");
        // Dropped from the desired state: it drains and stops, and its instance goes.
        let steps = plan(&one_gpu(vec![], vec![]), &have()).unwrap();
        assert_eq!(steps.iter().map(kind).collect::<Vec<_>>(), ["drain", "stop", "drain", "stop", "destroy"]);
    }

    #[test]
    fn a_matching_standby_is_promoted_not_restarted() {
        let old = spec("a", Slot::WholeGpu, 30.0, 8);
        let new = spec("a", Slot::WholeGpu, 40.0, 8);
        let want = one_gpu(vec![], vec![new.clone()]);
        let have = observed(vec![], vec![running("a1", old, Role::Active), running("a3", new, Role::Standby)]);
        let steps = plan(&want, &have).unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Promote { gpu: "GPU-0".into(), service: "a".into(), slot: Slot::WholeGpu },
                Step::Drain { gpu: "GPU-0".into(), id: "a1".into() },
                Step::Stop { gpu: "GPU-0".into(), id: "a1".into() },
            ]
        );
    }

    #[test]
    fn a_workload_runs_its_processes_and_one_standby() {
        let mut a = spec("a", mig(G3, 4), 33.3, 8);
        a.processes = 3;
        let want = one_gpu(vec![Placement::new(G3, 4)], vec![a.clone()]);
        let kinds = |steps: &[Step]| steps.iter().map(kind).collect::<Vec<_>>();
        let steps = plan(&want, &observed(vec![], vec![])).unwrap();
        assert_eq!(kinds(&steps), ["create", "start", "start", "start", "standby"]);
        // One process died and its restart was lost: only the missing one starts.
        let have = observed(
            vec![Placement::new(G3, 4)],
            vec![running("a1", a.clone(), Role::Active), running("a2", a.clone(), Role::Active), running("a9", a.clone(), Role::Standby)],
        );
        assert_eq!(plan(&want, &have).unwrap(), vec![Step::Start { gpu: "GPU-0".into(), spec: a.clone() }]);
        // Fewer processes wanted: the surplus drains and stops.
        let mut two = a.clone();
        two.processes = 2;
        let have = observed(
            vec![Placement::new(G3, 4)],
            vec![
                running("a1", two.clone(), Role::Active),
                running("a2", two.clone(), Role::Active),
                running("a3", two.clone(), Role::Active),
                running("a9", two.clone(), Role::Standby),
            ],
        );
        let want = one_gpu(vec![Placement::new(G3, 4)], vec![two]);
        assert_eq!(kinds(&plan(&want, &have).unwrap()), ["drain", "stop"]);
    }

    #[test]
    fn resizing_a_multi_process_workload_promotes_the_standby_and_starts_the_rest_first() {
        let mut old = spec("a", Slot::WholeGpu, 30.0, 8);
        old.processes = 2;
        let mut new = spec("a", Slot::WholeGpu, 40.0, 8);
        new.processes = 2;
        let want = one_gpu(vec![], vec![new.clone()]);
        let have = observed(
            vec![],
            vec![running("a1", old.clone(), Role::Active), running("a2", old.clone(), Role::Active), running("a3", old, Role::Standby)],
        );
        let steps = plan(&want, &have).unwrap();
        let kinds: Vec<&str> = steps.iter().map(kind).collect();
        assert_eq!(kinds, ["standby", "promote", "start", "drain", "stop", "drain", "stop", "drain", "stop"]);
    }

    #[test]
    fn a_gpu_the_agent_does_not_have_is_an_error() {
        let want = one_gpu(vec![], vec![]);
        assert_eq!(plan(&want, &NodeObserved::default()), Err(ReconcileError::UnknownGpu("GPU-0".into())));
    }

    #[test]
    fn an_undesired_gpu_is_emptied() {
        let a = spec("a", mig(G7, 0), 100.0, 8);
        let have = observed(vec![Placement::new(G7, 0)], vec![running("a1", a, Role::Active)]);
        let steps = plan(&NodeDesired::default(), &have).unwrap();
        let kinds: Vec<&str> = steps.iter().map(kind).collect();
        assert_eq!(kinds, ["drain", "stop", "destroy"]);
    }
}
