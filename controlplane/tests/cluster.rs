//! A 3-node controller cluster on loopback with sled storage: replication, forwarding,
//! failover, restart from disk, snapshot catch-up, membership changes, watch.

mod common;

use std::time::Duration;

use common::*;
use proto::WriteMode;

fn names(list: &proto::ListResponse) -> Vec<(String, u64)> {
    list.resources.iter().map(|r| (r.name.clone(), r.resource_version)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_through_any_node_replicate_and_survive_leader_kill() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    seed(&cluster.client()).await;
    // A write sent to each node (followers forward to the leader) lands everywhere.
    for id in 1..=3 {
        let out = cluster.client_of(id).put(service(&format!("via-{id}"), 10.0, 50.0), WriteMode::Create).await.unwrap().resource.unwrap();
        // A version is the log index of the change.
        assert_eq!(out.resource_version, out.create_revision);
    }
    let revision = cluster.client().list("Service", "", false).await.unwrap().revision;
    cluster.wait_applied(revision).await;
    for (id, node) in cluster.running() {
        let on_node = node.controller.read(|d| d.cluster.list(controlplane::resources::Kind::Service).count());
        assert_eq!(on_node, 3, "node {id}");
    }

    // Acknowledged just before the kill.
    let leader = cluster.wait_leader().await;
    let acked = cluster.client().put(service("acked-before-kill", 5.0, 40.0), WriteMode::Create).await.unwrap();
    cluster.stop(leader).await;
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    let client = cluster.client();
    client.put(service("after-failover", 5.0, 40.0), WriteMode::Create).await.unwrap();
    let got = client.get("Service", "acked-before-kill", false).await.unwrap();
    assert_eq!(got.resource_version, acked.resource.unwrap().resource_version);

    // The old leader comes back as a follower and catches up.
    cluster.restart(leader).await;
    let revision = client.list("Service", "", false).await.unwrap().revision;
    cluster.wait_applied(revision).await;
    let on_old =
        cluster.node(leader).controller.read(|d| d.cluster.get(controlplane::resources::Kind::Service, "after-failover").is_some());
    assert!(on_old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_restart_from_data_dirs_keeps_resources_and_versions() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    for i in 0..20 {
        client.put(service(&format!("svc-{i}"), 10.0 + f64::from(i), 50.0), WriteMode::Create).await.unwrap();
    }
    for i in 0..5 {
        client.put(service(&format!("svc-{i}"), 99.0, 45.0), WriteMode::Update).await.unwrap();
    }
    let before = client.list("Service", "", false).await.unwrap();
    let gpu_before = client.get("GpuModel", "A100-80GB", false).await.unwrap();
    for id in 1..=3 {
        cluster.stop(id).await;
    }
    for id in 1..=3 {
        cluster.restart(id).await;
    }
    cluster.wait_leader().await;
    let client = cluster.client();
    let after = client.list("Service", "", false).await.unwrap();
    assert_eq!(names(&before), names(&after));
    assert_eq!(before.resources, after.resources);
    assert_eq!(gpu_before, client.get("GpuModel", "A100-80GB", false).await.unwrap());
    assert!(after.resources.iter().filter(|r| r.resource_version > r.create_revision).count() == 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lagging_follower_catches_up_through_snapshot_install() {
    let settings = controlplane::raft::RaftSettings { snapshot_every: 20, keep_logs_after_snapshot: 5, ..fast_settings() };
    let mut cluster = TestCluster::start(3, settings).await;
    let client = cluster.client();
    seed(&client).await;
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.stop(follower).await;
    for i in 0..120 {
        client.put(service(&format!("svc-{i}"), 10.0, 50.0), WriteMode::Create).await.unwrap();
    }
    // Wait until the leader has compacted past the follower's log.
    let mut purged = false;
    for _ in 0..200 {
        let m = controlplane::raft::consensus::metrics(&cluster.node(leader).controller.raft);
        if m.purged.is_some_and(|p| p.index > 30) {
            purged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(purged, "leader should have purged its log after snapshots");
    cluster.restart(follower).await;
    let revision = client.list("Service", "", false).await.unwrap().revision;
    cluster.wait_applied(revision).await;
    // The follower installed a snapshot: it could not catch up otherwise.
    cluster.wait_snapshot(follower, 1).await;
    let count = cluster.node(follower).controller.read(|d| d.cluster.list(controlplane::resources::Kind::Service).count());
    assert_eq!(count, 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compacting_on_request_snapshots_purges_and_a_lagging_follower_installs_the_snapshot() {
    // Snapshots every 10,000 entries by default: none happens by itself here.
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.stop(follower).await;
    for i in 0..20 {
        client.put(service(&format!("svc-{i}"), 10.0, 50.0), WriteMode::Create).await.unwrap();
    }
    let applied = cluster.node(leader).controller.status().applied_index;
    assert_eq!(cluster.node(leader).controller.status().snapshot_index, 0);

    let compacted = client.compact(&cluster.addrs[&leader].to_string()).await.unwrap();
    assert_eq!(compacted.node_id, leader);
    assert!(compacted.snapshot_index >= applied, "{compacted:?} (applied {applied})");
    assert!(compacted.snapshot_bytes > 0, "{compacted:?}");
    assert_eq!(compacted.purged_index, compacted.snapshot_index);
    let status = cluster.node(leader).controller.status();
    assert_eq!((status.snapshot_index, status.purged_index), (compacted.snapshot_index, compacted.purged_index));

    // The entries the follower misses are gone: it can only catch up from the snapshot.
    cluster.restart(follower).await;
    let revision = client.list("Service", "", false).await.unwrap().revision;
    cluster.wait_applied(revision).await;
    cluster.wait_snapshot(follower, compacted.snapshot_index).await;
    let count = cluster.node(follower).controller.read(|d| d.cluster.list(controlplane::resources::Kind::Service).count());
    assert_eq!(count, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retried_request_id_applies_once_and_stale_version_is_refused() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let first = client.put_with_id(service("svc", 10.0, 50.0), WriteMode::Unspecified, "req-1").await.unwrap();
    // The retry goes to another node first: still applied once.
    let second = cluster.client_of(2).put_with_id(service("svc", 10.0, 50.0), WriteMode::Unspecified, "req-1").await.unwrap();
    assert!(!first.deduplicated);
    assert!(second.deduplicated);
    let version = first.resource.unwrap().resource_version;
    assert_eq!(second.resource.unwrap().resource_version, version);
    assert_eq!(client.get("Service", "svc", false).await.unwrap().resource_version, version);

    let mut update = service("svc", 20.0, 50.0);
    update.resource_version = version;
    assert!(client.put(update.clone(), WriteMode::Update).await.unwrap().resource.unwrap().resource_version > version);
    let err = client.put(update, WriteMode::Update).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(err.metadata().get(proto::meta::FIELD).unwrap(), "resource_version");
    assert!(err.message().contains("stale"), "{}", err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_answers_not_leader_with_address_when_it_cannot_forward() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addrs[&follower])).unwrap().connect().await.unwrap();
    let mut raw = proto::control_plane_client::ControlPlaneClient::new(channel);
    let mut req = tonic::Request::new(proto::PutRequest { resource: Some(base_resources()[0].clone()), ..Default::default() });
    // A request that was already forwarded once is never forwarded again.
    req.metadata_mut().insert(proto::meta::FORWARDED, "1".parse().unwrap());
    let err = raw.put(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.metadata().get(proto::meta::LEADER_ADDR).unwrap().to_str().unwrap(), cluster.addrs[&leader].to_string());
    assert_eq!(err.metadata().get(proto::meta::LEADER_ID).unwrap().to_str().unwrap(), leader.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_add_promote_remove_and_leader_transfer() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    cluster.start_node(4, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr4 = cluster.addrs[&4].to_string();
    let resp = client.add_member(4, &addr4, true).await.unwrap();
    let members = resp.status.unwrap().members;
    assert!(members.iter().any(|m| m.node_id == 4 && m.voter), "{members:?}");
    let revision = client.list("Tenant", "", false).await.unwrap().revision;
    cluster.wait_applied(revision).await;
    assert!(cluster.node(4).controller.read(|d| d.cluster.get(controlplane::resources::Kind::Tenant, "acme").is_some()));

    let leader = cluster.wait_leader().await;
    let target = (1..=3).find(|id| *id != leader).unwrap();
    client.transfer_leader(target).await.unwrap();
    assert_eq!(cluster.wait_leader().await, target);

    let resp = client.remove_member(4).await.unwrap();
    assert!(!resp.status.unwrap().members.iter().any(|m| m.node_id == 4));
    // Writes still work with the shrunk membership.
    client.put(service("after-remove", 1.0, 10.0), WriteMode::Create).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_streams_state_then_changes_and_resumes_from_a_revision() {
    use tokio_stream::StreamExt;
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let mut stream = client.watch("Tenant", 0).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.r#type, proto::EventType::Added as i32);
    assert_eq!(first.resource.unwrap().name, "acme");
    let bookmark = stream.next().await.unwrap().unwrap();
    assert_eq!(bookmark.r#type, proto::EventType::Bookmark as i32);

    let created = client.put(resource("Tenant", "globex", "", serde_json::json!({})), WriteMode::Create).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(ev.r#type, proto::EventType::Added as i32);
    assert_eq!(ev.revision, created.resource.as_ref().unwrap().mod_revision);

    // Resume after the first change: only later changes arrive, without a resync.
    client.delete("Tenant", "globex", 0).await.unwrap();
    let mut resumed = client.watch("Tenant", ev.revision).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), resumed.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(next.r#type, proto::EventType::Deleted as i32);
    assert_eq!(next.resource.unwrap().name, "globex");
}

/// One log entry can change several resources (a batch of puts, agents' statuses, writes
/// grouped into one entry): a watcher gets every change, not the first of each revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_gets_every_change_of_an_entry_that_changes_several_resources() {
    use tokio_stream::StreamExt;
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let mut stream = client.watch("Tenant", 0).await.unwrap();
    // The seeded tenant and the bookmark.
    for _ in 0..2 {
        stream.next().await.unwrap().unwrap();
    }
    let names = ["t-one", "t-two", "t-three"];
    let batch = names.iter().map(|n| resource("Tenant", n, "", serde_json::json!({}))).collect();
    client.put_many(batch, WriteMode::Create).await.unwrap();
    let mut seen = Vec::new();
    for _ in names {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("every change arrives").unwrap().unwrap();
        assert_eq!(ev.r#type, proto::EventType::Added as i32);
        seen.push((ev.resource.unwrap().name, ev.revision));
    }
    assert_eq!(seen.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), names);
    assert!(seen.iter().all(|(_, r)| *r == seen[0].1), "one entry, one revision: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_hold_ends_when_the_node_hears_from_a_leader_not_at_its_bound() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    // A follower that knows its leader: the hold, bounded at an hour, ends at once.
    let gate = cluster.node(follower).controller.elections.clone();
    gate.hold_until_leader_heard(Duration::from_secs(3600));
    let lifted = async {
        while !gate.may_elect() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), lifted).await.expect("the hold ends once a leader is heard from");

    // Restarted (its start hold on, as by default), it hears from the leader and may stand
    // again: a leader dying next is replaced with it voting and standing.
    cluster.stop(follower).await;
    cluster.restart(follower).await;
    let restarted = cluster.node(follower).controller.elections.clone();
    let lifted = async {
        while !restarted.may_elect() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), lifted).await.expect("the restarted node's start hold ends");
    assert!(cluster.node(follower).controller.leader().is_some(), "it heard from a leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resource_over_grpcs_default_4_mib_is_read_through_a_follower() {
    use controlplane::resources::{Kind, Spec};
    use controlplane::state::{Command, Request, WriteMode as Mode};
    // openraft gives an AppendEntries the heartbeat interval to arrive: a debug build
    // sends this entry's megabytes slower than the fast settings' 50 ms.
    let settings = controlplane::raft::RaftSettings {
        heartbeat_interval_ms: 1_000,
        election_timeout_min_ms: 3_000,
        election_timeout_max_ms: 4_000,
        ..fast_settings()
    };
    let cluster = TestCluster::start(3, settings).await;
    // A Plan of 30,000 GPUs encodes to over 4 MiB, gRPC's default limit (a 10,000-host
    // fleet's is about 50 MB). That is over the API's message limit too (the provisioner
    // writes its Plans in parts), so it is written through the leader's controller.
    let nodes: Vec<String> = (0..30_000).map(|i| format!("host-{i:05}")).collect();
    let workloads: Vec<(&str, &str, u32)> = nodes.iter().map(|n| (n.as_str(), "web", 8)).collect();
    let plan = whole_gpu_plan(&workloads);
    let spec = Spec::from_json(Kind::Plan, &plan.spec_json).unwrap();
    let command = Command::Put { name: "current".into(), tenant: String::new(), spec, mode: Mode::Upsert, expected_version: 0 };
    let request = Request { request_id: "big-plan".into(), command, trace_parent: None };
    // Through whichever controller leads once it is written (a young cluster may still
    // change leader).
    let mut attempts = 0;
    let leader = loop {
        let leader = cluster.wait_leader().await;
        match cluster.node(leader).controller.write(request.clone()).await {
            Ok(_) => break leader,
            Err(e) if attempts < 5 => eprintln!("writing through {leader}: {e}; again"),
            Err(e) => panic!("writing through {leader}: {e}"),
        }
        attempts += 1;
    };

    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let read = cluster.client_of(follower);
    let got = read.get("Plan", "current", false).await.expect("a follower forwards the read and takes the leader's whole answer");
    assert!(got.spec_json.len() > 4 * 1024 * 1024, "{} bytes", got.spec_json.len());
    let listed = read.list("Plan", "", false).await.expect("and a listing's");
    assert_eq!(listed.resources.len(), 1);
}
