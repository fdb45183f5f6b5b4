//! Golden files of what a controller persists and replicates (`controlplane/golden/format-N/`,
//! one directory per data-dir format version, `storage::FORMAT_VERSION`): log entries as the
//! log stores them and AppendEntries carries them, a vote, and the snapshot those entries
//! make. Every directory is read by this build and gives the state checked in beside it;
//! the current format's files are also what this build writes, byte for byte. A change to
//! an encoding fails here: it is either compatible (a field added with a default and left
//! out when unset, as `GpuAssignment.retiring` was), or it needs a new format version and a
//! new directory, with the old one kept and still read. The replay is also a check that
//! apply is deterministic across builds: a change to a rule that would apply an entry
//! already admitted differently (a bound lowered, a check added at apply) changes the
//! state the entries give and fails here.
//!
//! `GPUPLANE_BLESS_GOLDEN=1 cargo test -p controlplane golden` writes the current format's
//! directory from [`scenario`] when it does not exist yet; review the files and commit them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, Membership};

use super::*;
use crate::resources::*;
use crate::state::tests::{gpu_model, plan, put, service};
use crate::state::{Command, Proposal, Request, WriteMode};
use crate::storage::{open_data_dir, FORMAT_VERSION};

const ENTRIES: &str = "entries.jsonl";
const SNAPSHOT: &str = "snapshot.json";
const VOTE: &str = "vote.json";

fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn entry(index: u64, payload: EntryPayload<Proposal, NodeId, Node>) -> Entry {
    Entry { log_id: crate::raft::types::log_id(2, index), payload }
}

fn normal(index: u64, requests: Vec<Request>) -> Entry {
    entry(index, EntryPayload::Normal(Proposal::new(requests).unwrap()))
}

/// Every kind of entry and of command, each resource kind, and the optional fields that
/// stay out of the stored form when unset (a member's peer address, a plan's retiring
/// workloads) once set.
fn scenario() -> Vec<Entry> {
    let members = BTreeMap::from([
        (1, Node::new("c-1:7400")),
        (2, Node::with_peer_addr("c-2:7400", Some("c-2:7401".into()))),
        (3, Node::new("c-3:7400")),
    ]);
    let profile = Spec::ModelProfile(ModelProfileSpec {
        model: "resnet50".into(),
        gpu_model: "A100-80GB".into(),
        points: vec![serde_json::from_value(serde_json::json!({"gpcs": 1, "batch": 8, "throughput_rps": 400, "latency_ms": 18})).unwrap()],
        igniter: Default::default(),
    });
    let instance_type = Spec::InstanceType(InstanceTypeSpec {
        gpu_model: "A100-80GB".into(),
        gpu_count: 8,
        price_per_hour: 32.0,
        launch_latency_s: 120.0,
        cpu_cores: 96,
        memory_gib: 1152.0,
        max_instances: Some(10),
    });
    let Spec::Plan(mut handing_over) = plan(&[("n1", "G1", "web", 8), ("n2", "G2", "web", 4)]) else { unreachable!() };
    handing_over.gpus[1].retiring = vec![WorkloadAssignment { mps_percent: 40.0, ..handing_over.gpus[1].workloads[0].clone() }];
    let Spec::Plan(moved) = plan(&[("n1", "G1", "web", 8), ("n2", "G2", "web", 16)]) else { unreachable!() };
    let patch = handing_over.diff(&moved);
    let status = StatusJson::of(&serde_json::json!({"provisioned_rps": 120.0})).unwrap();
    let command = |id: &str, command: Command| Request { request_id: id.into(), command, trace_parent: None };
    vec![
        entry(1, EntryPayload::Blank),
        entry(2, EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1, 2, 3])], members).unwrap())),
        normal(
            3,
            vec![
                put("t", "acme", "", Spec::Tenant(TenantSpec::default()), WriteMode::Create, 0),
                put("g", "A100-80GB", "", gpu_model(), WriteMode::Create, 0),
            ],
        ),
        normal(
            4,
            vec![command(
                "b",
                Command::Batch {
                    puts: vec![
                        put("", "resnet50-a100", "", profile, WriteMode::Create, 0).command,
                        put("", "a100-8x", "", instance_type, WriteMode::Create, 0).command,
                    ],
                },
            )],
        ),
        normal(5, vec![put("s", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)]),
        normal(6, vec![put("p", "current", "", Spec::Plan(handing_over), WriteMode::Create, 0)]),
        normal(7, vec![command("q", Command::PatchPlan { name: "current".into(), patch, expected_version: 6 })]),
        normal(
            8,
            vec![command(
                "st",
                Command::PutStatus { kind: Kind::Service, name: "web".into(), status: status.clone(), expected_version: 0 },
            )],
        ),
        normal(
            9,
            vec![
                command(
                    "",
                    Command::PutStatuses { kind: Kind::Service, statuses: vec![crate::state::StatusPut { name: "web".into(), status }] },
                ),
                put("s2", "batch", "acme", service("resnet50", 200.0), WriteMode::Create, 0),
            ],
        ),
        normal(10, vec![command("d", Command::Delete { kind: Kind::Service, name: "batch".into(), expected_version: 0 })]),
    ]
}

fn vote() -> Vote {
    Vote::new_committed(2, 1)
}

/// Applies `entries` to an empty state machine; the snapshot it then builds.
async fn snapshot_of(entries: Vec<Entry>) -> (Vec<crate::state::CommandResult>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachineStore::open(Arc::new(open_data_dir(dir.path(), 1).unwrap()), false).unwrap();
    let results = sm.apply_entries(entries.into_iter()).into_iter().flatten().collect();
    (results, sm.build_snapshot().await.unwrap().snapshot.into_inner())
}

fn encode_entries(entries: &[Entry]) -> String {
    entries.iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect()
}

#[tokio::test]
async fn every_golden_format_is_read_and_gives_its_state_and_the_current_one_is_written_byte_for_byte() {
    let current = golden_root().join(format!("format-{FORMAT_VERSION}"));
    if std::env::var_os("GPUPLANE_BLESS_GOLDEN").is_some() && !current.exists() {
        let entries = scenario();
        let (results, snapshot) = snapshot_of(entries.clone()).await;
        assert!(results.iter().all(Result::is_ok), "the scenario applies: {results:?}");
        std::fs::create_dir_all(&current).unwrap();
        std::fs::write(current.join(ENTRIES), encode_entries(&entries)).unwrap();
        std::fs::write(current.join(SNAPSHOT), snapshot).unwrap();
        std::fs::write(current.join(VOTE), serde_json::to_string(&vote()).unwrap()).unwrap();
    }
    assert!(
        current.join(ENTRIES).exists(),
        "no golden files for format {FORMAT_VERSION} in {}: bless them (see this module)",
        current.display()
    );
    let mut formats: Vec<PathBuf> = std::fs::read_dir(golden_root()).unwrap().map(|d| d.unwrap().path()).collect();
    formats.sort();
    for dir in formats {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()));
        let text = read(ENTRIES);
        let entries: Vec<Entry> = text
            .lines()
            .enumerate()
            .map(|(i, line)| serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: entry {}: {e}", dir.display(), i + 1)))
            .collect();
        let golden_snapshot = read(SNAPSHOT);
        let (results, snapshot) = snapshot_of(entries.clone()).await;
        assert!(results.iter().all(Result::is_ok), "{}: every entry applies: {results:?}", dir.display());
        assert_eq!(String::from_utf8(snapshot).unwrap(), golden_snapshot, "{}: the entries give the state checked in", dir.display());
        // The snapshot itself installs, and gives the same state.
        let installed = tempfile::tempdir().unwrap();
        let mut sm = StateMachineStore::open(Arc::new(open_data_dir(installed.path(), 1).unwrap()), false).unwrap();
        let payload: SnapshotPayload =
            serde_json::from_str(&golden_snapshot).unwrap_or_else(|e| panic!("{}: snapshot: {e}", dir.display()));
        let meta = SnapshotMeta { last_log_id: payload.last_applied, last_membership: payload.membership };
        sm.install_snapshot(&meta, Cursor::new(golden_snapshot.clone().into_bytes())).await.unwrap();
        let rebuilt = sm.build_snapshot().await.unwrap().snapshot.into_inner();
        let vote: Vote = serde_json::from_str(&read(VOTE)).unwrap_or_else(|e| panic!("{}: vote: {e}", dir.display()));
        if dir == current {
            assert_eq!(encode_entries(&entries), text, "this build writes format {FORMAT_VERSION}'s entries as checked in");
            assert_eq!(serde_json::to_string(&vote).unwrap(), read(VOTE));
            assert_eq!(String::from_utf8(rebuilt).unwrap(), golden_snapshot, "an installed snapshot is written again as it came");
        }
    }
}
