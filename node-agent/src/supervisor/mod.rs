//! Process supervisor: starts workload processes from templates, restarts crashed ones with
//! back-off, and after an agent restart adopts the processes still running (they run in
//! their own process group, so killing the agent does not kill them) instead of starting
//! duplicates.

mod backoff;
mod records;
pub mod template;

pub use backoff::restart_delay;
pub use records::{Launch, MetricsEndpoint, ProcessRecord, RecordStore};

use crate::command::CommandSpec;
use crate::desired::WorkloadSpec;
use crate::reconcile::Role;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot start `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("process state file {path}: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("no process with id {0}")]
    Unknown(String),
}

/// A process the supervisor runs.
struct Supervised {
    record: ProcessRecord,
    /// Set for processes this agent started (so it can reap them); adopted ones have none.
    child: Option<Child>,
    exited_at: Option<Instant>,
    /// When it was launched, until it first answers ready (for its cold start).
    launched: Option<Instant>,
}

pub struct Supervisor {
    store: RecordStore,
    log_dir: PathBuf,
    procs: BTreeMap<String, Supervised>,
    next_id: u64,
}

impl Supervisor {
    /// Opens the supervisor's state in `state_dir`, adopting every recorded process that is
    /// still alive (same pid and start time) and forgetting the others.
    pub fn open(state_dir: &Path) -> Result<(Supervisor, usize), SupervisorError> {
        let store = RecordStore::new(state_dir.join("processes.json"));
        let log_dir = state_dir.join("logs");
        std::fs::create_dir_all(&log_dir).map_err(|e| SupervisorError::State { path: log_dir.clone(), reason: e.to_string() })?;
        let mut procs = BTreeMap::new();
        let mut next_id = 0;
        for record in store.load()? {
            next_id = next_id.max(record.seq + 1);
            if records::is_same_process(record.pid, record.start_ticks) {
                procs.insert(record.id.clone(), Supervised { record, child: None, exited_at: None, launched: None });
            }
        }
        let adopted = procs.len();
        let s = Supervisor { store, log_dir, procs, next_id };
        s.save()?;
        Ok((s, adopted))
    }

    fn save(&self) -> Result<(), SupervisorError> {
        self.store.save(self.procs.values().map(|p| &p.record))
    }

    /// Starts a process for `spec` in `role` with `launch`; returns its id.
    pub fn start(&mut self, gpu: &str, spec: &WorkloadSpec, role: Role, launch: &Launch) -> Result<String, SupervisorError> {
        let seq = self.next_id;
        self.next_id += 1;
        let id = format!("{}-{}-{seq}", spec.service, if role == Role::Active { "a" } else { "s" });
        let (child, start_ticks) = self.spawn(&id, &launch.command)?;
        let record = ProcessRecord {
            id: id.clone(),
            seq,
            gpu: gpu.to_string(),
            pid: child.id(),
            start_ticks,
            spec: spec.clone(),
            role,
            port: launch.port,
            http_port: launch.http_port,
            metrics: launch.metrics.clone(),
            load_model: launch.load_model,
            command: launch.command.clone(),
            restarts: 0,
        };
        let launched = Some(Instant::now());
        self.procs.insert(id.clone(), Supervised { record, child: Some(child), exited_at: None, launched });
        self.save()?;
        Ok(id)
    }

    fn spawn(&self, id: &str, cmd: &CommandSpec) -> Result<(Child, u64), SupervisorError> {
        let log = self.log_dir.join(format!("{id}.log"));
        let err = |e: std::io::Error| SupervisorError::Spawn { command: cmd.command_line(), source: e };
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(err)?;
        let mut command = Command::new(&cmd.program);
        command
            .args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(err)?)
            .stderr(out)
            // Its own process group: signals to the agent (Ctrl-C, kill of the group) do not
            // reach the workload, which keeps serving while the agent restarts.
            .process_group(0);
        let child = command.spawn().map_err(err)?;
        let ticks = records::start_ticks(child.id()).unwrap_or(0);
        Ok((child, ticks))
    }

    /// Changes a process's role (a standby promoted to active).
    pub fn set_role(&mut self, id: &str, role: Role) -> Result<(), SupervisorError> {
        let p = self.procs.get_mut(id).ok_or_else(|| SupervisorError::Unknown(id.to_string()))?;
        p.record.role = role;
        self.save()
    }

    /// Stops a process: SIGTERM, then SIGKILL after `grace`. Unknown ids are already stopped.
    pub fn stop(&mut self, id: &str, grace: Duration) -> Result<(), SupervisorError> {
        let Some(mut p) = self.procs.remove(id) else { return Ok(()) };
        if p.exited_at.is_none() && records::is_same_process(p.record.pid, p.record.start_ticks) {
            records::signal(p.record.pid, libc::SIGTERM);
            let deadline = Instant::now() + grace;
            // The grace is for the server's children too (they had the SIGTERM with it); the
            // leader is reaped first, or its zombie would keep the group alive.
            // The group is scanned (all of /proc) only once the leader is gone, and less often.
            let pgid = p.record.pid;
            while Instant::now() < deadline {
                let leader_alive = !reaped(&mut p.child) && records::is_same_process(pgid, p.record.start_ticks);
                if !leader_alive && !records::group_has_members(pgid) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(if leader_alive { 10 } else { 50 }));
            }
            if records::is_same_process(p.record.pid, p.record.start_ticks) {
                records::signal(p.record.pid, libc::SIGKILL);
            }
            if let Some(c) = p.child.as_mut() {
                let _ = c.wait();
            }
        }
        // Children that outlived their leader (it died before, or they ignored SIGTERM) hold
        // GPU memory and would outlive the agent's record of them.
        if records::kill_leftovers(p.record.pid, p.record.start_ticks) {
            tracing::warn!(id, "killed processes its server left behind");
        }
        self.save()
    }

    /// Notices exited processes and restarts those whose back-off has elapsed. Returns the
    /// ids restarted.
    pub fn check(&mut self, now: Instant) -> Result<Vec<String>, SupervisorError> {
        let mut restarted = Vec::new();
        let ids: Vec<String> = self.procs.keys().cloned().collect();
        for id in ids {
            let p = self.procs.get_mut(&id).expect("listed");
            let alive = !reaped(&mut p.child) && records::is_same_process(p.record.pid, p.record.start_ticks);
            if alive {
                continue;
            }
            let exited_at = *p.exited_at.get_or_insert(now);
            if now.duration_since(exited_at) < restart_delay(p.record.restarts) {
                continue;
            }
            // What the dead server left behind goes before its successor starts.
            if records::kill_leftovers(p.record.pid, p.record.start_ticks) {
                tracing::warn!(id, "killed processes the exited server left behind");
            }
            let cmd = p.record.command.clone();
            let (child, ticks) = self.spawn(&id, &cmd)?;
            let p = self.procs.get_mut(&id).expect("listed");
            tracing::warn!(id, restarts = p.record.restarts + 1, "workload process exited; restarted");
            p.record.pid = child.id();
            p.record.start_ticks = ticks;
            p.record.restarts += 1;
            p.child = Some(child);
            p.exited_at = None;
            p.launched = Some(now);
            restarted.push(id);
        }
        if !restarted.is_empty() {
            self.save()?;
        }
        Ok(restarted)
    }

    pub fn records(&self) -> impl Iterator<Item = &ProcessRecord> {
        self.procs.values().map(|p| &p.record)
    }

    pub fn get(&self, id: &str) -> Option<&ProcessRecord> {
        self.procs.get(id).map(|p| &p.record)
    }

    /// Takes the SLO and predicted batch time of `spec` (the desired state's, which change
    /// without a restart) into `id`'s record; saved only when they changed.
    pub fn refresh(&mut self, id: &str, spec: &WorkloadSpec) -> Result<(), SupervisorError> {
        let Some(p) = self.procs.get_mut(id) else { return Ok(()) };
        let r = &mut p.record.spec;
        if r.slo_ms.to_bits() == spec.slo_ms.to_bits() && r.batch_ms.to_bits() == spec.batch_ms.to_bits() {
            return Ok(());
        }
        (r.slo_ms, r.batch_ms) = (spec.slo_ms, spec.batch_ms);
        self.save()
    }

    /// The processes that exited and were not restarted yet.
    pub fn exited(&self) -> impl Iterator<Item = &str> {
        self.procs.values().filter(|p| p.exited_at.is_some()).map(|p| p.record.id.as_str())
    }

    /// Where `id` stands, as the agent reports it (`ObservedWorkload.state` in agent.proto):
    /// "failed" while it waits to be restarted, "starting" from its launch until it answers
    /// ready, then "ready". A process adopted after an agent restart counts as ready.
    pub fn state(&self, id: &str) -> &'static str {
        match self.procs.get(id) {
            Some(p) if p.exited_at.is_some() => "failed",
            Some(p) if p.launched.is_some() => "starting",
            Some(_) => "ready",
            None => "failed",
        }
    }

    /// `id` answered ready at `now`: its cold start (launch to ready), the first time after
    /// each launch. `None` for a process adopted after an agent restart (its launch time is
    /// not known) or already counted.
    pub fn ready(&mut self, id: &str, now: Instant) -> Option<Duration> {
        let launched = self.procs.get_mut(id)?.launched.take()?;
        Some(now.saturating_duration_since(launched))
    }
}

/// Whether our own child has exited (reaping it); adopted processes have no handle.
fn reaped(child: &mut Option<Child>) -> bool {
    child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Slot;

    fn spec() -> WorkloadSpec {
        WorkloadSpec {
            service: "web".into(),
            model: "m".into(),
            slot: Slot::WholeGpu,
            mps_percent: 50.0,
            batch: 4,
            processes: 1,
            shadow_mps_percent: 10.0,
            slo_ms: 20.0,
            batch_ms: 0.0,
            runtime: None,
            model_uri: String::new(),
            retiring: false,
        }
    }

    fn sleeper() -> CommandSpec {
        CommandSpec::new("sleep").arg("600")
    }

    #[test]
    fn a_reopened_supervisor_adopts_live_processes_instead_of_starting_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, adopted) = Supervisor::open(dir.path()).unwrap();
        assert_eq!(adopted, 0);
        let a = s.start("GPU-0", &spec(), Role::Active, &Launch::on_port(sleeper(), 7000)).unwrap();
        let b = s.start("GPU-0", &spec(), Role::Standby, &Launch::on_port(sleeper(), 7001)).unwrap();
        let (pid_a, ticks_a) = (s.get(&a).unwrap().pid, s.get(&a).unwrap().start_ticks);
        // The agent "dies": its in-memory state is dropped, the processes keep running.
        drop(s);
        let (mut s, adopted) = Supervisor::open(dir.path()).unwrap();
        assert_eq!(adopted, 2);
        assert_eq!(s.get(&a).unwrap().pid, pid_a, "the same process, not a new one");
        assert_eq!(s.get(&b).unwrap().role, Role::Standby);
        // A new process gets a fresh id even after the restart.
        let c = s.start("GPU-0", &spec(), Role::Standby, &Launch::on_port(sleeper(), 7002)).unwrap();
        assert!(c != a && c != b);
        for id in [a, b, c] {
            s.stop(&id, Duration::from_secs(2)).unwrap();
        }
        assert!(!records::is_same_process(pid_a, ticks_a), "the adopted process was stopped");
        assert_eq!(s.records().count(), 0);
        let (_, adopted) = Supervisor::open(dir.path()).unwrap();
        assert_eq!(adopted, 0, "stopped processes are not adopted");
    }

    #[test]
    fn a_crashed_process_is_restarted_after_its_back_off() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Supervisor::open(dir.path()).unwrap();
        let id = s.start("GPU-0", &spec(), Role::Active, &Launch::on_port(sleeper(), 7000)).unwrap();
        assert_eq!(s.state(&id), "starting");
        assert!(s.ready(&id, Instant::now()).is_some(), "its cold start");
        assert_eq!(s.state(&id), "ready");
        let old = s.get(&id).unwrap().clone();
        records::signal(old.pid, libc::SIGKILL);
        let t0 = Instant::now();
        // Wait until the supervisor notices the exit.
        while s.check(t0).unwrap().is_empty() && s.procs[&id].exited_at.is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(s.get(&id).unwrap().pid, old.pid, "no restart before the back-off");
        assert_eq!(s.state(&id), "failed");
        let restarted = s.check(t0 + restart_delay(0)).unwrap();
        assert_eq!(restarted, vec![id.clone()]);
        assert_eq!(s.state(&id), "starting", "until the relaunched process answers");
        let new = s.get(&id).unwrap();
        assert_ne!(new.pid, old.pid);
        assert_eq!(new.restarts, 1);
        assert!(records::is_same_process(new.pid, new.start_ticks));
        s.stop(&id, Duration::from_secs(2)).unwrap();
    }

    #[test]
    fn a_new_slo_reaches_the_record_of_a_running_process_and_its_cold_start_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Supervisor::open(dir.path()).unwrap();
        let id = s.start("GPU-0", &spec(), Role::Active, &Launch::on_port(sleeper(), 7000)).unwrap();
        let took = s.ready(&id, Instant::now() + Duration::from_secs(3)).expect("the first ready after launch");
        assert!(took >= Duration::from_secs(3), "{took:?}");
        assert_eq!(s.ready(&id, Instant::now()), None, "counted once per launch");
        let tighter = WorkloadSpec { slo_ms: 5.0, batch_ms: 2.5, ..spec() };
        s.refresh(&id, &tighter).unwrap();
        assert_eq!((s.get(&id).unwrap().spec.slo_ms, s.get(&id).unwrap().spec.batch_ms), (5.0, 2.5));
        drop(s);
        let (mut s, _) = Supervisor::open(dir.path()).unwrap();
        assert_eq!(s.get(&id).unwrap().spec.slo_ms, 5.0, "saved");
        assert_eq!(s.ready(&id, Instant::now()), None, "an adopted process's launch time is not known");
        s.stop(&id, Duration::from_secs(2)).unwrap();
    }

    #[test]
    fn a_corrupt_state_file_stops_the_agent_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("processes.json"), b"{not json").unwrap();
        let err = Supervisor::open(dir.path()).err().expect("refused");
        assert!(err.to_string().contains("processes.json") && err.to_string().contains("corrupt"), "{err}");
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Supervisor::open(dir.path()).unwrap();
        let err = s.start("GPU-0", &spec(), Role::Active, &Launch::on_port(CommandSpec::new("/nonexistent/sim-infer"), 7000)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/sim-infer"), "{err}");
    }

    /// A leader (`sh`) with a child (`sleep`) in its group, as a server with its stubs.
    fn with_child() -> CommandSpec {
        CommandSpec::new("sh").arg("-c").arg("sleep 600 & wait")
    }

    /// The members of group `pgid` other than its leader, once the child has started.
    fn children_of(pgid: u32) -> Vec<u32> {
        for _ in 0..500 {
            let found: Vec<u32> = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| pid != pgid && records::process_group(pid) == Some(pgid))
                .collect();
            if !found.is_empty() {
                return found;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no child in group {pgid}");
    }

    fn gone(pid: u32) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
        stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)) == Some("Z")
    }

    #[test]
    fn children_a_dead_leader_left_behind_are_killed_when_it_is_stopped_or_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Supervisor::open(dir.path()).unwrap();
        // Stopped after its leader was killed: the child goes too.
        let id = s.start("GPU-0", &spec(), Role::Active, &Launch::on_port(with_child(), 7000)).unwrap();
        let leader = s.get(&id).unwrap().pid;
        let children = children_of(leader);
        kill_leader(leader);
        s.stop(&id, Duration::from_secs(1)).unwrap();
        assert!(children.iter().all(|&c| gone(c)), "{children:?} outlived the stop");

        // Restarted after its leader was killed: the old child goes before the new launch.
        let id = s.start("GPU-0", &spec(), Role::Active, &Launch::on_port(with_child(), 7001)).unwrap();
        let leader = s.get(&id).unwrap().pid;
        let children = children_of(leader);
        kill_leader(leader);
        let restarted = (0..3000).any(|_| {
            let done = !s.check(Instant::now()).unwrap().is_empty();
            if !done {
                std::thread::sleep(Duration::from_millis(10));
            }
            done
        });
        assert!(restarted, "the supervisor restarts the exited server");
        assert!(children.iter().all(|&c| gone(c)), "{children:?} outlived the restart");
        s.stop(&id, Duration::from_secs(1)).unwrap();
    }

    /// SIGKILL to the leader alone, not its group (a server that crashes); returns once it
    /// is dead.
    fn kill_leader(pid: u32) {
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our child, alive.
        unsafe {
            libc::kill(libc::pid_t::try_from(pid).unwrap(), libc::SIGKILL);
        }
        while !gone(pid) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
