//! What a node's report may say, checked before anything of it is used. A node certificate
//! proves which node speaks, not that what it says is true: a compromised node could report
//! metrics or a router endpoint for another tenant's service (a traffic hijack through
//! `gpuctl get endpoints`, false load for the autoscaler), or numbers that break the
//! arithmetic. Pure: the report, the node's spec and its placement in, a verdict out.

use std::collections::BTreeSet;

use super::Placement;
use crate::resources::limits::*;
use crate::resources::{bounded_list, bounded_text, host_of, named, non_negative, validate_name, FieldError, NodeSpec};

/// Why a report was refused: `PermissionDenied` (it speaks for what is not the node's) or
/// `InvalidArgument` (malformed or out of bounds). The field path names the offending entry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportRefusal {
    #[error("{0}")]
    NotTheNodes(FieldError),
    #[error("{0}")]
    Invalid(FieldError),
}

impl ReportRefusal {
    /// The label of `gpuplane_agent_reports_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            ReportRefusal::NotTheNodes(_) => "not_the_nodes",
            ReportRefusal::Invalid(_) => "invalid",
        }
    }
}

impl From<FieldError> for ReportRefusal {
    fn from(e: FieldError) -> Self {
        ReportRefusal::Invalid(e)
    }
}

/// Checks `report` from the node whose spec is `node` and whose committed placement is
/// `placed`: metrics and endpoints only for services the plan placed on this node,
/// endpoints on the node's own host, observed GPUs only the node's own, and every number
/// finite, non-negative and bounded.
///
/// An agent behind its desired state (`applied_version` below `placed.version`) still
/// serves, and measures, what it was told before: its windows of services the plan has
/// since moved away are stale, not hostile. So are those of an agent ahead of this
/// controller (it got a newer desired state from a follower that applied the entry before
/// this leader did): what it runs cannot be judged from here yet. Their indexes in
/// `report.metrics` are returned for the caller to drop (never used), and the rest of the
/// report stands; an agent that claims to run exactly the current version gets them
/// refused.
pub fn check_report(report: &proto::ReportRequest, node: &NodeSpec, placed: &Placement) -> Result<Vec<usize>, ReportRefusal> {
    let behind = report.applied_version != placed.version;
    let mut stale = Vec::new();
    let own_gpus: BTreeSet<&str> = node.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let node_host = host_of(&node.address);

    bounded_list("gpus", report.gpus.len(), MAX_GPUS_PER_NODE)?;
    if report.gpus_unchanged && !report.gpus.is_empty() {
        return Err(FieldError::invalid(
            "gpus",
            format!("{} GPUs in a report that leaves them out (gpus_unchanged is set): it carries none", report.gpus.len()),
        )
        .into());
    }
    for (i, gpu) in report.gpus.iter().enumerate() {
        if !own_gpus.contains(gpu.gpu_uuid.as_str()) {
            return Err(ReportRefusal::NotTheNodes(FieldError::invalid(
                format!("gpus[{i}].gpu_uuid"),
                format!("GPU {:?} is not one of this node's GPUs", truncated(&gpu.gpu_uuid)),
            )));
        }
        named(bounded_list("", gpu.instances.len(), usize::from(MAX_MIG_SLICES)), || format!("gpus[{i}].instances"))?;
        for (j, inst) in gpu.instances.iter().enumerate() {
            named(bounded_text("", &inst.profile, MAX_NAME_LEN), || format!("gpus[{i}].instances[{j}].profile"))?;
        }
        named(bounded_list("", gpu.workloads.len(), MAX_REPORTED_WORKLOADS_PER_GPU), || format!("gpus[{i}].workloads"))?;
        for (j, w) in gpu.workloads.iter().enumerate() {
            let wf = |rest: &str| format!("gpus[{i}].workloads[{j}].{rest}");
            // A workload the plan no longer wants may still be draining: observed state is
            // what runs, so it is bounded and well-formed but not matched against the plan.
            named(validate_name("", &w.service), || wf("service"))?;
            named(non_negative("", w.mps_percent, 100.0), || wf("mps_percent"))?;
            named(bounded_text("", &w.state, 32), || wf("state"))?;
            named(bounded_text("", &w.process, MAX_NAME_LEN * 2), || wf("process"))?;
        }
    }

    // Each entry is bounded above, their product is not: 64 GPUs of 256 workloads made a
    // 3.9 MB Node status, and the log grew by it at every change.
    let observed: usize = report.gpus.iter().map(prost::Message::encoded_len).sum();
    if observed > MAX_REPORTED_OBSERVED_BYTES {
        return Err(FieldError::invalid(
            "gpus",
            format!("the observed state is {observed} bytes encoded; a report holds at most {MAX_REPORTED_OBSERVED_BYTES}"),
        )
        .into());
    }

    bounded_list("metrics", report.metrics.len(), MAX_REPORTED_SERVICES)?;
    let mut seen = BTreeSet::new();
    for (i, m) in report.metrics.iter().enumerate() {
        let f = |rest: &str| format!("metrics[{i}].{rest}");
        named(validate_name("", &m.service), || f("service"))?;
        let planned = placed.services.contains_key(m.service.as_str());
        if !planned && behind {
            stale.push(i);
            continue;
        }
        if !planned {
            return Err(ReportRefusal::NotTheNodes(FieldError::invalid(
                f("service"),
                format!("the committed plan places no workload of service {:?} on this node", m.service),
            )));
        }
        if !seen.insert(m.service.as_str()) {
            return Err(FieldError::invalid(f("service"), format!("service {:?} is reported twice", m.service)).into());
        }
        named(non_negative("", m.p99_ms, MAX_REPORTED_LATENCY_MS), || f("p99_ms"))?;
        named(non_negative("", m.throughput_rps, MAX_REQUEST_RATE), || f("throughput_rps"))?;
        named(non_negative("", m.arrival_rps, MAX_REQUEST_RATE), || f("arrival_rps"))?;
        named(non_negative("", m.cold_start_s, MAX_COLD_START_S), || f("cold_start_s"))?;
        if let Some(server) = &m.server {
            named(non_negative("", server.success_rps, MAX_REQUEST_RATE), || f("server.success_rps"))?;
            named(non_negative("", server.failure_rps, MAX_REQUEST_RATE), || f("server.failure_rps"))?;
            named(non_negative("", server.mean_request_ms, MAX_REPORTED_LATENCY_MS), || f("server.mean_request_ms"))?;
            named(non_negative("", server.mean_queue_ms, MAX_REPORTED_LATENCY_MS), || f("server.mean_queue_ms"))?;
            named(non_negative("", server.mean_compute_ms, MAX_REPORTED_LATENCY_MS), || f("server.mean_compute_ms"))?;
        }
        if m.failed > MAX_REPORTED_FAILED {
            return Err(FieldError::invalid(f("failed"), format!("must be <= {MAX_REPORTED_FAILED} (got {})", m.failed)).into());
        }
        if !m.endpoint.is_empty() {
            named(bounded_text("", &m.endpoint, MAX_ADDRESS_LEN), || f("endpoint"))?;
            let host = host_of(&m.endpoint);
            if host.is_none() {
                return Err(FieldError::invalid(f("endpoint"), format!("{:?} is not host:port", m.endpoint)).into());
            }
            if host != node_host {
                return Err(ReportRefusal::NotTheNodes(FieldError::invalid(
                    f("endpoint"),
                    format!("{:?} is not on this node's host (its address is {:?})", m.endpoint, node.address),
                )));
            }
        }
    }
    Ok(stale)
}

/// At most 64 characters of a value an error quotes back.
fn truncated(value: &str) -> String {
    value.chars().take(64).collect()
}

/// One metrics window of a report, judged against its service's SLO: met when its p99 is
/// within the SLO and no request failed (as `gpuctl demo` counts). Windows without traffic
/// and services the desired state does not place here are left out.
#[derive(Debug, Clone, PartialEq)]
pub struct SloWindow {
    pub tenant: String,
    pub service: String,
    pub met: bool,
}

/// The SLO windows of a checked report, against the node's placement (each placed service's
/// SLO and tenant).
pub fn slo_windows(report: &proto::ReportRequest, placed: &Placement) -> Vec<SloWindow> {
    report
        .metrics
        .iter()
        .filter(|m| m.arrival_rps > 0.0 || m.throughput_rps > 0.0 || m.failed > 0)
        .filter_map(|m| {
            let p = placed.services.get(m.service.as_str())?;
            Some(SloWindow { tenant: p.tenant.to_string(), service: m.service.clone(), met: m.failed == 0 && m.p99_ms <= p.slo_ms })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::Placed;
    use crate::resources::NodeGpu;

    fn node() -> NodeSpec {
        NodeSpec {
            address: "10.0.0.1:7000".into(),
            instance_type: "a100-8x".into(),
            gpus: vec![NodeGpu { uuid: "GPU-0".into(), model: "A100-80GB".into(), mig_enabled: true }],
            labels: Default::default(),
        }
    }

    fn placed<'a>(services: &[&'a str]) -> Placement<'a> {
        Placement { version: 3, services: services.iter().map(|s| (*s, Placed { tenant: "", slo_ms: 0.0 })).collect() }
    }

    fn metrics(service: &str, endpoint: &str) -> proto::ServiceMetrics {
        proto::ServiceMetrics {
            service: service.into(),
            p99_ms: 12.0,
            throughput_rps: 100.0,
            arrival_rps: 100.0,
            failed: 0,
            endpoint: endpoint.into(),
            ..Default::default()
        }
    }

    fn report(m: Vec<proto::ServiceMetrics>) -> proto::ReportRequest {
        proto::ReportRequest {
            node: "n1".into(),
            applied_version: 3,
            gpus: vec![proto::ObservedGpu { gpu_uuid: "GPU-0".into(), ..Default::default() }],
            metrics: m,
            ..Default::default()
        }
    }

    fn field(r: Result<Vec<usize>, ReportRefusal>) -> (String, &'static str) {
        match r.unwrap_err() {
            ReportRefusal::NotTheNodes(e) => (e.field, "denied"),
            ReportRefusal::Invalid(e) => (e.field, "invalid"),
        }
    }

    #[test]
    fn a_node_reports_for_what_the_plan_placed_on_it() {
        assert_eq!(check_report(&report(vec![metrics("web", "10.0.0.1:7100")]), &node(), &placed(&["web"])), Ok(vec![]));
    }

    #[test]
    fn an_agent_behind_its_desired_state_has_the_windows_of_services_moved_away_dropped_not_refused() {
        let mut r = report(vec![metrics("moved-away", "10.0.0.1:7101"), metrics("web", "10.0.0.1:7100")]);
        r.applied_version = 2;
        assert_eq!(check_report(&r, &node(), &placed(&["web"])), Ok(vec![0]));
        // Stale or not, a window is still checked for what it may not carry.
        r.metrics[1].endpoint = "10.6.6.6:443".into();
        assert_eq!(field(check_report(&r, &node(), &placed(&["web"]))), ("metrics[1].endpoint".into(), "denied"));
        // Claiming the current version, the same window is refused.
        let mut current = report(vec![metrics("moved-away", "")]);
        current.applied_version = 3;
        assert_eq!(field(check_report(&current, &node(), &placed(&["web"]))), ("metrics[0].service".into(), "denied"));
    }

    #[test]
    fn an_agent_ahead_of_the_leaders_applied_state_has_the_windows_it_cannot_judge_dropped_not_refused() {
        // Desired version 3 here; the agent got version 4 (placing "new-svc") from a follower.
        let mut r = report(vec![metrics("web", "10.0.0.1:7100"), metrics("new-svc", "10.0.0.1:7101")]);
        r.applied_version = 4;
        assert_eq!(check_report(&r, &node(), &placed(&["web"])), Ok(vec![1]));
    }

    #[test]
    fn metrics_or_endpoints_for_a_service_not_placed_on_the_node_are_denied() {
        let r = report(vec![metrics("web", "10.0.0.1:7100"), metrics("other-tenants", "10.0.0.1:7101")]);
        assert_eq!(field(check_report(&r, &node(), &placed(&["web"]))), ("metrics[1].service".into(), "denied"));
    }

    #[test]
    fn an_endpoint_on_another_host_is_denied() {
        let r = report(vec![metrics("web", "10.9.9.9:7100")]);
        assert_eq!(field(check_report(&r, &node(), &placed(&["web"]))), ("metrics[0].endpoint".into(), "denied"));
        let r = report(vec![metrics("web", "not an address")]);
        assert_eq!(field(check_report(&r, &node(), &placed(&["web"]))), ("metrics[0].endpoint".into(), "invalid"));
    }

    #[test]
    fn another_nodes_gpu_is_denied() {
        let mut r = report(vec![]);
        r.gpus[0].gpu_uuid = "GPU-of-n2".into();
        assert_eq!(field(check_report(&r, &node(), &placed(&[]))), ("gpus[0].gpu_uuid".into(), "denied"));
    }

    #[test]
    fn a_report_that_leaves_its_gpus_out_carries_none() {
        let mut r = report(vec![]);
        r.gpus_unchanged = true;
        assert_eq!(field(check_report(&r, &node(), &placed(&[]))), ("gpus".into(), "invalid"));
        r.gpus.clear();
        assert_eq!(check_report(&r, &node(), &placed(&[])), Ok(vec![]));
    }

    #[test]
    fn numbers_must_be_finite_non_negative_and_bounded() {
        let cases = [
            (f64::NAN, "p99_ms"),
            (f64::INFINITY, "throughput_rps"),
            (-1.0, "arrival_rps"),
            (1e12, "arrival_rps"),
            (f64::NAN, "server.success_rps"),
            (-0.5, "server.mean_queue_ms"),
            (1e12, "server.mean_compute_ms"),
        ];
        for (value, name) in cases {
            let mut m = metrics("web", "");
            let server = m.server.get_or_insert_with(Default::default);
            match name {
                "p99_ms" => m.p99_ms = value,
                "throughput_rps" => m.throughput_rps = value,
                "server.success_rps" => server.success_rps = value,
                "server.mean_queue_ms" => server.mean_queue_ms = value,
                "server.mean_compute_ms" => server.mean_compute_ms = value,
                _ => m.arrival_rps = value,
            }
            let got = field(check_report(&report(vec![m]), &node(), &placed(&["web"])));
            assert_eq!(got, (format!("metrics[0].{name}"), "invalid"), "{value}");
        }
    }

    #[test]
    fn names_that_could_forge_series_and_oversized_lists_are_invalid() {
        let r = report(vec![metrics("web\"} 1\nx{a=\"", "")]);
        assert_eq!(field(check_report(&r, &node(), &placed(&["web"]))), ("metrics[0].service".into(), "invalid"));
        let many: Vec<proto::ServiceMetrics> = (0..=MAX_REPORTED_SERVICES).map(|i| metrics(&format!("s{i}"), "")).collect();
        assert_eq!(field(check_report(&report(many), &node(), &placed(&["web"]))), ("metrics".into(), "invalid"));
        let twice = report(vec![metrics("web", ""), metrics("web", "")]);
        assert_eq!(field(check_report(&twice, &node(), &placed(&["web"]))), ("metrics[1].service".into(), "invalid"));
    }

    #[test]
    fn an_observed_state_past_its_bytes_is_invalid_though_each_list_is_within_bounds() {
        let mut big = node();
        big.gpus =
            (0..MAX_GPUS_PER_NODE).map(|g| NodeGpu { uuid: format!("GPU-{g}"), model: "A100-80GB".into(), mig_enabled: true }).collect();
        let workload = |j: usize| proto::ObservedWorkload {
            service: format!("svc-{j}"),
            process: "p".repeat(MAX_NAME_LEN * 2),
            state: "ready".into(),
            ..Default::default()
        };
        let gpu = |g: usize, workloads: usize| proto::ObservedGpu {
            gpu_uuid: format!("GPU-{g}"),
            workloads: (0..workloads).map(workload).collect(),
            ..Default::default()
        };
        let mut r = report(vec![]);
        // The attack: every GPU at the per-GPU bound, 3.9 MB in all.
        r.gpus = (0..MAX_GPUS_PER_NODE).map(|g| gpu(g, MAX_REPORTED_WORKLOADS_PER_GPU)).collect();
        assert_eq!(field(check_report(&r, &big, &placed(&[]))), ("gpus".into(), "invalid"));
        // A large honest host: 8 GPUs of 7 instances with a shadow each.
        r.gpus = (0..8).map(|g| gpu(g, 14)).collect();
        assert!(r.gpus.iter().map(prost::Message::encoded_len).sum::<usize>() < MAX_REPORTED_OBSERVED_BYTES);
        assert_eq!(check_report(&r, &big, &placed(&[])), Ok(vec![]));
    }

    #[test]
    fn a_window_meets_its_slo_within_the_latency_and_without_failures() {
        let placed = Placement { version: 0, services: [("web", Placed { tenant: "acme", slo_ms: 50.0 })].into() };
        let m = |service: &str, p99_ms: f64, failed: u64, arrival_rps: f64| proto::ServiceMetrics {
            service: service.into(),
            p99_ms,
            failed,
            arrival_rps,
            ..Default::default()
        };
        let report = proto::ReportRequest {
            metrics: vec![
                m("web", 40.0, 0, 10.0),
                m("web", 60.0, 0, 10.0),
                m("web", 40.0, 1, 10.0),
                m("web", 1.0, 0, 0.0),
                m("gone", 1.0, 0, 5.0),
            ],
            ..Default::default()
        };
        let met: Vec<bool> = slo_windows(&report, &placed).iter().map(|w| w.met).collect();
        assert_eq!(met, [true, false, false], "idle windows and services not placed here are left out");
        assert_eq!(slo_windows(&report, &placed)[0].tenant, "acme");
    }
}
