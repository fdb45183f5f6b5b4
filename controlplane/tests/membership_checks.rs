//! AddMember refuses bad input and changes nothing then (README, "Membership"): node id 0,
//! an id that is a member at another address, an address another member uses, an address
//! that does not answer, and a node that answers as another id. A real new node joins as a
//! learner and is promoted once caught up.

mod common;

use common::*;
use tonic::Code;

/// Members as (id, address, voter), from the leader's view.
async fn members(client: &controlplane::client::Client) -> Vec<(u64, String, bool)> {
    let status = client.cluster_status().await.unwrap();
    let leader = status.leader_address;
    let status = client.node_status(&leader).await.unwrap();
    status.members.into_iter().map(|m| (m.node_id, m.address, m.voter)).collect()
}

fn field_of(err: &tonic::Status) -> &str {
    err.metadata().get(proto::meta::FIELD).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_additions_are_refused_and_change_nothing() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let before = members(&client).await;
    assert_eq!(before.len(), 3);
    let addr2 = cluster.addrs[&2].to_string();
    // A running node that is not a member, with id 5.
    cluster.start_node(5, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr5 = cluster.addrs[&5].to_string();

    let cases: Vec<(u64, String, Code, &str, Vec<String>)> = vec![
        (0, addr5.clone(), Code::InvalidArgument, "node_id", vec!["0".into()]),
        // Node 2 again at another address: named with its address.
        (2, addr5.clone(), Code::AlreadyExists, "node_id", vec!["node 2".into(), addr2.clone()]),
        // Node 2's address for a new id: names node 2.
        (4, addr2.clone(), Code::AlreadyExists, "address", vec![addr2.clone(), "node 2".into()]),
        // Nothing listens there.
        (4, "127.0.0.1:1".into(), Code::FailedPrecondition, "address", vec!["127.0.0.1:1".into(), "did not answer".into()]),
        // Node 5 is not node 4.
        (4, addr5.clone(), Code::InvalidArgument, "node_id", vec![format!("the node at {addr5} says it is node 5")]),
    ];
    for (id, addr, code, field, words) in cases {
        for promote in [true, false] {
            let err = client.add_member(id, &addr, promote).await.unwrap_err();
            assert_eq!(err.code(), code, "add {id} at {addr}: {err:?}");
            assert_eq!(field_of(&err), field, "add {id} at {addr}: {err:?}");
            for w in &words {
                assert!(err.message().contains(w.as_str()), "add {id} at {addr}: {:?} should contain {w:?}", err.message());
            }
            assert_eq!(members(&client).await, before, "add {id} at {addr} changed the membership");
        }
    }

    // Through a follower too (it forwards to the leader).
    let leader = client.cluster_status().await.unwrap().leader_id;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let err = cluster.client_of(follower).add_member(4, "127.0.0.1:1", true).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err)), (Code::FailedPrecondition, "address"), "{err:?}");
    assert_eq!(members(&client).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_node_joins_as_learner_and_is_promoted_once_caught_up() {
    let mut cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    for i in 0..150 {
        client.put(resource("Tenant", &format!("t{i}"), "", serde_json::json!({})), proto::WriteMode::Create).await.unwrap();
    }
    cluster.start_node(4, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr4 = cluster.addrs[&4].to_string();

    // As a learner only.
    client.add_member(4, &addr4, false).await.unwrap();
    assert!(members(&client).await.contains(&(4, addr4.clone(), false)));
    // Again, now to promote it: the learner at its own address is promoted.
    let status = client.add_member(4, &addr4, true).await.unwrap().status.unwrap();
    assert!(status.members.iter().any(|m| m.node_id == 4 && m.voter), "{:?}", status.members);
    let m4 = status.members.iter().find(|m| m.node_id == 4).unwrap();
    assert!(m4.matched_index > 0, "{m4:?}");
    // Adding a voter again at its address changes nothing; as a learner it is refused.
    client.add_member(4, &addr4, true).await.unwrap();
    let err = client.add_member(4, &addr4, false).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err)), (Code::FailedPrecondition, "node_id"), "{err:?}");

    // A learner that stopped answering is not promoted (its matched index is recent).
    cluster.start_node(6, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr6 = cluster.addrs[&6].to_string();
    client.add_member(6, &addr6, false).await.unwrap();
    cluster.stop(6).await;
    let before = members(&client).await;
    assert!(before.contains(&(6, addr6.clone(), false)));
    let err = client.add_member(6, &addr6, true).await.unwrap_err();
    // Refused either way: its address no longer answers the probe, or (when the probe
    // raced the stop and got an answer) it never catches up within the wait.
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(["address", "node_id"].contains(&field_of(&err)), "{err:?}");
    assert_eq!(members(&client).await, before);
    client.remove_member(6).await.unwrap();

    // A fresh node promoted in one call.
    cluster.start_node(5, "127.0.0.1:0".parse().unwrap(), None).await;
    let addr5 = cluster.addrs[&5].to_string();
    client.add_member(5, &addr5, true).await.unwrap();
    let now = members(&client).await;
    assert!(now.contains(&(5, addr5, true)), "{now:?}");
    assert_eq!(now.iter().filter(|m| m.2).count(), 5);
    let revision = client.list("Tenant", "", false).await.unwrap().revision;
    cluster.wait_applied(revision).await;
    assert!(cluster.node(5).controller.read(|d| d.cluster.get(controlplane::resources::Kind::Tenant, "t149").is_some()));
}
