//! `[limits]`: per-tenant and per-node request rate limits (governor's keyed GCRA limiters),
//! and the bounds on a controller's connections, HTTP/2 streams and Watch streams (applied by
//! `server`; README, "Limits and the threat model").

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
    /// Connections the API's listener keeps open at once; past it a new connection is
    /// closed as soon as it is accepted (and `/readyz` answers 503). `None`: the process's
    /// open-file limit less [`FILES_KEPT_FREE`], so that connections alone never take the
    /// files the log, the snapshot and the peers need (see [`RateLimits::max_connections`]).
    pub max_connections: Option<u32>,
    /// Connections one client address keeps open at once on a listener (an IPv6 client is
    /// counted by its /64, which one host usually holds whole); past it a new one is closed
    /// as soon as it is accepted. Agents behind one NAT address share it.
    pub connections_per_ip: u32,
    /// Leaves loopback clients (127.0.0.0/8, ::1) out of `connections_per_ip`: the tests,
    /// the development cluster and the fleet benchmark connect everything from 127.0.0.1,
    /// and a proxy on the host shows every client at one loopback address.
    pub exempt_loopback: bool,
    /// A connection must finish its TLS handshake and send its first request within this
    /// many milliseconds of being accepted, or it is closed.
    pub handshake_timeout_ms: u64,
    /// A connection with no request in flight (an open stream, such as an agent's
    /// desired-state watch, is one) for this many milliseconds is closed; clients reconnect
    /// on their next call.
    pub idle_timeout_ms: u64,
    /// HTTP/2 streams (requests in flight) one connection may have open at once
    /// (SETTINGS_MAX_CONCURRENT_STREAMS); a client past it waits for one of its own to end.
    pub streams_per_connection: u32,
    /// Watch streams one principal (a tenant, a node, an admin) may have open on one
    /// controller; past it a Watch is refused with ResourceExhausted.
    pub watches_per_principal: u32,
    /// Changes a Watch stream may have waiting to be sent; a watcher further behind is cut
    /// off with Aborted, naming the revision to watch again from.
    pub watch_queue_events: u32,
    /// The same bound in KiB of encoded changes (a single change larger than it still goes,
    /// alone).
    pub watch_queue_kib: u32,
}

/// Open files a controller keeps beside its API's connections when `max_connections` is not
/// set: the peer listener's connections (at most 1,024, `server::connections`), the log's
/// segments, the snapshot, sled, outgoing connections to peers and the metrics listener.
pub const FILES_KEPT_FREE: u64 = 2048;

/// The least `max_connections` derived from a low open-file limit.
pub const MIN_DERIVED_CONNECTIONS: u64 = 256;

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            tenant_rps: 50,
            tenant_burst: 100,
            node_rps: 20,
            node_burst: 40,
            max_connections: None,
            connections_per_ip: 1024,
            exempt_loopback: true,
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            streams_per_connection: 256,
            watches_per_principal: 16,
            watch_queue_events: 1000,
            watch_queue_kib: 4096,
        }
    }
}

impl RateLimits {
    pub fn validate(&self) -> Result<(), String> {
        for (field, v) in [
            ("limits.tenant_rps", self.tenant_rps),
            ("limits.tenant_burst", self.tenant_burst),
            ("limits.node_rps", self.node_rps),
            ("limits.node_burst", self.node_burst),
            ("limits.max_connections", self.max_connections.unwrap_or(1)),
            ("limits.connections_per_ip", self.connections_per_ip),
            ("limits.streams_per_connection", self.streams_per_connection),
            ("limits.watches_per_principal", self.watches_per_principal),
            ("limits.watch_queue_events", self.watch_queue_events),
            ("limits.watch_queue_kib", self.watch_queue_kib),
        ] {
            if v == 0 {
                return Err(format!("{field}: must be at least 1"));
            }
        }
        for (field, v, max) in [
            ("limits.handshake_timeout_ms", self.handshake_timeout_ms, 600_000),
            ("limits.idle_timeout_ms", self.idle_timeout_ms, 86_400_000),
        ] {
            if v == 0 || v > max {
                return Err(format!("{field}: must be in [1, {max}], got {v}"));
            }
        }
        if self.watch_queue_kib > 1_048_576 {
            return Err(format!("limits.watch_queue_kib: must be at most 1048576 (1 GiB), got {}", self.watch_queue_kib));
        }
        Ok(())
    }

    /// `max_connections`, or the default derived from `open_files` (the process's soft
    /// limit; `None` when it cannot be read, which leaves the API's connections uncapped).
    pub fn max_connections(&self, open_files: Option<u64>) -> usize {
        match (self.max_connections, open_files) {
            (Some(n), _) => n as usize,
            (None, Some(files)) => files.saturating_sub(FILES_KEPT_FREE).max(MIN_DERIVED_CONNECTIONS) as usize,
            (None, None) => usize::MAX,
        }
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_defaults_to_the_open_file_limit_less_what_the_controller_keeps() {
        let d = RateLimits::default();
        assert_eq!(d.max_connections(Some(16_384)), 16_384 - FILES_KEPT_FREE as usize);
        assert_eq!(d.max_connections(Some(1_024)), MIN_DERIVED_CONNECTIONS as usize, "a low limit still serves some");
        assert_eq!(d.max_connections(None), usize::MAX);
        let set = RateLimits { max_connections: Some(7), ..d };
        assert_eq!(set.max_connections(Some(16_384)), 7);
    }

    #[test]
    fn every_bound_is_checked() {
        assert_eq!(RateLimits::default().validate(), Ok(()));
        let err = |l: RateLimits| l.validate().unwrap_err();
        assert_eq!(err(RateLimits { watches_per_principal: 0, ..Default::default() }), "limits.watches_per_principal: must be at least 1");
        assert_eq!(err(RateLimits { max_connections: Some(0), ..Default::default() }), "limits.max_connections: must be at least 1");
        assert_eq!(
            err(RateLimits { handshake_timeout_ms: 0, ..Default::default() }),
            "limits.handshake_timeout_ms: must be in [1, 600000], got 0"
        );
        assert!(err(RateLimits { idle_timeout_ms: 86_400_001, ..Default::default() }).starts_with("limits.idle_timeout_ms: "));
        assert!(err(RateLimits { watch_queue_kib: 1_048_577, ..Default::default() }).starts_with("limits.watch_queue_kib: "));
    }
}
