//! The replicated state machine: pure `apply(command) -> outcome` over the domain model.
//! No IO, no clocks: the log index is the only notion of time, so every replica computes
//! exactly the same state from the same log.

mod admission;
mod command;
mod desired_index;
mod gpu_owners;
mod references;

pub use command::{BatchItem, ChangeEvent, ChangeType, Command, CommandOutcome, CommandResult, Proposal, Request, StatusPut, WriteMode};
pub use desired_index::DesiredIndex;
pub use gpu_owners::GpuOwners;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::resources::{validate_name, validate_spec, ErrorCode, FieldError, Kind, Spec, StoredResource};

/// How many applied request ids are remembered for de-duplication. A client retries within
/// seconds; 100k writes of history is minutes even at bench rates.
pub const DEDUP_WINDOW: usize = 100_000;

/// Resources written by the requests of one log entry so far (see
/// [`ClusterState::apply_in_entry`]); one per entry, dropped after it.
#[derive(Default)]
pub struct EntryWrites(BTreeMap<Kind, std::collections::HashSet<String>>);

impl EntryWrites {
    /// Records what `request` writes, or refuses it if an earlier request wrote any of it.
    /// Looked up by name without copying it: this runs for every request, on the leader's
    /// proposer and in every controller's apply.
    pub fn claim(&mut self, request: &Request) -> Result<(), FieldError> {
        let resources = request.resources();
        if let Some((kind, name)) = resources.iter().find(|(kind, name)| self.0.get(kind).is_some_and(|names| names.contains(*name))) {
            return Err(FieldError::new(
                ErrorCode::FailedPrecondition,
                "request_id",
                format!("{kind:?} {name:?} was written by an earlier request of the same log entry; retry the request"),
            ));
        }
        for (kind, name) in resources {
            self.0.entry(kind).or_default().insert(name.to_string());
        }
        Ok(())
    }
}

/// The resources by kind, then by name. Persistent maps (`imbl`), like the de-duplication
/// record: a snapshot copies them in O(1) under the state lock, sharing every node with the
/// live state, and encodes the copy outside it (a deep copy took 1.3 s at 10,000 hosts,
/// during which no entry could be applied).
///
/// Each resource is behind an `Arc`: changing one copies the map's path to it, and every
/// sibling in a copied leaf (up to 64) was copied whole, a Node's GPUs with it, for every
/// status written (perf at 10,000 hosts: 3% of the controllers' CPU); now only pointers.
/// Names are shared too (`Arc<str>`), so a copied leaf allocates no strings.
type Resources = BTreeMap<Kind, imbl::OrdMap<Arc<str>, Arc<StoredResource>>>;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(from = "PersistedState")]
pub struct ClusterState {
    resources: Resources,
    /// request id -> outcome, for retried writes. Ordered: a snapshot serialises the same
    /// state to the same bytes on every controller and in every run. Ids and outcomes are
    /// shared, not owned: every write records one, and the persistent map and vector then
    /// copy the leaf they change (up to 64 entries), which cost a string and a whole
    /// resource per entry copied (11% of the leader's CPU under 64 writers, `perf`).
    applied_requests: imbl::OrdMap<Arc<str>, Arc<CommandResult>>,
    /// Insertion order of `applied_requests`, oldest first, to bound it.
    applied_order: imbl::Vector<Arc<str>>,
    /// Log index of the last applied command.
    revision: u64,
    /// What each node is to run, and since which index (see `desired_index`).
    desired: DesiredIndex,
    /// Which Node registered each GPU uuid (derived from the Nodes, see `gpu_owners`).
    gpu_owners: GpuOwners,
}

/// [`ClusterState`] as stored in snapshots: the derived parts of the desired-state index
/// are rebuilt when it is read back.
#[derive(Deserialize)]
struct PersistedState {
    resources: Resources,
    applied_requests: imbl::OrdMap<Arc<str>, Arc<CommandResult>>,
    applied_order: imbl::Vector<Arc<str>>,
    revision: u64,
    /// Absent in snapshots from before per-node versions.
    #[serde(default)]
    desired: imbl::OrdMap<String, u64>,
}

/// What a snapshot of a [`ClusterState`] holds, taken in O(1) ([`ClusterState::persisted`])
/// and encoded as `PersistedState` reads it back.
#[derive(Clone, Serialize)]
pub struct PersistedCopy {
    resources: Resources,
    applied_requests: imbl::OrdMap<Arc<str>, Arc<CommandResult>>,
    applied_order: imbl::Vector<Arc<str>>,
    revision: u64,
    desired: imbl::OrdMap<String, u64>,
}

impl Serialize for ClusterState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.persisted().serialize(s)
    }
}

impl From<PersistedState> for ClusterState {
    fn from(p: PersistedState) -> Self {
        let plans = p.resources.get(&Kind::Plan).into_iter().flat_map(|m| m.values()).map(Arc::as_ref);
        let desired = DesiredIndex::rebuild(p.desired, plans);
        let nodes = p.resources.get(&Kind::Node).into_iter().flat_map(|m| m.values()).filter_map(|r| match &r.spec {
            Spec::Node(n) => Some((r.name.as_str(), n)),
            _ => None,
        });
        let gpu_owners = GpuOwners::rebuild(nodes);
        ClusterState {
            resources: p.resources,
            applied_requests: p.applied_requests,
            applied_order: p.applied_order,
            revision: p.revision,
            desired,
            gpu_owners,
        }
    }
}

impl ClusterState {
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// What a snapshot holds, in O(1): the persistent maps share their nodes with `self`.
    pub fn persisted(&self) -> PersistedCopy {
        PersistedCopy {
            resources: self.resources.clone(),
            applied_requests: self.applied_requests.clone(),
            applied_order: self.applied_order.clone(),
            revision: self.revision,
            desired: self.desired.versions().clone(),
        }
    }

    /// The resources alone, in O(1) (persistent maps): for reading them off the state lock,
    /// e.g. a planning pass over the whole fleet. Its desired-state index and request
    /// records are empty: never apply to it.
    pub fn resources_only(&self) -> ClusterState {
        ClusterState { resources: self.resources.clone(), revision: self.revision, ..ClusterState::default() }
    }

    /// [`ClusterState::resources_only`] without the Services, Nodes and Plans: the
    /// catalogue (GPU models, instance types, profiles) and the Tenants, for planning a few
    /// services alone at a cost that does not grow with the fleet.
    pub fn catalogue_only(&self) -> ClusterState {
        let mut catalogue = self.resources_only();
        for kind in [Kind::Service, Kind::Node, Kind::Plan] {
            catalogue.resources.remove(&kind);
        }
        catalogue
    }

    /// [`ClusterState::resources_only`] with `spec` put as `name` of `tenant`, with no
    /// status: what planning would read were the put applied, for a check made before it is
    /// proposed (a Service against its tenant's quota). A new resource gets the next
    /// revision as its creation; never apply to it.
    pub fn resources_with(&self, name: &str, tenant: &str, spec: Spec) -> ClusterState {
        let mut what_if = self.resources_only();
        let kind = spec.kind();
        let create_revision = self.get(kind, name).map_or(self.revision + 1, |r| r.create_revision);
        let resource = StoredResource {
            name: name.to_string(),
            tenant: tenant.to_string(),
            resource_version: self.revision + 1,
            spec,
            status: Default::default(),
            create_revision,
            mod_revision: self.revision + 1,
        };
        what_if.resources.entry(kind).or_default().insert(Arc::from(name), Arc::new(resource));
        what_if
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<&StoredResource> {
        self.resources.get(&kind)?.get(name).map(Arc::as_ref)
    }

    pub fn list(&self, kind: Kind) -> impl Iterator<Item = &StoredResource> {
        self.resources.get(&kind).into_iter().flat_map(|m| m.values()).map(Arc::as_ref)
    }

    /// What the committed Plans place on each node, and each node's desired version.
    pub fn desired(&self) -> &DesiredIndex {
        &self.desired
    }

    /// Which Node registered each GPU uuid.
    pub fn gpu_owners(&self) -> &GpuOwners {
        &self.gpu_owners
    }

    /// The nodes whose desired state changed since the last call (to wake their watchers).
    pub fn take_touched_nodes(&mut self) -> std::collections::BTreeSet<String> {
        self.desired.take_touched()
    }

    /// How many resources of `kind` there are, in O(1).
    pub fn count(&self, kind: Kind) -> usize {
        self.resources.get(&kind).map_or(0, imbl::OrdMap::len)
    }

    pub fn len(&self) -> usize {
        self.resources.values().map(imbl::OrdMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The recorded outcome of an already applied request id.
    pub fn applied_outcome(&self, request_id: &str) -> Option<&CommandResult> {
        self.applied_requests.get(request_id).map(Arc::as_ref)
    }

    /// Checks whether `request` would be accepted now, without changing anything. The leader
    /// runs this before proposing so that bad input never reaches the log.
    pub fn check(&self, request: &Request) -> Result<(), FieldError> {
        if self.applied_requests.contains_key(request.request_id.as_str()) {
            return Ok(());
        }
        match &request.command {
            Command::Batch { puts } => self.plan_batch(puts).map(|_| ()),
            Command::PutStatuses { kind, statuses } => self.check_statuses(*kind, statuses),
            command => self.plan_change(command).map(|_| ()),
        }
    }

    /// Applies a committed request at log index `index`. Refused commands change nothing
    /// but their outcome is recorded, so a retry gets the same answer.
    pub fn apply(&mut self, index: u64, request: &Request) -> (CommandResult, Vec<ChangeEvent>) {
        self.apply_in_entry(index, request, &mut EntryWrites::default())
    }

    /// Applies one request of the log entry at `index`, after the entry's earlier ones
    /// (`written` names what they wrote). A request that would write a resource an earlier
    /// one of the same entry wrote is refused: both changes would carry revision `index`,
    /// and what is keyed by revision (a watch resuming after it, a node's desired version)
    /// could not tell the two states apart. The leader's proposer never groups such
    /// requests; this holds the line against any entry that does. The refusal is not
    /// remembered for the request id: a retry in an entry of its own is applied.
    pub fn apply_in_entry(&mut self, index: u64, request: &Request, written: &mut EntryWrites) -> (CommandResult, Vec<ChangeEvent>) {
        self.revision = index;
        if let Some(previous) = self.applied_requests.get(request.request_id.as_str()) {
            let mut outcome = CommandResult::clone(previous);
            if let Ok(o) = &mut outcome {
                o.deduplicated = true;
            }
            return (outcome, Vec::new());
        }
        if let Err(e) = written.claim(request) {
            return (Err(e), Vec::new());
        }
        let result = match &request.command {
            Command::Batch { puts } => self.plan_batch(puts).map(|changes| self.commit_batch(index, changes)),
            Command::PutStatuses { kind, statuses } => self.plan_statuses(*kind, statuses).map(|changes| self.commit_batch(index, changes)),
            command => self.plan_change(command).map(|change| {
                let (outcome, event) = self.commit_change(index, change);
                (outcome, vec![event])
            }),
        };
        let (result, events) = match result {
            Ok((outcome, events)) => (Ok(outcome), events),
            Err(e) => (Err(e), Vec::new()),
        };
        self.remember(&request.request_id, &result);
        (result, events)
    }

    /// Checks the puts of a batch in order, each against the state the ones before it
    /// leave, on a copy of the resources (O(1): persistent maps; the desired-state index
    /// is left out, as no check reads it). Changes nothing.
    fn plan_batch(&self, puts: &[Command]) -> Result<Vec<PlannedChange>, FieldError> {
        use crate::resources::limits::MAX_BATCH_PUTS;
        if puts.is_empty() || puts.len() > MAX_BATCH_PUTS {
            return Err(FieldError::invalid("puts", format!("{} puts; a batch holds 1 to {MAX_BATCH_PUTS}", puts.len())));
        }
        let mut trial = ClusterState {
            resources: self.resources.clone(),
            revision: self.revision,
            gpu_owners: self.gpu_owners.clone(),
            ..ClusterState::default()
        };
        let mut changes = Vec::with_capacity(puts.len());
        for (i, put) in puts.iter().enumerate() {
            let in_batch = |e: FieldError| FieldError { field: format!("puts[{i}].{}", e.field), ..e };
            match put {
                Command::Put { spec: Spec::Plan(_), .. } => {
                    return Err(FieldError::invalid(format!("puts[{i}].kind"), "a Plan is written on its own, not in a batch"));
                }
                Command::Put { .. } => {}
                _ => return Err(FieldError::invalid(format!("puts[{i}]"), "a batch holds puts of resources only")),
            }
            let change = trial.plan_change(put).map_err(in_batch)?;
            trial.commit_change(self.revision, change.clone());
            changes.push(change);
        }
        Ok(changes)
    }

    /// The status writes of a `PutStatuses` for the resources that still exist; refused
    /// only when the count is out of bounds or none of them exists.
    fn plan_statuses(&self, kind: Kind, statuses: &[StatusPut]) -> Result<Vec<PlannedChange>, FieldError> {
        self.check_statuses(kind, statuses)?;
        Ok(statuses
            .iter()
            .filter(|s| self.get(kind, &s.name).is_some())
            .map(|s| PlannedChange::Status { kind, name: s.name.clone(), status: s.status.clone() })
            .collect())
    }

    /// What `plan_statuses` refuses, without copying the statuses (`check` only asks).
    fn check_statuses(&self, kind: Kind, statuses: &[StatusPut]) -> Result<(), FieldError> {
        use crate::resources::limits::MAX_STATUSES_PER_ENTRY;
        if statuses.is_empty() || statuses.len() > MAX_STATUSES_PER_ENTRY {
            return Err(FieldError::invalid(
                "statuses",
                format!("{} statuses; one entry holds 1 to {MAX_STATUSES_PER_ENTRY}", statuses.len()),
            ));
        }
        if !statuses.iter().any(|s| self.get(kind, &s.name).is_some()) {
            return Err(FieldError::new(
                ErrorCode::NotFound,
                "statuses",
                format!("none of the {} {kind}s exists (first: {:?})", statuses.len(), statuses[0].name),
            ));
        }
        Ok(())
    }

    fn commit_batch(&mut self, index: u64, changes: Vec<PlannedChange>) -> (CommandOutcome, Vec<ChangeEvent>) {
        let mut events = Vec::with_capacity(changes.len());
        let mut batch = Vec::with_capacity(changes.len());
        for change in changes {
            let (_, event) = self.commit_change(index, change);
            let r = &event.resource;
            let created = r.create_revision == index;
            batch.push(BatchItem { kind: r.kind(), name: r.name.clone(), resource_version: r.resource_version, created });
            events.push(event);
        }
        let resource = events.last().expect("plan_batch refuses an empty batch").resource.clone();
        (CommandOutcome { resource, deduplicated: false, batch }, events)
    }

    /// Advances the revision for log entries that carry no command (blank, membership).
    pub fn note_index(&mut self, index: u64) {
        self.revision = index;
    }

    fn remember(&mut self, request_id: &str, result: &CommandResult) {
        if request_id.is_empty() {
            return;
        }
        let id: Arc<str> = Arc::from(request_id);
        self.applied_requests.insert(id.clone(), Arc::new(result.clone()));
        self.applied_order.push_back(id);
        while self.applied_order.len() > DEDUP_WINDOW {
            if let Some(old) = self.applied_order.pop_front() {
                self.applied_requests.remove(&old);
            }
        }
    }

    /// Validates a command against the current state and describes the change it makes.
    fn plan_change(&self, command: &Command) -> Result<PlannedChange, FieldError> {
        match command {
            Command::Put { name, tenant, spec, mode, expected_version } => {
                let kind = spec.kind();
                validate_name("name", name)?;
                validate_spec(spec)?;
                self.check_tenant(kind, tenant)?;
                // Before the count against the instance type: a claim of another node's
                // GPU is named as such.
                if let Spec::Node(node) = spec {
                    self.gpu_owners.check_claim(name, node)?;
                }
                references::check_references(self, name, tenant, spec)?;
                admission::check_limits(self, name, tenant, spec)?;
                let existing = self.get(kind, name);
                match (existing, mode) {
                    (Some(_), WriteMode::Create) => {
                        return Err(FieldError::new(ErrorCode::AlreadyExists, "name", format!("{kind} {name:?} already exists")));
                    }
                    (_, WriteMode::NodeRegistration) if kind != Kind::Node => {
                        return Err(FieldError::invalid("mode", format!("a node registration writes a Node, not a {kind}")));
                    }
                    (Some(current), WriteMode::NodeRegistration) => admission::check_registration(current, spec)?,
                    (None, WriteMode::Update) => return Err(not_found(kind, name)),
                    (None, _) if *expected_version != 0 => return Err(not_found(kind, name)),
                    _ => {}
                }
                if let Some(current) = existing {
                    check_version(current, *expected_version)?;
                    if current.tenant != *tenant {
                        return Err(FieldError::invalid(
                            "tenant",
                            format!("{kind} {name:?} belongs to tenant {:?}; the tenant of a resource cannot change", current.tenant),
                        ));
                    }
                }
                let mut spec = spec.clone();
                if let Spec::Plan(plan) = &mut spec {
                    // The order patches and the desired-state index rely on.
                    plan.normalise();
                }
                Ok(PlannedChange::Put { name: name.clone(), tenant: tenant.clone(), spec })
            }
            // Only through `plan_batch` (from `check` and `apply`).
            Command::Batch { .. } => Err(FieldError::invalid("puts", "a batch cannot hold another batch")),
            // Only through `plan_statuses` (from `check` and `apply`).
            Command::PutStatuses { .. } => Err(FieldError::invalid("puts", "a batch holds puts of resources only")),
            Command::PatchPlan { name, patch, expected_version } => {
                let current = self.get(Kind::Plan, name).ok_or_else(|| not_found(Kind::Plan, name))?;
                check_version(current, *expected_version)?;
                let Spec::Plan(plan) = &current.spec else { return Err(not_found(Kind::Plan, name)) };
                crate::resources::validate_plan_patch(plan, patch)?;
                Ok(PlannedChange::PatchPlan { name: name.clone(), patch: patch.clone() })
            }
            Command::PutStatus { kind, name, status, expected_version } => {
                let current = self.get(*kind, name).ok_or_else(|| not_found(*kind, name))?;
                check_version(current, *expected_version)?;
                Ok(PlannedChange::Status { kind: *kind, name: name.clone(), status: status.clone() })
            }
            Command::Delete { kind, name, expected_version } => {
                let current = self.get(*kind, name).ok_or_else(|| not_found(*kind, name))?;
                check_version(current, *expected_version)?;
                references::check_not_referenced(self, *kind, name)?;
                Ok(PlannedChange::Delete { kind: *kind, name: name.clone() })
            }
        }
    }

    fn check_tenant(&self, kind: Kind, tenant: &str) -> Result<(), FieldError> {
        if kind.is_tenant_scoped() {
            if tenant.is_empty() {
                return Err(FieldError::invalid("tenant", format!("required for {kind}")));
            }
            if self.get(Kind::Tenant, tenant).is_none() {
                return Err(FieldError::new(ErrorCode::NotFound, "tenant", format!("tenant {tenant:?} does not exist")));
            }
        } else if !tenant.is_empty() {
            return Err(FieldError::invalid("tenant", format!("{kind} is cluster-scoped; leave tenant empty")));
        }
        Ok(())
    }

    fn commit_change(&mut self, index: u64, change: PlannedChange) -> (CommandOutcome, ChangeEvent) {
        let (resource, change_type) = match change {
            PlannedChange::Put { name, tenant, spec } => {
                let kind = spec.kind();
                let map = self.resources.entry(kind).or_default();
                match map.get_mut(name.as_str()) {
                    Some(shared) => {
                        let existing = Arc::make_mut(shared);
                        let old = std::mem::replace(&mut existing.spec, spec);
                        bump_version(existing, index);
                        self.desired.spec_changed(index, &name, Some(&old), Some(&existing.spec));
                        if let (Spec::Node(old), Spec::Node(new)) = (&old, &existing.spec) {
                            self.gpu_owners.node_changed(&name, Some(old), Some(new));
                        }
                        (shared.clone(), ChangeType::Modified)
                    }
                    None => {
                        let created = StoredResource {
                            name: name.clone(),
                            tenant,
                            // Versions start at the creating entry's index (see
                            // `bump_version`): a resource deleted and created again never
                            // repeats a version an old compare-and-set could name (no ABA).
                            resource_version: index,
                            spec,
                            status: Default::default(),
                            create_revision: index,
                            mod_revision: index,
                        };
                        self.desired.spec_changed(index, &name, None, Some(&created.spec));
                        if let Spec::Node(new) = &created.spec {
                            self.gpu_owners.node_changed(&name, None, Some(new));
                        }
                        let created = Arc::new(created);
                        map.insert(Arc::from(name), created.clone());
                        (created, ChangeType::Added)
                    }
                }
            }
            PlannedChange::Status { kind, name, status } => {
                let shared = self.resources.get_mut(&kind).and_then(|m| m.get_mut(name.as_str())).expect("checked by plan_change");
                let existing = Arc::make_mut(shared);
                existing.status = status;
                bump_version(existing, index);
                (shared.clone(), ChangeType::Modified)
            }
            PlannedChange::PatchPlan { name, patch } => {
                let shared = self.resources.get_mut(&Kind::Plan).and_then(|m| m.get_mut(name.as_str())).expect("checked by plan_change");
                let existing = Arc::make_mut(shared);
                bump_version(existing, index);
                let Spec::Plan(plan) = &mut existing.spec else { unreachable!("checked by plan_change") };
                plan.apply_patch(&patch);
                self.desired.plan_patched(index, &name, plan, &patch);
                (shared.clone(), ChangeType::Modified)
            }
            PlannedChange::Delete { kind, name } => {
                let removed = self.resources.get_mut(&kind).and_then(|m| m.remove(name.as_str())).expect("checked by plan_change");
                self.desired.spec_changed(index, &name, Some(&removed.spec), None);
                if let Spec::Node(old) = &removed.spec {
                    self.gpu_owners.node_changed(&name, Some(old), None);
                }
                (removed, ChangeType::Deleted)
            }
        };
        let event = ChangeEvent { revision: index, change_type, resource: resource.clone(), trace_parent: None };
        (CommandOutcome { resource, deduplicated: false, batch: Vec::new() }, event)
    }

    /// The resources of `kind` in name order, starting after the name `after` (from the
    /// first when `None`): a range query, O(log n) to the start, for paged listings.
    pub fn list_after<'a>(&'a self, kind: Kind, after: Option<&str>) -> impl Iterator<Item = &'a StoredResource> + 'a {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.resources.get(&kind).map(|m| m.range::<_, str>((start, Bound::Unbounded))).into_iter().flatten().map(|(_, r)| &**r)
    }
}

#[derive(Clone)]
enum PlannedChange {
    Put { name: String, tenant: String, spec: Spec },
    Status { kind: Kind, name: String, status: crate::resources::StatusJson },
    Delete { kind: Kind, name: String },
    PatchPlan { name: String, patch: crate::resources::PlanPatch },
}

/// A change at log index `index`: the version goes up by one per entry that changes the
/// resource (a batch that writes it twice bumps it once: no one saw the state between), so
/// a writer can expect the version its own next write leaves (the provisioner's plan parts
/// are in flight together on that), and every version of a resource is at most the index of
/// its last change. Versions start at the index of the entry that created the resource, so
/// one created again after a delete starts above every version of the one before.
fn bump_version(resource: &mut StoredResource, index: u64) {
    if resource.mod_revision != index {
        resource.resource_version += 1;
    }
    resource.mod_revision = index;
}

fn not_found(kind: Kind, name: &str) -> FieldError {
    FieldError::new(ErrorCode::NotFound, "name", format!("{kind} {name:?} does not exist"))
}

fn check_version(current: &StoredResource, expected: u64) -> Result<(), FieldError> {
    if expected != 0 && expected != current.resource_version {
        return Err(FieldError::new(
            ErrorCode::FailedPrecondition,
            "resource_version",
            format!(
                "stale: {} {:?} is at version {}, the request expected {expected}",
                current.kind(),
                current.name,
                current.resource_version
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
