//! The Node resource the agent registers: its address, instance type, GPUs and labels.

use super::Agent;

impl Agent {
    /// The Node resource this agent registers.
    pub(super) fn node_resource(&self) -> proto::Resource {
        let gpus = self
            .executor
            .lock()
            .expect("executor lock")
            .gpus
            .iter()
            .map(|g| model::NodeGpu { uuid: g.uuid.clone(), model: self.model_name(g), mig_enabled: g.mig_enabled })
            .collect();
        let spec = model::NodeSpec {
            address: self.cfg.advertise.clone(),
            instance_type: self.cfg.instance_type.clone(),
            gpus,
            labels: self.cfg.labels.clone(),
        };
        let spec_json = serde_json::to_string(&spec).expect("a NodeSpec is plain data");
        proto::Resource { kind: model::Kind::Node.to_string(), name: self.cfg.node.clone(), spec_json, ..Default::default() }
    }

    /// The GpuModel resource name of a GPU: the configured name for simulated GPUs (V100 and
    /// T4 share the planner's no-MIG geometry), else derived from the product.
    pub(super) fn model_name(&self, g: &crate::backend::GpuInfo) -> String {
        match self.cfg.sim.gpus.get(g.index as usize) {
            Some(name) if self.cfg.gpu_backend == "sim" => name.clone(),
            _ => config_model_name(g.model, &g.name).to_string(),
        }
    }
}

/// The GpuModel resource name for a GPU (what the controller's references expect).
fn config_model_name(model: planner::mig::GpuModel, product: &str) -> &'static str {
    use planner::mig::GpuModel::*;
    match model {
        A100_40GB => "A100-40GB",
        A100_80GB => "A100-80GB",
        H100_80GB => "H100-80GB",
        H200 => "H200",
        NoMig if product.contains("T4") => "T4",
        NoMig => "V100",
    }
}
