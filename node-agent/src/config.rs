//! The agent's configuration file (TOML). Unknown keys are refused so a typo never turns
//! into a silently ignored setting.

use crate::supervisor::template::Template;
use planner::mig::GpuModel;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This node's name (the Node resource the agent registers); or `--node`.
    #[serde(default)]
    pub node: String,
    /// Controller gRPC addresses (host:port); any of them will do. Each agent starts with
    /// one picked by its node name (`first_controller`), so that a fleet configured with
    /// the same list spreads over them, and moves to the next one in the list when it fails.
    pub controllers: Vec<String>,
    /// The InstanceType resource this host is.
    pub instance_type: String,
    /// Address (host:port) registered for this node: where its agent and routers are reached;
    /// or `--advertise`.
    #[serde(default = "loopback")]
    pub advertise: String,
    /// Agent state: process records, MPS pipes, the last desired state.
    pub state_dir: PathBuf,
    /// `sim`, `nvml` or `nvidia-smi`.
    #[serde(default = "sim")]
    pub gpu_backend: String,
    #[serde(default)]
    pub sim: SimFleet,
    pub template: Template,
    /// Ports handed to workload processes: [first, last].
    #[serde(default = "ports")]
    pub port_range: [u16; 2],
    /// Ports of the per-service router endpoints (on the `advertise` host): [first, last].
    #[serde(default = "router_ports")]
    pub router_ports: [u16; 2],
    /// Threads the routers run on, each service's on one (`router::threads`): one carries
    /// a service's requests up to one core's worth; more spread a host's services.
    #[serde(default = "one")]
    pub router_threads: usize,
    /// Labels of the Node resource (e.g. set by the cloud provider that launched the host).
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// How often the agent reports and reconciles, in milliseconds.
    #[serde(default = "interval")]
    pub interval_ms: u64,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` over plain HTTP; not served
    /// when unset.
    #[serde(default)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Plaintext to the controllers, no certificate (development only; also `--insecure`).
    #[serde(default)]
    pub insecure: bool,
    /// The cluster CA (PEM) that signed the controllers' certificates.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// This node's certificate (PEM, URI SAN `spiffe://gpuplane/node/<node>`) and key.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Export traces over OTLP/gRPC here, e.g. `http://collector:4317` (default:
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; no export when neither is set).
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

/// The simulated GPUs of this host (`gpu_backend = "sim"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimFleet {
    /// GPU model names: A100-40GB, A100-80GB, H100-80GB, H200, V100, T4 (the last two: no MIG).
    pub gpus: Vec<String>,
    #[serde(default = "yes")]
    pub mig_enabled: bool,
}

impl Default for SimFleet {
    fn default() -> Self {
        SimFleet { gpus: vec!["A100-80GB".into()], mig_enabled: true }
    }
}

fn loopback() -> String {
    "127.0.0.1:7100".into()
}
fn sim() -> String {
    "sim".into()
}
fn ports() -> [u16; 2] {
    [20000, 29999]
}
fn router_ports() -> [u16; 2] {
    [7200, 7299]
}
fn one() -> usize {
    1
}
fn interval() -> u64 {
    1000
}
fn yes() -> bool {
    true
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ConfigError {
    pub path: String,
    pub reason: String,
}

/// Per-host values from the command line that replace the file's, so that one file can
/// serve many hosts (a DaemonSet's ConfigMap).
#[derive(Debug, Clone, Default)]
pub struct HostOverrides {
    pub node: Option<String>,
    pub advertise: Option<String>,
}

impl AgentConfig {
    /// The mTLS settings for the controller links; `None` when `insecure`.
    pub fn client_tls(&self) -> Result<Option<tonic::transport::ClientTlsConfig>, ConfigError> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        if self.insecure {
            return Ok(None);
        }
        let read = |field: &str, path: &Option<PathBuf>| {
            let path = path.as_ref().ok_or_else(|| ConfigError {
                path: String::new(),
                reason: format!("`{field}`: required (ca, cert and key of this node, e.g. from `gpuctl certs`), or insecure = true / --insecure for plaintext (development only)"),
            })?;
            std::fs::read(path)
                .map_err(|e| ConfigError { path: String::new(), reason: format!("`{field}`: cannot read {}: {e}", path.display()) })
        };
        let (ca, cert, key) = (read("ca", &self.ca)?, read("cert", &self.cert)?, read("key", &self.key)?);
        Ok(Some(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).identity(Identity::from_pem(cert, key))))
    }

    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        Self::load_with(path, &HostOverrides::default())
    }

    pub fn load_with(path: &Path, overrides: &HostOverrides) -> Result<AgentConfig, ConfigError> {
        let err = |reason: String| ConfigError { path: path.display().to_string(), reason };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Self::parse_with(&text, overrides).map_err(|e| err(e.reason))
    }

    pub fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        Self::parse_with(text, &HostOverrides::default())
    }

    pub fn parse_with(text: &str, overrides: &HostOverrides) -> Result<AgentConfig, ConfigError> {
        let mut cfg: AgentConfig = toml::from_str(text).map_err(|e| ConfigError { path: String::new(), reason: e.to_string() })?;
        if let Some(node) = &overrides.node {
            cfg.node = node.clone();
        }
        if let Some(advertise) = &overrides.advertise {
            cfg.advertise = advertise.clone();
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// The index in `controllers` this node tries first: a hash of its name, so that the
    /// agents of a fleet with one configuration spread evenly over the controllers instead
    /// of all following, and reporting to, the first one listed (at 10,000 hosts, every
    /// stream and report on one controller), and a restarted agent comes back to the same
    /// one. std's SipHash with its fixed keys: stable within a build, which is all a spread
    /// needs (a new Rust release may move agents once).
    pub fn first_controller(&self) -> usize {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        self.node.hash(&mut hasher);
        (hasher.finish() % self.controllers.len().max(1) as u64) as usize
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |field: &str, reason: &str| Err(ConfigError { path: String::new(), reason: format!("`{field}`: {reason}") });
        if self.node.is_empty() {
            return bad("node", "required (in the file or --node)");
        }
        if self.controllers.is_empty() {
            return bad("controllers", "at least one controller address is required");
        }
        if self.port_range[0] == 0 || self.port_range[0] > self.port_range[1] {
            return bad("port_range", "must be [first, last] with 0 < first <= last");
        }
        if self.router_ports[0] == 0 || self.router_ports[0] > self.router_ports[1] {
            return bad("router_ports", "must be [first, last] with 0 < first <= last");
        }
        if !(1..=crate::router::MAX_ROUTER_THREADS).contains(&self.router_threads) {
            return bad(
                "router_threads",
                &format!("{} is out of range: from 1 to {}", self.router_threads, crate::router::MAX_ROUTER_THREADS),
            );
        }
        if self.interval_ms == 0 {
            return bad("interval_ms", "must be positive");
        }
        if let Some(unknown) = self.sim.gpus.iter().find(|g| GpuModel::for_name(g).is_none()) {
            return bad("sim.gpus", &format!("unknown GPU model {unknown:?} (known families: A100-40GB, A100-80GB, H100-80GB, H200, V100, T4, A10, L4, e.g. `T4-16GB`)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
node = "n1"
controllers = ["127.0.0.1:7001"]
instance_type = "p4de.24xlarge"
state_dir = "/tmp/agent"
[sim]
gpus = ["A100-80GB", "T4"]
[template]
kind = "command"
program = "sim-infer"
args = ["--port={port}"]
"#;

    #[test]
    fn agents_with_one_configuration_spread_over_the_controllers() {
        let base = AgentConfig::parse(&GOOD.replace(r#"["127.0.0.1:7001"]"#, r#"["c1:7001", "c2:7001", "c3:7001"]"#)).unwrap();
        let mut per_controller = [0usize; 3];
        for i in 0..3_000 {
            let cfg = AgentConfig { node: format!("host-{i}"), ..base.clone() };
            let first = cfg.first_controller();
            assert_eq!(first, cfg.first_controller(), "the same node always starts on the same one");
            per_controller[first] += 1;
        }
        assert!(per_controller.iter().all(|&n| (800..=1_200).contains(&n)), "{per_controller:?}");
        assert_eq!(AgentConfig::parse(GOOD).unwrap().first_controller(), 0, "one controller: that one");
    }

    #[test]
    fn defaults_fill_the_optional_fields() {
        let c = AgentConfig::parse(GOOD).unwrap();
        assert_eq!(c.gpu_backend, "sim");
        assert_eq!(c.interval_ms, 1000);
        assert_eq!(c.router_threads, 1);
        assert_eq!(c.sim.gpus.len(), 2);
        assert_eq!(c.metrics_listen, None);
        let served = AgentConfig::parse(&GOOD.replace("[sim]", "metrics_listen = \"127.0.0.1:9500\"\n[sim]")).unwrap();
        assert_eq!(served.metrics_listen, Some("127.0.0.1:9500".parse().unwrap()));
    }

    #[test]
    fn tls_files_are_required_unless_insecure() {
        let c = AgentConfig::parse(GOOD).unwrap();
        let err = c.client_tls().unwrap_err().reason;
        assert!(err.contains("`ca`") && err.contains("insecure"), "{err}");
        let insecure = AgentConfig { insecure: true, ..c.clone() };
        assert!(insecure.client_tls().unwrap().is_none());
        let missing = AgentConfig { ca: Some("/nonexistent/ca.pem".into()), cert: Some("c".into()), key: Some("k".into()), ..c };
        assert!(missing.client_tls().unwrap_err().reason.contains("/nonexistent/ca.pem"));
    }

    #[test]
    fn command_line_overrides_replace_the_per_host_values() {
        let shared = GOOD.replace("node = \"n1\"\n", "");
        assert!(AgentConfig::parse(&shared).unwrap_err().reason.starts_with("`node`: required"));
        let o = HostOverrides { node: Some("gpu-host-7".into()), advertise: Some("10.0.0.7:7200".into()) };
        let c = AgentConfig::parse_with(&shared, &o).unwrap();
        assert_eq!((c.node.as_str(), c.advertise.as_str()), ("gpu-host-7", "10.0.0.7:7200"));
        let renamed = AgentConfig::parse_with(GOOD, &HostOverrides { node: Some("n2".into()), advertise: None }).unwrap();
        assert_eq!((renamed.node.as_str(), renamed.advertise.as_str()), ("n2", "127.0.0.1:7100"));
    }

    #[test]
    fn bad_configs_name_the_field() {
        for (text, field) in [
            (GOOD.replace("node = \"n1\"", "node = \"\""), "`node`"),
            (GOOD.replace("[\"127.0.0.1:7001\"]", "[]"), "`controllers`"),
            (GOOD.replace("\"T4\"", "\"GTX480\""), "`sim.gpus`"),
            (GOOD.replace("state_dir", "state_dri"), "state_dri"),
            (GOOD.replace("[sim]", "metrics_listen = \"nowhere\"\n[sim]"), "metrics_listen"),
            (GOOD.replace("[sim]", "metrics_port = 9500\n[sim]"), "metrics_port"),
            (GOOD.replace("[sim]", "router_threads = 0\n[sim]"), "`router_threads`: 0 is out of range"),
            (GOOD.replace("[sim]", "router_threads = 65\n[sim]"), "`router_threads`: 65 is out of range: from 1 to 64"),
        ] {
            let err = AgentConfig::parse(&text).unwrap_err();
            assert!(err.reason.contains(field), "{field}: {}", err.reason);
        }
    }
}
