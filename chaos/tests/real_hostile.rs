//! `chaos real --scenario hostile` against real controller and agent processes in network
//! namespaces (needs root): a hostile tenant, operator and compromised node attack while
//! clients write. Every attack must be answered with its expected code and field, the
//! cluster must keep serving (nothing lost, linearizable), the other tenant's service stay
//! planned and routed only to the real agents, and the valid-but-hostile service be refused
//! by name; the tenant's unread watches past its bound refused, a connection flood without
//! handshakes closed, and an anonymous flood of another tenant's endpoint refused while
//! that tenant's own caller loses no request.

mod common;

#[test]
fn hostile_tenant_operator_and_node_change_nothing_they_should_not() {
    let Some((report, printed)) = common::run_scenario("hostile") else { return };
    let attempts = report["hostile"].as_array().unwrap();
    for who in ["tenant", "operator", "node"] {
        assert!(attempts.iter().any(|a| a["who"] == who), "no {who} attack:\n{printed}");
    }
    for a in attempts {
        assert_eq!(a["expected"], a["got"], "{a}");
    }
    let refused = attempts.iter().filter(|a| a["got"] != "accepted").count();
    assert!(refused >= 10, "{printed}");
    let floods = &report["floods"];
    assert_eq!(floods["watches"]["past_the_bound"], "ResourceExhausted", "{printed}");
    assert_eq!(floods["connections"]["still_open"], 0, "{printed}");
    assert_eq!(floods["connections"]["api_answered_during"], true, "{printed}");
    let data = &floods["data_plane"];
    assert!(data["anonymous_sent"].as_u64().unwrap() > 0, "{printed}");
    assert_eq!(data["anonymous_refused"], data["anonymous_sent"], "{printed}");
    assert_eq!(data["victim_failed"], 0, "{printed}");
    // The tenant at its quota: its services are sized and refused by reason, not planned past it.
    let outcomes = floods["leader"]["outcomes"].as_array().unwrap();
    assert!(outcomes.iter().any(|o| o[1].as_str().unwrap().contains("over quota")), "{printed}");
}
