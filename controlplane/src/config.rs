//! Controller configuration: a TOML file, overridden by command-line flags.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::loops::LoopSettings;
use crate::provision::MigStrategy;
use crate::raft::{check_host_port, Member, RaftSettings};
use crate::tuning::TuningSettings;
use planner::policy::gslice::TunerConfig;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    pub node_id: Option<u64>,
    /// Address to listen on, e.g. `0.0.0.0:7400`.
    pub listen: Option<SocketAddr>,
    /// Address peers and clients reach this node at (default: the listen address).
    pub advertise: Option<String>,
    /// Serve Raft's peer RPCs on a listener of their own, e.g. `0.0.0.0:7410`, on Raft's own
    /// threads: peers' heartbeats and log entries are then never queued behind agents'
    /// requests. When unset, peers reach this node at `listen` (which serves them too).
    pub peer_listen: Option<SocketAddr>,
    /// Address peers reach `peer_listen` at (default: this node's `[peers]` entry's peer
    /// address, else the peer listen address).
    pub peer_advertise: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` over plain HTTP, e.g.
    /// `127.0.0.1:9400`; not served when unset.
    pub metrics_listen: Option<SocketAddr>,
    /// Export traces over OTLP/gRPC here, e.g. `http://collector:4317` (default:
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; no export when neither is set).
    pub otlp_endpoint: Option<String>,
    /// Initial cluster members, node id -> `host:port`, or `host:port,peer_host:peer_port`
    /// for a member with a `peer_listen` (this node included). Used with `bootstrap = true`
    /// on exactly one node.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    #[serde(default)]
    pub bootstrap: bool,
    /// The node with this id bootstraps (as if it had `bootstrap = true`): one config file
    /// for every node, e.g. a StatefulSet's ConfigMap.
    pub bootstrap_node: Option<u64>,
    #[serde(default)]
    pub raft: RaftConfig,
    #[serde(default)]
    pub loops: LoopsConfig,
    #[serde(default)]
    pub cloud: CloudConfig,
    #[serde(default)]
    pub security: SecurityConfig,
    #[serde(default)]
    pub limits: crate::security::RateLimits,
}

/// `[security]`: mTLS and tokens. Either `ca`, `cert` and `key`, or `insecure = true`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// Plaintext and no authentication (development only).
    #[serde(default)]
    pub insecure: bool,
    /// The cluster CA (PEM): peers, agents and clients present certificates it signed.
    pub ca: Option<PathBuf>,
    /// This controller's certificate (PEM, URI SAN `spiffe://gpuplane/controller/<id>`).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Tenants' and admins' token digests (TOML); no tokens when unset.
    pub tokens: Option<PathBuf>,
}

impl ControllerConfig {
    /// The security settings, or an error naming the missing setting.
    pub fn security(&self) -> anyhow::Result<crate::security::Security> {
        use crate::security::{Security, TlsMaterial, Tokens};
        let s = &self.security;
        self.limits.validate().map_err(anyhow::Error::msg)?;
        if s.insecure {
            return Ok(Security { limits: self.limits.clone(), ..Security::insecure() });
        }
        let missing = |field: &str| {
            anyhow::anyhow!(
                "security.{field} is not set: give security.ca, security.cert and security.key (or --ca/--cert/--key; \
                 `gpuctl certs` makes development certificates), or run plaintext with --insecure (development only)"
            )
        };
        let ca = s.ca.as_deref().ok_or_else(|| missing("ca"))?;
        let cert = s.cert.as_deref().ok_or_else(|| missing("cert"))?;
        let key = s.key.as_deref().ok_or_else(|| missing("key"))?;
        let tls = TlsMaterial::load(ca, Some(cert), Some(key))?;
        let tokens = match &s.tokens {
            Some(path) => Tokens::load(path)?,
            None => Tokens::default(),
        };
        Ok(Security { tls: Some(tls), tokens, limits: self.limits.clone() })
    }
}

/// `[loops]`: the leader-only loops.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopsConfig {
    /// Seconds between provisioning passes (also run on every relevant change); default 30.
    pub provision_interval_s: Option<f64>,
    /// `parvagpu` (default) or `exact-mig`.
    pub mig_strategy: Option<MigStrategy>,
    /// Agents' report interval, ms (default 1000): the failure detector's heartbeat.
    pub heartbeat_interval_ms: Option<u64>,
    /// Heartbeats a node may miss before it is unhealthy (default 5).
    pub missed_heartbeats: Option<u32>,
    /// Milliseconds after its agent's desired-state stream ended, with no report from a new
    /// stream, before a node is unhealthy (default 2000; at most 600000).
    pub watch_grace_ms: Option<u64>,
    /// Reports a second the whole fleet may send (default 2500): past `budget × heartbeat`
    /// nodes, agents are told to report less often, up to once a minute.
    pub report_budget_per_s: Option<u32>,
    /// KiB of agents' reports a second whose observed state the leader writes into Nodes'
    /// statuses (default 4096, bursts of twice that; in [8, 1048576]): bounds how much of a
    /// burst of changed statuses (after a fleet-wide re-plan) goes into the log at once.
    pub status_write_kib_per_s: Option<u32>,
    /// Seconds the load must stay up before an autoscaling service is sized up (default 60).
    pub scale_window_s: Option<f64>,
    /// Seconds before sizing down or terminating an idle launched node (default 300).
    pub cooldown_s: Option<f64>,
    /// HetSev's λ per second of launch latency (default 0.001).
    pub lambda_per_s: Option<f64>,
    /// The highest throughput saturation an autoscaling service is sized to, in (0, 1]
    /// (default 0.8, HetSev's); each is sized below it as far as its SLO and its observed
    /// windows need.
    pub target_saturation: Option<f64>,
    /// Run the GSLICE tuner (default true).
    pub tuner: Option<bool>,
    /// Seconds between tuning passes (default 5).
    pub tune_interval_s: Option<f64>,
    /// The tuner's latency target as a fraction of the SLO, in (0, 1] (default 1.0).
    pub tune_slo_fraction: Option<f64>,
    /// Seconds between two share changes of one workload (default 10, GSLICE's hold-down).
    pub tune_hold_down_s: Option<f64>,
    /// Seconds between writes of each Tenant's usage and SLO attainment into its status
    /// (default 10).
    pub metering_interval_s: Option<f64>,
    /// Seconds a moved workload keeps serving in its old slot at most, when its
    /// replacements never report ready (default 300).
    pub handover_max_s: Option<f64>,
}

/// `[cloud]`: where the autoscaler gets nodes. Only `provider = "sim"` exists so far.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudConfig {
    pub provider: Option<String>,
    /// `node-agent` executable for the simulated cloud.
    pub agent_binary: Option<PathBuf>,
    /// Workload command of the simulated instances (e.g. `sim-infer`) and its arguments.
    pub workload_program: Option<PathBuf>,
    #[serde(default)]
    pub workload_args: Vec<String>,
    /// Parent directory of the simulated instances' state.
    pub base_dir: Option<PathBuf>,
    /// First port of the blocks handed to simulated instances (default 30000).
    pub first_port: Option<u16>,
    /// Launch latencies are multiplied by this (default 1).
    pub time_scale: Option<f64>,
}

impl LoopsConfig {
    pub fn settings(&self, enabled: bool) -> Result<LoopSettings, String> {
        let d = LoopSettings::default();
        let seconds = |name: &str, v: Option<f64>, default: std::time::Duration| match v {
            Some(s) if !(s > 0.0 && s <= 86_400.0) => Err(format!("loops.{name}: must be in (0, 86400], got {s}")),
            Some(s) => Ok(std::time::Duration::from_secs_f64(s)),
            None => Ok(default),
        };
        let interval = seconds("provision_interval_s", self.provision_interval_s, d.provision_interval)?;
        let heartbeat = match self.heartbeat_interval_ms {
            Some(0) => return Err("loops.heartbeat_interval_ms: must be positive".into()),
            Some(ms) => std::time::Duration::from_millis(ms),
            None => d.heartbeat_interval,
        };
        let missed = match self.missed_heartbeats {
            Some(0) => return Err("loops.missed_heartbeats: must be at least 1".into()),
            Some(n) => n,
            None => d.missed_heartbeats,
        };
        let watch_grace = match self.watch_grace_ms {
            Some(ms) if ms == 0 || ms > 600_000 => return Err(format!("loops.watch_grace_ms: must be in [1, 600000], got {ms}")),
            Some(ms) => std::time::Duration::from_millis(ms),
            None => d.watch_grace,
        };
        let report_budget_per_s = match self.report_budget_per_s {
            Some(0) => return Err("loops.report_budget_per_s: must be at least 1".into()),
            Some(n) => n,
            None => d.report_budget_per_s,
        };
        use crate::agents::status_pace::{MAX_KIB_PER_S, MIN_KIB_PER_S};
        let status_write_kib_per_s = match self.status_write_kib_per_s {
            Some(n) if !(MIN_KIB_PER_S..=MAX_KIB_PER_S).contains(&n) => {
                return Err(format!("loops.status_write_kib_per_s: must be in [{MIN_KIB_PER_S}, {MAX_KIB_PER_S}], got {n}"))
            }
            Some(n) => n,
            None => d.status_write_kib_per_s,
        };
        let non_negative = |name: &str, v: Option<f64>, default: f64| match v {
            Some(x) if !(x >= 0.0 && x.is_finite()) => Err(format!("loops.{name}: must be a non-negative number, got {x}")),
            Some(x) => Ok(x),
            None => Ok(default),
        };
        Ok(LoopSettings {
            provision_interval: interval,
            mig_strategy: self.mig_strategy.unwrap_or(d.mig_strategy),
            heartbeat_interval: heartbeat,
            report_budget_per_s,
            status_write_kib_per_s,
            missed_heartbeats: missed,
            watch_grace,
            enabled,
            provider: None,
            scale_window_s: non_negative("scale_window_s", self.scale_window_s, d.scale_window_s)?,
            cooldown_s: non_negative("cooldown_s", self.cooldown_s, d.cooldown_s)?,
            lambda_per_s: non_negative("lambda_per_s", self.lambda_per_s, d.lambda_per_s)?,
            target_saturation: match self.target_saturation {
                Some(x) if !(x > 0.0 && x <= 1.0) => return Err(format!("loops.target_saturation: must be in (0, 1], got {x}")),
                Some(x) => x,
                None => d.target_saturation,
            },
            tuner: self.tuner.unwrap_or(d.tuner),
            tune_interval: seconds("tune_interval_s", self.tune_interval_s, d.tune_interval)?,
            metering_interval: seconds("metering_interval_s", self.metering_interval_s, d.metering_interval)?,
            handover_max: seconds("handover_max_s", self.handover_max_s, d.handover_max)?,
            tuning: TuningSettings::new(
                self.tune_slo_fraction.unwrap_or(d.tuning.slo_fraction()),
                TunerConfig {
                    hold_down_s: non_negative("tune_hold_down_s", self.tune_hold_down_s, d.tuning.gslice().hold_down_s)?,
                    ..*d.tuning.gslice()
                },
            )
            .map_err(|e| format!("loops.tune_{}: {}", e.field, e.reason))?,
            plan_off_runtime: d.plan_off_runtime,
        })
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaftConfig {
    pub heartbeat_interval_ms: Option<u64>,
    pub election_timeout_min_ms: Option<u64>,
    pub election_timeout_max_ms: Option<u64>,
    pub snapshot_every: Option<u64>,
    pub keep_logs_after_snapshot: Option<u64>,
    pub own_runtime: Option<bool>,
}

impl RaftConfig {
    pub fn settings(&self) -> RaftSettings {
        let d = RaftSettings::default();
        RaftSettings {
            heartbeat_interval_ms: self.heartbeat_interval_ms.unwrap_or(d.heartbeat_interval_ms),
            election_timeout_min_ms: self.election_timeout_min_ms.unwrap_or(d.election_timeout_min_ms),
            election_timeout_max_ms: self.election_timeout_max_ms.unwrap_or(d.election_timeout_max_ms),
            snapshot_every: self.snapshot_every.unwrap_or(d.snapshot_every),
            keep_logs_after_snapshot: self.keep_logs_after_snapshot.unwrap_or(d.keep_logs_after_snapshot),
            own_runtime: self.own_runtime.unwrap_or(d.own_runtime),
            ..d
        }
    }
}

impl ControllerConfig {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("config {}: {}", path.display(), e.message()))
    }

    /// Peers with their ids and addresses parsed; errors name the offending key.
    pub fn peer_map(&self) -> Result<BTreeMap<u64, Member>, String> {
        self.peers
            .iter()
            .map(|(id, value)| {
                let id = id.parse::<u64>().map_err(|_| format!("peers.{id}: node ids must be positive integers"))?;
                if id == 0 {
                    return Err("peers.0: node ids start at 1".to_string());
                }
                let member = match value.split_once(',') {
                    Some((addr, peer)) => Member::with_peer_addr(addr.trim(), Some(peer.trim().to_string())),
                    None => Member::new(value.trim()),
                };
                for addr in [Some(&member.addr), member.peer_addr.as_ref()].into_iter().flatten() {
                    check_host_port(addr)
                        .map_err(|why| format!("peers.{id}: {why} (expected host:port or host:port,peer_host:peer_port)"))?;
                }
                Ok((id, member))
            })
            .collect()
    }

    /// This node's id: `node_id`, or else the id of the `[peers]` entry whose address is
    /// `advertise` (a StatefulSet pod knows its stable name, not a number).
    pub fn resolve_node_id(&self) -> Result<u64, String> {
        let id = match (self.node_id, &self.advertise) {
            (Some(id), _) => id,
            (None, Some(advertise)) => {
                let peers = self.peer_map()?;
                let ids: Vec<u64> = peers.iter().filter(|(_, m)| m.addr == *advertise).map(|(id, _)| *id).collect();
                match ids[..] {
                    [id] => id,
                    [] => return Err(format!("node_id is required: advertise {advertise:?} is not the address of any [peers] entry")),
                    _ => return Err(format!("node_id is required: [peers] entries {ids:?} all have the address {advertise:?}")),
                }
            }
            (None, None) => return Err(NODE_ID_REQUIRED.into()),
        };
        if id == 0 {
            return Err("node_id: must be >= 1".into());
        }
        Ok(id)
    }

    /// Whether node `id` initialises the cluster (when it has no state yet).
    pub fn bootstraps(&self, id: u64) -> bool {
        self.bootstrap || self.bootstrap_node == Some(id)
    }
}

const NODE_ID_REQUIRED: &str =
    "node_id is required (--node-id or node_id in the config file; or advertise the address of one [peers] entry)";

/// Parses `ID=HOST:PORT` or `ID=HOST:PORT,PEER_HOST:PEER_PORT` from the command line.
pub fn parse_peer_flag(s: &str) -> Result<(String, String), String> {
    let (id, addr) = s.split_once('=').ok_or_else(|| format!("--peer {s:?}: expected ID=HOST:PORT[,PEER_HOST:PEER_PORT]"))?;
    Ok((id.trim().to_string(), addr.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_config_for_every_node_derives_the_id_from_advertise() {
        let shared = "bootstrap_node = 1\n[peers]\n1 = \"c-0.c:7400\"\n2 = \"c-1.c:7400\"\n";
        let node = |advertise: &str| {
            let mut cfg: ControllerConfig = toml::from_str(shared).unwrap();
            cfg.advertise = Some(advertise.to_string());
            cfg
        };
        assert_eq!(node("c-1.c:7400").resolve_node_id(), Ok(2));
        assert!(node("c-0.c:7400").bootstraps(1));
        assert!(!node("c-1.c:7400").bootstraps(2));
        let err = node("c-2.c:7400").resolve_node_id().unwrap_err();
        assert!(err.contains("\"c-2.c:7400\" is not the address of any [peers] entry"), "{err}");
        let mut explicit = node("c-2.c:7400");
        explicit.node_id = Some(7);
        assert_eq!(explicit.resolve_node_id(), Ok(7));
        explicit.node_id = Some(0);
        assert_eq!(explicit.resolve_node_id(), Err("node_id: must be >= 1".to_string()));
        assert!(ControllerConfig::default().resolve_node_id().unwrap_err().starts_with("node_id is required"));
    }

    #[test]
    fn parses_a_full_config_and_rejects_unknown_keys() {
        let cfg: ControllerConfig = toml::from_str(
            r#"
node_id = 2
listen = "0.0.0.0:7400"
advertise = "ctrl-2:7400"
data_dir = "/var/lib/gpuplane"
metrics_listen = "127.0.0.1:9400"
peer_listen = "0.0.0.0:7410"
[peers]
1 = "ctrl-1:7400"
2 = "ctrl-2:7400, ctrl-2:7410"
[raft]
heartbeat_interval_ms = 50
"#,
        )
        .unwrap();
        assert_eq!(cfg.peer_map().unwrap()[&1], Member::new("ctrl-1:7400"));
        assert_eq!(cfg.peer_map().unwrap()[&2], Member::with_peer_addr("ctrl-2:7400", Some("ctrl-2:7410".into())));
        assert_eq!(cfg.peer_listen, Some("0.0.0.0:7410".parse().unwrap()));
        assert_eq!(cfg.metrics_listen, Some("127.0.0.1:9400".parse().unwrap()));
        let err = toml::from_str::<ControllerConfig>("metrics_listen = \"nowhere\"").unwrap_err();
        assert!(err.message().contains("invalid socket address"), "{}", err.message());
        assert_eq!(cfg.raft.settings().heartbeat_interval_ms, 50);
        assert_eq!(cfg.raft.settings().election_timeout_min_ms, RaftSettings::default().election_timeout_min_ms);
        let err = toml::from_str::<ControllerConfig>("node_id = 1\nlisten_addr = \"x\"").unwrap_err();
        assert!(err.message().contains("unknown field `listen_addr`"), "{}", err.message());
        let bad: ControllerConfig = toml::from_str("[peers]\nx = \"a:1\"").unwrap();
        assert!(bad.peer_map().unwrap_err().contains("peers.x"));
        let bad: ControllerConfig = toml::from_str("[peers]\n3 = \"a:1,a\"").unwrap();
        assert_eq!(bad.peer_map().unwrap_err(), "peers.3: \"a\" is not host:port (expected host:port or host:port,peer_host:peer_port)");
    }

    fn loops(toml_text: &str) -> Result<LoopSettings, String> {
        toml::from_str::<ControllerConfig>(toml_text).map_err(|e| e.message().to_string())?.loops.settings(true)
    }

    #[test]
    fn security_needs_tls_files_or_insecure_and_limits_are_checked() {
        let cfg: ControllerConfig = toml::from_str("node_id = 1\n").unwrap();
        let err = cfg.security().unwrap_err().to_string();
        assert!(err.contains("security.ca") && err.contains("--insecure"), "{err}");
        let cfg: ControllerConfig = toml::from_str("[security]\nca = \"/nonexistent/ca.pem\"\n").unwrap();
        assert!(cfg.security().unwrap_err().to_string().contains("security.cert"));
        let cfg: ControllerConfig = toml::from_str("[security]\ninsecure = true\n[limits]\ntenant_rps = 5\n").unwrap();
        let security = cfg.security().unwrap();
        assert!(security.is_insecure());
        assert_eq!((security.limits.tenant_rps, security.limits.tenant_burst), (5, 100));
        let cfg: ControllerConfig = toml::from_str("[security]\ninsecure = true\n[limits]\nnode_burst = 0\n").unwrap();
        assert!(cfg.security().unwrap_err().to_string().contains("limits.node_burst"));
        assert!(toml::from_str::<ControllerConfig>("[limits]\ntenant_rate = 5\n").is_err());
    }

    #[test]
    fn connection_and_watch_bounds_are_set_under_limits_and_checked() {
        let d = crate::security::RateLimits::default();
        assert_eq!((d.connections_per_ip, d.exempt_loopback, d.max_connections), (1024, true, None));
        assert_eq!((d.handshake_timeout_ms, d.idle_timeout_ms, d.streams_per_connection), (10_000, 300_000, 256));
        assert_eq!((d.watches_per_principal, d.watch_queue_events, d.watch_queue_kib), (16, 1000, 4096));
        let cfg: ControllerConfig = toml::from_str(
            "[security]\ninsecure = true\n[limits]\nmax_connections = 5000\nconnections_per_ip = 8\nexempt_loopback = false\n\
             handshake_timeout_ms = 500\nidle_timeout_ms = 60000\nstreams_per_connection = 64\nwatches_per_principal = 4\n\
             watch_queue_events = 100\nwatch_queue_kib = 256\n",
        )
        .unwrap();
        let limits = cfg.security().unwrap().limits;
        assert_eq!((limits.max_connections, limits.connections_per_ip, limits.exempt_loopback), (Some(5000), 8, false));
        assert_eq!((limits.handshake_timeout_ms, limits.idle_timeout_ms, limits.streams_per_connection), (500, 60_000, 64));
        assert_eq!((limits.watches_per_principal, limits.watch_queue_events, limits.watch_queue_kib), (4, 100, 256));
        let cfg: ControllerConfig = toml::from_str("[security]\ninsecure = true\n[limits]\nwatches_per_principal = 0\n").unwrap();
        assert!(cfg.security().unwrap_err().to_string().contains("limits.watches_per_principal: must be at least 1"));
        let cfg: ControllerConfig = toml::from_str("[security]\ninsecure = true\n[limits]\nhandshake_timeout_ms = 0\n").unwrap();
        assert!(cfg.security().unwrap_err().to_string().contains("limits.handshake_timeout_ms"));
    }

    #[test]
    fn the_tuner_is_on_by_default_and_configured_under_loops() {
        let d = loops("").unwrap();
        assert!(d.tuner);
        assert_eq!(d.tune_interval, std::time::Duration::from_secs(5));
        assert_eq!(d.tuning.slo_fraction(), 1.0);
        assert_eq!(d.tuning.gslice().hold_down_s, 10.0);

        let s = loops("[loops]\ntuner = false\ntune_interval_s = 2\ntune_slo_fraction = 0.9\ntune_hold_down_s = 3").unwrap();
        assert!(!s.tuner);
        assert_eq!(s.tune_interval, std::time::Duration::from_secs(2));
        assert_eq!(s.tuning.slo_fraction(), 0.9);
        assert_eq!(s.tuning.gslice().hold_down_s, 3.0);

        let err = |text: &str| loops(text).unwrap_err();
        assert!(err("[loops]\ntune_interval_s = 0").starts_with("loops.tune_interval_s: "), "{}", err("[loops]\ntune_interval_s = 0"));
        assert!(err("[loops]\ntune_slo_fraction = 1.2").starts_with("loops.tune_slo_fraction: must be in (0, 1]"));
        assert!(err("[loops]\ntune_hold_down_s = -1").starts_with("loops.tune_hold_down_s: "));
        assert!(err("[loops]\ntune_intervals = 3").contains("unknown field `tune_intervals`"));
    }

    #[test]
    fn the_report_budget_defaults_to_2500_a_second_and_is_at_least_one() {
        assert_eq!(loops("").unwrap().report_budget_per_s, 2_500);
        assert_eq!(loops("[loops]\nreport_budget_per_s = 500").unwrap().report_budget_per_s, 500);
        let err = loops("[loops]\nreport_budget_per_s = 0").unwrap_err();
        assert_eq!(err, "loops.report_budget_per_s: must be at least 1");
    }

    #[test]
    fn the_target_saturation_defaults_to_hetsevs_and_is_a_fraction() {
        assert_eq!(loops("[loops]\ntarget_saturation = 0.7").unwrap().target_saturation, 0.7);
        assert_eq!(loops("").unwrap().target_saturation, 0.8, "HetSev's by default");
        assert_eq!(loops("[loops]\ntarget_saturation = 1.5").unwrap_err(), "loops.target_saturation: must be in (0, 1], got 1.5");
        assert!(loops("[loops]\ntarget_saturation = 0").unwrap_err().starts_with("loops.target_saturation: "));
    }

    #[test]
    fn the_watch_grace_defaults_to_two_seconds_and_is_bounded() {
        assert_eq!(loops("").unwrap().watch_grace, std::time::Duration::from_secs(2));
        assert_eq!(loops("[loops]\nwatch_grace_ms = 500").unwrap().watch_grace, std::time::Duration::from_millis(500));
        assert_eq!(loops("[loops]\nwatch_grace_ms = 0").unwrap_err(), "loops.watch_grace_ms: must be in [1, 600000], got 0");
        assert!(loops("[loops]\nwatch_grace_ms = 600001").unwrap_err().starts_with("loops.watch_grace_ms: "));
    }

    #[test]
    fn the_status_write_pace_defaults_to_4_mib_a_second_and_is_bounded() {
        assert_eq!(loops("").unwrap().status_write_kib_per_s, 4096);
        assert_eq!(loops("[loops]\nstatus_write_kib_per_s = 65536").unwrap().status_write_kib_per_s, 65536);
        assert_eq!(loops("[loops]\nstatus_write_kib_per_s = 8").unwrap().status_write_kib_per_s, 8, "the lower bound itself");
        assert_eq!(loops("[loops]\nstatus_write_kib_per_s = 1048576").unwrap().status_write_kib_per_s, 1_048_576, "the upper bound");
        assert_eq!(
            loops("[loops]\nstatus_write_kib_per_s = 7").unwrap_err(),
            "loops.status_write_kib_per_s: must be in [8, 1048576], got 7"
        );
        assert!(loops("[loops]\nstatus_write_kib_per_s = 1048577").unwrap_err().starts_with("loops.status_write_kib_per_s: "));
    }
}
