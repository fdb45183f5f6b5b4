//! Rules that depend on other resources: a tenant's `max_services`, a new Service's name
//! (not another tenant's, not a look-alike of one that exists), one ModelProfile per
//! (model, GPU model), and what a node's own registration may change. Checked at apply
//! like every other rule, so two racing creates cannot both pass.

use super::ClusterState;
use crate::resources::limits::MAX_SERVICES_PER_TENANT;
use crate::resources::{ErrorCode, FieldError, Kind, Spec, StoredResource};

pub(super) fn check_limits(state: &ClusterState, name: &str, tenant: &str, spec: &Spec) -> Result<(), FieldError> {
    let exists = state.get(spec.kind(), name).is_some();
    match spec {
        Spec::Service(_) if !exists => {
            check_service_name(state, name, tenant)?;
            check_service_quota(state, tenant)
        }
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

/// A node agent's registration ([`super::WriteMode::NodeRegistration`]) of a Node that
/// exists keeps its address and instance type: an agent that could move its address could
/// report endpoints on another host (the report check compares them with it), and one that
/// could change its instance type could claim GPUs it does not have.
pub(super) fn check_registration(current: &StoredResource, spec: &Spec) -> Result<(), FieldError> {
    let (Spec::Node(was), Spec::Node(now)) = (&current.spec, spec) else { return Ok(()) };
    let fixed = |field: &str, was: &str, now: &str| {
        FieldError::new(
            ErrorCode::FailedPrecondition,
            field,
            format!(
                "Node {:?} was registered with {field} {was:?}; its agent may not change it to {now:?} (an admin may, by writing \
                 the Node)",
                current.name
            ),
        )
    };
    if was.address != now.address {
        return Err(fixed("spec.address", &was.address, &now.address));
    }
    if was.instance_type != now.instance_type {
        return Err(fixed("spec.instance_type", &was.instance_type, &now.instance_type));
    }
    Ok(())
}

/// What a name looks like to a reader: ASCII letters that look alike in common fonts
/// (`I`/`l`/`1`/`L`, `O`/`0`, `rn`/`m`), case and the separators `.`, `_`, `-` made one.
/// Two names with one skeleton are look-alikes (`Globex-Web`, `gIobex-web`, `acrne-web`).
pub fn name_skeleton(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| match c {
            'I' | 'L' | '1' | '|' => 'l',
            'O' | '0' => 'o',
            '.' | '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    mapped.replace("rn", "m")
}

/// A new Service's name may not begin with another tenant's name (or a look-alike of it)
/// followed by `-`, nor be that name: `globex-web` is tenant globex's to take. Nor may it
/// look like an existing Service's name, whoever owns that one. The refusals do not name
/// the other tenant or its service. O(tenants + services), as the quota count beside it.
fn check_service_name(state: &ClusterState, name: &str, tenant: &str) -> Result<(), FieldError> {
    let skeleton = name_skeleton(name);
    let reserved = state.list(Kind::Tenant).filter(|t| t.name != tenant).any(|t| {
        let other = name_skeleton(&t.name);
        skeleton.strip_prefix(other.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
    });
    if reserved {
        return Err(FieldError::invalid(
            "name",
            format!(
                "{name:?} begins with another tenant's name (or one that looks like it); such Service names are that tenant's \
                 to take: begin your Service names with \"{tenant}-\""
            ),
        ));
    }
    if let Some(like) = state.list(Kind::Service).find(|s| s.name != name && name_skeleton(&s.name) == skeleton) {
        let which = if like.tenant == tenant { format!("your Service {:?}", like.name) } else { "an existing Service".to_string() };
        return Err(FieldError::new(
            ErrorCode::AlreadyExists,
            "name",
            format!(
                "{name:?} looks like the name of {which} (letters that look alike: I, l, 1; O, 0; case; '.', '_', '-'); choose another"
            ),
        ));
    }
    Ok(())
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
