//! What the demo prints: the deployment map per GPU and the per-service SLO report. Pure
//! (resources and windows in, text out).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::load::{compliance, Window};
use controlplane::resources::{PlanSpec, Spec};

fn spec_of(r: &proto::Resource) -> Option<Spec> {
    let kind: controlplane::resources::Kind = r.kind.parse().ok()?;
    Spec::from_json(kind, &r.spec_json).ok()
}

/// The committed plan, if any.
pub fn plan_of(resources: &[proto::Resource]) -> Option<(PlanSpec, u64)> {
    resources.iter().find(|r| r.kind == "Plan" && r.name == "current").and_then(|r| match spec_of(r) {
        Some(Spec::Plan(p)) => Some((p, r.mod_revision)),
        _ => None,
    })
}

/// Per GPU uuid: (node, GPU model); per node: price per GPU-hour of its instance type.
fn gpu_index(nodes: &[proto::Resource], types: &[proto::Resource]) -> (BTreeMap<String, (String, String)>, BTreeMap<String, f64>) {
    let prices: BTreeMap<String, f64> = types
        .iter()
        .filter_map(|t| match spec_of(t) {
            Some(Spec::InstanceType(s)) => Some((t.name.clone(), s.price_per_hour / f64::from(s.gpu_count.max(1)))),
            _ => None,
        })
        .collect();
    let mut gpus = BTreeMap::new();
    let mut node_price = BTreeMap::new();
    for n in nodes {
        if let Some(Spec::Node(s)) = spec_of(n) {
            node_price.insert(n.name.clone(), prices.get(&s.instance_type).copied().unwrap_or(0.0));
            for g in s.gpus {
                gpus.insert(g.uuid, (n.name.clone(), g.model));
            }
        }
    }
    (gpus, node_price)
}

/// Cost per hour of the GPUs the plan uses (each at its node's instance price per GPU).
pub fn plan_cost(plan: &PlanSpec, nodes: &[proto::Resource], types: &[proto::Resource]) -> f64 {
    let (_, node_price) = gpu_index(nodes, types);
    plan.gpus.iter().map(|g| node_price.get(&g.node).copied().unwrap_or(0.0)).sum()
}

/// Cost per hour of what the plan occupies: a MIG instance's GPCs / 7 of its GPU's price,
/// an MPS workload's share (processes times share, plus the shadow reserve) of it. Whole
/// GPUs ([`plan_cost`]) hide the difference between strategies on a small workload.
pub fn occupied_cost(plan: &PlanSpec, nodes: &[proto::Resource], types: &[proto::Resource]) -> f64 {
    let (_, node_price) = gpu_index(nodes, types);
    plan.gpus
        .iter()
        .map(|g| {
            let price = node_price.get(&g.node).copied().unwrap_or(0.0);
            let used = if g.mig_layout.is_empty() {
                g.workloads.iter().map(|w| w.mps_percent * f64::from(w.processes) + w.shadow_mps_percent).sum::<f64>() / 100.0
            } else {
                let gpcs: u32 = g.mig_layout.iter().map(|m| controlplane::metering::profile_gpcs(&m.profile)).sum();
                f64::from(gpcs) / 7.0
            };
            price * used.min(1.0)
        })
        .sum()
}

/// The deployment map: per GPU its node, model, MIG layout with slots, and the workloads
/// with their MPS shares, batch sizes and process counts.
pub fn deployment_map(plan: &PlanSpec, nodes: &[proto::Resource], types: &[proto::Resource]) -> String {
    let (gpus, _) = gpu_index(nodes, types);
    let mut out = String::new();
    let _ = writeln!(out, "{:<14} {:<12} {:<10} PLACEMENT", "NODE", "GPU", "MODEL");
    for g in &plan.gpus {
        let model = gpus.get(&g.gpu_uuid).map_or("?", |(_, m)| m.as_str());
        let short = g.gpu_uuid.get(..12).unwrap_or(&g.gpu_uuid);
        let workload = |w: &controlplane::resources::WorkloadAssignment| {
            let procs = if w.processes > 1 { format!(" x{}", w.processes) } else { String::new() };
            let shadow = if w.shadow_mps_percent > 0.0 { format!(" +{:.1}% shadow", w.shadow_mps_percent) } else { String::new() };
            format!("{} b{} MPS {:.1}%{procs}{shadow}", w.service, w.batch, w.mps_percent)
        };
        let placement = if g.mig_layout.is_empty() {
            format!("MPS  {}", g.workloads.iter().map(workload).collect::<Vec<_>>().join(" | "))
        } else {
            g.mig_layout
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let size = u8::try_from(controlplane::metering::profile_gpcs(&m.profile)).unwrap_or(1);
                    let on: Vec<String> = g.workloads.iter().filter(|w| w.mig_instance == Some(i)).map(workload).collect();
                    let on = if on.is_empty() { "(idle)".to_string() } else { on.join(", ") };
                    format!("[{}-{}] {}: {on}", m.start, m.start + size - 1, m.profile)
                })
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let _ = writeln!(out, "{:<14} {:<12} {:<10} {placement}", g.node, short, model);
    }
    out
}

/// One tenant's line of the demo's summary: what the plan gives it and how its services
/// did.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TenantRow {
    pub tenant: String,
    /// GPUs-worth and $/h of what the plan gives it (`metering`).
    pub gpus: f64,
    pub cost_per_hour: f64,
    /// One-second windows of its services that met their SLO, of all.
    pub windows_met: usize,
    pub windows: usize,
}

/// Per tenant of `tenant_of` (service → tenant): [`TenantRow`] with the usage the leader
/// metered into its Tenant's status (`loops::metering`; none for a Tenant not listed in
/// `tenants` or not metered yet) and its services' windows in `slo`.
pub fn tenant_report(tenants: &[proto::Resource], slo: &[ServiceSlo], tenant_of: &BTreeMap<String, String>) -> Vec<TenantRow> {
    let metered: BTreeMap<&str, controlplane::resources::TenantStatus> =
        tenants.iter().map(|r| (r.name.as_str(), serde_json::from_str(&r.status_json).unwrap_or_default())).collect();
    let mut rows: BTreeMap<&str, TenantRow> = BTreeMap::new();
    for tenant in tenant_of.values() {
        let u = metered.get(tenant.as_str()).cloned().unwrap_or_default();
        rows.entry(tenant).or_insert_with(|| TenantRow {
            tenant: tenant.clone(),
            gpus: u.gpus,
            cost_per_hour: u.cost_per_hour,
            windows_met: 0,
            windows: 0,
        });
    }
    for s in slo {
        if let Some(row) = tenant_of.get(&s.service).and_then(|t| rows.get_mut(t.as_str())) {
            row.windows_met += s.windows_met;
            row.windows += s.windows;
        }
    }
    rows.into_values().collect()
}

/// One service's line of the SLO report.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceSlo {
    pub service: String,
    pub slo_ms: f64,
    pub rate_rps: f64,
    pub windows: usize,
    pub windows_met: usize,
    /// Requests sent in the windows, and those answered within the SLO.
    pub requests: u64,
    pub requests_met: u64,
    pub worst_p99_ms: f64,
    pub median_p99_ms: f64,
}

impl ServiceSlo {
    pub fn compliance_pct(&self) -> f64 {
        percent(self.windows_met as f64, self.windows as f64)
    }

    /// The share of requests answered within the SLO.
    pub fn attainment_pct(&self) -> f64 {
        percent(self.requests_met as f64, self.requests as f64)
    }
}

/// `part` of `whole` in percent; 0 of nothing.
pub(crate) fn percent(part: f64, whole: f64) -> f64 {
    if whole == 0.0 {
        0.0
    } else {
        100.0 * part / whole
    }
}

/// Per-service SLO figures over the windows in `[from_s, to_s)`.
pub fn slo_report(windows: &BTreeMap<String, Vec<Window>>, slos: &BTreeMap<String, (f64, f64)>, from_s: f64, to_s: f64) -> Vec<ServiceSlo> {
    slos.iter()
        .map(|(service, &(slo_ms, rate_rps))| {
            let list: Vec<Window> = windows
                .get(service)
                .map(|w| w.iter().filter(|w| (w.second as f64) >= from_s && (w.second as f64) < to_s).cloned().collect())
                .unwrap_or_default();
            let (met, n) = compliance(&list, from_s, to_s);
            let mut p99s: Vec<f64> = list.iter().map(|w| w.p99_ms).collect();
            p99s.sort_by(f64::total_cmp);
            let requests: u64 = list.iter().map(|w| w.sent).sum();
            let over_slo: u64 = list.iter().map(|w| w.over_slo).sum();
            ServiceSlo {
                service: service.clone(),
                slo_ms,
                rate_rps,
                windows: n,
                windows_met: met,
                requests,
                requests_met: requests.saturating_sub(over_slo),
                worst_p99_ms: p99s.last().copied().unwrap_or(0.0),
                median_p99_ms: p99s.get(p99s.len() / 2).copied().unwrap_or(0.0),
            }
        })
        .collect()
}

pub fn format_slo_report(rows: &[ServiceSlo]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>7} {:>7} {:>12} {:>9} {:>11} {:>10} {:>13}",
        "SERVICE", "SLO ms", "req/s", "windows met", "%", "median p99", "worst p99", "requests met"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:>7.0} {:>7.0} {:>6}/{:<5} {:>9.1} {:>11.1} {:>10.1} {:>12.2}%",
            r.service,
            r.slo_ms,
            r.rate_rps,
            r.windows_met,
            r.windows,
            r.compliance_pct(),
            r.median_p99_ms,
            r.worst_p99_ms,
            r.attainment_pct()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance type "one": one A100 at $7/h.
    fn one_gpu_at_7() -> [proto::Resource; 1] {
        [proto::Resource {
            kind: "InstanceType".into(),
            name: "one".into(),
            spec_json: serde_json::json!({"gpu_model": "A100-80GB", "gpu_count": 1, "price_per_hour": 7.0, "launch_latency_s": 1})
                .to_string(),
            ..Default::default()
        }]
    }

    /// A node of instance type "one" whose GPU is `GPU-{name}`.
    fn node_of_one(name: &str) -> proto::Resource {
        proto::Resource {
            kind: "Node".into(),
            name: name.into(),
            spec_json: serde_json::json!({"address": "h:1", "instance_type": "one", "gpus": [{"uuid": format!("GPU-{name}"), "model": "A100-80GB"}]})
                .to_string(),
            ..Default::default()
        }
    }

    fn w(second: u64, p99_ms: f64, met: bool) -> Window {
        Window { second, sent: 10, failed: 0, over_slo: if met { 0 } else { 1 }, p99_ms, met }
    }

    #[test]
    fn the_tenant_report_shows_each_tenants_metered_usage_and_adds_up_its_windows() {
        let tenant = |name: &str, status: serde_json::Value| proto::Resource {
            kind: "Tenant".into(),
            name: name.into(),
            status_json: status.to_string(),
            ..Default::default()
        };
        let tenants = [tenant("acme", serde_json::json!({"gpus": 0.5, "cost_per_hour": 4.0})), tenant("globex", serde_json::Value::Null)];
        let slo = |service: &str, windows_met, windows| ServiceSlo {
            service: service.into(),
            slo_ms: 50.0,
            rate_rps: 10.0,
            windows,
            windows_met,
            requests: 0,
            requests_met: 0,
            worst_p99_ms: 1.0,
            median_p99_ms: 1.0,
        };
        let tenant_of: BTreeMap<String, String> =
            [("a", "acme"), ("b", "globex"), ("c", "globex")].iter().map(|(s, t)| (s.to_string(), t.to_string())).collect();
        let rows = tenant_report(&tenants, &[slo("a", 9, 10), slo("b", 5, 5), slo("c", 3, 5)], &tenant_of);
        assert_eq!(
            rows.iter().map(|r| (r.tenant.as_str(), r.gpus, r.cost_per_hour, r.windows_met, r.windows)).collect::<Vec<_>>(),
            [("acme", 0.5, 4.0, 9, 10), ("globex", 0.0, 0.0, 8, 10)],
            "globex is not metered yet"
        );
    }

    #[test]
    fn occupied_cost_prices_gpcs_and_shares() {
        let types = one_gpu_at_7();
        let node = node_of_one;
        let plan: PlanSpec = serde_json::from_value(serde_json::json!({"strategy": "t", "gpus": [
            {"node": "m", "gpu_uuid": "GPU-m", "mig_layout": [{"profile": "3g", "start": 4}, {"profile": "1g.2m", "start": 0}], "workloads": []},
            {"node": "s", "gpu_uuid": "GPU-s", "workloads": [{"service": "a", "mps_percent": 20, "batch": 1, "processes": 2, "shadow_mps_percent": 10}]}
        ], "services": []}))
        .unwrap();
        let nodes = [node("m"), node("s")];
        // 4 of 7 GPCs of a $7 GPU, and 50% of another.
        assert!((occupied_cost(&plan, &nodes, &types) - (4.0 + 3.5)).abs() < 1e-9);
        assert!((plan_cost(&plan, &nodes, &types) - 14.0).abs() < 1e-9);
    }

    #[test]
    fn the_report_counts_only_windows_in_the_phase() {
        let windows = BTreeMap::from([("web".to_string(), vec![w(0, 10.0, true), w(1, 90.0, false), w(2, 20.0, true), w(9, 5.0, true)])]);
        let slos = BTreeMap::from([("web".to_string(), (50.0, 100.0))]);
        let rows = slo_report(&windows, &slos, 0.0, 3.0);
        assert_eq!((rows[0].windows_met, rows[0].windows), (2, 3));
        assert_eq!(rows[0].worst_p99_ms, 90.0);
        assert_eq!(rows[0].median_p99_ms, 20.0);
        assert!((rows[0].compliance_pct() - 66.666).abs() < 0.01);
        // 30 requests in the phase, one of them over the SLO (in the window that missed).
        assert_eq!((rows[0].requests_met, rows[0].requests), (29, 30));
        assert!((rows[0].attainment_pct() - 96.666).abs() < 0.01);
    }
}
