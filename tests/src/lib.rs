//! Helpers for end-to-end tests that start the real binaries: locating (and building) them,
//! and a three-controller cluster. Processes are started the one way local clusters start
//! them (`devcluster`).
pub mod agent;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use devcluster::ports::free_loopback_addr as free_addr;
pub use devcluster::{Controllers, Proc};

/// Path of a binary of the `controlplane`, `gpuctl` or `node-agent` package, building their
/// binaries once per test process.
///
/// Built as README's test command builds them, `cargo test --workspace`, so with the
/// same features of shared dependencies: `cargo build -p …` or `cargo build --workspace`
/// resolves others (the tests' dev-dependencies turn some on) and compiled a dozen crates
/// again in the middle of the suite. `cargo test` builds a package's binaries only when the
/// package has integration tests; each of the three has some (`gpuctl`'s are in
/// `controlplane/gpuctl/tests`).
/// The variables cargo sets for a running test are removed for this inner build: ring's
/// build script declares `CARGO_MANIFEST_DIR` and `CARGO_PKG_*` with `rerun-if-env-changed`
/// (briansmith/ring#2454), and cargo compares them with its own environment, so with the
/// test's values ring and everything above it (rustls, tonic, `proto`, ...) was rebuilt.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["test", "--workspace", "--no-run", "--quiet"]);
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(set_by_cargo_for_a_test) {
                build.env_remove(name);
            }
        }
        let status = build.status().expect("running cargo test --no-run for the binaries");
        assert!(status.success(), "building the binaries failed");
        // Test executables live in target/<profile>/deps; binaries one level up.
        let exe = std::env::current_exe().unwrap();
        exe.parent().and_then(Path::parent).unwrap().to_path_buf()
    });
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} was not built by `cargo test --workspace --no-run`: cargo builds a package's binaries only for its integration tests",
        path.display()
    );
    path
}

/// Whether cargo sets the variable `name` for a test it runs (the package's manifest
/// values, its output and temporary directories), as opposed to the configuration it reads.
fn set_by_cargo_for_a_test(name: &str) -> bool {
    const EXACT: [&str; 6] =
        ["CARGO_CRATE_NAME", "CARGO_BIN_NAME", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "CARGO_RUSTC_CURRENT_DIR", "OUT_DIR"];
    const PREFIXES: [&str; 3] = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_EXE_"];
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A node agent with `config` (written to `dir/agent.toml`), logging to `dir/agent.log`.
pub fn node_agent(dir: &Path, config: &str) -> Proc {
    devcluster::agents::start_agent(&binary("node-agent"), dir, "agent", config, None).unwrap()
}

/// Runs gpuctl against `servers` and returns its output.
pub fn gpuctl(servers: &[String], args: &[&str]) -> Output {
    Command::new(binary("gpuctl")).arg("--insecure").arg("--server").arg(servers.join(",")).args(args).output().unwrap()
}

/// Three controller processes on loopback with their data dirs and logs under one temporary
/// directory (dropped after the processes).
pub struct Cluster {
    pub controllers: Controllers,
    /// Each controller's /metrics listener, by node id.
    pub metrics: std::collections::BTreeMap<u64, String>,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start() -> Cluster {
        Self::start_with(&[])
    }

    /// Three controllers started with extra `flags` (e.g. `--no-loops`).
    pub fn start_with(flags: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let flags: Vec<String> = ["--insecure"].iter().chain(flags).map(|f| f.to_string()).collect();
        let metrics: std::collections::BTreeMap<u64, String> = (1..=3).map(|id| (id, free_addr())).collect();
        let listeners = metrics.clone();
        let mut controllers = Controllers::three_on_loopback(&binary("controlplane"), dir.path())
            .with_flags(move |id| flags.iter().cloned().chain(["--metrics-listen".into(), listeners[&id].clone()]).collect());
        controllers.start_all().unwrap();
        Cluster { controllers, metrics, dir }
    }

    pub fn servers(&self) -> Vec<String> {
        self.controllers.servers()
    }

    /// The current leader among the running processes (waits up to 20 s).
    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = gpuctl(&self.servers(), &["cluster", "status", "-o", "json"]);
            if let Ok(views) = serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout) {
                if let Some(l) = views.iter().find(|v| v["state"] == "Leader").and_then(|v| v["node_id"].as_u64()) {
                    if self.controllers.running(l) {
                        return l;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("no leader among the controller processes");
    }
}

/// The real inference servers and clients (Triton, MLServer, `tritonclient`), installed by
/// `deploy/real-servers/install.sh` when missing (idempotent: a no-op when up to date), once
/// per test process. The directory it installed into: `venv/bin/python` runs the clients.
pub fn real_servers() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/real-servers/install.sh");
        let out = Command::new("bash").arg(&script).output().unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "installing the real servers failed:\n{printed}");
        // Its last line on success, whether it installed now or found an install up to
        // date: "gpuplane real servers: ready in ROOT (stamp ...)".
        let root = printed
            .lines()
            .rev()
            .find_map(|l| l.split_once("ready in ").map(|(_, rest)| rest.split(" (").next().unwrap_or(rest).to_string()))
            .unwrap_or_else(|| panic!("install.sh did not name its directory:\n{printed}"));
        PathBuf::from(root)
    })
    .clone()
}
