//! Leader-only loops: they start when this controller wins leadership and stop when it
//! loses it. They read committed state and write back through Raft like any client, so a
//! new leader simply runs them again (level-triggered: each pass recomputes from the whole
//! state).

mod provisioner;

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::controller::Controller;
use crate::provision::MigStrategy;

/// Settings of the leader-only loops.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopSettings {
    /// Re-provision at least this often (also on every change of services, nodes, profiles,
    /// GPU models or instance types).
    pub provision_interval: Duration,
    pub mig_strategy: MigStrategy,
    /// `false` turns every loop off (tests of the bare Raft cluster).
    pub enabled: bool,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings { provision_interval: Duration::from_secs(30), mig_strategy: MigStrategy::default(), enabled: true }
    }
}

/// Watches leadership and runs the loops while this node leads.
pub fn spawn(controller: Controller, settings: LoopSettings) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !settings.enabled {
            return;
        }
        let mut metrics = controller.raft.metrics();
        let mut running: Option<JoinHandle<()>> = None;
        loop {
            let leading = metrics.borrow().current_leader == Some(controller.id);
            match (leading, running.is_some()) {
                (true, false) => {
                    tracing::info!("leader: starting the provisioner");
                    running = Some(tokio::spawn(provisioner::run(controller.clone(), settings.clone())));
                }
                (false, true) => {
                    tracing::info!("no longer leader: stopping the provisioner");
                    if let Some(task) = running.take() {
                        task.abort();
                    }
                }
                _ => {}
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
        if let Some(task) = running {
            task.abort();
        }
    })
}
