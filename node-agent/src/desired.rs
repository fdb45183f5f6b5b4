//! The agent's desired state, decoded from the controller's `DesiredState` and checked
//! before anything is applied: an illegal plan is refused whole, with the field and the
//! reason, and changes nothing on the node.

use crate::router::admission::{parse_digest, Callers};
use model::{validate_spec, Kind, ServingRuntimeSpec, Spec};
use planner::isolation::{check_gpu, Boundary, Isolation};
use planner::mig::{parse_profile, validate, GpuModel, Placement};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a workload runs on its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Slot {
    /// The whole GPU, shared with MPS.
    WholeGpu,
    /// A MIG instance of the GPU's layout.
    Mig(Placement),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub service: String,
    pub model: String,
    pub slot: Slot,
    pub mps_percent: f64,
    pub batch: u32,
    pub processes: u32,
    pub shadow_mps_percent: f64,
    pub slo_ms: f64,
    /// The planner's predicted time of one batch in this slot, ms (0: not known), for the
    /// router's ELSA. Not part of the process configuration: a new prediction restarts
    /// nothing.
    #[serde(default)]
    pub batch_ms: f64,
    /// The ServingRuntime its processes run (`NodeDesired::runtimes`); `None`: the host's
    /// launch template.
    #[serde(default)]
    pub runtime: Option<String>,
    /// Where its model lives, as the runtime understands it (empty: none given).
    #[serde(default)]
    pub model_uri: String,
    /// It left this slot and serves here until what replaces it serves (the controller's
    /// make-before-break): its running processes are kept, none is started for it, and it
    /// has no standby. Not part of the process configuration.
    #[serde(default)]
    pub retiring: bool,
}

impl WorkloadSpec {
    /// Two specs run the same process configuration (a change needs a restart or a switch).
    pub fn same_config(&self, other: &WorkloadSpec) -> bool {
        self.model == other.model
            && self.slot == other.slot
            && (self.mps_percent - other.mps_percent).abs() < 1e-9
            && self.batch == other.batch
            && self.processes == other.processes
            && self.runtime == other.runtime
            && self.model_uri == other.model_uri
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuDesired {
    /// Empty: the GPU is not partitioned.
    pub layout: Vec<Placement>,
    pub workloads: Vec<WorkloadSpec>,
}

/// The desired state of this node, by GPU uuid.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeDesired {
    pub version: u64,
    pub gpus: BTreeMap<String, GpuDesired>,
    /// Per service placed here, who may call its endpoint (its `inference_tokens`).
    pub callers: BTreeMap<String, Callers>,
    /// The ServingRuntimes its workloads name, by name.
    pub runtimes: BTreeMap<String, ServingRuntimeSpec>,
    /// The trace of the write that committed the newest plan in it (empty when traces are
    /// not exported): the reconcile that applies it continues that trace.
    pub trace_parent: String,
}

/// Why a desired state was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("desired state refused: `{field}`: {reason}")]
pub struct RefusedPlan {
    pub field: String,
    pub reason: String,
}

fn refuse(field: String, reason: impl Into<String>) -> RefusedPlan {
    RefusedPlan { field, reason: reason.into() }
}

/// Decodes and checks `state` against this node's GPUs (`models`: uuid → model).
pub fn decode(state: &proto::DesiredState, node: &str, models: &BTreeMap<String, GpuModel>) -> Result<NodeDesired, RefusedPlan> {
    if state.node != node {
        return Err(refuse("node".into(), format!("addressed to {:?}, this agent is {node:?}", state.node)));
    }
    let runtimes = decode_runtimes(&state.runtimes)?;
    let mut gpus = BTreeMap::new();
    let mut callers = BTreeMap::new();
    for (gi, g) in state.gpus.iter().enumerate() {
        let field = |f: &str| format!("gpus[{gi}].{f}");
        let model = *models.get(&g.gpu_uuid).ok_or_else(|| refuse(field("gpu_uuid"), format!("no GPU {:?} on this node", g.gpu_uuid)))?;
        if gpus.contains_key(&g.gpu_uuid) {
            return Err(refuse(field("gpu_uuid"), format!("GPU {:?} appears twice", g.gpu_uuid)));
        }
        let mut layout = Vec::with_capacity(g.mig_layout.len());
        for (ii, inst) in g.mig_layout.iter().enumerate() {
            let profile =
                parse_profile(model, &inst.profile).map_err(|e| refuse(field(&format!("mig_layout[{ii}].profile")), e.to_string()))?;
            let start = u8::try_from(inst.start).map_err(|_| refuse(field(&format!("mig_layout[{ii}].start")), "out of range"))?;
            layout.push(Placement::new(profile, start));
        }
        validate(&layout).map_err(|e| refuse(field("mig_layout"), e.to_string()))?;
        let mut workloads = Vec::with_capacity(g.workloads.len());
        let mut share: BTreeMap<Slot, f64> = BTreeMap::new();
        let mut boundaries = Vec::new();
        for (wi, w) in g.workloads.iter().enumerate() {
            let wf = |f: &str| field(&format!("workloads[{wi}].{f}"));
            let slot = match w.mig_instance {
                -1 if layout.is_empty() => Slot::WholeGpu,
                -1 => return Err(refuse(wf("mig_instance"), "the GPU is partitioned: a workload must name one of its instances")),
                i => Slot::Mig(*usize::try_from(i).ok().and_then(|i| layout.get(i)).ok_or_else(|| {
                    refuse(wf("mig_instance"), format!("{i} is not an index of the GPU's {} MIG instances", layout.len()))
                })?),
            };
            if w.service.is_empty() {
                return Err(refuse(wf("service"), "required"));
            }
            if !(w.mps_percent > 0.0 && w.mps_percent <= 100.0) {
                return Err(refuse(wf("mps_percent"), format!("must be in (0, 100], got {}", w.mps_percent)));
            }
            if !(0.0..=100.0).contains(&w.shadow_mps_percent) {
                return Err(refuse(wf("shadow_mps_percent"), format!("must be in [0, 100], got {}", w.shadow_mps_percent)));
            }
            if w.batch == 0 || w.processes == 0 {
                return Err(refuse(wf(if w.batch == 0 { "batch" } else { "processes" }), "must be at least 1"));
            }
            if !(0.0..=model::limits::MAX_LATENCY_MS).contains(&w.batch_ms) {
                return Err(refuse(wf("batch_ms"), format!("must be in [0, {}], got {}", model::limits::MAX_LATENCY_MS, w.batch_ms)));
            }
            if !w.tenant.is_empty() {
                let isolation = Isolation::parse(&w.isolation)
                    .ok_or_else(|| refuse(wf("isolation"), format!("{:?} is not shared, mig or dedicated", w.isolation)))?;
                boundaries.push((slot, Boundary { tenant: w.tenant.clone(), isolation }));
            }
            if w.inference_tokens.len() > model::limits::MAX_INFERENCE_TOKENS {
                return Err(refuse(
                    wf("inference_tokens"),
                    format!("{} tokens; at most {}", w.inference_tokens.len(), model::limits::MAX_INFERENCE_TOKENS),
                ));
            }
            if let Some(i) = w.inference_tokens.iter().position(|d| parse_digest(d).is_none()) {
                return Err(refuse(wf(&format!("inference_tokens[{i}]")), "not a SHA-256 as 64 hex digits"));
            }
            if !w.runtime.is_empty() && !runtimes.contains_key(&w.runtime) {
                return Err(refuse(wf("runtime"), format!("{:?} is not one of the desired state's runtimes", w.runtime)));
            }
            if w.model_uri.len() > model::limits::MAX_MODEL_URI_LEN {
                return Err(refuse(wf("model_uri"), format!("{} bytes; at most {}", w.model_uri.len(), model::limits::MAX_MODEL_URI_LEN)));
            }
            callers.entry(w.service.clone()).or_insert_with(|| Callers::from_hex(w.inference_tokens.iter().map(String::as_str)));
            *share.entry(slot).or_default() += w.mps_percent * f64::from(w.processes);
            workloads.push(WorkloadSpec {
                service: w.service.clone(),
                model: w.model.clone(),
                slot,
                mps_percent: w.mps_percent,
                batch: w.batch,
                processes: w.processes,
                shadow_mps_percent: w.shadow_mps_percent,
                slo_ms: w.slo_ms,
                batch_ms: w.batch_ms,
                runtime: (!w.runtime.is_empty()).then(|| w.runtime.clone()),
                model_uri: w.model_uri.clone(),
                retiring: w.retiring,
            });
        }
        if let Some((slot, total)) = share.iter().find(|(_, &t)| t > 100.0 + 1e-6) {
            return Err(refuse(field("workloads"), format!("MPS shares on {slot:?} add up to {total:.1}%, more than 100%")));
        }
        // The controller plans within the tenants' boundaries; a desired state across one
        // (a defect, or a forged plan) would mix tenants in one fault domain.
        check_gpu(boundaries.iter().map(|(slot, b)| (*slot, b)), |slot| match slot {
            Slot::WholeGpu => "the GPU's MPS server".to_string(),
            Slot::Mig(p) => format!("the MPS server of MIG instance {}@{}", p.profile, p.start),
        })
        .map_err(|e| refuse(field("workloads"), e))?;
        gpus.insert(g.gpu_uuid.clone(), GpuDesired { layout, workloads });
    }
    Ok(NodeDesired { version: state.version, gpus, callers, runtimes, trace_parent: state.trace_parent.clone() })
}

/// Most runtimes one desired state may carry: each is named by a workload, and a node runs
/// far fewer distinct servers than this.
const MAX_RUNTIMES: usize = 64;

/// The runtimes, checked as the controller checks a ServingRuntime (one validation).
fn decode_runtimes(list: &[proto::AgentRuntime]) -> Result<BTreeMap<String, ServingRuntimeSpec>, RefusedPlan> {
    if list.len() > MAX_RUNTIMES {
        return Err(refuse("runtimes".into(), format!("{} runtimes; at most {MAX_RUNTIMES}", list.len())));
    }
    let mut runtimes = BTreeMap::new();
    for (i, r) in list.iter().enumerate() {
        let spec = Spec::from_json(Kind::ServingRuntime, &r.spec_json)
            .and_then(|spec| validate_spec(&spec).map(|()| spec))
            .map_err(|e| refuse(format!("runtimes[{i}].{}", e.field), e.reason))?;
        let Spec::ServingRuntime(spec) = spec else {
            return Err(refuse(format!("runtimes[{i}]"), "not a ServingRuntime"));
        };
        if runtimes.insert(r.name.clone(), spec).is_some() {
            return Err(refuse(format!("runtimes[{i}].name"), format!("{:?} appears twice", r.name)));
        }
    }
    Ok(runtimes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(layout: &[(&str, u32)], workloads: Vec<proto::AgentWorkload>) -> proto::DesiredState {
        proto::DesiredState {
            node: "n1".into(),
            version: 7,
            gpus: vec![proto::AgentGpu {
                gpu_uuid: "GPU-0".into(),
                mig_layout: layout.iter().map(|&(p, s)| proto::AgentMigInstance { profile: p.into(), start: s }).collect(),
                workloads,
            }],
            ..Default::default()
        }
    }

    fn workload(mig_instance: i32, pct: f64) -> proto::AgentWorkload {
        proto::AgentWorkload {
            service: "s".into(),
            model: "resnet50".into(),
            mig_instance,
            mps_percent: pct,
            batch: 8,
            processes: 1,
            shadow_mps_percent: 10.0,
            slo_ms: 50.0,
            ..Default::default()
        }
    }

    fn of_tenant(w: proto::AgentWorkload, service: &str, tenant: &str, isolation: &str) -> proto::AgentWorkload {
        proto::AgentWorkload { service: service.into(), tenant: tenant.into(), isolation: isolation.into(), ..w }
    }

    fn models() -> BTreeMap<String, GpuModel> {
        [("GPU-0".to_string(), GpuModel::A100_80GB)].into()
    }

    #[test]
    fn a_legal_plan_decodes() {
        let d = decode(&state(&[("4g", 0), ("3g.40gb", 4)], vec![workload(1, 50.0), workload(0, 100.0)]), "n1", &models()).unwrap();
        assert_eq!(d.version, 7);
        let g = &d.gpus["GPU-0"];
        assert_eq!(g.layout.len(), 2);
        assert_eq!(g.workloads[0].slot, Slot::Mig(Placement::new(planner::mig::MigProfile::G3, 4)));
    }

    #[test]
    fn runtimes_are_checked_as_the_controller_checks_them_and_must_be_carried() {
        let runtime = |json: &str| proto::AgentRuntime { name: "triton".into(), spec_json: json.into() };
        let served = proto::AgentWorkload { runtime: "triton".into(), model_uri: "/models".into(), ..workload(-1, 50.0) };
        let mut ok = state(&[], vec![served.clone()]);
        ok.runtimes = vec![runtime(r#"{"program": "tritonserver", "args": ["--grpc-port={port}"], "cold_start_s": 8}"#)];
        let d = decode(&ok, "n1", &models()).unwrap();
        assert_eq!(d.runtimes["triton"].program, "tritonserver");
        assert_eq!(d.gpus["GPU-0"].workloads[0].runtime.as_deref(), Some("triton"));
        assert_eq!(d.gpus["GPU-0"].workloads[0].model_uri, "/models");
        let missing = state(&[], vec![served.clone()]);
        assert_eq!(decode(&missing, "n1", &models()).unwrap_err().field, "gpus[0].workloads[0].runtime");
        let mut bad = state(&[], vec![served]);
        bad.runtimes = vec![runtime(r#"{"program": "x", "env": {"CUDA_VISIBLE_DEVICES": "all"}, "cold_start_s": 1}"#)];
        assert_eq!(decode(&bad, "n1", &models()).unwrap_err().field, "runtimes[0].spec.env.CUDA_VISIBLE_DEVICES");
    }

    #[test]
    fn tenants_share_what_their_isolation_allows() {
        let shared =
            state(&[], vec![of_tenant(workload(-1, 40.0), "a", "t1", "shared"), of_tenant(workload(-1, 40.0), "b", "t2", "shared")]);
        assert!(decode(&shared, "n1", &models()).is_ok());
        let apart = state(
            &[("4g", 0), ("3g", 4)],
            vec![of_tenant(workload(0, 50.0), "a", "t1", "mig"), of_tenant(workload(1, 50.0), "b", "t2", "mig")],
        );
        assert!(decode(&apart, "n1", &models()).is_ok());
    }

    #[test]
    fn illegal_plans_are_refused_with_the_field() {
        let cases: Vec<(proto::DesiredState, &str)> = vec![
            (state(&[("3g", 2)], vec![]), "gpus[0].mig_layout"),
            (state(&[("4g", 0), ("4g", 0)], vec![]), "gpus[0].mig_layout"),
            (state(&[("5g", 0)], vec![]), "gpus[0].mig_layout[0].profile"),
            (state(&[("4g", 0)], vec![workload(3, 50.0)]), "gpus[0].workloads[0].mig_instance"),
            (state(&[("4g", 0)], vec![workload(-1, 50.0)]), "gpus[0].workloads[0].mig_instance"),
            (state(&[], vec![workload(-1, 0.0)]), "gpus[0].workloads[0].mps_percent"),
            (state(&[], vec![workload(-1, 60.0), workload(-1, 60.0)]), "gpus[0].workloads"),
            (state(&[], vec![proto::AgentWorkload { batch_ms: -1.0, ..workload(-1, 50.0) }]), "gpus[0].workloads[0].batch_ms"),
            (state(&[], vec![proto::AgentWorkload { batch_ms: f64::NAN, ..workload(-1, 50.0) }]), "gpus[0].workloads[0].batch_ms"),
            (state(&[], vec![proto::AgentWorkload { batch_ms: 1e12, ..workload(-1, 50.0) }]), "gpus[0].workloads[0].batch_ms"),
        ];
        for (s, field) in cases {
            let err = decode(&s, "n1", &models()).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        let crossing: Vec<(proto::DesiredState, &str)> = vec![
            // Two tenants under the GPU's one MPS server, one of them not shared.
            (state(&[], vec![of_tenant(workload(-1, 40.0), "a", "t1", "shared"), of_tenant(workload(-1, 40.0), "b", "t2", "mig")]), "mig"),
            // A dedicated tenant beside another on separate MIG instances.
            (
                state(
                    &[("4g", 0), ("3g", 4)],
                    vec![of_tenant(workload(0, 50.0), "a", "t1", "dedicated"), of_tenant(workload(1, 50.0), "b", "t2", "mig")],
                ),
                "dedicated tenant \"t1\"",
            ),
        ];
        for (s, reason) in crossing {
            let err = decode(&s, "n1", &models()).unwrap_err();
            assert_eq!(err.field, "gpus[0].workloads", "{err}");
            assert!(err.reason.contains(reason), "{err}");
        }
        let unknown = state(&[], vec![of_tenant(workload(-1, 40.0), "a", "t1", "none")]);
        assert_eq!(decode(&unknown, "n1", &models()).unwrap_err().field, "gpus[0].workloads[0].isolation");
        let mut other = state(&[], vec![]);
        other.gpus[0].gpu_uuid = "GPU-9".into();
        assert_eq!(decode(&other, "n1", &models()).unwrap_err().field, "gpus[0].gpu_uuid");
        assert_eq!(decode(&state(&[], vec![]), "n2", &models()).unwrap_err().field, "node");
    }
}
