//! The controller's gRPC API: resources (`ControlPlane`), membership (`Admin`), and the
//! conversions between proto messages and the domain model.

mod access;
mod admin_service;
mod agent_service;
mod convert;
mod errors;
mod forward;
mod paging;
mod resource_service;
mod watch;

pub use admin_service::AdminService;
pub use agent_service::AgentService;
pub use convert::{resource_to_proto, spec_from_proto};
pub use errors::ApiError;
pub use paging::{DEFAULT_LIMIT, MAX_LIMIT, PAGE_BYTES};
pub use resource_service::ResourceService;
