//! The simulated controllers: turmoil hosts running the real controller (Raft, state
//! machine, gRPC services, leader-only loops) over in-memory disks that survive a crash.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controlplane::controller::Controller;
use controlplane::loops::LoopSettings;
use controlplane::raft::{Member, RaftSettings};
use controlplane::security::Security;
use controlplane::server::{start_node_with_incoming, NodeOptions, StorageChoice};
use controlplane::storage::{BackendError, KvBackend, KvPair, KvPairs, MemBackend, Tree};

use super::net::{incoming, sim_channels, CONTROLLER_PORT};

/// A controller's disk: what it holds outlives a crash of its host (the `Arc` is kept by the
/// simulation, not by the host), and writes can be made slow.
#[derive(Default)]
pub struct Disk {
    store: MemBackend,
    write_delay_ms: AtomicU64,
}

impl Disk {
    /// Every later durable write of the Raft log takes `delay` longer (zero: a normal disk).
    pub fn set_write_delay(&self, delay: Duration) {
        self.write_delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }
}

impl KvBackend for Disk {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        self.store.get(tree, key)
    }
    fn insert_batch(&self, tree: Tree, items: KvPairs) -> Result<(), BackendError> {
        self.store.insert_batch(tree, items)
    }
    fn remove_range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>) -> Result<(), BackendError> {
        self.store.remove_range(tree, from, to)
    }
    fn range(&self, tree: Tree, from: &[u8], to: Option<&[u8]>, limit: usize) -> Result<KvPairs, BackendError> {
        self.store.range(tree, from, to, limit)
    }
    fn last(&self, tree: Tree) -> Result<Option<KvPair>, BackendError> {
        self.store.last(tree)
    }
    fn flush(&self) -> Result<(), BackendError> {
        self.store.flush()
    }
    fn write_delay(&self) -> Option<Duration> {
        match self.write_delay_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// The controllers currently running, by node id: the host registers its controller once
/// started; the simulation removes it when it crashes the host.
pub type Running = Arc<Mutex<BTreeMap<u64, Controller>>>;

/// The turmoil host name of controller `id`.
pub fn controller_host(id: u64) -> String {
    format!("c{id}")
}

/// The address clients and peers reach controller `id` at.
pub fn controller_addr(id: u64) -> String {
    format!("{}:{CONTROLLER_PORT}", controller_host(id))
}

/// Raft timings of node `id`: a short heartbeat, and a fixed election timeout drawn from
/// the seed (openraft draws it from its thread RNG in `[min, max)`, so `max = min + 1` pins
/// it and keeps the run a function of the seed).
pub fn raft_settings(election_timeout_ms: u64) -> RaftSettings {
    RaftSettings {
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: election_timeout_ms,
        election_timeout_max_ms: election_timeout_ms + 1,
        // Small, so that snapshots and log purging happen within a run.
        snapshot_every: 200,
        keep_logs_after_snapshot: 50,
        // Inline and on the one runtime, so that a seed replays (another thread is outside
        // turmoil's clock).
        snapshot_off_runtime: false,
        own_runtime: false,
        // See `RaftSettings::hold_elections_on_start`: with it a seed did not always replay.
        hold_elections_on_start: false,
        // Its timeouts are distinct and pinned from the seed; a random hold would not replay.
        break_split_votes: false,
        // openraft's other draws (each tick loop's first wait) from the seed too; distinct
        // per controller, as their timeouts are.
        random_seed: Some(election_timeout_ms),
    }
}

/// The leader-only loops as the simulation runs them: a provisioning pass every second, and
/// the failure detector on the agents' one-second reports (all on tokio's clock, so on
/// simulated time). The tuner is off: the simulated agents report no latency windows.
pub fn loop_settings() -> LoopSettings {
    LoopSettings {
        provision_interval: Duration::from_secs(1),
        heartbeat_interval: Duration::from_secs(1),
        missed_heartbeats: 5,
        tuner: false,
        // Inline and on the one runtime, so that a seed replays (another thread is outside
        // turmoil's clock).
        plan_off_runtime: false,
        // The status pace's bucket runs on the real clock, outside turmoil's: one this deep
        // never makes a write wait, so it cannot change a replay.
        status_write_kib_per_s: controlplane::agents::status_pace::MAX_KIB_PER_S,
        ..LoopSettings::default()
    }
}

/// Registers controller `id` as a turmoil host. Node 1 initialises the cluster (once: a
/// restarted node 1 finds its disk initialised).
pub fn add_controller(sim: &mut turmoil::Sim<'_>, id: u64, members: u64, election_timeout_ms: u64, disk: Arc<Disk>, running: Running) {
    sim.host(controller_host(id), move || {
        let disk = disk.clone();
        let running = running.clone();
        // No peer listeners here: the simulation's nodes serve their peers on the API's
        // listener, as a member without a peer address does.
        let bootstrap = (id == 1).then(|| (1..=members).map(|m| (m, Member::new(controller_addr(m)))).collect::<BTreeMap<u64, Member>>());
        async move {
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", CONTROLLER_PORT)).await?;
            let addr = listener.local_addr()?;
            let opts = NodeOptions {
                id,
                listen: addr,
                advertise: Some(controller_addr(id)),
                peer_listen: None,
                peer_advertise: None,
                storage: StorageChoice::Memory,
                raft: raft_settings(election_timeout_ms),
                bootstrap,
                loops: loop_settings(),
                metrics_listen: None,
                // Plaintext in the simulation: TLS would only add CPU work; identities
                // and limits are tested in controlplane/tests/security.rs.
                security: Security::insecure(),
            };
            let node = start_node_with_incoming(opts, disk, incoming(listener), addr, sim_channels()).await?;
            running.lock().unwrap().insert(id, node.controller.clone());
            let fatal = node.fatal().await;
            Err(format!("controller {id}: {fatal}").into())
        }
    });
}
