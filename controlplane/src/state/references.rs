//! Referential integrity: a resource may only name resources that exist, and a resource
//! that others name cannot be deleted.

use super::ClusterState;
use crate::resources::{ErrorCode, FieldError, Kind, ServingRuntimeSpec, Spec};

fn must_exist(state: &ClusterState, field: &str, kind: Kind, name: &str) -> Result<(), FieldError> {
    if state.get(kind, name).is_none() {
        return Err(FieldError::new(ErrorCode::NotFound, field, format!("{kind} {name:?} does not exist")));
    }
    Ok(())
}

pub(super) fn check_references(state: &ClusterState, name: &str, _tenant: &str, spec: &Spec) -> Result<(), FieldError> {
    match spec {
        Spec::Tenant(_) | Spec::GpuModel(_) | Spec::Plan(_) => {}
        Spec::ServingRuntime(new) => runtime_unchanged_while_used(state, name, new)?,
        Spec::InstanceType(it) => must_exist(state, "spec.gpu_model", Kind::GpuModel, &it.gpu_model)?,
        Spec::ModelProfile(p) => must_exist(state, "spec.gpu_model", Kind::GpuModel, &p.gpu_model)?,
        Spec::Service(s) => {
            let profiled = state.list(Kind::ModelProfile).any(|r| matches!(&r.spec, Spec::ModelProfile(p) if p.model == s.model));
            if !profiled {
                return Err(FieldError::new(ErrorCode::NotFound, "spec.model", format!("no ModelProfile exists for model {:?}", s.model)));
            }
            if let Some(runtime) = &s.runtime {
                must_exist(state, "spec.runtime", Kind::ServingRuntime, runtime)?;
            }
            for (i, gpu) in s.allowed_gpu_models.iter().enumerate() {
                must_exist(state, &format!("spec.allowed_gpu_models[{i}]"), Kind::GpuModel, gpu)?;
            }
            for (i, it) in s.allowed_instance_types.iter().enumerate() {
                must_exist(state, &format!("spec.allowed_instance_types[{i}]"), Kind::InstanceType, it)?;
            }
        }
        Spec::Node(n) => {
            must_exist(state, "spec.instance_type", Kind::InstanceType, &n.instance_type)?;
            // A node has at most the GPUs of its instance type: a host that declared 64 on a
            // 1-GPU type would be planned 64 GPUs of other tenants' workloads.
            if let Some(Spec::InstanceType(it)) = state.get(Kind::InstanceType, &n.instance_type).map(|r| &r.spec) {
                if n.gpus.len() > it.gpu_count as usize {
                    return Err(FieldError::invalid(
                        "spec.gpus",
                        format!("lists {} GPUs; instance type {:?} has {}", n.gpus.len(), n.instance_type, it.gpu_count),
                    ));
                }
            }
            for (i, gpu) in n.gpus.iter().enumerate() {
                must_exist(state, &format!("spec.gpus[{i}].model"), Kind::GpuModel, &gpu.model)?;
            }
        }
    }
    Ok(())
}

/// A ServingRuntime a Service names is immutable: its processes were launched with it, and
/// agents launch new ones from the runtime the desired state carries, so a change in place
/// would run two launches of one service side by side. A new version is a new runtime that
/// services move to (each move restarts only that service's processes).
fn runtime_unchanged_while_used(state: &ClusterState, name: &str, new: &ServingRuntimeSpec) -> Result<(), FieldError> {
    let Some(Spec::ServingRuntime(old)) = state.get(Kind::ServingRuntime, name).map(|r| &r.spec) else { return Ok(()) };
    if old == new {
        return Ok(());
    }
    let user = state.list(Kind::Service).find(|r| matches!(&r.spec, Spec::Service(s) if s.runtime.as_deref() == Some(name)));
    match user {
        Some(service) => Err(FieldError::new(
            ErrorCode::FailedPrecondition,
            "spec",
            format!(
                "ServingRuntime {name:?} is in use by Service {:?} and cannot change; create a new runtime and point the services at it",
                service.name
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses to delete a resource that another one names (a GPU model still used by an
/// instance type, a tenant that still owns services, ...).
pub(super) fn check_not_referenced(state: &ClusterState, kind: Kind, name: &str) -> Result<(), FieldError> {
    let user = |by: Kind, user: &str| {
        Err(FieldError::new(ErrorCode::FailedPrecondition, "name", format!("{kind} {name:?} is still referenced by {by} {user:?}")))
    };
    for kind_of_user in Kind::ALL {
        for r in state.list(kind_of_user) {
            let refers = match (&r.spec, kind) {
                (Spec::Service(_), Kind::Tenant) => r.tenant == name,
                (Spec::InstanceType(it), Kind::GpuModel) => it.gpu_model == name,
                (Spec::ModelProfile(p), Kind::GpuModel) => p.gpu_model == name,
                (Spec::Service(s), Kind::GpuModel) => s.allowed_gpu_models.iter().any(|g| g == name),
                (Spec::Service(s), Kind::InstanceType) => s.allowed_instance_types.iter().any(|g| g == name),
                (Spec::Node(n), Kind::InstanceType) => n.instance_type == name,
                (Spec::Node(n), Kind::GpuModel) => n.gpus.iter().any(|g| g.model == name),
                (Spec::Service(s), Kind::ServingRuntime) => s.runtime.as_deref() == Some(name),
                _ => false,
            };
            if refers {
                return user(kind_of_user, &r.name);
            }
        }
    }
    Ok(())
}
