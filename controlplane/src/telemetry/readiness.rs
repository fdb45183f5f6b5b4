//! What `/readyz` decides from a controller's figures.

use super::metrics::RaftFigures;

/// A leader-only loop that failed this many passes in a row makes the leader unready.
pub const UNREADY_AFTER_LOOP_FAILURES: u32 = 3;

/// Ready: the node knows a leader, has applied everything it knows to be committed, and no
/// leader-only loop of its has failed [`UNREADY_AFTER_LOOP_FAILURES`] passes in a row.
/// Otherwise the reason, in one line.
pub fn readiness(raft: &RaftFigures, failing_loops: &[(&str, u32)]) -> Result<(), String> {
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
        assert_eq!(readiness(&caught_up, &[]), Ok(()));
        assert_eq!(readiness(&RaftFigures { leader: None, ..caught_up.clone() }, &[]), Err("no leader known".into()));
        assert_eq!(
            readiness(&RaftFigures { applied_index: 5, ..caught_up.clone() }, &[]),
            Err("applied index 5 behind commit index 7".into())
        );
        assert_eq!(
            readiness(&caught_up, &[("provisioner", 4)]),
            Err("the provisioner loop failed its last 4 passes (see gpuplane_loop_failures_total and the log)".into())
        );
    }
}
