//! What each principal may read and write through the resource API (README, "Security").
//! Tenants see their own Tenant and Services and the catalogue (GPU models, instance types,
//! model profiles, serving runtimes); agents see the catalogue and their own Node; Nodes and Plans (which
//! show every tenant's placements) and status writes are for admins.

use super::errors::permission_denied;
use tonic::Status;

use crate::resources::{Kind, StoredResource};
use crate::security::Principal;

/// Which resources of one kind a principal may see.
pub enum Visibility {
    All,
    /// Resources of this tenant only.
    OfTenant(String),
    /// The one resource of this name.
    Named(String),
    Nothing,
}

impl Visibility {
    pub fn of(principal: &Principal, kind: Kind) -> Self {
        let catalogue = matches!(kind, Kind::GpuModel | Kind::InstanceType | Kind::ModelProfile | Kind::ServingRuntime);
        match principal {
            p if p.is_admin() => Visibility::All,
            _ if catalogue => Visibility::All,
            Principal::Tenant(t) if kind == Kind::Service => Visibility::OfTenant(t.clone()),
            Principal::Tenant(t) if kind == Kind::Tenant => Visibility::Named(t.clone()),
            Principal::Node(n) if kind == Kind::Node => Visibility::Named(n.clone()),
            _ => Visibility::Nothing,
        }
    }

    pub fn allows(&self, r: &StoredResource) -> bool {
        match self {
            Visibility::All => true,
            Visibility::OfTenant(t) => r.tenant == *t,
            Visibility::Named(n) => r.name == *n,
            Visibility::Nothing => false,
        }
    }
}

/// Refuses a kind the principal may not see at all.
pub fn may_read_kind(principal: &Principal, kind: Kind) -> Result<Visibility, Status> {
    match Visibility::of(principal, kind) {
        Visibility::Nothing => Err(permission_denied("kind", format!("{principal} may not read {kind} resources"))),
        v => Ok(v),
    }
}

/// Checks a write of `kind`/`name` with `tenant` against the principal; `existing` is the
/// resource as this controller sees it now. Messages never name another tenant.
pub fn may_write(
    principal: &Principal,
    kind: Kind,
    name: &str,
    tenant: &str,
    status_only: bool,
    existing: Option<&StoredResource>,
) -> Result<(), Status> {
    if principal.is_admin() {
        return Ok(());
    }
    if status_only {
        return Err(permission_denied("status_only", format!("{principal} may not write the status of resources")));
    }
    match principal {
        Principal::Tenant(t) if kind == Kind::Service => {
            if tenant != t {
                return Err(permission_denied("tenant", format!("{principal} may write only its own tenant's services")));
            }
            if existing.is_some_and(|r| r.tenant != *t) {
                return Err(permission_denied("name", format!("Service {name:?} belongs to another tenant")));
            }
            Ok(())
        }
        Principal::Node(n) if kind == Kind::Node => {
            if name != n {
                return Err(permission_denied("name", format!("{principal} may write only its own Node, not {name:?}")));
            }
            Ok(())
        }
        _ => Err(permission_denied("kind", format!("{principal} may not write {kind} resources"))),
    }
}

/// Cluster-wide operations (membership, elections).
pub fn require_admin(principal: &Principal, what: &str) -> Result<(), Status> {
    if principal.is_admin() {
        Ok(())
    } else {
        Err(Status::permission_denied(format!("{what} needs an admin identity; {principal} is not one")))
    }
}
