//! Limits that depend on other resources: a tenant's `max_services`, and one ModelProfile
//! per (model, GPU model). Checked at apply like every other rule, so two racing creates
//! cannot both pass.

use super::ClusterState;
use crate::resources::limits::MAX_SERVICES_PER_TENANT;
use crate::resources::{ErrorCode, FieldError, Kind, Spec};

pub(super) fn check_limits(state: &ClusterState, name: &str, tenant: &str, spec: &Spec) -> Result<(), FieldError> {
    let exists = state.get(spec.kind(), name).is_some();
    match spec {
        Spec::Service(_) if !exists => check_service_quota(state, tenant),
        Spec::ModelProfile(p) => {
            let other = state
                .list(Kind::ModelProfile)
                .find(|r| r.name != name && matches!(&r.spec, Spec::ModelProfile(o) if o.model == p.model && o.gpu_model == p.gpu_model));
            match other {
                Some(first) => Err(FieldError::new(
                    ErrorCode::AlreadyExists,
                    "spec.model",
                    format!(
                        "ModelProfile {:?} already profiles model {:?} on GPU model {:?}; update it instead of adding a second one",
                        first.name, p.model, p.gpu_model
                    ),
                )),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// A new service of `tenant` must stay within its `max_services` (or the global bound).
fn check_service_quota(state: &ClusterState, tenant: &str) -> Result<(), FieldError> {
    let declared = state.get(Kind::Tenant, tenant).and_then(|t| match &t.spec {
        Spec::Tenant(t) => t.max_services,
        _ => None,
    });
    let limit = declared.unwrap_or(MAX_SERVICES_PER_TENANT).min(MAX_SERVICES_PER_TENANT);
    let used = state.list(Kind::Service).filter(|s| s.tenant == tenant).count();
    if used >= limit as usize {
        let source = if declared.is_some() { "the tenant's spec.max_services" } else { "the cluster's limit" };
        return Err(FieldError::new(
            ErrorCode::ResourceExhausted,
            "tenant",
            format!("tenant {tenant:?} already has {used} services; {source} is {limit}"),
        ));
    }
    Ok(())
}
