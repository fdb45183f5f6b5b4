//! The real-process chaos runner: controllers and node agents as real processes in network
//! namespaces, a recorded client workload, and faults on processes, network and disks.

pub mod cluster;
pub mod faults;
pub mod net;
pub mod observe;
pub mod report;
pub mod scenario;
pub mod workload;
