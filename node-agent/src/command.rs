//! Running external tools (`nvidia-smi`, `nvidia-cuda-mps-control`) behind a small trait, so
//! that the exact command lines, environment and standard input the agent produces can be
//! checked in tests without the tools being installed.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, Write};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// A command to run: program, arguments, extra environment (added to the agent's own) and
/// optional standard input.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<String>,
}

impl CommandSpec {
    pub fn new(program: impl Into<String>) -> Self {
        CommandSpec { program: program.into(), args: Vec::new(), env: Vec::new(), stdin: None }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn stdin(mut self, input: impl Into<String>) -> Self {
        self.stdin = Some(input.into());
        self
    }

    /// The program and its arguments as one line, quoted where needed (environment and
    /// standard input are not part of it); used in error messages and in tests.
    pub fn command_line(&self) -> String {
        std::iter::once(&self.program).chain(&self.args).map(|s| quote(s)).collect::<Vec<_>>().join(" ")
    }
}

impl fmt::Display for CommandSpec {
    /// Shell-like rendering with the environment in front, e.g.
    /// `CUDA_VISIBLE_DEVICES=MIG-… nvidia-cuda-mps-control -d`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.env {
            write!(f, "{k}={} ", quote(v))?;
        }
        f.write_str(&self.command_line())
    }
}

fn quote(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What a finished command produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    /// Exit code; `None` when the process was killed by a signal.
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CommandOutput {
    pub fn success(stdout: impl Into<String>) -> Self {
        CommandOutput { status: Some(0), stdout: stdout.into(), stderr: String::new() }
    }

    pub fn failure(status: i32, stdout: impl Into<String>, stderr: impl Into<String>) -> Self {
        CommandOutput { status: Some(status), stdout: stdout.into(), stderr: stderr.into() }
    }

    pub fn is_success(&self) -> bool {
        self.status == Some(0)
    }

    /// Stdout and stderr together: NVIDIA's tools print some errors on stdout.
    pub fn all_text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs commands. Implementations must be shareable between threads: the agent calls backends
/// from `spawn_blocking`.
pub trait CommandRunner: Send + Sync {
    /// Runs `spec` to completion. An `Err` means the command could not be started at all
    /// (e.g. the program is not installed); a non-zero exit is an `Ok` with that status.
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput>;
}

/// Runs commands for real with [`std::process::Command`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        let mut command = Command::new(&spec.program);
        command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        if let Some(input) = &spec.stdin {
            // Dropping the handle closes the pipe, which is what ends the control session.
            if let Some(mut pipe) = child.stdin.take() {
                pipe.write_all(input.as_bytes())?;
            }
        }
        let output = child.wait_with_output()?;
        Ok(CommandOutput {
            status: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// A fake runner for tests: records every command and answers with canned output chosen by
/// the exact command line ([`CommandSpec::command_line`]). Several answers for one line are
/// given in order, the last one repeating. A command with no canned answer fails to start
/// (`io::ErrorKind::NotFound`), so a test notices commands it did not expect.
#[derive(Debug, Default)]
pub struct RecordingRunner {
    calls: Mutex<Vec<CommandSpec>>,
    answers: Mutex<BTreeMap<String, VecDeque<CommandOutput>>>,
}

impl RecordingRunner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an answer for `command_line`.
    pub fn respond(&self, command_line: &str, output: CommandOutput) -> &Self {
        lock(&self.answers).entry(command_line.to_string()).or_default().push_back(output);
        self
    }

    /// Every command run so far, in order.
    pub fn calls(&self) -> Vec<CommandSpec> {
        lock(&self.calls).clone()
    }

    /// The command lines run so far, in order.
    pub fn command_lines(&self) -> Vec<String> {
        lock(&self.calls).iter().map(CommandSpec::command_line).collect()
    }

    pub fn clear_calls(&self) {
        lock(&self.calls).clear();
    }
}

impl CommandRunner for RecordingRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        lock(&self.calls).push(spec.clone());
        let line = spec.command_line();
        let mut answers = lock(&self.answers);
        let queue = answers
            .get_mut(&line)
            .filter(|q| !q.is_empty())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no canned output for `{line}`")))?;
        let answer = if queue.len() > 1 { queue.pop_front() } else { queue.front().cloned() };
        answer.ok_or_else(|| io::Error::other("empty answer queue"))
    }
}

/// Locks a mutex, recovering the data if another thread panicked while holding it (the
/// guarded data here is plain bookkeeping that stays consistent between statements).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_quotes_only_what_needs_it() {
        let spec = CommandSpec::new("nvidia-smi").args(["--query-gpu=index,uuid", "--format=csv,noheader"]).arg("a b");
        assert_eq!(spec.command_line(), "nvidia-smi --query-gpu=index,uuid --format=csv,noheader 'a b'");
        let with_env = CommandSpec::new("nvidia-cuda-mps-control").arg("-d").env("CUDA_VISIBLE_DEVICES", "MIG-1");
        assert_eq!(with_env.to_string(), "CUDA_VISIBLE_DEVICES=MIG-1 nvidia-cuda-mps-control -d");
    }

    #[test]
    fn recording_runner_answers_in_order_and_repeats_the_last() {
        let runner = RecordingRunner::new();
        runner.respond("tool x", CommandOutput::success("first")).respond("tool x", CommandOutput::success("second"));
        let spec = CommandSpec::new("tool").arg("x");
        assert_eq!(runner.run(&spec).unwrap().stdout, "first");
        assert_eq!(runner.run(&spec).unwrap().stdout, "second");
        assert_eq!(runner.run(&spec).unwrap().stdout, "second");
        let err = runner.run(&CommandSpec::new("tool").arg("y")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(runner.command_lines(), vec!["tool x", "tool x", "tool x", "tool y"]);
    }

    #[test]
    fn system_runner_passes_env_and_stdin() {
        let spec = CommandSpec::new("sh").arg("-c").arg("printf '%s:' \"$GPUPLANE_TEST\"; cat").env("GPUPLANE_TEST", "v1").stdin("quit\n");
        let out = SystemRunner.run(&spec).unwrap();
        assert!(out.is_success());
        assert_eq!(out.stdout, "v1:quit\n");
        let missing = SystemRunner.run(&CommandSpec::new("/nonexistent/gpuplane-tool"));
        assert_eq!(missing.unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
