//! Provisioning strategies: each is a function from a [`crate::input::PlanningInput`] to a
//! [`crate::plan::Plan`] that names every service it could not place.

pub mod exact;
pub mod igniter;
pub mod joint;
pub mod paris;
pub mod parvagpu;
#[cfg(test)]
mod properties;
pub mod segments;
