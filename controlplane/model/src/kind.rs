use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Resource kinds of the cluster state (ARCHITECTURE.md, "Domain model").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    Tenant,
    GpuModel,
    InstanceType,
    ModelProfile,
    Service,
    Node,
    Plan,
    ServingRuntime,
}

impl Kind {
    pub const ALL: [Kind; 8] =
        [Kind::Tenant, Kind::GpuModel, Kind::InstanceType, Kind::ModelProfile, Kind::ServingRuntime, Kind::Service, Kind::Node, Kind::Plan];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tenant => "Tenant",
            Kind::GpuModel => "GpuModel",
            Kind::InstanceType => "InstanceType",
            Kind::ModelProfile => "ModelProfile",
            Kind::Service => "Service",
            Kind::Node => "Node",
            Kind::Plan => "Plan",
            Kind::ServingRuntime => "ServingRuntime",
        }
    }

    /// Tenant-scoped kinds must name an existing tenant; the others must not name one.
    pub fn is_tenant_scoped(self) -> bool {
        matches!(self, Kind::Service)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    /// Accepts the kind's name in any case, plus the plural and a few short forms
    /// (`svc`, `gpumodels`, ...), as kubectl does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let singular = lower.strip_suffix('s').unwrap_or(&lower);
        let kind = match singular {
            "tenant" => Kind::Tenant,
            "gpumodel" | "gpu-model" | "gpu" => Kind::GpuModel,
            "instancetype" | "instance-type" | "it" => Kind::InstanceType,
            "modelprofile" | "model-profile" | "profile" => Kind::ModelProfile,
            "service" | "svc" => Kind::Service,
            "node" => Kind::Node,
            "plan" => Kind::Plan,
            "servingruntime" | "serving-runtime" | "runtime" => Kind::ServingRuntime,
            _ => {
                let known: Vec<_> = Kind::ALL.iter().map(|k| k.as_str()).collect();
                return Err(format!("unknown kind {s:?} (known: {})", known.join(", ")));
            }
        };
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_plurals_and_short_forms() {
        for kind in Kind::ALL {
            assert_eq!(kind.as_str().parse::<Kind>().unwrap(), kind);
            assert_eq!(format!("{}s", kind.as_str().to_lowercase()).parse::<Kind>().unwrap(), kind);
        }
        assert_eq!("svc".parse::<Kind>().unwrap(), Kind::Service);
        assert!("pods".parse::<Kind>().unwrap_err().contains("unknown kind"));
    }
}
