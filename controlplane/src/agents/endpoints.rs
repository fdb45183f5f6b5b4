//! Service endpoints: per service, the router addresses of the healthy nodes that serve it,
//! from the Nodes' reported status. Pure; `gpuctl get endpoints` and load balancers (through
//! a watch on Nodes) read them the same way.

use crate::resources::NodeStatus;

/// (service, node, endpoint) of every router on a healthy node, sorted.
pub fn service_endpoints(nodes: &[proto::Resource]) -> Vec<(String, String, String)> {
    let mut rows = Vec::new();
    for n in nodes.iter().filter(|n| n.kind == "Node") {
        let status: serde_json::Value = serde_json::from_str(&n.status_json).unwrap_or_default();
        if NodeStatus::is_unhealthy(&status) {
            continue;
        }
        for (service, addr) in NodeStatus::endpoints(&status) {
            rows.push((service.to_string(), n.name.clone(), addr.to_string()));
        }
    }
    rows.sort();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Health;

    fn node(name: &str, health: crate::resources::Health, endpoints: &[(&str, &str)]) -> proto::Resource {
        let endpoints = endpoints.iter().map(|(s, a)| (s.to_string(), a.to_string())).collect();
        let status = NodeStatus { health, endpoints, ..Default::default() }.to_json();
        proto::Resource { kind: "Node".into(), name: name.into(), status_json: status.to_string(), ..Default::default() }
    }

    #[test]
    fn only_healthy_nodes_publish_their_routers() {
        let nodes = [
            node("b", Health::Healthy, &[("web", "10.0.0.2:7100"), ("chat", "10.0.0.2:7101")]),
            node("a", Health::Healthy, &[("web", "10.0.0.1:7100")]),
            node("c", Health::Unhealthy, &[("web", "10.0.0.3:7100")]),
            proto::Resource { kind: "Node".into(), name: "d".into(), ..Default::default() },
        ];
        let rows = service_endpoints(&nodes);
        let expected = [("chat", "b", "10.0.0.2:7101"), ("web", "a", "10.0.0.1:7100"), ("web", "b", "10.0.0.2:7100")];
        assert_eq!(rows, expected.map(|(s, n, a)| (s.to_string(), n.to_string(), a.to_string())));
    }
}
