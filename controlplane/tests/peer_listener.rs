//! Peer listeners (README, `peer_listen` and `gpuctl cluster add`): a member with a peer
//! address is sent Raft's RPCs there, not at its API address; the peer listener serves
//! nothing else; AddMember checks the peer address as it checks the API address.

mod common;

use std::time::Duration;

use common::*;
use tonic::Code;

fn field_of(err: &tonic::Status) -> &str {
    err.metadata().get(proto::meta::FIELD).map_or("", |v| v.to_str().unwrap())
}

/// Member `id` as the leader sees it.
async fn member(client: &controlplane::client::Client, id: u64) -> Option<proto::Member> {
    let leader = client.cluster_status().await.unwrap().leader_address;
    client.node_status(&leader).await.unwrap().members.into_iter().find(|m| m.node_id == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raft_rpcs_go_to_a_members_peer_address() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    for id in 1..=3 {
        let m = member(&client, id).await.unwrap();
        assert_eq!(m.peer_address, cluster.peer_addrs[&id].to_string(), "{m:?}");
    }
    cluster.start_node(4, "127.0.0.1:0".parse().unwrap(), None).await;
    let (addr4, peer4) = (cluster.addrs[&4].to_string(), cluster.peer_addrs[&4].to_string());

    // With a peer address where nothing listens, the learner gets nothing, although its API
    // address (which serves Raft too) answers.
    client.add_member_with_peer_address(4, &addr4, Some("127.0.0.1:1"), false).await.unwrap();
    for i in 0..20 {
        client.put(resource("Tenant", &format!("t{i}"), "", serde_json::json!({})), proto::WriteMode::Create).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let m4 = member(&client, 4).await.unwrap();
    assert_eq!((m4.peer_address.as_str(), m4.matched_index), ("127.0.0.1:1", 0), "{m4:?}");

    // At its real peer address it catches up and is promoted.
    client.remove_member(4).await.unwrap();
    let status = client.add_member_with_peer_address(4, &addr4, Some(&peer4), true).await.unwrap().status.unwrap();
    let m4 = status.members.iter().find(|m| m.node_id == 4).unwrap();
    assert!(m4.voter && m4.matched_index > 0 && m4.peer_address == peer4, "{m4:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_peer_listener_serves_raft_alone() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let at_peer_port = controlplane::client::Client::new(vec![cluster.peer_addrs[&1].to_string()]);
    let err = at_peer_port.node_status(&cluster.peer_addrs[&1].to_string()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_peer_addresses_are_refused_and_change_nothing() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    cluster.start_node(4, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr4 = cluster.addrs[&4].to_string();
    let (addr2, peer2) = (cluster.addrs[&2].to_string(), cluster.peer_addrs[&2].to_string());
    let long = format!("{}:7410", "h".repeat(300));
    let cases: Vec<(u64, &str, &str, Code, &str, String)> = vec![
        (4, &addr4, "nowhere", Code::InvalidArgument, "peer_address", "\"nowhere\" is not host:port".into()),
        (4, &addr4, &long, Code::InvalidArgument, "peer_address", "longer than an address can be".into()),
        // Node 2's peer address for another node: names node 2.
        (4, &addr4, &peer2, Code::AlreadyExists, "peer_address", format!("{peer2} is already the peer address of node 2")),
        // Node 2 again at its API address but another peer address.
        (
            2,
            &addr2,
            "127.0.0.1:1",
            Code::AlreadyExists,
            "node_id",
            format!("node 2 is already a member (voter) at {addr2} (peers: {peer2})"),
        ),
    ];
    let before = client.node_status(&client.cluster_status().await.unwrap().leader_address).await.unwrap().members;
    for (id, addr, peer, code, field, words) in cases {
        let err = client.add_member_with_peer_address(id, addr, Some(peer), false).await.unwrap_err();
        assert_eq!((err.code(), field_of(&err)), (code, field), "add {id} at {addr}, peers at {peer}: {err:?}");
        assert!(err.message().contains(&words), "{:?} should contain {words:?}", err.message());
        let now = client.node_status(&client.cluster_status().await.unwrap().leader_address).await.unwrap().members;
        let ids = |ms: &[proto::Member]| ms.iter().map(|m| (m.node_id, m.address.clone(), m.peer_address.clone())).collect::<Vec<_>>();
        assert_eq!(ids(&now), ids(&before), "add {id} changed the membership");
    }
}
