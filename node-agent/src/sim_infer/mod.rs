//! `sim-infer`: the inference server of the simulated fleet. It speaks the real Inference
//! gRPC API, batches requests dynamically and takes as long as the synthetic performance
//! model says a batch takes on its MIG instance / MPS share next to its neighbours, with
//! noise, so the router and the shadow failover meet latencies the planner did not predict.
//!
//! * [`latency`]: the pure service-time function.
//! * [`server`]: the gRPC service, the batcher task and the graceful drain.
//! * [`service_time`]: the same model as ELSA's table, for routers in tests and benchmarks.

pub mod latency;
pub mod rng;
pub mod server;
pub mod service_time;

pub use latency::{model_shape, LatencyModel, LatencyModelError, Placement};
pub use server::{spawn, SimInfer, SimInferConfig, SimInferError, SimInferHandle};
pub use service_time::ShapeServiceTime;
