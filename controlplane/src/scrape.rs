//! A controller's `/metrics`, `/healthz` and `/readyz` (served over plain HTTP on a separate
//! listener, `metrics_listen`, never on the Raft peer port): what a scrape reads from the
//! controller. The series and the readiness rule are `telemetry`'s, which knows nothing of
//! the controller.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::controller::Controller;
use crate::resources::TenantStatus;
use crate::resources::{Kind, Spec};
use crate::server::Connections;
use crate::state::ClusterState;
use crate::telemetry::{readiness, serve, RaftFigures, Response, ServiceSample, Snapshot, UNREADY_AFTER_LOOP_FAILURES};

/// Serves `/metrics`, `/healthz` and `/readyz` for `controller` on `listener` until aborted;
/// `api`: the connections of its API's listener, whose accept errors and connection cap
/// `/readyz` answers 503 for (none in the simulation).
pub async fn serve_controller(listener: tokio::net::TcpListener, controller: Controller, api: Option<Arc<Connections>>) {
    serve(
        listener,
        Arc::new(move |path: &str| match path {
            "/metrics" => Response::metrics(controller.telemetry.render(&snapshot(&controller))),
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => {
                let (accept_failing, refusing_at) = api.as_ref().map(|a| a.unready()).unwrap_or_default();
                let loops = controller.telemetry.failing_loops(UNREADY_AFTER_LOOP_FAILURES);
                match readiness(&snapshot(&controller).raft, &loops, accept_failing.as_deref(), refusing_at) {
                    Ok(()) => Response::text(200, "ready\n"),
                    Err(reason) => Response::text(503, format!("not ready: {reason}\n")),
                }
            }
            _ => Response::text(404, "not found (try /metrics, /healthz, /readyz)\n"),
        }),
    )
    .await
}

/// The state figures of `controller` now.
pub fn snapshot(controller: &Controller) -> Snapshot {
    let m = controller.raft_status();
    let raft = RaftFigures {
        term: m.term,
        commit_index: controller.committed.load(Ordering::Relaxed),
        log_appended_bytes: controller.log_bytes.load(Ordering::Relaxed),
        applied_index: m.applied_index,
        last_log_index: m.last_log_index,
        is_leader: m.leader == Some(controller.id),
        leader: m.leader,
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
                    server: s.server,
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
