//! Helpers for tests that run a real node agent under a controller cluster: wait for its
//! registration, convergence and router endpoints, and kill the workload processes it
//! recorded when a test ends (they run in their own process groups on purpose, so they
//! outlive the agent).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use controlplane::client::Client;
use controlplane::resources::NodeStatus;
use serde_json::Value;

/// Kills the workload processes (and their process groups) the agent recorded in its state
/// directory, so a failed test leaves none behind.
pub struct Workloads(pub PathBuf);

impl Workloads {
    /// The agent's process records (`processes.json`).
    pub fn records(&self) -> Vec<Value> {
        let Ok(bytes) = std::fs::read(self.0.join("processes.json")) else { return vec![] };
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.records().iter().filter_map(|r| r["pid"].as_u64()).map(|p| p as u32).collect()
    }
}

impl Drop for Workloads {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = Command::new("kill").arg("-9").arg("--").arg(format!("-{pid}")).status();
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    }
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Polls `f` for up to `limit`; on timeout fails with the tail of the agent's log.
pub async fn wait_for<T>(what: &str, log: &Path, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            panic!("timed out waiting for {what}; agent log:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The address of `service`'s router on the agent (from the agent's state, next to its log).
pub async fn router_endpoint(log: &Path, service: &str) -> String {
    let ports_file = log.with_file_name("agent").join("router-ports.json");
    wait_for("the router's endpoint", log, Duration::from_secs(60), async || {
        let ports: Value = serde_json::from_slice(&std::fs::read(&ports_file).ok()?).ok()?;
        Some(format!("http://127.0.0.1:{}", ports[service].as_u64()?))
    })
    .await
}

/// The GPU uuids the agent registered for `node`.
pub async fn registered_gpus(client: &Client, node: &str, log: &Path) -> Vec<String> {
    wait_for("the agent to register", log, Duration::from_secs(30), async || {
        let node = client.get("Node", node, false).await.ok()?;
        let spec: Value = serde_json::from_str(&node.spec_json).ok()?;
        Some(spec["gpus"].as_array()?.iter().map(|g| g["uuid"].as_str().unwrap().to_string()).collect())
    })
    .await
}

/// The Node's observed state once it reports convergence to at least `version`.
pub async fn converged(client: &Client, node: &str, log: &Path, version: u64, limit: Duration) -> Value {
    wait_for("the agent to converge", log, limit, async || {
        let node = client.get("Node", node, false).await.ok()?;
        let status: Value = serde_json::from_str(&node.status_json).ok()?;
        (NodeStatus::applied_version(&status) >= version).then_some(status)
    })
    .await
}
