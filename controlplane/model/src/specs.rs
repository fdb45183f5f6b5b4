//! Typed specs, one per kind. Every struct refuses unknown fields so a typo in a manifest
//! is an error naming the field, never a silently ignored setting.

use std::collections::BTreeMap;

pub use planner::isolation::Isolation;
use serde::{Deserialize, Serialize};

use super::{FieldError, Kind};

/// The spec of a resource, tagged by kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "spec")]
pub enum Spec {
    Tenant(TenantSpec),
    GpuModel(GpuModelSpec),
    InstanceType(InstanceTypeSpec),
    ModelProfile(ModelProfileSpec),
    Service(ServiceSpec),
    Node(NodeSpec),
    Plan(PlanSpec),
    ServingRuntime(ServingRuntimeSpec),
}

impl Spec {
    pub fn kind(&self) -> Kind {
        match self {
            Spec::Tenant(_) => Kind::Tenant,
            Spec::GpuModel(_) => Kind::GpuModel,
            Spec::InstanceType(_) => Kind::InstanceType,
            Spec::ModelProfile(_) => Kind::ModelProfile,
            Spec::Service(_) => Kind::Service,
            Spec::Node(_) => Kind::Node,
            Spec::Plan(_) => Kind::Plan,
            Spec::ServingRuntime(_) => Kind::ServingRuntime,
        }
    }

    /// Decodes the JSON spec of `kind`; a type error or an unknown field names its path
    /// under `spec.`.
    pub fn from_json(kind: Kind, json: &str) -> Result<Spec, FieldError> {
        let json = if json.trim().is_empty() { "{}" } else { json };
        fn parse<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, FieldError> {
            let de = &mut serde_json::Deserializer::from_str(json);
            serde_path_to_error::deserialize(de).map_err(|e| {
                if e.inner().is_syntax() || e.inner().is_eof() {
                    return FieldError::invalid("spec", format!("malformed JSON: {}", e.inner()));
                }
                let path = e.path().to_string();
                let field = if path == "." || path.is_empty() { "spec".to_string() } else { format!("spec.{path}") };
                FieldError::invalid(field, e.into_inner().to_string())
            })
        }
        Ok(match kind {
            Kind::Tenant => Spec::Tenant(parse(json)?),
            Kind::GpuModel => Spec::GpuModel(parse(json)?),
            Kind::InstanceType => Spec::InstanceType(parse(json)?),
            Kind::ModelProfile => Spec::ModelProfile(parse(json)?),
            Kind::Service => Spec::Service(parse(json)?),
            Kind::Node => Spec::Node(parse(json)?),
            Kind::Plan => Spec::Plan(parse(json)?),
            Kind::ServingRuntime => Spec::ServingRuntime(parse(json)?),
        })
    }

    /// The spec alone as JSON (without the kind tag), as the API carries it.
    pub fn to_json(&self) -> String {
        let value = match self {
            Spec::Tenant(s) => serde_json::to_string(s),
            Spec::GpuModel(s) => serde_json::to_string(s),
            Spec::InstanceType(s) => serde_json::to_string(s),
            Spec::ModelProfile(s) => serde_json::to_string(s),
            Spec::Service(s) => serde_json::to_string(s),
            Spec::Node(s) => serde_json::to_string(s),
            Spec::Plan(s) => serde_json::to_string(s),
            Spec::ServingRuntime(s) => serde_json::to_string(s),
        };
        value.expect("specs hold only JSON-representable data")
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    #[serde(default)]
    pub display_name: String,
    /// Weight in fair sharing between tenants (HetSev weighted fairness); default 1.
    #[serde(default = "one")]
    pub weight: f64,
    /// Upper bound on the number of services; absent = unlimited.
    #[serde(default)]
    pub max_services: Option<u32>,
    /// What this tenant's workloads may share with other tenants' (`planner::isolation`):
    /// `shared` (an MPS server with other `shared` tenants), `mig` (a GPU only through
    /// separate MIG instances; the default) or `dedicated` (whole GPUs of its own).
    #[serde(default)]
    pub isolation: Isolation,
    /// Most GPUs-worth the plan gives the tenant (MIG instance GPCs/7 plus MPS shares, with
    /// the shadows' reserve); absent = unlimited. Services past it are refused, the newest
    /// first (`provision::quota`).
    #[serde(default)]
    pub max_gpus: Option<f64>,
    /// Most cost per hour of what the plan gives the tenant (those GPUs-worth at each GPU's
    /// price); absent = unlimited.
    #[serde(default)]
    pub max_cost_per_hour: Option<f64>,
}

impl Default for TenantSpec {
    fn default() -> Self {
        Self {
            display_name: String::new(),
            weight: 1.0,
            max_services: None,
            isolation: Isolation::default(),
            max_gpus: None,
            max_cost_per_hour: None,
        }
    }
}

fn one() -> f64 {
    1.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModelSpec {
    pub sm_count: u32,
    pub memory_gib: f64,
    /// MIG capability; absent for GPUs without MIG (V100, T4).
    #[serde(default)]
    pub mig: Option<MigCapability>,
    #[serde(default = "yes")]
    pub mps: bool,
    /// Figures used by iGniter's model (Eq. 1-11); optional.
    #[serde(default)]
    pub idle_power_w: Option<f64>,
    #[serde(default)]
    pub max_power_w: Option<f64>,
    #[serde(default)]
    pub max_frequency_mhz: Option<f64>,
    /// Host-to-GPU bandwidth available to inference, GB/s.
    #[serde(default)]
    pub pcie_gbps: Option<f64>,
    /// iGniter's hardware coefficients: with them (and the four figures above) the GPU can
    /// be provisioned by iGniter when it has no MIG.
    #[serde(default)]
    pub igniter: Option<IgniterHardwareSpec>,
}

/// iGniter's fitted hardware coefficients (iGniter Sec. 3.1, Eq. 6 and 9).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IgniterHardwareSpec {
    /// Eq. 9: frequency drop per watt over the power cap, MHz/W (<= 0).
    pub alpha_f: f64,
    /// Eq. 6: scheduling delay growth per co-located workload, ms per kernel.
    pub alpha_sch: f64,
    pub beta_sch: f64,
    /// Allocation unit r_unit, percent of the GPU (iGniter: 2.5 on a V100).
    #[serde(default = "r_unit")]
    pub r_unit_pct: f64,
    /// Most of the GPU iGniter may hand out, percent.
    #[serde(default = "r_max")]
    pub r_max_pct: f64,
}

fn r_unit() -> f64 {
    2.5
}

fn r_max() -> f64 {
    100.0
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigCapability {
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub profiles: Vec<MigProfileSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigProfileSpec {
    /// e.g. `1g.10gb`, `3g.40gb`.
    pub name: String,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// Legal start memory slices.
    pub starts: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceTypeSpec {
    pub gpu_model: String,
    pub gpu_count: u32,
    pub price_per_hour: f64,
    /// Seconds from launch request to a registered agent.
    pub launch_latency_s: f64,
    #[serde(default)]
    pub cpu_cores: u32,
    #[serde(default)]
    pub memory_gib: f64,
    /// The cloud account's limit on instances of this type, registered or launching; none
    /// is no limit. With a node provider, the fleet can grow only to these limits, and
    /// tenants share what it can hold by weight (see README, Tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<u32>,
}

/// Performance data of one model on one GPU model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProfileSpec {
    pub model: String,
    pub gpu_model: String,
    /// ParvaGPU-style table rows.
    #[serde(default)]
    pub points: Vec<ProfilePoint>,
    /// iGniter's workload coefficients (Sec. 3.1) of this model on this GPU model, as fitted
    /// from profiling (Eq. 11 and the power and L2 lines).
    #[serde(default)]
    pub igniter: Option<planner::perf::igniter::WorkloadCoeffs>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilePoint {
    /// MIG instance size in GPCs; 0 = whole GPU without MIG (MPS share below).
    pub gpcs: u8,
    pub batch: u32,
    /// MPS processes sharing the instance.
    #[serde(default = "one_u32")]
    pub processes: u32,
    /// MPS active thread percentage, for MPS-only points.
    #[serde(default)]
    pub mps_percent: Option<f64>,
    /// Throughput of one process, requests per second.
    pub throughput_rps: f64,
    pub latency_ms: f64,
    /// GPU compute utilisation in [0, 1] at this point (PARIS's utilisation curves).
    #[serde(default)]
    pub utilisation: Option<f64>,
}

fn one_u32() -> u32 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Model name; some ModelProfile must exist for it.
    pub model: String,
    pub slo: Slo,
    /// Restrict placement to these GPU models; empty = any profiled model.
    #[serde(default)]
    pub allowed_gpu_models: Vec<String>,
    /// Restrict autoscaling to these instance types; empty = any.
    #[serde(default)]
    pub allowed_instance_types: Vec<String>,
    /// Override the pool's provisioning strategy.
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// Batch-size distribution of arriving queries (PARIS); absent = fixed batches.
    #[serde(default)]
    pub batch_distribution: Option<BatchDistribution>,
    /// Within its tenant, the order in which services keep their place when its quota, or
    /// its fair share of a fleet that cannot grow, does not hold them all: higher first,
    /// then older. 0 (the default) to `MAX_SERVICE_PRIORITY`. Left out of the encoding when
    /// 0, so a Service without one encodes as before it existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
    /// SHA-256 digests (64 lower-case hex digits, as `gpuctl token` prints them) of the
    /// bearer tokens its endpoints accept (`authorization: Bearer <token>`); each token gets
    /// an equal share of the router's requests in flight. Empty (the default): the
    /// endpoints are open to anyone who can reach them. At most `MAX_INFERENCE_TOKENS`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inference_tokens: Vec<String>,
    /// The ServingRuntime that serves it; absent: each host's own launch template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Where its model lives, as its runtime understands it (a model repository, a model
    /// directory, a URI): `{model_uri}` in the runtime's arguments and environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_uri: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    pub latency_ms: f64,
    #[serde(default = "p99")]
    pub percentile: f64,
    /// Fixed request rate to provision for. Exactly one of this and `autoscaling`.
    #[serde(default)]
    pub request_rate: Option<f64>,
    #[serde(default)]
    pub autoscaling: Option<AutoscalingRange>,
}

fn p99() -> f64 {
    99.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingRange {
    pub min_rps: f64,
    pub max_rps: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    Igniter,
    Parvagpu,
    ExactMig,
    Paris,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "kebab-case")]
pub enum BatchDistribution {
    LogNormal { mu: f64, sigma: f64, max_batch: u32 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// host:port of the node agent.
    pub address: String,
    pub instance_type: String,
    #[serde(default)]
    pub gpus: Vec<NodeGpu>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGpu {
    pub uuid: String,
    pub model: String,
    #[serde(default)]
    pub mig_enabled: bool,
}

/// How an inference server is launched and watched (KServe's ServingRuntime): what the
/// agent runs for each process of a Service that names it. Cluster-scoped and written by
/// administrators only: it is a program every host runs, so a tenant must not choose it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingRuntimeSpec {
    /// What the server speaks to the router.
    #[serde(default)]
    pub protocol: RuntimeProtocol,
    /// The program, a path on the hosts or a name on their `PATH`.
    pub program: String,
    /// Its arguments; the placeholders in [`RUNTIME_PLACEHOLDERS`] are replaced per process.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables added to the agent's (placeholders replaced too). The GPU's
    /// (`CUDA_VISIBLE_DEVICES`, `CUDA_MPS_*`) and gpuplane's (`GPUPLANE_*`) are the agent's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Path of its Prometheus metrics on `{metrics_port}` (e.g. `/metrics`); absent: none
    /// are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_path: Option<String>,
    /// Expected time from launch to ready, s: what a restart costs until one is measured.
    pub cold_start_s: f64,
    /// How the server gets its model.
    #[serde(default)]
    pub model_control: ModelControl,
}

/// How a server gets its model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelControl {
    /// Its arguments load it at launch (Triton's `--load-model={model}`, MLServer's model
    /// directory).
    #[default]
    Launch,
    /// The server starts with no model and the agent loads it through the Open Inference
    /// Protocol's repository extension, `POST /v2/repository/models/{model}/load` on
    /// `{http_port}` (Triton's `--model-control-mode=explicit`, MLServer), retrying with
    /// back-off: a model that fails to load is logged with the server's own reason and
    /// tried again without paying the server's start again.
    Repository,
}

/// The placeholders of a ServingRuntime's arguments and environment. `{port}` is the
/// server's gRPC port, which the router forwards to; `{http_port}` and `{metrics_port}` are
/// given a port of their own only when used, so several servers on one host never collide.
pub const RUNTIME_PLACEHOLDERS: [&str; 10] =
    ["service", "model", "model_uri", "batch", "port", "http_port", "metrics_port", "gpcs", "mps_percent", "gpu_name"];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeProtocol {
    /// The Open Inference Protocol (KServe v2) over gRPC, `inference.GRPCInferenceService`:
    /// Triton, MLServer, KServe's servers and sim-infer.
    #[default]
    OpenInferenceGrpc,
}

impl RuntimeProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeProtocol::OpenInferenceGrpc => "open-inference-grpc",
        }
    }
}

/// Desired state of the fleet, as committed by the provisioner.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// Strategy that produced the plan, e.g. `parvagpu`.
    pub strategy: String,
    /// In (node, gpu_uuid) order (the state machine keeps it so), one entry per GPU.
    #[serde(default)]
    pub gpus: imbl::Vector<GpuAssignment>,
    /// In service order, one entry per service.
    #[serde(default)]
    pub services: imbl::Vector<ServicePrediction>,
    /// Digest of the planning inputs and fleet the provisioner computed this plan from
    /// (`crate::provision::inputs_digest`); empty for plans written otherwise. While it
    /// matches the current inputs the provisioner leaves the plan alone, so the shares the
    /// tuner adjusts in it are not reverted.
    #[serde(default)]
    pub inputs_digest: String,
    /// W3C `traceparent` of the proposal that committed the plan (set when the entry is
    /// applied, empty when traces are not exported): an agent's `agent.reconcile`
    /// continues that trace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trace_parent: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuAssignment {
    pub node: String,
    pub gpu_uuid: String,
    /// MIG instances (empty = the GPU is used whole, MPS only).
    #[serde(default)]
    pub mig_layout: Vec<MigPlacement>,
    #[serde(default)]
    pub workloads: Vec<WorkloadAssignment>,
    /// Workloads that left this GPU and keep serving here until what replaces them serves
    /// (make-before-break, `provision::handover`): the agent keeps their processes and
    /// starts nothing for them. Their shares and instances count against the GPU's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retiring: Vec<WorkloadAssignment>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigPlacement {
    pub profile: String,
    pub start: u8,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadAssignment {
    pub service: String,
    /// Index into `mig_layout`; absent when the GPU is not partitioned.
    #[serde(default)]
    pub mig_instance: Option<usize>,
    pub mps_percent: f64,
    pub batch: u32,
    #[serde(default = "one_u32")]
    pub processes: u32,
    /// Extra share of the warm shadow process (iGniter: min(10%, free)).
    #[serde(default)]
    pub shadow_mps_percent: f64,
    /// The service's tenant and that tenant's isolation when planned, so that the agent
    /// checks the boundaries itself (`planner::isolation`). Empty in a plan written without
    /// tenants: such a workload is not checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
    #[serde(default)]
    pub isolation: Isolation,
    /// The planner's predicted time of one batch of `batch` in this slot and share, in ms
    /// (0: not known, e.g. a plan written by hand). The agent's router prices this
    /// partition with it for ELSA. Left out of the encoding when 0.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub batch_ms: f64,
}

fn is_zero_ms(ms: &f64) -> bool {
    *ms == 0.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePrediction {
    pub service: String,
    pub capacity_rps: f64,
    pub latency_ms: f64,
    #[serde(default)]
    pub infeasible_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The provisioner compares the plan it computes with the one read back from the log;
    /// a float that does not survive JSON exactly would make every pass commit a "new" plan.
    #[test]
    fn floats_survive_json_exactly() {
        let plan = Spec::Plan(PlanSpec {
            strategy: "t".into(),
            gpus: Default::default(),
            services: vec![ServicePrediction {
                service: "s".into(),
                capacity_rps: 45.220681740555044,
                latency_ms: 66.36955023678524,
                infeasible_reason: None,
            }]
            .into(),
            inputs_digest: String::new(),
            trace_parent: String::new(),
        });
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(
            Spec::from_json(
                Kind::Plan,
                &serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&json).unwrap()["spec"]).unwrap()
            )
            .unwrap(),
            plan
        );
    }
}
