//! The scenarios: `ci` (every fault kind once or twice, a few minutes) and `kills` (the
//! leader killed N times under continuous writes).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use controlplane::client::Client;
use controlplane::resources::NodeStatus;
use devcluster::Binaries;
use serde_json::json;

use super::cluster::Cluster;
use super::faults::{self, Corruption, FaultKind, Injection, StorageOutcome};
use super::floods::{self, Figures};
use super::hostile::{self, Attempt};
use super::net::Host;
use super::observe::{self, LeaderWatch};
use super::report::{Inputs, Report};
use super::workload::{self, Workload};
use crate::history::{check, History};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Every fault kind, bounded to a few minutes (what CI runs).
    Ci,
    /// The leader killed `--kills` times under continuous writes.
    Kills,
    /// A hostile tenant, operator and compromised node attack while clients write.
    Hostile,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub scenario: Scenario,
    pub kills: usize,
    /// Steady seconds between two faults.
    pub settle_s: f64,
    pub clients: usize,
    pub keys: usize,
    /// Where the logs and data dirs go (a temporary directory, removed after, when absent).
    pub dir: Option<PathBuf>,
}

const PATIENCE: Duration = Duration::from_secs(60);
/// Acme's service, which the agents serve and the hostile scenario attacks.
const VICTIM: &str = "chaos-web";
const VICTIM_SLO_MS: f64 = 80.0;
/// The controller that gets the small disk in the `ci` scenario.
const SMALL_DISK_NODE: u64 = 3;

fn resource(kind: &str, name: &str, tenant: &str, spec: serde_json::Value) -> proto::Resource {
    proto::Resource { kind: kind.into(), name: name.into(), tenant: tenant.into(), spec_json: spec.to_string(), ..Default::default() }
}

/// A fleet of A100 hosts and one service, from the demo's resources (its profiles come from
/// the same synthetic model the simulated GPUs run).
fn fleet_resources() -> Vec<proto::Resource> {
    let keep = |r: &proto::Resource| match r.kind.as_str() {
        "Tenant" => r.name == "acme",
        "GpuModel" => r.name == "A100-80GB",
        "ModelProfile" => r.name == "resnet50-a100-80gb" || r.name == "mobilenet-a100-80gb",
        _ => false,
    };
    let mut out: Vec<proto::Resource> = devcluster::demo::scenario::resources().into_iter().filter(keep).collect();
    out.push(resource(
        "InstanceType",
        "chaos-a100",
        "",
        json!({"gpu_model": "A100-80GB", "gpu_count": 1, "price_per_hour": 4, "launch_latency_s": 60}),
    ));
    out.push(service(VICTIM, "resnet50", VICTIM_SLO_MS, 100.0));
    out
}

fn service(name: &str, model: &str, slo_ms: f64, rate: f64) -> proto::Resource {
    resource("Service", name, "acme", json!({"model": model, "slo": {"latency_ms": slo_ms, "request_rate": rate}}))
}

/// Every agent reports healthy and runs the latest plan, which places `service`: each node
/// of the plan reports its own desired version applied (a node's version changes only when
/// its own assignment does).
async fn agents_converged(client: &Client, agents: &[String], service: &str) -> bool {
    let (Ok(nodes), Ok(plans)) = (client.list("Node", "", false).await, client.list("Plan", "", false).await) else { return false };
    let Some((plan, _)) = devcluster::demo::show::plan_of(&plans.resources) else { return false };
    if !plan.gpus.iter().any(|g| g.workloads.iter().any(|w| w.service == service)) {
        return false;
    }
    let status = |name: &str| {
        nodes
            .resources
            .iter()
            .find(|n| n.name == name)
            .map(|n| serde_json::from_str::<serde_json::Value>(&n.status_json).unwrap_or_default())
    };
    let healthy = agents.iter().all(|a| status(a).is_some_and(|s| NodeStatus::is_healthy(&s)));
    if !healthy {
        return false;
    }
    let nodes: std::collections::BTreeSet<&str> = plan.gpus.iter().map(|g| g.node.as_str()).collect();
    for node in nodes {
        let Ok(want) = client.desired_version(node).await else { return false };
        if status(node).is_none_or(|s| NodeStatus::applied_version(&s) < want) {
            return false;
        }
    }
    true
}

async fn wait_agents(client: &Client, agents: &[String], service: &str, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    while !agents_converged(client, agents, service).await {
        if started.elapsed() > within {
            return Err(format!("the agents did not converge on a plan with {service} within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(started.elapsed())
}

/// Waits until every running controller follows the leader and has applied what it committed.
async fn settle(cluster: &Cluster, client: &Client) -> Result<(), String> {
    let addrs = faults::addrs(cluster);
    for id in cluster.controllers.members.keys().copied().filter(|&i| cluster.running(i)) {
        observe::wait_caught_up(client, &addrs, id, PATIENCE).await?;
    }
    Ok(())
}

/// Waits for the first write acknowledged after `at` (the cluster serves again).
async fn wait_write_after(w: &Workload, at: Instant) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while !w.acks.lock().unwrap().iter().any(|a| a.invoked >= at) {
        if Instant::now() > deadline {
            return Err(format!("no write acknowledged within {PATIENCE:?} of a fault"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

struct Run {
    cluster: Cluster,
    client: Client,
    injections: Vec<Injection>,
    storage: Vec<StorageOutcome>,
    settle: Duration,
}

impl Run {
    async fn leader(&self) -> Result<u64, String> {
        observe::wait_leader(&self.client, &faults::addrs(&self.cluster), PATIENCE).await
    }

    async fn follower(&self, not: u64) -> Result<u64, String> {
        let leader = self.leader().await?;
        Ok(self.cluster.controllers.members.keys().copied().find(|&i| i != leader && i != not).expect("three controllers"))
    }

    async fn kill_leader(&mut self, w: &Workload) -> Result<(), String> {
        let leader = self.leader().await?;
        let at = Instant::now();
        self.cluster.kill9(leader);
        self.injections.push(Injection { kind: FaultKind::Kill9, node: leader, at });
        wait_write_after(w, at).await?;
        self.cluster.start_controller(leader, false)?;
        settle(&self.cluster, &self.client).await
    }

    async fn pause_leader(&mut self) -> Result<(), String> {
        let leader = self.leader().await?;
        self.injections.push(faults::pause(&self.cluster, leader, Duration::from_secs(3)).await?);
        settle(&self.cluster, &self.client).await
    }

    async fn partition(&mut self, kind: FaultKind) -> Result<(), String> {
        let leader = self.leader().await?;
        self.injections.push(faults::partition(&mut self.cluster, kind, leader, Duration::from_secs(4)).await?);
        settle(&self.cluster, &self.client).await
    }

    fn record(&mut self, (injection, outcome): (Injection, StorageOutcome)) {
        self.injections.push(injection);
        self.storage.push(outcome);
    }

    async fn pause_between(&self) {
        tokio::time::sleep(self.settle).await;
    }
}

/// Runs a scenario; the report says whether it passed.
pub async fn run(opts: &Options) -> Result<Report, String> {
    let bins = Binaries::beside_current_exe("chaos")?;
    let temp = tempfile::Builder::new().prefix("chaos-real-").tempdir().map_err(|e| format!("temporary dir: {e}"))?;
    let dir = opts.dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ci = opts.scenario == Scenario::Ci;
    let hostile = opts.scenario == Scenario::Hostile;
    let (agent_count, small_disk) = match opts.scenario {
        Scenario::Ci => (2, Some(SMALL_DISK_NODE)),
        Scenario::Hostile => (2, None),
        Scenario::Kills => (0, None),
    };
    let cluster = Cluster::start(&dir, bins, agent_count, small_disk)?;
    let client = cluster.client();
    let mut run = Run { cluster, client, injections: Vec::new(), storage: Vec::new(), settle: Duration::from_secs_f64(opts.settle_s) };
    run.leader().await?;
    for r in fleet_resources() {
        run.client.put(r, proto::WriteMode::Unspecified).await.map_err(|e| format!("seeding the cluster: {e}"))?;
    }
    let agents: Vec<String> = run.cluster.agents.iter().map(|a| a.name.clone()).collect();
    if ci || hostile {
        wait_agents(&run.client, &agents, VICTIM, PATIENCE).await?;
    }
    if hostile {
        hostile::prepare(&run.client).await?;
    }

    let history = History::new();
    let access = run.cluster.access();
    let watch = LeaderWatch::start(faults::addrs(&run.cluster), access.credentials.clone());
    let workload = Workload::start(&history, &access, opts.clients, opts.keys);
    let started = workload.started;
    let mut problems = Vec::new();
    let mut convergence = None;
    let mut attempts = Vec::new();
    let mut figures = None;
    let outcome = match opts.scenario {
        Scenario::Ci => ci_faults(&mut run, &workload, &agents).await,
        Scenario::Kills => kills(&mut run, &workload, opts.kills).await,
        Scenario::Hostile => hostile_attacks(&mut run, &agents).await.map(|(a, f, p)| {
            attempts = a;
            figures = f;
            problems.extend(p);
            None
        }),
    };
    match outcome {
        Ok(c) => convergence = c,
        Err(e) => problems.push(e),
    }
    let _ = run.cluster.net.heal();
    run.pause_between().await;
    let acks = workload.acks.clone();
    let counts = workload.stop().await;
    let ended = Instant::now();
    if let Err(e) = workload::final_reads(&history, &access, opts.keys, PATIENCE).await {
        problems.push(e);
    }
    let leader_changes = watch.finish().await;
    let verdict = check(&history);
    let acks = acks.lock().unwrap().clone();
    let report = Report::build(Inputs {
        scenario: match opts.scenario {
            Scenario::Ci => "ci",
            Scenario::Kills => "kills",
            Scenario::Hostile => "hostile",
        },
        started,
        ended,
        counts,
        verdict,
        acks: &acks,
        injections: &run.injections,
        leader_changes,
        agent_convergence: convergence,
        storage_faults: run.storage,
        hostile: attempts,
        floods: figures,
        problems,
    });
    if !report.passed() && opts.dir.is_none() {
        // Keep the logs of a failed run.
        let kept = temp.keep();
        eprintln!("chaos: logs and data dirs kept in {}", kept.display());
    }
    Ok(report)
}

async fn ci_faults(run: &mut Run, w: &Workload, agents: &[String]) -> Result<Option<Duration>, String> {
    run.pause_between().await;
    run.kill_leader(w).await?;
    run.pause_between().await;
    run.pause_leader().await?;
    run.pause_between().await;
    run.partition(FaultKind::LeaderIsolated).await?;
    run.pause_between().await;
    run.partition(FaultKind::OneWayPartition).await?;
    run.pause_between().await;
    run.partition(FaultKind::FollowerIsolated).await?;
    run.pause_between().await;
    let outcome = faults::full_disk(&mut run.cluster, SMALL_DISK_NODE, &run.client, PATIENCE).await?;
    run.record(outcome);
    settle(&run.cluster, &run.client).await?;
    run.pause_between().await;
    for how in [Corruption::Truncate, Corruption::FlipMiddle] {
        let victim = run.follower(SMALL_DISK_NODE).await?;
        let outcome = faults::corrupt(&mut run.cluster, victim, how, &run.client, PATIENCE).await?;
        run.record(outcome);
        settle(&run.cluster, &run.client).await?;
        run.pause_between().await;
    }
    // The agents lose every controller while a new service changes the plan; the time
    // from the heal to every agent running the new plan is the convergence time.
    let at = Instant::now();
    let controllers: Vec<u64> = run.cluster.controllers.members.keys().copied().collect();
    for a in run.cluster.agents.iter().map(|a| a.index).collect::<Vec<_>>() {
        for &c in &controllers {
            run.cluster.net.cut(Host::Agent(a), Host::Controller(c))?;
        }
    }
    run.client
        .put(service("chaos-thumbs", "mobilenet", 150.0, 40.0), proto::WriteMode::Unspecified)
        .await
        .map_err(|e| format!("adding a service: {e}"))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.cluster.net.heal()?;
    run.injections.push(Injection { kind: FaultKind::AgentsCutOff, node: 0, at });
    let converged = wait_agents(&run.client, agents, "chaos-thumbs", PATIENCE).await?;
    Ok(Some(converged))
}

/// The hostile scenario: attacks against the node that serves `chaos-web` (acme's service),
/// the tenant at its quota, the floods, then the checks of what must have survived them.
async fn hostile_attacks(run: &mut Run, agents: &[String]) -> Result<(Vec<Attempt>, Option<Figures>, Vec<String>), String> {
    run.pause_between().await;
    let plans = run.client.list("Plan", "", false).await.map_err(|e| format!("reading the plan: {e}"))?;
    let (plan, _) = devcluster::demo::show::plan_of(&plans.resources).ok_or("no plan before the attacks")?;
    let node = plan
        .gpus
        .iter()
        .find(|g| g.workloads.iter().any(|w| w.service == VICTIM))
        .map(|g| g.node.clone())
        .ok_or("chaos-web is not planned before the attacks")?;
    let index = run.cluster.agents.iter().find(|a| a.name == node).map(|a| a.index).ok_or(format!("{node} is no agent of the run"))?;
    let other = agents.iter().find(|a| **a != node).cloned().ok_or("the scenario needs two agents")?;
    let attempts = hostile::attack(&run.cluster, &run.client, index, &node, &other, VICTIM).await?;

    // The tenant at its quota of the hardest services it may create, the leader watched.
    let leader = run.leader().await?;
    let pid = run.cluster.pid(leader).ok_or("the leader has no process")?;
    let at_quota = hostile::fill_quota(&run.cluster, &run.client).await?;
    let mut leader_load = floods::watch_leader(pid, run.cluster.metrics_addr(leader), Duration::from_secs(20)).await;
    if let Some((plan, _)) = run.client.list("Plan", "", false).await.ok().and_then(|l| devcluster::demo::show::plan_of(&l.resources)) {
        leader_load.outcomes = plan
            .services
            .iter()
            .filter(|p| at_quota.contains(&p.service))
            .map(|p| (p.service.clone(), p.infeasible_reason.clone().unwrap_or_default()))
            .collect();
    }
    let hosts: Vec<String> = run.cluster.agents.iter().map(|a| run.cluster.net.ip(Host::Agent(a.index)).to_string()).collect();
    let mut problems = hostile::check_aftermath(&run.cluster, &run.client, VICTIM, &hosts, PATIENCE).await;

    // Unread watches and a connection flood on a follower.
    let follower = run.follower(leader).await?;
    let follower_addr = run.cluster.api_addr(follower);
    let follower_pid = run.cluster.pid(follower).ok_or("the follower has no process")?;
    let mallory = run.client.get("Service", "mallory-2", false).await.map_err(|e| format!("reading mallory-2: {e}"))?;
    let mallory = resource("Service", &mallory.name, &mallory.tenant, serde_json::from_str(&mallory.spec_json).unwrap_or_default());
    let watcher = run.cluster.tenant_client_at(&follower_addr.to_string())?;
    let watches = floods::unread_watches(&watcher, &run.cluster.tenant_client()?, follower_pid, mallory, 120).await;
    let flood_host = run.cluster.net.namespace(Host::Agent(index)).ok_or("an agent's namespace")?;
    let admin = run.cluster.client();
    let target = follower_addr.to_string();
    let probe = || async move { tokio::time::timeout(Duration::from_secs(5), admin.node_status(&target)).await.is_ok_and(|r| r.is_ok()) };
    let connections = floods::connection_flood(&flood_host, follower_addr, 3 * floods::CONNECTIONS_PER_IP, probe).await?;

    // The victim's own callers, and an anonymous and a greedy flood at its endpoint.
    let (victim_token, greedy_token) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
    let endpoint = list_callers(&run.client, VICTIM, &[&victim_token, &greedy_token]).await?;
    let data_plane = floods::data_plane_flood(floods::DataPlaneAttack {
        endpoint: &endpoint,
        service: VICTIM,
        slo_ms: VICTIM_SLO_MS,
        victim_token: &victim_token,
        rate: 20.0,
        greedy_token: &greedy_token,
        callers: 32,
        during: Duration::from_secs(15),
    })
    .await?;
    let figures = Figures { leader: leader_load, watches, connections, data_plane };
    problems.extend(floods::check(&figures.watches, &figures.connections, &figures.data_plane, &figures.leader));
    run.pause_between().await;
    Ok((attempts, Some(figures), problems))
}

/// Lists `tokens` as the callers of acme's `service` and waits until its router refuses an
/// anonymous request (the agents have the new callers); the endpoint it serves at.
async fn list_callers(admin: &Client, service: &str, tokens: &[&str]) -> Result<String, String> {
    let current = admin.get("Service", service, false).await.map_err(|e| format!("reading {service}: {e}"))?;
    let mut spec: serde_json::Value = serde_json::from_str(&current.spec_json).map_err(|e| format!("{service}'s spec: {e}"))?;
    spec["inference_tokens"] = tokens.iter().map(|t| controlplane::security::hash_token(t)).collect();
    admin
        .put(resource("Service", service, &current.tenant, spec), proto::WriteMode::Unspecified)
        .await
        .map_err(|e| format!("listing {service}'s callers: {e}"))?;
    let started = Instant::now();
    loop {
        let nodes = admin.list("Node", "", false).await.map_err(|e| format!("listing nodes: {e}"))?;
        let endpoint = controlplane::agents::endpoints::service_endpoints(&nodes.resources)
            .into_iter()
            .find(|(s, _, _)| s == service)
            .map(|(_, _, addr)| addr);
        if let Some(endpoint) = endpoint {
            if let Ok(channel) = tonic::transport::Channel::from_shared(format!("http://{endpoint}")).map_err(|e| e.to_string()) {
                if let Ok(channel) = channel.connect().await {
                    let request = proto::open_inference::fp32_request(service, "1", 1, 1, 1.0);
                    let got =
                        proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient::new(channel).model_infer(request).await;
                    if got.is_err_and(|e| e.code() == tonic::Code::Unauthenticated) {
                        return Ok(endpoint);
                    }
                }
            }
        }
        if started.elapsed() > PATIENCE {
            return Err(format!("{service}'s router did not refuse anonymous callers within {PATIENCE:?} of listing its callers"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn kills(run: &mut Run, w: &Workload, kills: usize) -> Result<Option<Duration>, String> {
    run.pause_between().await;
    for k in 0..kills {
        run.kill_leader(w).await.map_err(|e| format!("kill {}: {e}", k + 1))?;
        run.pause_between().await;
    }
    Ok(None)
}
