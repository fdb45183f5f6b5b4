//! `gpuctl demo`: a local cluster on simulated GPUs, end to end.

pub mod load;
pub mod run;
pub mod scenario;
pub mod show;
