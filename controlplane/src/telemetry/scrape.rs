//! What a scrape reads from a controller, and what `/readyz` decides from it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::metrics::{RaftFigures, ServiceSample, Snapshot};
use crate::controller::Controller;
use crate::resources::TenantStatus;
use crate::resources::{Kind, Spec};
use crate::state::ClusterState;

/// The state figures of `controller` now.
pub fn snapshot(controller: &Controller) -> Snapshot {
    let m = controller.raft.metrics().borrow().clone();
    let raft = RaftFigures {
        term: m.current_term,
        commit_index: controller.committed.load(Ordering::Relaxed),
        log_appended_bytes: controller.log_bytes.load(Ordering::Relaxed),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        is_leader: m.current_leader == Some(controller.id),
        leader: m.current_leader,
    };
    // Under the lock only an O(1) copy of the state: summing 10,000 hosts' GPUs there
    // would hold up the applies.
    let cluster = controller.read(|d| d.cluster.resources_only());
    let plan_cost_per_hour = plan_cost(&cluster);
    // As the leader last metered them (`loops::metering`): the same figures on every
    // controller, and no pass over the plan per scrape.
    let tenants = cluster.list(Kind::Tenant).map(|r| (r.name.clone(), TenantStatus::of(r))).collect();
    // Reports reach the leader only; a former leader's are stale.
    let services = if raft.is_leader {
        controller
            .reports
            .all()
            .into_values()
            .flat_map(|r| {
                let node = r.report.node.clone();
                r.report.metrics.clone().into_iter().map(move |s| ServiceSample {
                    service: s.service,
                    node: node.clone(),
                    p99_ms: s.p99_ms,
                    throughput_rps: s.throughput_rps,
                    arrival_rps: s.arrival_rps,
                    failed: s.failed,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    Snapshot { raft, plan_cost_per_hour, services, tenants }
}

/// Cost per hour of the GPUs the committed plan uses, each at its node's instance price per
/// GPU (as `gpuctl demo` prints it); `None` without a plan.
fn plan_cost(cluster: &ClusterState) -> Option<f64> {
    let Spec::Plan(plan) = &cluster.get(Kind::Plan, "current")?.spec else { return None };
    let per_gpu: BTreeMap<&str, f64> = cluster
        .list(Kind::InstanceType)
        .filter_map(|r| match &r.spec {
            Spec::InstanceType(t) => Some((r.name.as_str(), t.price_per_hour / f64::from(t.gpu_count.max(1)))),
            _ => None,
        })
        .collect();
    let price = |node: &str| match cluster.get(Kind::Node, node).map(|n| &n.spec) {
        Some(Spec::Node(n)) => per_gpu.get(n.instance_type.as_str()).copied().unwrap_or(0.0),
        _ => 0.0,
    };
    Some(plan.gpus.iter().map(|g| price(&g.node)).sum())
}

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
