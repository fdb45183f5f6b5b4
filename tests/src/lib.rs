//! Helpers for end-to-end tests that start the real binaries: locating (and building)
//! them, free loopback ports, and child processes that are killed when dropped.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Path of a binary of the `controlplane` or `node-agent` package, building the package's binaries once
/// per test process (a no-op when they are up to date).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "controlplane", "-p", "node-agent", "--bins"])
            .status()
            .expect("running cargo build for the binaries");
        assert!(status.success(), "building the binaries failed");
        // Test executables live in target/<profile>/deps; binaries one level up.
        let exe = std::env::current_exe().unwrap();
        exe.parent().and_then(Path::parent).unwrap().to_path_buf()
    });
    let path = dir.join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// A loopback address with a port that was free a moment ago. Below the kernel's ephemeral
/// range (32768 and up): a port the kernel picked for `:0` is one it also hands to outgoing
/// connections, which other tests' processes open by the hundred, so it could be taken
/// before the controller binds it (a cluster once came up without its bootstrap node under
/// a full test run's load). Ports come from a counter shared by this process's test
/// threads, in a block of 10,000-16,999 chosen by process id.
pub fn free_addr() -> String {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % 35) as u16 * 200;
    for _ in 0..200 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 200;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().unwrap().to_string();
        }
    }
    panic!("no free loopback port in {base}..{}", base + 200);
}

/// A child process killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).unwrap();
        let child = cmd.stdout(Stdio::from(out.try_clone().unwrap())).stderr(Stdio::from(out)).spawn().unwrap();
        Proc { child, name: name.to_string() }
    }

    /// A node agent with `config` (written to `dir/agent.toml`), logging to `dir/agent.log`.
    pub fn node_agent(dir: &Path, config: &str) -> Proc {
        let path = dir.join("agent.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = Command::new(binary("node-agent"));
        cmd.arg("--config").arg(&path).env("RUST_LOG", "info");
        Proc::spawn("node-agent", &mut cmd, &dir.join("agent.log"))
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs gpuctl against `servers` and returns its output.
pub fn gpuctl(servers: &[String], args: &[&str]) -> Output {
    Command::new(binary("gpuctl")).arg("--insecure").arg("--server").arg(servers.join(",")).args(args).output().unwrap()
}

/// Three controller processes on loopback with sled data dirs under one temporary directory.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub addrs: BTreeMap<u64, String>,
    pub procs: BTreeMap<u64, Proc>,
    /// Extra flags for every controller process.
    pub flags: Vec<String>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Self::start_with(&[])
    }

    /// Three controllers started with extra `flags` (e.g. `--no-loops`).
    pub fn start_with(flags: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let addrs: BTreeMap<u64, String> = (1..=3).map(|id| (id, free_addr())).collect();
        let flags = flags.iter().map(|f| f.to_string()).collect();
        let mut cluster = Cluster { dir, addrs, procs: BTreeMap::new(), flags };
        for id in 1..=3 {
            cluster.spawn(id, id == 1);
        }
        cluster
    }

    pub fn spawn(&mut self, id: u64, bootstrap: bool) {
        let mut cmd = Command::new(binary("controlplane"));
        cmd.arg("--insecure")
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&self.addrs[&id])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("n{id}")));
        for (pid, addr) in &self.addrs {
            cmd.arg("--peer").arg(format!("{pid}={addr}"));
        }
        if bootstrap {
            cmd.arg("--bootstrap");
        }
        cmd.args(&self.flags);
        let log = self.dir.path().join(format!("n{id}.log"));
        self.procs.insert(id, Proc::spawn(&format!("controller-{id}"), &mut cmd, &log));
    }

    pub fn servers(&self) -> Vec<String> {
        self.addrs.values().cloned().collect()
    }

    /// The current leader among the running processes (waits up to 20 s).
    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = gpuctl(&self.servers(), &["cluster", "status", "-o", "json"]);
            if let Ok(views) = serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout) {
                if let Some(l) = views.iter().find(|v| v["state"] == "Leader").and_then(|v| v["node_id"].as_u64()) {
                    if self.procs.contains_key(&l) {
                        return l;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("no leader among the controller processes");
    }
}
