//! What `/readyz` decides from a controller's figures.

use super::metrics::RaftFigures;

/// A leader-only loop that failed this many passes in a row makes the leader unready.
pub const UNREADY_AFTER_LOOP_FAILURES: u32 = 3;

/// Ready: the API's listener accepts connections (`accept_failing`: the error of its last
/// accept, when that failed lately and nothing was accepted since) and is not refusing them
/// at its connection cap (`refusing_at`: the cap, when it refused a connection at it lately
/// or is at it now), the node knows a leader, has applied everything it knows to be
/// committed, and no leader-only loop of its has failed [`UNREADY_AFTER_LOOP_FAILURES`]
/// passes in a row. Otherwise the reason, in one line.
///
/// Connections refused at the cap of one client address (`connections_per_ip`) do not make
/// a controller unready: that would let one address take every controller out of service.
pub fn readiness(
    raft: &RaftFigures,
    failing_loops: &[(&str, u32)],
    accept_failing: Option<&str>,
    refusing_at: Option<usize>,
) -> Result<(), String> {
    if let Some(error) = accept_failing {
        return Err(format!("the API's listener cannot accept connections: {error} (see gpuplane_accept_errors_total)"));
    }
    if let Some(cap) = refusing_at {
        return Err(format!(
            "the API refuses new connections: {cap} are open, its cap ([limits] max_connections; see gpuplane_connections_refused_total)"
        ));
    }
    if let Some((name, n)) = failing_loops.first() {
        return Err(format!("the {name} loop failed its last {n} passes (see gpuplane_loop_failures_total and the log)"));
    }
    if raft.leader.is_none() {
        return Err("no leader known".into());
    }
    if raft.applied_index < raft.commit_index {
        return Err(format!("applied index {} behind commit index {}", raft.applied_index, raft.commit_index));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_a_leader_and_the_commit_index_applied() {
        let caught_up = RaftFigures { leader: Some(2), commit_index: 7, applied_index: 7, ..Default::default() };
        assert_eq!(readiness(&caught_up, &[], None, None), Ok(()));
        assert_eq!(readiness(&RaftFigures { leader: None, ..caught_up.clone() }, &[], None, None), Err("no leader known".into()));
        assert_eq!(
            readiness(&RaftFigures { applied_index: 5, ..caught_up.clone() }, &[], None, None),
            Err("applied index 5 behind commit index 7".into())
        );
        assert_eq!(
            readiness(&caught_up, &[("provisioner", 4)], None, None),
            Err("the provisioner loop failed its last 4 passes (see gpuplane_loop_failures_total and the log)".into())
        );
    }

    #[test]
    fn a_caught_up_node_whose_api_cannot_take_connections_is_not_ready() {
        let caught_up = RaftFigures { leader: Some(2), commit_index: 7, applied_index: 7, ..Default::default() };
        assert_eq!(
            readiness(&caught_up, &[], Some("Too many open files (os error 24)"), None),
            Err("the API's listener cannot accept connections: Too many open files (os error 24) (see gpuplane_accept_errors_total)".into())
        );
        let at_cap = readiness(&caught_up, &[], None, Some(100)).unwrap_err();
        assert!(at_cap.starts_with("the API refuses new connections: 100 are open"), "{at_cap}");
    }
}
