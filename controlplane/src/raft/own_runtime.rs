//! A runtime of Raft's own (`RaftSettings::own_runtime`): two threads for the Raft core, its
//! replication streams, the state machine worker and the connections to peers, so that the
//! agents' and clients' requests queued on the main runtime's workers do not delay them.

use std::future::Future;
use std::pin::Pin;

use tokio::runtime::{Handle, Runtime};

/// Owns the runtime; dropping it stops whatever still runs there (after `Raft::shutdown`,
/// nothing should). Safe to drop inside async code, unlike a bare `Runtime`.
pub struct RaftRuntime(Option<Runtime>);

impl RaftRuntime {
    pub fn new(node: u64) -> std::io::Result<Self> {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(format!("raft-{node}")).enable_all().build()?;
        Ok(Self(Some(runtime)))
    }

    pub fn handle(&self) -> &Handle {
        self.0.as_ref().expect("present until dropped").handle()
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
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
