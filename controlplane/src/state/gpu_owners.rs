//! Which Node registered each GPU uuid. A GPU is one physical device: the first Node to
//! register its uuid owns it until that Node drops it from its spec or is deleted, and a
//! second claim is refused. Without this a node certificate could register another
//! host's GPU and be sent its workloads and endpoints (the plan is keyed by GPU uuid).
//!
//! Derived from the Nodes' specs (never stored: rebuilt when a snapshot is read) and kept
//! in step by the state machine's apply; a persistent map, so that a trial copy for a
//! batch's checks is O(1).

use std::sync::Arc;

use crate::resources::{ErrorCode, FieldError, NodeSpec};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuOwners(imbl::HashMap<Arc<str>, Arc<str>>);

impl GpuOwners {
    /// The index of `nodes` (name, spec); a uuid two of them list (possible only in a log
    /// written before this rule) goes to the first in name order, as the planner's fleet
    /// takes it.
    pub fn rebuild<'a>(nodes: impl Iterator<Item = (&'a str, &'a NodeSpec)>) -> Self {
        let mut owners = GpuOwners::default();
        for (name, spec) in nodes {
            let name: Arc<str> = Arc::from(name);
            for gpu in &spec.gpus {
                owners.0.entry(Arc::from(gpu.uuid.as_str())).or_insert_with(|| name.clone());
            }
        }
        owners
    }

    /// The Node that registered `uuid`.
    pub fn owner(&self, uuid: &str) -> Option<&str> {
        self.0.get(uuid).map(|n| &**n)
    }

    /// Refuses `spec` for Node `name` if it lists a GPU another Node registered. The
    /// message does not name that Node: the caller may be the node's own agent.
    pub fn check_claim(&self, name: &str, spec: &NodeSpec) -> Result<(), FieldError> {
        for (i, gpu) in spec.gpus.iter().enumerate() {
            if self.owner(&gpu.uuid).is_some_and(|owner| owner != name) {
                return Err(FieldError::new(
                    ErrorCode::AlreadyExists,
                    format!("spec.gpus[{i}].uuid"),
                    format!(
                        "GPU {:?} is registered by another Node; a GPU belongs to the first Node that registers it until that Node \
                         is deleted or drops it from its spec",
                        gpu.uuid
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Follows Node `name`'s spec from `old` to `new` (`None`: absent), once checked.
    pub fn node_changed(&mut self, name: &str, old: Option<&NodeSpec>, new: Option<&NodeSpec>) {
        for gpu in old.into_iter().flat_map(|s| &s.gpus) {
            if self.owner(&gpu.uuid) == Some(name) {
                self.0.remove(gpu.uuid.as_str());
            }
        }
        let name: Arc<str> = Arc::from(name);
        for gpu in new.into_iter().flat_map(|s| &s.gpus) {
            self.0.entry(Arc::from(gpu.uuid.as_str())).or_insert_with(|| name.clone());
        }
    }
}
