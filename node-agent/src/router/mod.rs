//! The per-service router of the node agent (ARCHITECTURE.md "Agent internals"): one local
//! endpoint speaking the Open Inference Protocol over gRPC and HTTP/REST, forwarding to the active backend(s), ELSA across partitions of different sizes,
//! per-second p99 / throughput / arrival-rate windows, and an atomic active-set switch;
//! [`Routers`] holds the node's routers for the executor.

pub mod admission;
pub mod backend;
pub mod connections;
pub mod planned_times;
pub mod queue;
pub mod rest;
pub mod rest_json;
pub mod routers;
pub mod service;
pub mod threads;
pub mod window;

pub use admission::{Admission, Callers};
pub use backend::{Backend, BackendAddrError, BackendSpec};
pub use planned_times::PlannedServiceTimes;
pub use routers::{ActiveProcess, Routers, RoutingError};
pub use service::{serve, ActiveSet, Router, RouterConfig, RouterCounts, RouterError, Swap};
pub use threads::{RouterThreads, MAX_ROUTER_THREADS, ROUTER_THREAD};
pub use window::{Window, WindowStats};
