//! The last accepted desired state, kept on disk: an agent restarted while every controller
//! is unreachable runs it (static stability).

use super::Agent;
use crate::desired::{decode, NodeDesired};
use prost::Message;

impl Agent {
    /// The last desired state this agent accepted, from disk.
    pub(super) fn saved_desired(&self) -> Option<NodeDesired> {
        let bytes = std::fs::read(&self.desired_file).ok()?;
        let state = proto::DesiredState::decode(bytes.as_slice()).ok()?;
        decode(&state, &self.cfg.node, &self.models).ok()
    }

    pub(super) fn save_desired(&self, state: &proto::DesiredState) {
        let tmp = self.desired_file.with_extension("tmp");
        let written = std::fs::write(&tmp, state.encode_to_vec()).and_then(|()| std::fs::rename(&tmp, &self.desired_file));
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not keep the desired state on disk");
        }
    }
}
