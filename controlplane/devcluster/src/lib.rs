//! Local gpuplane clusters of real processes, and what runs on them.
//!
//! One way to start controllers ([`controllers::Controllers`]) and node agents
//! ([`agents::start_agent`]), used by the demo ([`demo`], behind `gpuctl demo`), the
//! end-to-end tests (`tests/`), the chaos runner (`chaos real`) and the benchmarks
//! (`fleet-bench`, `raft-bench`, `provision-bench`). [`local::LocalCluster`] is the demo's and fleet-bench's
//! cluster: three controllers with a simulated cloud and one agent per simulated host.

pub mod agents;
pub mod binaries;
pub mod controllers;
pub mod demo;
pub mod local;
pub mod ports;
pub mod process;
pub mod stats;
pub mod synthetic_fleet;

pub use binaries::Binaries;
pub use controllers::Controllers;
pub use process::Proc;
