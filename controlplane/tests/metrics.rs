//! `/metrics`, `/healthz` and `/readyz` of an in-process 3-node cluster, scraped over HTTP:
//! the key series exist and move with writes and agent reports; readiness follows the leader.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use proto::agent_client::AgentClient;

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    telemetry_http::get(addr, path).await.unwrap()
}

/// The value of the sample line that starts with `series` (name and labels, exactly).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn metrics_addr(cluster: &TestCluster, id: u64) -> SocketAddr {
    cluster.node(id).metrics_addr.expect("the test cluster serves metrics")
}

async fn scrape(cluster: &TestCluster, id: u64) -> String {
    let (status, body) = get(metrics_addr(cluster, id), "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

fn plan() -> proto::Resource {
    whole_gpu_plan(&[("n1", "web", 8)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_exist_and_move_with_writes_and_reports() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let leader = cluster.wait_leader().await;

    let before = scrape(&cluster, leader).await;
    for series in [
        "gpuplane_raft_term",
        "gpuplane_raft_commit_index",
        "gpuplane_raft_applied_index",
        "gpuplane_raft_last_log_index",
        "gpuplane_raft_proposal_duration_seconds_count",
        "gpuplane_plan_cost_per_hour",
    ] {
        assert!(value(&before, series).is_some(), "{series} missing:\n{before}");
    }
    assert!(value(&before, "gpuplane_raft_term").unwrap() >= 1.0);
    assert_eq!(value(&before, "gpuplane_raft_is_leader"), Some(1.0));
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    assert_eq!(value(&scrape(&cluster, follower).await, "gpuplane_raft_is_leader"), Some(0.0));

    // Writes: the commit index and the leader's proposals move.
    let client = cluster.client();
    seed(&client).await;
    client.put(service("web", 100.0, 40.0), proto::WriteMode::Create).await.unwrap();
    client.put(node("n1"), proto::WriteMode::Create).await.unwrap();
    let planned = client.put(plan(), proto::WriteMode::Create).await.unwrap();
    let after = scrape(&cluster, leader).await;
    let moved = |series: &str| value(&after, series).unwrap() - value(&before, series).unwrap();
    assert!(moved("gpuplane_raft_commit_index") >= 7.0, "{after}");
    assert!(moved("gpuplane_raft_applied_index") >= 7.0, "{after}");
    assert!(moved("gpuplane_raft_proposal_duration_seconds_count") >= 7.0, "{after}");
    assert!(value(&after, "gpuplane_raft_proposals_total{result=\"ok\"}").unwrap() >= 7.0, "{after}");
    // One A100 of a p4de.24xlarge (40.96 per hour for 8 GPUs).
    assert!((value(&after, "gpuplane_plan_cost_per_hour").unwrap() - 5.12).abs() < 1e-9, "{after}");

    // A report through a follower reaches the leader, which exports its per-service figures.
    // The follower checks it against the plan, so it must have applied it.
    cluster.wait_applied(planned.resource.unwrap().mod_revision).await;
    let mut agent = AgentClient::connect(format!("http://{}", cluster.node(follower).addr)).await.unwrap();
    let window = proto::ServiceMetrics {
        service: "web".into(),
        p99_ms: 12.5,
        throughput_rps: 90.0,
        arrival_rps: 95.0,
        failed: 2,
        ..Default::default()
    };
    agent.report(proto::ReportRequest { node: "n1".into(), metrics: vec![window], ..Default::default() }).await.unwrap();
    // The follower answered; the leader has it in its next batch, moments later.
    let labels = "{service=\"web\",node=\"n1\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let reported = loop {
        let text = scrape(&cluster, leader).await;
        if value(&text, &format!("gpuplane_service_p99_ms{labels}")).is_some() {
            break text;
        }
        assert!(tokio::time::Instant::now() < deadline, "the report never reached the leader:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(value(&reported, &format!("gpuplane_service_p99_ms{labels}")), Some(12.5), "{reported}");
    assert_eq!(value(&reported, &format!("gpuplane_service_throughput_rps{labels}")), Some(90.0));
    assert_eq!(value(&reported, &format!("gpuplane_service_arrival_rps{labels}")), Some(95.0));
    assert_eq!(value(&reported, &format!("gpuplane_service_failed{labels}")), Some(2.0));

    let (status, _) = get(metrics_addr(&cluster, leader), "/nowhere").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healthz_always_and_readyz_only_while_a_leader_is_known() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let leader = cluster.wait_leader().await;
    seed(&cluster.client()).await;
    for id in 1..=3 {
        assert_eq!(get(metrics_addr(&cluster, id), "/healthz").await.0, 200);
    }
    // A node may apply a moment after it learns the commit index: wait for it.
    let mut ready = Vec::new();
    for _ in 0..100 {
        ready.clear();
        for id in 1..=3 {
            ready.push(get(metrics_addr(&cluster, id), "/readyz").await);
        }
        if ready.iter().all(|(s, _)| *s == 200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready.iter().all(|(s, _)| *s == 200), "{ready:?}");

    // Alone, the last follower loses its leader at its election timeout: not ready, but alive.
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    for id in (1..=3).filter(|&id| id != follower) {
        cluster.stop(id).await;
    }
    // On the way it may briefly be not ready for another reason (it learned a commit index it has
    // not applied yet): wait for the reason under test.
    let addr = metrics_addr(&cluster, follower);
    let no_leader = (503, "not ready: no leader known\n".to_string());
    let mut last = (0, String::new());
    for _ in 0..100 {
        last = get(addr, "/readyz").await;
        if last == no_leader {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last, no_leader);
    assert_eq!(get(addr, "/healthz").await.0, 200);
}
