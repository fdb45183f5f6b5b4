//! The supervisor's durable record of its processes, and the /proc checks that tell whether
//! a recorded pid is still the same process (pids are reused).

use super::SupervisorError;
use crate::command::CommandSpec;
use crate::desired::WorkloadSpec;
use crate::reconcile::Role;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub id: String,
    /// Order of creation; ids are never reused.
    pub seq: u64,
    /// uuid of the GPU the workload runs on.
    pub gpu: String,
    pub pid: u32,
    /// Start time of the process in clock ticks since boot (/proc/PID/stat field 22).
    pub start_ticks: u64,
    pub spec: WorkloadSpec,
    pub role: Role,
    pub port: u16,
    /// Its HTTP port and its metrics endpoint, when its launch passes them.
    #[serde(default)]
    pub http_port: Option<u16>,
    #[serde(default)]
    pub metrics: Option<MetricsEndpoint>,
    /// Whether the agent loads its model on its HTTP port (`crate::model_load`).
    #[serde(default)]
    pub load_model: bool,
    pub command: CommandSpec,
    pub restarts: u32,
}

/// Where a process serves its Prometheus metrics (on the loopback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsEndpoint {
    pub port: u16,
    pub path: String,
}

/// How one process is started: its command and the ports it was given.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub command: CommandSpec,
    pub port: u16,
    pub http_port: Option<u16>,
    pub metrics: Option<MetricsEndpoint>,
    /// Whether the agent loads its model on `http_port` once it is launched.
    pub load_model: bool,
}

impl Launch {
    /// A launch with one port (tests, and servers told only their gRPC port).
    pub fn on_port(command: CommandSpec, port: u16) -> Self {
        Launch { command, port, http_port: None, metrics: None, load_model: false }
    }

    /// Every port the process holds.
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        std::iter::once(self.port).chain(self.http_port).chain(self.metrics.as_ref().map(|m| m.port))
    }
}

impl ProcessRecord {
    /// Every port the process holds.
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        std::iter::once(self.port).chain(self.http_port).chain(self.metrics.as_ref().map(|m| m.port))
    }
}

pub struct RecordStore {
    path: PathBuf,
}

impl RecordStore {
    pub fn new(path: PathBuf) -> Self {
        RecordStore { path }
    }

    pub fn load(&self) -> Result<Vec<ProcessRecord>, SupervisorError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| SupervisorError::State {
                path: self.path.clone(),
                reason: format!("corrupt ({e}); move it away to start without adopting processes"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(SupervisorError::State { path: self.path.clone(), reason: e.to_string() }),
        }
    }

    /// Writes the records atomically (temporary file, fsync, rename) so that a crash leaves
    /// the old or the new list, never half of one.
    pub fn save<'a>(&self, records: impl Iterator<Item = &'a ProcessRecord>) -> Result<(), SupervisorError> {
        use std::io::Write;
        let list: Vec<&ProcessRecord> = records.collect();
        let err = |e: std::io::Error| SupervisorError::State { path: self.path.clone(), reason: e.to_string() };
        let tmp = self.path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&serde_json::to_vec_pretty(&list).expect("records serialize")).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)
    }
}

/// Start time of `pid` in clock ticks since boot, if it exists.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: parse after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    // `rest` starts at field 3; the start time is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` is still the process that started at `ticks` (and not a zombie).
pub fn is_same_process(pid: u32, ticks: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let zombie = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)) == Some("Z");
    !zombie && start_ticks(pid) == Some(ticks)
}

/// Signals the process group `pid` leads: a workload runs in a group of its own, and a
/// real server has children (Triton's python-backend stubs, MLServer's workers) that must
/// stop with it.
pub fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) has no memory-safety preconditions; a stale pid is ruled out by the
    // start-time check just before.
    unsafe {
        libc::kill(-pid, sig);
    }
}

/// The process group of `pid` (field 5 of its stat), if it exists and is not a zombie.
pub fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name: state (3), ppid (4), pgrp (5).
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(1)?.parse().ok()
}

/// Whether a live process is left in the group `pgid` (zombies hold nothing): a workload
/// whose leader died may leave its children (Triton's python-backend stubs, MLServer's
/// workers) holding GPU memory. Reads every `/proc/<pid>/stat`: done only when a process is
/// stopped or restarted.
pub fn group_has_members(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).any(|pid| process_group(pid) == Some(pgid))
}

/// SIGKILLs what is left of the group of the leader `pgid` (started at `leader_ticks`) once
/// the leader is gone; true if anything was. Not when another process holds the leader's
/// number: the kernel reuses no number while a group of it has members, so that group is
/// empty and the number is someone else's now.
pub fn kill_leftovers(pgid: u32, leader_ticks: u64) -> bool {
    if start_ticks(pgid).is_some_and(|t| t != leader_ticks) || !group_has_members(pgid) {
        return false;
    }
    signal(pgid, libc::SIGKILL);
    true
}
