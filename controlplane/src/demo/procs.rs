//! The demo's processes: three controllers and one node agent per demo node, each with its
//! own config and log under the demo's directory, killed when dropped (unless kept).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::scenario::DemoNode;
use crate::procs::{free_port_block, kill9, kill_recorded_workloads, Proc};

/// The binaries the demo runs, next to the running `gpuctl`.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub controlplane: PathBuf,
    pub node_agent: PathBuf,
    pub sim_infer: PathBuf,
}

impl Binaries {
    /// The binaries next to the running program (`gpuctl`, `chaos`), named `who` in errors.
    pub fn beside_current_exe(who: &str) -> Result<Binaries, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot locate {who}: {e}"))?;
        let dir = exe.parent().ok_or(format!("{who} has no parent directory"))?;
        let find = |name: &str| {
            let path = dir.join(name);
            if path.exists() {
                Ok(path)
            } else {
                Err(format!(
                    "{} not found: {who} runs the controller, node-agent and sim-infer binaries next to itself \
                     (build them all with `cargo build --release`)",
                    path.display()
                ))
            }
        };
        Ok(Binaries { controlplane: find("controlplane")?, node_agent: find("node-agent")?, sim_infer: find("sim-infer")? })
    }
}

/// Timings of the demo's control loops: fast enough to show in a minute or two.
#[derive(Clone, Debug)]
pub struct DemoTimings {
    pub provision_interval_s: f64,
    pub heartbeat_ms: u64,
    pub missed_heartbeats: u32,
    pub scale_window_s: f64,
    pub cooldown_s: f64,
    /// Launch latencies of the simulated cloud are multiplied by this.
    pub launch_time_scale: f64,
}

/// Everything the demo runs, and where.
pub struct DemoCluster {
    pub dir: PathBuf,
    pub bins: Binaries,
    pub addrs: BTreeMap<u64, String>,
    /// Each controller's `/metrics` address.
    pub metrics_addrs: BTreeMap<u64, String>,
    pub controllers: BTreeMap<u64, Proc>,
    pub agents: BTreeMap<String, Proc>,
    /// First port of each agent's block (100 workload ports, then 20 router ports).
    agent_ports: BTreeMap<String, u16>,
    mig_strategy: crate::provision::MigStrategy,
    timings: DemoTimings,
    next_block: u16,
}

impl DemoCluster {
    pub fn new(dir: &Path, bins: Binaries, mig_strategy: crate::provision::MigStrategy, timings: DemoTimings) -> Result<Self, String> {
        let base = free_port_block(17400, 3)?;
        let addrs = (1..=3u64).map(|id| (id, format!("127.0.0.1:{}", base + id as u16 - 1))).collect();
        let metrics_base = free_port_block(base + 100, 3)?;
        let metrics_addrs = (1..=3u64).map(|id| (id, format!("127.0.0.1:{}", metrics_base + id as u16 - 1))).collect();
        Ok(DemoCluster {
            dir: dir.to_path_buf(),
            bins,
            addrs,
            metrics_addrs,
            controllers: BTreeMap::new(),
            agents: BTreeMap::new(),
            agent_ports: BTreeMap::new(),
            mig_strategy,
            timings,
            next_block: 21000,
        })
    }

    pub fn servers(&self) -> Vec<String> {
        self.addrs.values().cloned().collect()
    }

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

    fn controller_config(&self, id: u64) -> String {
        let t = &self.timings;
        let peers: String = self.addrs.iter().map(|(i, a)| format!("\"{i}\" = {a:?}\n")).collect();
        let strategy = self.mig_strategy.flag_name();
        format!(
            "node_id = {id}\nlisten = {listen:?}\nmetrics_listen = {metrics:?}\ndata_dir = {data:?}\nbootstrap = {bootstrap}\n\n[security]\ninsecure = true\n\n[peers]\n{peers}\n[loops]\n\
             provision_interval_s = {pi}\nmig_strategy = \"{strategy}\"\nheartbeat_interval_ms = {hb}\nmissed_heartbeats = {missed}\n\
             scale_window_s = {window}\ncooldown_s = {cooldown}\n\n[cloud]\nprovider = \"sim\"\nagent_binary = {agent:?}\n\
             workload_program = {sim:?}\nworkload_args = {args:?}\nbase_dir = {cloud:?}\nfirst_port = {first}\ntime_scale = {scale}\n",
            listen = self.addrs[&id],
            metrics = self.metrics_addrs[&id],
            data = self.dir.join(format!("controller-{id}")).display().to_string(),
            bootstrap = id == 1,
            pi = t.provision_interval_s,
            hb = t.heartbeat_ms,
            missed = t.missed_heartbeats,
            window = t.scale_window_s,
            cooldown = t.cooldown_s,
            agent = self.bins.node_agent.display().to_string(),
            sim = self.bins.sim_infer.display().to_string(),
            args = Self::workload_args(),
            cloud = self.dir.join("cloud").display().to_string(),
            // Each controller launches into its own range, so a new leader never reuses the
            // ports of nodes the previous one launched.
            first = 40000 + (id as u16 - 1) * 6000,
            scale = t.launch_time_scale,
        )
    }

    /// Starts (or restarts) controller `id`.
    pub fn start_controller(&mut self, id: u64) -> Result<(), String> {
        let path = self.dir.join(format!("controller-{id}.toml"));
        std::fs::write(&path, self.controller_config(id)).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut cmd = Command::new(&self.bins.controlplane);
        cmd.arg("--config").arg(&path).env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        let proc = Proc::spawn(&mut cmd, &self.dir.join(format!("controller-{id}.log")))?;
        self.controllers.insert(id, proc);
        Ok(())
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
            hb = self.timings.heartbeat_ms,
            program = self.bins.sim_infer.display().to_string(),
            args = Self::workload_args(),
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
        let dir = self.dir.join("agents");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(format!("{}.toml", node.name));
        std::fs::write(&path, self.agent_config(node, first)).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut cmd = Command::new(&self.bins.node_agent);
        cmd.arg("--config").arg(&path).env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        let proc = Proc::spawn(&mut cmd, &dir.join(format!("{}.log", node.name)))?;
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
        for p in self.controllers.values_mut().chain(self.agents.values_mut()) {
            p.release();
        }
    }

    /// Stops the agents (and their workloads) and the controllers.
    pub fn shutdown(&mut self) {
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
        for p in self.controllers.values_mut() {
            p.kill9();
        }
    }
}
