//! Where new nodes come from: a [`NodeProvider`] launches and terminates cloud instances.
//! A launched instance's agent registers its Node itself; the autoscaler only asks. The
//! simulated provider starts local `node-agent` processes on simulated GPUs after the
//! instance type's launch latency; real clouds can implement the same trait.

pub mod sim;

use crate::resources::InstanceTypeSpec;

/// The label a launched node carries, so any leader (not only the one that launched it) can
/// scale it in.
pub const AUTOSCALED_LABEL: &str = "gpuplane.io/autoscaled";

pub trait NodeProvider: Send + Sync {
    /// Starts launching `node` as an instance of `type_name`; returns at once.
    fn launch(&self, node: &str, type_name: &str, spec: &InstanceTypeSpec) -> Result<(), String>;
    /// Terminates the instance of `node` (and whatever runs on it).
    fn terminate(&self, node: &str) -> Result<(), String>;
}
