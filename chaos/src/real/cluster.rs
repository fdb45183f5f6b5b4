//! The processes under test: three controllers and a few node agents (simulated GPUs),
//! each in its own network namespace, with data dirs, configs and one log per start under
//! the run's directory.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use controlplane::client::Client;
use controlplane::security::certs::{self, CertPlan};
use controlplane::security::{ClientCredentials, Principal, TlsMaterial};
use devcluster::agents::start_agent;
use devcluster::process::{kill_recorded_workloads, Proc};
use devcluster::{Binaries, Controllers};

use super::net::{Host, Network};

pub const CONTROLLER_PORT: u16 = 7400;
/// Where each controller serves its peers (`--peer-listen`), on its namespace's address.
pub const CONTROLLER_PEER_PORT: u16 = 7410;
/// Where each controller serves `/metrics` (`--metrics-listen`), on its namespace's address.
pub const CONTROLLER_METRICS_PORT: u16 = 7420;

pub struct Agent {
    pub index: u8,
    pub name: String,
    state_dir: PathBuf,
    proc: Option<Proc>,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub net: Network,
    bins: Binaries,
    pub controllers: Controllers,
    pub agents: Vec<Agent>,
    /// Data dirs with a tmpfs mounted on them (the full-disk fault), unmounted on drop.
    mounts: Vec<PathBuf>,
    /// The run's development CA and certificates: every link is mutually authenticated TLS,
    /// as in production.
    certs: PathBuf,
    /// The runner's own identity (an admin certificate).
    pub credentials: ClientCredentials,
    hostile_token: String,
}

/// Where the workload and the observers reach the cluster, and as whom.
#[derive(Clone)]
pub struct Access {
    pub servers: Vec<String>,
    pub credentials: ClientCredentials,
}

impl Access {
    pub fn client(&self) -> Client {
        Client::with_credentials(self.servers.clone(), self.credentials.clone()).expect("the runner's credentials are valid")
    }
}

const RUNNER: &str = "chaos-runner";
/// The tenant the `hostile` scenario plays, with a bearer token like any tenant.
pub const HOSTILE_TENANT: &str = "mallory";
const TOKENS_FILE: &str = "tokens.toml";

/// Generates the CA and the certificates of controllers 1..=3, the agents and the runner.
fn issue_certs(dir: &Path, net: &Network, ids: &[u64], agents: u8, hostile_token: &str) -> Result<ClientCredentials, String> {
    let plan = CertPlan {
        controllers: ids.to_vec(),
        nodes: (1..=agents).map(agent_name).collect(),
        admins: vec![RUNNER.into()],
        hosts: ids.iter().map(|id| net.ip(Host::Controller(*id)).to_string()).collect(),
        force: false,
    };
    certs::generate(dir, &plan).map_err(|e| format!("certificates: {e:#}"))?;
    let tokens = format!("[tenants]\n{HOSTILE_TENANT} = {:?}\n", controlplane::security::hash_token(hostile_token));
    std::fs::write(dir.join(TOKENS_FILE), tokens).map_err(|e| format!("tokens file: {e}"))?;
    let (cert, key) = certs::leaf_files(dir, &Principal::Admin(RUNNER.into()));
    let tls = TlsMaterial::load(&dir.join(certs::CA_CERT), Some(&cert), Some(&key)).map_err(|e| format!("certificates: {e:#}"))?;
    Ok(ClientCredentials { tls: Some(tls), token: None })
}

fn agent_name(index: u8) -> String {
    format!("chaos-node-{index}")
}

/// Makes the child join network namespace `ns` before it runs the program.
fn enter_namespace(cmd: &mut Command, ns: &str) -> Result<(), String> {
    let path = format!("/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: setns is async-signal-safe; `file` is moved into the closure and stays open
    // until the command is dropped.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

impl Cluster {
    /// Creates the network and starts controllers 1..=3 (node 1 bootstraps) and `agents`
    /// agents. With `small_disk`, that controller's data dir is a 32 MiB tmpfs.
    pub fn start(dir: &Path, bins: Binaries, agents: u8, small_disk: Option<u64>) -> Result<Cluster, String> {
        let ids = [1u64, 2, 3];
        let net = Network::create(&ids, agents)?;
        let certs = dir.join("certs");
        // The hostile tenant's bearer token: random per run, known only to the runner.
        let hostile_token = uuid::Uuid::new_v4().to_string();
        let credentials = issue_certs(&certs, &net, &ids, agents, &hostile_token)?;
        let members = ids.iter().map(|&id| (id, format!("{}:{CONTROLLER_PORT}", net.ip(Host::Controller(id)))));
        let namespaces: BTreeMap<u64, String> =
            ids.iter().map(|&id| (id, net.namespace(Host::Controller(id)).expect("a controller's namespace"))).collect();
        let tls = certs.clone();
        let metrics: BTreeMap<u64, String> =
            ids.iter().map(|&id| (id, format!("{}:{CONTROLLER_METRICS_PORT}", net.ip(Host::Controller(id))))).collect();
        let peer_addrs = ids.iter().map(|&id| (id, format!("{}:{CONTROLLER_PEER_PORT}", net.ip(Host::Controller(id)))));
        let controllers = Controllers::new(&bins.controlplane, dir, members)
            .with_peer_addrs(peer_addrs)
            .with_flags(move |id| {
                let (cert, key) = certs::leaf_files(&tls, &Principal::Controller(id));
                [
                    "--ca".into(),
                    tls.join(certs::CA_CERT),
                    "--cert".into(),
                    cert,
                    "--key".into(),
                    key,
                    "--tokens".into(),
                    tls.join(TOKENS_FILE),
                ]
                .iter()
                .map(|p| p.display().to_string())
                .chain(["--metrics-listen".to_string(), metrics[&id].clone()])
                .collect()
            })
            .with_env("RUST_LOG", "info,openraft=warn")
            .with_prepare(move |id, cmd| enter_namespace(cmd, &namespaces[&id]));
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            net,
            bins,
            controllers,
            agents: Vec::new(),
            mounts: Vec::new(),
            certs,
            credentials,
            hostile_token,
        };
        if let Some(id) = small_disk {
            cluster.mount_small_disk(id)?;
        }
        for id in ids {
            cluster.start_controller(id, id == 1)?;
        }
        for index in 1..=agents {
            cluster.add_agent(index)?;
        }
        Ok(cluster)
    }

    fn mount_small_disk(&mut self, id: u64) -> Result<(), String> {
        let data = self.controllers.members[&id].data_dir.clone();
        std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
            .arg(&data)
            .status()
            .map_err(|e| format!("mount: {e}"))?;
        if !status.success() {
            return Err(format!("mounting a tmpfs on {} failed", data.display()));
        }
        self.mounts.push(data);
        Ok(())
    }

    pub fn servers(&self) -> Vec<String> {
        self.controllers.servers()
    }

    pub fn access(&self) -> Access {
        Access { servers: self.servers(), credentials: self.credentials.clone() }
    }

    pub fn client(&self) -> Client {
        self.access().client()
    }

    /// A client of the hostile tenant: its bearer token over TLS, no client certificate.
    pub fn tenant_client(&self) -> Result<Client, String> {
        let tls = TlsMaterial::load(&self.certs.join(certs::CA_CERT), None, None).map_err(|e| format!("certificates: {e:#}"))?;
        Client::with_credentials(self.servers(), ClientCredentials { tls: Some(tls), token: Some(self.hostile_token.clone()) })
    }

    /// The hostile tenant's client of one controller only (`addr`).
    pub fn tenant_client_at(&self, addr: &str) -> Result<Client, String> {
        let tls = TlsMaterial::load(&self.certs.join(certs::CA_CERT), None, None).map_err(|e| format!("certificates: {e:#}"))?;
        Client::with_credentials(vec![addr.to_string()], ClientCredentials { tls: Some(tls), token: Some(self.hostile_token.clone()) })
    }

    /// Where controller `id` serves `/metrics`.
    pub fn metrics_addr(&self, id: u64) -> std::net::SocketAddr {
        format!("{}:{CONTROLLER_METRICS_PORT}", self.net.ip(Host::Controller(id))).parse().expect("a socket address")
    }

    /// Where controller `id` serves the API.
    pub fn api_addr(&self, id: u64) -> std::net::SocketAddr {
        format!("{}:{CONTROLLER_PORT}", self.net.ip(Host::Controller(id))).parse().expect("a socket address")
    }

    /// A client holding agent `index`'s node certificate: a compromised node.
    pub fn node_client(&self, index: u8) -> Result<Client, String> {
        let (cert, key) = certs::leaf_files(&self.certs, &Principal::Node(agent_name(index)));
        let tls =
            TlsMaterial::load(&self.certs.join(certs::CA_CERT), Some(&cert), Some(&key)).map_err(|e| format!("certificates: {e:#}"))?;
        Client::with_credentials(self.servers(), ClientCredentials { tls: Some(tls), token: None })
    }

    /// Starts controller `id` from its data dir; the log of each start is kept apart.
    pub fn start_controller(&mut self, id: u64, bootstrap: bool) -> Result<PathBuf, String> {
        self.controllers.start(id, bootstrap)
    }

    pub fn pid(&self, id: u64) -> Option<u32> {
        self.controllers.pid(id)
    }

    pub fn running(&self, id: u64) -> bool {
        self.controllers.running(id)
    }

    pub fn kill9(&mut self, id: u64) {
        self.controllers.kill9(id);
    }

    /// Waits up to `within` for controller `id` to exit on its own; its status and log.
    pub async fn wait_exit(&mut self, id: u64, within: Duration) -> Option<(ExitStatus, String)> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(exit) = self.controllers.exited(id) {
                return Some(exit);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    fn agent_config(&self, index: u8, name: &str, state_dir: &Path) -> String {
        let ip = self.net.ip(Host::Agent(index));
        let (cert, key) = certs::leaf_files(&self.certs, &Principal::Node(name.to_string()));
        format!(
            "node = {name:?}\ncontrollers = {controllers:?}\ninstance_type = \"chaos-a100\"\nstate_dir = {state:?}\n\
             ca = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n\
             advertise = \"{ip}:7100\"\nport_range = [20000, 20099]\nrouter_ports = [7200, 7219]\ninterval_ms = 300\n\
             [sim]\ngpus = [\"A100-80GB\"]\n[template]\nkind = \"command\"\nprogram = {program:?}\nargs = {args:?}\n",
            controllers = self.servers(),
            state = state_dir.display().to_string(),
            ca = self.certs.join(certs::CA_CERT).display().to_string(),
            cert = cert.display().to_string(),
            key = key.display().to_string(),
            program = self.bins.sim_infer.display().to_string(),
            args = [
                "--listen=127.0.0.1:{port}",
                "--model={model}",
                "--mig-gpcs={gpcs}",
                "--max-batch={batch}",
                "--time-scale=0.1",
                "--id={service}:{port}"
            ],
        )
    }

    fn add_agent(&mut self, index: u8) -> Result<(), String> {
        let name = agent_name(index);
        let state_dir = self.dir.join(format!("agent-{index}"));
        let config = self.agent_config(index, &name, &state_dir);
        let ns = self.net.namespace(Host::Agent(index)).expect("an agent's namespace");
        let prepare = |cmd: &mut Command| enter_namespace(cmd, &ns);
        let proc = start_agent(&self.bins.node_agent, &self.dir, &format!("agent-{index}"), &config, Some(&prepare))?;
        self.agents.push(Agent { index, name, state_dir, proc: Some(proc) });
        Ok(())
    }

    /// Stops everything this cluster started (idempotent).
    pub fn shutdown(&mut self) {
        for a in &mut self.agents {
            if let Some(mut p) = a.proc.take() {
                p.kill9();
            }
            kill_recorded_workloads(&a.state_dir);
        }
        self.controllers.shutdown();
        for m in self.mounts.drain(..) {
            let _ = Command::new("umount").arg(&m).status();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Before the network goes (a field dropped after this): nothing may be left
        // running in a namespace or holding the tmpfs.
        self.shutdown();
    }
}
