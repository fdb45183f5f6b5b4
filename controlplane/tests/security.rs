//! Security on a 3-node cluster over mTLS with certificates from the development CA
//! (`security::certs`): tenants see and change only their own services (also through a
//! follower that forwards to the leader), agents act only for their own node, the Raft peer
//! service takes controllers only, callers without credentials are refused, and a tenant
//! over its rate gets ResourceExhausted while others are still served.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use controlplane::client::{Client, RetryPolicy};
use controlplane::loops::LoopSettings;
use controlplane::security::certs;
use controlplane::security::{ClientCredentials, Principal, RateLimits, Security, TlsMaterial, Tokens};
use proto::agent_client::AgentClient;
use proto::raft_service_client::RaftServiceClient;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

fn ca_only(dir: &Path) -> TlsMaterial {
    TlsMaterial::load(&dir.join(certs::CA_CERT), None, None).unwrap()
}

async fn secure_cluster(pki: &Path, limits: RateLimits) -> TestCluster {
    let pki = pki.to_path_buf();
    let tokens =
        Tokens::default().with(Principal::Tenant("acme".into()), "token-acme").with(Principal::Tenant("globex".into()), "token-globex");
    let security = Arc::new(move |id| Security {
        tls: Some(tls_of(&pki, &Principal::Controller(id))),
        tokens: tokens.clone(),
        limits: limits.clone(),
    });
    TestCluster::start_with(3, fast_settings(), LoopSettings { enabled: false, ..LoopSettings::default() }, security).await
}

fn client(endpoints: Vec<String>, tls: TlsMaterial, token: Option<&str>) -> Client {
    Client::with_credentials(endpoints, ClientCredentials { tls: Some(tls), token: token.map(str::to_string) }).unwrap()
}

fn admin(cluster: &TestCluster, pki: &Path) -> Client {
    client(cluster.endpoints(), tls_of(pki, &Principal::Admin("ops".into())), None)
}

fn tenant(endpoints: Vec<String>, pki: &Path, name: &str) -> Client {
    client(endpoints, ca_only(pki), Some(&format!("token-{name}")))
}

async fn channel(addr: &str, tls: &TlsMaterial) -> Channel {
    Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(tls.client_config()).unwrap().connect().await.unwrap()
}

fn tenant_service(name: &str, tenant: &str) -> proto::Resource {
    resource("Service", name, tenant, json!({"model": "resnet50", "slo": {"latency_ms": 50.0, "request_rate": 10.0}}))
}

async fn seed_two_tenants(admin: &Client) {
    seed(admin).await;
    let put = |r| admin.put(r, proto::WriteMode::Unspecified);
    put(resource("Tenant", "globex", "", json!({"display_name": "Globex"}))).await.unwrap();
    put(tenant_service("acme-web", "acme")).await.unwrap();
    put(tenant_service("globex-web", "globex")).await.unwrap();
    put(node("node-a")).await.unwrap();
    put(node("node-b")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_see_and_change_only_their_own_services_even_through_a_follower() {
    let pki = make_pki(&[1, 2, 3], &["node-a", "node-b"]);
    let cluster = secure_cluster(pki.path(), RateLimits::default()).await;
    let admin = admin(&cluster, pki.path());
    seed_two_tenants(&admin).await;
    let acme = tenant(cluster.endpoints(), pki.path(), "acme");

    // Another tenant's service does not exist for acme, and errors do not name globex.
    let err = acme.get("Service", "globex-web", false).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(!err.message().contains("tenant \"globex\""), "{}", err.message());
    assert_eq!(acme.get("Service", "acme-web", false).await.unwrap().tenant, "acme");
    let listed = acme.list("Service", "", false).await.unwrap();
    assert_eq!(listed.resources.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["acme-web"]);
    assert_eq!(acme.list("Service", "globex", false).await.unwrap_err().code(), Code::PermissionDenied);

    // Nor can acme change it: not by name, not by claiming the other tenant, not by delete.
    let err = acme.put(tenant_service("globex-web", "acme"), proto::WriteMode::Unspecified).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(!err.message().contains("globex\""), "{}", err.message());
    let err = acme.put(tenant_service("acme-new", "globex"), proto::WriteMode::Unspecified).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert_eq!(acme.delete("Service", "globex-web", 0).await.unwrap_err().code(), Code::NotFound);
    let theirs = admin.get("Service", "globex-web", false).await.unwrap();
    assert_eq!((theirs.tenant.as_str(), theirs.resource_version), ("globex", theirs.create_revision), "unchanged since created");

    // Its own services it manages freely; an empty tenant means its own.
    let created = acme.put(tenant_service("acme-two", ""), proto::WriteMode::Create).await.unwrap().resource.unwrap();
    assert_eq!(created.tenant, "acme");
    acme.delete("Service", "acme-two", 0).await.unwrap();

    // Its own Tenant (whose status carries its metered usage) it reads; another's does not
    // exist for it, and the list holds its own alone.
    assert_eq!(acme.get("Tenant", "acme", false).await.unwrap().name, "acme");
    assert_eq!(acme.get("Tenant", "globex", false).await.unwrap_err().code(), Code::NotFound);
    let tenants = acme.list("Tenant", "", false).await.unwrap().resources;
    assert_eq!(tenants.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["acme"]);

    // The catalogue is readable; Plans, Nodes and membership are for admins.
    acme.get("GpuModel", "A100-80GB", false).await.unwrap();
    assert_eq!(acme.get("Node", "node-a", false).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(acme.list("Plan", "", false).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(acme.remove_member(3).await.unwrap_err().code(), Code::PermissionDenied);

    // A watch of everything shows acme's resources and the catalogue only.
    let mut watch = acme.watch("", 0).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.message()).await.unwrap().unwrap().unwrap();
        match ev.resource {
            Some(r) => seen.push((r.kind, r.name, r.tenant)),
            None => break,
        }
    }
    assert!(seen.iter().any(|(k, n, _)| k == "Service" && n == "acme-web"), "{seen:?}");
    assert!(seen.iter().all(|(k, _, t)| t != "globex" && k != "Node"), "{seen:?}");
    assert!(!seen.iter().any(|(k, n, _)| k == "Tenant" && n == "globex"), "{seen:?}");

    // Through a follower, which forwards linearizable reads to the leader as a controller
    // carrying acme's identity: still acme's view, not the controller's.
    let leader = cluster.wait_leader().await;
    let follower = cluster.running().map(|(id, _)| id).find(|id| *id != leader).unwrap();
    let via_follower = tenant(vec![cluster.addrs[&follower].to_string()], pki.path(), "acme");
    assert_eq!(via_follower.get("Service", "globex-web", false).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(via_follower.get("Service", "acme-web", false).await.unwrap().name, "acme-web");
    let err = via_follower.put(tenant_service("globex-web", "acme"), proto::WriteMode::Unspecified).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    via_follower.put(tenant_service("acme-three", "acme"), proto::WriteMode::Create).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_batch_is_checked_put_by_put_and_applied_whole_or_not_at_all() {
    let pki = make_pki(&[1, 2, 3], &["node-a", "node-b"]);
    let cluster = secure_cluster(pki.path(), RateLimits::default()).await;
    let admin = admin(&cluster, pki.path());
    seed_two_tenants(&admin).await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.running().map(|(id, _)| id).find(|id| *id != leader).unwrap();
    let acme = tenant(vec![cluster.addrs[&follower].to_string()], pki.path(), "acme");

    // One service of another tenant in the batch: refused, named by its place, and the
    // batch's own services are not created either.
    let err = acme
        .put_many(vec![tenant_service("acme-b1", ""), tenant_service("globex-web", "")], proto::WriteMode::Unspecified)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().starts_with("puts[1]"), "{}", err.message());
    assert!(!err.message().contains("globex\""), "{}", err.message());
    assert_eq!(admin.get("Service", "acme-b1", false).await.unwrap_err().code(), Code::NotFound);
    // What gpuctl apply uses names the refused resource by its place.
    let refused = acme.put_batch(&[tenant_service("acme-b1", ""), tenant_service("globex-web", "")]).await.unwrap_err();
    assert_eq!((refused.status.code(), refused.which), (Code::PermissionDenied, Some(1)));
    // A refusal by the state machine (an unknown model) is all or nothing too.
    let mut bad = tenant_service("acme-b2", "");
    bad.spec_json = json!({"model": "no-such-model", "slo": {"latency_ms": 50.0, "request_rate": 10.0}}).to_string();
    let err = acme.put_many(vec![tenant_service("acme-b1", ""), bad], proto::WriteMode::Unspecified).await.unwrap_err();
    assert!(err.message().starts_with("puts[1]."), "{}", err.message());
    assert_eq!(admin.get("Service", "acme-b1", false).await.unwrap_err().code(), Code::NotFound);

    // Its own services, through a follower: all written, in order, as its own.
    let written = acme
        .put_many(
            vec![tenant_service("acme-b1", ""), tenant_service("acme-b2", ""), tenant_service("acme-web", "")],
            proto::WriteMode::Unspecified,
        )
        .await
        .unwrap();
    let got: Vec<_> = written.written.iter().map(|w| (w.name.as_str(), w.created)).collect();
    assert_eq!(got, [("acme-b1", true), ("acme-b2", true), ("acme-web", false)]);
    // One entry: the two created start at its index, the one updated goes up by one.
    assert_eq!(written.written[0].resource_version, written.written[1].resource_version);
    assert!(written.written[2].resource_version < written.written[0].resource_version);
    assert_eq!(admin.get("Service", "acme-b2", false).await.unwrap().tenant, "acme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_without_credentials_or_with_plaintext_are_refused() {
    let pki = make_pki(&[1, 2, 3], &["node-a", "node-b"]);
    let cluster = secure_cluster(pki.path(), RateLimits::default()).await;
    let no_retry = RetryPolicy { attempts: 1, ..RetryPolicy::default() };

    // TLS to the cluster's CA, but neither a certificate nor a token.
    let anonymous = client(cluster.endpoints(), ca_only(pki.path()), None).with_retry(no_retry.clone());
    let err = anonymous.get("GpuModel", "A100-80GB", true).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = anonymous.cluster_status().await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // An unknown token is no credential either.
    let forged = client(cluster.endpoints(), ca_only(pki.path()), Some("guess")).with_retry(no_retry.clone());
    assert_eq!(forged.get("GpuModel", "A100-80GB", true).await.unwrap_err().code(), Code::Unauthenticated);

    // Plaintext against a TLS controller gets no answer at all.
    let plaintext = Client::new(cluster.endpoints()).with_retry(no_retry);
    let err = plaintext.cluster_status().await.unwrap_err();
    assert!(!matches!(err.code(), Code::Ok | Code::PermissionDenied | Code::NotFound), "{err:?}");

    // A certificate from another CA does not get through the handshake.
    let other = make_pki(&[1, 2, 3], &["node-a", "node-b"]);
    let stranger = tls_of(other.path(), &Principal::Admin("ops".into()));
    let stranger = TlsMaterial { ca_pem: ca_only(pki.path()).ca_pem, identity: stranger.identity };
    let endpoint =
        Endpoint::from_shared(format!("https://{}", cluster.endpoints()[0])).unwrap().tls_config(stranger.client_config()).unwrap();
    let refused = match endpoint.connect().await {
        Err(_) => true,
        Ok(ch) => proto::admin_client::AdminClient::new(ch).cluster_status(proto::ClusterStatusRequest {}).await.is_err(),
    };
    assert!(refused, "a certificate of another CA was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_act_only_for_their_own_node_and_raft_takes_controllers_only() {
    let pki = make_pki(&[1, 2, 3], &["node-a", "node-b"]);
    let cluster = secure_cluster(pki.path(), RateLimits::default()).await;
    seed_two_tenants(&admin(&cluster, pki.path())).await;
    let addr = cluster.endpoints()[0].clone();
    let node_a = tls_of(pki.path(), &Principal::Node("node-a".into()));
    let mut agent = AgentClient::new(channel(&addr, &node_a).await);

    agent.watch_desired(proto::WatchDesiredRequest { node: "node-a".into(), from_version: 0, session: 0 }).await.unwrap();
    let err = agent.watch_desired(proto::WatchDesiredRequest { node: "node-b".into(), from_version: 0, session: 0 }).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().starts_with("node:"), "names the field: {}", err.message());
    let err = agent.report(proto::ReportRequest { node: "node-b".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Nor may it say that another node's agent went away (controllers relay that).
    let ended = proto::WatchesEndedRequest { ended: vec![proto::EndedWatch { node: "node-b".into(), session: 1 }] };
    let err = agent.watches_ended(ended).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("controllers only"), "{}", err.message());

    // Nor learn which nodes' agents are connected where (a new leader asks the controllers).
    let asked = proto::OpenWatchesRequest { nodes: vec!["node-b".into()] };
    let err = agent.open_watches(asked).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Nor relay reports in the name of others.
    let batch = proto::ReportBatchRequest { reports: vec![proto::ReportRequest { node: "node-b".into(), ..Default::default() }] };
    let err = agent.report_batch(batch).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Claiming another principal in metadata counts only from a controller.
    let mut spoofed = tonic::Request::new(proto::WatchDesiredRequest { node: "node-b".into(), from_version: 0, session: 0 });
    spoofed.metadata_mut().insert(proto::meta::PRINCIPAL, "admin:ops".parse().unwrap());
    assert_eq!(agent.watch_desired(spoofed).await.unwrap_err().code(), Code::PermissionDenied);

    // An agent writes only its own Node.
    let err = Client::with_credentials(vec![addr.clone()], ClientCredentials { tls: Some(node_a.clone()), token: None })
        .unwrap()
        .put(node("node-b"), proto::WriteMode::Unspecified)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // The Raft peer service: a node, an admin or a tenant is refused before Raft sees a byte.
    let vote = || proto::RaftPayload { data: b"{}".to_vec(), ..Default::default() };
    for tls in [node_a.clone(), tls_of(pki.path(), &Principal::Admin("ops".into()))] {
        let err = RaftServiceClient::new(channel(&addr, &tls).await).vote(vote()).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }
    let mut with_token = tonic::Request::new(vote());
    with_token.metadata_mut().insert(proto::meta::AUTHORIZATION, "Bearer token-acme".parse().unwrap());
    let err = RaftServiceClient::new(channel(&addr, &ca_only(pki.path())).await).vote(with_token).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_over_its_rate_is_refused_while_others_are_served() {
    let pki = make_pki(&[1, 2, 3], &["node-a", "node-b"]);
    let limits = RateLimits { tenant_rps: 1, tenant_burst: 3, ..RateLimits::default() };
    let cluster = secure_cluster(pki.path(), limits).await;
    let admin = admin(&cluster, pki.path());
    seed_two_tenants(&admin).await;
    let one = vec![cluster.endpoints()[0].clone()];
    let acme = tenant(one.clone(), pki.path(), "acme");

    // One request a second with a burst of three: well before 50 requests, acme is refused.
    let mut refused = None;
    for _ in 0..50 {
        if let Err(status) = acme.get("GpuModel", "A100-80GB", true).await {
            refused = Some(status);
            break;
        }
    }
    let status = refused.expect("acme was never limited");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let retry_ms: u64 = status.metadata().get(proto::meta::RETRY_AFTER_MS).expect("retry-after-ms").to_str().unwrap().parse().unwrap();
    assert!(retry_ms > 0 && retry_ms <= 1000, "retry after {retry_ms} ms");
    assert!(status.message().contains("retry in"), "{}", status.message());
    let retry_info = tonic_types::StatusExt::get_details_retry_info(&status).expect("a google.rpc.RetryInfo detail");
    assert_eq!(retry_info.retry_delay, Some(Duration::from_millis(retry_ms)));

    // Another tenant and the admin are still served by the same controller.
    tenant(one.clone(), pki.path(), "globex").get("Service", "globex-web", true).await.unwrap();
    client(one, tls_of(pki.path(), &Principal::Admin("ops".into())), None).get("Service", "acme-web", true).await.unwrap();
}
