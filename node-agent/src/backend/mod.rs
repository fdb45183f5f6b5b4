//! GPU backends: how the agent reads its GPUs and applies MIG layouts.
//!
//! Three implementations of [`GpuBackend`], chosen at run time by name with
//! [`select_backend`]: `nvml` (libnvidia-ml loaded at run time), `nvidia-smi` (the CLI, for
//! hosts where NVML cannot be used) and `sim` (simulated GPUs with the exact placement rules
//! of [`planner::mig`], for tests and GPU-less development).
//!
//! Every instance is created at an explicit placement; the backends never choose one, so the
//! layout on the GPU is the one the planner computed.

pub mod nvidia_smi;
pub mod nvml;
pub mod sim;

use planner::mig::{GpuModel, MigProfile, Placement};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

pub use nvidia_smi::NvidiaSmiBackend;
pub use nvml::NvmlBackend;
pub use sim::SimBackend;

/// One physical GPU as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The driver's index (`nvidia-smi -i`, NVML device index).
    pub index: u32,
    /// `GPU-…` uuid.
    pub uuid: String,
    /// Product name as reported by the driver, e.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    pub model: GpuModel,
    pub memory_mib: u64,
    /// Current (not pending) MIG mode.
    pub mig_enabled: bool,
}

/// A MIG GPU instance with its compute instance, as it exists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub gpu: u32,
    /// GPU-instance id assigned by the driver.
    pub gpu_instance_id: u32,
    /// Compute-instance id; `None` for a GPU instance without a compute instance (left by a
    /// failed creation or by another tool), which has no usable device yet.
    pub compute_instance_id: Option<u32>,
    pub placement: Placement,
    /// `MIG-…` uuid to put in `CUDA_VISIBLE_DEVICES`; `None` without a compute instance.
    pub device_uuid: Option<String>,
}

/// Errors of GPU operations, mirroring what the driver reports so that the agent can react
/// (retry later on `InUse`, replan on `Overlap`, …).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Processes are running on the instance (NVML `IN_USE`, nvidia-smi "In use by another client").
    #[error("GPU {gpu}: {what} is in use: {detail}")]
    InUse { gpu: u32, what: String, detail: String },
    /// The profile may not start at this slot on this GPU (NVML `INVALID_ARGUMENT`).
    #[error("GPU {gpu}: invalid MIG placement {placement}: {reason}")]
    InvalidPlacement { gpu: u32, placement: Placement, reason: String },
    /// The slices are taken by existing instances (NVML `INSUFFICIENT_RESOURCES`).
    #[error("GPU {gpu}: MIG placement {placement} is not free: {reason}")]
    Overlap { gpu: u32, placement: Placement, reason: String },
    #[error("GPU {gpu}: {what} not found")]
    NotFound { gpu: u32, what: String },
    #[error("GPU {gpu}: MIG mode is disabled (enable it first)")]
    MigDisabled { gpu: u32 },
    /// The mode change was accepted but takes effect only after a GPU reset or reboot.
    #[error("GPU {gpu}: MIG mode change to {} is pending: {reason}", if *enabled { "enabled" } else { "disabled" })]
    MigModePending { gpu: u32, enabled: bool, reason: String },
    #[error("GPU {gpu}: {what} is not supported")]
    NotSupported { gpu: u32, what: String },
    /// The backend cannot work on this host (no library, no driver, no GPU, no tool).
    #[error("GPU backend `{backend}` is unavailable: {message}. On a host without NVIDIA GPUs run the agent with `--gpu-backend sim`")]
    Unavailable { backend: &'static str, message: String },
    #[error("unknown GPU backend `{name}` (expected one of: {})", BACKEND_NAMES.join(", "))]
    UnknownBackend { name: String },
    #[error("`{command}` failed ({status}): {output}")]
    Command { command: String, status: String, output: String },
    #[error("could not run `{command}`: {source}")]
    Io {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected output from `{command}`: {reason}")]
    Parse { command: String, reason: String },
    #[error("NVML {operation} failed on GPU {gpu}: {message}")]
    Nvml { gpu: u32, operation: String, message: String },
}

/// Reads and changes the MIG configuration of the host's GPUs. Calls block (driver calls,
/// child processes); async callers use `spawn_blocking`.
pub trait GpuBackend: Send + Sync {
    /// The backend's name as accepted by [`select_backend`].
    fn name(&self) -> &'static str;

    /// All GPUs of the host.
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError>;

    /// Enables or disables MIG mode. May fail with [`BackendError::MigModePending`] when the
    /// GPU needs a reset for the change to take effect.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError>;

    /// The MIG instances of a GPU, sorted by placement (start slot, then profile).
    fn list_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError>;

    /// Creates a GPU instance at exactly `placement` and one compute instance spanning it.
    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<MigInstance, BackendError>;

    /// Destroys a GPU instance (and its compute instances). Fails with
    /// [`BackendError::InUse`] while processes run on it, leaving it in place.
    fn destroy_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), BackendError>;
}

/// Names accepted by [`select_backend`].
pub const BACKEND_NAMES: [&str; 3] = ["sim", "nvml", "nvidia-smi"];

/// What [`select_backend`] needs besides the name.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendOptions {
    /// GPUs of the `sim` backend, by index.
    pub sim_gpus: Vec<GpuModel>,
    /// Whether the simulated GPUs start with MIG enabled (real ones usually start disabled).
    pub sim_mig_enabled: bool,
    /// Path or soname of libnvidia-ml for `nvml`; `None` for the default `libnvidia-ml.so.1`.
    pub nvml_library: Option<PathBuf>,
    /// The `nvidia-smi` executable for `nvidia-smi`.
    pub nvidia_smi: PathBuf,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            sim_gpus: vec![GpuModel::A100_80GB],
            sim_mig_enabled: false,
            nvml_library: None,
            nvidia_smi: PathBuf::from("nvidia-smi"),
        }
    }
}

/// Builds the backend called `kind` (`sim`, `nvml` or `nvidia-smi`). `nvml` fails with
/// [`BackendError::Unavailable`] when the library, driver or GPUs are missing.
pub fn select_backend(kind: &str, options: &BackendOptions) -> Result<Arc<dyn GpuBackend>, BackendError> {
    match kind {
        "sim" => Ok(Arc::new(SimBackend::new(&options.sim_gpus, options.sim_mig_enabled))),
        "nvml" => {
            let backend = match &options.nvml_library {
                Some(path) => NvmlBackend::open_library(path.as_os_str())?,
                None => NvmlBackend::open()?,
            };
            Ok(Arc::new(backend))
        }
        "nvidia-smi" => Ok(Arc::new(NvidiaSmiBackend::new(options.nvidia_smi.to_string_lossy().into_owned()))),
        other => Err(BackendError::UnknownBackend { name: other.to_string() }),
    }
}

/// Recognises the GPU models whose MIG geometry the planner knows from the driver's product
/// name and memory size. Anything else (V100, T4, L4, A30 with its 4-slice geometry, …) is
/// [`GpuModel::NoMig`]: the planner then uses it with MPS only.
pub fn model_from_name(name: &str, memory_mib: u64) -> GpuModel {
    let upper = name.to_ascii_uppercase();
    if upper.contains("A100") {
        // A100 40GB cards report 40960 MiB, 80GB cards 81920 MiB.
        if memory_mib > 60 * 1024 || upper.contains("80GB") {
            GpuModel::A100_80GB
        } else {
            GpuModel::A100_40GB
        }
    } else if upper.contains("H100") {
        GpuModel::H100_80GB
    } else if upper.contains("H200") {
        GpuModel::H200
    } else {
        GpuModel::NoMig
    }
}

/// The placement of `profile` at memory slice `start`, provided the driver's slice count
/// `size` matches the profile; used to map what the driver lists back to planner placements.
pub(crate) fn placement_from_slices(profile: MigProfile, start: u32, size: u32) -> Option<Placement> {
    let start = u8::try_from(start).ok()?;
    if u32::from(profile.memory_slices()) != size {
        return None;
    }
    Some(Placement::new(profile, start))
}

/// Sorts instances the way [`GpuBackend::list_instances`] promises.
pub(crate) fn sort_instances(instances: &mut [MigInstance]) {
    instances.sort_by_key(|i| (i.placement.start, i.placement.profile, i.gpu_instance_id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_recognised_from_driver_names() {
        assert_eq!(model_from_name("NVIDIA A100-SXM4-80GB", 81920), GpuModel::A100_80GB);
        assert_eq!(model_from_name("NVIDIA A100-PCIE-40GB", 40960), GpuModel::A100_40GB);
        assert_eq!(model_from_name("NVIDIA A100 80GB PCIe", 81920), GpuModel::A100_80GB);
        assert_eq!(model_from_name("NVIDIA H100 80GB HBM3", 81559), GpuModel::H100_80GB);
        assert_eq!(model_from_name("NVIDIA H200", 143771), GpuModel::H200);
        assert_eq!(model_from_name("Tesla T4", 15360), GpuModel::NoMig);
        assert_eq!(model_from_name("NVIDIA A30", 24576), GpuModel::NoMig);
    }

    #[test]
    fn unknown_backend_names_are_refused_with_the_known_ones() {
        let err = select_backend("cuda", &BackendOptions::default()).err().expect("unknown name must fail");
        assert!(matches!(&err, BackendError::UnknownBackend { name } if name == "cuda"));
        assert_eq!(err.to_string(), "unknown GPU backend `cuda` (expected one of: sim, nvml, nvidia-smi)");
    }

    #[test]
    fn sim_and_nvidia_smi_backends_are_built_by_name() {
        let options = BackendOptions { sim_gpus: vec![GpuModel::A100_80GB, GpuModel::H100_80GB], ..Default::default() };
        let sim = select_backend("sim", &options).unwrap();
        assert_eq!(sim.name(), "sim");
        assert_eq!(sim.inventory().unwrap().len(), 2);
        assert_eq!(select_backend("nvidia-smi", &options).unwrap().name(), "nvidia-smi");
    }

    #[test]
    fn nvml_without_library_is_unavailable_and_points_to_sim() {
        let options = BackendOptions { nvml_library: Some("/nonexistent/libnvidia-ml.so.1".into()), ..Default::default() };
        let err = select_backend("nvml", &options).err().expect("a missing library must fail");
        assert!(matches!(err, BackendError::Unavailable { backend: "nvml", .. }), "{err}");
        assert!(err.to_string().contains("--gpu-backend sim"), "{err}");
    }
}
