//! Child processes of a local cluster: controllers and node agents with their output in a
//! log file, killed when dropped, and the workload processes an agent started in their own
//! process groups.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

/// Makes the program `cmd` starts run at CPU nice value `nice` (higher: less priority),
/// every thread it starts with it (Linux threads inherit their creator's). Elsewhere, or
/// when not permitted, it runs at the caller's priority.
pub fn run_at_nice(cmd: &mut Command, nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority is async-signal-safe and reads no memory of ours; in the forked
    // child before exec, `who = 0` is its only thread. Its result is ignored on purpose
    // (see above).
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::setpriority(libc::PRIO_PROCESS, 0, nice);
            Ok(())
        });
    }
}

/// `text` without its terminal colour codes: the controllers' and agents' log lines have
/// them (CSI sequences: ESC [ parameters, then a letter).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A child process, killed (SIGKILL) on drop unless released.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr going to `log` (created or truncated).
    pub fn spawn(cmd: &mut Command, log: &Path) -> Result<Proc, String> {
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        Ok(Proc { child: Some(child), log: log.to_path_buf() })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status once the process has exited on its own (`None` while it runs).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Asks the process to stop (SIGTERM) and waits up to `within` for it to exit; kills it
    /// (SIGKILL) after that. Its exit status, if it exited by itself.
    pub fn terminate(&mut self, within: std::time::Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).stderr(Stdio::null()).status();
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// Leaves the process running after its owner is dropped (`gpuctl demo --keep-running`).
    pub fn release(&mut self) {
        self.child.take();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// User + system CPU seconds a process (a pid, or "self") has used so far, 0 when it is gone:
/// clock ticks of 1/100 s, Linux's USER_HZ on every architecture it runs here.
pub fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A memory figure of a process (a pid, or "self") from `/proc/PID/status`, MiB: `VmRSS`
/// (resident now) or `VmHWM` (its peak so far). `None` when it is gone or has no such line.
pub fn memory_mib(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: f64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

pub fn kill9(pid: &str) {
    let _ = Command::new("kill").arg("-9").arg(pid).stderr(Stdio::null()).status();
}

/// Kills the workload processes an agent's supervisor recorded in `state_dir` (they run in
/// their own process groups, so killing the agent leaves them running).
pub fn kill_recorded_workloads(state_dir: &Path) {
    let Ok(bytes) = std::fs::read(state_dir.join("processes.json")) else { return };
    let list: Vec<serde_json::Value> = serde_json::from_slice(&bytes).unwrap_or_default();
    for pid in list.iter().filter_map(|r| r["pid"].as_u64()) {
        kill9(&pid.to_string());
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn memory_figures_are_read_from_proc_status() {
        let rss = memory_mib("self", "VmRSS").expect("this process has a VmRSS");
        let peak = memory_mib("self", "VmHWM").expect("and a VmHWM");
        assert!(rss > 0.0 && peak >= rss, "{rss} {peak}");
        // A field name that is only a prefix of another is no match.
        assert_eq!(memory_mib("self", "Vm"), None);
        assert_eq!(memory_mib("0", "VmRSS"), None);
    }

    #[test]
    fn a_program_started_at_a_nice_value_runs_at_it() {
        // SAFETY: getpriority reads no memory of ours; `who = 0` is this thread.
        let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let wanted = (own + 3).min(19);
        // `nice` without arguments prints the niceness it runs at.
        let mut cmd = Command::new("nice");
        run_at_nice(&mut cmd, wanted);
        let out = cmd.output().expect("nice runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), wanted.to_string());
    }
}
