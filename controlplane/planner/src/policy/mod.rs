//! Autoscaling and scheduling policies from the literature, each a pure function of its inputs.
//!
//! * [`hetsev`]: HetSev's autoscaling (the scaling controller and its instance-type choice).
//! * [`elsa`]: ELSA (PARIS/ELSA Alg. 2) query scheduling across MIG partitions of different
//!   sizes, by SLA slack (Eq. 1-2).
//! * [`gslice`]: GSLICE Alg. 1 self-tuning of an inference function's MPS GPU%.
//! * [`slo_headroom`]: each service's saturation target from its SLO and predicted latency,
//!   corrected by its observed windows.
//! * [`fair_share`]: weighted max-min fair share of a GPU's (or MIG instance's) 100%
//!   (GSLICE Sec. 3.2.3).
//!
//! The runtime policies take time as plain numbers and never read a clock; stateful ones
//! (`gslice`) are small structs fed one observation at a time.

pub mod elsa;
pub mod fair_share;
pub mod gslice;
pub mod hetsev;
pub mod slo_headroom;
pub mod validate;

pub use validate::InvalidField;
