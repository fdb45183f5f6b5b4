//! A runtime of Raft's own (`RaftSettings::own_runtime`): one thread for the Raft core, its
//! replication streams, the state machine worker and the connections to peers, so that the
//! agents' and clients' requests queued on the main runtime's workers do not delay them.
//!
//! One thread, not a pool: a Raft write hands off between these tasks a dozen times, and
//! on a pool each hand-off may wake another worker on another CPU (on a VM, a trip to the
//! hypervisor). A current-thread runtime keeps them on one thread. Measured against the
//! two-worker pool it replaced (`raft-bench --seconds 6 --kills 0 --clients 1,64`, two
//! alternating pairs, 2026-11-28): 1 client 908, 987 → 1,069, 1,087 writes/s; 64 clients
//! 9,004, 10,369 → 12,926, 13,181 writes/s; at 10,000 simulated hosts no figure of
//! `fleet-bench` got worse. The long work of the Raft side runs on threads of its own
//! already: snapshots, the log's purge, and the decoding of large peer payloads.

use std::future::Future;
use std::pin::Pin;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Owns the runtime's thread; dropping it stops the runtime and whatever still runs there
/// (after `Raft::shutdown`, nothing should), without waiting. Safe to drop inside async
/// code, unlike a bare `Runtime`.
pub struct RaftRuntime {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl RaftRuntime {
    pub fn new(node: u64) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name(format!("raft-{node}")).spawn(move || {
            // Runs the spawned tasks until told to stop, or until the owner is gone
            // without telling (the sender dropped in a panic).
            let _ = runtime.block_on(stopped);
            runtime.shutdown_background();
        })?;
        Ok(Self { handle, stop: Some(stop) })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Spawns a gRPC channel's connection tasks on a given runtime, whichever runtime first
/// asked for the channel (tonic spawns them where the channel is created by default).
#[derive(Clone)]
pub struct SpawnOn(pub Handle);

impl hyper::rt::Executor<Pin<Box<dyn Future<Output = ()> + Send>>> for SpawnOn {
    fn execute(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        self.0.spawn(future);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_on_the_runtimes_own_thread_and_stop_when_it_is_dropped() {
        let runtime = RaftRuntime::new(7).unwrap();
        let thread = runtime.handle().block_on(async { tokio::spawn(async { std::thread::current().name().map(str::to_owned) }).await });
        assert_eq!(thread.unwrap().as_deref(), Some("raft-7"));

        // A task still running when the runtime is dropped is dropped with it.
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        runtime.handle().spawn(async move {
            let _tell_on_drop = dropped_tx;
            std::future::pending::<()>().await
        });
        drop(runtime);
        let gone = dropped_rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(gone, Err(std::sync::mpsc::RecvTimeoutError::Disconnected), "the task's sender was dropped");
    }
}
