//! Simulated GPUs with the exact MIG placement rules of [`planner::mig`] and the errors real
//! hardware gives: illegal start → invalid placement, taken slices → overlap ("Insufficient
//! Resources"), destroying an instance that runs processes → in use, MIG disabled → refused.
//!
//! Ids are deterministic: GPU-instance ids are the lowest free id from 1, compute-instance
//! ids are 0 (one full compute instance per GPU instance), and uuids are derived from the GPU
//! index and a creation counter, so one sequence of operations always yields the same ids.

use super::{sort_instances, BackendError, GpuBackend, GpuInfo, MigInstance};
use crate::command::lock;
use planner::mig::{validate, GpuModel, MigError, Placement};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Simulated GPUs; cheap to share (`Arc<SimBackend>`), all state behind one mutex.
#[derive(Debug)]
pub struct SimBackend {
    state: Mutex<SimState>,
}

#[derive(Debug)]
struct SimState {
    /// Mixed into every uuid so that the GPUs of different simulated hosts differ.
    host_seed: u64,
    /// Where the simulated hardware state lives between agent restarts (real GPUs keep
    /// their MIG instances when the agent dies); `None` = memory only.
    device_file: Option<PathBuf>,
    gpus: Vec<SimGpu>,
    /// Instances created so far on the whole host; feeds the uuids so that a re-created
    /// instance gets a new uuid, as on hardware.
    created: u64,
}

#[derive(Debug)]
struct SimGpu {
    info: GpuInfo,
    instances: BTreeMap<u32, SimInstance>,
}

#[derive(Debug)]
struct SimInstance {
    instance: MigInstance,
    pids: BTreeSet<u32>,
}

impl SimBackend {
    /// One simulated GPU per entry of `models`, indexed from 0.
    pub fn new(models: &[GpuModel], mig_enabled: bool) -> Self {
        let gpus = models
            .iter()
            .enumerate()
            .map(|(i, &model)| {
                let index = i as u32;
                let (name, memory_mib) = product(model);
                let info = GpuInfo {
                    index,
                    uuid: sim_uuid("GPU", u64::from(index), 0),
                    name: name.to_string(),
                    model,
                    memory_mib,
                    mig_enabled: mig_enabled && model != GpuModel::NoMig,
                };
                SimGpu { info, instances: BTreeMap::new() }
            })
            .collect();
        SimBackend { state: Mutex::new(SimState { host_seed: 0, device_file: None, gpus, created: 0 }) }
    }

    /// Simulated GPUs of one host: uuids unique to `host`, and the MIG state kept in
    /// `device_file` so that it survives an agent restart as hardware state does. An
    /// existing file must describe the same GPU models, else it is refused.
    /// Names the GPUs without MIG after their configured model (`V100-16GB`, `T4`, ...),
    /// which the product table cannot tell apart, so that what runs on them (the simulated
    /// inference servers' speed) can.
    pub fn name_products(&self, configured: &[String]) {
        let mut state = lock(&self.state);
        for (g, name) in state.gpus.iter_mut().zip(configured) {
            if g.info.model == GpuModel::NoMig {
                let (product, memory_mib) = no_mig_product(name);
                g.info.name = product.to_string();
                g.info.memory_mib = memory_mib;
            }
        }
    }

    pub fn for_host(models: &[GpuModel], mig_enabled: bool, host: &str, device_file: Option<PathBuf>) -> Result<Self, BackendError> {
        let host_seed = fnv1a(host.as_bytes());
        let backend = SimBackend::new(models, mig_enabled);
        {
            let mut state = lock(&backend.state);
            state.host_seed = host_seed;
            for g in &mut state.gpus {
                g.info.uuid = sim_uuid("GPU", u64::from(g.info.index) ^ host_seed, 0);
            }
            if let Some(path) = &device_file {
                state.load(path)?;
            }
            state.device_file = device_file;
            state.save()?;
        }
        Ok(backend)
    }

    /// Marks process `pid` as running on GPU instance `gpu_instance_id`, as a CUDA process
    /// started with its MIG uuid would be.
    pub fn attach_process(&self, gpu: u32, gpu_instance_id: u32, pid: u32) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        let instance = state.instance_mut(gpu, gpu_instance_id)?;
        instance.pids.insert(pid);
        Ok(())
    }

    /// Removes process `pid` from the instance; returns whether it was attached.
    pub fn detach_process(&self, gpu: u32, gpu_instance_id: u32, pid: u32) -> Result<bool, BackendError> {
        let mut state = lock(&self.state);
        let instance = state.instance_mut(gpu, gpu_instance_id)?;
        Ok(instance.pids.remove(&pid))
    }

    /// Processes attached to the instance, ascending.
    pub fn processes(&self, gpu: u32, gpu_instance_id: u32) -> Result<Vec<u32>, BackendError> {
        let mut state = lock(&self.state);
        let instance = state.instance_mut(gpu, gpu_instance_id)?;
        Ok(instance.pids.iter().copied().collect())
    }
}

/// The persisted part of the simulated hardware.
#[derive(serde::Serialize, serde::Deserialize)]
struct DeviceFile {
    created: u64,
    gpus: Vec<(GpuModel, bool, Vec<MigInstance>)>,
}

impl SimState {
    fn load(&mut self, path: &Path) -> Result<(), BackendError> {
        let bad = |reason: String| BackendError::Io {
            command: format!("read simulated device state {}", path.display()),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(bad(e.to_string())),
        };
        let file: DeviceFile = serde_json::from_slice(&bytes).map_err(|e| bad(format!("corrupt: {e}")))?;
        let models: Vec<GpuModel> = file.gpus.iter().map(|g| g.0).collect();
        let ours: Vec<GpuModel> = self.gpus.iter().map(|g| g.info.model).collect();
        if models != ours {
            return Err(bad(format!("it describes GPUs {models:?}, the configuration {ours:?}")));
        }
        for (gpu, (_, mig, instances)) in self.gpus.iter_mut().zip(file.gpus) {
            gpu.info.mig_enabled = mig;
            gpu.instances =
                instances.into_iter().map(|i| (i.gpu_instance_id, SimInstance { instance: i, pids: BTreeSet::new() })).collect();
        }
        self.created = file.created;
        Ok(())
    }

    fn save(&self) -> Result<(), BackendError> {
        let Some(path) = &self.device_file else { return Ok(()) };
        let file = DeviceFile {
            created: self.created,
            gpus: self
                .gpus
                .iter()
                .map(|g| (g.info.model, g.info.mig_enabled, g.instances.values().map(|i| i.instance.clone()).collect()))
                .collect(),
        };
        let tmp = path.with_extension("tmp");
        let io = |e: std::io::Error| BackendError::Io { command: format!("write simulated device state {}", path.display()), source: e };
        std::fs::write(&tmp, serde_json::to_vec(&file).expect("device state serializes")).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    fn gpu(&self, gpu: u32) -> Result<&SimGpu, BackendError> {
        self.gpus.get(gpu as usize).ok_or_else(|| BackendError::NotFound { gpu, what: format!("GPU index {gpu}") })
    }

    fn gpu_mut(&mut self, gpu: u32) -> Result<&mut SimGpu, BackendError> {
        self.gpus.get_mut(gpu as usize).ok_or_else(|| BackendError::NotFound { gpu, what: format!("GPU index {gpu}") })
    }

    fn mig_gpu_mut(&mut self, gpu: u32) -> Result<&mut SimGpu, BackendError> {
        let sim_gpu = self.gpu_mut(gpu)?;
        if !sim_gpu.info.mig_enabled {
            return Err(BackendError::MigDisabled { gpu });
        }
        Ok(sim_gpu)
    }

    fn instance_mut(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<&mut SimInstance, BackendError> {
        self.mig_gpu_mut(gpu)?
            .instances
            .get_mut(&gpu_instance_id)
            .ok_or_else(|| BackendError::NotFound { gpu, what: format!("GPU instance {gpu_instance_id}") })
    }
}

impl GpuBackend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(lock(&self.state).gpus.iter().map(|g| g.info.clone()).collect())
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        let sim_gpu = state.gpu_mut(gpu)?;
        if sim_gpu.info.model == GpuModel::NoMig {
            return Err(BackendError::NotSupported { gpu, what: format!("MIG on {}", sim_gpu.info.name) });
        }
        if sim_gpu.info.mig_enabled == enabled {
            return Ok(());
        }
        if !enabled {
            // Leaving MIG mode tears the instances down, which the driver refuses while
            // processes use them.
            let busy: Vec<String> = sim_gpu
                .instances
                .values()
                .filter(|i| !i.pids.is_empty())
                .map(|i| format!("GPU instance {} (pids {:?})", i.instance.gpu_instance_id, i.pids))
                .collect();
            if !busy.is_empty() {
                return Err(BackendError::InUse { gpu, what: "MIG configuration".into(), detail: busy.join(", ") });
            }
            sim_gpu.instances.clear();
        }
        sim_gpu.info.mig_enabled = enabled;
        state.save()
    }

    fn list_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        let state = lock(&self.state);
        let sim_gpu = state.gpu(gpu)?;
        if !sim_gpu.info.mig_enabled {
            return Err(BackendError::MigDisabled { gpu });
        }
        let mut instances: Vec<MigInstance> = sim_gpu.instances.values().map(|i| i.instance.clone()).collect();
        sort_instances(&mut instances);
        Ok(instances)
    }

    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<MigInstance, BackendError> {
        let mut state = lock(&self.state);
        let serial = state.created + 1;
        let host_seed = state.host_seed;
        let sim_gpu = state.mig_gpu_mut(gpu)?;
        check_placement(gpu, &sim_gpu.instances, placement)?;
        let gpu_instance_id = (1..).find(|id| !sim_gpu.instances.contains_key(id)).unwrap_or(u32::MAX);
        let instance = MigInstance {
            gpu,
            gpu_instance_id,
            compute_instance_id: Some(0),
            placement,
            device_uuid: Some(sim_uuid("MIG", u64::from(gpu) ^ host_seed, serial)),
        };
        sim_gpu.instances.insert(gpu_instance_id, SimInstance { instance: instance.clone(), pids: BTreeSet::new() });
        state.created = serial;
        state.save()?;
        Ok(instance)
    }

    fn destroy_instance(&self, gpu: u32, gpu_instance_id: u32) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        let sim_gpu = state.mig_gpu_mut(gpu)?;
        let instance = sim_gpu
            .instances
            .get(&gpu_instance_id)
            .ok_or_else(|| BackendError::NotFound { gpu, what: format!("GPU instance {gpu_instance_id}") })?;
        if !instance.pids.is_empty() {
            let pids: Vec<String> = instance.pids.iter().map(u32::to_string).collect();
            return Err(BackendError::InUse {
                gpu,
                what: format!("GPU instance {gpu_instance_id} ({})", instance.instance.placement),
                detail: format!("processes {} are running on it", pids.join(", ")),
            });
        }
        sim_gpu.instances.remove(&gpu_instance_id);
        state.save()
    }
}

/// Checks a new placement against the existing instances with the planner's rules, reporting
/// the failures the way the driver classifies them.
fn check_placement(gpu: u32, existing: &BTreeMap<u32, SimInstance>, placement: Placement) -> Result<(), BackendError> {
    if let Err(MigError::IllegalStart { legal, .. }) = validate(&[placement]) {
        return Err(BackendError::InvalidPlacement {
            gpu,
            placement,
            reason: format!("Invalid Argument: {} may only start at memory slices {legal:?}", placement.profile),
        });
    }
    for other in existing.values() {
        if let Err(err) = validate(&[other.instance.placement, placement]) {
            return Err(BackendError::Overlap {
                gpu,
                placement,
                reason: format!(
                    "Insufficient Resources: conflicts with GPU instance {} at {} ({err})",
                    other.instance.gpu_instance_id, other.instance.placement
                ),
            });
        }
    }
    let mut layout: Vec<Placement> = existing.values().map(|i| i.instance.placement).collect();
    layout.push(placement);
    validate(&layout).map_err(|err| BackendError::Overlap { gpu, placement, reason: format!("Insufficient Resources: {err}") })
}

/// Product name and memory of the simulated GPU of each model.
fn product(model: GpuModel) -> (&'static str, u64) {
    match model {
        GpuModel::A100_40GB => ("NVIDIA A100-SXM4-40GB", 40_960),
        GpuModel::A100_80GB => ("NVIDIA A100-SXM4-80GB", 81_920),
        GpuModel::H100_80GB => ("NVIDIA H100 80GB HBM3", 81_559),
        GpuModel::H200 => ("NVIDIA H200", 143_771),
        GpuModel::NoMig => ("Tesla T4", 15_360),
    }
}

/// Product name and memory of a simulated GPU without MIG, by its configured model name.
fn no_mig_product(name: &str) -> (&'static str, u64) {
    if name.contains("V100") {
        ("Tesla V100-SXM2-16GB", 16_384)
    } else if name.contains("L4") {
        ("NVIDIA L4", 23_034)
    } else if name.contains("A10") {
        ("NVIDIA A10", 23_028)
    } else {
        ("Tesla T4", 15_360)
    }
}

/// A uuid-shaped id (`PREFIX-8-4-4-4-12` hex digits) derived deterministically from its inputs
/// (FNV-1a, so it is stable across Rust releases, unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn sim_uuid(prefix: &str, a: u64, b: u64) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut next = |bytes: &[u8]| {
        for &byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash
    };
    let hi = next(&[prefix.as_bytes(), &a.to_le_bytes(), &b.to_le_bytes()].concat());
    let lo = next(b"gpuplane-sim");
    format!("{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xffff, hi & 0xffff, lo >> 48, lo & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::mig::{maximal_layouts, MigProfile, COMPUTE_SLICES};
    use MigProfile::*;

    #[test]
    fn a_host_keeps_its_mig_instances_across_agent_restarts_and_has_its_own_uuids() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gpus.json");
        let b = SimBackend::for_host(&[GpuModel::A100_80GB], true, "node-a", Some(file.clone())).unwrap();
        let made = b.create_instance(0, Placement::new(G3, 4)).unwrap();
        let uuid = b.inventory().unwrap()[0].uuid.clone();
        drop(b);
        let again = SimBackend::for_host(&[GpuModel::A100_80GB], true, "node-a", Some(file.clone())).unwrap();
        assert_eq!(again.list_instances(0).unwrap(), vec![made]);
        assert_eq!(again.inventory().unwrap()[0].uuid, uuid);
        let other = SimBackend::for_host(&[GpuModel::A100_80GB], true, "node-b", None).unwrap();
        assert_ne!(other.inventory().unwrap()[0].uuid, uuid, "hosts have distinct GPU uuids");
        let err = SimBackend::for_host(&[GpuModel::H100_80GB], true, "node-a", Some(file)).expect_err("refused");
        assert!(err.to_string().contains("gpus.json"), "{err}");
    }

    fn a100() -> SimBackend {
        SimBackend::new(&[GpuModel::A100_80GB], true)
    }

    fn layout_of(instances: &[MigInstance]) -> Vec<Placement> {
        instances.iter().map(|i| i.placement).collect()
    }

    #[test]
    fn every_maximal_a100_layout_is_created_and_listed_back_identically() {
        let layouts = maximal_layouts(&MigProfile::PARVA);
        assert_eq!(layouts.len(), 19);
        let backend = a100();
        for layout in &layouts {
            let mut created = Vec::new();
            for &placement in layout {
                created.push(backend.create_instance(0, placement).unwrap_or_else(|e| panic!("{layout:?}: {e}")));
            }
            let listed = backend.list_instances(0).unwrap();
            assert_eq!(&layout_of(&listed), layout);
            for instance in &listed {
                assert!(created.contains(instance), "{instance:?} was not what create returned");
                assert_eq!(instance.compute_instance_id, Some(0));
                assert!(instance.device_uuid.as_deref().is_some_and(|u| u.starts_with("MIG-")));
            }
            // A maximal layout has no room left for any profile at any legal start.
            for profile in MigProfile::PARVA {
                for &start in profile.legal_starts() {
                    let err = backend.create_instance(0, Placement::new(profile, start)).unwrap_err();
                    assert!(matches!(err, BackendError::Overlap { .. }), "{layout:?} + {profile}@{start}: {err}");
                }
            }
            assert_eq!(backend.list_instances(0).unwrap(), listed, "failed creations must not change the GPU");
            for instance in listed {
                backend.destroy_instance(0, instance.gpu_instance_id).unwrap();
            }
            assert!(backend.list_instances(0).unwrap().is_empty());
        }
    }

    #[test]
    fn every_illegal_start_fails_with_invalid_placement_and_creates_nothing() {
        let backend = a100();
        let mut checked = 0;
        for profile in MigProfile::ALL {
            for start in 0..=u8::MAX {
                if profile.legal_starts().contains(&start) {
                    continue;
                }
                let placement = Placement::new(profile, start);
                match backend.create_instance(0, placement) {
                    Err(BackendError::InvalidPlacement { gpu: 0, placement: p, reason }) => {
                        assert_eq!(p, placement);
                        assert!(reason.starts_with("Invalid Argument"), "{reason}");
                    }
                    other => panic!("{placement}: expected InvalidPlacement, got {other:?}"),
                }
                checked += 1;
            }
        }
        assert!(checked > 6 * 240);
        assert!(backend.list_instances(0).unwrap().is_empty());
    }

    #[test]
    fn every_overlapping_pair_of_legal_placements_fails_with_overlap() {
        let backend = a100();
        let legal: Vec<Placement> =
            MigProfile::ALL.iter().flat_map(|&p| p.legal_starts().iter().map(move |&s| Placement::new(p, s))).collect();
        let mut overlaps = 0;
        for &first in &legal {
            let existing = backend.create_instance(0, first).unwrap();
            for &second in &legal {
                let shares_memory = first.profile.memory_mask(first.start) & second.profile.memory_mask(second.start) != 0;
                let too_much_compute = first.profile.compute() + second.profile.compute() > COMPUTE_SLICES;
                let result = backend.create_instance(0, second);
                if shares_memory || too_much_compute {
                    overlaps += 1;
                    match result {
                        Err(BackendError::Overlap { placement, reason, .. }) => {
                            assert_eq!(placement, second);
                            assert!(reason.contains(&format!("GPU instance {}", existing.gpu_instance_id)), "{reason}");
                        }
                        other => panic!("{first} then {second}: expected Overlap, got {other:?}"),
                    }
                } else {
                    let created = result.unwrap_or_else(|e| panic!("{first} then {second}: {e}"));
                    backend.destroy_instance(0, created.gpu_instance_id).unwrap();
                }
            }
            assert_eq!(layout_of(&backend.list_instances(0).unwrap()), vec![first]);
            backend.destroy_instance(0, existing.gpu_instance_id).unwrap();
        }
        assert!(overlaps > legal.len(), "every placement overlaps at least itself");
    }

    #[test]
    fn destroying_a_busy_instance_fails_and_leaves_it_in_place() {
        let backend = a100();
        let big = backend.create_instance(0, Placement::new(G4, 0)).unwrap();
        let small = backend.create_instance(0, Placement::new(G2, 4)).unwrap();
        backend.attach_process(0, big.gpu_instance_id, 4242).unwrap();
        backend.attach_process(0, big.gpu_instance_id, 4343).unwrap();

        let err = backend.destroy_instance(0, big.gpu_instance_id).unwrap_err();
        match &err {
            BackendError::InUse { gpu: 0, detail, .. } => assert_eq!(detail, "processes 4242, 4343 are running on it"),
            other => panic!("expected InUse, got {other:?}"),
        }
        assert_eq!(backend.list_instances(0).unwrap(), vec![big.clone(), small.clone()]);
        assert!(matches!(backend.set_mig_mode(0, false), Err(BackendError::InUse { .. })));
        assert!(backend.inventory().unwrap()[0].mig_enabled);

        assert!(backend.detach_process(0, big.gpu_instance_id, 4242).unwrap());
        assert!(!backend.detach_process(0, big.gpu_instance_id, 4242).unwrap());
        assert!(matches!(backend.destroy_instance(0, big.gpu_instance_id), Err(BackendError::InUse { .. })));
        backend.detach_process(0, big.gpu_instance_id, 4343).unwrap();
        backend.destroy_instance(0, big.gpu_instance_id).unwrap();
        assert_eq!(backend.list_instances(0).unwrap(), vec![small]);
    }

    #[test]
    fn mig_mode_gates_every_instance_operation() {
        let backend = SimBackend::new(&[GpuModel::A100_80GB, GpuModel::NoMig], false);
        let p = Placement::new(G7, 0);
        assert!(matches!(backend.list_instances(0), Err(BackendError::MigDisabled { gpu: 0 })));
        assert!(matches!(backend.create_instance(0, p), Err(BackendError::MigDisabled { gpu: 0 })));
        assert!(matches!(backend.destroy_instance(0, 1), Err(BackendError::MigDisabled { gpu: 0 })));
        assert!(matches!(backend.attach_process(0, 1, 7), Err(BackendError::MigDisabled { gpu: 0 })));
        assert!(matches!(backend.set_mig_mode(1, true), Err(BackendError::NotSupported { gpu: 1, .. })));
        assert!(matches!(backend.set_mig_mode(2, true), Err(BackendError::NotFound { gpu: 2, .. })));

        backend.set_mig_mode(0, true).unwrap();
        let created = backend.create_instance(0, p).unwrap();
        assert!(matches!(backend.destroy_instance(0, created.gpu_instance_id + 1), Err(BackendError::NotFound { .. })));
        // Leaving MIG mode with idle instances tears them down.
        backend.set_mig_mode(0, false).unwrap();
        backend.set_mig_mode(0, true).unwrap();
        assert!(backend.list_instances(0).unwrap().is_empty());
    }

    #[test]
    fn ids_and_uuids_are_deterministic_and_fresh_after_recreation() {
        let run = || {
            let backend = SimBackend::new(&[GpuModel::A100_80GB, GpuModel::H100_80GB], true);
            let a = backend.create_instance(0, Placement::new(G3, 0)).unwrap();
            let b = backend.create_instance(0, Placement::new(G3, 4)).unwrap();
            backend.destroy_instance(0, a.gpu_instance_id).unwrap();
            let c = backend.create_instance(0, Placement::new(G3, 0)).unwrap();
            let d = backend.create_instance(1, Placement::new(G3, 0)).unwrap();
            (backend.inventory().unwrap(), a, b, c, d)
        };
        let (gpus, a, b, c, d) = run();
        assert_eq!(run(), (gpus.clone(), a.clone(), b.clone(), c.clone(), d.clone()));
        assert_eq!((a.gpu_instance_id, b.gpu_instance_id, c.gpu_instance_id), (1, 2, 1));
        assert_ne!(a.device_uuid, c.device_uuid, "a re-created instance is a new device");
        assert_ne!(c.device_uuid, d.device_uuid);
        assert_ne!(gpus[0].uuid, gpus[1].uuid);
        assert!(gpus[0].uuid.starts_with("GPU-") && gpus[0].uuid.len() == 40, "{}", gpus[0].uuid);
        assert_eq!(gpus[1].model, GpuModel::H100_80GB);
    }

    #[test]
    fn the_backend_is_shareable_between_threads() {
        let backend = std::sync::Arc::new(a100());
        let handles: Vec<_> = (0..7u8)
            .map(|start| {
                let backend = backend.clone();
                std::thread::spawn(move || backend.create_instance(0, Placement::new(G1, start)).map(|i| i.gpu_instance_id))
            })
            .collect();
        let mut ids: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (1..=7).collect::<Vec<_>>());
    }
}
