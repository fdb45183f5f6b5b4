//! The bounds on a controller's connections and streams (`[limits]`; README, "Limits and the
//! threat model"), on in-process clusters: a watcher that never reads is cut off naming the
//! revision to watch again from, and a watch from there misses nothing; a principal past its
//! Watch streams is refused; a connection that never finishes its TLS handshake, or that
//! sits idle, is closed, while an open stream keeps its connection; connections past the cap
//! of one address, or of the listener, are refused, the latter with `/readyz` at 503; a
//! client past its streams on one connection waits for one of its own to end.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use controlplane::client::Client;
use controlplane::loops::LoopSettings;
use controlplane::security::{ClientCredentials, Principal, RateLimits, Security};
use proto::control_plane_client::ControlPlaneClient;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

/// Waits at most this long for what a test waits for; never a bound on how fast it is.
const PATIENCE: Duration = Duration::from_secs(30);

fn no_loops() -> LoopSettings {
    LoopSettings { enabled: false, ..LoopSettings::default() }
}

/// A cluster of `n` insecure nodes whose node `limited` has `limits` (the others the defaults).
async fn cluster_with(n: u64, limited: u64, limits: RateLimits) -> TestCluster {
    let security = Arc::new(move |id| {
        let limits = if id == limited { limits.clone() } else { RateLimits::default() };
        Security { limits, ..Security::insecure() }
    });
    TestCluster::start_with(n, fast_settings(), no_loops(), security).await
}

async fn metrics_of(cluster: &TestCluster, id: u64) -> String {
    let (status, body) = telemetry_http::get(cluster.node(id).metrics_addr.unwrap(), "/metrics").await.unwrap();
    assert_eq!(status, 200);
    body
}

/// The value of the sample line that starts with `series` (name and labels, exactly).
fn value(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// Waits until `series` on node `id` is at least `at_least`.
async fn wait_for_series(cluster: &TestCluster, id: u64, series: &str, at_least: f64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = metrics_of(cluster, id).await;
        if value(&text, series) >= at_least {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series} never reached {at_least}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn readyz(cluster: &TestCluster, id: u64) -> (u16, String) {
    telemetry_http::get(cluster.node(id).metrics_addr.unwrap(), "/readyz").await.unwrap()
}

/// Whether the server closed `stream` (a read ends or fails), waiting for it at most PATIENCE.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A plaintext HTTP/2 server writes its SETTINGS first; read on.
            Ok(Ok(_)) => {}
        }
    }
}

fn tenant(name: &str) -> proto::Resource {
    // 256 characters of display name: each change is a few hundred bytes on the wire.
    resource("Tenant", name, "", json!({ "display_name": "d".repeat(256) }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_that_never_reads_is_cut_off_and_a_watch_from_the_revision_it_names_misses_nothing() {
    // The bounds are the follower's, small; its other clients keep the defaults.
    let limits = RateLimits { watch_queue_events: 16, watch_queue_kib: 16, ..RateLimits::default() };
    let cluster = cluster_with(3, 2, limits.clone()).await;
    let leader = cluster.wait_leader().await;
    if leader == 2 {
        // Node 2 is to be a follower: give leadership to another.
        cluster.client().transfer_leader(1).await.unwrap();
        assert_eq!(cluster.wait_leader().await, 1);
    }
    let client = cluster.client();
    seed(&client).await;
    let follower = cluster.addrs[&2];
    // The stalled watcher: an HTTP/2 window of 1 KiB that it never reads, so never updates.
    let stalled =
        Endpoint::from_shared(format!("http://{follower}")).unwrap().initial_stream_window_size(Some(1024)).connect().await.unwrap();
    let request = proto::WatchRequest { kind: "Tenant".into(), name: String::new(), from_revision: 0 };
    let mut stalled = ControlPlaneClient::new(stalled).watch(request).await.unwrap().into_inner();

    // 600 Tenants, in three entries: ~200 KB of changes for the stalled watcher.
    let names: Vec<String> = (0..600).map(|i| format!("t-{i:03}")).collect();
    for batch in names.chunks(200) {
        client.put_many(batch.iter().map(|n| tenant(n)).collect(), proto::WriteMode::Create).await.unwrap();
    }
    wait_for_series(&cluster, 2, "gpuplane_watches_cut_off_total", 1.0).await;
    // The follower serves its other clients meanwhile.
    let on_follower = cluster.client_of(2);
    assert_eq!(on_follower.get("Tenant", "t-599", false).await.unwrap().name, "t-599");
    let listed = on_follower.list("Tenant", "", false).await.unwrap();
    assert!(listed.resources.len() >= 600, "{}", listed.resources.len());

    // Read now: what was already sent, then the cut-off naming where to watch again from.
    let mut seen = BTreeSet::new();
    let status = loop {
        match tokio::time::timeout(PATIENCE, stalled.message()).await.unwrap() {
            Ok(Some(ev)) => {
                if let Some(r) = ev.resource {
                    seen.insert(r.name);
                }
            }
            Ok(None) => panic!("the stalled watch ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("watch fell behind"), "{}", status.message());
    let resume: u64 = status.metadata().get("x-gpuplane-resume-revision").unwrap().to_str().unwrap().parse().unwrap();
    assert!(status.message().ends_with(&format!("watch again from revision {resume}")), "{}", status.message());
    assert!(seen.len() < names.len(), "cut off before it was sent everything: {}", seen.len());

    // Watching again from there (on the same follower) brings the rest, without a resync.
    let mut resumed = on_follower.watch("Tenant", resume).await.unwrap();
    while !names.iter().all(|n| seen.contains(n)) {
        let ev = tokio::time::timeout(PATIENCE, resumed.message()).await.unwrap().unwrap().expect("the watch goes on");
        assert_ne!(ev.r#type, proto::EventType::Resync as i32, "resumed from the history");
        if let Some(r) = ev.resource {
            seen.insert(r.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_principal_past_its_watch_streams_is_refused_until_one_of_them_ends() {
    let limits = RateLimits { watches_per_principal: 2, ..RateLimits::default() };
    let cluster = cluster_with(1, 1, limits).await;
    let client = cluster.client();
    seed(&client).await;
    // Insecure: every caller is the one admin, so these are one principal's.
    let first = client.watch("Tenant", 0).await.unwrap();
    let mut second = client.watch("", 0).await.unwrap();
    let refused = client.watch("Service", 0).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("watches_per_principal = 2"), "{}", refused.message());
    let text = metrics_of(&cluster, 1).await;
    assert_eq!(value(&text, "gpuplane_watch_streams"), 2.0, "{text}");
    assert_eq!(value(&text, "gpuplane_watches_refused_total"), 1.0, "{text}");
    // The open ones go on.
    assert!(second.message().await.unwrap().is_some());

    drop(first);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut again = loop {
        match client.watch("Service", 0).await {
            Ok(stream) => break stream,
            Err(e) if e.code() == Code::ResourceExhausted && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("the ended stream's slot was not given back: {e:?}"),
        }
    };
    assert!(again.message().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_that_never_finishes_its_tls_handshake_is_closed_at_the_deadline() {
    let pki = make_pki(&[1], &[]);
    let dir = pki.path().to_path_buf();
    let limits = RateLimits { handshake_timeout_ms: 300, ..RateLimits::default() };
    let security = Arc::new(move |id| Security {
        tls: Some(tls_of(&dir, &Principal::Controller(id))),
        tokens: Default::default(),
        limits: limits.clone(),
    });
    let cluster = TestCluster::start_with(1, fast_settings(), no_loops(), security).await;
    let addr = cluster.addrs[&1];

    // A TCP connection that sends nothing, and one that starts a handshake and stops.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut partial, &[0x16, 0x03, 0x01, 0x00, 0x40]).await.unwrap();
    assert!(closed_by_server(&mut silent).await, "a connection without a handshake stayed open");
    assert!(closed_by_server(&mut partial).await, "a connection with half a handshake stayed open");
    let text = metrics_of(&cluster, 1).await;
    assert!(value(&text, "gpuplane_connections_closed_total{listener=\"api\",reason=\"handshake_timeout\"}") >= 2.0, "{text}");

    // A client that completes its handshake and asks at once is served.
    let admin = Client::with_credentials(
        cluster.endpoints(),
        ClientCredentials { tls: Some(tls_of(pki.path(), &Principal::Admin("ops".into()))), token: None },
    )
    .unwrap();
    seed(&admin).await;
    // Past the handshake deadline, the connection that sent requests is not closed as one
    // that never did: only the two above count.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(admin.get("Tenant", "acme", false).await.unwrap().name, "acme");
    let text = metrics_of(&cluster, 1).await;
    assert_eq!(value(&text, "gpuplane_connections_closed_total{listener=\"api\",reason=\"handshake_timeout\"}"), 2.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_connection_is_closed_but_one_with_an_open_stream_is_kept() {
    let limits = RateLimits { idle_timeout_ms: 300, ..RateLimits::default() };
    let cluster = cluster_with(1, 1, limits).await;
    let client = cluster.client();
    seed(&client).await;
    // A watch on a connection of its own, read up to its bookmark, then left open.
    let watcher = Client::new(cluster.endpoints());
    let mut watch = watcher.watch("Tenant", 0).await.unwrap();
    loop {
        let ev = watch.message().await.unwrap().unwrap();
        if ev.r#type == proto::EventType::Bookmark as i32 {
            break;
        }
    }
    // `client` made its calls and is idle now: its connection is closed.
    wait_for_series(&cluster, 1, "gpuplane_connections_closed_total{listener=\"api\",reason=\"idle\"}", 1.0).await;
    // Several idle deadlines later the watch's connection is still there and the stream
    // delivers; the idle client reconnects on its next call.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    client.put(tenant("after-idle"), proto::WriteMode::Create).await.unwrap();
    let ev = tokio::time::timeout(PATIENCE, watch.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(ev.resource.unwrap().name, "after-idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_past_one_addresss_cap_are_refused_and_the_controller_stays_ready() {
    // Loopback counted like any address here (it is left out by default).
    let limits = RateLimits { connections_per_ip: 2, exempt_loopback: false, handshake_timeout_ms: 120_000, ..RateLimits::default() };
    let cluster = cluster_with(1, 1, limits).await;
    let addr = cluster.addrs[&1];
    let held = [tokio::net::TcpStream::connect(addr).await.unwrap(), tokio::net::TcpStream::connect(addr).await.unwrap()];
    wait_for_series(&cluster, 1, "gpuplane_connections{listener=\"api\"}", 2.0).await;
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut third).await, "a third connection from 127.0.0.1 was kept");
    let text = metrics_of(&cluster, 1).await;
    assert_eq!(value(&text, "gpuplane_connections_refused_total{listener=\"api\",reason=\"per_ip\"}"), 1.0, "{text}");
    // One address at its cap does not take the controller out of service.
    assert_eq!(readyz(&cluster, 1).await.0, 200);

    // Once they close, their places are free again.
    drop(held);
    wait_until_served(&cluster).await;
}

/// Waits until a client is served by node 1 (connections closing give their places back).
async fn wait_until_served(cluster: &TestCluster) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match cluster.client_of(1).list("Tenant", "", true).await {
            Ok(_) => return,
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "never served again: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_its_connection_cap_a_controller_refuses_connections_and_readyz_answers_503() {
    let limits = RateLimits { max_connections: Some(3), handshake_timeout_ms: 120_000, ..RateLimits::default() };
    let cluster = cluster_with(1, 1, limits).await;
    let addr = cluster.addrs[&1];
    assert_eq!(readyz(&cluster, 1).await.0, 200);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    wait_for_series(&cluster, 1, "gpuplane_connections{listener=\"api\"}", 3.0).await;
    let mut fourth = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut fourth).await, "a connection past max_connections was kept");
    let text = metrics_of(&cluster, 1).await;
    assert_eq!(value(&text, "gpuplane_connections_refused_total{listener=\"api\",reason=\"max_connections\"}"), 1.0, "{text}");
    let (status, body) = readyz(&cluster, 1).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("refuses new connections: 3 are open"), "{body}");

    drop(held);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while readyz(&cluster, 1).await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until_served(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_past_its_streams_on_one_connection_waits_for_one_of_them_to_end() {
    let limits = RateLimits { streams_per_connection: 2, ..RateLimits::default() };
    let cluster = cluster_with(1, 1, limits).await;
    seed(&cluster.client()).await;
    let channel: Channel = Endpoint::from_shared(format!("http://{}", cluster.addrs[&1])).unwrap().connect().await.unwrap();
    let watch = |kind: &str| {
        let mut c = ControlPlaneClient::new(channel.clone());
        let request = proto::WatchRequest { kind: kind.into(), name: String::new(), from_revision: 0 };
        async move { c.watch(request).await.unwrap().into_inner() }
    };
    let mut first = watch("Tenant").await;
    let mut second = watch("GpuModel").await;
    assert!(first.message().await.unwrap().is_some() && second.message().await.unwrap().is_some());
    let third = tokio::spawn(watch("InstanceType"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a third stream was opened on a connection allowed two");
    drop(first);
    let mut third = tokio::time::timeout(PATIENCE, third).await.expect("the third stream opens once one ends").unwrap();
    assert!(third.message().await.unwrap().is_some());
}
