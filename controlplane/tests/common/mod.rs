//! In-process controller clusters on loopback for integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use controlplane::client::Client;
use controlplane::loops::LoopSettings;
use controlplane::raft::{Member, RaftSettings};
use controlplane::security::Security;
use controlplane::server::{start_node, NodeOptions, RunningNode, StorageChoice};

/// The security settings of each node, by id.
pub type SecurityOf = Arc<dyn Fn(u64) -> Security + Send + Sync>;

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub nodes: BTreeMap<u64, Option<RunningNode>>,
    pub addrs: BTreeMap<u64, SocketAddr>,
    /// Each node's peer listener (`NodeOptions::peer_listen`). The nodes the cluster starts
    /// with are members at it; nodes a test adds with `add_member` are reached at `addrs`.
    pub peer_addrs: BTreeMap<u64, SocketAddr>,
    pub settings: RaftSettings,
    /// Off unless a test turns them on: most tests check Raft and the API alone.
    pub loops: LoopSettings,
    /// Insecure unless a test secures the cluster (`start_with`).
    pub security: SecurityOf,
}

pub fn fast_settings() -> RaftSettings {
    RaftSettings { heartbeat_interval_ms: 50, election_timeout_min_ms: 200, election_timeout_max_ms: 400, ..RaftSettings::default() }
}

impl TestCluster {
    pub async fn start(n: u64, settings: RaftSettings) -> Self {
        Self::start_with_loops(n, settings, LoopSettings { enabled: false, ..LoopSettings::default() }).await
    }

    pub async fn start_with_loops(n: u64, settings: RaftSettings, loops: LoopSettings) -> Self {
        Self::start_with(n, settings, loops, Arc::new(|_| Security::insecure())).await
    }

    pub async fn start_with(n: u64, settings: RaftSettings, loops: LoopSettings, security: SecurityOf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster =
            TestCluster { dir, nodes: BTreeMap::new(), addrs: BTreeMap::new(), peer_addrs: BTreeMap::new(), settings, loops, security };
        for id in 1..=n {
            cluster.start_node(id, "127.0.0.1:0".parse().unwrap(), None).await;
        }
        let nodes = cluster
            .addrs
            .iter()
            .map(|(id, a)| (*id, Member::with_peer_addr(a.to_string(), Some(cluster.peer_addrs[id].to_string()))))
            .collect();
        // Initialise through node 1 only, exactly once.
        let first = cluster.node(1);
        first.controller.initialize(nodes).await.unwrap();
        cluster.wait_leader().await;
        cluster
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    pub async fn start_node(&mut self, id: u64, listen: SocketAddr, bootstrap: Option<BTreeMap<u64, Member>>) {
        let opts = NodeOptions {
            id,
            listen,
            advertise: None,
            peer_listen: Some("127.0.0.1:0".parse().unwrap()),
            peer_advertise: None,
            storage: StorageChoice::DataDir(self.data_dir(id)),
            raft: self.settings.clone(),
            bootstrap,
            loops: self.loops.clone(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            security: (self.security)(id),
        };
        let node = start_node(opts).await.unwrap();
        self.addrs.insert(id, node.addr);
        self.peer_addrs.insert(id, node.peer_addr.expect("a peer listener"));
        self.nodes.insert(id, Some(node));
    }

    /// Restarts a stopped node on its old addresses from its data dir.
    pub async fn restart(&mut self, id: u64) {
        let (addr, peer_addr) = (self.addrs[&id], self.peer_addrs[&id]);
        for _ in 0..50 {
            let opts = NodeOptions {
                id,
                listen: addr,
                advertise: None,
                peer_listen: Some(peer_addr),
                peer_advertise: None,
                storage: StorageChoice::DataDir(self.data_dir(id)),
                raft: self.settings.clone(),
                bootstrap: None,
                loops: self.loops.clone(),
                metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
                security: (self.security)(id),
            };
            match start_node(opts).await {
                Ok(node) => {
                    self.nodes.insert(id, Some(node));
                    return;
                }
                // The port or the sled lock may still be held briefly by the stopped node.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("node {id} did not restart");
    }

    pub async fn stop(&mut self, id: u64) {
        if let Some(node) = self.nodes.get_mut(&id).and_then(Option::take) {
            node.shutdown().await;
        }
    }

    pub fn node(&self, id: u64) -> &RunningNode {
        self.nodes[&id].as_ref().expect("node is running")
    }

    pub fn running(&self) -> impl Iterator<Item = (u64, &RunningNode)> {
        self.nodes.iter().filter_map(|(id, n)| n.as_ref().map(|n| (*id, n)))
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.addrs.values().map(|a| a.to_string()).collect()
    }

    pub fn client(&self) -> Client {
        Client::new(self.endpoints())
    }

    pub fn client_of(&self, id: u64) -> Client {
        Client::new(vec![self.addrs[&id].to_string()])
    }

    /// Waits until the running nodes agree on a leader that is running; returns its id.
    pub async fn wait_leader(&self) -> u64 {
        for _ in 0..200 {
            let leaders: Vec<Option<u64>> = self.running().map(|(_, n)| n.controller.leader().map(|l| l.0)).collect();
            if let Some(Some(l)) = leaders.first() {
                if leaders.iter().all(|x| *x == Some(*l))
                    && self.nodes.get(l).is_some_and(Option::is_some)
                    && self.node(*l).controller.is_leader()
                {
                    return *l;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no leader elected");
    }

    /// Waits until every running node has applied at least `index`.
    pub async fn wait_applied(&self, index: u64) {
        for _ in 0..400 {
            if self.running().all(|(_, n)| n.controller.status().applied_index >= index) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let seen: Vec<_> = self.running().map(|(id, n)| (id, n.controller.status().applied_index)).collect();
        panic!("nodes did not apply index {index}: {seen:?}");
    }

    /// Node `id`'s status once it shows its snapshot at `index` or later. The applied index
    /// is the state machine's own, and openraft's metrics, where the snapshot index comes
    /// from, say what an install did a few milliseconds after the state shows it: with the
    /// machine loaded, the two snapshot tests of `cluster.rs` read them too early in 5 of
    /// 12 runs.
    pub async fn wait_snapshot(&self, id: u64, index: u64) -> proto::ClusterStatusResponse {
        for _ in 0..400 {
            let status = self.node(id).controller.status();
            if status.snapshot_index >= index {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("node {id} shows no snapshot at {index} or later: {:?}", self.node(id).controller.status());
    }
}

pub fn resource(kind: &str, name: &str, tenant: &str, spec: serde_json::Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

/// The resources every service needs: a tenant, GPU models, an instance type, a profile.
/// A Node of one MIG-enabled A100 (`GPU-<name>`) at `<name>:7000`.
pub fn node(name: &str) -> proto::Resource {
    resource(
        "Node",
        name,
        "",
        serde_json::json!({"address": format!("{name}:7000"), "instance_type": "p4de.24xlarge", "gpus": [{"uuid": format!("GPU-{name}"), "model": "A100-80GB", "mig_enabled": true}]}),
    )
}

/// The Plan `current`: on each [`node`]'s GPU one 7g instance running one workload of
/// (service, batch).
pub fn whole_gpu_plan(workloads: &[(&str, &str, u32)]) -> proto::Resource {
    let gpus: Vec<serde_json::Value> = workloads
        .iter()
        .map(|(node, service, batch)| {
            serde_json::json!({"node": node, "gpu_uuid": format!("GPU-{node}"), "mig_layout": [{"profile": "7g", "start": 0}],
                "workloads": [{"service": service, "mig_instance": 0, "mps_percent": 100, "batch": batch}]})
        })
        .collect();
    resource("Plan", "current", "", serde_json::json!({"strategy": "parvagpu", "gpus": gpus}))
}

pub fn base_resources() -> Vec<proto::Resource> {
    use serde_json::json;
    vec![
        resource("Tenant", "acme", "", json!({"display_name": "Acme"})),
        resource("GpuModel", "A100-80GB", "", json!({"sm_count": 108, "memory_gib": 80})),
        resource(
            "InstanceType",
            "p4de.24xlarge",
            "",
            json!({"gpu_model": "A100-80GB", "gpu_count": 8, "price_per_hour": 40.96, "launch_latency_s": 180}),
        ),
        resource(
            "ModelProfile",
            "resnet50-a100",
            "",
            json!({"model": "resnet50", "gpu_model": "A100-80GB", "points": [{"gpcs": 1, "batch": 8, "throughput_rps": 400, "latency_ms": 18}]}),
        ),
    ]
}

pub fn service(name: &str, rate: f64, latency_ms: f64) -> proto::Resource {
    resource("Service", name, "acme", serde_json::json!({"model": "resnet50", "slo": {"latency_ms": latency_ms, "request_rate": rate}}))
}

pub async fn seed(client: &Client) {
    for r in base_resources() {
        client.put(r, proto::WriteMode::Unspecified).await.unwrap();
    }
}

/// The A100/H100 MIG geometry as a GpuModel's `spec.mig` (NVIDIA's profiles and starts).
pub fn a100_mig() -> serde_json::Value {
    serde_json::json!({"compute_slices": 7, "memory_slices": 8, "profiles": [
        {"name": "1g", "compute_slices": 1, "memory_slices": 1, "starts": [0,1,2,3,4,5,6]},
        {"name": "2g", "compute_slices": 2, "memory_slices": 2, "starts": [0,2,4]},
        {"name": "3g", "compute_slices": 3, "memory_slices": 4, "starts": [0,4]},
        {"name": "4g", "compute_slices": 4, "memory_slices": 4, "starts": [0]},
        {"name": "7g", "compute_slices": 7, "memory_slices": 8, "starts": [0]}]})
}

/// The Node's status once `ready` holds for it (agents' observed state is written in the
/// background after their report is answered); panics after 10 s.
#[allow(dead_code)] // not every test binary that includes `common` waits on a status
pub async fn node_status_when(client: &Client, node: &str, ready: impl Fn(&serde_json::Value) -> bool) -> (serde_json::Value, u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = client.get("Node", node, false).await.unwrap();
        let status: serde_json::Value = serde_json::from_str(&r.status_json).unwrap_or_default();
        if ready(&status) {
            return (status, r.resource_version);
        }
        assert!(tokio::time::Instant::now() < deadline, "node {node}'s status never got there: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A development CA and leaf certificates (`gpuctl certs`) for these controllers and nodes,
/// admin `ops`, and hosts localhost and 127.0.0.1.
pub fn make_pki(controllers: &[u64], nodes: &[&str]) -> tempfile::TempDir {
    use controlplane::security::certs::{self, CertPlan};
    let dir = tempfile::tempdir().unwrap();
    let plan = CertPlan {
        controllers: controllers.to_vec(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        admins: vec!["ops".into()],
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        force: false,
    };
    certs::generate(dir.path(), &plan).unwrap();
    dir
}

/// The CA of `dir` with `principal`'s certificate and key.
pub fn tls_of(dir: &std::path::Path, principal: &controlplane::security::Principal) -> controlplane::security::TlsMaterial {
    use controlplane::security::certs;
    let (cert, key) = certs::leaf_files(dir, principal);
    controlplane::security::TlsMaterial::load(&dir.join(certs::CA_CERT), Some(&cert), Some(&key)).unwrap()
}
