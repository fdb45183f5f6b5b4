//! Running `chaos real` from a test: needs root (network namespaces); elsewhere the run must
//! be skipped explicitly with GPUPLANE_SKIP_PRIVILEGED_TESTS, never silently.

use std::process::Command;

use serde_json::Value;

/// Runs `chaos real --scenario SCENARIO --settle-seconds 1` and returns its JSON report and
/// what it printed, after checking what every scenario must show: it exited 0, lost no
/// acknowledged write, stayed linearizable, acknowledged writes, and saw no problem.
/// `None` when privileged tests are skipped.
pub fn run_scenario(scenario: &str) -> Option<(Value, String)> {
    if let Err(why) = chaos::real::net::available() {
        if std::env::var_os("GPUPLANE_SKIP_PRIVILEGED_TESTS").is_some() {
            eprintln!("skipped (GPUPLANE_SKIP_PRIVILEGED_TESTS is set): {why}");
            return None;
        }
        panic!("the chaos run needs network namespaces: {why}; set GPUPLANE_SKIP_PRIVILEGED_TESTS=1 to skip it explicitly");
    }
    // Builds the controller, agent and sim-infer binaries next to the `chaos` binary.
    tests::binary("controlplane");
    tests::binary("sim-infer");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["real", "--scenario", scenario, "--settle-seconds", "1", "--report-json"])
        .arg(&json)
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the chaos run failed:\n{printed}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["lost"], 0, "{printed}");
    assert_eq!(report["linearizable"], true, "{printed}");
    assert!(report["acknowledged_writes"].as_u64().unwrap() > 0, "{printed}");
    assert_eq!(report["problems"].as_array().unwrap().len(), 0, "{printed}");
    Some((report, printed))
}
