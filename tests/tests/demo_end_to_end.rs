//! The control loops end to end, through `gpuctl demo` (real processes: 3 controllers, 5 node
//! agents on simulated A100, H100, V100 and T4 GPUs, their inference servers, and agents the
//! simulated cloud launches): the workload converges; under load at the SLO rates at least
//! 99% of per-second windows meet every service's p99 SLO, also across a leader kill; a
//! failed host's services are served again within 2 provisioning intervals; a load step
//! launches the cheapest adequate instance type and the drop scales in after the cool-down.

use devcluster::demo::scenario::INSTANCE_TYPES;
use std::process::Command;
use tests::binary;

fn fraction_met(rows: &serde_json::Value) -> Vec<(String, u64, u64)> {
    rows.as_array()
        .expect("SLO rows")
        .iter()
        .map(|r| (r["service"].as_str().unwrap().to_string(), r["windows_met"].as_u64().unwrap(), r["windows"].as_u64().unwrap()))
        .collect()
}

#[test]
fn the_demo_meets_its_slos_through_a_leader_kill_a_host_failure_and_a_load_step() {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("report.json");
    let out = Command::new(binary("gpuctl"))
        .args(["demo", "--steady-seconds", "20", "--dir"])
        .arg(dir.path().join("cluster"))
        .arg("--report-json")
        .arg(&report_path)
        .output()
        .expect("gpuctl demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "gpuctl demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();

    // Every service, steady and around the leader kill: at least 99% of windows meet the SLO.
    for phase in ["steady", "during_failover"] {
        let rows = fraction_met(&report[phase]);
        assert_eq!(rows.len(), 6, "{phase}: every service reported");
        for (service, met, windows) in rows {
            assert!(windows >= 8, "{phase}: {service} has only {windows} windows\n{stdout}");
            assert!(met as f64 >= 0.99 * windows as f64, "{phase}: {service} met {met}/{windows} windows\n{stdout}");
        }
    }
    assert!(report["failover_s"].as_f64().unwrap() > 0.0);

    // The failed host's services are served again within two provisioning intervals.
    let interval = report["provision_interval_s"].as_f64().unwrap();
    let reserved = report["node_reserved_s"].as_f64().unwrap();
    assert!(reserved <= 2.0 * interval, "re-served after {reserved} s, interval {interval} s\n{stdout}");

    // The load step launched the cheapest adequate type: the cheapest per GPU of its model.
    let launched = report["scale_out_instance_type"].as_str().unwrap();
    let model = INSTANCE_TYPES.iter().find(|t| t.0 == launched).map(|t| t.1).expect("a known instance type");
    let cheapest =
        INSTANCE_TYPES.iter().filter(|t| t.1 == model).min_by(|a, b| (a.3 / f64::from(a.2)).total_cmp(&(b.3 / f64::from(b.2)))).unwrap().0;
    assert_eq!(launched, cheapest, "{stdout}");
    // Scale-in waits for the cool-down.
    assert!(report["scale_in_s"].as_f64().unwrap() >= report["cooldown_s"].as_f64().unwrap(), "{stdout}");
    assert!(report["change_convergence_s"].as_f64().unwrap() > 0.0);
}
