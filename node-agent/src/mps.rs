//! CUDA MPS control: one MPS control daemon per GPU or per MIG instance, each with its own
//! pipe and log directory under the agent's state directory, started with
//! `CUDA_VISIBLE_DEVICES` set to the device's uuid (as NVIDIA documents for MPS on MIG).
//!
//! - start: `nvidia-cuda-mps-control -d` with `CUDA_VISIBLE_DEVICES`, `CUDA_MPS_PIPE_DIRECTORY`,
//!   `CUDA_MPS_LOG_DIRECTORY`
//! - stop: `echo quit | nvidia-cuda-mps-control` (same pipe directory)
//! - default share: `echo set_default_active_thread_percentage N | nvidia-cuda-mps-control`
//! - a client process gets `CUDA_VISIBLE_DEVICES`, `CUDA_MPS_PIPE_DIRECTORY` and, for its own
//!   share, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
//!
//! [`NvidiaMps`] runs the real tool through a [`CommandRunner`]; [`SimMps`] only records what
//! would run. MPS allows the shares on one daemon to add up to more than 100% (the planner
//! decides whether to oversubscribe), so neither refuses that.

use crate::command::{lock, CommandOutput, CommandRunner, CommandSpec, SystemRunner};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
pub const CUDA_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
pub const CUDA_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
pub const CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// The control program's default name.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// Longest pipe directory that leaves room for the daemon's `control` socket in a Unix socket
/// path (108 bytes with the terminating NUL on Linux); longer ones make MPS fail obscurely.
pub const MAX_PIPE_DIR_LEN: usize = 107 - "/control".len();

/// One MPS control daemon and the clients the agent has prepared for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsDaemon {
    /// `GPU-…` or `MIG-…` uuid the daemon serves.
    pub device_uuid: String,
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Set with `set_default_active_thread_percentage`; `None` means MPS's default (100%).
    pub default_active_thread_percentage: Option<u8>,
    /// Client name → its own active-thread percentage (`None`: the daemon's default).
    pub clients: BTreeMap<String, Option<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("active thread percentage must be 1..=100, got {percentage}")]
    InvalidPercentage { percentage: u8 },
    #[error("`{uuid}` is not a GPU or MIG device uuid")]
    InvalidDeviceUuid { uuid: String },
    #[error("no MPS daemon is running for {device_uuid} (start it first)")]
    DaemonNotRunning { device_uuid: String },
    #[error("MPS pipe directory {} is {len} bytes, longer than the {MAX_PIPE_DIR_LEN} a Unix socket path allows; use a shorter agent state directory", path.display())]
    PipePathTooLong { path: PathBuf, len: usize },
    #[error("MPS is unavailable: {message}. On a host without NVIDIA GPUs run the agent with `--gpu-backend sim`")]
    Unavailable { message: String },
    #[error("`{command}` failed ({status}): {output}")]
    Command { command: String, status: String, output: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// Controls MPS daemons. Implementations are shared between threads.
pub trait MpsControl: Send + Sync {
    /// Starts the daemon for a device; a no-op when it already runs.
    fn start_daemon(&self, device_uuid: &str) -> Result<MpsDaemon, MpsError>;

    /// Stops the daemon for a device; a no-op when none runs.
    fn stop_daemon(&self, device_uuid: &str) -> Result<(), MpsError>;

    /// Sets the share that clients without their own percentage get.
    fn set_default_active_thread_percentage(&self, device_uuid: &str, percentage: u8) -> Result<(), MpsError>;

    /// Registers client `client` of the device's daemon and returns the environment its
    /// process must be started with.
    fn client_env(&self, device_uuid: &str, client: &str, active_thread_percentage: Option<u8>) -> Result<Vec<(String, String)>, MpsError>;

    /// Forgets a client (its process has exited).
    fn release_client(&self, device_uuid: &str, client: &str) -> Result<(), MpsError>;

    /// The running daemons, by device uuid.
    fn daemons(&self) -> Vec<MpsDaemon>;
}

/// Bookkeeping shared by the real and the simulated implementation.
#[derive(Debug)]
struct Registry {
    state_dir: PathBuf,
    daemons: Mutex<BTreeMap<String, MpsDaemon>>,
}

impl Registry {
    fn new(state_dir: &Path) -> Self {
        Registry { state_dir: state_dir.to_path_buf(), daemons: Mutex::new(BTreeMap::new()) }
    }

    /// The daemon record a device would get (not yet registered).
    fn planned(&self, device_uuid: &str) -> Result<MpsDaemon, MpsError> {
        validate_uuid(device_uuid)?;
        let base = self.state_dir.join("mps").join(device_uuid);
        let pipe_dir = base.join("pipe");
        let len = pipe_dir.as_os_str().len();
        if len > MAX_PIPE_DIR_LEN {
            return Err(MpsError::PipePathTooLong { path: pipe_dir, len });
        }
        Ok(MpsDaemon {
            device_uuid: device_uuid.to_string(),
            pipe_dir,
            log_dir: base.join("log"),
            default_active_thread_percentage: None,
            clients: BTreeMap::new(),
        })
    }

    fn running(&self, device_uuid: &str) -> Option<MpsDaemon> {
        lock(&self.daemons).get(device_uuid).cloned()
    }

    fn require(&self, device_uuid: &str) -> Result<MpsDaemon, MpsError> {
        self.running(device_uuid).ok_or_else(|| MpsError::DaemonNotRunning { device_uuid: device_uuid.to_string() })
    }

    fn insert(&self, daemon: MpsDaemon) {
        lock(&self.daemons).insert(daemon.device_uuid.clone(), daemon);
    }

    fn remove(&self, device_uuid: &str) {
        lock(&self.daemons).remove(device_uuid);
    }

    fn update(&self, device_uuid: &str, change: impl FnOnce(&mut MpsDaemon)) -> Result<(), MpsError> {
        let mut daemons = lock(&self.daemons);
        let daemon = daemons.get_mut(device_uuid).ok_or_else(|| MpsError::DaemonNotRunning { device_uuid: device_uuid.to_string() })?;
        change(daemon);
        Ok(())
    }

    fn release_client(&self, device_uuid: &str, client: &str) -> Result<(), MpsError> {
        self.update(device_uuid, |d| {
            d.clients.remove(client);
        })
    }

    fn client_env(&self, device_uuid: &str, client: &str, percentage: Option<u8>) -> Result<Vec<(String, String)>, MpsError> {
        if let Some(p) = percentage {
            validate_percentage(p)?;
        }
        let daemon = self.require(device_uuid)?;
        self.update(device_uuid, |d| {
            d.clients.insert(client.to_string(), percentage);
        })?;
        Ok(client_environment(&daemon, percentage))
    }

    fn daemons(&self) -> Vec<MpsDaemon> {
        lock(&self.daemons).values().cloned().collect()
    }
}

/// The environment of a client process of `daemon`.
pub fn client_environment(daemon: &MpsDaemon, active_thread_percentage: Option<u8>) -> Vec<(String, String)> {
    let mut env = vec![
        (CUDA_VISIBLE_DEVICES.to_string(), daemon.device_uuid.clone()),
        (CUDA_MPS_PIPE_DIRECTORY.to_string(), daemon.pipe_dir.to_string_lossy().into_owned()),
    ];
    if let Some(p) = active_thread_percentage {
        env.push((CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.to_string(), p.to_string()));
    }
    env
}

fn validate_percentage(percentage: u8) -> Result<(), MpsError> {
    if (1..=100).contains(&percentage) {
        Ok(())
    } else {
        Err(MpsError::InvalidPercentage { percentage })
    }
}

/// Device uuids become directory names, so only `GPU-…`/`MIG-…` with uuid characters pass.
fn validate_uuid(uuid: &str) -> Result<(), MpsError> {
    let well_formed = (uuid.starts_with("GPU-") || uuid.starts_with("MIG-"))
        && uuid.len() > 4
        && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if well_formed {
        Ok(())
    } else {
        Err(MpsError::InvalidDeviceUuid { uuid: uuid.to_string() })
    }
}

/// MPS through `nvidia-cuda-mps-control`.
pub struct NvidiaMps {
    program: String,
    runner: Arc<dyn CommandRunner>,
    registry: Registry,
}

impl std::fmt::Debug for NvidiaMps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvidiaMps").field("program", &self.program).field("registry", &self.registry).finish_non_exhaustive()
    }
}

impl NvidiaMps {
    /// Real MPS with pipe and log directories under `state_dir/mps/<uuid>/`.
    pub fn new(state_dir: &Path) -> Self {
        Self::with_runner(state_dir, MPS_CONTROL, Arc::new(SystemRunner))
    }

    pub fn with_runner(state_dir: &Path, program: impl Into<String>, runner: Arc<dyn CommandRunner>) -> Self {
        NvidiaMps { program: program.into(), runner, registry: Registry::new(state_dir) }
    }

    /// `nvidia-cuda-mps-control -d` for a daemon.
    pub fn start_command(&self, daemon: &MpsDaemon) -> CommandSpec {
        CommandSpec::new(self.program.clone())
            .arg("-d")
            .env(CUDA_VISIBLE_DEVICES, daemon.device_uuid.clone())
            .env(CUDA_MPS_PIPE_DIRECTORY, daemon.pipe_dir.to_string_lossy())
            .env(CUDA_MPS_LOG_DIRECTORY, daemon.log_dir.to_string_lossy())
    }

    /// `echo <input> | nvidia-cuda-mps-control` against a daemon's pipe.
    pub fn control_command(&self, daemon: &MpsDaemon, input: &str) -> CommandSpec {
        CommandSpec::new(self.program.clone())
            .env(CUDA_MPS_PIPE_DIRECTORY, daemon.pipe_dir.to_string_lossy())
            .env(CUDA_MPS_LOG_DIRECTORY, daemon.log_dir.to_string_lossy())
            .stdin(format!("{input}\n"))
    }

    fn run(&self, spec: &CommandSpec) -> Result<CommandOutput, MpsError> {
        self.runner.run(spec).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                MpsError::Unavailable { message: format!("`{}` cannot be run: {source}", spec.program) }
            } else {
                MpsError::Io { context: format!("running `{spec}`"), source }
            }
        })
    }
}

fn command_failed(spec: &CommandSpec, output: &CommandOutput) -> MpsError {
    MpsError::Command {
        command: spec.to_string(),
        status: output.status.map_or_else(|| "killed by a signal".to_string(), |code| format!("exit status {code}")),
        output: output.all_text().trim().to_string(),
    }
}

fn create_dir(path: &Path) -> Result<(), MpsError> {
    std::fs::create_dir_all(path).map_err(|source| MpsError::Io { context: format!("creating {}", path.display()), source })
}

impl MpsControl for NvidiaMps {
    fn start_daemon(&self, device_uuid: &str) -> Result<MpsDaemon, MpsError> {
        if let Some(daemon) = self.registry.running(device_uuid) {
            return Ok(daemon);
        }
        let daemon = self.registry.planned(device_uuid)?;
        create_dir(&daemon.pipe_dir)?;
        create_dir(&daemon.log_dir)?;
        let spec = self.start_command(&daemon);
        let output = self.run(&spec)?;
        // A daemon left running by a previous agent process is adopted, not an error.
        if !output.is_success() && !output.all_text().contains("already running") {
            return Err(command_failed(&spec, &output));
        }
        self.registry.insert(daemon.clone());
        Ok(daemon)
    }

    fn stop_daemon(&self, device_uuid: &str) -> Result<(), MpsError> {
        let daemon = match self.registry.running(device_uuid) {
            Some(daemon) => daemon,
            // Not started by this process; one from before an agent restart may still run.
            None => self.registry.planned(device_uuid)?,
        };
        if !daemon.pipe_dir.exists() {
            self.registry.remove(device_uuid);
            return Ok(());
        }
        let spec = self.control_command(&daemon, "quit");
        let output = self.run(&spec)?;
        if !output.is_success() && !output.all_text().contains("Cannot find MPS control daemon") {
            return Err(command_failed(&spec, &output));
        }
        self.registry.remove(device_uuid);
        Ok(())
    }

    fn set_default_active_thread_percentage(&self, device_uuid: &str, percentage: u8) -> Result<(), MpsError> {
        validate_percentage(percentage)?;
        let daemon = self.registry.require(device_uuid)?;
        let spec = self.control_command(&daemon, &format!("set_default_active_thread_percentage {percentage}"));
        let output = self.run(&spec)?;
        if !output.is_success() {
            return Err(command_failed(&spec, &output));
        }
        self.registry.update(device_uuid, |d| d.default_active_thread_percentage = Some(percentage))
    }

    fn client_env(&self, device_uuid: &str, client: &str, active_thread_percentage: Option<u8>) -> Result<Vec<(String, String)>, MpsError> {
        self.registry.client_env(device_uuid, client, active_thread_percentage)
    }

    fn release_client(&self, device_uuid: &str, client: &str) -> Result<(), MpsError> {
        self.registry.release_client(device_uuid, client)
    }

    fn daemons(&self) -> Vec<MpsDaemon> {
        self.registry.daemons()
    }
}

/// Simulated MPS: records daemons, default shares and client shares; runs nothing and
/// touches no files.
#[derive(Debug)]
pub struct SimMps {
    registry: Registry,
}

impl SimMps {
    pub fn new(state_dir: &Path) -> Self {
        SimMps { registry: Registry::new(state_dir) }
    }

    /// Sum of the explicit client shares on a daemon (may exceed 100: MPS allows it).
    pub fn client_percentage_sum(&self, device_uuid: &str) -> Option<u32> {
        self.registry.running(device_uuid).map(|d| d.clients.values().flatten().map(|&p| u32::from(p)).sum())
    }
}

impl MpsControl for SimMps {
    fn start_daemon(&self, device_uuid: &str) -> Result<MpsDaemon, MpsError> {
        if let Some(daemon) = self.registry.running(device_uuid) {
            return Ok(daemon);
        }
        let daemon = self.registry.planned(device_uuid)?;
        self.registry.insert(daemon.clone());
        Ok(daemon)
    }

    fn stop_daemon(&self, device_uuid: &str) -> Result<(), MpsError> {
        validate_uuid(device_uuid)?;
        self.registry.remove(device_uuid);
        Ok(())
    }

    fn set_default_active_thread_percentage(&self, device_uuid: &str, percentage: u8) -> Result<(), MpsError> {
        validate_percentage(percentage)?;
        self.registry.update(device_uuid, |d| d.default_active_thread_percentage = Some(percentage))
    }

    fn client_env(&self, device_uuid: &str, client: &str, active_thread_percentage: Option<u8>) -> Result<Vec<(String, String)>, MpsError> {
        self.registry.client_env(device_uuid, client, active_thread_percentage)
    }

    fn release_client(&self, device_uuid: &str, client: &str) -> Result<(), MpsError> {
        self.registry.release_client(device_uuid, client)
    }

    fn daemons(&self) -> Vec<MpsDaemon> {
        self.registry.daemons()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::RecordingRunner;

    const MIG_4G: &str = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f";
    const MIG_2G: &str = "MIG-1f2e3d4c-5b6a-5789-8a9b-0c1d2e3f4a5b";
    const MIG_1G: &str = "MIG-9e8d7c6b-5a49-5382-a1b0-c9d8e7f6a5b4";

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_4g_2g_1g_layout_gets_one_daemon_per_instance_with_exact_commands() {
        let state = tempfile::tempdir().unwrap();
        let runner = Arc::new(RecordingRunner::new());
        runner.respond("nvidia-cuda-mps-control -d", CommandOutput::success(""));
        runner.respond("nvidia-cuda-mps-control", CommandOutput::success(""));
        let mps = NvidiaMps::with_runner(state.path(), MPS_CONTROL, runner.clone());

        for uuid in [MIG_4G, MIG_2G, MIG_1G] {
            let daemon = mps.start_daemon(uuid).unwrap();
            assert!(daemon.pipe_dir.is_dir() && daemon.log_dir.is_dir());
        }
        assert_eq!(mps.start_daemon(MIG_4G).unwrap().device_uuid, MIG_4G, "starting twice is a no-op");
        mps.set_default_active_thread_percentage(MIG_4G, 50).unwrap();
        mps.stop_daemon(MIG_1G).unwrap();

        let dir = |uuid: &str, leaf: &str| state.path().join("mps").join(uuid).join(leaf).to_string_lossy().into_owned();
        let start = |uuid: &str| CommandSpec {
            program: "nvidia-cuda-mps-control".into(),
            args: vec!["-d".into()],
            env: env(&[
                ("CUDA_VISIBLE_DEVICES", uuid),
                ("CUDA_MPS_PIPE_DIRECTORY", &dir(uuid, "pipe")),
                ("CUDA_MPS_LOG_DIRECTORY", &dir(uuid, "log")),
            ]),
            stdin: None,
        };
        let control = |uuid: &str, input: &str| CommandSpec {
            program: "nvidia-cuda-mps-control".into(),
            args: vec![],
            env: env(&[("CUDA_MPS_PIPE_DIRECTORY", &dir(uuid, "pipe")), ("CUDA_MPS_LOG_DIRECTORY", &dir(uuid, "log"))]),
            stdin: Some(input.into()),
        };
        assert_eq!(
            runner.calls(),
            vec![
                start(MIG_4G),
                start(MIG_2G),
                start(MIG_1G),
                control(MIG_4G, "set_default_active_thread_percentage 50\n"),
                control(MIG_1G, "quit\n"),
            ]
        );
        let running: Vec<String> = mps.daemons().into_iter().map(|d| d.device_uuid).collect();
        assert_eq!(running, vec![MIG_2G.to_string(), MIG_4G.to_string()]);
        assert_eq!(mps.daemons()[1].default_active_thread_percentage, Some(50));
    }

    #[test]
    fn client_environment_names_device_pipe_and_share() {
        let state = tempfile::tempdir().unwrap();
        let runner = Arc::new(RecordingRunner::new());
        runner.respond("nvidia-cuda-mps-control -d", CommandOutput::success(""));
        let mps = NvidiaMps::with_runner(state.path(), MPS_CONTROL, runner);
        assert!(matches!(mps.client_env(MIG_2G, "resnet", Some(30)), Err(MpsError::DaemonNotRunning { .. })));
        let daemon = mps.start_daemon(MIG_2G).unwrap();
        let pipe = daemon.pipe_dir.to_string_lossy().into_owned();
        assert_eq!(
            mps.client_env(MIG_2G, "resnet", Some(30)).unwrap(),
            env(&[("CUDA_VISIBLE_DEVICES", MIG_2G), ("CUDA_MPS_PIPE_DIRECTORY", &pipe), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")])
        );
        assert_eq!(
            mps.client_env(MIG_2G, "bert", None).unwrap(),
            env(&[("CUDA_VISIBLE_DEVICES", MIG_2G), ("CUDA_MPS_PIPE_DIRECTORY", &pipe)])
        );
        assert!(matches!(mps.client_env(MIG_2G, "x", Some(0)), Err(MpsError::InvalidPercentage { percentage: 0 })));
        assert!(matches!(mps.client_env(MIG_2G, "x", Some(101)), Err(MpsError::InvalidPercentage { percentage: 101 })));
        mps.release_client(MIG_2G, "bert").unwrap();
        assert_eq!(mps.daemons()[0].clients, BTreeMap::from([("resnet".to_string(), Some(30))]));
    }

    #[test]
    fn failures_are_reported_with_the_command() {
        let state = tempfile::tempdir().unwrap();
        let runner = Arc::new(RecordingRunner::new());
        runner.respond("nvidia-cuda-mps-control -d", CommandOutput::failure(1, "", "An instance of this daemon is already running\n"));
        runner.respond("nvidia-cuda-mps-control", CommandOutput::failure(1, "", "Invalid command\n"));
        let mps = NvidiaMps::with_runner(state.path(), MPS_CONTROL, runner);
        mps.start_daemon(MIG_4G).expect("an already running daemon is adopted");
        let err = mps.set_default_active_thread_percentage(MIG_4G, 40).unwrap_err();
        assert!(matches!(&err, MpsError::Command { status, .. } if status == "exit status 1"), "{err}");
        assert!(err.to_string().contains("nvidia-cuda-mps-control") && err.to_string().contains("Invalid command"), "{err}");
        assert_eq!(mps.daemons()[0].default_active_thread_percentage, None, "a refused change is not recorded");
        assert!(matches!(mps.start_daemon("../etc"), Err(MpsError::InvalidDeviceUuid { .. })));

        let missing = NvidiaMps::with_runner(state.path(), "/nonexistent/nvidia-cuda-mps-control", Arc::new(SystemRunner));
        let err = missing.start_daemon(MIG_1G).unwrap_err();
        assert!(matches!(err, MpsError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("--gpu-backend sim"));
    }

    #[test]
    fn long_state_dirs_are_refused_before_mps_fails_on_them() {
        let long = PathBuf::from(format!("/var/lib/{}", "x".repeat(60)));
        let err = SimMps::new(&long).start_daemon(MIG_4G).unwrap_err();
        assert!(matches!(err, MpsError::PipePathTooLong { .. }), "{err}");
    }

    #[test]
    fn sim_records_daemons_and_oversubscribed_shares() {
        let mps = SimMps::new(Path::new("/run/gpuplane"));
        let daemon = mps.start_daemon(MIG_4G).unwrap();
        assert_eq!(daemon.pipe_dir, Path::new("/run/gpuplane/mps").join(MIG_4G).join("pipe"));
        assert!(!daemon.pipe_dir.exists(), "the simulation touches no files");
        mps.set_default_active_thread_percentage(MIG_4G, 25).unwrap();
        mps.client_env(MIG_4G, "a", Some(60)).unwrap();
        mps.client_env(MIG_4G, "b", Some(60)).unwrap();
        mps.client_env(MIG_4G, "c", None).unwrap();
        assert_eq!(mps.client_percentage_sum(MIG_4G), Some(120));
        let recorded = &mps.daemons()[0];
        assert_eq!(recorded.default_active_thread_percentage, Some(25));
        assert_eq!(recorded.clients.len(), 3);
        mps.stop_daemon(MIG_4G).unwrap();
        assert!(mps.daemons().is_empty());
        assert!(matches!(mps.set_default_active_thread_percentage(MIG_4G, 25), Err(MpsError::DaemonNotRunning { .. })));
    }

    #[test]
    fn mps_control_is_usable_as_a_trait_object() {
        let controls: Vec<Box<dyn MpsControl>> =
            vec![Box::new(SimMps::new(Path::new("/run/a"))), Box::new(SimMps::new(Path::new("/run/b")))];
        for control in &controls {
            control.start_daemon("GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77").unwrap();
            assert_eq!(control.daemons().len(), 1);
        }
    }
}
