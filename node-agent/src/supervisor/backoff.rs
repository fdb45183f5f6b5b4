//! Restart back-off for crashed workload processes.

use std::time::Duration;

/// Delay before the restart that follows `restarts` earlier ones: 100 ms doubling up to 30 s,
/// so a crash-looping process costs little and a one-off crash is repaired at once.
pub fn restart_delay(restarts: u32) -> Duration {
    const FIRST_MS: u64 = 100;
    const MAX_MS: u64 = 30_000;
    Duration::from_millis(FIRST_MS.saturating_mul(1u64 << restarts.min(20)).min(MAX_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        assert_eq!(restart_delay(0), Duration::from_millis(100));
        assert_eq!(restart_delay(1), Duration::from_millis(200));
        assert_eq!(restart_delay(5), Duration::from_millis(3200));
        assert_eq!(restart_delay(9), Duration::from_secs(30));
        assert_eq!(restart_delay(u32::MAX), Duration::from_secs(30));
    }
}
