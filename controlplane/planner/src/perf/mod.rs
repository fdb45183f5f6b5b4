//! Performance models: iGniter's analytical interference model and ParvaGPU-style measured
//! profile tables.

pub mod igniter;
pub mod synthetic;
pub mod table;
