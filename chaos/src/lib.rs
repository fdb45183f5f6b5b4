//! Deterministic simulation and real-process chaos testing of the replicated controller.

pub mod history;
pub mod real;
pub mod sim;
