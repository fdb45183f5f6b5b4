//! Autoscaling and scheduling policies from the literature, each a pure function of its inputs.

pub mod hetsev;
