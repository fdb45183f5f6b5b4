//! Bounds the strategies keep on their own work, whatever input passed validation: a
//! service may need at most [`MAX_INSTANCES_PER_SERVICE`] instances (in 1g equivalents of
//! its slowest optimal segment), and no batch exceeds [`MAX_BATCH`]. A service beyond them
//! is refused as too large instead of being planned with unbounded memory and time.

use crate::plan::InfeasibleReason;

/// Instances one service may need: 2,000 GPUs of seven 1g instances each. A fleet of
/// 10,000 hosts of 8 GPUs holds 80,000 GPUs; one service on more than 2,000 of them is
/// beyond any inference service we know, and the bound keeps one hostile service's
/// allocations to a few MB.
pub const MAX_INSTANCES_PER_SERVICE: u32 = 14_000;

/// Largest batch a plan may carry (the controller's validation bounds manifests to it too).
pub const MAX_BATCH: u32 = 1024;

/// Refuses a service whose `rate` needs more than [`MAX_INSTANCES_PER_SERVICE`] instances of
/// `per_instance` req/s each (or whose throughput is not a positive finite number).
pub fn check_instances(rate: f64, per_instance: f64, what: &str) -> Result<(), InfeasibleReason> {
    let needed = rate / per_instance;
    if !(per_instance.is_finite() && per_instance > 0.0 && needed.is_finite()) || needed > f64::from(MAX_INSTANCES_PER_SERVICE) {
        return Err(InfeasibleReason::TooLarge {
            detail: format!(
                "{rate} req/s at {per_instance} req/s per {what} needs more than {MAX_INSTANCES_PER_SERVICE} instances (the planner's bound per service)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_beyond_the_instance_bound_is_too_large() {
        assert!(check_instances(1000.0, 10.0, "1g").is_ok());
        assert!(check_instances(14_000.0, 1.0, "1g").is_ok());
        for (rate, per) in [(14_001.0, 1.0), (1e7, 0.01), (10.0, 0.0), (10.0, f64::NAN), (f64::INFINITY, 1.0), (10.0, -1.0)] {
            assert!(matches!(check_instances(rate, per, "1g"), Err(InfeasibleReason::TooLarge { .. })), "{rate} {per}");
        }
    }
}
