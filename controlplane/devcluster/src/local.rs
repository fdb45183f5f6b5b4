//! The demo's and fleet-bench's cluster: three controllers with a simulated cloud and one
//! node agent per simulated host, each with its own config and log under one directory,
//! killed when dropped (unless kept).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use controlplane::provision::MigStrategy;

use crate::agents::start_agent;
use crate::binaries::Binaries;
use crate::controllers::Controllers;
use crate::demo::scenario::DemoNode;
use crate::ports::free_port_block;
use crate::process::{kill9, kill_recorded_workloads, Proc};

/// Timings of the cluster's control loops (the demo's are fast enough to show in a minute
/// or two).
#[derive(Clone, Debug)]
pub struct LoopTimings {
    pub provision_interval_s: f64,
    pub heartbeat_ms: u64,
    pub missed_heartbeats: u32,
    pub scale_window_s: f64,
    pub cooldown_s: f64,
    /// Launch latencies of the simulated cloud are multiplied by this.
    pub launch_time_scale: f64,
}

/// Everything the cluster runs, and where.
pub struct LocalCluster {
    pub dir: PathBuf,
    pub bins: Binaries,
    /// Each controller's `/metrics` address.
    pub metrics_addrs: BTreeMap<u64, String>,
    pub controllers: Controllers,
    pub agents: BTreeMap<String, Proc>,
    /// First port of each agent's block (100 workload ports, then 20 router ports).
    agent_ports: BTreeMap<String, u16>,
    next_block: u16,
    /// How often agents report.
    heartbeat_ms: u64,
    /// Stopped, or left running on purpose (`--keep-running`): nothing for a drop to do (a
    /// second stop would signal workload pids that may have been reused since).
    done: bool,
}

impl LocalCluster {
    /// Three controllers (not started yet) whose loops plan MIG GPUs with `mig_strategy` and
    /// run at `timings`, with a simulated cloud launching agents under `dir/cloud`.
    pub fn new(dir: &Path, bins: Binaries, mig_strategy: MigStrategy, timings: LoopTimings) -> Result<Self, String> {
        let base = free_port_block(17400, 3)?;
        let addrs: BTreeMap<u64, String> = (1..=3u64).map(|id| (id, format!("127.0.0.1:{}", base + id as u16 - 1))).collect();
        let peer_base = free_port_block(base + 10, 3)?;
        let peer_addrs = (1..=3u64).map(|id| (id, format!("127.0.0.1:{}", peer_base + id as u16 - 1)));
        let metrics_base = free_port_block(base + 100, 3)?;
        let metrics_addrs: BTreeMap<u64, String> =
            (1..=3u64).map(|id| (id, format!("127.0.0.1:{}", metrics_base + id as u16 - 1))).collect();
        // Identity and peers are flags (Controllers); the rest of a controller's settings is
        // its config file.
        for id in 1..=3u64 {
            let path = dir.join(format!("controller-{id}.toml"));
            let config = controller_config(id, dir, &bins, &metrics_addrs[&id], mig_strategy, &timings);
            std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let config_dir = dir.to_path_buf();
        let controllers = Controllers::new(&bins.controlplane, dir, addrs)
            .with_peer_addrs(peer_addrs)
            .with_flags(move |id| {
                vec!["--insecure".into(), "--config".into(), config_dir.join(format!("controller-{id}.toml")).display().to_string()]
            })
            .with_env("RUST_LOG", &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        Ok(LocalCluster {
            dir: dir.to_path_buf(),
            bins,
            metrics_addrs,
            controllers,
            agents: BTreeMap::new(),
            agent_ports: BTreeMap::new(),
            next_block: 21000,
            heartbeat_ms: timings.heartbeat_ms,
            done: false,
        })
    }

    pub fn servers(&self) -> Vec<String> {
        self.controllers.servers()
    }

    /// Starts (or restarts) controller `id`; controller 1 bootstraps the cluster.
    /// Starts (or restarts) controller `id`; returns the log of this start.
    pub fn start_controller(&mut self, id: u64) -> Result<std::path::PathBuf, String> {
        self.controllers.start(id, id == 1)
    }

    fn agent_config(&self, node: &DemoNode, first: u16) -> String {
        let gpus: Vec<String> = node.gpus.iter().map(|g| g.to_string()).collect();
        format!(
            "node = {name:?}\ncontrollers = {controllers:?}\ninstance_type = {it:?}\nstate_dir = {state:?}\ninsecure = true\n\
             advertise = \"127.0.0.1:{router}\"\nport_range = [{first}, {wl}]\nrouter_ports = [{router}, {rl}]\ninterval_ms = {hb}\n\
             [sim]\ngpus = {gpus:?}\n[template]\nkind = \"command\"\nprogram = {program:?}\nargs = {args:?}\n",
            name = node.name,
            controllers = self.servers(),
            it = node.instance_type,
            state = self.dir.join("agents").join(node.name).display().to_string(),
            router = first + 100,
            wl = first + 99,
            rl = first + 119,
            hb = self.heartbeat_ms,
            program = self.bins.sim_infer.display().to_string(),
            args = workload_args(),
        )
    }

    /// Starts (or restarts, on the same ports and state) the agent of `node`.
    pub fn start_agent(&mut self, node: &DemoNode) -> Result<(), String> {
        let first = match self.agent_ports.get(node.name) {
            Some(&p) => p,
            None => {
                let p = free_port_block(self.next_block, 120)?;
                self.next_block = p + 120;
                self.agent_ports.insert(node.name.to_string(), p);
                p
            }
        };
        let config = self.agent_config(node, first);
        let proc = start_agent(&self.bins.node_agent, &self.dir.join("agents"), node.name, &config, None)?;
        self.agents.insert(node.name.to_string(), proc);
        Ok(())
    }

    /// A host failure: the agent and every workload process it started die at once.
    pub fn kill_node(&mut self, node: &str) {
        if let Some(mut p) = self.agents.remove(node) {
            p.kill9();
        }
        kill_recorded_workloads(&self.dir.join("agents").join(node));
    }

    /// Leaves everything running (`--keep-running`).
    pub fn release_all(&mut self) {
        self.done = true;
        self.controllers.release_all();
        for p in self.agents.values_mut() {
            p.release();
        }
    }

    /// Stops the agents (and their workloads) and the controllers, once.
    pub fn shutdown(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let nodes: Vec<String> = self.agents.keys().cloned().collect();
        for n in nodes {
            self.kill_node(&n);
        }
        // Nodes the simulated cloud launched live under cloud/: their agents are children of
        // whichever controller launched them.
        if let Ok(entries) = std::fs::read_dir(self.dir.join("cloud")) {
            for e in entries.flatten() {
                kill_recorded_workloads(&e.path());
                if let Ok(pid) = std::fs::read_to_string(e.path().join("agent.pid")) {
                    kill9(pid.trim());
                }
            }
        }
        self.controllers.shutdown();
    }
}

/// What a simulated host's workloads run: `sim-infer` with the planned configuration.
fn workload_args() -> Vec<String> {
    [
        "--listen=127.0.0.1:{port}",
        "--model={model}",
        "--mig-gpcs={gpcs}",
        "--max-batch={batch}",
        "--gpu={gpu_name}",
        "--id={service}:{port}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A controller's config file: what is not a flag (`Controllers` passes identity, peers and
/// `--insecure`).
fn controller_config(id: u64, dir: &Path, bins: &Binaries, metrics: &str, mig_strategy: MigStrategy, t: &LoopTimings) -> String {
    format!(
        "metrics_listen = {metrics:?}\n\n[loops]\n\
         provision_interval_s = {pi}\nmig_strategy = \"{strategy}\"\nheartbeat_interval_ms = {hb}\nmissed_heartbeats = {missed}\n\
         scale_window_s = {window}\ncooldown_s = {cooldown}\n\n[cloud]\nprovider = \"sim\"\nagent_binary = {agent:?}\n\
         workload_program = {sim:?}\nworkload_args = {args:?}\nbase_dir = {cloud:?}\nfirst_port = {first}\ntime_scale = {scale}\n",
        strategy = mig_strategy.flag_name(),
        pi = t.provision_interval_s,
        hb = t.heartbeat_ms,
        missed = t.missed_heartbeats,
        window = t.scale_window_s,
        cooldown = t.cooldown_s,
        agent = bins.node_agent.display().to_string(),
        sim = bins.sim_infer.display().to_string(),
        args = workload_args(),
        cloud = dir.join("cloud").display().to_string(),
        // Each controller launches into its own range, so a new leader never reuses the
        // ports of nodes the previous one launched.
        first = 40000 + (id as u16 - 1) * 6000,
        scale = t.launch_time_scale,
    )
}

/// A run that ends early (an error, a panic) stops what it started: dropping the agents'
/// processes alone would leave their workloads running, in process groups of their own.
impl Drop for LocalCluster {
    fn drop(&mut self) {
        if !self.done {
            self.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Command;

    /// A cluster in `dir` whose binaries are never run, with one agent (a `sleep`) that
    /// recorded one workload (another `sleep`, in a process group of its own, as the agent's
    /// supervisor starts them).
    fn cluster_with_a_workload(dir: &Path) -> (LocalCluster, std::process::Child) {
        let never_run = PathBuf::from("/nonexistent");
        let bins = Binaries { controlplane: never_run.clone(), node_agent: never_run.clone(), sim_infer: never_run };
        let timings = LoopTimings {
            provision_interval_s: 1.0,
            heartbeat_ms: 500,
            missed_heartbeats: 3,
            scale_window_s: 1.0,
            cooldown_s: 1.0,
            launch_time_scale: 1.0,
        };
        let mut cluster = LocalCluster::new(dir, bins, MigStrategy::default(), timings).unwrap();
        let agent = Proc::spawn(Command::new("sleep").arg("30"), &dir.join("agent.log")).unwrap();
        let workload = Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let state = dir.join("agents").join("h1");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("processes.json"), serde_json::json!([{ "pid": workload.id() }]).to_string()).unwrap();
        cluster.agents.insert("h1".into(), agent);
        (cluster, workload)
    }

    #[test]
    fn a_cluster_dropped_early_stops_its_agents_workloads_too() {
        let dir = tempfile::tempdir().unwrap();
        let (cluster, mut workload) = cluster_with_a_workload(dir.path());
        drop(cluster);
        // Killed, not run to its end (which would take 30 s and exit 0).
        assert_eq!(workload.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_released_cluster_is_left_running() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cluster, mut workload) = cluster_with_a_workload(dir.path());
        let agent_pid = cluster.agents["h1"].pid().unwrap();
        cluster.release_all();
        drop(cluster);
        assert!(workload.try_wait().unwrap().is_none(), "the workload runs on");
        // SAFETY: kill takes no memory of ours; the pid is our own child's, not yet reaped.
        assert_eq!(unsafe { libc::kill(agent_pid as i32, 0) }, 0, "the agent runs on");
        workload.kill().unwrap();
        kill9(&agent_pid.to_string());
    }
}
