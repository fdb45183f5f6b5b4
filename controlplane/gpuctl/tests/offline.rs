//! gpuctl's commands that need no cluster, run as a user runs them: the binary itself.
//!
//! Being an integration test of this package also makes `cargo test --workspace` build the
//! `gpuctl` binary (cargo builds a package's binaries only for its integration tests); the
//! end-to-end tests in `tests/` find it there (`tests::binary`).

use std::path::Path;
use std::process::{Command, Output};

fn gpuctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuctl")).args(args).output().unwrap()
}

fn sample() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/sample-cluster.yaml").to_string_lossy().into_owned()
}

fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line expected: {err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

#[test]
fn plan_runs_a_manifest_offline_and_refuses_a_broken_one_in_one_line() {
    let out = gpuctl(&["plan", "-f", &sample()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("acme-resnet") && text.contains("per hour"), "{text}");
    let json = gpuctl(&["plan", "-f", &sample(), "--strategy", "exact-mig", "-o", "json"]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(value["cost_per_hour"].as_f64().unwrap() > 0.0);
    assert!(value["plan"]["infeasible"].as_array().unwrap().is_empty());

    // A Service whose tenant the manifest does not define.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "kind: Service\nname: orphan\ntenant: acme\nspec:\n  model: resnet50\n  slo: {latency_ms: 50, request_rate: 100}\n",
    )
    .unwrap();
    let err = one_error_line(&gpuctl(&["plan", "-f", bad.to_str().unwrap()]));
    assert!(err.contains("Service \"orphan\""), "{err}");
}

#[test]
fn token_prints_a_fresh_token_and_the_hash_line_the_controllers_check_it_against() {
    let tokens: Vec<(String, String)> = (0..2)
        .map(|_| {
            let out = gpuctl(&["token", "tenant:acme"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8(out.stdout).unwrap();
            let mut lines = text.lines();
            let token = lines.next().unwrap().strip_prefix("token: ").unwrap().to_string();
            (token, lines.next().unwrap().to_string())
        })
        .collect();
    for (token, line) in &tokens {
        assert_eq!(token.len(), 64, "{token}");
        let expected = format!("tokens file, under [tenants]: acme = \"{}\"", controlplane::security::hash_token(token));
        assert_eq!(line, &expected);
    }
    assert_ne!(tokens[0].0, tokens[1].0, "two calls gave the same token");

    let err = one_error_line(&gpuctl(&["token", "acme"]));
    assert!(err.contains("expected tenant:NAME or admin:NAME") && err.contains("\"acme\""), "{err}");
}

#[test]
fn commands_that_need_a_controller_say_how_to_reach_one() {
    // No CA and no --insecure: nothing is dialled, the error says what to give.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .env_remove("GPUPLANE_CA")
        .env_remove("GPUPLANE_INSECURE")
        .args(["get", "services"])
        .output()
        .unwrap();
    let err = one_error_line(&out);
    assert!(err.contains("--ca") && err.contains("--insecure"), "{err}");
}

/// `sample-cluster.yaml` and `n` more services: a plan whose output is far larger than a
/// pipe's buffer.
fn many_services(dir: &Path, n: usize) -> String {
    let mut text = std::fs::read_to_string(sample()).unwrap();
    for i in 0..n {
        text.push_str(&format!(
            "---\nkind: Service\nname: svc-{i}\ntenant: globex\nspec:\n  model: resnet50\n  slo: {{latency_ms: 80, request_rate: 20}}\n"
        ));
    }
    let path = dir.join("many.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn output_into_a_pipe_closed_early_ends_quietly() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let manifest = many_services(dir.path(), 2500);
    for output in ["table", "json", "yaml"] {
        let args = ["plan", "-f", &manifest, "-o", output];
        let whole = gpuctl(&args);
        assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
        assert!(whole.stdout.len() > 128 * 1024, "-o {output}: {} bytes do not outgrow a pipe", whole.stdout.len());

        // As `gpuctl plan ... | head -1`: the reader takes one line and goes away while
        // gpuctl is still writing. println! panicked here ("failed printing to stdout").
        let mut child =
            Command::new(env!("CARGO_BIN_EXE_gpuctl")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        assert!(!first.is_empty());
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked") && err.is_empty(), "-o {output}: {err}");
        assert!(status.success(), "-o {output}: {status:?}");
    }

    // As `gpuctl --help | true`: the reader is gone before anything is written.
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuctl")).arg("--help").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_deep_or_nan_manifest_is_refused_in_one_line_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    // 20-24 s of CPU before (libyaml is quadratic in the depth).
    for (name, deep) in [("flow.yaml", "[".repeat(100_000)), ("map.yaml", "{a: ".repeat(100_000)), ("block.yaml", "- ".repeat(100_000))] {
        let path = write(name, &format!("kind: Tenant\nname: acme\nspec:\n  {deep}\n"));
        let err = one_error_line(&gpuctl(&["plan", "-f", &path]));
        // The pre-pass's refusal: the YAML parser never saw it.
        assert!(err.contains(&format!("{name}: document 1, line 4: nested more than 64 levels deep")), "{err}");
    }
    // `.nan` was a null: no quota.
    let path = write("nan.yaml", "kind: Tenant\nname: acme\nspec: {max_gpus: .nan}\n");
    let err = one_error_line(&gpuctl(&["plan", "-f", &path]));
    assert!(err.contains("document 1 (Tenant \"acme\"): spec.max_gpus: must be a finite number (got .nan)"), "{err}");
}
