//! Workload templates: how a workload process is launched. Pure: a template plus a
//! workload gives the exact program, arguments and environment, which tests check.

use crate::command::CommandSpec;
use serde::Deserialize;

/// How the agent launches a workload's inference server.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Template {
    /// NVIDIA Triton serving one model from a model repository.
    Triton {
        #[serde(default = "tritonserver")]
        program: String,
        model_repository: String,
    },
    /// Any command. `{service}`, `{model}`, `{batch}`, `{port}`, `{gpcs}`, `{mps_percent}`
    /// and `{gpu_name}` (the GPU's product name) in the arguments are replaced per workload.
    Command {
        program: String,
        #[serde(default)]
        args: Vec<String>,
    },
}

fn tritonserver() -> String {
    "tritonserver".into()
}

/// What one process of a workload needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchParams {
    pub service: String,
    pub model: String,
    pub batch: u32,
    /// Port the process serves on (the router forwards to it).
    pub port: u16,
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

/// Placeholders, so a template can pass anything it needs on the command line.
fn expand(arg: &str, p: &LaunchParams) -> String {
    arg.replace("{service}", &p.service)
        .replace("{model}", &p.model)
        .replace("{batch}", &p.batch.to_string())
        .replace("{port}", &p.port.to_string())
        .replace("{gpcs}", &p.gpcs.to_string())
        .replace("{mps_percent}", &format!("{}", p.mps_percent))
        .replace("{gpu_name}", &p.gpu_name)
}

/// The command that starts one process of a workload.
pub fn launch_command(template: &Template, p: &LaunchParams) -> CommandSpec {
    let mut cmd = match template {
        Template::Triton { program, model_repository } => CommandSpec::new(program)
            .arg(format!("--model-repository={model_repository}"))
            .arg(format!("--load-model={}", p.model))
            .arg("--model-control-mode=explicit")
            .arg(format!("--grpc-port={}", p.port))
            // Triton's HTTP and metrics ports default to fixed numbers; several servers on
            // one host must not collide, so they are turned off (the router speaks gRPC).
            .arg("--allow-http=false")
            .arg("--allow-metrics=false")
            .arg(format!("--backend-config=default-max-batch-size={}", p.batch)),
        Template::Command { program, args } => CommandSpec::new(program).args(args.iter().map(|a| expand(a, p))),
    };
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
            batch: 8,
            port: 7101,
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
        let c = launch_command(&t, &params());
        assert_eq!(c.command_line(), "sim-infer --model=resnet50 --listen=127.0.0.1:7101 --batch=8 --gpcs=3 '--gpu=NVIDIA A100-SXM4-80GB'");
        assert_eq!(c.args.last().map(String::as_str), Some("--gpu=NVIDIA A100-SXM4-80GB"), "one argument despite the space");
        assert_eq!(env_of(&c, "CUDA_VISIBLE_DEVICES"), Some("MIG-1234"));
        assert_eq!(env_of(&c, "CUDA_MPS_PIPE_DIRECTORY"), Some("/var/lib/gpuplane/mps/MIG-1234/pipe"));
        assert_eq!(env_of(&c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("40"));
        assert_eq!(env_of(&c, "GPUPLANE_BATCH"), Some("8"));
    }

    #[test]
    fn triton_serves_one_model_on_the_workload_port() {
        let t = Template::Triton { program: "tritonserver".into(), model_repository: "/models".into() };
        let c = launch_command(&t, &params());
        assert_eq!(
            c.command_line(),
            "tritonserver --model-repository=/models --load-model=resnet50 --model-control-mode=explicit --grpc-port=7101 \
             --allow-http=false --allow-metrics=false --backend-config=default-max-batch-size=8"
        );
        assert_eq!(env_of(&c, "CUDA_VISIBLE_DEVICES"), Some("MIG-1234"));
    }

    #[test]
    fn templates_refuse_unknown_fields() {
        let err = toml::from_str::<Template>("kind = \"command\"\nprogram = \"x\"\nargz = []").unwrap_err();
        assert!(err.to_string().contains("argz"), "{err}");
    }
}
