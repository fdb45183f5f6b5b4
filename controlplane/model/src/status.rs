//! The statuses written into the replicated state, typed. A status is stored as JSON
//! (`StoredResource::status`), so that a status write is never refused for a spec reason;
//! this module is the one place its keys are spelled. Writers build the types; readers use
//! the accessors, which read one key without decoding the rest (a Node's status holds every
//! GPU's workloads, and the provisioner reads the health of every Node on each pass).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::StatusJson;

/// The failure detector's verdict on a Node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Its agent reported (every report says so).
    #[default]
    Healthy,
    /// It missed its reports or its watch ended: planned around until it reports again.
    Unhealthy,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// A Node's status: what its agent last reported, and the failure detector's verdict.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    // The keys read on hot paths (`HOT_KEYS`) come first: they are read from the stored
    // text without reading past them (`StatusJson::field`).
    /// The desired-state version the agent has converged to (0: none yet).
    #[serde(default)]
    pub applied_version: u64,
    #[serde(default)]
    pub health: Health,
    /// Each service's router address on this node: what `gpuctl get endpoints` and load
    /// balancers (watching Nodes) read.
    #[serde(default)]
    pub endpoints: BTreeMap<String, String>,
    /// The digest of the report this status was written from (`proto::observed_digest`;
    /// 0: none, or marked unhealthy since): an agent whose observed state has it sends its
    /// reports without its GPUs.
    #[serde(default)]
    pub observed_digest: u64,
    #[serde(default)]
    pub gpus: Vec<ObservedGpu>,
}

/// A GPU as its agent observed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservedGpu {
    pub gpu_uuid: String,
    pub model: String,
    pub mig_enabled: bool,
    /// MIG instances as `profile@start`.
    pub instances: Vec<String>,
    pub workloads: Vec<ObservedWorkload>,
}

/// A workload process as its agent observed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservedWorkload {
    pub service: String,
    pub mig_instance: i32,
    pub mps_percent: f64,
    pub batch: u32,
    pub state: String,
    pub shadow: bool,
    pub pid: u32,
}

const HEALTH: &str = "health";
const APPLIED_VERSION: &str = "applied_version";
const ENDPOINTS: &str = "endpoints";
const OBSERVED_DIGEST: &str = "observed_digest";

/// The keys a stored status keeps at hand (`StatusJson::field`): those read for every Node
/// on every pass of the provisioner and the failure detector, and on every report.
pub(crate) const HOT_KEYS: [&str; 3] = [HEALTH, APPLIED_VERSION, OBSERVED_DIGEST];

/// A status's top-level keys, whether it is parsed (a client's `status_json`) or as the
/// state stores it ([`StatusJson`]).
pub trait StatusFields {
    /// The value of the top-level key `key`, if any.
    fn field(&self, key: &str) -> Option<Value>;
}

impl StatusFields for Value {
    fn field(&self, key: &str) -> Option<Value> {
        self.get(key).cloned()
    }
}

impl StatusFields for StatusJson {
    fn field(&self, key: &str) -> Option<Value> {
        StatusJson::field(self, key)
    }
}

impl NodeStatus {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a NodeStatus is plain data")
    }

    /// As the state stores it.
    pub fn to_status(&self) -> StatusJson {
        StatusJson::of(self).expect("a NodeStatus is plain data")
    }

    /// Whether `status` (a Node's) says the failure detector marked it unhealthy.
    pub fn is_unhealthy(status: &impl StatusFields) -> bool {
        status.field(HEALTH).as_ref().and_then(Value::as_str) == Some(Health::Unhealthy.as_str())
    }

    /// Whether `status` (a Node's) comes from a report since it was last marked unhealthy.
    pub fn is_healthy(status: &impl StatusFields) -> bool {
        status.field(HEALTH).as_ref().and_then(Value::as_str) == Some(Health::Healthy.as_str())
    }

    /// The desired-state version `status` (a Node's) says its agent converged to.
    pub fn applied_version(status: &impl StatusFields) -> u64 {
        status.field(APPLIED_VERSION).as_ref().and_then(Value::as_u64).unwrap_or(0)
    }

    /// The digest of the report `status` (a Node's) was written from; 0 when none.
    pub fn observed_digest(status: &impl StatusFields) -> u64 {
        status.field(OBSERVED_DIGEST).as_ref().and_then(Value::as_u64).unwrap_or(0)
    }

    /// The (service, router address) pairs of `status` (a Node's), empty addresses left out.
    pub fn endpoints(status: &Value) -> impl Iterator<Item = (&str, &str)> {
        status
            .get(ENDPOINTS)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(service, addr)| addr.as_str().filter(|a| !a.is_empty()).map(|a| (service.as_str(), a)))
    }

    /// `status` (a Node's) marked unhealthy, the rest as it was but for its report's digest
    /// (so that the agent's next report carries its GPUs and writes the status back as
    /// healthy); `None` when it already is.
    pub fn marked_unhealthy(status: &Value) -> Option<Value> {
        if Self::is_unhealthy(status) {
            return None;
        }
        let mut marked = if status.is_object() { status.clone() } else { Value::Object(Default::default()) };
        marked[HEALTH] = Value::from(Health::Unhealthy.as_str());
        if let Some(fields) = marked.as_object_mut() {
            fields.remove(OBSERVED_DIGEST);
        }
        Some(marked)
    }
}

/// A Service's status, written by the autoscaler.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// The rate the service is planned for (within its autoscaling range).
    pub provisioned_rps: f64,
    /// The arrival rate the agents measured when it was set.
    pub arrival_rps: f64,
}

const PROVISIONED_RPS: &str = "provisioned_rps";

impl ServiceStatus {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a ServiceStatus is plain data")
    }

    /// The rate `status` (a Service's) says the autoscaler provisioned it for.
    pub fn provisioned_rps(status: &impl StatusFields) -> Option<f64> {
        status.field(PROVISIONED_RPS).as_ref().and_then(Value::as_f64)
    }
}

/// SLO windows reported for a tenant's services, and how many met their SLO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SloCount {
    pub windows: u64,
    pub met: u64,
}

impl SloCount {
    pub fn plus(self, other: SloCount) -> SloCount {
        SloCount { windows: self.windows.saturating_add(other.windows), met: self.met.saturating_add(other.met) }
    }
}

/// A Tenant's status: its usage as of the committed plan and its SLO attainment since
/// metering began (carried over from leader to leader in the status itself).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TenantStatus {
    /// GPUs-worth the plan gives it: what its spec's `max_gpus` bounds.
    pub gpus: f64,
    /// `gpus` at their models' prices: what its spec's `max_cost_per_hour` bounds.
    pub cost_per_hour: f64,
    /// Of `gpus`, the MIG instance GPCs (times the MPS share in each) and the MPS shares of
    /// GPUs used whole (`controlplane::metering::Occupied`).
    pub mig_gpcs: f64,
    pub mps_gpus: f64,
    /// Its services the plan places.
    pub services_planned: u32,
    pub slo: SloCount,
}

impl TenantStatus {
    /// As stored (a status this binary cannot read counts as none: it is rewritten).
    pub fn of(r: &crate::StoredResource) -> TenantStatus {
        r.status.read().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accessors_read_what_the_types_write() {
        let node = NodeStatus {
            applied_version: 7,
            gpus: vec![ObservedGpu { gpu_uuid: "GPU-1".into(), model: "A100-80GB".into(), ..Default::default() }],
            health: Health::Healthy,
            endpoints: [("web".to_string(), "10.0.0.1:7100".to_string()), ("idle".to_string(), String::new())].into(),
            observed_digest: u64::MAX,
        };
        let json = node.to_json();
        assert_eq!(NodeStatus::applied_version(&json), 7);
        assert_eq!(NodeStatus::observed_digest(&json), u64::MAX, "every bit of the digest");
        assert!(NodeStatus::is_healthy(&json) && !NodeStatus::is_unhealthy(&json));
        assert_eq!(NodeStatus::endpoints(&json).collect::<Vec<_>>(), [("web", "10.0.0.1:7100")]);
        assert_eq!(serde_json::from_value::<NodeStatus>(json.clone()).unwrap(), node, "it reads back");
        // The same from the text the state stores, which puts the keys read on hot paths first.
        let stored = node.to_status();
        assert!(stored.as_str().starts_with(r#"{"applied_version":7,"health":"healthy","endpoints":"#), "{stored}");
        assert_eq!(NodeStatus::applied_version(&stored), 7);
        assert_eq!(NodeStatus::observed_digest(&stored), u64::MAX, "every bit of the digest");
        assert!(NodeStatus::is_healthy(&stored) && !NodeStatus::is_unhealthy(&stored));
        assert_eq!(stored.read::<NodeStatus>().unwrap(), node, "it reads back");
        assert_eq!(stored.to_value(), json);

        let marked = NodeStatus::marked_unhealthy(&json).unwrap();
        assert!(NodeStatus::is_unhealthy(&marked) && !NodeStatus::is_healthy(&marked));
        assert_eq!(serde_json::from_value::<NodeStatus>(marked.clone()).unwrap().health, Health::Unhealthy);
        assert_eq!(NodeStatus::applied_version(&marked), 7, "the rest is kept");
        assert_eq!(NodeStatus::observed_digest(&marked), 0, "but the report's digest: the next report carries the GPUs");
        assert_eq!(NodeStatus::marked_unhealthy(&marked), None, "once");
        // A Node that never reported has no status at all.
        assert!(NodeStatus::is_unhealthy(&NodeStatus::marked_unhealthy(&Value::Null).unwrap()));
        assert!(!NodeStatus::is_healthy(&Value::Null) && !NodeStatus::is_unhealthy(&Value::Null));

        let service = ServiceStatus { provisioned_rps: 2000.0, arrival_rps: 1600.0 };
        assert_eq!(ServiceStatus::provisioned_rps(&service.to_json()), Some(2000.0));
        assert_eq!(ServiceStatus::provisioned_rps(&Value::Null), None);
        assert_eq!(ServiceStatus::provisioned_rps(&StatusJson::of(&service).unwrap()), Some(2000.0));
        assert_eq!(ServiceStatus::provisioned_rps(&StatusJson::null()), None);
    }
}
