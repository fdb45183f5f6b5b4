//! Autoscaling and scheduling policies from the literature, each a pure function of its inputs.
//!
//! * [`hetsev`]: HetSev's autoscaling and instance scheduling.
//! * [`elsa`]: ELSA (PARIS/ELSA Alg. 2) query scheduling across MIG partitions of different
//!   sizes, by SLA slack (Eq. 1-2).
//! * [`gslice`]: GSLICE Alg. 1 self-tuning of an inference function's MPS GPU%.
//! * [`fair_share`]: weighted max-min fair share of a GPU's (or MIG instance's) 100%
//!   (GSLICE Sec. 3.2.3).
//! * [`slab`]: GSLICE's self-learning adaptive batching (Sec. 3.3.1).
//!
//! The runtime policies take time as plain numbers and never read a clock; stateful ones
//! (`gslice`, `slab`) are small structs fed one observation at a time.

pub mod elsa;
pub mod fair_share;
pub mod gslice;
pub mod hetsev;
pub mod slab;
pub mod validate;

pub use validate::InvalidField;
