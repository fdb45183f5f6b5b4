//! The node agents' API on a 3-node cluster: the desired-state projection of a Plan onto one
//! node, its resumption by version, and reports (forwarded to the leader, observed state
//! written to the Node's status only when it changes).

mod common;

use std::time::Duration;

use common::*;
use controlplane::resources::NodeStatus;
use proto::agent_client::AgentClient;
use serde_json::json;

fn plan(batch: u32) -> proto::Resource {
    resource(
        "Plan",
        "current",
        "",
        json!({"strategy": "parvagpu", "gpus": [
            {"node": "n1", "gpu_uuid": "GPU-n1", "mig_layout": [{"profile": "4g", "start": 0}, {"profile": "3g", "start": 4}],
             "workloads": [{"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": batch}]},
            {"node": "n2", "gpu_uuid": "GPU-n2", "mig_layout": [{"profile": "7g", "start": 0}],
             "workloads": [{"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": 8}]}
        ]}),
    )
}

async fn agent_client(addr: &str) -> AgentClient<tonic::transport::Channel> {
    AgentClient::connect(format!("http://{addr}")).await.unwrap()
}

/// The leader's id, and an agent client connected to a follower (which answers reports from
/// its own state and relays them to the leader).
async fn agent_at_a_follower(cluster: &TestCluster) -> (u64, AgentClient<tonic::transport::Channel>) {
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    (leader, agent_client(&cluster.node(follower).addr.to_string()).await)
}

async fn next(stream: &mut tonic::Streaming<proto::DesiredState>) -> proto::DesiredState {
    tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("a desired state in time").unwrap().expect("stream open")
}

/// The next desired state that places something on the node.
async fn next_placed(stream: &mut tonic::Streaming<proto::DesiredState>) -> proto::DesiredState {
    loop {
        let d = next(stream).await;
        if !d.gpus.is_empty() {
            return d;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn desired_state_is_the_plan_projected_on_the_node_and_resumes_by_version() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    client.put(service("web", 100.0, 40.0), proto::WriteMode::Create).await.unwrap();
    for n in ["n1", "n2"] {
        client.put(node(n), proto::WriteMode::Create).await.unwrap();
    }
    // Any controller serves the watch, followers included.
    let endpoints = cluster.endpoints();
    let mut agent = agent_client(&endpoints[2]).await;
    let mut stream =
        agent.watch_desired(proto::WatchDesiredRequest { node: "n1".into(), from_version: 0, session: 0 }).await.unwrap().into_inner();
    // From 0, the current state comes first: nothing planned yet.
    let nothing = next(&mut stream).await;
    assert_eq!((nothing.node.as_str(), nothing.version, nothing.gpus.len()), ("n1", 0, 0));
    client.put(plan(8), proto::WriteMode::Create).await.unwrap();
    let first = next(&mut stream).await;
    assert_eq!(first.node, "n1");
    assert_eq!(first.gpus.len(), 1, "only n1's GPU");
    let gpu = &first.gpus[0];
    assert_eq!(gpu.gpu_uuid, "GPU-n1");
    assert_eq!(gpu.mig_layout.iter().map(|m| (m.profile.as_str(), m.start)).collect::<Vec<_>>(), [("4g", 0), ("3g", 4)]);
    assert_eq!(gpu.workloads[0].model, "resnet50", "model taken from the Service");
    assert_eq!(gpu.workloads[0].slo_ms, 40.0);
    assert_eq!(gpu.workloads[0].mig_instance, 0);

    // A change to the plan reaches the watcher with a higher version.
    client.put(plan(16), proto::WriteMode::Update).await.unwrap();
    let second = next(&mut stream).await;
    assert!(second.version > first.version);
    assert_eq!(second.gpus[0].workloads[0].batch, 16);

    // Resuming from the current version sends nothing until the next change.
    let mut resumed = agent
        .watch_desired(proto::WatchDesiredRequest { node: "n1".into(), from_version: second.version, session: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(tokio::time::timeout(Duration::from_millis(500), resumed.message()).await.is_err(), "nothing newer to send");
    client.put(service("web", 100.0, 60.0), proto::WriteMode::Update).await.unwrap();
    let third = next(&mut resumed).await;
    assert_eq!(third.gpus[0].workloads[0].slo_ms, 60.0, "a Service change reaches the agent");
    assert!(third.version > second.version);
}

fn plan_batches(n1: u32, n2: u32) -> proto::Resource {
    whole_gpu_plan(&[("n1", "web", n1), ("n2", "api", n2)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_reaches_only_the_watchers_of_the_nodes_it_changes() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    client.put(service("web", 100.0, 40.0), proto::WriteMode::Create).await.unwrap();
    client.put(service("api", 100.0, 40.0), proto::WriteMode::Create).await.unwrap();
    for n in ["n1", "n2", "n3"] {
        client.put(node(n), proto::WriteMode::Create).await.unwrap();
    }
    client.put(plan_batches(8, 8), proto::WriteMode::Create).await.unwrap();
    let endpoints = cluster.endpoints();
    let mut agent = agent_client(&endpoints[1]).await;
    let watch = |n: &str| {
        let req = proto::WatchDesiredRequest { node: n.into(), from_version: 0, session: 0 };
        let mut agent = agent.clone();
        async move { agent.watch_desired(req).await.unwrap().into_inner() }
    };
    let (mut n1, mut n2, mut n3) = (watch("n1").await, watch("n2").await, watch("n3").await);
    // The controller watched may not have applied the plan yet: it then starts with the
    // empty state, and the plan follows.
    let (first1, first2) = (next_placed(&mut n1).await, next_placed(&mut n2).await);
    assert_eq!(first1.version, first2.version, "both placed by the same commit");
    // A watch from 0 starts with the current state, empty for a node with no work.
    let empty3 = next(&mut n3).await;
    assert_eq!((empty3.version, empty3.gpus.len()), (0, 0));

    // Only n1's batch changes: n1 gets it; n2 (untouched) and n3 (no work) get nothing, which
    // shows below as their next message being the later change that does concern them.
    client.put(plan_batches(16, 8), proto::WriteMode::Update).await.unwrap();
    let second1 = next(&mut n1).await;
    assert_eq!(second1.gpus[0].workloads[0].batch, 16);
    assert!(second1.version > first1.version);
    // api's SLO concerns n2 alone.
    client.put(service("api", 100.0, 60.0), proto::WriteMode::Update).await.unwrap();
    let second2 = next(&mut n2).await;
    assert_eq!(second2.gpus[0].workloads[0].slo_ms, 60.0, "n2's next message is api's change, not n1's");
    assert!(second2.version > second1.version);
    // The Plan's own version is not the node's: n2 is still at the version of its last change.
    let resumed = agent.watch_desired(proto::WatchDesiredRequest { node: "n2".into(), from_version: second2.version, session: 0 }).await;
    let mut resumed = resumed.unwrap().into_inner();
    // n3 receives its first state when work is placed on it.
    let with_n3 = json!({"strategy": "parvagpu", "gpus": [
        {"node": "n3", "gpu_uuid": "GPU-n3", "mig_layout": [{"profile": "7g", "start": 0}],
         "workloads": [{"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": 4}]}]});
    client.put(resource("Plan", "extra", "", with_n3), proto::WriteMode::Create).await.unwrap();
    let first3 = next(&mut n3).await;
    assert_eq!(first3.gpus[0].gpu_uuid, "GPU-n3");
    assert!(first3.version > second2.version);
    // The watcher resumed at n2's version got nothing from n3's change: its next is api's.
    client.put(service("api", 100.0, 70.0), proto::WriteMode::Update).await.unwrap();
    assert_eq!(next(&mut resumed).await.gpus[0].workloads[0].slo_ms, 70.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_reach_the_leader_and_write_observed_state_once() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    client.put(node("n1"), proto::WriteMode::Create).await.unwrap();
    // The plan puts web on n1: a node reports metrics only for what is placed on it.
    let plan = serde_json::json!({"strategy": "test", "gpus": [{"node": "n1", "gpu_uuid": "GPU-n1",
        "mig_layout": [{"profile": "7g", "start": 0}],
        "workloads": [{"service": "web", "mig_instance": 0, "mps_percent": 100, "batch": 8}]}]});
    client.put(resource("Plan", "current", "", plan), proto::WriteMode::Create).await.unwrap();
    let (leader, mut agent) = agent_at_a_follower(&cluster).await;
    let report = proto::ReportRequest {
        node: "n1".into(),
        applied_version: 3,
        gpus: vec![proto::ObservedGpu {
            gpu_uuid: "GPU-n1".into(),
            model: "A100-80GB".into(),
            mig_enabled: true,
            instances: vec![proto::AgentMigInstance { profile: "7g".into(), start: 0 }],
            workloads: vec![],
        }],
        metrics: vec![proto::ServiceMetrics {
            service: "web".into(),
            p99_ms: 12.0,
            throughput_rps: 90.0,
            arrival_rps: 90.0,
            ..Default::default()
        }],
        ..Default::default()
    };
    agent.report(report.clone()).await.unwrap();
    let (observed, version) = node_status_when(&client, "n1", |s| NodeStatus::applied_version(s) == 3).await;
    assert_eq!(observed["gpus"][0]["instances"][0], "7g@0");
    // The leader keeps the metrics in memory.
    let kept = cluster.node(leader).controller.reports.get("n1").expect("report recorded on the leader");
    assert_eq!(kept.report.metrics[0].p99_ms, 12.0);
    // The same observed state again changes nothing in the replicated state: the next change
    // is the very next version of the Node.
    agent.report(report.clone()).await.unwrap();
    agent.report(proto::ReportRequest { applied_version: 4, ..report }).await.unwrap();
    let (_, next) = node_status_when(&client, "n1", |s| NodeStatus::applied_version(s) == 4).await;
    assert_eq!(next, version + 1, "only the changed report was written");
    // An unregistered node is told to register.
    let err = agent.report(proto::ReportRequest { node: "ghost".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("not registered"), "{}", err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_leaves_its_gpus_out_of_reports_while_the_controllers_hold_its_observed_state() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    client.put(node("n1"), proto::WriteMode::Create).await.unwrap();
    let (leader, mut agent) = agent_at_a_follower(&cluster).await;
    let observed = proto::ReportRequest {
        node: "n1".into(),
        gpus: vec![proto::ObservedGpu { gpu_uuid: "GPU-n1".into(), model: "A100-80GB".into(), ..Default::default() }],
        ..Default::default()
    };
    let digest = proto::observed_digest(&observed);
    // As the agent does: the controllers hold nothing yet, so the GPUs go with the report;
    // they are written with the report's digest, which answers then name.
    let mut full = observed.clone();
    proto::leave_out_unchanged(&mut full, 0);
    assert!(!full.gpus_unchanged && full.gpus.len() == 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.report(full.clone()).await.unwrap().into_inner().observed_digest != digest {
        assert!(tokio::time::Instant::now() < deadline, "no answer named the written digest");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, version) = node_status_when(&client, "n1", |s| NodeStatus::observed_digest(s) == digest).await;
    assert_eq!(status["gpus"][0]["gpu_uuid"], "GPU-n1");

    // Then the GPUs stay out. The report still counts as the node's heartbeat, and the
    // status keeps the GPUs.
    let mut slim = observed.clone();
    proto::leave_out_unchanged(&mut slim, digest);
    assert!(slim.gpus_unchanged && slim.gpus.is_empty());
    let before = cluster.node(leader).controller.reports.get("n1").map(|r| r.received);
    assert_eq!(agent.report(slim.clone()).await.unwrap().into_inner().observed_digest, digest);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.node(leader).controller.reports.get("n1").map(|r| r.received) == before {
        assert!(tokio::time::Instant::now() < deadline, "the relayed report never reached the leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A report that says its GPUs are unchanged carries none.
    let err = agent.report(proto::ReportRequest { gpus: observed.gpus.clone(), ..slim.clone() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("gpus_unchanged"), "{}", err.message());
    // An agent that left out GPUs the controllers do not hold (a digest they never wrote) is
    // answered with the digest they do hold, and its next report carries its GPUs; nothing
    // is written meanwhile.
    let wrong = proto::ReportRequest { observed_digest: digest ^ 1, ..slim.clone() };
    assert_eq!(agent.report(wrong).await.unwrap().into_inner().observed_digest, digest);
    let changed = proto::ReportRequest { applied_version: 9, ..observed.clone() };
    let mut next = changed.clone();
    proto::leave_out_unchanged(&mut next, digest);
    assert!(!next.gpus_unchanged, "a changed state carries its GPUs");
    agent.report(next).await.unwrap();
    let (status, next_version) = node_status_when(&client, "n1", |s| NodeStatus::applied_version(s) == 9).await;
    assert_eq!(next_version, version + 1, "the slim reports wrote nothing");
    assert_eq!(NodeStatus::observed_digest(&status), proto::observed_digest(&changed));
    assert_eq!(status["gpus"][0]["gpu_uuid"], "GPU-n1");

    // An operator overwrites the status: what is stored counts, not what the leader last
    // wrote. Answers name the new digest (none), and the agent's next report, with its
    // GPUs, writes its observed state again.
    client.put_status("Node", "n1", r#"{"health": "healthy"}"#.into(), 0).await.unwrap();
    let mut slim = changed.clone();
    proto::leave_out_unchanged(&mut slim, proto::observed_digest(&changed));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.report(slim.clone()).await.unwrap().into_inner().observed_digest != 0 {
        assert!(tokio::time::Instant::now() < deadline, "answers never named the overwritten status");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut full = changed.clone();
    proto::leave_out_unchanged(&mut full, 0);
    agent.report(full).await.unwrap();
    let (status, _) = node_status_when(&client, "n1", |s| NodeStatus::applied_version(s) == 9).await;
    assert_eq!(NodeStatus::observed_digest(&status), proto::observed_digest(&changed));
}

/// Loop settings under which reports are never late: only ended streams mark a node.
fn only_ended_streams_mark(heartbeat_interval: Duration, watch_grace: Duration) -> controlplane::loops::LoopSettings {
    controlplane::loops::LoopSettings { heartbeat_interval, missed_heartbeats: 100_000, watch_grace, tuner: false, ..Default::default() }
}

async fn watch(agent: &AgentClient<tonic::transport::Channel>, node: &str, session: u64) -> tonic::Streaming<proto::DesiredState> {
    let req = proto::WatchDesiredRequest { node: node.into(), from_version: 0, session };
    agent.clone().watch_desired(req).await.unwrap().into_inner()
}

fn report(node: &str, watch_session: u64) -> proto::ReportRequest {
    proto::ReportRequest { node: node.into(), watch_session, ..Default::default() }
}

/// The failure detector's fast path: a node whose agent's desired-state stream ends, with no
/// report from a new stream within the grace, is marked unhealthy long before its report
/// timeout; the end of a stream the agent has already replaced, or a quick reconnection,
/// marks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_agent_stream_ends_is_marked_unhealthy_unless_it_reports_a_new_stream() {
    let loops = only_ended_streams_mark(Duration::from_millis(100), Duration::from_secs(3));
    let cluster = TestCluster::start_with_loops(3, fast_settings(), loops).await;
    let client = cluster.client();
    seed(&client).await;
    for n in ["dies", "moved", "blinks"] {
        client.put(node(n), proto::WriteMode::Create).await.unwrap();
    }
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    let other = (1..=3).find(|&id| id != leader && id != follower).unwrap();
    let mut at_follower = agent_client(&cluster.node(follower).addr.to_string()).await;
    let mut at_other = agent_client(&cluster.node(other).addr.to_string()).await;
    let healthy = |s: &serde_json::Value| NodeStatus::is_healthy(s);
    let mut streams = std::collections::BTreeMap::new();
    for (node, session) in [("dies", 11), ("moved", 21), ("blinks", 31)] {
        let mut stream = watch(&at_follower, node, session).await;
        next(&mut stream).await;
        streams.insert(node, stream);
        at_follower.report(report(node, session)).await.unwrap();
        node_status_when(&client, node, healthy).await;
    }
    // "moved" opens a stream on another controller and reports it before its old stream's
    // end is relayed; "blinks" loses its stream and comes back at once; "dies" goes away.
    let mut moved = watch(&at_other, "moved", 22).await;
    next(&mut moved).await;
    at_other.report(report("moved", 22)).await.unwrap();
    drop(streams.remove("moved"));
    drop(streams.remove("blinks"));
    let mut blinked = watch(&at_other, "blinks", 32).await;
    next(&mut blinked).await;
    at_other.report(report("blinks", 32)).await.unwrap();
    drop(streams.remove("dies"));
    node_status_when(&client, "dies", NodeStatus::is_unhealthy).await;
    // The grace has passed for all three ends: the two agents that reported new streams
    // are still healthy.
    for n in ["moved", "blinks"] {
        let r = client.get("Node", n, false).await.unwrap();
        let status: serde_json::Value = serde_json::from_str(&r.status_json).unwrap();
        assert!(NodeStatus::is_healthy(&status), "{n}");
    }
    // It comes back on a new stream. It held its status's digest and leaves its GPUs out,
    // but the mark dropped that digest: answers say the controllers hold none, so its next
    // report carries them and turns it healthy again.
    let mut back = watch(&at_other, "dies", 12).await;
    next(&mut back).await;
    let mut slim = report("dies", 12);
    proto::leave_out_unchanged(&mut slim, proto::observed_digest(&report("dies", 11)));
    assert!(slim.gpus_unchanged);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while at_other.report(slim.clone()).await.unwrap().into_inner().observed_digest != 0 {
        assert!(tokio::time::Instant::now() < deadline, "the mark never dropped the node's digest");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut full = report("dies", 12);
    proto::leave_out_unchanged(&mut full, 0);
    at_other.report(full).await.unwrap();
    node_status_when(&client, "dies", healthy).await;
    // Only controllers (and operators) may relay ends; the leader checks what it is sent.
    let too_many = proto::WatchesEndedRequest {
        ended: (0..=controlplane::agents::watch_ends::MAX_ENDS_PER_RELAY)
            .map(|i| proto::EndedWatch { node: format!("n{i}"), session: 1 })
            .collect(),
    };
    let mut at_leader = agent_client(&cluster.node(leader).addr.to_string()).await;
    let err = at_leader.watches_ended(too_many).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("ended: 4097 items in one request; at most 4096"), "{}", err.message());
    let too_many = proto::ReportBatchRequest { reports: vec![proto::ReportRequest::default(); 513] };
    let err = at_leader.report_batch(too_many).await.unwrap_err();
    assert!(err.message().starts_with("reports: 513 items in one request; at most 512"), "{}", err.message());
    let bad_name = proto::WatchesEndedRequest { ended: vec![proto::EndedWatch { node: "Not A Name!".into(), session: 1 }] };
    let err = at_leader.watches_ended(bad_name).await.unwrap_err();
    assert!(err.message().contains("ended[0].node"), "{}", err.message());
}

/// A host that dies around a leader change: its stream's end reaches no leader (the old one
/// is gone, the new one not elected yet), so the controller that served the stream keeps it
/// and sends it to the new leader. The new leader has no report of either node; it asks the
/// controllers which streams are open, so it marks the dead node without waiting for a
/// report, and not an agent that moved to another controller in the same moments and has
/// not reported since.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_dies_around_a_leader_change_is_marked_by_the_new_leader() {
    // Agents report every 2 s, longer than the grace, as in a large fleet.
    let loops = only_ended_streams_mark(Duration::from_secs(2), Duration::from_millis(300));
    let mut cluster = TestCluster::start_with_loops(3, fast_settings(), loops).await;
    let client = cluster.client();
    seed(&client).await;
    for n in ["dies", "moved"] {
        client.put(node(n), proto::WriteMode::Create).await.unwrap();
    }
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    let other = (1..=3).find(|&id| id != leader && id != follower).unwrap();
    let at_follower = agent_client(&cluster.node(follower).addr.to_string()).await;
    let at_other = agent_client(&cluster.node(other).addr.to_string()).await;
    let healthy = |s: &serde_json::Value| NodeStatus::is_healthy(s);
    let mut streams = std::collections::BTreeMap::new();
    for (node, session) in [("dies", 11), ("moved", 21)] {
        let mut stream = watch(&at_follower, node, session).await;
        next(&mut stream).await;
        streams.insert(node, stream);
        at_follower.clone().report(report(node, session)).await.unwrap();
        node_status_when(&client, node, healthy).await;
    }

    cluster.stop(leader).await;
    // While no leader is known (or a dead one is), "dies" goes away and "moved" moves to
    // the other controller, where it holds a stream but does not report (its next report
    // is not due for a while).
    drop(streams.remove("dies"));
    drop(streams.remove("moved"));
    let mut moved = watch(&at_other, "moved", 22).await;
    next(&mut moved).await;

    cluster.wait_leader().await;
    node_status_when(&client, "dies", NodeStatus::is_unhealthy).await;
    // Past a report interval and the grace for "moved" too: still healthy, without a
    // report since its old stream ended.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = client.get("Node", "moved", false).await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&r.status_json).unwrap();
    assert!(NodeStatus::is_healthy(&status), "{status}");
    // Only controllers may ask which streams are open, about a bounded number of nodes.
    let too_many =
        proto::OpenWatchesRequest { nodes: (0..=controlplane::agents::watch_ends::MAX_ENDS_PER_RELAY).map(|i| format!("n{i}")).collect() };
    let err = at_other.clone().open_watches(too_many).await.unwrap_err();
    assert!(err.message().starts_with("nodes: 4097 items in one request; at most 4096"), "{}", err.message());
    let asked = proto::OpenWatchesRequest { nodes: vec!["moved".into(), "dies".into()] };
    let open = at_other.clone().open_watches(asked).await.unwrap().into_inner().open;
    assert_eq!(open, [proto::OpenWatch { node: "moved".into(), session: 22 }]);
    drop(moved);
}
