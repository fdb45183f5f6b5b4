//! Real controller processes on loopback: kill -9 of the leader, restart, corrupt data dirs,
//! and gpuctl's behaviour as a user sees it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use controlplane::storage::FORMAT_VERSION;
use tests::{binary, free_addr, gpuctl, Cluster, Proc};

fn write_manifest(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn sample() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/sample-cluster.yaml").to_string_lossy().into_owned()
}

fn service_manifest(name: &str) -> String {
    format!("kind: Service\nname: {name}\ntenant: acme\nspec:\n  model: resnet50\n  slo: {{latency_ms: 50, request_rate: 100}}\n")
}

#[test]
fn kill_9_of_the_leader_loses_no_acknowledged_write() {
    let mut cluster = Cluster::start();
    cluster.leader();
    let out = gpuctl(&cluster.servers(), &["apply", "-f", &sample()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let leader = cluster.leader();
    let m = write_manifest(cluster.dir.path(), "before.yaml", &service_manifest("acked-before-kill"));
    let out = gpuctl(&cluster.servers(), &["apply", "-f", &m]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cluster.controllers.kill9(leader);

    let new_leader = cluster.leader();
    assert_ne!(new_leader, leader);
    let m = write_manifest(cluster.dir.path(), "after.yaml", &service_manifest("after-kill"));
    let out = gpuctl(&cluster.servers(), &["apply", "-f", &m]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = gpuctl(&cluster.servers(), &["get", "service", "acked-before-kill", "-o", "json"]);
    assert!(out.status.success(), "acknowledged write lost: {}", String::from_utf8_lossy(&out.stderr));

    // The killed node restarts from its data dir and rejoins.
    cluster.controllers.start(leader, true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = gpuctl(&[cluster.controllers.addr(leader).to_string()], &["get", "service", "after-kill", "--stale"]);
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "restarted node did not catch up");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn corrupt_or_foreign_data_dir_refuses_to_start_and_is_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let run = |data: &Path| {
        Command::new(binary("controlplane"))
            .args(["--insecure", "--node-id", "1", "--listen", &addr, "--data-dir"])
            .arg(data)
            .args(["--bootstrap", "--peer", &format!("1={addr}")])
            .output()
            .unwrap()
    };
    // A valid data dir first, made by a node that ran and stopped.
    let data = dir.path().join("node");
    {
        let mut cmd = Command::new(binary("controlplane"));
        cmd.args(["--insecure", "--node-id", "1", "--listen", &addr, "--data-dir"]).arg(&data).args([
            "--bootstrap",
            "--peer",
            &format!("1={addr}"),
        ]);
        let mut p = Proc::spawn(&mut cmd, &dir.path().join("first.log")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !gpuctl(std::slice::from_ref(&addr), &["cluster", "status"]).status.success() {
            assert!(Instant::now() < deadline, "node did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        p.kill9();
    }
    let format_file = data.join("FORMAT");
    let original = std::fs::read_to_string(&format_file).unwrap();

    for (what, contents, expect) in [
        // A data dir two versions back (the one before is upgraded in place: storage tests),
        // and one of a newer binary.
        (
            "old version",
            original.replace(&format!("format_version={FORMAT_VERSION}"), &format!("format_version={}", FORMAT_VERSION - 2)),
            &*format!("format version {}, this binary reads version {FORMAT_VERSION}", FORMAT_VERSION - 2),
        ),
        (
            "newer version",
            original.replace(&format!("format_version={FORMAT_VERSION}"), &format!("format_version={}", FORMAT_VERSION + 1)),
            &*format!("format version {} is newer than this binary's {FORMAT_VERSION}", FORMAT_VERSION + 1),
        ),
        ("truncated", original[..original.len() / 2].to_string(), "FORMAT"),
        ("other node", original.replace("node_id=1", "node_id=2"), "belongs to node 2"),
    ] {
        std::fs::write(&format_file, &contents).unwrap();
        let out = run(&data);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: must not start");
        assert!(stderr.contains(expect) && stderr.contains("refusing to start"), "{what}: {stderr}");
        assert_eq!(std::fs::read_to_string(&format_file).unwrap(), contents, "{what}: FORMAT must be left as it was");
    }
    std::fs::write(&format_file, &original).unwrap();

    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("postgresql.conf"), "x").unwrap();
    let out = run(&foreign);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a gpuplane controller data dir"));
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 1, "nothing may be written into a foreign dir");
}

#[test]
fn gpuctl_prints_one_clear_line_and_exits_non_zero_on_bad_input() {
    let cluster = Cluster::start();
    cluster.leader();
    let dir = cluster.dir.path();
    let out = gpuctl(&cluster.servers(), &["apply", "-f", &sample()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cases = [
        ("malformed.yaml", "kind: Service\nname: [oops\n", "malformed YAML"),
        (
            "negative.yaml",
            &service_manifest("neg").replace("request_rate: 100", "request_rate: -1"),
            "spec.slo.request_rate: must be in [0.001, 10000000] (got -1)",
        ),
        ("unknown.yaml", &service_manifest("unk").replace("model: resnet50", "model: nope"), "NotFound: spec.model"),
        ("field.json", r#"{"kind":"Tenant","name":"x","spec":{"colour":"red"}}"#, "unknown field `colour`"),
    ];
    for (file, text, expect) in cases {
        let m = write_manifest(dir, file, text);
        let out = gpuctl(&cluster.servers(), &["apply", "-f", &m]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{file}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{file}: one line expected: {stderr}");
        assert!(stderr.contains(expect), "{file}: {stderr}");
    }
    let out = gpuctl(&["127.0.0.1:1".to_string()], &["get", "services"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}

/// `gpuctl certs` makes a CA and certificates; a controller refuses to start with neither
/// TLS settings nor --insecure, serves mTLS with them, and gpuctl gets in only with an
/// identity.
#[test]
fn gpuctl_certs_secure_a_controller_and_gpuctl_needs_an_identity() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let gpuctl_raw = |args: &[&str]| Command::new(binary("gpuctl")).args(args).output().unwrap();
    let certs_arg = certs.to_str().unwrap();
    let make = ["certs", "--out", certs_arg, "--controllers", "1", "--nodes", "n1", "--admin", "ops"];
    let out = gpuctl_raw(&make);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(certs.join("admin-ops.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "keys are private");
    }
    // The CA is not replaced by accident.
    let again = gpuctl_raw(&make);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--force"));

    let addr = free_addr();
    let data = dir.path().join("node");
    let base = ["--node-id", "1", "--listen", &addr, "--bootstrap", "--peer"];
    let peer = format!("1={addr}");
    let out = Command::new(binary("controlplane")).args(base).arg(&peer).arg("--data-dir").arg(&data).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("security.ca") && stderr.contains("--insecure"), "{stderr}");

    let file = |name: &str| certs.join(name).to_str().unwrap().to_string();
    let mut cmd = Command::new(binary("controlplane"));
    cmd.args(base).arg(&peer).arg("--data-dir").arg(&data);
    cmd.args(["--ca", &file("ca.pem"), "--cert", &file("controller-1.pem"), "--key", &file("controller-1.key")]);
    let _controller = Proc::spawn(&mut cmd, &dir.path().join("controller.log")).unwrap();
    let admin = ["--ca", &file("ca.pem"), "--cert", &file("admin-ops.pem"), "--key", &file("admin-ops.key")];
    let as_admin = |args: &[&str]| Command::new(binary("gpuctl")).arg("--server").arg(&addr).args(admin).args(args).output().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !as_admin(&["cluster", "status"]).status.success() {
        assert!(Instant::now() < deadline, "the controller did not serve its admin over mTLS");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = as_admin(&["apply", "-f", &sample()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Only the CA: TLS works, but there is no identity.
    let anonymous = gpuctl_raw(&["--server", &addr, "--ca", &file("ca.pem"), "get", "gpumodels"]);
    assert!(!anonymous.status.success() && String::from_utf8_lossy(&anonymous.stderr).contains("Unauthenticated"));
    // Without the CA gpuctl refuses to guess; plaintext gets no answer.
    let bare = gpuctl_raw(&["--server", &addr, "get", "gpumodels"]);
    assert!(!bare.status.success() && String::from_utf8_lossy(&bare.stderr).contains("--ca"));
    assert!(!gpuctl(std::slice::from_ref(&addr), &["get", "gpumodels"]).status.success());
}

/// SIGTERM, as an orchestrator stops a controller in a rolling restart, makes a leader hand
/// leadership to a follower before it exits: it exits cleanly, its log names the new
/// leader, and that follower leads.
#[test]
fn a_leader_stopped_with_sigterm_hands_over_before_it_exits() {
    let mut cluster = Cluster::start();
    let out = gpuctl(&cluster.servers(), &["apply", "-f", &sample()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let leader = cluster.leader();
    let exited = cluster.controllers.terminate(leader, Duration::from_secs(20));
    assert!(exited.is_some_and(|s| s.success()), "controller {leader} did not exit cleanly: {exited:?}");
    let log =
        devcluster::process::strip_ansi(&std::fs::read_to_string(cluster.dir.path().join(format!("controller-{leader}.log"))).unwrap());
    let line = log.lines().find(|l| l.contains("handed leadership over before stopping")).unwrap_or_else(|| panic!("no hand-over:\n{log}"));
    let new_leader: u64 =
        line.split("leader=").nth(1).and_then(|rest| rest.split_whitespace().next()).and_then(|id| id.parse().ok()).unwrap();
    assert_ne!(new_leader, leader, "{line}");
    assert_eq!(cluster.leader(), new_leader);
    // The cluster takes writes without the stopped controller.
    let m = write_manifest(cluster.dir.path(), "after.yaml", &service_manifest("after-handover"));
    let out = gpuctl(&cluster.servers(), &["apply", "-f", &m]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
