//! Validation of a ServingRuntime and of the runtime fields of a Service. A runtime's launch
//! is copied by every agent for every process, so each list and text is bounded; the
//! placeholders are checked here, so that a typo (`{prot}`) is refused at `apply` instead of
//! reaching a server's command line.

use super::limits::*;
use super::validate::{bounded_list, bounded_text, non_negative};
use super::{FieldError, ModelControl, ServingRuntimeSpec, RUNTIME_PLACEHOLDERS};

/// Environment variables the agent sets itself: the device and MPS settings of the plan and
/// gpuplane's own. A runtime that set them could escape its GPU partition.
fn reserved_env(name: &str) -> bool {
    name == "CUDA_VISIBLE_DEVICES" || name.starts_with("CUDA_MPS_") || name.starts_with("GPUPLANE_")
}

pub fn validate_serving_runtime(r: &ServingRuntimeSpec) -> Result<(), FieldError> {
    if r.program.trim().is_empty() {
        return Err(FieldError::invalid("spec.program", "must not be empty"));
    }
    bounded_text("spec.program", &r.program, MAX_RUNTIME_TEXT_LEN)?;
    bounded_list("spec.args", r.args.len(), MAX_RUNTIME_ARGS)?;
    for (i, arg) in r.args.iter().enumerate() {
        let field = format!("spec.args[{i}]");
        bounded_text(&field, arg, MAX_RUNTIME_TEXT_LEN)?;
        placeholders_known(&field, arg)?;
    }
    bounded_list("spec.env", r.env.len(), MAX_RUNTIME_ENV)?;
    for (name, value) in &r.env {
        let field = format!("spec.env.{name}");
        env_name(&field, name)?;
        bounded_text(&field, value, MAX_RUNTIME_TEXT_LEN)?;
        placeholders_known(&field, value)?;
    }
    if let Some(path) = &r.metrics_path {
        if !path.starts_with('/') || path.len() > 256 || !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(FieldError::invalid(
                "spec.metrics_path",
                format!("{path:?} must be an HTTP path: '/' then at most 255 printable characters, no spaces"),
            ));
        }
        let uses_port = r.args.iter().chain(r.env.values()).any(|a| a.contains("{metrics_port}"));
        if !uses_port {
            return Err(FieldError::invalid(
                "spec.metrics_path",
                "is set but no argument or variable passes {metrics_port}: the server would not serve its metrics where the agent reads them",
            ));
        }
    }
    let passes_http_port = r.args.iter().chain(r.env.values()).any(|a| a.contains("{http_port}"));
    if r.model_control == ModelControl::Repository && !passes_http_port {
        return Err(FieldError::invalid(
            "spec.model_control",
            "is repository but no argument or variable passes {http_port}: the agent loads the model on the server's HTTP port",
        ));
    }
    non_negative("spec.cold_start_s", r.cold_start_s, MAX_COLD_START_S)
}

/// A Service's `model_uri`: bounded text, not empty when given.
pub fn validate_model_uri(uri: &str) -> Result<(), FieldError> {
    if uri.trim().is_empty() {
        return Err(FieldError::invalid("spec.model_uri", "must not be empty when given"));
    }
    bounded_text("spec.model_uri", uri, MAX_MODEL_URI_LEN)
}

fn env_name(field: &str, name: &str) -> Result<(), FieldError> {
    let shaped = name.len() <= MAX_ENV_NAME_LEN
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !shaped {
        return Err(FieldError::invalid(
            field,
            format!("{name:?} is not a variable name: a letter or '_', then letters, digits or '_', at most {MAX_ENV_NAME_LEN}"),
        ));
    }
    if reserved_env(name) {
        return Err(FieldError::invalid(field, "is set by the agent from the plan (the GPU, MPS and gpuplane's own variables)"));
    }
    Ok(())
}

/// Every `{word}` (lower-case letters and '_') must be a known placeholder; other braces
/// (a JSON argument) pass as written.
fn placeholders_known(field: &str, text: &str) -> Result<(), FieldError> {
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        let Some(close) = rest.find('}') else { break };
        let word = &rest[..close];
        let is_word = !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        if is_word && !RUNTIME_PLACEHOLDERS.contains(&word) {
            return Err(FieldError::invalid(
                field,
                format!("{{{word}}} is not a placeholder; known: {}", RUNTIME_PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{validate_spec, Kind, Spec};

    fn runtime(json: serde_json::Value) -> Result<(), FieldError> {
        let spec = Spec::from_json(Kind::ServingRuntime, &json.to_string())?;
        validate_spec(&spec)
    }

    fn refused(json: serde_json::Value) -> FieldError {
        runtime(json).expect_err("refused")
    }

    #[test]
    fn a_triton_runtime_with_its_ports_and_metrics_is_accepted() {
        runtime(serde_json::json!({
            "program": "tritonserver",
            "args": ["--model-repository={model_uri}", "--load-model={model}", "--grpc-port={port}",
                     "--http-port={http_port}", "--metrics-port={metrics_port}", "--backend-config={\"a\":1}"],
            "env": {"TRITON_LOG": "{service}"},
            "metrics_path": "/metrics",
            "cold_start_s": 8
        }))
        .unwrap();
        runtime(serde_json::json!({
            "program": "tritonserver",
            "args": ["--model-control-mode=explicit", "--grpc-port={port}", "--http-port={http_port}"],
            "model_control": "repository",
            "cold_start_s": 8
        }))
        .unwrap();
    }

    #[test]
    fn bad_runtimes_are_refused_naming_the_field_and_the_reason() {
        let base = || serde_json::json!({"program": "srv", "args": ["--port={port}"], "cold_start_s": 1});
        let with = |key: &str, value: serde_json::Value| {
            let mut j = base();
            j[key] = value;
            j
        };
        let e = refused(with("args", serde_json::json!(["--grpc-port={prot}"])));
        assert_eq!(e.field, "spec.args[0]");
        assert!(e.reason.contains("{prot} is not a placeholder"), "{e:?}");
        let e = refused(with("env", serde_json::json!({"CUDA_VISIBLE_DEVICES": "0"})));
        assert_eq!(e.field, "spec.env.CUDA_VISIBLE_DEVICES");
        assert!(e.reason.contains("set by the agent"), "{e:?}");
        assert_eq!(refused(with("env", serde_json::json!({"CUDA_MPS_PIPE_DIRECTORY": "/tmp"}))).field, "spec.env.CUDA_MPS_PIPE_DIRECTORY");
        assert_eq!(refused(with("env", serde_json::json!({"1X": "a"}))).field, "spec.env.1X");
        assert_eq!(refused(with("program", serde_json::json!(" "))).field, "spec.program");
        assert_eq!(refused(with("cold_start_s", serde_json::json!(1e9))).field, "spec.cold_start_s");
        let e = refused(with("metrics_path", serde_json::json!("/metrics")));
        assert_eq!(e.field, "spec.metrics_path");
        assert!(e.reason.contains("{metrics_port}"), "{e:?}");
        assert_eq!(refused(with("metrics_path", serde_json::json!("metrics"))).field, "spec.metrics_path");
        let many: Vec<String> = (0..=MAX_RUNTIME_ARGS).map(|i| format!("-{i}")).collect();
        assert_eq!(refused(with("args", serde_json::json!(many))).field, "spec.args");
        assert_eq!(refused(with("args", serde_json::json!(["x".repeat(MAX_RUNTIME_TEXT_LEN + 1)]))).field, "spec.args[0]");
        assert_eq!(refused(with("args", serde_json::json!(["a\nb"]))).field, "spec.args[0]");
        let e = refused(with("model_control", serde_json::json!("repository")));
        assert_eq!(e.field, "spec.model_control");
        assert!(e.reason.contains("{http_port}"), "{e:?}");
        assert_eq!(refused(with("model_control", serde_json::json!("lazy"))).field, "spec.model_control");
        let e = refused(with("protocol", serde_json::json!("http")));
        assert_eq!(e.field, "spec.protocol");
    }
}
