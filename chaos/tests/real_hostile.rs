//! `chaos real --scenario hostile` against real controller and agent processes in network
//! namespaces (needs root): a hostile tenant, operator and compromised node attack while
//! clients write. Every attack must be answered with its expected code and field, the
//! cluster must keep serving (nothing lost, linearizable), the other tenant's service stay
//! planned and routed only to the real agents, and the valid-but-hostile service be refused
//! by name.

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
}
