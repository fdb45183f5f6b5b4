//! Provisioning strategies: each is a function from a [`crate::input::PlanningInput`] to a
//! [`crate::plan::Plan`] that names every service it could not place.

pub mod exact;
pub mod parvagpu;
pub mod segments;
