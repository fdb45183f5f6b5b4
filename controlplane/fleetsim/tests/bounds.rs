//! `fleet-sim` refuses a run over its documented bounds (README, "What-if fleet simulator")
//! before it builds anything, with a message naming the flag, the value and the bound.

use std::process::Command;

fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-sim")).args(args).output().expect("fleet-sim runs");
    assert!(!out.status.success(), "{args:?} must be refused");
    assert!(out.stdout.is_empty(), "{args:?}: nothing simulated");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn runs_over_the_bounds_are_refused_naming_the_bound() {
    assert!(refused(&["--services", "2001"]).contains("--services must be in 1..=2000, got 2001"));
    assert!(refused(&["--services", "0"]).contains("--services must be in 1..=2000, got 0"));
    assert!(refused(&["--hours", "168.5"]).contains("--hours must be in (0, 168], got 168.5"));
    // At the service bound, a day is the most it may simulate.
    let e = refused(&["--services", "2000", "--tenants", "20", "--hours", "25"]);
    assert!(e.contains("2000 services for 25 simulated hours is over the bound of 172800000 service-seconds"), "{e}");
    assert!(refused(&["--failures-per-day", "1001"]).contains("--failures-per-day must be in [0, 1000], got 1001"));
    assert!(refused(&["--reconfigure-s", "3601"]).contains("--reconfigure-s must be at most 3600, got 3601"));
    assert!(refused(&["--target-saturation", "1.5"]).contains("--target-saturation must be in (0, 1], got 1.5"));
}
