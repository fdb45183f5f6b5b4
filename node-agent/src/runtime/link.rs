//! The controller link: register the Node, follow its desired state through any controller,
//! and on failure back off with jitter and try the next one.

use super::{Agent, RPC_TIMEOUT};
use crate::desired::{decode, NodeDesired};
use proto::agent_client::AgentClient;
use proto::control_plane_client::ControlPlaneClient;
use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

impl Agent {
    /// The connection to the controller at `addr`, opened on first use and then shared by
    /// the desired-state stream and every report sent there. Each report used to open one of
    /// its own: a TCP, HTTP/2 and (with mTLS) TLS handshake per report, 2,000 a second on
    /// the controllers at 10,000 hosts. Kept after a failed call: tonic's channel connects
    /// again by itself when its connection is gone, and a controller's refusal (a follower
    /// that cannot reach the leader) is no reason to open another one.
    pub(super) async fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        if let Some(channel) = self.channels.lock().expect("channels lock").get(addr) {
            return Ok(channel.clone());
        }
        let opened = self.connect(addr).await?;
        self.telemetry.controller_connection();
        // The stream and a report may both have connected first: the one kept first is
        // shared, and the other connection is dropped here.
        Ok(self.channels.lock().expect("channels lock").entry(addr.to_string()).or_insert(opened).clone())
    }

    async fn connect(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let endpoint = match &self.tls {
            Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.clone())?,
            None => Endpoint::from_shared(format!("http://{addr}"))?,
        };
        // HTTP/2 pings, as the controllers send theirs: a controller cut off from this host
        // without a reset ends the desired-state stream within 3 s, so the agent reconnects
        // elsewhere and reports its new stream before the leader's grace for the old one
        // runs out (the controller, seeing the same silence, relays the stream's end).
        endpoint
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true)
            .connect()
            .await
    }

    /// Registers and follows the desired state through any controller; on failure, backs
    /// off with jitter and tries the next one.
    pub(super) async fn link_loop(self: Arc<Self>, tx: watch::Sender<Option<NodeDesired>>) {
        let mut attempt: u32 = 0;
        let mut k = self.cfg.first_controller();
        loop {
            let addr = self.cfg.controllers[k % self.cfg.controllers.len()].clone();
            k += 1;
            let mut followed = false;
            if let Err(e) = self.follow(&addr, &tx, &mut followed).await {
                tracing::warn!(controller = %addr, error = format!("{e:#}"), "controller link lost");
            }
            attempt = next_attempt(attempt, followed);
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    /// Follows the desired state through the controller at `addr` until the stream ends;
    /// sets `followed` once the stream is open.
    async fn follow(&self, addr: &str, tx: &watch::Sender<Option<NodeDesired>>, followed: &mut bool) -> anyhow::Result<()> {
        let channel = self.channel(addr).await?;
        let mut put = tonic::Request::new(proto::PutRequest { resource: Some(self.node_resource()), ..Default::default() });
        put.set_timeout(RPC_TIMEOUT);
        ControlPlaneClient::new(channel.clone()).put(put).await?;
        self.registered.store(true, Ordering::Relaxed);
        let from_version = tx.borrow().as_ref().map_or(0, |d| d.version);
        // Nonzero and new for every stream: the controllers tell this stream's end from the
        // end of the ones before it.
        let session = rand::rng().random_range(1..=u64::MAX);
        let mut stream = AgentClient::new(channel)
            .watch_desired(proto::WatchDesiredRequest { node: self.cfg.node.clone(), from_version, session })
            .await?
            .into_inner();
        self.watch_session.store(session, Ordering::Relaxed);
        *followed = true;
        self.report_now.notify_one();
        tracing::info!(controller = %addr, from_version, "registered; following the desired state");
        while let Some(state) = stream.message().await? {
            match decode(&state, &self.cfg.node, &self.models) {
                Ok(desired) => {
                    self.save_desired(&state);
                    tracing::info!(version = desired.version, "new desired state");
                    tx.send_replace(Some(desired));
                    self.has_desired.store(true, Ordering::Relaxed);
                }
                // Refused whole: nothing of it is applied, the previous state keeps running.
                Err(e) => tracing::error!(version = state.version, error = %e, "desired state refused"),
            }
        }
        anyhow::bail!("desired-state stream ended")
    }
}

/// The attempt after a link that ended: a stream that was followed starts the count again
/// (its end, a controller going away, is not a failed attempt; the next one goes to the
/// next controller), else one more. Without that the count only grew over the agent's
/// life, and after a few controller restarts an agent waited up to 15 s to reconnect:
/// longer than the leader's grace for its ended stream, so a live host was marked
/// unhealthy.
fn next_attempt(attempt: u32, followed: bool) -> u32 {
    if followed {
        0
    } else {
        attempt.saturating_add(1)
    }
}

/// Reconnection delay: 200 ms doubling to 10 s, with ±50% jitter so that a fleet of agents
/// does not reconnect in lock-step after a controller outage.
fn backoff(attempt: u32) -> Duration {
    let base = 200u64.saturating_mul(1 << attempt.min(6)).min(10_000);
    Duration::from_millis(rand::rng().random_range(base / 2..=base + base / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followed_stream_starts_the_backoff_again_and_failures_grow_it() {
        let mut attempt = 0;
        for _ in 0..10 {
            attempt = next_attempt(attempt, false);
        }
        assert_eq!(attempt, 10);
        assert!(backoff(attempt) >= Duration::from_secs(5), "failures back off");
        attempt = next_attempt(attempt, true);
        assert_eq!(attempt, 0);
        assert!(backoff(attempt) <= Duration::from_millis(300), "the first retry after a followed stream is quick: {:?}", backoff(attempt));
    }
}
