//! Carries out reconcile steps against the GPU backend, MPS control and the supervisor, and
//! observes the node for the next round. Blocking (driver calls, process signals): the
//! runtime calls it from a blocking thread.

use crate::backend::{BackendError, GpuBackend, GpuInfo, MigInstance};
use crate::desired::{Slot, WorkloadSpec};
use crate::model_load::{LoadTarget, ModelLoads};
use crate::mps::{MpsControl, MpsError};
use crate::reconcile::{GpuObserved, NodeObserved, Role, Running, Step};
use crate::router::{ActiveProcess, Routers, RoutingError};
use crate::shadow::{Action, Event};
use crate::supervisor::template::{launch_command, uses, LaunchParams, Template};
use crate::supervisor::{Launch, MetricsEndpoint, Supervisor, SupervisorError};
use model::{ModelControl, ServingRuntimeSpec};
use planner::mig::Placement;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How long a stopped process may take to exit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Mps(#[from] MpsError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error("GPU {0} is not on this node")]
    UnknownGpu(String),
    #[error("GPU {gpu} has no MIG instance {placement}")]
    NoInstance { gpu: String, placement: Placement },
    #[error("no free port left in {0:?}")]
    NoPort([u16; 2]),
    #[error(transparent)]
    Routing(#[from] RoutingError),
    #[error("no standby of {service} to promote on GPU {gpu}")]
    NoStandby { gpu: String, service: String },
    #[error("service {service} names runtime {runtime:?}, which the desired state does not carry")]
    UnknownRuntime { service: String, runtime: String },
}

/// A process that answered ready for the first time since its launch.
#[derive(Debug, Clone, PartialEq)]
pub struct ColdStart {
    pub service: String,
    /// Its ServingRuntime (`host` for the host's template).
    pub runtime: String,
    pub seconds: f64,
}

pub struct Executor {
    pub backend: Arc<dyn GpuBackend>,
    pub mps: Arc<dyn MpsControl>,
    pub supervisor: Supervisor,
    pub template: Template,
    /// The ServingRuntimes of the desired state being applied (`NodeDesired::runtimes`).
    pub runtimes: BTreeMap<String, ServingRuntimeSpec>,
    /// Cold starts measured since the last `take_cold_starts`.
    pub cold_starts: Vec<ColdStart>,
    pub ports: [u16; 2],
    pub gpus: Vec<GpuInfo>,
    /// The per-service routers; `None` when the agent routes nothing (tests of the steps).
    pub routers: Option<Arc<Routers>>,
    /// The model loads the agent asked servers for (runtimes with `model_control = repository`);
    /// `None` when the agent loads none (tests of the steps).
    pub model_loads: Option<ModelLoads>,
}

impl Executor {
    fn gpu(&self, uuid: &str) -> Result<&GpuInfo, ExecError> {
        self.gpus.iter().find(|g| g.uuid == uuid).ok_or_else(|| ExecError::UnknownGpu(uuid.to_string()))
    }

    fn instances(&self, gpu: &GpuInfo) -> Result<Vec<MigInstance>, ExecError> {
        match self.backend.list_instances(gpu.index) {
            Ok(list) => Ok(list),
            Err(BackendError::MigDisabled { .. }) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// What runs on the node now.
    pub fn observe(&self) -> Result<NodeObserved, ExecError> {
        let mut observed = NodeObserved::default();
        for g in &self.gpus {
            let layout = self.instances(g)?.iter().map(|i| i.placement).collect();
            let running = self
                .supervisor
                .records()
                .filter(|r| r.gpu == g.uuid)
                .map(|r| Running { id: r.id.clone(), spec: r.spec.clone(), role: r.role })
                .collect();
            observed.gpus.insert(g.uuid.clone(), GpuObserved { layout, running });
        }
        observed.exited = self.supervisor.exited().map(String::from).collect();
        Ok(observed)
    }

    /// Carries out one step. Every step checks the state first, so repeating one that was
    /// done (the agent died right after it) changes nothing.
    pub fn execute(&mut self, step: &Step) -> Result<(), ExecError> {
        match step {
            Step::CreateInstance { gpu, placement } => {
                let g = self.gpu(gpu)?.clone();
                if !g.mig_enabled {
                    self.backend.set_mig_mode(g.index, true)?;
                    self.refresh_inventory()?;
                }
                if !self.instances(&g)?.iter().any(|i| i.placement == *placement) {
                    self.backend.create_instance(g.index, *placement)?;
                }
            }
            Step::DestroyInstance { gpu, placement } => {
                let g = self.gpu(gpu)?.clone();
                if let Some(i) = self.instances(&g)?.iter().find(|i| i.placement == *placement) {
                    self.backend.destroy_instance(g.index, i.gpu_instance_id)?;
                }
            }
            Step::Start { gpu, spec } => {
                self.start(gpu, spec, Role::Active)?;
                self.route(&spec.service)?;
            }
            Step::StartStandby { gpu, spec } => self.start(gpu, spec, Role::Standby)?,
            Step::Promote { gpu, service, slot } => {
                let id = self
                    .supervisor
                    .records()
                    .filter(|r| r.gpu == *gpu && r.role == Role::Standby && r.spec.service == *service && r.spec.slot == *slot)
                    .max_by_key(|r| r.seq)
                    .map(|r| r.id.clone())
                    .ok_or_else(|| ExecError::NoStandby { gpu: gpu.clone(), service: service.clone() })?;
                self.supervisor.set_role(&id, Role::Active)?;
                // The switch: one pointer swap in the service's router.
                self.route(service)?;
            }
            Step::Drain { id, .. } => {
                if let Some(routers) = &self.routers {
                    routers.retire(id);
                }
            }
            Step::Stop { gpu, id } => {
                let Some(record) = self.supervisor.get(id).cloned() else { return Ok(()) };
                self.supervisor.stop(id, STOP_GRACE)?;
                // After an agent restart the MPS bookkeeping may not know the client; the
                // process is gone either way, so a failed release is only logged.
                if let Err(e) = self
                    .device_of(gpu, record.spec.slot)
                    .and_then(|d| Ok(self.mps.release_client(&d, &client_name(&record.spec.service, record.role, record.port))?))
                {
                    tracing::debug!(id, error = %e, "MPS client not released");
                }
            }
        }
        Ok(())
    }

    /// Carries out a shadow policy's action (`crate::shadow`); returns what it led to, for
    /// the policies to hear.
    /// * `ProbeReady`: one Ready probe now; a standby not ready yet is probed again next round.
    /// * `Switch` (iGniter Sec. 4.2, GSLICE Sec. 3.2.4): the standby becomes active and the
    ///   active one leaves the router's set in one pointer swap, then drains.
    /// * `Stop`: as the reconcile step, MPS client released.
    /// * `WantShadow`: nothing here; the reconcile plan starts a standby for every workload
    ///   that has none.
    pub fn carry_out(&mut self, action: &Action) -> Result<Vec<Event>, ExecError> {
        match action {
            Action::ProbeReady(id) => {
                let ready = match (self.supervisor.get(id), &self.routers) {
                    (Some(record), Some(routers)) => routers.probe_ready(record.port, &record.spec.model),
                    (None, _) => return Ok(vec![Event::Gone(id.clone())]),
                    (Some(_), None) => false,
                };
                if ready {
                    self.note_ready(id);
                }
                Ok(if ready { vec![Event::Ready(id.clone())] } else { Vec::new() })
            }
            Action::Switch { from, to, .. } => {
                let Some(service) = self.supervisor.get(to).map(|r| r.spec.service.clone()) else {
                    return Ok(vec![Event::Gone(to.clone())]);
                };
                self.supervisor.set_role(to, Role::Active)?;
                if self.supervisor.get(from).is_some() {
                    // Out of the active set in the same swap that puts the standby in.
                    self.supervisor.set_role(from, Role::Standby)?;
                }
                self.route(&service)?;
                if let Some(routers) = &self.routers {
                    routers.retire(from);
                }
                Ok(vec![Event::Drained(from.clone())])
            }
            Action::Stop(id) => {
                if let Some(gpu) = self.supervisor.get(id).map(|r| r.gpu.clone()) {
                    self.execute(&Step::Stop { gpu, id: id.clone() })?;
                }
                Ok(vec![Event::Gone(id.clone())])
            }
            Action::WantShadow => Ok(Vec::new()),
        }
    }

    /// Points the service's router at its active processes on this node.
    pub fn route(&mut self, service: &str) -> Result<(), ExecError> {
        let Some(routers) = &self.routers else { return Ok(()) };
        let active: Vec<&crate::supervisor::ProcessRecord> =
            self.supervisor.records().filter(|r| r.role == Role::Active && r.spec.service == service).collect();
        let Some(first) = active.first() else { return Ok(()) };
        let processes: Vec<ActiveProcess> = active
            .iter()
            .map(|r| ActiveProcess {
                id: r.id.clone(),
                port: r.port,
                gpcs: match r.spec.slot {
                    Slot::WholeGpu => 7,
                    Slot::Mig(p) => u32::from(p.profile.compute()),
                },
                max_batch: r.spec.batch,
                batch_ms: r.spec.batch_ms,
                model: r.spec.model.clone(),
            })
            .collect();
        let routed = routers.sync(service, first.spec.slo_ms, &processes)?;
        // A process the supervisor relaunched after a crash keeps its place in the router,
        // so `sync` does not probe it again: it is asked here until it answers ready.
        let answered: Vec<String> = processes
            .iter()
            .filter(|p| !routed.contains(&p.id) && self.supervisor.state(&p.id) == "starting" && routers.routes(&p.id))
            .filter(|p| routers.probe_ready(p.port, &p.model))
            .map(|p| p.id.clone())
            .collect();
        for id in routed.into_iter().chain(answered) {
            self.note_ready(&id);
        }
        Ok(())
    }

    /// `id` answered ready: its cold start, if this is the first time since its launch.
    fn note_ready(&mut self, id: &str) {
        let Some(took) = self.supervisor.ready(id, std::time::Instant::now()) else { return };
        let Some(r) = self.supervisor.get(id) else { return };
        let runtime = r.spec.runtime.clone().unwrap_or_else(|| "host".into());
        tracing::info!(process = id, service = %r.spec.service, runtime, seconds = took.as_secs_f64(), "process ready");
        self.cold_starts.push(ColdStart { service: r.spec.service.clone(), runtime, seconds: took.as_secs_f64() });
    }

    /// Gives each process the SLO and predicted batch time its workload has in `desired`:
    /// they change without a restart, and the router and the shadow policies read them from
    /// the process records.
    pub fn refresh(&mut self, desired: &crate::desired::NodeDesired) -> Result<(), ExecError> {
        let updates: Vec<(String, WorkloadSpec)> = self
            .supervisor
            .records()
            .filter_map(|r| {
                let wanted = desired.gpus.get(&r.gpu)?.workloads.iter().find(|w| w.service == r.spec.service && w.same_config(&r.spec))?;
                Some((r.id.clone(), wanted.clone()))
            })
            .collect();
        for (id, spec) in updates {
            self.supervisor.refresh(&id, &spec)?;
        }
        Ok(())
    }

    /// Asks the server of each process whose runtime has the agent load its model to load it,
    /// once per launch (`crate::model_load`).
    pub fn load_models(&mut self) {
        let Some(loads) = &mut self.model_loads else { return };
        let targets: Vec<LoadTarget> = self
            .supervisor
            .records()
            .filter(|r| r.load_model)
            .filter_map(|r| {
                Some(LoadTarget {
                    process: r.id.clone(),
                    pid: r.pid,
                    service: r.spec.service.clone(),
                    model: r.spec.model.clone(),
                    http_port: r.http_port?,
                })
            })
            .collect();
        loads.sync(&targets);
    }

    /// The cold starts measured since the last call.
    pub fn take_cold_starts(&mut self) -> Vec<ColdStart> {
        std::mem::take(&mut self.cold_starts)
    }

    /// Routes every service with processes here (after an agent restart, or for processes
    /// that were not ready in an earlier round).
    pub fn route_all(&mut self) -> Result<(), ExecError> {
        let services: BTreeSet<String> = self.supervisor.records().map(|r| r.spec.service.clone()).collect();
        for s in services {
            self.route(&s)?;
        }
        Ok(())
    }

    fn refresh_inventory(&mut self) -> Result<(), ExecError> {
        self.gpus = self.backend.inventory()?;
        Ok(())
    }

    /// The device a workload's processes may see: its MIG instance or the whole GPU.
    fn device_of(&self, gpu: &str, slot: Slot) -> Result<String, ExecError> {
        let g = self.gpu(gpu)?;
        match slot {
            Slot::WholeGpu => Ok(g.uuid.clone()),
            Slot::Mig(p) => self
                .instances(g)?
                .into_iter()
                .find(|i| i.placement == p)
                .and_then(|i| i.device_uuid)
                .ok_or_else(|| ExecError::NoInstance { gpu: gpu.to_string(), placement: p }),
        }
    }

    /// A port of the range that no process holds and no other program has bound; `taken`
    /// are the ones given out for the process being launched.
    fn free_port(&self, taken: &[u16]) -> Result<u16, ExecError> {
        let used: BTreeSet<u16> = self.supervisor.records().flat_map(|r| r.ports()).chain(taken.iter().copied()).collect();
        // Skip ports another program holds (several agents may share a host in tests and
        // demos): a process that cannot bind its port would only crash-loop.
        let bindable = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        (self.ports[0]..=self.ports[1]).find(|&p| !used.contains(&p) && bindable(p)).ok_or(ExecError::NoPort(self.ports))
    }

    /// The launch spec of a workload: its Service's runtime, else the host's template.
    fn launch_spec(&self, spec: &WorkloadSpec) -> Result<ServingRuntimeSpec, ExecError> {
        match &spec.runtime {
            None => Ok(self.template.launch_spec()),
            Some(name) => self
                .runtimes
                .get(name)
                .cloned()
                .ok_or_else(|| ExecError::UnknownRuntime { service: spec.service.clone(), runtime: name.clone() }),
        }
    }

    fn start(&mut self, gpu: &str, spec: &WorkloadSpec, role: Role) -> Result<(), ExecError> {
        // The plan counts the processes it wants (a workload may run several), so a start
        // always starts one; only a standby is unique per workload.
        let exists = role == Role::Standby && self.supervisor.records().any(|r| r.gpu == gpu && r.role == role && r.spec.same_config(spec));
        if exists {
            return Ok(());
        }
        let device = self.device_of(gpu, spec.slot)?;
        self.mps.start_daemon(&device)?;
        // The standby gets the workload's share plus the shadow share (iGniter Sec. 4.2).
        let share = if role == Role::Standby { spec.mps_percent + spec.shadow_mps_percent } else { spec.mps_percent };
        let percent = share.clamp(1.0, 100.0).round() as u8;
        let launch_spec = self.launch_spec(spec)?;
        let port = self.free_port(&[])?;
        let http_port = if uses(&launch_spec, "{http_port}") { Some(self.free_port(&[port])?) } else { None };
        let metrics_port =
            if uses(&launch_spec, "{metrics_port}") { Some(self.free_port(&[port, http_port.unwrap_or(port)])?) } else { None };
        let client = client_name(&spec.service, role, port);
        let mps_env = self.mps.client_env(&device, &client, Some(percent))?;
        let gpcs = match spec.slot {
            Slot::WholeGpu => 0,
            Slot::Mig(p) => p.profile.compute(),
        };
        let params = LaunchParams {
            service: spec.service.clone(),
            model: spec.model.clone(),
            model_uri: spec.model_uri.clone(),
            batch: spec.batch,
            port,
            http_port,
            metrics_port,
            gpcs,
            device_uuid: device,
            mps_env,
            mps_percent: f64::from(percent),
            gpu_name: self.gpu(gpu)?.name.clone(),
        };
        let command = launch_command(&launch_spec, &params);
        let load_model = launch_spec.model_control == ModelControl::Repository && http_port.is_some();
        let metrics = metrics_port.zip(launch_spec.metrics_path).map(|(port, path)| MetricsEndpoint { port, path });
        self.supervisor.start(gpu, spec, role, &Launch { command, port, http_port, metrics, load_model })?;
        if load_model {
            self.load_models();
        }
        Ok(())
    }
}

/// The MPS client name of a workload process (unique per port).
fn client_name(service: &str, role: Role, port: u16) -> String {
    format!("{service}-{}-{port}", if role == Role::Active { "a" } else { "s" })
}
