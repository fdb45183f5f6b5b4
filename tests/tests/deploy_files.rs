//! The files under deploy/ are read by the real config parsers, and the Kubernetes and
//! compose manifests hold together: every pod's config resolves to its own node id, one
//! controller bootstraps, the headless Service, StatefulSet and PDB agree.

use std::path::{Path, PathBuf};

use controlplane::config::ControllerConfig;
use node_agent::config::{AgentConfig, HostOverrides};
use serde_yaml_ng::Value;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The documents of a multi-document YAML file.
fn documents(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

fn str_at<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str().unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

fn controller_config(text: &str) -> ControllerConfig {
    toml::from_str(text).unwrap_or_else(|e| panic!("controller.toml: {e}"))
}

#[test]
fn every_kubernetes_object_has_api_version_kind_name_and_namespace() {
    for file in ["k8s/namespace.yaml", "k8s/controller.yaml", "k8s/node-agent.yaml"] {
        for doc in documents(file) {
            for key in ["apiVersion", "kind"] {
                str_at(&doc[key], &format!("{file}: {key}"));
            }
            str_at(&doc["metadata"]["name"], &format!("{file}: metadata.name"));
            if doc["kind"] != "Namespace" {
                assert_eq!(doc["metadata"]["namespace"], "gpuplane", "{file}: {:?}", doc["metadata"]["name"]);
            }
        }
    }
}

#[test]
fn each_controller_pod_resolves_its_own_node_id_and_only_the_first_bootstraps() {
    let docs = documents("k8s/controller.yaml");
    let set = find(&docs, "StatefulSet");
    let replicas = set["spec"]["replicas"].as_u64().unwrap();
    assert_eq!(replicas, 3);
    let service = str_at(&set["spec"]["serviceName"], "serviceName");
    let headless = docs.iter().find(|d| d["kind"] == "Service" && d["metadata"]["name"] == service).expect("the headless Service");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true, "peers must resolve before any pod is ready");
    let pdb = find(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"].as_u64(), Some(replicas / 2 + 1), "a voluntary disruption must keep a quorum");

    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let advertise_arg = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| str_at(a, "args"))
        .find_map(|a| a.strip_prefix("--advertise="))
        .expect("--advertise in the controller's args");
    let text = str_at(&find(&docs, "ConfigMap")["data"]["controller.toml"], "controller.toml");
    let pod_names = (0..replicas).map(|i| format!("{}-{i}", str_at(&set["metadata"]["name"], "name")));
    let mut bootstrapping = Vec::new();
    for (ordinal, pod) in pod_names.enumerate() {
        let mut cfg = controller_config(text);
        cfg.advertise = Some(advertise_arg.replace("$(POD_NAME)", &pod));
        let id = cfg.resolve_node_id().unwrap_or_else(|e| panic!("{pod}: {e}"));
        assert_eq!(id, ordinal as u64 + 1, "{pod}");
        if cfg.bootstraps(id) {
            bootstrapping.push(pod);
        }
    }
    assert_eq!(bootstrapping, ["gpuplane-controller-0"]);
    // Peers reach each pod's peer listener, through a port the headless Service and the
    // container publish.
    let cfg = controller_config(text);
    let peer_port = cfg.peer_listen.expect("peer_listen in controller.toml").port();
    for (id, m) in cfg.peer_map().unwrap() {
        let peer_addr = m.peer_addr.unwrap_or_else(|| panic!("peer {id} has no peer address"));
        assert!(peer_addr.ends_with(&format!(":{peer_port}")), "peer {id}: {peer_addr}");
    }
    let publishes = |ports: &Value, key: &str| ports.as_sequence().unwrap().iter().any(|p| p[key].as_u64() == Some(peer_port.into()));
    assert!(publishes(&headless["spec"]["ports"], "port"), "the headless Service does not publish port {peer_port}");
    assert!(publishes(&container["ports"], "containerPort"), "the container does not publish port {peer_port}");

    let mount = |name: &str| {
        container["volumeMounts"].as_sequence().unwrap().iter().find(|m| m["name"] == name).map(|m| str_at(&m["mountPath"], "mountPath"))
    };
    let data_dir = controller_config(text).data_dir.unwrap();
    assert!(data_dir.starts_with(mount("data").expect("the data volume mount")), "data_dir {data_dir:?} is not on the volume");
    let claim = &set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"];
    assert_eq!(claim, "data");
}

#[test]
fn the_agent_daemonset_config_parses_with_the_per_host_values() {
    let docs = documents("k8s/node-agent.yaml");
    let text = str_at(&find(&docs, "ConfigMap")["data"]["agent.toml"], "agent.toml");
    assert!(AgentConfig::parse(text).unwrap_err().reason.starts_with("`node`"), "the shared file names no node");
    let cfg = AgentConfig::parse_with(text, &HostOverrides { node: Some("gpu-host-1".into()), advertise: Some("10.0.0.5:7200".into()) })
        .unwrap_or_else(|e| panic!("agent.toml: {e}"));
    assert_eq!(cfg.gpu_backend, "nvidia-smi");
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["hostPID"], true, "MPS clients and the control daemon share a PID namespace");
    let env = pod["containers"][0]["env"].as_sequence().unwrap();
    for name in ["GPUPLANE_NODE", "GPUPLANE_ADVERTISE", "NVIDIA_VISIBLE_DEVICES"] {
        assert!(env.iter().any(|e| e["name"] == name), "{name} is not set");
    }
}

#[test]
fn the_compose_cluster_configs_parse_and_point_at_the_compose_services() {
    let compose: Value = serde_yaml_ng::from_str(&read("compose/compose.yaml")).unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let names: Vec<&str> = services.keys().map(|k| str_at(k, "service name")).collect();
    assert_eq!(names.iter().filter(|n| n.starts_with("controller-")).count(), 3);
    assert!(names.iter().filter(|n| n.starts_with("agent-")).count() >= 3);

    let cfg = controller_config(&read("compose/controller.toml"));
    let peers = cfg.peer_map().unwrap();
    let peer_port = cfg.peer_listen.expect("peer_listen in controller.toml").port();
    let mut bootstrapping = Vec::new();
    for (id, member) in &peers {
        let addr = &member.addr;
        let service = addr.split(':').next().unwrap();
        assert_eq!(member.peer_addr, Some(format!("{service}:{peer_port}")), "peer {id}");
        let command: Vec<&str> = services.get(service).unwrap_or_else(|| panic!("peer {id} = {addr:?}: no compose service {service:?}"))
            ["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| str_at(a, "command"))
            .collect();
        let flag = |name: &str| command.iter().position(|a| *a == name).map(|i| command[i + 1]);
        assert_eq!(flag("--node-id"), Some(id.to_string().as_str()), "{service}");
        assert_eq!(flag("--advertise"), Some(addr.as_str()), "{service}");
        if command.contains(&"--bootstrap") {
            bootstrapping.push(*id);
        }
    }
    assert_eq!(bootstrapping, [1]);

    for n in 1..=3 {
        let path = deploy(&format!("compose/agent-{n}.toml"));
        let agent = AgentConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(agent.advertise, format!("agent-{n}:7200"), "routers bind to the advertised host");
        assert!(agent.controllers.iter().all(|c| peers.values().any(|p| p.addr == *c)), "{}: {:?}", path.display(), agent.controllers);
    }
}
