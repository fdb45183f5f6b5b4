//! Leader-only loops: they start when this controller wins leadership and stop when it
//! loses it. They read committed state and write back through Raft like any client, so a
//! new leader simply runs them again (level-triggered: each pass recomputes from the whole
//! state).

pub mod failure_detector;
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
    /// How often agents report (their heartbeat) and the failure detector checks.
    pub heartbeat_interval: Duration,
    /// Heartbeats a node may miss before it is marked unhealthy.
    pub missed_heartbeats: u32,
    /// `false` turns every loop off (tests of the bare Raft cluster).
    pub enabled: bool,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            provision_interval: Duration::from_secs(30),
            mig_strategy: MigStrategy::default(),
            heartbeat_interval: Duration::from_secs(1),
            missed_heartbeats: 5,
            enabled: true,
        }
    }
}

/// Watches leadership and runs the loops while this node leads.
pub fn spawn(controller: Controller, settings: LoopSettings) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !settings.enabled {
            return;
        }
        let mut metrics = controller.raft.metrics();
        let mut running: Vec<JoinHandle<()>> = Vec::new();
        loop {
            let leading = metrics.borrow().current_leader == Some(controller.id);
            match (leading, running.is_empty()) {
                (true, true) => {
                    tracing::info!("leader: starting the provisioner and the failure detector");
                    running.push(tokio::spawn(provisioner::run(controller.clone(), settings.clone())));
                    running.push(tokio::spawn(failure_detector::run(controller.clone(), settings.clone())));
                }
                (false, false) => {
                    tracing::info!("no longer leader: stopping the loops");
                    for task in running.drain(..) {
                        task.abort();
                    }
                }
                _ => {}
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
        for task in running {
            task.abort();
        }
    })
}
