//! Per-tenant and per-node request rate limits (governor's keyed GCRA limiters).

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;

/// `[limits]` of controller.toml.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimits {
    /// Sustained requests per second of one tenant on the client API (all its tokens).
    pub tenant_rps: u32,
    /// Requests a tenant may send at once above the sustained rate.
    pub tenant_burst: u32,
    /// Sustained requests per second of one node's agent.
    pub node_rps: u32,
    pub node_burst: u32,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self { tenant_rps: 50, tenant_burst: 100, node_rps: 20, node_burst: 40 }
    }
}

impl RateLimits {
    pub fn validate(&self) -> Result<(), String> {
        for (field, v) in [
            ("limits.tenant_rps", self.tenant_rps),
            ("limits.tenant_burst", self.tenant_burst),
            ("limits.node_rps", self.node_rps),
            ("limits.node_burst", self.node_burst),
        ] {
            if v == 0 {
                return Err(format!("{field}: must be at least 1"));
            }
        }
        Ok(())
    }
}

/// One keyed limiter: a bucket per tenant or per node.
pub(super) struct Limiter {
    limiter: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

impl Limiter {
    pub fn new(rps: u32, burst: u32) -> Self {
        let quota =
            Quota::per_second(NonZeroU32::new(rps.max(1)).expect("max(1)")).allow_burst(NonZeroU32::new(burst.max(1)).expect("max(1)"));
        Self { limiter: RateLimiter::keyed(quota), clock: DefaultClock::default() }
    }

    /// `Err(wait)`: over the rate; the next request is admitted after `wait`.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        // Keys are the tenants and nodes known to the tokens file and the CA: a bounded set.
        self.limiter.check_key(&key.to_string()).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}
