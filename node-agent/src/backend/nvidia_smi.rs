//! The `nvidia-smi` backend: the same operations as the NVML backend through the CLI, for
//! hosts where libnvidia-ml cannot be loaded into the agent (containers with only the tool
//! mounted, debugging). Commands go through a [`CommandRunner`], so tests check the exact
//! command lines and parse recorded output.
//!
//! Commands used (`<id>` is the GPU-instance profile id, see [`smi_profile_id`]):
//! - inventory: `nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader,nounits`
//! - MIG mode: `nvidia-smi -i <gpu> -mig 1|0`
//! - create: `nvidia-smi mig -cgi <id>:<start> -C -i <gpu>` (explicit placement, default compute instance)
//! - destroy: `nvidia-smi mig -dci -gi <gi> -i <gpu>` then `nvidia-smi mig -dgi -gi <gi> -i <gpu>`
//! - list: `nvidia-smi mig -lgi -i <gpu>` (placements), `nvidia-smi -i <gpu>` (the "MIG devices"
//!   table: GI id → CI id and MIG device index) and `nvidia-smi -L` (MIG device index → uuid).

use super::{model_from_name, sort_instances, BackendError, GpuBackend, GpuInfo, MigInstance};
use crate::command::{lock, CommandOutput, CommandRunner, CommandSpec, SystemRunner};
use planner::mig::{GpuModel, MigProfile, Placement};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// GPU-instance profile id as `nvidia-smi mig -lgip` shows it and `-cgi` takes it. The ids
/// are the same on A100-40GB, A100-80GB, H100-80GB and H200 (only the memory in the names
/// differs, e.g. 3g.20gb / 3g.40gb / 3g.71gb are all id 9); `None` for GPUs without MIG.
pub fn smi_profile_id(model: GpuModel, profile: MigProfile) -> Option<u32> {
    if model == GpuModel::NoMig {
        return None;
    }
    Some(match profile {
        MigProfile::G1 => 19,
        MigProfile::G1Mem2 => 15,
        MigProfile::G2 => 14,
        MigProfile::G3 => 9,
        MigProfile::G4 => 5,
        MigProfile::G7 => 0,
    })
}

/// The profile (geometry) of a GPU-instance profile id listed by `nvidia-smi mig -lgi`.
/// 20 is `1g.*+me` (a 1g with the media engines), which occupies the same slices as a 1g.
pub fn profile_from_smi_id(id: u32) -> Option<MigProfile> {
    match id {
        19 | 20 => Some(MigProfile::G1),
        15 => Some(MigProfile::G1Mem2),
        14 => Some(MigProfile::G2),
        9 => Some(MigProfile::G3),
        5 => Some(MigProfile::G4),
        0 => Some(MigProfile::G7),
        _ => None,
    }
}

/// `nvidia-smi` driven through a [`CommandRunner`].
pub struct NvidiaSmiBackend {
    program: String,
    runner: Arc<dyn CommandRunner>,
    /// Models by GPU index, learnt from the inventory query (models do not change while the
    /// agent runs; the MIG mode does, so it is never cached).
    models: Mutex<BTreeMap<u32, GpuModel>>,
}

impl std::fmt::Debug for NvidiaSmiBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvidiaSmiBackend").field("program", &self.program).finish_non_exhaustive()
    }
}

impl NvidiaSmiBackend {
    /// Runs `program` (usually `nvidia-smi`) for real.
    pub fn new(program: impl Into<String>) -> Self {
        Self::with_runner(program, Arc::new(SystemRunner))
    }

    pub fn with_runner(program: impl Into<String>, runner: Arc<dyn CommandRunner>) -> Self {
        NvidiaSmiBackend { program: program.into(), runner, models: Mutex::new(BTreeMap::new()) }
    }

    fn command(&self) -> CommandSpec {
        CommandSpec::new(self.program.clone())
    }

    pub fn inventory_command(&self) -> CommandSpec {
        self.command().args(["--query-gpu=index,uuid,name,memory.total,mig.mode.current", "--format=csv,noheader,nounits"])
    }

    pub fn set_mig_mode_command(&self, gpu: u32, enabled: bool) -> CommandSpec {
        self.command().args(["-i".to_string(), gpu.to_string(), "-mig".into(), if enabled { "1" } else { "0" }.into()])
    }

    pub fn create_command(&self, gpu: u32, profile_id: u32, start: u8) -> CommandSpec {
        self.command().args(["mig".to_string(), "-cgi".into(), format!("{profile_id}:{start}"), "-C".into(), "-i".into(), gpu.to_string()])
    }

    pub fn destroy_compute_instances_command(&self, gpu: u32, gpu_instance_id: u32) -> CommandSpec {
        self.command().args(["mig".to_string(), "-dci".into(), "-gi".into(), gpu_instance_id.to_string(), "-i".into(), gpu.to_string()])
    }

    pub fn destroy_gpu_instance_command(&self, gpu: u32, gpu_instance_id: u32) -> CommandSpec {
        self.command().args(["mig".to_string(), "-dgi".into(), "-gi".into(), gpu_instance_id.to_string(), "-i".into(), gpu.to_string()])
    }

    pub fn list_gpu_instances_command(&self, gpu: u32) -> CommandSpec {
        self.command().args(["mig".to_string(), "-lgi".into(), "-i".into(), gpu.to_string()])
    }

    pub fn device_table_command(&self, gpu: u32) -> CommandSpec {
        self.command().args(["-i".to_string(), gpu.to_string()])
    }

    pub fn list_devices_command(&self) -> CommandSpec {
        self.command().arg("-L")
    }

    /// Runs a command; a failure to start (tool missing) makes the backend unavailable.
    fn run(&self, spec: &CommandSpec) -> Result<CommandOutput, BackendError> {
        self.runner.run(spec).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                BackendError::Unavailable { backend: "nvidia-smi", message: format!("`{}` cannot be run: {source}", spec.program) }
            } else {
                BackendError::Io { command: spec.command_line(), source }
            }
        })
    }

    /// Runs a command that must succeed, classifying a failure by the driver's message.
    fn run_checked(&self, gpu: u32, spec: &CommandSpec, subject: Subject) -> Result<CommandOutput, BackendError> {
        let output = self.run(spec)?;
        if output.is_success() {
            Ok(output)
        } else {
            Err(classify_failure(gpu, spec, &output, subject))
        }
    }

    fn model_of(&self, gpu: u32) -> Result<GpuModel, BackendError> {
        if let Some(model) = lock(&self.models).get(&gpu) {
            return Ok(*model);
        }
        self.inventory()?
            .into_iter()
            .find(|g| g.index == gpu)
            .map(|g| g.model)
            .ok_or_else(|| BackendError::NotFound { gpu, what: format!("GPU index {gpu}") })
    }

    /// GI id → (CI id, MIG device uuid) from the device table and `-L`.
    fn devices(&self, gpu: u32) -> Result<BTreeMap<u32, (u32, Option<String>)>, BackendError> {
        let table_cmd = self.device_table_command(gpu);
        let table = parse_mig_device_table(&self.run_checked(gpu, &table_cmd, Subject::Gpu)?.stdout);
        let list_cmd = self.list_devices_command();
        let uuids = parse_device_list(&self.run_checked(gpu, &list_cmd, Subject::Gpu)?.stdout);
        Ok(table
            .into_iter()
            .filter(|row| row.gpu == gpu)
            .map(|row| (row.gpu_instance_id, (row.compute_instance_id, uuids.get(&(gpu, row.mig_device)).cloned())))
            .collect())
    }
}

impl GpuBackend for NvidiaSmiBackend {
    fn name(&self) -> &'static str {
        "nvidia-smi"
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let spec = self.inventory_command();
        let output = self.run(&spec)?;
        if !output.is_success() {
            return Err(classify_failure(0, &spec, &output, Subject::Gpu));
        }
        let gpus = parse_inventory(&output.stdout).map_err(|reason| BackendError::Parse { command: spec.command_line(), reason })?;
        *lock(&self.models) = gpus.iter().map(|g| (g.index, g.model)).collect();
        Ok(gpus)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError> {
        let output = self.run_checked(gpu, &self.set_mig_mode_command(gpu, enabled), Subject::Gpu)?;
        let text = output.all_text();
        // "Warning: MIG mode is in pending enable state for GPU …: In use by another client"
        if text.contains("pending") {
            let reason = text.lines().find(|l| l.contains("pending")).unwrap_or_default().trim().to_string();
            return Err(BackendError::MigModePending { gpu, enabled, reason });
        }
        Ok(())
    }

    fn list_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        let spec = self.list_gpu_instances_command(gpu);
        let output = self.run(&spec)?;
        if !output.is_success() {
            if output.all_text().contains("No GPU instances found") {
                return Ok(Vec::new());
            }
            return Err(classify_failure(gpu, &spec, &output, Subject::Gpu));
        }
        let rows = parse_gpu_instances(&output.stdout).map_err(|reason| BackendError::Parse { command: spec.command_line(), reason })?;
        let devices = self.devices(gpu)?;
        let mut instances: Vec<MigInstance> = rows
            .into_iter()
            .filter(|row| row.gpu == gpu)
            .map(|row| {
                let (compute_instance_id, device_uuid) = match devices.get(&row.gpu_instance_id) {
                    Some((ci, uuid)) => (Some(*ci), uuid.clone()),
                    None => (None, None),
                };
                MigInstance { gpu, gpu_instance_id: row.gpu_instance_id, compute_instance_id, placement: row.placement, device_uuid }
            })
            .collect();
        sort_instances(&mut instances);
        Ok(instances)
    }

    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<MigInstance, BackendError> {
        let model = self.model_of(gpu)?;
        let profile_id = smi_profile_id(model, placement.profile)
            .ok_or_else(|| BackendError::NotSupported { gpu, what: format!("MIG on {model:?}") })?;
        if !placement.profile.legal_starts().contains(&placement.start) {
            // The driver would answer "Invalid Argument"; say which starts are legal instead.
            return Err(BackendError::InvalidPlacement {
                gpu,
                placement,
                reason: format!("{} may only start at memory slices {:?}", placement.profile, placement.profile.legal_starts()),
            });
        }
        let spec = self.create_command(gpu, profile_id, placement.start);
        let output = self.run_checked(gpu, &spec, Subject::Placement(placement))?;
        let created = parse_create_output(&output.stdout).map_err(|reason| BackendError::Parse { command: spec.command_line(), reason })?;
        let device_uuid = self.devices(gpu)?.remove(&created.gpu_instance_id).and_then(|(_, uuid)| uuid);
        Ok(MigInstance {
            gpu,
            gpu_instance_id: created.gpu_instance_id,
            compute_instance_id: created.compute_instance_id,
            placement,
            device_uuid,
        })
    }

    fn destroy_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), BackendError> {
        // Compute instances first: a GPU instance that still has one cannot be destroyed.
        let dci = self.destroy_compute_instances_command(gpu, gpu_instance_id);
        let output = self.run(&dci)?;
        let text = output.all_text();
        let had_no_compute_instance = text.contains("No compute instances found");
        if !output.is_success() && !had_no_compute_instance {
            return Err(classify_failure(gpu, &dci, &output, Subject::GpuInstance(gpu_instance_id)));
        }
        self.run_checked(gpu, &self.destroy_gpu_instance_command(gpu, gpu_instance_id), Subject::GpuInstance(gpu_instance_id))?;
        Ok(())
    }
}

/// What a command acts on, for error messages and for reading the driver's answer.
#[derive(Debug, Clone, Copy)]
enum Subject {
    Gpu,
    Placement(Placement),
    GpuInstance(u32),
}

impl Subject {
    fn describe(self) -> String {
        match self {
            Subject::Gpu => "the GPU".to_string(),
            Subject::Placement(placement) => format!("placement {placement}"),
            Subject::GpuInstance(id) => format!("GPU instance {id}"),
        }
    }
}

/// Maps a failed command to the error the driver's message stands for. nvidia-smi prints
/// these on stdout or stderr depending on the version, so both are searched.
fn classify_failure(gpu: u32, spec: &CommandSpec, output: &CommandOutput, subject: Subject) -> BackendError {
    let text = output.all_text();
    let message = text.trim().to_string();
    let has = |needle: &str| text.to_ascii_lowercase().contains(&needle.to_ascii_lowercase());
    if has("In use by another client") {
        return BackendError::InUse { gpu, what: subject.describe(), detail: message };
    }
    if let Subject::Placement(placement) = subject {
        if has("Insufficient Resources") {
            return BackendError::Overlap { gpu, placement, reason: message };
        }
        if has("Invalid Argument") {
            return BackendError::InvalidPlacement { gpu, placement, reason: message };
        }
    }
    if has("No MIG-enabled devices found") || has("MIG mode is disabled") {
        return BackendError::MigDisabled { gpu };
    }
    if has("couldn't communicate with the NVIDIA driver") || has("No devices were found") {
        return BackendError::Unavailable { backend: "nvidia-smi", message };
    }
    if has("Not Found") {
        return BackendError::NotFound { gpu, what: format!("{} ({message})", subject.describe()) };
    }
    BackendError::Command {
        command: spec.command_line(),
        status: output.status.map_or_else(|| "killed by a signal".to_string(), |code| format!("exit status {code}")),
        output: message,
    }
}

/// Parses `--query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader,nounits`.
pub fn parse_inventory(stdout: &str) -> Result<Vec<GpuInfo>, String> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() < 5 {
                return Err(format!("expected 5 fields in `{line}`"));
            }
            let index = fields[0].parse::<u32>().map_err(|e| format!("GPU index in `{line}`: {e}"))?;
            let memory_mib = fields[fields.len() - 2].parse::<u64>().map_err(|e| format!("memory.total in `{line}`: {e}"))?;
            // A product name could contain a comma; everything between uuid and memory is the name.
            let name = fields[2..fields.len() - 2].join(", ");
            let mig_enabled = fields[fields.len() - 1] == "Enabled";
            Ok(GpuInfo { index, uuid: fields[1].to_string(), model: model_from_name(&name, memory_mib), name, memory_mib, mig_enabled })
        })
        .collect()
}

/// One row of `nvidia-smi mig -lgi`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstanceRow {
    pub gpu: u32,
    pub profile_id: u32,
    pub gpu_instance_id: u32,
    pub placement: Placement,
}

/// Parses the `nvidia-smi mig -lgi` table; rows look like
/// `|   0  MIG 3g.40gb          9        2          0:4     |`.
pub fn parse_gpu_instances(stdout: &str) -> Result<Vec<GpuInstanceRow>, String> {
    let mut rows = Vec::new();
    for line in stdout.lines() {
        let tokens: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
        let (Some(gpu), Some(&"MIG")) = (tokens.first().and_then(|t| t.parse::<u32>().ok()), tokens.get(1)) else {
            continue;
        };
        let n = tokens.len();
        if n < 6 {
            return Err(format!("short GPU instance row `{line}`"));
        }
        let parse = |t: &str, what: &str| t.parse::<u32>().map_err(|e| format!("{what} in `{line}`: {e}"));
        let profile_id = parse(tokens[n - 3], "profile id")?;
        let gpu_instance_id = parse(tokens[n - 2], "instance id")?;
        let (start, size) = tokens[n - 1].split_once(':').ok_or_else(|| format!("placement in `{line}`"))?;
        let (start, size) = (parse(start, "placement start")?, parse(size, "placement size")?);
        let profile = profile_from_smi_id(profile_id).ok_or_else(|| format!("unknown GPU instance profile id {profile_id}"))?;
        let placement = super::placement_from_slices(profile, start, size)
            .ok_or_else(|| format!("placement {start}:{size} does not fit profile {profile} in `{line}`"))?;
        rows.push(GpuInstanceRow { gpu, profile_id, gpu_instance_id, placement });
    }
    Ok(rows)
}

/// One row of the "MIG devices" table of plain `nvidia-smi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigDeviceRow {
    pub gpu: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// The MIG device index, as in `nvidia-smi -L` ("Device  N").
    pub mig_device: u32,
}

/// Parses the "MIG devices" section of plain `nvidia-smi` output: rows whose first cell holds
/// four numbers `GPU GI CI MIG-Dev`, e.g. `|  0    1   0   0  |  …`.
pub fn parse_mig_device_table(stdout: &str) -> Vec<MigDeviceRow> {
    let mut in_section = false;
    let mut rows = Vec::new();
    for line in stdout.lines() {
        if line.contains("MIG devices:") {
            in_section = true;
            continue;
        }
        if line.contains("Processes:") {
            in_section = false;
        }
        if !in_section {
            continue;
        }
        let Some(first_cell) = line.trim().strip_prefix('|').and_then(|rest| rest.split('|').next()) else {
            continue;
        };
        let numbers: Option<Vec<u32>> = first_cell.split_whitespace().map(|t| t.parse().ok()).collect();
        if let Some([gpu, gi, ci, dev]) = numbers.as_deref() {
            rows.push(MigDeviceRow { gpu: *gpu, gpu_instance_id: *gi, compute_instance_id: *ci, mig_device: *dev });
        }
    }
    rows
}

/// Parses `nvidia-smi -L` into (GPU index, MIG device index) → `MIG-…` uuid.
pub fn parse_device_list(stdout: &str) -> BTreeMap<(u32, u32), String> {
    let mut current_gpu = None;
    let mut uuids = BTreeMap::new();
    for line in stdout.lines() {
        let trimmed = line.trim();
        let uuid = trimmed.split_once("(UUID: ").and_then(|(_, rest)| rest.split_once(')')).map(|(uuid, _)| uuid.trim().to_string());
        if let Some(rest) = trimmed.strip_prefix("GPU ") {
            current_gpu = rest.split_once(':').and_then(|(index, _)| index.trim().parse::<u32>().ok());
        } else if trimmed.starts_with("MIG ") {
            let device = trimmed
                .split_once("Device")
                .and_then(|(_, rest)| rest.split_once(':'))
                .and_then(|(index, _)| index.trim().parse::<u32>().ok());
            if let (Some(gpu), Some(device), Some(uuid)) = (current_gpu, device, uuid) {
                uuids.insert((gpu, device), uuid);
            }
        }
    }
    uuids
}

/// Ids reported by `nvidia-smi mig -cgi … -C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedIds {
    pub gpu_instance_id: u32,
    pub compute_instance_id: Option<u32>,
}

/// Parses "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 4g.40gb (ID  5)"
/// and the following "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 …".
pub fn parse_create_output(stdout: &str) -> Result<CreatedIds, String> {
    let id_after = |line: &str, marker: &str| -> Option<u32> { line.split_once(marker)?.1.split_whitespace().next()?.parse().ok() };
    let gpu_instance_id = stdout
        .lines()
        .find_map(|l| id_after(l, "created GPU instance ID"))
        .ok_or_else(|| format!("no \"created GPU instance ID\" in `{}`", stdout.trim()))?;
    let compute_instance_id = stdout.lines().find_map(|l| id_after(l, "created compute instance ID"));
    Ok(CreatedIds { gpu_instance_id, compute_instance_id })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::RecordingRunner;
    use MigProfile::*;

    const INVENTORY: &str = "\
0, GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77, NVIDIA A100-SXM4-80GB, 81920, Enabled
1, GPU-0b4c3c58-8c1f-7a3e-34d4-2f1f2e8b9c10, NVIDIA A100-SXM4-80GB, 81920, Disabled
2, GPU-9a7c1e02-51d4-0f4e-8d6c-3f0b4c5a6e71, Tesla T4, 15360, [N/A]
";

    const CREATE_4G: &str = "\
Successfully created GPU instance ID  1 on GPU  0 using profile MIG 4g.40gb (ID  5)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile MIG 4g.40gb (ID  3)
";
    const CREATE_2G: &str = "\
Successfully created GPU instance ID  5 on GPU  0 using profile MIG 2g.20gb (ID 14)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  5 using profile MIG 2g.20gb (ID  1)
";
    const CREATE_1G: &str = "\
Successfully created GPU instance ID 13 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID 13 using profile MIG 1g.10gb (ID  0)
";

    const LGI: &str = "\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.10gb         19       13          6:1     |
+-------------------------------------------------------+
|   0  MIG 2g.20gb         14        5          4:2     |
+-------------------------------------------------------+
|   0  MIG 4g.40gb          5        1          0:4     |
+-------------------------------------------------------+
";

    const DEVICE_TABLE: &str = "\
Mon Nov 23 09:41:07 2026
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |                   On |
| N/A   33C    P0              62W / 400W |     87MiB / 81920MiB |     N/A      Default |
|                                         |                      |              Enabled |
+-----------------------------------------+----------------------+----------------------+

+---------------------------------------------------------------------------------------+
| MIG devices:                                                                          |
+------------------+--------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |                   Memory-Usage |        Vol|      Shared           |
|      ID  ID  Dev |                     BAR1-Usage | SM     Unc| CE ENC DEC OFA JPG    |
|                  |                                |        ECC|                       |
|==================+================================+===========+=======================|
|  0    1   0   0  |              50MiB / 40192MiB  | 56      0 |  4   0    2    0    0 |
|                  |               0MiB / 65535MiB |           |                       |
+------------------+--------------------------------+-----------+-----------------------+
|  0    5   0   1  |              25MiB / 19968MiB  | 28      0 |  2   0    1    0    0 |
|                  |               0MiB / 32767MiB |           |                       |
+------------------+--------------------------------+-----------+-----------------------+
|  0   13   0   2  |              12MiB /  9728MiB  | 14      0 |  1   0    0    0    0 |
|                  |               0MiB / 16383MiB |           |                       |
+------------------+--------------------------------+-----------+-----------------------+

+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    0    1    0     31337      C   tritonserver                                 38MiB |
+---------------------------------------------------------------------------------------+
";

    const DEVICE_LIST: &str = "\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 4g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 2g.20gb     Device  1: (UUID: MIG-1f2e3d4c-5b6a-5789-8a9b-0c1d2e3f4a5b)
  MIG 1g.10gb     Device  2: (UUID: MIG-9e8d7c6b-5a49-5382-a1b0-c9d8e7f6a5b4)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-0b4c3c58-8c1f-7a3e-34d4-2f1f2e8b9c10)
GPU 2: Tesla T4 (UUID: GPU-9a7c1e02-51d4-0f4e-8d6c-3f0b4c5a6e71)
";

    fn backend_with(runner: &Arc<RecordingRunner>) -> NvidiaSmiBackend {
        NvidiaSmiBackend::with_runner("nvidia-smi", runner.clone())
    }

    fn answer_listing(runner: &RecordingRunner) {
        runner.respond("nvidia-smi -i 0", CommandOutput::success(DEVICE_TABLE));
        runner.respond("nvidia-smi -L", CommandOutput::success(DEVICE_LIST));
    }

    #[test]
    fn profile_ids_match_nvidia_smi_on_every_mig_model() {
        for model in [GpuModel::A100_40GB, GpuModel::A100_80GB, GpuModel::H100_80GB, GpuModel::H200] {
            let ids: Vec<Option<u32>> = MigProfile::ALL.iter().map(|&p| smi_profile_id(model, p)).collect();
            assert_eq!(ids, vec![Some(19), Some(15), Some(14), Some(9), Some(5), Some(0)], "{model:?}");
            for profile in MigProfile::ALL {
                assert_eq!(smi_profile_id(model, profile).and_then(profile_from_smi_id), Some(profile));
            }
        }
        assert_eq!(smi_profile_id(GpuModel::NoMig, G1), None);
        assert_eq!(profile_from_smi_id(20), Some(G1), "1g+me has 1g geometry");
        assert_eq!(profile_from_smi_id(21), None);
    }

    #[test]
    fn creating_a_4g_2g_1g_plan_runs_exactly_these_commands() {
        let runner = Arc::new(RecordingRunner::new());
        runner.respond(
            "nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader,nounits",
            CommandOutput::success(INVENTORY),
        );
        runner.respond("nvidia-smi mig -cgi 5:0 -C -i 0", CommandOutput::success(CREATE_4G));
        runner.respond("nvidia-smi mig -cgi 14:4 -C -i 0", CommandOutput::success(CREATE_2G));
        runner.respond("nvidia-smi mig -cgi 19:6 -C -i 0", CommandOutput::success(CREATE_1G));
        answer_listing(&runner);
        let backend = backend_with(&runner);

        let plan = [Placement::new(G4, 0), Placement::new(G2, 4), Placement::new(G1, 6)];
        let created: Vec<MigInstance> = plan.iter().map(|&p| backend.create_instance(0, p).unwrap()).collect();

        assert_eq!(
            runner.command_lines(),
            vec![
                "nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader,nounits",
                "nvidia-smi mig -cgi 5:0 -C -i 0",
                "nvidia-smi -i 0",
                "nvidia-smi -L",
                "nvidia-smi mig -cgi 14:4 -C -i 0",
                "nvidia-smi -i 0",
                "nvidia-smi -L",
                "nvidia-smi mig -cgi 19:6 -C -i 0",
                "nvidia-smi -i 0",
                "nvidia-smi -L",
            ]
        );
        assert!(runner.calls().iter().all(|c| c.env.is_empty() && c.stdin.is_none()));
        assert_eq!(
            created,
            vec![
                MigInstance {
                    gpu: 0,
                    gpu_instance_id: 1,
                    compute_instance_id: Some(0),
                    placement: plan[0],
                    device_uuid: Some("MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f".into()),
                },
                MigInstance {
                    gpu: 0,
                    gpu_instance_id: 5,
                    compute_instance_id: Some(0),
                    placement: plan[1],
                    device_uuid: Some("MIG-1f2e3d4c-5b6a-5789-8a9b-0c1d2e3f4a5b".into()),
                },
                MigInstance {
                    gpu: 0,
                    gpu_instance_id: 13,
                    compute_instance_id: Some(0),
                    placement: plan[2],
                    device_uuid: Some("MIG-9e8d7c6b-5a49-5382-a1b0-c9d8e7f6a5b4".into()),
                },
            ]
        );

        // Listing reads the same layout back, sorted by placement.
        runner.respond("nvidia-smi mig -lgi -i 0", CommandOutput::success(LGI));
        runner.clear_calls();
        assert_eq!(backend.list_instances(0).unwrap(), created);
        assert_eq!(runner.command_lines(), vec!["nvidia-smi mig -lgi -i 0", "nvidia-smi -i 0", "nvidia-smi -L"]);
    }

    #[test]
    fn destroy_removes_compute_instances_first_and_reports_in_use() {
        let runner = Arc::new(RecordingRunner::new());
        runner.respond(
            "nvidia-smi mig -dci -gi 5 -i 0",
            CommandOutput::success("Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  5\n"),
        );
        runner.respond("nvidia-smi mig -dgi -gi 5 -i 0", CommandOutput::success("Successfully destroyed GPU instance ID  5 from GPU  0\n"));
        runner.respond(
            "nvidia-smi mig -dci -gi 1 -i 0",
            CommandOutput::failure(
                19,
                "Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID  1: In use by another client\n\
                 Failed to destroy compute instances: In use by another client\n",
                "",
            ),
        );
        let backend = backend_with(&runner);
        backend.destroy_instance(0, 5).unwrap();
        let err = backend.destroy_instance(0, 1).unwrap_err();
        assert!(matches!(&err, BackendError::InUse { gpu: 0, what, .. } if what == "GPU instance 1"), "{err}");
        assert_eq!(
            runner.command_lines(),
            vec!["nvidia-smi mig -dci -gi 5 -i 0", "nvidia-smi mig -dgi -gi 5 -i 0", "nvidia-smi mig -dci -gi 1 -i 0"],
            "no -dgi after a refused -dci"
        );
    }

    #[test]
    fn driver_errors_on_create_map_to_typed_errors() {
        let runner = Arc::new(RecordingRunner::new());
        runner.respond(
            "nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader,nounits",
            CommandOutput::success(INVENTORY),
        );
        runner.respond(
            "nvidia-smi mig -cgi 9:4 -C -i 0",
            CommandOutput::failure(
                2,
                "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources\n\
                 Failed to create GPU instances: Insufficient Resources\n",
                "",
            ),
        );
        runner.respond("nvidia-smi mig -cgi 0:0 -C -i 1", CommandOutput::failure(6, "No MIG-enabled devices found.\n", ""));
        let backend = backend_with(&runner);

        let overlap = backend.create_instance(0, Placement::new(G3, 4)).unwrap_err();
        assert!(matches!(&overlap, BackendError::Overlap { placement, .. } if *placement == Placement::new(G3, 4)), "{overlap}");
        let illegal = backend.create_instance(0, Placement::new(G3, 2)).unwrap_err();
        assert!(matches!(illegal, BackendError::InvalidPlacement { .. }), "{illegal}");
        let disabled = backend.create_instance(1, Placement::new(G7, 0)).unwrap_err();
        assert!(matches!(disabled, BackendError::MigDisabled { gpu: 1 }), "{disabled}");
        let no_mig = backend.create_instance(2, Placement::new(G7, 0)).unwrap_err();
        assert!(matches!(no_mig, BackendError::NotSupported { gpu: 2, .. }), "{no_mig}");
        // The illegal start and the non-MIG GPU never reach the driver.
        assert_eq!(runner.command_lines().iter().filter(|l| l.contains("-cgi")).count(), 2);
    }

    #[test]
    fn mig_mode_commands_and_pending_state() {
        let runner = Arc::new(RecordingRunner::new());
        runner.respond("nvidia-smi -i 0 -mig 1", CommandOutput::success("Enabled MIG Mode for GPU 00000000:07:00.0\nAll done.\n"));
        runner.respond(
            "nvidia-smi -i 1 -mig 1",
            CommandOutput::success(
                "Warning: MIG mode is in pending enable state for GPU 00000000:0F:00.0:In use by another client\n\
                 00000000:0F:00.0 is currently being used by one or more other processes (e.g. CUDA application or a monitoring application such as another instance of nvidia-smi). Please first kill all processes using the device and retry the command or reboot the system to make MIG mode effective.\n\
                 All done.\n",
            ),
        );
        runner.respond("nvidia-smi -i 0 -mig 0", CommandOutput::success("Disabled MIG Mode for GPU 00000000:07:00.0\nAll done.\n"));
        let backend = backend_with(&runner);
        backend.set_mig_mode(0, true).unwrap();
        let pending = backend.set_mig_mode(1, true).unwrap_err();
        assert!(matches!(&pending, BackendError::MigModePending { gpu: 1, enabled: true, reason } if reason.starts_with("Warning")));
        backend.set_mig_mode(0, false).unwrap();
        assert_eq!(runner.command_lines(), vec!["nvidia-smi -i 0 -mig 1", "nvidia-smi -i 1 -mig 1", "nvidia-smi -i 0 -mig 0"]);
    }

    #[test]
    fn inventory_parses_models_memory_and_mig_mode() {
        let gpus = parse_inventory(INVENTORY).unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(
            gpus[0],
            GpuInfo {
                index: 0,
                uuid: "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77".into(),
                name: "NVIDIA A100-SXM4-80GB".into(),
                model: GpuModel::A100_80GB,
                memory_mib: 81920,
                mig_enabled: true,
            }
        );
        assert!(!gpus[1].mig_enabled);
        assert_eq!((gpus[2].model, gpus[2].mig_enabled), (GpuModel::NoMig, false));
        assert!(parse_inventory("0, GPU-x, A100\n").is_err());
    }

    #[test]
    fn listings_parse_placements_devices_and_uuids() {
        let rows = parse_gpu_instances(LGI).unwrap();
        assert_eq!(
            rows.iter().map(|r| (r.gpu_instance_id, r.placement)).collect::<Vec<_>>(),
            vec![(13, Placement::new(G1, 6)), (5, Placement::new(G2, 4)), (1, Placement::new(G4, 0))]
        );
        assert!(parse_gpu_instances("|   0  MIG 3g.40gb          9        2          0:2     |").is_err(), "size must match the profile");

        let devices = parse_mig_device_table(DEVICE_TABLE);
        assert_eq!(
            devices.iter().map(|d| (d.gpu, d.gpu_instance_id, d.compute_instance_id, d.mig_device)).collect::<Vec<_>>(),
            vec![(0, 1, 0, 0), (0, 5, 0, 1), (0, 13, 0, 2)],
            "the process table's `0 1 0 31337` row must not be read as a device"
        );
        let uuids = parse_device_list(DEVICE_LIST);
        assert_eq!(uuids.len(), 3);
        assert_eq!(uuids[&(0, 2)], "MIG-9e8d7c6b-5a49-5382-a1b0-c9d8e7f6a5b4");

        assert_eq!(parse_create_output(CREATE_1G).unwrap(), CreatedIds { gpu_instance_id: 13, compute_instance_id: Some(0) });
        assert!(parse_create_output("All done.\n").is_err());
    }

    #[test]
    fn empty_gpu_and_missing_tool() {
        let runner = Arc::new(RecordingRunner::new());
        runner.respond("nvidia-smi mig -lgi -i 0", CommandOutput::failure(6, "No GPU instances found: Not Found\n", ""));
        let backend = backend_with(&runner);
        assert!(backend.list_instances(0).unwrap().is_empty());
        // No canned answer behaves like a missing executable.
        let err = backend.inventory().unwrap_err();
        assert!(matches!(err, BackendError::Unavailable { backend: "nvidia-smi", .. }), "{err}");
        assert!(err.to_string().contains("--gpu-backend sim"));
    }
}
