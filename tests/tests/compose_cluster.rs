//! The compose cluster of deploy/compose on this machine's Docker engine, checked by the
//! same script a person runs (deploy/ci/compose-check.sh): a from-scratch image, 3
//! controllers and 3 simulated agents; gpuctl applies and reads; the leader's container is
//! killed and the cluster goes on serving. The image takes the binaries this test suite's
//! build made, dynamically linked, with their libraries (build-image.sh's
//! GPUPLANE_PREBUILT): building static ones would compile every crate again. Needs a Docker
//! engine; set GPUPLANE_SKIP_COMPOSE_CHECK=1 to skip it deliberately on a machine without one.

use std::path::Path;
use std::process::Command;

#[test]
fn the_compose_cluster_comes_up_and_survives_the_leader_container_being_killed() {
    if std::env::var_os("GPUPLANE_SKIP_COMPOSE_CHECK").is_some_and(|v| v == "1") {
        eprintln!("GPUPLANE_SKIP_COMPOSE_CHECK=1: compose check skipped");
        return;
    }
    let engine = Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]).output();
    assert!(
        engine.as_ref().is_ok_and(|o| o.status.success()),
        "no Docker engine reachable (docker info: {engine:?}); this test needs one, or GPUPLANE_SKIP_COMPOSE_CHECK=1"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ci/compose-check.sh");
    // Built and found the one way the other end-to-end tests build and find them.
    let controlplane = tests::binary("controlplane");
    let binaries = controlplane.parent().expect("the binaries' directory");
    let status = Command::new("bash").arg(&script).env("GPUPLANE_PREBUILT", binaries).status().expect("running compose-check.sh");
    assert!(status.success(), "{} failed ({status}); its output above says which check", script.display());
}
