//! Node agent: GPU backends, supervisor, router and shadow failover (see issue "node-agent").

pub mod backend;
pub mod command;
pub mod config;
pub mod desired;
pub mod executor;
pub mod inflight;
pub mod model_load;
pub mod mps;
pub mod reconcile;
pub mod router;
pub mod runtime;
pub mod shadow;
pub mod sim_infer;
pub mod supervisor;
pub mod telemetry;
