//! A simulated cloud on this host: an instance is a `node-agent` process with simulated
//! GPUs of the instance type, started after the type's launch latency, each with its own
//! state directory and port blocks. Terminating kills the agent and its workload processes,
//! as losing the VM would.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{NodeProvider, AUTOSCALED_LABEL};
use crate::resources::InstanceTypeSpec;

#[derive(Clone, Debug)]
pub struct SimCloudConfig {
    /// The `node-agent` executable.
    pub agent_binary: PathBuf,
    /// The workload command (e.g. `sim-infer`) and its arguments, as in an agent template.
    pub workload_program: PathBuf,
    pub workload_args: Vec<String>,
    /// Parent of the instances' state directories.
    pub base_dir: PathBuf,
    /// Controllers the agents report to.
    pub controllers: Vec<String>,
    /// First port of the blocks handed to instances (100 workload and 20 router ports each).
    pub first_port: u16,
    /// Launch latency is multiplied by this (tests and demos run faster than a cloud).
    pub time_scale: f64,
}

pub struct SimCloud {
    config: SimCloudConfig,
    instances: Arc<Mutex<BTreeMap<String, Option<Child>>>>,
    next_block: Mutex<u16>,
}

impl SimCloud {
    pub fn new(config: SimCloudConfig) -> Self {
        SimCloud { config, instances: Arc::default(), next_block: Mutex::new(0) }
    }

    fn agent_config(&self, node: &str, type_name: &str, spec: &InstanceTypeSpec, block: u16) -> String {
        let workload_first = self.config.first_port + block * 120;
        let router_first = workload_first + 100;
        let gpus: Vec<String> = (0..spec.gpu_count).map(|_| format!("{:?}", spec.gpu_model)).collect();
        let args: Vec<String> = self.config.workload_args.iter().map(|a| format!("{a:?}")).collect();
        format!(
            "node = {node:?}\ncontrollers = {controllers:?}\ninstance_type = {type_name:?}\nstate_dir = {state:?}\ninsecure = true\n\
             advertise = \"127.0.0.1:{router_first}\"\nport_range = [{workload_first}, {wl}]\nrouter_ports = [{router_first}, {rl}]\n\
             interval_ms = 500\n[labels]\n{label:?} = \"true\"\n[sim]\ngpus = [{gpus}]\n[template]\nkind = \"command\"\nprogram = {program:?}\nargs = [{args}]\n",
            controllers = self.config.controllers,
            state = self.config.base_dir.join(node).display().to_string(),
            wl = workload_first + 99,
            rl = router_first + 19,
            label = AUTOSCALED_LABEL,
            gpus = gpus.join(", "),
            program = self.config.workload_program.display().to_string(),
            args = args.join(", "),
        )
    }
}

impl NodeProvider for SimCloud {
    fn launch(&self, node: &str, type_name: &str, spec: &InstanceTypeSpec) -> Result<(), String> {
        let block = {
            let mut next = self.next_block.lock().expect("block lock");
            *next += 1;
            *next - 1
        };
        let dir = self.config.base_dir.join(node);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config_path = dir.join("agent.toml");
        std::fs::write(&config_path, self.agent_config(node, type_name, spec, block))
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        self.instances.lock().expect("instances lock").insert(node.to_string(), None);
        let delay = Duration::from_secs_f64((spec.launch_latency_s * self.config.time_scale).max(0.0));
        let (instances, binary, node) = (self.instances.clone(), self.config.agent_binary.clone(), node.to_string());
        tracing::info!(node, type_name, delay_ms = delay.as_millis() as u64, "sim cloud: launching");
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let log = match std::fs::File::create(dir.join("agent.log")) {
                Ok(f) => f,
                Err(e) => return tracing::error!(node, error = %e, "sim cloud: no log file"),
            };
            let child = Command::new(&binary)
                .arg("--config")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map(Stdio::from).unwrap_or(Stdio::null()))
                .stderr(Stdio::from(log))
                .spawn();
            match child {
                Ok(c) => {
                    // For whoever cleans up after this controller is gone (the demo).
                    let _ = std::fs::write(dir.join("agent.pid"), c.id().to_string());
                    // Terminated while launching: do not start it.
                    let mut map = instances.lock().expect("instances lock");
                    match map.get_mut(&node) {
                        Some(slot) => *slot = Some(c),
                        None => {
                            let mut c = c;
                            let _ = c.kill();
                        }
                    }
                }
                Err(e) => tracing::error!(node, error = %e, "sim cloud: the agent did not start"),
            }
        });
        Ok(())
    }

    fn terminate(&self, node: &str) -> Result<(), String> {
        if let Some(Some(mut child)) = self.instances.lock().expect("instances lock").remove(node) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The VM's processes die with it: the agent's recorded workloads.
        let records = self.config.base_dir.join(node).join("processes.json");
        if let Ok(bytes) = std::fs::read(&records) {
            let list: Vec<serde_json::Value> = serde_json::from_slice(&bytes).unwrap_or_default();
            for pid in list.iter().filter_map(|r| r["pid"].as_u64()) {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
        tracing::info!(node, "sim cloud: terminated");
        Ok(())
    }
}

impl Drop for SimCloud {
    fn drop(&mut self) {
        let nodes: Vec<String> = self.instances.lock().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        for n in nodes {
            let _ = self.terminate(&n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_gets_an_agent_config_with_its_gpus_label_and_port_blocks() {
        let cloud = SimCloud::new(SimCloudConfig {
            agent_binary: "node-agent".into(),
            workload_program: "sim-infer".into(),
            workload_args: vec!["--listen=127.0.0.1:{port}".into()],
            base_dir: "/tmp/cloud".into(),
            controllers: vec!["127.0.0.1:7401".into()],
            first_port: 30000,
            time_scale: 0.0,
        });
        let spec = InstanceTypeSpec {
            gpu_model: "T4-16GB".into(),
            gpu_count: 2,
            price_per_hour: 1.0,
            launch_latency_s: 60.0,
            cpu_cores: 0,
            memory_gib: 0.0,
            max_instances: None,
        };
        let text = cloud.agent_config("auto-g4-1", "g4dn", &spec, 2);
        let v: toml::Value = toml::from_str(&text).expect("valid TOML");
        assert_eq!(v["node"].as_str(), Some("auto-g4-1"));
        assert_eq!(v["instance_type"].as_str(), Some("g4dn"));
        assert_eq!(v["sim"]["gpus"].as_array().unwrap().len(), 2);
        assert_eq!(v["labels"][AUTOSCALED_LABEL].as_str(), Some("true"));
        // Block 2: workloads 30240-30339, routers 30340-30359.
        assert_eq!(v["port_range"].as_array().unwrap()[0].as_integer(), Some(30240));
        assert_eq!(v["router_ports"].as_array().unwrap()[1].as_integer(), Some(30359));
        assert_eq!(v["template"]["args"].as_array().unwrap()[0].as_str(), Some("--listen=127.0.0.1:{port}"));
    }
}
