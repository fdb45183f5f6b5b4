//! Deterministic simulation and real-process chaos testing (see issue "chaos").
