//! gpuctl: the command-line client of gpuplane.

use std::io::Read;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use controlplane::client::Client;
use controlplane::manifest::{self, Format};
use controlplane::provision::offline::{plan_offline_bounded, state_from_resources};
use controlplane::provision::MigStrategy;
use controlplane::resources::Kind;

/// Why a command did not finish: an error to print, or the reader of its output went away
/// (`gpuctl get services | head -1`), when it stops quietly and exits 0, as `head`'s writer
/// expects. `println!` panicked there ("failed printing to stdout: Broken pipe").
#[derive(Debug)]
enum Failure {
    Error(String),
    OutputClosed,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Error(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure::Error(message.to_string())
    }
}

/// Writes to stdout; a closed pipe is [`Failure::OutputClosed`].
fn write_out(args: std::fmt::Arguments) -> Result<(), Failure> {
    use std::io::Write;
    std::io::stdout().lock().write_fmt(args).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => Failure::OutputClosed,
        _ => Failure::Error(format!("writing the output: {e}")),
    })
}

/// `print!` that returns [`Failure`] from the function instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        write_out(format_args!($($arg)*))?
    };
}

/// `println!` that returns [`Failure`] from the function instead of panicking.
macro_rules! outln {
    () => {
        write_out(format_args!("\n"))?
    };
    ($($arg:tt)*) => {
        write_out(format_args!("{}\n", format_args!($($arg)*)))?
    };
}

#[derive(Parser, Debug)]
#[command(name = "gpuctl", version, about = "Command-line client of the gpuplane controllers")]
struct Args {
    /// Controller address (repeat, or comma-separate, for several); leader hints are followed.
    #[arg(long = "server", short = 's', env = "GPUPLANE_SERVER", value_delimiter = ',', default_value = "127.0.0.1:7401")]
    servers: Vec<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// The cluster CA (PEM) to verify controllers with.
    #[arg(long, env = "GPUPLANE_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM), e.g. an admin's from `gpuctl certs`.
    #[arg(long, env = "GPUPLANE_CERT", global = true)]
    cert: Option<std::path::PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, env = "GPUPLANE_KEY", global = true)]
    key: Option<std::path::PathBuf>,
    /// Bearer token of a tenant or admin.
    #[arg(long, env = "GPUPLANE_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Plaintext, for controllers started with --insecure (development only).
    #[arg(long, env = "GPUPLANE_INSECURE", global = true)]
    insecure: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or update the resources of manifest files (YAML, JSON or TOML; `-` = stdin).
    Apply {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
    },
    /// List resources of a kind, or show one.
    Get {
        kind: String,
        name: Option<String>,
        /// Only this tenant's resources.
        #[arg(long)]
        tenant: Option<String>,
        /// Read from the contacted node without a read-index round (may be stale).
        #[arg(long)]
        stale: bool,
        /// Page size: list in requests of at most N resources each (0 = the server's default
        /// of 500; at most 1000). All pages are read and shown.
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// Show one resource in full, spec and status.
    Describe { kind: String, name: String },
    /// Delete a resource.
    Delete {
        kind: String,
        name: String,
        /// Only if the resource is at this version.
        #[arg(long, default_value_t = 0)]
        version: u64,
    },
    /// Run a provisioning strategy offline on manifest files (no cluster): the plan per GPU,
    /// each service's predicted capacity and latency, and the cost per hour.
    Plan {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
        #[arg(long, value_enum, default_value_t = MigStrategy::Parvagpu)]
        strategy: MigStrategy,
    },
    /// A local cluster on simulated GPUs, end to end: 3 controllers, a heterogeneous fleet
    /// (A100 and H100 with MIG, V100 and T4 with MPS), a multi-tenant workload under load,
    /// the deployment map and SLO report, a leader kill, a service change, a host failure,
    /// and autoscaling. Needs the controlplane, node-agent and sim-infer binaries next to
    /// gpuctl (`cargo build --release`).
    Demo {
        /// Strategy for the MIG GPUs.
        #[arg(long, value_enum, default_value_t = MigStrategy::Parvagpu)]
        strategy: MigStrategy,
        /// Leave the cluster running at the end (for gpuctl; the directory is kept).
        #[arg(long)]
        keep_running: bool,
        /// Directory for the cluster's data and logs (default: a new temporary directory).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Seconds of steady load before the leader is killed.
        #[arg(long, default_value_t = 20)]
        steady_seconds: u64,
        /// Also write the measured figures as JSON to this file.
        #[arg(long)]
        report_json: Option<std::path::PathBuf>,
        /// Print the demo's workload as a manifest (for `gpuctl plan -f`) and exit.
        #[arg(long)]
        print_manifest: bool,
    },
    /// Write a development CA and certificates (with their keys, mode 0600) for
    /// controllers, node agents and admins into a directory.
    Certs {
        #[arg(long)]
        out: std::path::PathBuf,
        /// Controller node ids.
        #[arg(long, value_delimiter = ',')]
        controllers: Vec<u64>,
        /// Node names (one certificate per node agent).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Admin names.
        #[arg(long, value_delimiter = ',')]
        admin: Vec<String>,
        /// DNS names and IP addresses the controllers are dialled at.
        #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1")]
        hosts: Vec<String>,
        /// Replace an existing CA and its certificates.
        #[arg(long)]
        force: bool,
    },
    /// Make a random bearer token for a tenant or an admin: prints the token (give it to
    /// them) and the line for the controllers' tokens file (only its SHA-256).
    Token {
        /// `tenant:NAME` or `admin:NAME`.
        principal: String,
    },
    /// Cluster membership and Raft state.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Members, leader, term, commit and applied index (as each reachable member sees it).
    Status,
    /// Add a controller: as learner, then promoted to voter once caught up (within 30 s;
    /// else it stays a learner). Refused: node id 0, an id that is a member at another
    /// address, an address another member uses, and an address that does not answer (3 s)
    /// or answers as another node id. Adding a member again at its address only promotes it.
    Add {
        /// The new controller's node id (>= 1), as it was started with.
        node_id: u64,
        /// host:port the new controller serves on; it must answer before it is added.
        address: String,
        /// host:port of its peer listener (its `--peer-listen`), where the other
        /// controllers send it Raft's RPCs; without it they use `address`.
        #[arg(long)]
        peer_address: Option<String>,
        /// Keep it a non-voting learner.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a controller from the cluster.
    Remove { node_id: u64 },
    /// Move leadership to another voter (any up-to-date one if no id is given).
    Transfer { node_id: Option<u64> },
    /// Snapshot one controller's state now and purge its log up to the snapshot (the
    /// snapshot policy does this by itself; this shrinks a log at once). Members added
    /// afterwards catch up from the snapshot.
    Compact {
        /// host:port of the controller to compact (default: the first --server).
        address: Option<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // With OTEL_EXPORTER_OTLP_ENDPOINT set, the command is the root span of its trace and
    // the controllers continue it (W3C trace context in the request metadata).
    let endpoint = controlplane::telemetry::tracing::otlp_endpoint(None);
    let _tracing = match endpoint.as_deref().map(|e| controlplane::telemetry::tracing::init("gpuctl", "warn", Some(e))) {
        Some(Err(e)) => {
            report_error(&e.to_string());
            return ExitCode::FAILURE;
        }
        guard => guard,
    };
    let span = tracing::info_span!("gpuctl");
    match tracing::Instrument::instrument(run(args), span).await {
        Ok(()) | Err(Failure::OutputClosed) => ExitCode::SUCCESS,
        Err(Failure::Error(message)) => {
            report_error(&message);
            ExitCode::FAILURE
        }
    }
}

/// `error: ...` on stderr (not `eprintln!`, which panics when stderr is a closed pipe too).
fn report_error(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "error: {message}");
}

/// One line: the gRPC code, the message, and the field when the server named one.
fn describe_status(s: tonic::Status) -> String {
    let code = format!("{:?}", s.code());
    match s.code() {
        tonic::Code::Unavailable if s.message().contains("transport") || s.message().contains("connect") => {
            format!("{code}: no controller reachable ({})", s.message())
        }
        _ => format!("{code}: {}", s.message()),
    }
}

fn parse_kind(kind: &str) -> Result<Kind, String> {
    kind.parse()
}

async fn run(args: Args) -> Result<(), Failure> {
    let servers: Vec<String> = args.servers.iter().filter(|s| !s.is_empty()).cloned().collect();
    // Only commands that talk to a controller need one (`plan` runs offline).
    let connect = || {
        if servers.is_empty() {
            return Err("--server: at least one controller address is required".to_string());
        }
        if args.insecure {
            return Ok(Client::new(servers.clone()));
        }
        let ca = args.ca.as_deref().ok_or(
            "--ca (or GPUPLANE_CA) is not set: give the cluster CA (with --cert/--key or --token), or --insecure for a development cluster",
        )?;
        let tls = controlplane::security::TlsMaterial::load(ca, args.cert.as_deref(), args.key.as_deref()).map_err(|e| format!("{e:#}"))?;
        let credentials = controlplane::security::ClientCredentials { tls: Some(tls), token: args.token.clone() };
        Client::with_credentials(servers.clone(), credentials)
    };
    match args.command {
        Command::Certs { out, controllers, nodes, admin, hosts, force } => {
            let plan = controlplane::security::certs::CertPlan { controllers, nodes, admins: admin, hosts, force };
            let written = controlplane::security::certs::generate(&out, &plan).map_err(|e| format!("{e:#}"))?;
            for path in written {
                outln!("{}", path.display());
            }
            Ok(())
        }
        Command::Token { principal } => {
            let (role, name) = match controlplane::security::Principal::from_meta(&principal) {
                Some(controlplane::security::Principal::Tenant(n)) => ("tenants", n),
                Some(controlplane::security::Principal::Admin(n)) => ("admins", n),
                _ => return Err(format!("principal: expected tenant:NAME or admin:NAME, got {principal:?}").into()),
            };
            let bytes: [u8; 32] = rand::random();
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            outln!("token: {token}");
            outln!("tokens file, under [{role}]: {name} = \"{}\"", controlplane::security::hash_token(&token));
            Ok(())
        }
        Command::Apply { files } => {
            let client = connect()?;
            // Every file is parsed and checked before anything is sent.
            let all = read_manifests(&files)?;
            // In batches (each one Raft entry, applied whole or not at all), so a manifest of
            // thousands of Services costs a few writes and one provisioning pass. A reader of
            // the output that goes away does not stop the batches after it.
            let mut closed = false;
            for batch in controlplane::client::batches(all) {
                let (written, deduplicated) = client.put_batch(&batch).await.map_err(|refused| {
                    let which = refused.which.map(|i| format!("{} {:?}: ", batch[i].kind, batch[i].name)).unwrap_or_default();
                    let rest =
                        if batch.len() > 1 { format!(" (nothing of this batch of {} was applied)", batch.len()) } else { String::new() };
                    format!("{which}{}{rest}", describe_status(refused.status))
                })?;
                for w in written {
                    let verb = if deduplicated {
                        "unchanged"
                    } else if w.created {
                        "created"
                    } else {
                        "configured"
                    };
                    if !closed {
                        match write_out(format_args!("{}/{} {verb} (version {})\n", w.kind, w.name, w.resource_version)) {
                            Err(Failure::OutputClosed) => closed = true,
                            written => written?,
                        }
                    }
                }
            }
            Ok(())
        }
        Command::Get { kind, name, stale, limit, .. } if kind == "endpoints" || kind == "endpoint" => {
            let client = connect()?;
            let nodes = client.list_in_pages("Node", "", stale, limit).await.map_err(describe_status)?.resources;
            print_endpoints(&nodes, name.as_deref(), args.output)
        }
        Command::Get { kind, name, .. } if kind == "desired" => {
            let node = name.ok_or("get desired NODE: name the node")?;
            let desired = connect()?.watch_desired(&node, 0, 0).await.map_err(describe_status)?.message().await.map_err(describe_status)?;
            print_desired(&desired.ok_or("the controller closed the watch before sending the node's state")?, args.output)
        }
        Command::Get { kind, name, tenant, stale, limit } => {
            let client = connect()?;
            let kind = parse_kind(&kind)?;
            let resources = match name {
                Some(name) => vec![client.get(kind.as_str(), &name, stale).await.map_err(describe_status)?],
                None => {
                    client
                        .list_in_pages(kind.as_str(), tenant.as_deref().unwrap_or(""), stale, limit)
                        .await
                        .map_err(describe_status)?
                        .resources
                }
            };
            print_resources(kind, &resources, args.output)
        }
        Command::Describe { kind, name } => {
            let client = connect()?;
            let kind = parse_kind(&kind)?;
            let r = client.get(kind.as_str(), &name, false).await.map_err(describe_status)?;
            let output = if args.output == Output::Table { Output::Yaml } else { args.output };
            print_resources(kind, &[r], output)
        }
        Command::Delete { kind, name, version } => {
            let client = connect()?;
            let kind = parse_kind(&kind)?;
            client.delete(kind.as_str(), &name, version).await.map_err(describe_status)?;
            outln!("{kind}/{name} deleted");
            Ok(())
        }
        Command::Demo { strategy, keep_running, dir, steady_seconds, report_json, print_manifest } => {
            if print_manifest {
                out!("{}", devcluster::demo::scenario::manifest_yaml());
                return Ok(());
            }
            let opts = devcluster::demo::run::DemoOptions { strategy, keep_running, dir, steady_s: steady_seconds, report_json };
            devcluster::demo::run::run(opts).await.map(|_| ()).map_err(Failure::from)
        }
        Command::Plan { files, strategy } => {
            let state = state_from_resources(&read_manifests(&files)?)?;
            let (plan, input) = plan_offline_bounded(&state, strategy)?;
            print_plan(&plan, &input, args.output)
        }
        Command::Cluster { command } => cluster(&connect()?, &servers, command, args.output).await,
    }
}

/// Per service, the router endpoints of the healthy nodes that serve it (from the Nodes'
/// reported status).
fn print_endpoints(nodes: &[proto::Resource], service: Option<&str>, output: Output) -> Result<(), Failure> {
    let rows: Vec<(String, String, String)> =
        controlplane::agents::endpoints::service_endpoints(nodes).into_iter().filter(|(s, _, _)| service.is_none_or(|x| x == s)).collect();
    if output != Output::Table {
        let value: Vec<serde_json::Value> =
            rows.iter().map(|(s, n, a)| serde_json::json!({"service": s, "node": n, "endpoint": a})).collect();
        return print_structured(&serde_json::Value::from(value), output);
    }
    outln!("{:<24} {:<16} ENDPOINT", "SERVICE", "NODE");
    for (s, n, a) in rows {
        outln!("{s:<24} {n:<16} {a}");
    }
    Ok(())
}

/// One node's share of the plan, as its agent receives it (readable at any fleet size, where
/// the whole Plan is one large resource).
fn print_desired(d: &proto::DesiredState, output: Output) -> Result<(), Failure> {
    let gpus: Vec<serde_json::Value> = d
        .gpus
        .iter()
        .map(|g| {
            let layout: Vec<String> = g.mig_layout.iter().map(|m| format!("{}@{}", m.profile, m.start)).collect();
            let workloads: Vec<serde_json::Value> = g
                .workloads
                .iter()
                .map(|w| {
                    serde_json::json!({"service": w.service, "model": w.model, "mig_instance": w.mig_instance, "mps_percent": w.mps_percent,
                                       "batch": w.batch, "processes": w.processes, "shadow_mps_percent": w.shadow_mps_percent, "slo_ms": w.slo_ms})
                })
                .collect();
            serde_json::json!({"gpu_uuid": g.gpu_uuid, "mig_layout": layout, "workloads": workloads})
        })
        .collect();
    if output != Output::Table {
        return print_structured(&serde_json::json!({"node": d.node, "version": d.version, "gpus": gpus}), output);
    }
    outln!("node {} desired version {}", d.node, d.version);
    outln!("{:<28} {:<22} WORKLOADS", "GPU", "MIG LAYOUT");
    for g in &d.gpus {
        let layout: Vec<String> = g.mig_layout.iter().map(|m| format!("{}@{}", m.profile, m.start)).collect();
        let workloads: Vec<String> = g.workloads.iter().map(|w| format!("{}(batch {}, {}%)", w.service, w.batch, w.mps_percent)).collect();
        outln!("{:<28} {:<22} {}", g.gpu_uuid, layout.join(","), workloads.join(" "));
    }
    Ok(())
}

/// The resources of manifest files (`-` = stdin), all parsed before any is used. Each is
/// read up to one byte past `manifest::MAX_MANIFEST_BYTES` (which `manifest::parse` then
/// refuses), never to its end.
fn read_manifests(files: &[String]) -> Result<Vec<proto::Resource>, String> {
    let mut all = Vec::new();
    for file in files {
        let read = |from: &mut dyn Read, name: &str| {
            let mut bytes = Vec::new();
            from.take(manifest::MAX_MANIFEST_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| format!("{name}: {e}"))?;
            String::from_utf8(bytes).map_err(|e| format!("{name}: not UTF-8 text: {}", e.utf8_error()))
        };
        let (name, text) = if file == "-" {
            ("stdin".to_string(), read(&mut std::io::stdin().lock(), "stdin")?)
        } else {
            let mut f = std::fs::File::open(file).map_err(|e| format!("{file}: {e}"))?;
            (file.clone(), read(&mut f, file)?)
        };
        all.extend(manifest::parse(&name, &text, Format::from_path(&name)).map_err(|e| e.to_string())?);
    }
    Ok(all)
}

fn print_plan(plan: &planner::plan::Plan, input: &planner::input::PlanningInput, output: Output) -> Result<(), Failure> {
    use planner::plan::Sharing;
    let cost = plan.cost_per_hour(&input.gpu_types);
    if output != Output::Table {
        let value = serde_json::json!({"plan": plan, "cost_per_hour": cost});
        return print_structured(&value, output);
    }
    outln!("{:<6} {:<12} {:<28} WORKLOADS", "GPU", "TYPE", "MIG LAYOUT");
    for g in &plan.gpus {
        let layout = match &g.sharing {
            Sharing::Mig { instances } => instances.iter().map(|i| format!("{}@{}", i.profile, i.start)).collect::<Vec<_>>().join(" "),
            Sharing::MpsOnly => "(whole GPU, MPS)".into(),
        };
        let workloads: Vec<String> = g
            .workloads
            .iter()
            .map(|w| {
                let at = w.mig_instance.map(|i| format!("[{i}]")).unwrap_or_default();
                format!("{}{at} {}%x{} b{}", w.service, w.mps_percent.round(), w.processes, w.batch_size)
            })
            .collect();
        outln!("{:<6} {:<12} {:<28} {}", g.slot, g.gpu_type, layout, workloads.join(", "));
    }
    outln!();
    outln!("{:<20} {:>10} {:>12} {:>10} {:>12}", "SERVICE", "RATE", "CAPACITY", "SLO MS", "LATENCY MS");
    for p in &plan.predictions {
        outln!("{:<20} {:>10.1} {:>12.1} {:>10.1} {:>12.2}", p.service, p.request_rate, p.capacity_rps, p.slo_ms, p.latency_ms);
    }
    for i in &plan.infeasible {
        outln!("{:<20} infeasible: {}", i.service, i.reason);
    }
    outln!();
    outln!("strategy {}: {} GPUs, {} GPCs, {cost:.2} per hour", plan.strategy, plan.gpus_used(), plan.gpcs_used());
    Ok(())
}

fn to_document(r: &proto::Resource) -> serde_json::Value {
    let spec: serde_json::Value = serde_json::from_str(&r.spec_json).unwrap_or(serde_json::Value::Null);
    let status: serde_json::Value =
        if r.status_json.is_empty() { serde_json::Value::Null } else { serde_json::from_str(&r.status_json).unwrap_or_default() };
    let mut doc = serde_json::json!({
        "kind": r.kind,
        "name": r.name,
        "resource_version": r.resource_version,
        "create_revision": r.create_revision,
        "mod_revision": r.mod_revision,
        "spec": spec,
    });
    if !r.tenant.is_empty() {
        doc["tenant"] = r.tenant.clone().into();
    }
    if !status.is_null() {
        doc["status"] = status;
    }
    doc
}

fn print_structured(value: &serde_json::Value, output: Output) -> Result<(), Failure> {
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(value).map_err(|e| e.to_string())?),
        _ => out!("{}", serde_yaml_ng::to_string(value).map_err(|e| e.to_string())?),
    }
    Ok(())
}

fn print_resources(kind: Kind, resources: &[proto::Resource], output: Output) -> Result<(), Failure> {
    if output != Output::Table {
        let docs: Vec<_> = resources.iter().map(to_document).collect();
        let value = if docs.len() == 1 { docs[0].clone() } else { serde_json::Value::Array(docs) };
        return print_structured(&value, output);
    }
    let mut rows = vec![vec!["NAME".to_string(), "TENANT".into(), "VERSION".into(), "SUMMARY".into()]];
    for r in resources {
        let spec: serde_json::Value = serde_json::from_str(&r.spec_json).unwrap_or_default();
        let status: serde_json::Value = serde_json::from_str(&r.status_json).unwrap_or_default();
        rows.push(vec![
            r.name.clone(),
            if r.tenant.is_empty() { "-".into() } else { r.tenant.clone() },
            r.resource_version.to_string(),
            summary(kind, &spec, &status),
        ]);
    }
    print_table(&rows)?;
    Ok(())
}

/// The few fields worth a glance, per kind.
fn summary(kind: Kind, spec: &serde_json::Value, status: &serde_json::Value) -> String {
    let f = |path: &str| {
        spec.pointer(path).filter(|v| !v.is_null()).map(|v| v.to_string().trim_matches('"').to_string()).unwrap_or_else(|| "-".into())
    };
    match kind {
        // Usage against quota, as the leader last metered it into the status.
        Kind::Tenant => {
            let usage: controlplane::resources::TenantStatus = serde_json::from_value(status.clone()).unwrap_or_default();
            let attainment = match usage.slo.windows {
                0 => "-".to_string(),
                n => format!("{}/{n} ({:.1}%)", usage.slo.met, 100.0 * usage.slo.met as f64 / n as f64),
            };
            format!(
                "weight={} isolation={} gpus={:.2}/{} cost/h={:.2}/{} services={} slo_met={attainment}",
                f("/weight"),
                spec.get("isolation").and_then(|i| i.as_str()).unwrap_or("mig"),
                usage.gpus,
                f("/max_gpus"),
                usage.cost_per_hour,
                f("/max_cost_per_hour"),
                usage.services_planned,
            )
        }
        Kind::GpuModel => format!(
            "sm={} mem={}GiB mig={}",
            f("/sm_count"),
            f("/memory_gib"),
            if spec.get("mig").is_some_and(|m| !m.is_null()) { "yes" } else { "no" }
        ),
        Kind::InstanceType => {
            let limit = spec.get("max_instances").filter(|m| !m.is_null()).map_or(String::new(), |m| format!(" max={m}"));
            format!("{}x{} ${}/h launch={}s{limit}", f("/gpu_count"), f("/gpu_model"), f("/price_per_hour"), f("/launch_latency_s"))
        }
        Kind::ModelProfile => {
            format!("{} on {} ({} points)", f("/model"), f("/gpu_model"), spec.get("points").and_then(|p| p.as_array()).map_or(0, Vec::len))
        }
        Kind::Service => {
            let rate = match spec.pointer("/slo/request_rate") {
                Some(r) if !r.is_null() => format!("{r} req/s"),
                _ => format!("autoscale {}-{} req/s", f("/slo/autoscaling/min_rps"), f("/slo/autoscaling/max_rps")),
            };
            let priority = match spec.get("priority").and_then(|p| p.as_u64()) {
                Some(p) if p > 0 => format!(" priority={p}"),
                _ => String::new(),
            };
            let runtime = spec.get("runtime").and_then(|r| r.as_str()).map_or(String::new(), |r| format!(" runtime={r}"));
            format!("{} p{}<{}ms {}{priority}{runtime}", f("/model"), f("/slo/percentile"), f("/slo/latency_ms"), rate)
        }
        Kind::Node => {
            format!("{} {} gpus={}", f("/address"), f("/instance_type"), spec.get("gpus").and_then(|g| g.as_array()).map_or(0, Vec::len))
        }
        Kind::Plan => format!("strategy={} gpus={}", f("/strategy"), spec.get("gpus").and_then(|g| g.as_array()).map_or(0, Vec::len)),
        Kind::ServingRuntime => {
            let protocol = spec.get("protocol").and_then(|p| p.as_str()).unwrap_or("open-inference-grpc");
            format!("{} {protocol} cold-start={}s", f("/program"), f("/cold_start_s"))
        }
    }
}

fn print_table(rows: &[Vec<String>]) -> Result<(), Failure> {
    let widths: Vec<usize> = (0..rows[0].len()).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        outln!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

async fn cluster(client: &Client, servers: &[String], command: ClusterCommand, output: Output) -> Result<(), Failure> {
    let status = match command {
        ClusterCommand::Status => {
            let mut views = Vec::new();
            let mut addrs: Vec<String> = servers.to_vec();
            match client.cluster_status().await {
                Ok(s) => {
                    for m in &s.members {
                        if !addrs.contains(&m.address) {
                            addrs.push(m.address.clone());
                        }
                    }
                }
                // A tenant's token or a node's certificate may not read the membership.
                Err(e) if matches!(e.code(), tonic::Code::PermissionDenied | tonic::Code::Unauthenticated) => {
                    return Err(describe_status(e).into())
                }
                Err(_) => {}
            }
            for addr in &addrs {
                views.push((addr.clone(), client.node_status(addr).await));
            }
            if output != Output::Table {
                let value: Vec<serde_json::Value> = views
                    .iter()
                    .map(|(addr, s)| match s {
                        Ok(s) => status_json(s),
                        Err(e) => serde_json::json!({"address": addr, "error": e.message()}),
                    })
                    .collect();
                return print_structured(&serde_json::Value::Array(value), output);
            }
            let mut rows = vec![["NODE", "ADDRESS", "STATE", "LEADER", "TERM", "COMMIT", "APPLIED", "LAST LOG", "SNAPSHOT", "VOTER"]
                .map(String::from)
                .to_vec()];
            let mut reachable = 0;
            for (addr, s) in &views {
                match s {
                    Ok(s) => {
                        reachable += 1;
                        let voter =
                            s.members.iter().find(|m| m.node_id == s.node_id).map_or("-", |m| if m.voter { "yes" } else { "learner" });
                        rows.push(vec![
                            s.node_id.to_string(),
                            addr.clone(),
                            s.state.clone(),
                            if s.leader_id == 0 { "-".into() } else { s.leader_id.to_string() },
                            s.term.to_string(),
                            s.commit_index.to_string(),
                            s.applied_index.to_string(),
                            s.last_log_index.to_string(),
                            s.snapshot_index.to_string(),
                            voter.into(),
                        ]);
                    }
                    Err(e) => rows.push(vec![
                        "?".into(),
                        addr.clone(),
                        format!("unreachable: {}", e.code()),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                    ]),
                }
            }
            print_table(&rows)?;
            if reachable == 0 {
                return Err("no controller reachable".into());
            }
            return Ok(());
        }
        ClusterCommand::Add { node_id, address, peer_address, learner } => {
            client.add_member_with_peer_address(node_id, &address, peer_address.as_deref(), !learner).await.map_err(describe_status)?
        }
        ClusterCommand::Remove { node_id } => client.remove_member(node_id).await.map_err(describe_status)?,
        ClusterCommand::Transfer { node_id } => client.transfer_leader(node_id.unwrap_or(0)).await.map_err(describe_status)?,
        ClusterCommand::Compact { address } => {
            let Some(address) = address.or_else(|| servers.first().cloned()) else {
                return Err("cluster compact: no controller address given".into());
            };
            let c = client.compact(&address).await.map_err(describe_status)?;
            let value = serde_json::json!({
                "node_id": c.node_id,
                "snapshot_index": c.snapshot_index,
                "snapshot_bytes": c.snapshot_bytes,
                "build_seconds": c.build_seconds,
                "purged_index": c.purged_index,
            });
            if output != Output::Table {
                return print_structured(&value, output);
            }
            outln!(
                "ok: controller {} snapshot at index {} ({} bytes, {:.2} s), log purged up to {}",
                c.node_id,
                c.snapshot_index,
                c.snapshot_bytes,
                c.build_seconds,
                c.purged_index
            );
            return Ok(());
        }
    };
    let s = status.status.unwrap_or_default();
    if output == Output::Table {
        outln!(
            "ok: leader {} term {}, members {:?}",
            s.leader_id,
            s.term,
            s.members.iter().map(|m| (m.node_id, m.voter)).collect::<Vec<_>>()
        );
        Ok(())
    } else {
        print_structured(&status_json(&s), output)
    }
}

fn status_json(s: &proto::ClusterStatusResponse) -> serde_json::Value {
    serde_json::json!({
        "node_id": s.node_id,
        "state": s.state,
        "leader_id": s.leader_id,
        "leader_address": s.leader_address,
        "term": s.term,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "last_log_index": s.last_log_index,
        "snapshot_index": s.snapshot_index,
        "purged_index": s.purged_index,
        "members": s.members.iter().map(|m| serde_json::json!({"node_id": m.node_id, "address": m.address, "peer_address": m.peer_address, "voter": m.voter, "matched_index": m.matched_index})).collect::<Vec<_>>(),
    })
}
