//! ParvaGPU's published scenarios: gpuplane's ParvaGPU and exact strategies against the
//! published deployment maps on the same inputs (`parvagpu/prof_data`, `parvagpu/SLO`,
//! `parvagpu/deployment`, read at run time). One row per SLO scenario: GPUs of the published
//! deployment, GPUs and GPCs of our plans, the lower bound (see `bounds.rs`), whether every
//! service's predicted capacity covers its rate, and the median planning time.

use crate::bounds;
use planner::input::{GpuType, PlanningInput, ServiceDemand};
use planner::mig::GpuModel;
use planner::perf::table::ProfileTable;
use planner::plan::Plan;
use planner::strategy::{exact, parvagpu};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The profile files in the column order of the SLO tables (alphabetical).
const MODELS: [&str; 11] = [
    "bert",
    "densenet121",
    "densenet169",
    "densenet201",
    "inceptionv3",
    "mobilenetv2",
    "resnet101",
    "resnet152",
    "resnet50",
    "vgg16",
    "vgg19",
];
const GPU_TYPE: &str = "a100-80gb";

/// The services of one SLO scenario: one per model with both an SLO and a rate.
fn scenario_services(latency: &[Option<f64>], rate: &[Option<f64>]) -> Vec<ServiceDemand> {
    MODELS
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let (slo, r) = (latency.get(i).copied().flatten()?, rate.get(i).copied().flatten()?);
            Some(ServiceDemand { name: m.to_string(), model: m.to_string(), slo_ms: slo, request_rate: r })
        })
        .collect()
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Rows of an SLO table: per scenario, per model, `None` for `N/A`.
fn slo_table(path: &Path) -> Result<Vec<Vec<Option<f64>>>, String> {
    read(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            l.split(',')
                .map(|f| match f.trim() {
                    "N/A" => Ok(None),
                    v => v.parse::<f64>().map(Some).map_err(|_| format!("{} line {}: `{v}` is not a number", path.display(), i + 1)),
                })
                .collect()
        })
        .collect()
}

/// Segment sizes per model of a published deployment, e.g. `3x3g 1x1g`.
fn published_mixes(path: &Path) -> Result<BTreeMap<String, BTreeMap<u8, u32>>, String> {
    let mut mixes: BTreeMap<String, BTreeMap<u8, u32>> = BTreeMap::new();
    for (i, l) in read(path)?.lines().enumerate().skip(1).filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        let size =
            f.get(4).and_then(|v| v.parse::<u8>().ok()).ok_or_else(|| format!("{} line {}: no instance size", path.display(), i + 1))?;
        *mixes.entry(f[2].to_string()).or_default().entry(size).or_default() += 1;
    }
    Ok(mixes)
}

fn plan_mixes(plan: &Plan) -> BTreeMap<String, BTreeMap<u8, u32>> {
    let mut mixes: BTreeMap<String, BTreeMap<u8, u32>> = BTreeMap::new();
    for g in &plan.gpus {
        let planner::plan::Sharing::Mig { instances } = &g.sharing else { continue };
        for w in &g.workloads {
            let Some(size) = w.mig_instance.map(|k| instances[k].profile.compute()) else { continue };
            *mixes.entry(w.service.clone()).or_default().entry(size).or_default() += 1;
        }
    }
    mixes
}

fn show_mix(m: Option<&BTreeMap<u8, u32>>) -> String {
    m.map(|m| m.iter().rev().map(|(s, n)| format!("{n}x{s}g")).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// GPUs of a published deployment: distinct (node, GPU) pairs.
fn published_gpus(path: &Path) -> Result<usize, String> {
    let text = read(path)?;
    let gpus: BTreeSet<(String, String)> = text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].trim().to_string(), f.get(1).unwrap_or(&"").trim().to_string())
        })
        .collect();
    Ok(gpus.len())
}

fn covers(plan: &Plan, input: &PlanningInput) -> bool {
    plan.infeasible.is_empty()
        && input.services.iter().all(|s| plan.prediction(&s.name).is_some_and(|p| p.capacity_rps + 1e-6 >= s.request_rate))
}

pub fn run(root: &Path, runs: usize, detail: bool) -> Result<(), String> {
    let mut tables = BTreeMap::new();
    for m in MODELS {
        let path = root.join("prof_data").join(format!("{m}.csv"));
        let t = ProfileTable::parse_csv(&read(&path)?).map_err(|e| format!("{}: {e}", path.display()))?;
        tables.insert(m.to_string(), t);
    }
    let latency = slo_table(&root.join("SLO/SLO_latency.csv"))?;
    let rate = slo_table(&root.join("SLO/SLO_req_rate.csv"))?;
    let gpu = GpuType { name: GPU_TYPE.into(), model: GpuModel::A100_80GB, price_per_hour: 4.1, mps: true, igniter: None };
    let mut input = PlanningInput { gpu_types: vec![gpu], ..Default::default() };
    input.profiles.tables.insert(GPU_TYPE.into(), tables);

    println!("\nParvaGPU scenarios on A100-80GB (published data from {}), median of {runs} runs", root.display());
    println!(
        "{:<8} {:>8} {:>15} {:>17} {:>14} {:>10} {:>14} {:>10} {:>10} {:>8} {:>10}",
        "scenario", "services", "published", "lower bound", "parvagpu GPUs", "GPCs", "time", "exact GPUs", "GPCs", "optimal", "time"
    );
    for (k, (lat_row, rate_row)) in latency.iter().zip(&rate).enumerate() {
        input.services = scenario_services(lat_row, rate_row);
        let n = k + 1;
        let deploy = root.join(format!("deployment/SLO{n}/SLO{n}_ParvaGPU_deploy.csv"));
        let published = published_gpus(&deploy)?;
        let published_gpcs: u32 =
            published_mixes(&deploy)?.values().flat_map(|m| m.iter()).map(|(&size, &count)| u32::from(size) * count).sum();
        let parva_cfg = parvagpu::ParvaConfig::default();
        let exact_cfg = exact::ExactConfig::default();
        let lb = bounds::mig(&input, &parva_cfg, exact_cfg.node_budget);
        let parva = parvagpu::plan(&input, &parva_cfg);
        let (ex, report) = exact::plan(&input, &exact_cfg);
        let t_parva = crate::median_time(runs, || drop(parvagpu::plan(&input, &parva_cfg)));
        let t_exact = crate::median_time(runs, || drop(exact::plan(&input, &exact_cfg)));
        let mark = |p: &Plan| if covers(p, &input) { "" } else { " (!)" };
        println!(
            "{:<8} {:>8} {:>15} {:>17} {:>14} {:>10} {:>14} {:>10} {:>10} {:>8} {:>10}",
            format!("SLO{n}"),
            input.services.len(),
            format!("{published} ({published_gpcs} GPCs)"),
            format!("{}{} GPCs={:.2}", if lb.complete { "" } else { "~" }, lb.gpcs, lb.gpus()),
            format!("{}{}", parva.gpus_used(), mark(&parva)),
            parva.gpcs_used(),
            format!("{:.2?}", t_parva),
            format!("{}{}", ex.gpus_used(), mark(&ex)),
            ex.gpcs_used(),
            if report.used_heuristic {
                "heur"
            } else if report.joint_proven_optimal {
                "joint"
            } else if report.proven_optimal {
                "mixes"
            } else {
                "budget"
            },
            format!("{:.2?}", t_exact),
        );
    }
    if detail {
        for (k, (lat_row, rate_row)) in latency.iter().zip(&rate).enumerate() {
            let n = k + 1;
            input.services = scenario_services(lat_row, rate_row);
            let published = published_mixes(&root.join(format!("deployment/SLO{n}/SLO{n}_ParvaGPU_deploy.csv")))?;
            let parva = plan_mixes(&parvagpu::plan(&input, &parvagpu::ParvaConfig::default()));
            let ex = plan_mixes(&exact::plan(&input, &exact::ExactConfig::default()).0);
            println!("\nSLO{n}: segments per service");
            println!("{:<12} {:>26} {:>26} {:>26}", "service", "published", "parvagpu", "exact");
            for s in &input.services {
                let m = &s.name;
                println!("{:<12} {:>26} {:>26} {:>26}", m, show_mix(published.get(m)), show_mix(parva.get(m)), show_mix(ex.get(m)));
            }
        }
    }
    println!("lower bound: Σ per-service minimum GPCs over the profiled points (exact::min_gpc_mix) = GPUs-worth after '='; any plan needs ≥ ⌈that⌉ GPUs");
    println!("optimal: joint = no choice of segment mixes packs onto fewer GPUs; mixes = packing optimal for the chosen mixes; heur = ParvaGPU's plan was as good");
    println!("(!) = some service's predicted capacity is below its rate or it was refused");
    Ok(())
}
