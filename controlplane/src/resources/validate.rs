//! Field-level validation of a resource on its own (no references to other resources;
//! those are checked by the state machine against the committed state).

use std::collections::BTreeMap;

use super::*;

/// Largest latency SLO accepted: a minute is already far beyond interactive inference.
pub const MAX_LATENCY_MS: f64 = 60_000.0;
/// Largest request rate accepted for one service.
pub const MAX_REQUEST_RATE: f64 = 10_000_000.0;
const MAX_NAME_LEN: usize = 128;

/// Names: 1-128 characters of `[A-Za-z0-9._-]`, starting with a letter or digit.
pub fn validate_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::invalid(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(FieldError::invalid(field, format!("longer than {MAX_NAME_LEN} characters")));
    }
    if !name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return Err(FieldError::invalid(field, format!("{name:?} must start with a letter or digit")));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(FieldError::invalid(field, format!("{name:?} contains {bad:?}; allowed: letters, digits, '.', '_', '-'")));
    }
    Ok(())
}

fn positive(field: &str, value: f64, max: f64) -> Result<(), FieldError> {
    if !value.is_finite() || value <= 0.0 {
        return Err(FieldError::invalid(field, format!("must be > 0 (got {value})")));
    }
    if value > max {
        return Err(FieldError::invalid(field, format!("must be <= {max} (got {value})")));
    }
    Ok(())
}

fn non_negative(field: &str, value: f64) -> Result<(), FieldError> {
    if !value.is_finite() || value < 0.0 {
        return Err(FieldError::invalid(field, format!("must be >= 0 (got {value})")));
    }
    Ok(())
}

fn names(field: &str, list: &[String]) -> Result<(), FieldError> {
    for (i, name) in list.iter().enumerate() {
        validate_name(&format!("{field}[{i}]"), name)?;
    }
    Ok(())
}

/// Checks a spec's own fields. The error names the path, e.g. `spec.slo.latency_ms`.
pub fn validate_spec(spec: &Spec) -> Result<(), FieldError> {
    match spec {
        Spec::Tenant(t) => {
            positive("spec.weight", t.weight, 1e6)?;
        }
        Spec::GpuModel(g) => validate_gpu_model(g)?,
        Spec::InstanceType(it) => {
            validate_name("spec.gpu_model", &it.gpu_model)?;
            if it.gpu_count == 0 || it.gpu_count > 64 {
                return Err(FieldError::invalid("spec.gpu_count", format!("must be 1-64 (got {})", it.gpu_count)));
            }
            positive("spec.price_per_hour", it.price_per_hour, 10_000.0)?;
            non_negative("spec.launch_latency_s", it.launch_latency_s)?;
            non_negative("spec.memory_gib", it.memory_gib)?;
        }
        Spec::ModelProfile(p) => {
            validate_name("spec.model", &p.model)?;
            validate_name("spec.gpu_model", &p.gpu_model)?;
            for (i, pt) in p.points.iter().enumerate() {
                let f = |name: &str| format!("spec.points[{i}].{name}");
                if pt.gpcs > 8 {
                    return Err(FieldError::invalid(f("gpcs"), format!("must be 0-8 (got {})", pt.gpcs)));
                }
                if pt.batch == 0 {
                    return Err(FieldError::invalid(f("batch"), "must be >= 1"));
                }
                if pt.processes == 0 {
                    return Err(FieldError::invalid(f("processes"), "must be >= 1"));
                }
                if let Some(pct) = pt.mps_percent {
                    positive(&f("mps_percent"), pct, 100.0)?;
                }
                non_negative(&f("throughput_rps"), pt.throughput_rps)?;
                non_negative(&f("latency_ms"), pt.latency_ms)?;
                if let Some(u) = pt.utilisation {
                    positive(&f("utilisation"), u, 1.0)?;
                }
            }
            if let Some(w) = &p.igniter {
                validate_igniter_workload(w)?;
            }
        }
        Spec::Service(s) => validate_service(s)?,
        Spec::Node(n) => {
            validate_address("spec.address", &n.address)?;
            validate_name("spec.instance_type", &n.instance_type)?;
            let mut seen = std::collections::BTreeSet::new();
            for (i, gpu) in n.gpus.iter().enumerate() {
                if gpu.uuid.is_empty() {
                    return Err(FieldError::invalid(format!("spec.gpus[{i}].uuid"), "must not be empty"));
                }
                if !seen.insert(&gpu.uuid) {
                    return Err(FieldError::invalid(format!("spec.gpus[{i}].uuid"), format!("duplicate GPU uuid {:?}", gpu.uuid)));
                }
                validate_name(&format!("spec.gpus[{i}].model"), &gpu.model)?;
            }
        }
        Spec::Plan(p) => validate_plan(p)?,
    }
    Ok(())
}

fn validate_address(field: &str, address: &str) -> Result<(), FieldError> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(FieldError::invalid(field, format!("{address:?} is not host:port")));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(FieldError::invalid(field, format!("{address:?} is not host:port")));
    }
    Ok(())
}

/// iGniter's model needs the power, frequency and bandwidth figures along with the fitted
/// coefficients (Eq. 3, 9, 10).
fn validate_igniter_hardware(g: &GpuModelSpec, hw: &IgniterHardwareSpec) -> Result<(), FieldError> {
    for (field, value) in [
        ("spec.idle_power_w", g.idle_power_w),
        ("spec.max_power_w", g.max_power_w),
        ("spec.max_frequency_mhz", g.max_frequency_mhz),
        ("spec.pcie_gbps", g.pcie_gbps),
    ] {
        if value.is_none() {
            return Err(FieldError::invalid(field, "required when spec.igniter is set (iGniter's Eq. 3, 9 and 10 use it)"));
        }
    }
    if g.idle_power_w >= g.max_power_w {
        return Err(FieldError::invalid("spec.idle_power_w", "must be below spec.max_power_w"));
    }
    if !hw.alpha_f.is_finite() || hw.alpha_f > 0.0 {
        return Err(FieldError::invalid("spec.igniter.alpha_f", format!("must be <= 0: frequency drops with power (got {})", hw.alpha_f)));
    }
    for (field, v) in [("spec.igniter.alpha_sch", hw.alpha_sch), ("spec.igniter.beta_sch", hw.beta_sch)] {
        if !v.is_finite() {
            return Err(FieldError::invalid(field, format!("must be a finite number (got {v})")));
        }
    }
    positive("spec.igniter.r_max_pct", hw.r_max_pct, 100.0)?;
    positive("spec.igniter.r_unit_pct", hw.r_unit_pct, hw.r_max_pct)?;
    Ok(())
}

fn validate_igniter_workload(w: &planner::perf::igniter::WorkloadCoeffs) -> Result<(), FieldError> {
    for (field, v) in [
        ("spec.igniter.d_load_bytes", w.d_load_bytes),
        ("spec.igniter.d_feedback_bytes", w.d_feedback_bytes),
        ("spec.igniter.n_kernels", w.n_kernels),
        ("spec.igniter.k_sch_ms", w.k_sch_ms),
    ] {
        non_negative(field, v)?;
    }
    // Eq. 11 divides by r + k4; shares start at 1%.
    if !w.k[3].is_finite() || w.k[3] <= -1.0 {
        return Err(FieldError::invalid("spec.igniter.k[3]", format!("must be > -1 so that r + k4 > 0 for shares >= 1% (got {})", w.k[3])));
    }
    for (field, v) in [
        ("spec.igniter.k[0]", w.k[0]),
        ("spec.igniter.k[1]", w.k[1]),
        ("spec.igniter.k[2]", w.k[2]),
        ("spec.igniter.k[4]", w.k[4]),
        ("spec.igniter.alpha_power", w.alpha_power),
        ("spec.igniter.beta_power", w.beta_power),
        ("spec.igniter.alpha_cacheutil", w.alpha_cacheutil),
        ("spec.igniter.beta_cacheutil", w.beta_cacheutil),
        ("spec.igniter.alpha_cache", w.alpha_cache),
    ] {
        if !v.is_finite() {
            return Err(FieldError::invalid(field, format!("must be a finite number (got {v})")));
        }
    }
    Ok(())
}

fn validate_gpu_model(g: &GpuModelSpec) -> Result<(), FieldError> {
    if g.sm_count == 0 {
        return Err(FieldError::invalid("spec.sm_count", "must be >= 1"));
    }
    positive("spec.memory_gib", g.memory_gib, 4096.0)?;
    for (field, value) in [
        ("spec.idle_power_w", g.idle_power_w),
        ("spec.max_power_w", g.max_power_w),
        ("spec.max_frequency_mhz", g.max_frequency_mhz),
        ("spec.pcie_gbps", g.pcie_gbps),
    ] {
        if let Some(v) = value {
            positive(field, v, 1e6)?;
        }
    }
    if let Some(hw) = &g.igniter {
        validate_igniter_hardware(g, hw)?;
    }
    if let Some(mig) = &g.mig {
        if mig.compute_slices == 0 || mig.memory_slices == 0 {
            return Err(FieldError::invalid("spec.mig", "compute_slices and memory_slices must be >= 1"));
        }
        if mig.profiles.is_empty() {
            return Err(FieldError::invalid("spec.mig.profiles", "must list at least one profile"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in mig.profiles.iter().enumerate() {
            let f = |name: &str| format!("spec.mig.profiles[{i}].{name}");
            if !seen.insert(&p.name) {
                return Err(FieldError::invalid(f("name"), format!("duplicate profile {:?}", p.name)));
            }
            if p.compute_slices == 0 || p.compute_slices > mig.compute_slices {
                return Err(FieldError::invalid(
                    f("compute_slices"),
                    format!("must be 1-{} (got {})", mig.compute_slices, p.compute_slices),
                ));
            }
            if p.memory_slices == 0 || p.memory_slices > mig.memory_slices {
                return Err(FieldError::invalid(f("memory_slices"), format!("must be 1-{} (got {})", mig.memory_slices, p.memory_slices)));
            }
            if p.starts.is_empty() {
                return Err(FieldError::invalid(f("starts"), "must list at least one legal start"));
            }
            for (j, &s) in p.starts.iter().enumerate() {
                if s + p.memory_slices > mig.memory_slices {
                    return Err(FieldError::invalid(
                        format!("spec.mig.profiles[{i}].starts[{j}]"),
                        format!("start {s} + {} memory slices exceeds {}", p.memory_slices, mig.memory_slices),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn validate_service(s: &ServiceSpec) -> Result<(), FieldError> {
    validate_name("spec.model", &s.model)?;
    positive("spec.slo.latency_ms", s.slo.latency_ms, MAX_LATENCY_MS)?;
    if !(s.slo.percentile > 0.0 && s.slo.percentile <= 100.0) {
        return Err(FieldError::invalid("spec.slo.percentile", format!("must be in (0, 100] (got {})", s.slo.percentile)));
    }
    match (&s.slo.request_rate, &s.slo.autoscaling) {
        (Some(rate), None) => positive("spec.slo.request_rate", *rate, MAX_REQUEST_RATE)?,
        (None, Some(range)) => {
            positive("spec.slo.autoscaling.min_rps", range.min_rps, MAX_REQUEST_RATE)?;
            positive("spec.slo.autoscaling.max_rps", range.max_rps, MAX_REQUEST_RATE)?;
            if range.min_rps > range.max_rps {
                return Err(FieldError::invalid(
                    "spec.slo.autoscaling.max_rps",
                    format!("must be >= min_rps ({} < {})", range.max_rps, range.min_rps),
                ));
            }
        }
        (Some(_), Some(_)) => {
            return Err(FieldError::invalid("spec.slo", "set either request_rate or autoscaling, not both"));
        }
        (None, None) => return Err(FieldError::invalid("spec.slo.request_rate", "required (or set spec.slo.autoscaling)")),
    }
    names("spec.allowed_gpu_models", &s.allowed_gpu_models)?;
    names("spec.allowed_instance_types", &s.allowed_instance_types)?;
    if let Some(BatchDistribution::LogNormal { mu, sigma, max_batch }) = &s.batch_distribution {
        if !mu.is_finite() {
            return Err(FieldError::invalid("spec.batch_distribution.mu", "must be finite"));
        }
        positive("spec.batch_distribution.sigma", *sigma, 100.0)?;
        if *max_batch == 0 {
            return Err(FieldError::invalid("spec.batch_distribution.max_batch", "must be >= 1"));
        }
    }
    Ok(())
}

fn validate_plan(p: &PlanSpec) -> Result<(), FieldError> {
    for (g, gpu) in p.gpus.iter().enumerate() {
        let f = |rest: &str| format!("spec.gpus[{g}].{rest}");
        validate_name(&f("node"), &gpu.node)?;
        // Shares are summed per MIG instance (or per whole GPU when not partitioned).
        let mut share: BTreeMap<Option<usize>, f64> = BTreeMap::new();
        for (w, wl) in gpu.workloads.iter().enumerate() {
            let wf = |rest: &str| format!("spec.gpus[{g}].workloads[{w}].{rest}");
            positive(&wf("mps_percent"), wl.mps_percent, 100.0)?;
            non_negative(&wf("shadow_mps_percent"), wl.shadow_mps_percent)?;
            if wl.batch == 0 {
                return Err(FieldError::invalid(wf("batch"), "must be >= 1"));
            }
            if let Some(idx) = wl.mig_instance {
                if idx >= gpu.mig_layout.len() {
                    return Err(FieldError::invalid(
                        wf("mig_instance"),
                        format!("index {idx} but the layout has {} instances", gpu.mig_layout.len()),
                    ));
                }
            } else if !gpu.mig_layout.is_empty() {
                return Err(FieldError::invalid(wf("mig_instance"), "required on a MIG-partitioned GPU"));
            }
            let total = share.entry(wl.mig_instance).or_default();
            *total += wl.mps_percent * f64::from(wl.processes) + wl.shadow_mps_percent;
            if *total > 100.0 + 1e-9 {
                return Err(FieldError::invalid(wf("mps_percent"), format!("MPS shares on this partition add up to {total:.1}% > 100%")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(rate: Option<f64>, latency: f64) -> Spec {
        Spec::Service(ServiceSpec {
            model: "resnet50".into(),
            slo: Slo { latency_ms: latency, percentile: 99.0, request_rate: rate, autoscaling: None },
            allowed_gpu_models: vec![],
            allowed_instance_types: vec![],
            strategy: None,
            batch_distribution: None,
        })
    }

    #[test]
    fn rates_and_latencies_must_be_positive_and_sane() {
        assert!(validate_spec(&service(Some(100.0), 50.0)).is_ok());
        for (rate, latency, field) in [
            (Some(-1.0), 50.0, "spec.slo.request_rate"),
            (Some(0.0), 50.0, "spec.slo.request_rate"),
            (Some(f64::NAN), 50.0, "spec.slo.request_rate"),
            (None, 50.0, "spec.slo.request_rate"),
            (Some(10.0), 0.0, "spec.slo.latency_ms"),
            (Some(10.0), 1e9, "spec.slo.latency_ms"),
        ] {
            let err = validate_spec(&service(rate, latency)).unwrap_err();
            assert_eq!(err.field, field, "{rate:?} {latency}: {err}");
            assert_eq!(err.code, ErrorCode::InvalidArgument);
        }
    }

    #[test]
    fn names_are_restricted() {
        assert!(validate_name("name", "A100-80GB").is_ok());
        assert!(validate_name("name", "").is_err());
        assert!(validate_name("name", "-x").is_err());
        assert!(validate_name("name", "a/b").unwrap_err().reason.contains("'/'"));
        assert!(validate_name("name", &"a".repeat(200)).is_err());
    }

    #[test]
    fn unknown_spec_field_is_named() {
        let err = Spec::from_json(Kind::Service, r#"{"model":"m","slo":{"latency_ms":5,"request_rate":1,"burst":3}}"#).unwrap_err();
        assert_eq!(err.field, "spec.slo.burst");
        assert!(err.reason.contains("unknown field `burst`"), "{}", err.reason);
        let err = Spec::from_json(Kind::Service, r#"{"model":"m","slo":{"latency_ms":"fast","request_rate":1}}"#).unwrap_err();
        assert_eq!(err.field, "spec.slo.latency_ms");
    }

    #[test]
    fn plan_shares_per_partition_are_bounded() {
        let wl = |pct: f64| WorkloadAssignment {
            service: "s".into(),
            mig_instance: None,
            mps_percent: pct,
            batch: 4,
            processes: 1,
            shadow_mps_percent: 0.0,
        };
        let plan = |wls: Vec<WorkloadAssignment>| {
            Spec::Plan(PlanSpec {
                strategy: "igniter".into(),
                gpus: vec![GpuAssignment { node: "n1".into(), gpu_uuid: "GPU-1".into(), mig_layout: vec![], workloads: wls }],
                services: vec![],
                inputs_digest: String::new(),
                trace_parent: String::new(),
            })
        };
        assert!(validate_spec(&plan(vec![wl(60.0), wl(40.0)])).is_ok());
        let err = validate_spec(&plan(vec![wl(60.0), wl(50.0)])).unwrap_err();
        assert_eq!(err.field, "spec.gpus[0].workloads[1].mps_percent");
    }
}
