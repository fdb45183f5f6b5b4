//! What the controllers keep for and about node agents: the per-node projection of the
//! committed Plans (desired state) and the latest agent reports (soft state, leader memory).

mod desired;
pub mod end_check;
pub mod endpoints;
mod relay;
pub mod report_check;
pub mod report_pace;
pub mod report_relay;
mod reports;
pub mod status_pace;
mod status_writer;
pub mod watch_ends;

pub use desired::{desired_state, placement, Placed, Placement, SentVersions};
pub use report_pace::ReportPace;
pub use reports::{AgentReports, Heard, NodeReport, ServiceWindow};
pub use status_pace::StatusPace;
pub use status_writer::StatusWriter;
pub use watch_ends::WatchEnds;
