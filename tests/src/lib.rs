//! Helpers for end-to-end tests that start the real binaries: locating (and building)
//! them, free loopback ports, and child processes that are killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

/// Path of a binary of the `controlplane` package, building the package's binaries once
/// per test process (a no-op when they are up to date).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "controlplane", "--bins"])
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

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
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
    Command::new(binary("gpuctl")).arg("--server").arg(servers.join(",")).args(args).output().unwrap()
}
