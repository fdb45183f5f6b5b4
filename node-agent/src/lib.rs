//! Node agent: GPU backends, supervisor, router and shadow failover (see issue "node-agent").

pub mod inflight;
pub mod router;
pub mod shadow;
pub mod sim_infer;
