//! CI's bounded chaos run: `chaos real --scenario ci` against real controller and agent
//! processes in network namespaces (needs root). It must lose no acknowledged write, keep
//! the history linearizable, inject every fault kind, see every storage fault end in a clear
//! stop (never a panic, never reset state) and a rejoin, and the agents converge.

mod common;

#[test]
fn bounded_chaos_run_loses_nothing_and_stays_linearizable() {
    let Some((report, printed)) = common::run_scenario("ci") else { return };
    for kind in [
        "kill -9",
        "SIGSTOP/SIGCONT",
        "leader cut off from followers",
        "one-way partition (leader not heard)",
        "follower isolated",
        "full disk",
        "corrupted files before restart",
        "agents cut off from controllers",
    ] {
        assert!(report["faults"][kind].as_u64().unwrap_or(0) >= 1, "{kind} was not injected:\n{printed}");
    }
    assert!(report["leader_changes"].as_u64().unwrap() >= 1, "{printed}");
    assert!(report["agent_convergence_ms"].is_number(), "{printed}");

    let storage = report["storage_faults"].as_array().unwrap();
    assert_eq!(storage.len(), 3, "{printed}");
    for s in storage {
        assert_eq!(s["panicked"], false, "{s}");
        assert_eq!(s["served_reset_state"], false, "{s}");
        assert_eq!(s["rejoined"], true, "{s}");
    }
    let full_disk = &storage[0];
    assert_eq!(full_disk["stopped"], true, "{full_disk}");
    assert!(full_disk["message"].as_str().unwrap().contains("No space left on device"), "{full_disk}");
    for corrupted in &storage[1..] {
        if corrupted["stopped"] == true {
            assert!(corrupted["message"].as_str().unwrap().contains("refusing to start"), "{corrupted}");
        }
    }
}
