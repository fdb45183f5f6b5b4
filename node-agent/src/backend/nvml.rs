//! The NVML backend: libnvidia-ml is loaded at run time (the agent builds and runs without
//! CUDA or a GPU; this backend then reports [`BackendError::Unavailable`]).
//!
//! `nvml-wrapper` 0.11 covers initialisation and the inventory (name, uuid, memory, MIG mode)
//! but has no calls for MIG instances, nor `nvmlDeviceSetMigMode`. Those go through the raw
//! `nvml-wrapper-sys` bindings: the wrapper keeps its library handle private, so a second
//! handle is opened on the same shared object. `dlopen` returns the already-loaded library,
//! and NVML's state (initialised by the wrapper) is per process, so the device handles from
//! the wrapper are valid for the raw calls.
//!
//! Operations, as in NVIDIA's MIG API:
//! - create: `nvmlDeviceGetGpuInstanceProfileInfo` → `nvmlDeviceGetGpuInstancePossiblePlacements_v2`
//!   (to refuse an illegal start with the legal ones) → `nvmlDeviceCreateGpuInstanceWithPlacement`
//!   → `nvmlGpuInstanceGetComputeInstanceProfileInfo` (full-size, shared engines) →
//!   `nvmlGpuInstanceCreateComputeInstance`; the GPU instance is destroyed again if the
//!   compute instance cannot be created.
//! - list: `nvmlDeviceGetGpuInstances` per profile → `nvmlGpuInstanceGetInfo` (id, placement);
//!   MIG device handles (`nvmlDeviceGetMigDeviceHandleByIndex`) give GI/CI ids and uuids.
//! - destroy: `nvmlDeviceGetGpuInstanceById` → every `nvmlComputeInstanceDestroy` →
//!   `nvmlGpuInstanceDestroy` (`IN_USE` while processes run).

use super::{model_from_name, sort_instances, BackendError, GpuBackend, GpuInfo, MigInstance};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;
use planner::mig::{MigProfile, Placement};
use std::collections::BTreeMap;
use std::ffi::{CStr, OsStr};
use std::os::raw::{c_char, c_uint};
use std::ptr;

/// The soname the NVIDIA driver installs (the unversioned `.so` only comes with dev packages).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

const BACKEND: &str = "nvml";

/// NVML GPU-instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`) of each planner profile.
/// The driver maps the index to its profile id (e.g. 3g → index 2 → id 9 on A100).
pub fn gpu_instance_profile_index(profile: MigProfile) -> c_uint {
    match profile {
        MigProfile::G1 => sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        MigProfile::G1Mem2 => sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
        MigProfile::G2 => sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        MigProfile::G3 => sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        MigProfile::G4 => sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        MigProfile::G7 => sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    }
}

/// The compute-instance profile index spanning a whole GPU instance of `profile`.
pub fn full_compute_instance_profile_index(profile: MigProfile) -> c_uint {
    match profile.compute() {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        _ => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }
}

/// GPU-instance profile indices to look for when listing, with the geometry they have.
/// `1_SLICE_REV1` is `1g.*+me` (media engines), which occupies the slices of a 1g.
const LISTED_PROFILES: [(c_uint, MigProfile); 7] = [
    (sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE, MigProfile::G1),
    (sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, MigProfile::G1),
    (sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, MigProfile::G1Mem2),
    (sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE, MigProfile::G2),
    (sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE, MigProfile::G3),
    (sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE, MigProfile::G4),
    (sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE, MigProfile::G7),
];

/// A failed NVML call: its return code and NVML's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlCode(pub c_uint);

impl NvmlCode {
    pub fn name(self) -> &'static str {
        match self.0 {
            sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "NVML_ERROR_UNINITIALIZED",
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "NVML_ERROR_INVALID_ARGUMENT",
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED",
            sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "NVML_ERROR_NO_PERMISSION (MIG changes need root)",
            sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "NVML_ERROR_NOT_FOUND",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => "NVML_ERROR_INSUFFICIENT_SIZE",
            sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => "NVML_ERROR_DRIVER_NOT_LOADED",
            sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => "NVML_ERROR_TIMEOUT",
            sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => "NVML_ERROR_FUNCTION_NOT_FOUND (driver too old)",
            sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
            sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => "NVML_ERROR_RESET_REQUIRED",
            sys::nvmlReturn_enum_NVML_ERROR_IN_USE => "NVML_ERROR_IN_USE",
            sys::nvmlReturn_enum_NVML_ERROR_MEMORY => "NVML_ERROR_MEMORY",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => "NVML_ERROR_INVALID_STATE",
            sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => "NVML_ERROR_LIB_RM_VERSION_MISMATCH (driver and library differ)",
            sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => "NVML_ERROR_OPERATING_SYSTEM (blocked by the OS or cgroups)",
            sys::nvmlReturn_enum_NVML_ERROR_NOT_READY => "NVML_ERROR_NOT_READY",
            _ => "NVML_ERROR_UNKNOWN",
        }
    }
}

fn check(code: sys::nvmlReturn_t) -> Result<(), NvmlCode> {
    if code == sys::nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(NvmlCode(code))
    }
}

/// Maps an NVML failure of `operation` on `gpu` to the backend's error. `placement` is the
/// placement being created, if any: there `INVALID_ARGUMENT` means an illegal start and
/// `INSUFFICIENT_RESOURCES` means the slices are taken.
pub fn map_code(gpu: u32, operation: &str, placement: Option<Placement>, code: NvmlCode) -> BackendError {
    let message = format!("{} ({})", code.name(), code.0);
    match (code.0, placement) {
        (sys::nvmlReturn_enum_NVML_ERROR_IN_USE, _) => BackendError::InUse { gpu, what: operation.to_string(), detail: message },
        (sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND, _) => BackendError::NotFound { gpu, what: format!("{operation}: {message}") },
        (sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES, Some(placement)) => {
            BackendError::Overlap { gpu, placement, reason: message }
        }
        (sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, Some(placement)) => {
            BackendError::InvalidPlacement { gpu, placement, reason: message }
        }
        (sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, _) | (sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH, _) => {
            BackendError::Unavailable { backend: BACKEND, message }
        }
        _ => BackendError::Nvml { gpu, operation: operation.to_string(), message },
    }
}

fn map_wrapper_error(gpu: u32, operation: &str, err: NvmlError) -> BackendError {
    match err {
        NvmlError::InUse => BackendError::InUse { gpu, what: operation.to_string(), detail: err.to_string() },
        NvmlError::NotFound => BackendError::NotFound { gpu, what: operation.to_string() },
        NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound | NvmlError::LibRmVersionMismatch => {
            BackendError::Unavailable { backend: BACKEND, message: err.to_string() }
        }
        other => BackendError::Nvml { gpu, operation: operation.to_string(), message: other.to_string() },
    }
}

/// The NVML backend (see the module documentation).
pub struct NvmlBackend {
    nvml: Nvml,
    raw: sys::NvmlLib,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

/// Resolves a raw NVML symbol, or says which one the installed driver lacks.
macro_rules! sym {
    ($self:ident, $gpu:expr, $name:ident) => {
        $self.raw.$name.as_ref().map_err(|e| BackendError::Nvml {
            gpu: $gpu,
            operation: stringify!($name).to_string(),
            message: format!("symbol missing from libnvidia-ml (driver too old for MIG?): {e}"),
        })?
    };
}

impl NvmlBackend {
    /// Loads [`DEFAULT_LIBRARY`] and initialises NVML.
    pub fn open() -> Result<Self, BackendError> {
        Self::open_library(OsStr::new(DEFAULT_LIBRARY))
    }

    /// Loads libnvidia-ml from `library` (a path or soname) and initialises NVML. Fails with
    /// [`BackendError::Unavailable`] when the library, the driver or any GPU is missing.
    pub fn open_library(library: &OsStr) -> Result<Self, BackendError> {
        let unavailable = |message: String| BackendError::Unavailable { backend: BACKEND, message };
        // SAFETY: loading libnvidia-ml runs only its initialisers, which have no preconditions.
        let raw = unsafe { sys::NvmlLib::new(library) }
            .map_err(|e| unavailable(format!("cannot load {} (is the NVIDIA driver installed?): {e}", library.to_string_lossy())))?;
        let nvml = Nvml::builder().lib_path(library).init().map_err(|e| unavailable(format!("NVML initialisation failed: {e}")))?;
        let count = nvml.device_count().map_err(|e| unavailable(format!("cannot count GPUs: {e}")))?;
        if count == 0 {
            return Err(unavailable("NVML found no GPU".to_string()));
        }
        Ok(NvmlBackend { nvml, raw })
    }

    fn device(&self, gpu: u32) -> Result<sys::nvmlDevice_t, BackendError> {
        let device = self.nvml.device_by_index(gpu).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => BackendError::NotFound { gpu, what: format!("GPU index {gpu}") },
            other => map_wrapper_error(gpu, "nvmlDeviceGetHandleByIndex", other),
        })?;
        // SAFETY: the handle stays valid while `self.nvml` is initialised, i.e. while `self` lives;
        // it is only passed to NVML calls made through `self`.
        Ok(unsafe { device.handle() })
    }

    /// The device handle of a GPU in MIG mode.
    fn mig_device(&self, gpu: u32) -> Result<sys::nvmlDevice_t, BackendError> {
        let device = self.device(gpu)?;
        let get_mode = sym!(self, gpu, nvmlDeviceGetMigMode);
        let (mut current, mut pending) = (0, 0);
        // SAFETY: valid device handle and out-pointers to live locals.
        match check(unsafe { get_mode(device, &mut current, &mut pending) }) {
            Ok(()) if current == sys::NVML_DEVICE_MIG_ENABLE => Ok(device),
            Ok(()) => Err(BackendError::MigDisabled { gpu }),
            Err(NvmlCode(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)) => Err(BackendError::NotSupported { gpu, what: "MIG".into() }),
            Err(code) => Err(map_code(gpu, "nvmlDeviceGetMigMode", None, code)),
        }
    }

    fn gpu_instance_profile(
        &self,
        gpu: u32,
        device: sys::nvmlDevice_t,
        index: c_uint,
    ) -> Result<Option<sys::nvmlGpuInstanceProfileInfo_t>, BackendError> {
        let get_info = sym!(self, gpu, nvmlDeviceGetGpuInstanceProfileInfo);
        // SAFETY: plain C struct, all-zero is a valid value.
        let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid device handle, out-pointer to a live local.
        match check(unsafe { get_info(device, index, &mut info) }) {
            Ok(()) => Ok(Some(info)),
            // This GPU has no such profile (e.g. no 1g.20gb on older drivers).
            Err(NvmlCode(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED | sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)) => Ok(None),
            Err(code) => Err(map_code(gpu, "nvmlDeviceGetGpuInstanceProfileInfo", None, code)),
        }
    }

    fn possible_placements(
        &self,
        gpu: u32,
        device: sys::nvmlDevice_t,
        profile_id: c_uint,
    ) -> Result<Vec<sys::nvmlGpuInstancePlacement_t>, BackendError> {
        let get = sym!(self, gpu, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
        let mut count: c_uint = 0;
        // SAFETY: a null array asks for the count only, as documented.
        check(unsafe { get(device, profile_id, ptr::null_mut(), &mut count) })
            .map_err(|c| map_code(gpu, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", None, c))?;
        let mut placements = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        // SAFETY: the array holds `count` elements.
        check(unsafe { get(device, profile_id, placements.as_mut_ptr(), &mut count) })
            .map_err(|c| map_code(gpu, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", None, c))?;
        placements.truncate(count as usize);
        Ok(placements)
    }

    fn gpu_instance_info(&self, gpu: u32, instance: sys::nvmlGpuInstance_t) -> Result<sys::nvmlGpuInstanceInfo_t, BackendError> {
        let get_info = sym!(self, gpu, nvmlGpuInstanceGetInfo);
        // SAFETY: plain C struct (pointers may be null), all-zero is a valid value.
        let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid GPU-instance handle, out-pointer to a live local.
        check(unsafe { get_info(instance, &mut info) }).map_err(|c| map_code(gpu, "nvmlGpuInstanceGetInfo", None, c))?;
        Ok(info)
    }

    /// The compute instances of a GPU instance, over every compute profile.
    fn compute_instances(&self, gpu: u32, instance: sys::nvmlGpuInstance_t) -> Result<Vec<sys::nvmlComputeInstance_t>, BackendError> {
        let get_profile = sym!(self, gpu, nvmlGpuInstanceGetComputeInstanceProfileInfo);
        let get_instances = sym!(self, gpu, nvmlGpuInstanceGetComputeInstances);
        let mut all = Vec::new();
        for index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: plain C struct, all-zero is a valid value.
            let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid GPU-instance handle, out-pointer to a live local.
            if check(unsafe { get_profile(instance, index, sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info) }).is_err() {
                continue; // profile not available inside this GPU instance
            }
            let mut handles = vec![ptr::null_mut(); info.instanceCount.max(1) as usize];
            let mut count: c_uint = 0;
            // SAFETY: the array holds `instanceCount` (the most there can be) elements.
            check(unsafe { get_instances(instance, info.id, handles.as_mut_ptr(), &mut count) })
                .map_err(|c| map_code(gpu, "nvmlGpuInstanceGetComputeInstances", None, c))?;
            handles.truncate(count as usize);
            all.extend(handles);
        }
        Ok(all)
    }

    /// (GI id, CI id) → `MIG-…` uuid for every MIG device of the GPU.
    fn mig_device_uuids(&self, gpu: u32, device: sys::nvmlDevice_t) -> Result<BTreeMap<(u32, u32), String>, BackendError> {
        let max_count = sym!(self, gpu, nvmlDeviceGetMaxMigDeviceCount);
        let by_index = sym!(self, gpu, nvmlDeviceGetMigDeviceHandleByIndex);
        let gi_id = sym!(self, gpu, nvmlDeviceGetGpuInstanceId);
        let ci_id = sym!(self, gpu, nvmlDeviceGetComputeInstanceId);
        let get_uuid = sym!(self, gpu, nvmlDeviceGetUUID);
        let mut count: c_uint = 0;
        // SAFETY: valid device handle, out-pointer to a live local.
        check(unsafe { max_count(device, &mut count) }).map_err(|c| map_code(gpu, "nvmlDeviceGetMaxMigDeviceCount", None, c))?;
        let mut uuids = BTreeMap::new();
        for index in 0..count {
            let mut mig: sys::nvmlDevice_t = ptr::null_mut();
            // SAFETY: valid device handle, out-pointer to a live local.
            match check(unsafe { by_index(device, index, &mut mig) }) {
                Ok(()) => {}
                Err(NvmlCode(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)) => continue, // no device at this index
                Err(code) => return Err(map_code(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", None, code)),
            }
            let (mut gi, mut ci) = (0, 0);
            let mut buffer = [0 as c_char; sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
            // SAFETY: `mig` is a MIG device handle from NVML; out-pointers are live locals and the
            // buffer length passed is its real length.
            unsafe {
                check(gi_id(mig, &mut gi)).map_err(|c| map_code(gpu, "nvmlDeviceGetGpuInstanceId", None, c))?;
                check(ci_id(mig, &mut ci)).map_err(|c| map_code(gpu, "nvmlDeviceGetComputeInstanceId", None, c))?;
                check(get_uuid(mig, buffer.as_mut_ptr(), buffer.len() as c_uint))
                    .map_err(|c| map_code(gpu, "nvmlDeviceGetUUID", None, c))?;
            }
            // SAFETY: NVML wrote a NUL-terminated string into the buffer (the last byte is never written).
            let uuid = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned();
            uuids.insert((gi, ci), uuid);
        }
        Ok(uuids)
    }

    fn instance_from_handle(
        &self,
        gpu: u32,
        profile: MigProfile,
        instance: sys::nvmlGpuInstance_t,
        uuids: &BTreeMap<(u32, u32), String>,
    ) -> Result<MigInstance, BackendError> {
        let info = self.gpu_instance_info(gpu, instance)?;
        let placement =
            super::placement_from_slices(profile, info.placement.start, info.placement.size).ok_or_else(|| BackendError::Nvml {
                gpu,
                operation: "nvmlGpuInstanceGetInfo".into(),
                message: format!("placement {}:{} does not fit profile {profile}", info.placement.start, info.placement.size),
            })?;
        let ci_info = sym!(self, gpu, nvmlComputeInstanceGetInfo_v2);
        let mut compute_instance_id = None;
        if let Some(&ci) = self.compute_instances(gpu, instance)?.first() {
            // SAFETY: plain C struct, all-zero is a valid value.
            let mut info: sys::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid compute-instance handle, out-pointer to a live local.
            check(unsafe { ci_info(ci, &mut info) }).map_err(|c| map_code(gpu, "nvmlComputeInstanceGetInfo_v2", None, c))?;
            compute_instance_id = Some(info.id);
        }
        let device_uuid = compute_instance_id.and_then(|ci| uuids.get(&(info.id, ci)).cloned());
        Ok(MigInstance { gpu, gpu_instance_id: info.id, compute_instance_id, placement, device_uuid })
    }

    fn destroy_gpu_instance_handle(&self, gpu: u32, instance: sys::nvmlGpuInstance_t) -> Result<(), BackendError> {
        let destroy_ci = sym!(self, gpu, nvmlComputeInstanceDestroy);
        let destroy_gi = sym!(self, gpu, nvmlGpuInstanceDestroy);
        for ci in self.compute_instances(gpu, instance)? {
            // SAFETY: handle returned by NVML for this GPU instance.
            check(unsafe { destroy_ci(ci) }).map_err(|c| map_code(gpu, "nvmlComputeInstanceDestroy", None, c))?;
        }
        // SAFETY: handle returned by NVML; not used again after this call.
        check(unsafe { destroy_gi(instance) }).map_err(|c| map_code(gpu, "nvmlGpuInstanceDestroy", None, c))
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let count = self.nvml.device_count().map_err(|e| map_wrapper_error(0, "nvmlDeviceGetCount", e))?;
        (0..count)
            .map(|index| {
                let device = self.nvml.device_by_index(index).map_err(|e| map_wrapper_error(index, "nvmlDeviceGetHandleByIndex", e))?;
                let name = device.name().map_err(|e| map_wrapper_error(index, "nvmlDeviceGetName", e))?;
                let uuid = device.uuid().map_err(|e| map_wrapper_error(index, "nvmlDeviceGetUUID", e))?;
                let memory_mib =
                    device.memory_info().map_err(|e| map_wrapper_error(index, "nvmlDeviceGetMemoryInfo", e))?.total / (1024 * 1024);
                let mig_enabled = match device.mig_mode() {
                    Ok(mode) => mode.current == sys::NVML_DEVICE_MIG_ENABLE,
                    Err(NvmlError::NotSupported) => false,
                    Err(e) => return Err(map_wrapper_error(index, "nvmlDeviceGetMigMode", e)),
                };
                Ok(GpuInfo { index, uuid, model: model_from_name(&name, memory_mib), name, memory_mib, mig_enabled })
            })
            .collect()
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError> {
        let device = self.device(gpu)?;
        let set_mode = sym!(self, gpu, nvmlDeviceSetMigMode);
        let mode = if enabled { sys::NVML_DEVICE_MIG_ENABLE } else { sys::NVML_DEVICE_MIG_DISABLE };
        let mut activation: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
        // SAFETY: valid device handle, out-pointer to a live local.
        match check(unsafe { set_mode(device, mode, &mut activation) }) {
            Ok(()) => {}
            Err(NvmlCode(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)) => {
                return Err(BackendError::NotSupported { gpu, what: "MIG".into() })
            }
            Err(code) => return Err(map_code(gpu, "nvmlDeviceSetMigMode", None, code)),
        }
        // The mode is stored but only takes effect after a reset when the GPU was busy.
        check(activation).map_err(|code| BackendError::MigModePending { gpu, enabled, reason: format!("activation: {}", code.name()) })
    }

    fn list_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        let device = self.mig_device(gpu)?;
        let get_instances = sym!(self, gpu, nvmlDeviceGetGpuInstances);
        let uuids = self.mig_device_uuids(gpu, device)?;
        let mut instances = Vec::new();
        for (index, profile) in LISTED_PROFILES {
            let Some(info) = self.gpu_instance_profile(gpu, device, index)? else { continue };
            let mut handles = vec![ptr::null_mut(); info.instanceCount.max(1) as usize];
            let mut count: c_uint = 0;
            // SAFETY: the array holds `instanceCount` (the most there can be) elements.
            check(unsafe { get_instances(device, info.id, handles.as_mut_ptr(), &mut count) })
                .map_err(|c| map_code(gpu, "nvmlDeviceGetGpuInstances", None, c))?;
            handles.truncate(count as usize);
            for handle in handles {
                instances.push(self.instance_from_handle(gpu, profile, handle, &uuids)?);
            }
        }
        sort_instances(&mut instances);
        Ok(instances)
    }

    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<MigInstance, BackendError> {
        let device = self.mig_device(gpu)?;
        let info = self.gpu_instance_profile(gpu, device, gpu_instance_profile_index(placement.profile))?.ok_or_else(|| {
            BackendError::InvalidPlacement { gpu, placement, reason: format!("profile {} is not available on this GPU", placement.profile) }
        })?;
        let possible = self.possible_placements(gpu, device, info.id)?;
        let Some(slot) = possible.iter().find(|p| p.start == u32::from(placement.start)) else {
            let legal: Vec<u32> = possible.iter().map(|p| p.start).collect();
            return Err(BackendError::InvalidPlacement {
                gpu,
                placement,
                reason: format!("{} may only start at memory slices {legal:?} on this GPU", placement.profile),
            });
        };
        let create_gi = sym!(self, gpu, nvmlDeviceCreateGpuInstanceWithPlacement);
        let mut instance: sys::nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle, placement from the driver's own list, out-pointer to a live local.
        check(unsafe { create_gi(device, info.id, slot, &mut instance) })
            .map_err(|c| map_code(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement", Some(placement), c))?;

        let with_compute = (|| -> Result<MigInstance, BackendError> {
            let get_ci_profile = sym!(self, gpu, nvmlGpuInstanceGetComputeInstanceProfileInfo);
            let create_ci = sym!(self, gpu, nvmlGpuInstanceCreateComputeInstance);
            // SAFETY: plain C struct, all-zero is a valid value.
            let mut ci_info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let ci_index = full_compute_instance_profile_index(placement.profile);
            // SAFETY: valid GPU-instance handle, out-pointer to a live local.
            check(unsafe { get_ci_profile(instance, ci_index, sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut ci_info) })
                .map_err(|c| map_code(gpu, "nvmlGpuInstanceGetComputeInstanceProfileInfo", None, c))?;
            let mut compute: sys::nvmlComputeInstance_t = ptr::null_mut();
            // SAFETY: valid GPU-instance handle, out-pointer to a live local.
            check(unsafe { create_ci(instance, ci_info.id, &mut compute) })
                .map_err(|c| map_code(gpu, "nvmlGpuInstanceCreateComputeInstance", None, c))?;
            let uuids = self.mig_device_uuids(gpu, device)?;
            self.instance_from_handle(gpu, placement.profile, instance, &uuids)
        })();
        if with_compute.is_err() {
            // Do not leave a GPU instance without a compute instance occupying the slices.
            if let Err(cleanup) = self.destroy_gpu_instance_handle(gpu, instance) {
                tracing::warn!(gpu, %placement, error = %cleanup, "could not remove GPU instance after failed compute-instance creation");
            }
        }
        with_compute
    }

    fn destroy_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), BackendError> {
        let device = self.mig_device(gpu)?;
        let by_id = sym!(self, gpu, nvmlDeviceGetGpuInstanceById);
        let mut instance: sys::nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle, out-pointer to a live local.
        check(unsafe { by_id(device, gpu_instance_id, &mut instance) }).map_err(|c| match c.0 {
            sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND | sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => {
                BackendError::NotFound { gpu, what: format!("GPU instance {gpu_instance_id}") }
            }
            _ => map_code(gpu, "nvmlDeviceGetGpuInstanceById", None, c),
        })?;
        self.destroy_gpu_instance_handle(gpu, instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use MigProfile::*;

    #[test]
    fn missing_library_is_unavailable_and_names_the_sim_backend() {
        let err = NvmlBackend::open_library(OsStr::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        assert!(
            matches!(&err, BackendError::Unavailable { backend: "nvml", message } if message.contains("/nonexistent/libnvidia-ml.so.1"))
        );
        assert!(err.to_string().contains("--gpu-backend sim"), "{err}");
    }

    #[test]
    fn default_library_on_a_host_without_gpus_is_unavailable() {
        // On a GPU host this opens NVML for real; on CI (no driver) it must fail cleanly.
        match NvmlBackend::open() {
            Ok(backend) => assert!(!backend.inventory().unwrap().is_empty()),
            Err(err) => assert!(matches!(err, BackendError::Unavailable { .. }), "{err}"),
        }
    }

    #[test]
    fn profile_indices_follow_nvml_headers() {
        let indices: Vec<c_uint> = MigProfile::ALL.iter().map(|&p| gpu_instance_profile_index(p)).collect();
        // NVML_GPU_INSTANCE_PROFILE_{1_SLICE, 1_SLICE_REV2, 2_SLICE, 3_SLICE, 4_SLICE, 7_SLICE}
        assert_eq!(indices, vec![0, 9, 1, 2, 3, 4]);
        let compute: Vec<c_uint> = MigProfile::ALL.iter().map(|&p| full_compute_instance_profile_index(p)).collect();
        // NVML_COMPUTE_INSTANCE_PROFILE_{1,1,2,3,4,7}_SLICE
        assert_eq!(compute, vec![0, 0, 1, 2, 3, 4]);
        // Every profile is listed, under distinct NVML indices.
        let listed: BTreeSet<MigProfile> = LISTED_PROFILES.iter().map(|&(_, p)| p).collect();
        assert_eq!(listed, MigProfile::ALL.into_iter().collect());
        assert_eq!(LISTED_PROFILES.iter().map(|&(i, _)| i).collect::<BTreeSet<_>>().len(), LISTED_PROFILES.len());
    }

    #[test]
    fn return_codes_map_to_typed_errors() {
        let p = Placement::new(G3, 4);
        let code = |c| NvmlCode(c);
        assert!(matches!(
            map_code(0, "create", Some(p), code(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)),
            BackendError::Overlap { .. }
        ));
        assert!(matches!(
            map_code(0, "create", Some(p), code(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)),
            BackendError::InvalidPlacement { .. }
        ));
        assert!(matches!(map_code(1, "destroy", None, code(sys::nvmlReturn_enum_NVML_ERROR_IN_USE)), BackendError::InUse { gpu: 1, .. }));
        assert!(matches!(map_code(1, "lookup", None, code(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)), BackendError::NotFound { .. }));
        assert!(matches!(
            map_code(0, "any", None, code(sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED)),
            BackendError::Unavailable { backend: "nvml", .. }
        ));
        let permission = map_code(0, "nvmlDeviceSetMigMode", None, code(sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION));
        assert_eq!(
            permission.to_string(),
            "NVML nvmlDeviceSetMigMode failed on GPU 0: NVML_ERROR_NO_PERMISSION (MIG changes need root) (4)"
        );
        // Without a placement being created, an invalid argument is not about placement.
        assert!(matches!(map_code(0, "x", None, code(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)), BackendError::Nvml { .. }));
        assert_eq!(check(sys::nvmlReturn_enum_NVML_SUCCESS), Ok(()));
    }
}
