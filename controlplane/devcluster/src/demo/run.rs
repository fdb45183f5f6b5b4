//! The demo's script: start the cluster and the fleet, apply the workload, drive load,
//! then show a leader failover, a service change, a host failure and autoscaling, and
//! report what was measured. Every wait has a deadline; a phase that does not happen in
//! time fails the demo with the reason.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::Load;
use super::scenario::{self, AUTOSCALED_SERVICE};
use super::show::{self, ServiceSlo};
use crate::local::{LocalCluster, LoopTimings};
use crate::Binaries;
use controlplane::client::Client;
use controlplane::provision::MigStrategy;

/// `gpuctl demo`'s options.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub strategy: MigStrategy,
    pub keep_running: bool,
    /// Where the cluster's data and logs go; default a new temporary directory.
    pub dir: Option<PathBuf>,
    /// Seconds of steady load before the leader is killed.
    pub steady_s: u64,
    pub report_json: Option<PathBuf>,
}

/// What the demo measured (printed, and written as JSON with `--report-json`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DemoReport {
    pub strategy: String,
    /// Seconds from applying the workload to every planned node running the plan with a
    /// router endpoint per service.
    pub initial_convergence_s: f64,
    /// $/h of the GPUs the plan uses, of the part of them it occupies (MIG GPCs, MPS
    /// shares), and of the whole fleet.
    pub plan_cost_per_hour: f64,
    pub occupied_cost_per_hour: f64,
    pub fleet_cost_per_hour: f64,
    pub steady: Vec<ServiceSlo>,
    /// Per tenant: what the first plan gives it and its services' steady windows.
    pub tenants: Vec<show::TenantRow>,
    pub leader_killed: u64,
    /// Seconds from the kill to a new leader answering.
    pub failover_s: f64,
    /// The windows around the failover (from 2 s before the kill to 10 s after).
    pub during_failover: Vec<ServiceSlo>,
    /// Seconds from updating a service's rate to every agent running the new plan.
    pub change_convergence_s: f64,
    pub node_killed: String,
    /// Seconds from the host failure until every service it ran is served from elsewhere.
    pub node_reserved_s: f64,
    pub provision_interval_s: f64,
    /// Instance type the autoscaler launched for the load step, and when it was serving.
    pub scale_out_instance_type: String,
    pub scale_out_s: f64,
    /// Seconds from dropping the load to the launched node being terminated.
    pub scale_in_s: f64,
    pub cooldown_s: f64,
}

/// Polls `check` every 200 ms until it yields a value or `limit` passes.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out after {} s waiting for {what}", limit.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn timings() -> LoopTimings {
    LoopTimings {
        provision_interval_s: 5.0,
        heartbeat_ms: 500,
        missed_heartbeats: 4,
        scale_window_s: 3.0,
        cooldown_s: 15.0,
        // A 120 s instance launch takes 6 s.
        launch_time_scale: 0.05,
    }
}

/// Reads the cluster: nodes, instance types, and the plan with its revision.
struct View {
    nodes: Vec<proto::Resource>,
    types: Vec<proto::Resource>,
    plan: Option<(controlplane::resources::PlanSpec, u64)>,
    /// The desired version of each node the plan names.
    desired: BTreeMap<String, u64>,
}

async fn view(client: &Client) -> Option<View> {
    let nodes = client.list("Node", "", true).await.ok()?.resources;
    let types = client.list("InstanceType", "", true).await.ok()?.resources;
    let plan = client.list("Plan", "", true).await.ok().and_then(|l| show::plan_of(&l.resources));
    let mut desired = BTreeMap::new();
    for g in plan.iter().flat_map(|(p, _)| p.gpus.iter()) {
        if !desired.contains_key(&g.node) {
            desired.insert(g.node.clone(), client.desired_version(&g.node).await.ok()?);
        }
    }
    Some(View { nodes, types, plan, desired })
}

impl View {
    /// Every node the plan names has applied its desired state, every service has a planned placement
    /// and an endpoint on a healthy node, and nothing runs on `excluded`.
    fn converged(&self, services: &[&str], excluded: Option<&str>, min_revision: u64) -> bool {
        let Some((plan, revision)) = &self.plan else { return false };
        if *revision < min_revision || plan.services.iter().any(|s| s.infeasible_reason.is_some()) {
            return false;
        }
        if excluded.is_some_and(|x| plan.gpus.iter().any(|g| g.node == x)) {
            return false;
        }
        let applied = |node: &str| {
            self.nodes.iter().find(|n| n.name == node).is_some_and(|n| {
                let status: serde_json::Value = serde_json::from_str(&n.status_json).unwrap_or_default();
                controlplane::resources::NodeStatus::applied_version(&status) >= self.desired.get(node).copied().unwrap_or(u64::MAX)
            })
        };
        if !plan.gpus.iter().all(|g| applied(&g.node)) {
            return false;
        }
        let endpoints = controlplane::agents::endpoints::service_endpoints(&self.nodes);
        services.iter().all(|s| endpoints.iter().any(|(svc, node, _)| svc == s && Some(node.as_str()) != excluded))
    }

    fn fleet_cost(&self) -> f64 {
        let prices: BTreeMap<String, f64> = self
            .types
            .iter()
            .filter_map(|t| {
                let v: serde_json::Value = serde_json::from_str(&t.spec_json).ok()?;
                Some((t.name.clone(), v["price_per_hour"].as_f64()?))
            })
            .collect();
        self.nodes
            .iter()
            .filter_map(|n| {
                let v: serde_json::Value = serde_json::from_str(&n.spec_json).ok()?;
                prices.get(v["instance_type"].as_str()?).copied()
            })
            .sum()
    }
}

async fn leader_of(client: &Client) -> Option<u64> {
    client.cluster_status().await.ok().map(|s| s.leader_id).filter(|&l| l != 0)
}

/// The share of all services' requests in `rows` answered within their SLO.
fn requests_met_pct(rows: &[show::ServiceSlo]) -> f64 {
    let (met, all) = rows.iter().fold((0, 0), |(m, a), r| (m + r.requests_met, a + r.requests));
    show::percent(met as f64, all as f64)
}

fn say(line: &str) {
    println!("\n== {line}");
}

/// Runs the demo; the cluster is stopped on return unless `keep_running`.
pub async fn run(opts: DemoOptions) -> Result<DemoReport, String> {
    let bins = Binaries::beside_current_exe("gpuctl demo")?;
    let (dir, temp) = match &opts.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new().prefix("gpuplane-demo-").tempdir().map_err(|e| format!("temporary directory: {e}"))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let t = timings();
    let mut cluster = LocalCluster::new(&dir, bins, opts.strategy, t.clone())?;
    // Interrupted (Ctrl-C reaches the controllers and agents too, not the workloads, which
    // run in process groups of their own), the demo still stops everything it started.
    let result = tokio::select! {
        result = script(&opts, &mut cluster, &t) => result,
        signal = interrupted() => Err(format!("interrupted by {signal}")),
    };
    if opts.keep_running && result.is_ok() {
        cluster.release_all();
        if let Some(t) = temp {
            // Keep the directory: the cluster's data and logs live there.
            let _ = t.keep();
        }
        println!("\nThe cluster keeps running (data and logs in {}). Try:", dir.display());
        println!("  gpuctl --insecure --server {} get plans -o yaml", cluster.servers().join(","));
        println!("  gpuctl --insecure --server {} get endpoints", cluster.servers().join(","));
        println!("Stop it with: pkill -f {}", dir.display());
    } else {
        cluster.shutdown();
        if result.is_err() {
            match temp {
                Some(_) => eprintln!("the demo's logs were in {} (removed on exit; pass --dir to keep them)", dir.display()),
                None => eprintln!("the demo's logs are in {}", dir.display()),
            }
        }
    }
    result
}

/// Resolves when this process receives SIGINT or SIGTERM; names it.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        return std::future::pending().await; // No handler: the default action stays.
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

async fn script(opts: &DemoOptions, cluster: &mut LocalCluster, t: &LoopTimings) -> Result<DemoReport, String> {
    let mut report = DemoReport {
        strategy: opts.strategy.flag_name().into(),
        provision_interval_s: t.provision_interval_s,
        cooldown_s: t.cooldown_s,
        ..Default::default()
    };
    let services = scenario::services();
    let names: Vec<&str> = services.iter().map(|s| s.name).collect();

    say("starting 3 controllers");
    for id in 1..=3 {
        cluster.start_controller(id)?;
    }
    let client = Client::new(cluster.servers());
    let leader = wait_for("a leader", Duration::from_secs(30), || leader_of(&client)).await?;
    println!("controllers at {}; leader: controller-{leader}", cluster.servers().join(", "));

    say("applying the sample multi-tenant workload (3 tenants, 6 services, 4 GPU models, 6 instance types)");
    let applied_at = Instant::now();
    for r in scenario::resources() {
        let what = format!("{} {}", r.kind, r.name);
        client.put(r, proto::WriteMode::Unspecified).await.map_err(|e| format!("apply {what}: {}", e.message()))?;
    }
    say("starting the fleet: node agents on simulated GPUs");
    for node in scenario::fleet() {
        println!("  {:<12} {:<8} {}", node.name, node.instance_type, node.gpus.join(", "));
        cluster.start_agent(&node)?;
    }
    let first = wait_for("the agents to run the first plan", Duration::from_secs(90), || async {
        let v = view(&client).await?;
        v.converged(&names, None, 0).then_some(v)
    })
    .await?;
    report.initial_convergence_s = applied_at.elapsed().as_secs_f64();
    let (plan, _) = first.plan.clone().expect("converged on a plan");
    report.plan_cost_per_hour = show::plan_cost(&plan, &first.nodes, &first.types);
    report.occupied_cost_per_hour = show::occupied_cost(&plan, &first.nodes, &first.types);
    report.fleet_cost_per_hour = first.fleet_cost();
    println!("converged {:.1} s after the apply; strategy {}", report.initial_convergence_s, plan.strategy);
    say("deployment map");
    print!("{}", show::deployment_map(&plan, &first.nodes, &first.types));
    println!(
        "plan cost {:.2} $/h in whole GPUs ({:.2} $/h occupied: MIG GPCs and MPS shares) of a {:.2} $/h fleet",
        report.plan_cost_per_hour, report.occupied_cost_per_hour, report.fleet_cost_per_hour
    );

    let slos: BTreeMap<String, (f64, f64)> = services.iter().map(|s| (s.name.to_string(), (s.slo_ms, s.rate_rps))).collect();
    let targets: Vec<(String, f64, f64)> = services.iter().map(|s| (s.name.to_string(), s.slo_ms, s.rate_rps)).collect();
    let load = Load::start(Client::new(cluster.servers()), &targets);
    say(&format!("driving load through the routers for {} s", opts.steady_s));
    tokio::time::sleep(Duration::from_secs(opts.steady_s + 4)).await;
    // The first two seconds warm up connections.
    let steady_from = 2.0;
    let steady_to = load.elapsed_s() - 3.0;
    report.steady = show::slo_report(&load.windows(), &slos, steady_from, steady_to);
    let tenant_of: BTreeMap<String, String> = services.iter().map(|s| (s.name.to_string(), s.tenant.to_string())).collect();
    // The usage the leader metered into each Tenant's status by now (every 10 s).
    let tenants = Client::new(cluster.servers())
        .list("Tenant", "", false)
        .await
        .map_err(|e| format!("listing the tenants: {}", e.message()))?
        .resources;
    report.tenants = show::tenant_report(&tenants, &report.steady, &tenant_of);
    print!("{}", show::format_slo_report(&report.steady));

    say("killing the leader (SIGKILL)");
    let leader = wait_for("a leader", Duration::from_secs(20), || leader_of(&client)).await?;
    let killed_at = Instant::now();
    let kill_s = load.elapsed_s();
    cluster.controllers.kill9(leader);
    report.leader_killed = leader;
    let survivors = Client::new(cluster.servers().into_iter().filter(|a| a != cluster.controllers.addr(leader)).collect());
    let new_leader =
        wait_for("a new leader", Duration::from_secs(30), || async { leader_of(&survivors).await.filter(|&l| l != leader) }).await?;
    report.failover_s = killed_at.elapsed().as_secs_f64();
    println!("controller-{leader} killed; controller-{new_leader} leads after {:.2} s; agents kept serving:", report.failover_s);
    tokio::time::sleep(Duration::from_secs(13)).await;
    report.during_failover = show::slo_report(&load.windows(), &slos, kill_s - 2.0, kill_s + 10.0);
    print!("{}", show::format_slo_report(&report.during_failover));
    cluster.start_controller(leader)?;
    println!("controller-{leader} restarted (it rejoins from its data directory)");

    say("changing a service: text-embed from 60 to 200 req/s");
    let mut svc = client.get("Service", "text-embed", false).await.map_err(|e| e.message().to_string())?;
    let mut spec: serde_json::Value = serde_json::from_str(&svc.spec_json).map_err(|e| e.to_string())?;
    spec["slo"]["request_rate"] = 200.0.into();
    svc.spec_json = spec.to_string();
    let changed_at = Instant::now();
    let put = client.put(svc, proto::WriteMode::Update).await.map_err(|e| e.message().to_string())?;
    let changed_rev = put.resource.map_or(0, |r| r.mod_revision);
    wait_for("the agents to run the re-provisioned plan", Duration::from_secs(60), || async {
        let v = view(&client).await?;
        let (plan, _) = v.plan.as_ref()?;
        let sized = plan.services.iter().any(|s| s.service == "text-embed" && s.capacity_rps >= 200.0);
        (sized && v.converged(&names, None, changed_rev)).then_some(())
    })
    .await?;
    report.change_convergence_s = changed_at.elapsed().as_secs_f64();
    load.set_rate("text-embed", 200.0);
    println!("re-provisioned and applied by every agent {:.2} s after the change", report.change_convergence_s);

    // The host failure: an A100 host that runs something (its services move to the spare).
    let v = view(&client).await.ok_or("cannot read the cluster")?;
    let (plan, _) = v.plan.clone().ok_or("no plan")?;
    let victim = ["a100-host-1", "a100-host-2"]
        .into_iter()
        .find(|n| plan.gpus.iter().any(|g| g.node == *n && !g.workloads.is_empty()))
        .ok_or("no A100 host runs anything")?;
    let affected: Vec<String> =
        plan.gpus.iter().filter(|g| g.node == victim).flat_map(|g| g.workloads.iter().map(|w| w.service.clone())).collect();
    say(&format!("host failure: killing {victim} (agent and inference servers), which runs {}", affected.join(", ")));
    let node_killed_at = Instant::now();
    cluster.kill_node(victim);
    report.node_killed = victim.to_string();
    wait_for("the failed host's services to be served elsewhere", Duration::from_secs(60), || async {
        view(&client).await.filter(|v| v.converged(&names, Some(victim), 0)).map(|_| ())
    })
    .await?;
    report.node_reserved_s = node_killed_at.elapsed().as_secs_f64();
    println!(
        "{victim} marked unhealthy and its services re-served elsewhere after {:.1} s (provisioning interval {} s)",
        report.node_reserved_s, t.provision_interval_s
    );

    let base_rate = load.rate(AUTOSCALED_SERVICE);
    let step = 360.0;
    say(&format!("load step: {AUTOSCALED_SERVICE} from {base_rate:.0} to {step:.0} req/s (autoscaling range 30-400)"));
    let nodes_before: Vec<String> = view(&client).await.ok_or("cannot read the cluster")?.nodes.iter().map(|n| n.name.clone()).collect();
    let step_at = Instant::now();
    load.set_rate(AUTOSCALED_SERVICE, step);
    let (launched, launched_type) = wait_for("a scale-out", Duration::from_secs(90), || async {
        let v = view(&client).await?;
        let n = v.nodes.iter().find(|n| !nodes_before.contains(&n.name))?;
        let spec: serde_json::Value = serde_json::from_str(&n.spec_json).ok()?;
        Some((n.name.clone(), spec["instance_type"].as_str()?.to_string()))
    })
    .await?;
    println!("the autoscaler launched {launched} ({launched_type}) {:.1} s after the step", step_at.elapsed().as_secs_f64());
    wait_for("the scaled-out plan to be served", Duration::from_secs(60), || async {
        view(&client)
            .await
            .filter(|v| {
                v.converged(&names, Some(victim), 0) && v.plan.as_ref().is_some_and(|(p, _)| p.gpus.iter().any(|g| g.node == launched))
            })
            .map(|_| ())
    })
    .await?;
    report.scale_out_instance_type = launched_type;
    report.scale_out_s = step_at.elapsed().as_secs_f64();
    println!("serving on {launched} {:.1} s after the step", report.scale_out_s);
    let v = view(&client).await.ok_or("cannot read the cluster")?;
    if let Some((plan, _)) = &v.plan {
        print!("{}", show::deployment_map(plan, &v.nodes, &v.types));
    }

    say(&format!("load drop: {AUTOSCALED_SERVICE} back to {base_rate:.0} req/s; scale-in after the {} s cool-down", t.cooldown_s));
    let drop_at = Instant::now();
    load.set_rate(AUTOSCALED_SERVICE, base_rate);
    wait_for("the scale-in", Duration::from_secs(120), || async {
        let v = view(&client).await?;
        (!v.nodes.iter().any(|n| n.name == launched)).then_some(())
    })
    .await?;
    report.scale_in_s = drop_at.elapsed().as_secs_f64();
    println!("{launched} terminated {:.1} s after the drop", report.scale_in_s);

    say(&format!("{victim} comes back"));
    if let Some(node) = scenario::fleet().into_iter().find(|n| n.name == victim) {
        cluster.start_agent(&node)?;
    }
    wait_for("the host to be healthy again", Duration::from_secs(30), || async {
        let v = view(&client).await?;
        let n = v.nodes.iter().find(|n| n.name == victim)?;
        let status: serde_json::Value = serde_json::from_str(&n.status_json).ok()?;
        controlplane::resources::NodeStatus::is_healthy(&status).then_some(())
    })
    .await?;
    println!("{victim} reports healthy again and is back in the fleet");
    load.stop();

    say("summary");
    println!("strategy                     {}", report.strategy);
    println!("initial convergence          {:.1} s", report.initial_convergence_s);
    println!(
        "plan cost                    {:.2} $/h in whole GPUs, {:.2} $/h occupied (fleet {:.2} $/h)",
        report.plan_cost_per_hour, report.occupied_cost_per_hour, report.fleet_cost_per_hour
    );
    let steady_met: usize = report.steady.iter().map(|s| s.windows_met).sum();
    let steady_all: usize = report.steady.iter().map(|s| s.windows).sum();
    println!("steady SLO windows met       {steady_met}/{steady_all}; requests within SLO {:.2}%", requests_met_pct(&report.steady));
    for t in &report.tenants {
        println!(
            "tenant {:<21} {:.2} GPUs, {:.2} $/h occupied; steady SLO windows met {}/{}",
            t.tenant, t.gpus, t.cost_per_hour, t.windows_met, t.windows
        );
    }
    let fo_met: usize = report.during_failover.iter().map(|s| s.windows_met).sum();
    let fo_all: usize = report.during_failover.iter().map(|s| s.windows).sum();
    println!(
        "leader failover              {:.2} s; SLO windows met around it {fo_met}/{fo_all}; requests within SLO {:.2}%",
        report.failover_s,
        requests_met_pct(&report.during_failover)
    );
    println!("service change to converged  {:.2} s", report.change_convergence_s);
    println!("host failure to re-served    {:.1} s", report.node_reserved_s);
    println!(
        "scale-out                    {} after {:.1} s; scale-in {:.1} s after the drop",
        report.scale_out_instance_type, report.scale_out_s, report.scale_in_s
    );
    if let Some(path) = &opts.report_json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report)
}
