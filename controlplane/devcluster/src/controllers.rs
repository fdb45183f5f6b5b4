//! The one way a local cluster starts its controllers: each from its data dir with its
//! identity and peers as flags, the cluster's own flags after them (security, a config file,
//! loop settings), one log per start, killed when dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use crate::process::Proc;

/// One controller of the cluster.
pub struct Member {
    pub id: u64,
    /// The address its API listens on.
    pub addr: String,
    /// The address of its peer listener (`--peer-listen`), if it has one; else its peers
    /// reach it at `addr`.
    pub peer_addr: Option<String>,
    pub data_dir: PathBuf,
    /// The running process, if any.
    pub proc: Option<Proc>,
    starts: u32,
}

/// Flags for one controller's start, after its identity ones.
pub type FlagsFor = Box<dyn Fn(u64) -> Vec<String> + Send + Sync>;
/// A last change to a controller's command before it starts (e.g. joining a network
/// namespace).
pub type Prepare = Box<dyn Fn(u64, &mut Command) -> Result<(), String> + Send + Sync>;

/// The controllers of one local cluster.
pub struct Controllers {
    bin: PathBuf,
    log_dir: PathBuf,
    pub members: BTreeMap<u64, Member>,
    flags: FlagsFor,
    env: Vec<(String, String)>,
    prepare: Option<Prepare>,
}

impl Controllers {
    /// Controllers `(id, address)` running `bin`, each with its data dir at
    /// `dir/controller-<id>` and its logs in `dir`; none started yet. By default they run
    /// `--insecure` and log at `info`.
    pub fn new(bin: &Path, dir: &Path, members: impl IntoIterator<Item = (u64, String)>) -> Controllers {
        let members = members
            .into_iter()
            .map(|(id, addr)| {
                (id, Member { id, addr, peer_addr: None, data_dir: dir.join(format!("controller-{id}")), proc: None, starts: 0 })
            })
            .collect();
        Controllers {
            bin: bin.to_path_buf(),
            log_dir: dir.to_path_buf(),
            members,
            flags: Box::new(|_| vec!["--insecure".to_string()]),
            env: vec![("RUST_LOG".into(), "info".into())],
            prepare: None,
        }
    }

    /// Three controllers on free loopback ports, each with a peer listener of its own.
    pub fn three_on_loopback(bin: &Path, dir: &Path) -> Controllers {
        Controllers::new(bin, dir, (1..=3).map(|id| (id, crate::ports::free_loopback_addr())))
            .with_peer_addrs((1..=3).map(|id| (id, crate::ports::free_loopback_addr())))
    }

    /// Gives controllers peer listeners (`--peer-listen`) at these addresses, and every
    /// controller's `--peer` flags these as their peer addresses.
    pub fn with_peer_addrs(mut self, peer_addrs: impl IntoIterator<Item = (u64, String)>) -> Self {
        for (id, peer_addr) in peer_addrs {
            if let Some(m) = self.members.get_mut(&id) {
                m.peer_addr = Some(peer_addr);
            }
        }
        self
    }

    /// The flags each start gets after its identity ones (replacing `--insecure`).
    pub fn with_flags(mut self, flags: impl Fn(u64) -> Vec<String> + Send + Sync + 'static) -> Self {
        self.flags = Box::new(flags);
        self
    }

    /// Sets an environment variable of every start (e.g. `RUST_LOG`).
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn with_prepare(mut self, prepare: impl Fn(u64, &mut Command) -> Result<(), String> + Send + Sync + 'static) -> Self {
        self.set_prepare(prepare);
        self
    }

    /// [`Controllers::with_prepare`] on controllers already built (e.g. a `LocalCluster`'s).
    pub fn set_prepare(&mut self, prepare: impl Fn(u64, &mut Command) -> Result<(), String> + Send + Sync + 'static) {
        self.prepare = Some(Box::new(prepare));
    }

    /// Starts (or restarts) controller `id` from its data dir; the node that `bootstrap`s
    /// initialises a new cluster. Returns the log of this start: `controller-<id>.log`, then
    /// `controller-<id>.start-<n>.log` for later starts.
    pub fn start(&mut self, id: u64, bootstrap: bool) -> Result<PathBuf, String> {
        let peers: Vec<String> = self
            .members
            .values()
            .map(|m| match &m.peer_addr {
                Some(peer) => format!("{}={},{peer}", m.id, m.addr),
                None => format!("{}={}", m.id, m.addr),
            })
            .collect();
        let member = self.members.get_mut(&id).ok_or(format!("no controller {id}"))?;
        member.starts += 1;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--node-id").arg(id.to_string()).arg("--listen").arg(&member.addr).arg("--data-dir").arg(&member.data_dir);
        if let Some(peer_addr) = &member.peer_addr {
            cmd.arg("--peer-listen").arg(peer_addr);
        }
        for p in &peers {
            cmd.arg("--peer").arg(p);
        }
        if bootstrap {
            cmd.arg("--bootstrap");
        }
        cmd.args((self.flags)(id));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(prepare) = &self.prepare {
            prepare(id, &mut cmd)?;
        }
        let log = match member.starts {
            1 => self.log_dir.join(format!("controller-{id}.log")),
            n => self.log_dir.join(format!("controller-{id}.start-{n}.log")),
        };
        member.proc = Some(Proc::spawn(&mut cmd, &log)?);
        Ok(log)
    }

    /// Starts every controller; the lowest id bootstraps.
    pub fn start_all(&mut self) -> Result<(), String> {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for (i, id) in ids.into_iter().enumerate() {
            self.start(id, i == 0)?;
        }
        Ok(())
    }

    pub fn servers(&self) -> Vec<String> {
        self.members.values().map(|m| m.addr.clone()).collect()
    }

    pub fn addr(&self, id: u64) -> &str {
        &self.members[&id].addr
    }

    pub fn ids(&self) -> Vec<u64> {
        self.members.keys().copied().collect()
    }

    pub fn pid(&self, id: u64) -> Option<u32> {
        self.members.get(&id)?.proc.as_ref()?.pid()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.members.values().filter_map(|m| m.proc.as_ref()?.pid()).collect()
    }

    pub fn running(&self, id: u64) -> bool {
        self.members.get(&id).is_some_and(|m| m.proc.is_some())
    }

    /// SIGKILL to controller `id` (a crash).
    pub fn kill9(&mut self, id: u64) {
        if let Some(mut p) = self.members.get_mut(&id).and_then(|m| m.proc.take()) {
            p.kill9();
        }
    }

    /// Stops controller `id` as an operator or an orchestrator does (SIGTERM), waiting up to
    /// `within` before killing it; its exit status if it exited by itself.
    pub fn terminate(&mut self, id: u64, within: std::time::Duration) -> Option<ExitStatus> {
        self.members.get_mut(&id).and_then(|m| m.proc.take())?.terminate(within)
    }

    /// Controller `id`'s exit status and log once it has exited on its own.
    pub fn exited(&mut self, id: u64) -> Option<(ExitStatus, String)> {
        let member = self.members.get_mut(&id)?;
        let status = member.proc.as_mut()?.exited()?;
        let proc = member.proc.take()?;
        Some((status, std::fs::read_to_string(&proc.log).unwrap_or_default()))
    }

    /// Leaves every controller running after this is dropped.
    pub fn release_all(&mut self) {
        for m in self.members.values_mut() {
            if let Some(p) = m.proc.as_mut() {
                p.release();
            }
        }
    }

    /// Kills every controller (idempotent).
    pub fn shutdown(&mut self) {
        for m in self.members.values_mut() {
            if let Some(mut p) = m.proc.take() {
                p.kill9();
            }
        }
    }
}
