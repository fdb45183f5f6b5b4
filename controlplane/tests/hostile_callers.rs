//! Hostile tenants and nodes at the Admin service and the resource API (issue 57): the
//! cluster's status (membership, leader, log positions) is for admins and controllers only,
//! not for a tenant's token or a node's certificate; removing a node that is not a member is
//! NotFound and changes nothing; a spec with NaN, an infinity or a 100,000-deep nesting is
//! refused at once, as malformed JSON.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use controlplane::client::{Client, RetryPolicy};
use controlplane::loops::LoopSettings;
use controlplane::security::certs;
use controlplane::security::{ClientCredentials, Principal, RateLimits, Security, TlsMaterial, Tokens};
use proto::admin_client::AdminClient;
use tonic::transport::Endpoint;
use tonic::Code;

async fn secure_cluster(pki: &Path) -> TestCluster {
    let pki = pki.to_path_buf();
    let tokens = Tokens::default().with(Principal::Tenant("acme".into()), "token-acme");
    let security = Arc::new(move |id| Security {
        tls: Some(tls_of(&pki, &Principal::Controller(id))),
        tokens: tokens.clone(),
        limits: RateLimits::default(),
    });
    TestCluster::start_with(3, fast_settings(), LoopSettings { enabled: false, ..LoopSettings::default() }, security).await
}

fn client(endpoints: Vec<String>, tls: TlsMaterial, token: Option<&str>) -> Client {
    Client::with_credentials(endpoints, ClientCredentials { tls: Some(tls), token: token.map(str::to_string) })
        .unwrap()
        .with_retry(RetryPolicy { attempts: 3, ..RetryPolicy::default() })
}

fn field_of(err: &tonic::Status) -> &str {
    err.metadata().get(proto::meta::FIELD).map_or("", |v| v.to_str().unwrap())
}

/// Members as (id, address, voter), as the leader sees them.
async fn members(admin: &Client) -> Vec<(u64, String, bool)> {
    let leader = admin.cluster_status().await.unwrap().leader_address;
    admin.node_status(&leader).await.unwrap().members.into_iter().map(|m| (m.node_id, m.address, m.voter)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_status_is_for_admins_and_controllers_and_a_new_member_is_still_probed() {
    let pki = make_pki(&[1, 2, 3, 4], &["node-a"]);
    let mut cluster = secure_cluster(pki.path()).await;
    let ca = TlsMaterial::load(&pki.path().join(certs::CA_CERT), None, None).unwrap();
    let admin = client(cluster.endpoints(), tls_of(pki.path(), &Principal::Admin("ops".into())), None);
    assert_eq!(admin.cluster_status().await.unwrap().members.len(), 3);

    // A tenant's token and a node's certificate read it no more (README: "not membership").
    let acme = client(cluster.endpoints(), ca.clone(), Some("token-acme"));
    let node = client(cluster.endpoints(), tls_of(pki.path(), &Principal::Node("node-a".into())), None);
    for (who, c, role) in [("tenant", &acme, "tenant:acme"), ("node", &node, "node:node-a")] {
        let addr = cluster.endpoints()[0].clone();
        for err in [c.cluster_status().await.unwrap_err(), c.node_status(&addr).await.unwrap_err()] {
            assert_eq!(err.code(), Code::PermissionDenied, "{who}: {err:?}");
            assert!(err.message().contains("ClusterStatus") && err.message().contains(role), "{who}: {}", err.message());
        }
    }
    // What they may do is unchanged: the tenant reads the catalogue.
    // (none is seeded: NotFound, not PermissionDenied)
    assert_eq!(acme.get("GpuModel", "A100-80GB", false).await.unwrap_err().code(), Code::NotFound);

    // A controller's certificate reads it: the leader probes a node it adds with this call.
    let addr = cluster.endpoints()[0].clone();
    let as_controller = tls_of(pki.path(), &Principal::Controller(2));
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(as_controller.client_config())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = AdminClient::new(channel).cluster_status(proto::ClusterStatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.members.len(), 3);

    cluster.start_node(4, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr4 = cluster.addrs[&4].to_string();
    admin.add_member(4, &addr4, false).await.unwrap();
    assert!(members(&admin).await.contains(&(4, addr4.clone(), false)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removing_a_node_that_is_not_a_member_is_not_found_and_changes_nothing() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    let before = members(&client).await;
    let leader = client.cluster_status().await.unwrap().leader_id;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    // At the leader, and through a follower (which forwards: its membership may be behind).
    for c in [cluster.client_of(leader), cluster.client_of(follower)] {
        let err = c.remove_member(99).await.unwrap_err();
        assert_eq!((err.code(), field_of(&err)), (Code::NotFound, "node_id"), "{err:?}");
        assert_eq!(err.message(), "node_id: node 99 is not a member of the cluster (its members are 1, 2, 3); nothing was changed");
        let err = c.remove_member(0).await.unwrap_err();
        assert_eq!((err.code(), field_of(&err)), (Code::InvalidArgument, "node_id"), "{err:?}");
        assert_eq!(members(&client).await, before);
    }
    // Adding an existing id at another address is refused too (membership_checks.rs has
    // every case), and at its own address it changes nothing.
    let err = client.add_member(2, "127.0.0.1:1", true).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err)), (Code::AlreadyExists, "node_id"), "{err:?}");
    let (addr2, peer2) = (cluster.addrs[&2].to_string(), cluster.peer_addrs[&2].to_string());
    client.add_member_with_peer_address(2, &addr2, Some(&peer2), true).await.unwrap();
    assert_eq!(members(&client).await, before);

    // A member is removed as before.
    client.remove_member(follower).await.unwrap();
    let after = members(&client).await;
    assert_eq!(after.len(), 2);
    assert!(after.iter().all(|(id, _, _)| *id != follower));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spec_with_nan_infinity_or_deep_nesting_is_refused_as_malformed_json_at_once() {
    let cluster = TestCluster::start(1, fast_settings()).await;
    let client = cluster.client();
    let tenant = |spec_json: String| proto::Resource { kind: "Tenant".into(), name: "acme".into(), spec_json, ..Default::default() };
    // JSON has no NaN or infinity (serde_json refuses them, and a number that overflows).
    for number in ["NaN", "-Infinity", "1e999"] {
        let err = client.put(tenant(format!("{{\"max_gpus\": {number}}}")), proto::WriteMode::Create).await.unwrap_err();
        assert_eq!((err.code(), field_of(&err)), (Code::InvalidArgument, "spec"), "{number}: {err:?}");
        assert!(
            err.message().starts_with("spec: malformed JSON: ") && err.message().contains("line 1 column"),
            "{number}: {}",
            err.message()
        );
    }
    let err = client.put(tenant("{\"max_gpus\": NaN}".into()), proto::WriteMode::Create).await.unwrap_err();
    assert_eq!(err.message(), "spec: malformed JSON: expected value at line 1 column 14");
    // A 100,000-deep spec: the typed decoding stops at the first level its field does not
    // take, and serde_json's recursion limit (128 levels; the workspace does not enable its
    // `unbounded_depth`) bounds every parse, typed or not.
    let deep = "[".repeat(100_000);
    for spec in [deep.clone(), format!("{{\"max_gpus\": {deep}"), format!("{{\"display_name\": {deep}")] {
        let err = client.put(tenant(spec), proto::WriteMode::Create).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("invalid type: sequence") && err.message().contains("line 1 column"), "{}", err.message());
    }
    let err = serde_json::from_str::<serde_json::Value>(&deep).unwrap_err();
    assert!(err.to_string().starts_with("recursion limit exceeded"), "{err}");
    // Nothing was written.
    assert_eq!(client.get("Tenant", "acme", false).await.unwrap_err().code(), Code::NotFound);
}
