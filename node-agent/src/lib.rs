//! Node agent: GPU backends, supervisor, router and shadow failover (see issue "node-agent").

pub mod backend;
pub mod command;
pub mod config;
pub mod desired;
pub mod executor;
pub mod mps;
pub mod reconcile;
pub mod runtime;
pub mod supervisor;
