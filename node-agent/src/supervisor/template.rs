//! How a workload process is launched. The host's template (agent config) and a Service's
//! ServingRuntime come down to one launch spec, [`ServingRuntimeSpec`]; the template is
//! the default for services that name no runtime. Pure: a launch spec plus a process's
//! parameters give the exact program, arguments and environment, which tests check.

use crate::command::CommandSpec;
use model::{ModelControl, RuntimeProtocol, ServingRuntimeSpec};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The host's default launch, for services that name no ServingRuntime.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Template {
    /// NVIDIA Triton serving one model from a model repository.
    Triton {
        #[serde(default = "tritonserver")]
        program: String,
        model_repository: String,
    },
    /// Any command; the placeholders of `model::RUNTIME_PLACEHOLDERS` in the arguments
    /// are replaced per process.
    Command {
        program: String,
        #[serde(default)]
        args: Vec<String>,
    },
}

fn tritonserver() -> String {
    "tritonserver".into()
}

impl Template {
    /// The template as a launch spec.
    pub fn launch_spec(&self) -> ServingRuntimeSpec {
        match self {
            Template::Triton { program, model_repository } => triton(program, model_repository),
            Template::Command { program, args } => ServingRuntimeSpec {
                protocol: RuntimeProtocol::OpenInferenceGrpc,
                program: program.clone(),
                args: args.clone(),
                env: BTreeMap::new(),
                metrics_path: None,
                cold_start_s: 0.0,
                model_control: ModelControl::Launch,
            },
        }
    }
}

/// Triton serving one model of `repository`, loaded at start. Every port is set: Triton's
/// HTTP (8000), gRPC (8001) and metrics (8002) defaults would collide between the servers
/// of one host.
fn triton(program: &str, repository: &str) -> ServingRuntimeSpec {
    let args = [
        format!("--model-repository={repository}"),
        "--model-control-mode=explicit".into(),
        "--load-model={model}".into(),
        "--grpc-port={port}".into(),
        "--http-port={http_port}".into(),
        "--metrics-port={metrics_port}".into(),
        "--grpc-address=127.0.0.1".into(),
        "--http-address=127.0.0.1".into(),
        "--metrics-address=127.0.0.1".into(),
        "--backend-config=default-max-batch-size={batch}".into(),
    ];
    ServingRuntimeSpec {
        protocol: RuntimeProtocol::OpenInferenceGrpc,
        program: program.into(),
        args: args.into(),
        env: BTreeMap::new(),
        metrics_path: Some("/metrics".into()),
        cold_start_s: 10.0,
        model_control: ModelControl::Launch,
    }
}

/// Whether the launch passes `placeholder` (e.g. `{http_port}`) anywhere: a port is given
/// only to a server that is told it.
pub fn uses(spec: &ServingRuntimeSpec, placeholder: &str) -> bool {
    spec.args.iter().chain(spec.env.values()).any(|a| a.contains(placeholder))
}

/// What one process of a workload needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchParams {
    pub service: String,
    pub model: String,
    /// The Service's `model_uri` (empty: none).
    pub model_uri: String,
    pub batch: u32,
    /// Port the process serves gRPC on (the router forwards to it).
    pub port: u16,
    /// Its HTTP and metrics ports, when its launch passes them.
    pub http_port: Option<u16>,
    pub metrics_port: Option<u16>,
    /// GPCs of its MIG instance; 0 = whole GPU.
    pub gpcs: u8,
    /// The GPU or MIG device the process may see (`CUDA_VISIBLE_DEVICES`).
    pub device_uuid: String,
    /// The MPS client environment (pipe directory, active thread %).
    pub mps_env: Vec<(String, String)>,
    pub mps_percent: f64,
    /// The GPU's product name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub gpu_name: String,
}

fn expand(arg: &str, p: &LaunchParams) -> String {
    let port = |p: Option<u16>| p.map_or(String::new(), |p| p.to_string());
    arg.replace("{service}", &p.service)
        .replace("{model_uri}", &p.model_uri)
        .replace("{model}", &p.model)
        .replace("{batch}", &p.batch.to_string())
        .replace("{http_port}", &port(p.http_port))
        .replace("{metrics_port}", &port(p.metrics_port))
        .replace("{port}", &p.port.to_string())
        .replace("{gpcs}", &p.gpcs.to_string())
        .replace("{mps_percent}", &format!("{}", p.mps_percent))
        .replace("{gpu_name}", &p.gpu_name)
}

/// The command that starts one process of a workload. The device and MPS variables come
/// last, from the plan: a launch cannot set them (`model::validate_spec` refuses it).
pub fn launch_command(spec: &ServingRuntimeSpec, p: &LaunchParams) -> CommandSpec {
    let mut cmd = CommandSpec::new(&spec.program).args(spec.args.iter().map(|a| expand(a, p)));
    for (k, v) in &spec.env {
        cmd = cmd.env(k, expand(v, p));
    }
    cmd = cmd.env("CUDA_VISIBLE_DEVICES", &p.device_uuid);
    for (k, v) in &p.mps_env {
        cmd = cmd.env(k, v);
    }
    cmd.env("GPUPLANE_SERVICE", &p.service).env("GPUPLANE_BATCH", p.batch.to_string()).env("GPUPLANE_PORT", p.port.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> LaunchParams {
        LaunchParams {
            service: "web".into(),
            model: "resnet50".into(),
            model_uri: "/models".into(),
            batch: 8,
            port: 7101,
            http_port: Some(7102),
            metrics_port: Some(7103),
            gpcs: 3,
            device_uuid: "MIG-1234".into(),
            mps_env: vec![
                ("CUDA_MPS_PIPE_DIRECTORY".into(), "/var/lib/gpuplane/mps/MIG-1234/pipe".into()),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "40".into()),
            ],
            mps_percent: 40.0,
            gpu_name: "NVIDIA A100-SXM4-80GB".into(),
        }
    }

    fn env_of<'a>(c: &'a CommandSpec, key: &str) -> Option<&'a str> {
        c.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn generic_command_expands_placeholders_and_sets_the_cuda_environment() {
        let t = Template::Command {
            program: "sim-infer".into(),
            args: vec![
                "--model={model}".into(),
                "--listen=127.0.0.1:{port}".into(),
                "--batch={batch}".into(),
                "--gpcs={gpcs}".into(),
                "--gpu={gpu_name}".into(),
            ],
        };
        let c = launch_command(&t.launch_spec(), &params());
        assert_eq!(c.command_line(), "sim-infer --model=resnet50 --listen=127.0.0.1:7101 --batch=8 --gpcs=3 '--gpu=NVIDIA A100-SXM4-80GB'");
        assert_eq!(c.args.last().map(String::as_str), Some("--gpu=NVIDIA A100-SXM4-80GB"), "one argument despite the space");
        assert_eq!(env_of(&c, "CUDA_VISIBLE_DEVICES"), Some("MIG-1234"));
        assert_eq!(env_of(&c, "CUDA_MPS_PIPE_DIRECTORY"), Some("/var/lib/gpuplane/mps/MIG-1234/pipe"));
        assert_eq!(env_of(&c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("40"));
        assert_eq!(env_of(&c, "GPUPLANE_BATCH"), Some("8"));
    }

    #[test]
    fn triton_serves_one_model_with_each_of_its_ports_set() {
        let t = Template::Triton { program: "tritonserver".into(), model_repository: "/models".into() };
        let spec = t.launch_spec();
        assert!(uses(&spec, "{http_port}") && uses(&spec, "{metrics_port}"));
        let c = launch_command(&spec, &params());
        assert_eq!(
            c.command_line(),
            "tritonserver --model-repository=/models --model-control-mode=explicit --load-model=resnet50 --grpc-port=7101 \
             --http-port=7102 --metrics-port=7103 --grpc-address=127.0.0.1 --http-address=127.0.0.1 --metrics-address=127.0.0.1 \
             --backend-config=default-max-batch-size=8"
        );
        assert_eq!(env_of(&c, "CUDA_VISIBLE_DEVICES"), Some("MIG-1234"));
    }

    #[test]
    fn a_runtime_passes_its_environment_with_placeholders_and_the_plan_sets_the_device() {
        let spec = ServingRuntimeSpec {
            protocol: RuntimeProtocol::OpenInferenceGrpc,
            program: "mlserver".into(),
            args: vec!["start".into(), "{model_uri}".into()],
            env: [("MLSERVER_GRPC_PORT".to_string(), "{port}".to_string()), ("MLSERVER_METRICS_PORT".into(), "{metrics_port}".into())]
                .into(),
            metrics_path: Some("/metrics".into()),
            cold_start_s: 5.0,
            model_control: ModelControl::Launch,
        };
        let c = launch_command(&spec, &params());
        assert_eq!(c.command_line(), "mlserver start /models");
        assert_eq!(env_of(&c, "MLSERVER_GRPC_PORT"), Some("7101"));
        assert_eq!(env_of(&c, "MLSERVER_METRICS_PORT"), Some("7103"));
        assert_eq!(env_of(&c, "CUDA_VISIBLE_DEVICES"), Some("MIG-1234"));
        assert_eq!(env_of(&c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("40"));
        assert!(!uses(&spec, "{http_port}"), "no HTTP port for a server not told one");
    }

    #[test]
    fn templates_refuse_unknown_fields() {
        let err = toml::from_str::<Template>("kind = \"command\"\nprogram = \"x\"\nargz = []").unwrap_err();
        assert!(err.to_string().contains("argz"), "{err}");
    }
}
