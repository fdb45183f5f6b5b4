//! Field-level validation of a resource on its own (no references to other resources;
//! those are checked by the state machine against the committed state).

use std::collections::{BTreeMap, BTreeSet};

use super::limits::*;
use super::*;

/// Names: 1-128 characters of `[A-Za-z0-9._-]`, starting with a letter or digit.
pub fn validate_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::invalid(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(FieldError::invalid(field, format!("is {} characters long; the limit is {MAX_NAME_LEN}", name.len())));
    }
    if !name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return Err(FieldError::invalid(field, format!("{name:?} must start with a letter or digit")));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(FieldError::invalid(field, format!("{name:?} contains {bad:?}; allowed: letters, digits, '.', '_', '-'")));
    }
    Ok(())
}

/// A finite number in `(0, max]`; NaN and infinities are named as such.
fn positive(field: &str, value: f64, max: f64) -> Result<(), FieldError> {
    finite(field, value)?;
    if value <= 0.0 {
        return Err(FieldError::invalid(field, format!("must be > 0 (got {value})")));
    }
    at_most(field, value, max)
}

/// A finite number in `[0, max]`.
pub fn non_negative(field: &str, value: f64, max: f64) -> Result<(), FieldError> {
    finite(field, value)?;
    if value < 0.0 {
        return Err(FieldError::invalid(field, format!("must be >= 0 (got {value})")));
    }
    at_most(field, value, max)
}

/// A finite number in `[min, max]`.
fn within(field: &str, value: f64, min: f64, max: f64) -> Result<(), FieldError> {
    finite(field, value)?;
    if value < min || value > max {
        return Err(FieldError::invalid(field, format!("must be in [{min}, {max}] (got {value})")));
    }
    Ok(())
}

fn finite(field: &str, value: f64) -> Result<(), FieldError> {
    if !value.is_finite() {
        return Err(FieldError::invalid(field, format!("must be a finite number (got {value})")));
    }
    Ok(())
}

fn at_most(field: &str, value: f64, max: f64) -> Result<(), FieldError> {
    if value > max {
        return Err(FieldError::invalid(field, format!("must be <= {max} (got {value})")));
    }
    Ok(())
}

/// An integer in `[min, max]`.
fn int_within(field: &str, value: u64, min: u64, max: u64) -> Result<(), FieldError> {
    if value < min || value > max {
        return Err(FieldError::invalid(field, format!("must be {min}-{max} (got {value})")));
    }
    Ok(())
}

/// A list of at most `max` entries.
pub fn bounded_list(field: &str, len: usize, max: usize) -> Result<(), FieldError> {
    if len > max {
        return Err(FieldError::invalid(field, format!("lists {len} entries; the limit is {max}")));
    }
    Ok(())
}

pub fn bounded_text(field: &str, text: &str, max: usize) -> Result<(), FieldError> {
    if text.len() > max {
        return Err(FieldError::invalid(field, format!("is {} bytes long; the limit is {max}", text.len())));
    }
    if text.chars().any(char::is_control) {
        return Err(FieldError::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// Names, at most `max`, each once.
fn unique_names(field: &str, list: &[String], max: usize) -> Result<(), FieldError> {
    bounded_list(field, list.len(), max)?;
    let mut seen = BTreeSet::new();
    for (i, name) in list.iter().enumerate() {
        validate_name(&format!("{field}[{i}]"), name)?;
        if !seen.insert(name) {
            return Err(FieldError::invalid(format!("{field}[{i}]"), format!("{name:?} is listed twice")));
        }
    }
    Ok(())
}

/// Checks a spec's own fields. The error names the path, e.g. `spec.slo.latency_ms`.
pub fn validate_spec(spec: &Spec) -> Result<(), FieldError> {
    match spec {
        Spec::Tenant(t) => {
            bounded_text("spec.display_name", &t.display_name, MAX_DISPLAY_NAME_LEN)?;
            positive("spec.weight", t.weight, MAX_TENANT_WEIGHT)?;
            if let Some(max) = t.max_services {
                int_within("spec.max_services", u64::from(max), 0, u64::from(MAX_SERVICES_PER_TENANT))?;
            }
            if let Some(max) = t.max_gpus {
                non_negative("spec.max_gpus", max, MAX_TENANT_GPUS)?;
            }
            if let Some(max) = t.max_cost_per_hour {
                non_negative("spec.max_cost_per_hour", max, MAX_TENANT_COST_PER_HOUR)?;
            }
        }
        Spec::GpuModel(g) => validate_gpu_model(g)?,
        Spec::InstanceType(it) => {
            validate_name("spec.gpu_model", &it.gpu_model)?;
            int_within("spec.gpu_count", u64::from(it.gpu_count), 1, MAX_GPUS_PER_NODE as u64)?;
            positive("spec.price_per_hour", it.price_per_hour, MAX_PRICE_PER_HOUR)?;
            non_negative("spec.launch_latency_s", it.launch_latency_s, MAX_LAUNCH_LATENCY_S)?;
            int_within("spec.cpu_cores", u64::from(it.cpu_cores), 0, 4096)?;
            non_negative("spec.memory_gib", it.memory_gib, 65_536.0)?;
            if let Some(max) = it.max_instances {
                int_within("spec.max_instances", u64::from(max), 0, u64::from(MAX_INSTANCES_PER_TYPE))?;
            }
        }
        Spec::ModelProfile(p) => validate_model_profile(p)?,
        Spec::Service(s) => validate_service(s)?,
        Spec::Node(n) => validate_node(n)?,
        Spec::Plan(p) => validate_plan(p)?,
        Spec::ServingRuntime(r) => super::validate_runtime::validate_serving_runtime(r)?,
    }
    if !matches!(spec, Spec::Plan(_)) {
        let bytes = spec.to_json().len();
        if bytes > MAX_SPEC_BYTES {
            return Err(FieldError::invalid("spec", format!("encodes to {bytes} bytes; the limit is {MAX_SPEC_BYTES}")));
        }
    }
    Ok(())
}

fn validate_model_profile(p: &ModelProfileSpec) -> Result<(), FieldError> {
    validate_name("spec.model", &p.model)?;
    validate_name("spec.gpu_model", &p.gpu_model)?;
    bounded_list("spec.points", p.points.len(), MAX_PROFILE_POINTS)?;
    // One row per configuration: a second row for the same one would make the table
    // ambiguous (which throughput holds?).
    let mut seen = BTreeMap::new();
    for (i, pt) in p.points.iter().enumerate() {
        let f = |name: &str| format!("spec.points[{i}].{name}");
        if !matches!(pt.gpcs, 0 | 1 | 2 | 3 | 4 | 7) {
            return Err(FieldError::invalid(f("gpcs"), format!("must be 0 (whole GPU) or a MIG size: 1, 2, 3, 4 or 7 (got {})", pt.gpcs)));
        }
        int_within(&f("batch"), u64::from(pt.batch), 1, u64::from(MAX_BATCH))?;
        int_within(&f("processes"), u64::from(pt.processes), 1, u64::from(MAX_PROCESSES))?;
        if let Some(pct) = pt.mps_percent {
            positive(&f("mps_percent"), pct, 100.0)?;
        }
        within(&f("throughput_rps"), pt.throughput_rps, MIN_THROUGHPUT_RPS, MAX_REQUEST_RATE)?;
        positive(&f("latency_ms"), pt.latency_ms, MAX_LATENCY_MS)?;
        if let Some(u) = pt.utilisation {
            positive(&f("utilisation"), u, 1.0)?;
        }
        let key = (pt.gpcs, pt.batch, pt.processes, pt.mps_percent.map(f64::to_bits));
        if let Some(first) = seen.insert(key, i) {
            return Err(FieldError::invalid(
                format!("spec.points[{i}]"),
                format!("repeats the configuration of spec.points[{first}] (gpcs, batch, processes, mps_percent)"),
            ));
        }
    }
    if let Some(w) = &p.igniter {
        validate_igniter_workload(w)?;
    }
    Ok(())
}

fn validate_node(n: &NodeSpec) -> Result<(), FieldError> {
    bounded_text("spec.address", &n.address, MAX_ADDRESS_LEN)?;
    validate_address("spec.address", &n.address)?;
    validate_name("spec.instance_type", &n.instance_type)?;
    bounded_list("spec.gpus", n.gpus.len(), MAX_GPUS_PER_NODE)?;
    let mut seen = BTreeSet::new();
    for (i, gpu) in n.gpus.iter().enumerate() {
        let field = format!("spec.gpus[{i}].uuid");
        if gpu.uuid.is_empty() {
            return Err(FieldError::invalid(field, "must not be empty"));
        }
        bounded_text(&field, &gpu.uuid, MAX_UUID_LEN)?;
        if !seen.insert(&gpu.uuid) {
            return Err(FieldError::invalid(field, format!("duplicate GPU uuid {:?}", gpu.uuid)));
        }
        validate_name(&format!("spec.gpus[{i}].model"), &gpu.model)?;
    }
    bounded_list("spec.labels", n.labels.len(), MAX_LABELS)?;
    for (key, value) in &n.labels {
        if key.is_empty() {
            return Err(FieldError::invalid("spec.labels", "a label key must not be empty"));
        }
        bounded_text(&format!("spec.labels.{key}"), key, MAX_LABEL_KEY_LEN)?;
        bounded_text(&format!("spec.labels.{key}"), value, MAX_LABEL_VALUE_LEN)?;
    }
    Ok(())
}

fn validate_address(field: &str, address: &str) -> Result<(), FieldError> {
    host_of(address).map(|_| ()).ok_or_else(|| {
        FieldError::invalid(
            field,
            format!("{address:?} is not host:port (a DNS name, an IPv4 address or a bracketed IPv6 address, and a port 1-65535)"),
        )
    })
}

/// The host of `host:port`, or `None` unless the host is a DNS name (RFC 1123 labels), an
/// IPv4 address or a bracketed IPv6 address (`[::1]:80`), and the port is 1-65535 in
/// decimal. A host compared with another (an endpoint on its node's own host) is then
/// one of these spellings, never `::::` or `a b c`.
pub fn host_of(address: &str) -> Option<&str> {
    let (host, port) = address.rsplit_once(':')?;
    let port_ok = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.parse::<std::net::Ipv4Addr>().is_ok() || is_dns_name(host),
    };
    (port_ok && host_ok).then_some(host)
}

/// RFC 1123 host names: dot-separated labels of 1-63 letters, digits and '-', neither
/// starting nor ending with '-', 253 characters at most; the last label is not all digits
/// (that would be a malformed IPv4 address).
fn is_dns_name(host: &str) -> bool {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && !l.starts_with('-') && !l.ends_with('-')
    };
    (1..=253).contains(&host.len())
        && host.split('.').all(label_ok)
        && !host.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
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
    within("spec.igniter.alpha_f", hw.alpha_f, -MAX_COEFFICIENT_ABS, 0.0)
        .map_err(|e| FieldError::invalid(e.field, format!("{}: frequency drops with power", e.reason)))?;
    for (field, v) in [("spec.igniter.alpha_sch", hw.alpha_sch), ("spec.igniter.beta_sch", hw.beta_sch)] {
        within(field, v, -MAX_COEFFICIENT_ABS, MAX_COEFFICIENT_ABS)?;
    }
    positive("spec.igniter.r_max_pct", hw.r_max_pct, 100.0)?;
    within("spec.igniter.r_unit_pct", hw.r_unit_pct, MIN_IGNITER_R_UNIT_PCT, hw.r_max_pct)?;
    Ok(())
}

fn validate_igniter_workload(w: &planner::perf::igniter::WorkloadCoeffs) -> Result<(), FieldError> {
    for (field, v) in [
        ("spec.igniter.d_load_bytes", w.d_load_bytes),
        ("spec.igniter.d_feedback_bytes", w.d_feedback_bytes),
        ("spec.igniter.n_kernels", w.n_kernels),
        ("spec.igniter.k_sch_ms", w.k_sch_ms),
    ] {
        non_negative(field, v, MAX_COEFFICIENT_ABS)?;
    }
    // Eq. 11 divides by r + k4; shares start at 1%.
    if !w.k[3].is_finite() || w.k[3] <= -1.0 || w.k[3] > MAX_COEFFICIENT_ABS {
        return Err(FieldError::invalid(
            "spec.igniter.k[3]",
            format!("must be in (-1, {MAX_COEFFICIENT_ABS}] so that r + k4 > 0 for shares >= 1% (got {})", w.k[3]),
        ));
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
        within(field, v, -MAX_COEFFICIENT_ABS, MAX_COEFFICIENT_ABS)?;
    }
    Ok(())
}

fn validate_gpu_model(g: &GpuModelSpec) -> Result<(), FieldError> {
    int_within("spec.sm_count", u64::from(g.sm_count), 1, u64::from(MAX_SM_COUNT))?;
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
        int_within("spec.mig.compute_slices", u64::from(mig.compute_slices), 1, u64::from(MAX_MIG_SLICES))?;
        int_within("spec.mig.memory_slices", u64::from(mig.memory_slices), 1, u64::from(MAX_MIG_SLICES))?;
        if mig.profiles.is_empty() {
            return Err(FieldError::invalid("spec.mig.profiles", "must list at least one profile"));
        }
        bounded_list("spec.mig.profiles", mig.profiles.len(), MAX_MIG_PROFILES)?;
        let mut seen = BTreeSet::new();
        for (i, p) in mig.profiles.iter().enumerate() {
            let f = |name: &str| format!("spec.mig.profiles[{i}].{name}");
            bounded_text(&f("name"), &p.name, MAX_NAME_LEN)?;
            if !seen.insert(&p.name) {
                return Err(FieldError::invalid(f("name"), format!("duplicate profile {:?}", p.name)));
            }
            int_within(&f("compute_slices"), u64::from(p.compute_slices), 1, u64::from(mig.compute_slices))?;
            int_within(&f("memory_slices"), u64::from(p.memory_slices), 1, u64::from(mig.memory_slices))?;
            if p.starts.is_empty() {
                return Err(FieldError::invalid(f("starts"), "must list at least one legal start"));
            }
            bounded_list(&f("starts"), p.starts.len(), usize::from(MAX_MIG_SLICES))?;
            let mut starts = BTreeSet::new();
            for (j, &s) in p.starts.iter().enumerate() {
                let field = format!("spec.mig.profiles[{i}].starts[{j}]");
                if u16::from(s) + u16::from(p.memory_slices) > u16::from(mig.memory_slices) {
                    return Err(FieldError::invalid(
                        field,
                        format!("start {s} + {} memory slices exceeds {}", p.memory_slices, mig.memory_slices),
                    ));
                }
                if !starts.insert(s) {
                    return Err(FieldError::invalid(field, format!("start {s} is listed twice")));
                }
            }
        }
    }
    Ok(())
}

fn validate_service(s: &ServiceSpec) -> Result<(), FieldError> {
    validate_name("spec.model", &s.model)?;
    positive("spec.slo.latency_ms", s.slo.latency_ms, MAX_LATENCY_MS)?;
    finite("spec.slo.percentile", s.slo.percentile)?;
    if !(s.slo.percentile > 0.0 && s.slo.percentile <= 100.0) {
        return Err(FieldError::invalid("spec.slo.percentile", format!("must be in (0, 100] (got {})", s.slo.percentile)));
    }
    match (&s.slo.request_rate, &s.slo.autoscaling) {
        (Some(rate), None) => within("spec.slo.request_rate", *rate, MIN_REQUEST_RATE, MAX_REQUEST_RATE)?,
        (None, Some(range)) => {
            within("spec.slo.autoscaling.min_rps", range.min_rps, MIN_REQUEST_RATE, MAX_REQUEST_RATE)?;
            within("spec.slo.autoscaling.max_rps", range.max_rps, MIN_REQUEST_RATE, MAX_REQUEST_RATE)?;
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
    int_within("spec.priority", u64::from(s.priority), 0, u64::from(MAX_SERVICE_PRIORITY))?;
    bounded_list("spec.inference_tokens", s.inference_tokens.len(), MAX_INFERENCE_TOKENS)?;
    let mut tokens = BTreeSet::new();
    for (i, digest) in s.inference_tokens.iter().enumerate() {
        let field = format!("spec.inference_tokens[{i}]");
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(FieldError::invalid(
                field,
                "must be the SHA-256 of a token as 64 lower-case hex digits (gpuctl token prints it), not the token itself",
            ));
        }
        if !tokens.insert(digest) {
            return Err(FieldError::invalid(field, "is listed twice"));
        }
    }
    if let Some(runtime) = &s.runtime {
        validate_name("spec.runtime", runtime)?;
    }
    if let Some(uri) = &s.model_uri {
        super::validate_runtime::validate_model_uri(uri)?;
    }
    unique_names("spec.allowed_gpu_models", &s.allowed_gpu_models, MAX_ALLOWED_GPU_MODELS)?;
    unique_names("spec.allowed_instance_types", &s.allowed_instance_types, MAX_ALLOWED_INSTANCE_TYPES)?;
    if let Some(BatchDistribution::LogNormal { mu, sigma, max_batch }) = &s.batch_distribution {
        within("spec.batch_distribution.mu", *mu, -MAX_LOGNORMAL_MU_ABS, MAX_LOGNORMAL_MU_ABS)?;
        positive("spec.batch_distribution.sigma", *sigma, MAX_LOGNORMAL_SIGMA)?;
        int_within("spec.batch_distribution.max_batch", u64::from(*max_batch), 1, u64::from(MAX_BATCH))?;
    }
    Ok(())
}

fn validate_plan(p: &PlanSpec) -> Result<(), FieldError> {
    bounded_list("spec.gpus", p.gpus.len(), MAX_PLAN_GPUS)?;
    let mut seen = std::collections::HashSet::new();
    for (g, gpu) in p.gpus.iter().enumerate() {
        if !seen.insert((gpu.node.as_str(), gpu.gpu_uuid.as_str())) {
            return Err(FieldError::invalid(
                format!("spec.gpus[{g}].gpu_uuid"),
                format!("GPU {:?} of node {:?} is planned twice", gpu.gpu_uuid, gpu.node),
            ));
        }
        validate_gpu_assignment(|| format!("spec.gpus[{g}]"), gpu)?;
    }
    for (i, s) in p.services.iter().enumerate() {
        validate_name(&format!("spec.services[{i}].service"), &s.service)?;
    }
    Ok(())
}

/// Checks a patch to `plan`: each GPU it sets as in a whole plan, and the size of the plan
/// it gives. O(the patch), so a small change is checked in proportion to its size.
pub fn validate_plan_patch(plan: &PlanSpec, patch: &PlanPatch) -> Result<(), FieldError> {
    bounded_list("patch.set_gpus", patch.set_gpus.len(), MAX_PLAN_GPUS)?;
    bounded_list("patch.remove_gpus", patch.remove_gpus.len(), MAX_PLAN_GPUS)?;
    if plan.gpus.len() + patch.set_gpus.len() > MAX_PLAN_GPUS + patch.remove_gpus.len() {
        return Err(FieldError::invalid("patch.set_gpus", format!("the patched plan could exceed {MAX_PLAN_GPUS} GPUs")));
    }
    let mut seen = std::collections::HashSet::new();
    for (g, gpu) in patch.set_gpus.iter().enumerate() {
        if !seen.insert((gpu.node.as_str(), gpu.gpu_uuid.as_str())) {
            return Err(FieldError::invalid(format!("patch.set_gpus[{g}].gpu_uuid"), format!("GPU {:?} is set twice", gpu.gpu_uuid)));
        }
        validate_gpu_assignment(|| format!("patch.set_gpus[{g}]"), gpu)?;
    }
    for (i, (node, uuid)) in patch.remove_gpus.iter().enumerate() {
        validate_name(&format!("patch.remove_gpus[{i}].node"), node)?;
        bounded_text(&format!("patch.remove_gpus[{i}].gpu_uuid"), uuid, MAX_UUID_LEN)?;
    }
    bounded_list("patch.set_services", patch.set_services.len(), MAX_PLAN_GPUS)?;
    for (i, s) in patch.set_services.iter().enumerate() {
        validate_name(&format!("patch.set_services[{i}].service"), &s.service)?;
    }
    for (i, s) in patch.remove_services.iter().enumerate() {
        validate_name(&format!("patch.remove_services[{i}]"), s)?;
    }
    Ok(())
}

/// `checked`, its error (if any) naming `field`: hot paths check with an empty field and
/// format the path only for a refusal (a plan's parts are thousands of GPUs, each checked by
/// every controller as the entry is applied).
pub fn named(checked: Result<(), FieldError>, field: impl FnOnce() -> String) -> Result<(), FieldError> {
    checked.map_err(|e| e.at(field()))
}

/// One GPU of a plan; `at` gives its field path, e.g. `spec.gpus[3]`, formatted only for an
/// error.
fn validate_gpu_assignment(at: impl Fn() -> String, gpu: &GpuAssignment) -> Result<(), FieldError> {
    let at = &at;
    let f = |rest: &'static str| move || format!("{}.{rest}", at());
    named(validate_name("", &gpu.node), f("node"))?;
    named(bounded_text("", &gpu.gpu_uuid, MAX_UUID_LEN), f("gpu_uuid"))?;
    named(bounded_list("", gpu.mig_layout.len(), usize::from(MAX_MIG_SLICES)), f("mig_layout"))?;
    named(bounded_list("", gpu.workloads.len(), MAX_WORKLOADS_PER_GPU), f("workloads"))?;
    named(bounded_list("", gpu.retiring.len(), MAX_WORKLOADS_PER_GPU), f("retiring"))?;
    // Shares are summed per MIG instance (or per whole GPU when not partitioned), retiring
    // workloads' with the others': the GPU holds both while they hand over.
    let mut share: BTreeMap<Option<usize>, f64> = BTreeMap::new();
    let listed = gpu.workloads.iter().enumerate().map(|(w, wl)| ("workloads", w, wl));
    for (list, w, wl) in listed.chain(gpu.retiring.iter().enumerate().map(|(w, wl)| ("retiring", w, wl))) {
        let wf = |rest: &'static str| move || format!("{}.{list}[{w}].{rest}", at());
        named(validate_name("", &wl.service), wf("service"))?;
        if !wl.tenant.is_empty() {
            named(validate_name("", &wl.tenant), wf("tenant"))?;
        }
        named(positive("", wl.mps_percent, 100.0), wf("mps_percent"))?;
        named(non_negative("", wl.shadow_mps_percent, 100.0), wf("shadow_mps_percent"))?;
        named(int_within("", u64::from(wl.batch), 1, u64::from(MAX_BATCH)), wf("batch"))?;
        named(int_within("", u64::from(wl.processes), 1, u64::from(MAX_PROCESSES)), wf("processes"))?;
        named(non_negative("", wl.batch_ms, MAX_LATENCY_MS), wf("batch_ms"))?;
        if let Some(idx) = wl.mig_instance {
            if idx >= gpu.mig_layout.len() {
                return Err(FieldError::invalid(
                    wf("mig_instance")(),
                    format!("index {idx} but the layout has {} instances", gpu.mig_layout.len()),
                ));
            }
        } else if !gpu.mig_layout.is_empty() {
            return Err(FieldError::invalid(wf("mig_instance")(), "required on a MIG-partitioned GPU"));
        }
        let total = share.entry(wl.mig_instance).or_default();
        *total += wl.mps_percent * f64::from(wl.processes) + wl.shadow_mps_percent;
        if *total > 100.0 + 1e-9 {
            return Err(FieldError::invalid(wf("mps_percent")(), format!("MPS shares on this partition add up to {total:.1}% > 100%")));
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
            priority: 0,
            inference_tokens: vec![],
            runtime: None,
            model_uri: None,
        })
    }

    #[test]
    fn rates_and_latencies_must_be_positive_and_sane() {
        assert!(validate_spec(&service(Some(100.0), 50.0)).is_ok());
        for (rate, latency, field) in [
            (Some(-1.0), 50.0, "spec.slo.request_rate"),
            (Some(0.0), 50.0, "spec.slo.request_rate"),
            (Some(f64::NAN), 50.0, "spec.slo.request_rate"),
            (Some(1e-300), 50.0, "spec.slo.request_rate"),
            (Some(MIN_REQUEST_RATE / 2.0), 50.0, "spec.slo.request_rate"),
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
    fn inference_tokens_are_digests_bounded_and_listed_once() {
        let with = |tokens: Vec<String>| {
            let Spec::Service(mut s) = service(Some(10.0), 50.0) else { unreachable!() };
            s.inference_tokens = tokens;
            validate_spec(&Spec::Service(s))
        };
        let digest = |i: usize| format!("{i:064x}");
        assert!(with((0..MAX_INFERENCE_TOKENS).map(digest).collect()).is_ok());
        assert_eq!(with((0..=MAX_INFERENCE_TOKENS).map(digest).collect()).unwrap_err().field, "spec.inference_tokens");
        for bad in ["a-plain-token", &"A".repeat(64), &"0".repeat(63)] {
            let err = with(vec![digest(1), bad.to_string()]).unwrap_err();
            assert_eq!(err.field, "spec.inference_tokens[1]", "{bad}");
            assert!(err.reason.contains("not the token itself"), "{err}");
        }
        assert_eq!(with(vec![digest(1), digest(1)]).unwrap_err().field, "spec.inference_tokens[1]");
    }

    #[test]
    fn the_smallest_request_rate_is_admitted() {
        assert!(validate_spec(&service(Some(MIN_REQUEST_RATE), 50.0)).is_ok());
    }

    #[test]
    fn addresses_are_a_name_or_an_ip_and_a_port() {
        for good in ["localhost:7400", "127.0.0.1:1", "[::1]:80", "[fe80::1]:65535", "a100-host-1.dc1.example:30000", "x:80"] {
            assert!(host_of(good).is_some(), "{good}");
        }
        for bad in [
            "::::80",
            "x:0",
            "a b c:80",
            "host",
            ":80",
            "host:",
            "host:65536",
            "host:+80",
            "[::1:80",
            "::1:80",
            "[nonsense]:80",
            "-host:80",
            "host-:80",
            "ho_st:80",
            "10.0.0.256:80",
            "a..b:80",
            "1.2.3:80",
        ] {
            assert_eq!(host_of(bad), None, "{bad}");
        }
        let node = |address: &str| format!(r#"{{"address": "{address}", "instance_type": "a2"}}"#);
        let err = Spec::from_json(Kind::Node, &node("a b c:80")).and_then(|s| validate_spec(&s)).unwrap_err();
        assert_eq!((err.field.as_str(), err.code), ("spec.address", ErrorCode::InvalidArgument), "{err}");
        assert!(err.reason.contains("\"a b c:80\" is not host:port"), "{err}");
    }

    #[test]
    fn a_service_priority_is_bounded() {
        let service = |json: &str| Spec::from_json(Kind::Service, json).and_then(|s| validate_spec(&s));
        let with = |priority: &str| format!(r#"{{"model": "m", "slo": {{"latency_ms": 5, "request_rate": 1}}, "priority": {priority}}}"#);
        assert!(service(&with(&MAX_SERVICE_PRIORITY.to_string())).is_ok());
        let err = service(&with(&(MAX_SERVICE_PRIORITY + 1).to_string())).unwrap_err();
        assert_eq!((err.field.as_str(), err.reason.as_str()), ("spec.priority", "must be 0-1000000 (got 1000001)"));
        assert_eq!(service(&with("-1")).unwrap_err().field, "spec.priority");
        // 0, the default, is left out of the encoding: a Service without one reads the same
        // on a controller that predates it.
        let plain = Spec::from_json(Kind::Service, &with("0")).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("priority"));
        let set = Spec::from_json(Kind::Service, &with("3")).unwrap();
        assert!(serde_json::to_string(&set).unwrap().contains("\"priority\":3"));
    }

    #[test]
    fn an_instance_types_limit_is_bounded_and_left_out_when_unset() {
        let it = |extra: &str| {
            let json = format!(r#"{{"gpu_model": "A100-80GB", "gpu_count": 8, "price_per_hour": 30, "launch_latency_s": 60{extra}}}"#);
            Spec::from_json(Kind::InstanceType, &json).and_then(|s| validate_spec(&s).map(|()| s))
        };
        assert!(it(&format!(r#", "max_instances": {MAX_INSTANCES_PER_TYPE}"#)).is_ok());
        assert!(it(r#", "max_instances": 0"#).is_ok(), "0: none may be launched");
        let err = it(&format!(r#", "max_instances": {}"#, MAX_INSTANCES_PER_TYPE + 1)).unwrap_err();
        assert_eq!((err.field.as_str(), err.reason.as_str()), ("spec.max_instances", "must be 0-200000 (got 200001)"));
        assert_eq!(it(r#", "max_instances": -1"#).unwrap_err().field, "spec.max_instances");
        // Unset, it is not encoded: an InstanceType without one reads the same on a
        // controller that predates it.
        assert!(!serde_json::to_string(&it("").unwrap()).unwrap().contains("max_instances"));
    }

    #[test]
    fn tenant_quotas_and_isolation_are_bounded() {
        let tenant = |json: &str| Spec::from_json(Kind::Tenant, json).and_then(|s| validate_spec(&s).map(|()| s));
        assert!(tenant(&format!(r#"{{"max_gpus": {MAX_TENANT_GPUS}, "max_cost_per_hour": {MAX_TENANT_COST_PER_HOUR}}}"#)).is_ok());
        assert!(tenant(r#"{"max_gpus": 0, "max_cost_per_hour": 0, "isolation": "dedicated"}"#).is_ok());
        for (json, field) in [
            (format!(r#"{{"max_gpus": {}}}"#, MAX_TENANT_GPUS * 2.0), "spec.max_gpus"),
            (r#"{"max_gpus": -0.5}"#.to_string(), "spec.max_gpus"),
            (format!(r#"{{"max_cost_per_hour": {}}}"#, MAX_TENANT_COST_PER_HOUR * 2.0), "spec.max_cost_per_hour"),
            (r#"{"max_cost_per_hour": -1}"#.to_string(), "spec.max_cost_per_hour"),
        ] {
            assert_eq!(tenant(&json).unwrap_err().field, field, "{json}");
        }
        let err = tenant(r#"{"isolation": "none"}"#).unwrap_err();
        assert!(err.field.starts_with("spec") && err.to_string().contains("none"), "{err}");
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
            tenant: String::new(),
            isolation: crate::Isolation::default(),
            batch_ms: 0.0,
        };
        let plan = |wls: Vec<WorkloadAssignment>| {
            Spec::Plan(PlanSpec {
                strategy: "igniter".into(),
                gpus: vec![GpuAssignment {
                    node: "n1".into(),
                    gpu_uuid: "GPU-1".into(),
                    mig_layout: vec![],
                    workloads: wls,
                    retiring: vec![],
                }]
                .into(),
                services: Default::default(),
                inputs_digest: String::new(),
                trace_parent: String::new(),
            })
        };
        assert!(validate_spec(&plan(vec![wl(60.0), wl(40.0)])).is_ok());
        let err = validate_spec(&plan(vec![wl(60.0), wl(50.0)])).unwrap_err();
        assert_eq!(err.field, "spec.gpus[0].workloads[1].mps_percent");
        for bad in [-1.0, f64::NAN, f64::INFINITY, MAX_LATENCY_MS * 2.0] {
            let err = validate_spec(&plan(vec![WorkloadAssignment { batch_ms: bad, ..wl(50.0) }])).unwrap_err();
            assert_eq!(err.field, "spec.gpus[0].workloads[0].batch_ms", "{bad}");
        }
        assert!(validate_spec(&plan(vec![WorkloadAssignment { batch_ms: 18.5, ..wl(50.0) }])).is_ok());
    }

    /// Paths are formatted only for an error: each names the GPU of the patch and the field.
    #[test]
    fn a_patchs_refusal_names_the_gpu_and_field() {
        let gpu = |node: &str, uuid: &str, batch: u32| crate::test_gpu(node, uuid, "s", batch);
        let patch = |set_gpus: Vec<GpuAssignment>| PlanPatch { set_gpus, ..Default::default() };
        let plan = PlanSpec::default();
        assert!(validate_plan_patch(&plan, &patch(vec![gpu("n1", "G1", 4), gpu("n2", "G2", 4)])).is_ok());
        for (bad, field) in [
            (gpu("n 2", "G2", 4), "patch.set_gpus[1].node"),
            (gpu("n2", "G\u{7}", 4), "patch.set_gpus[1].gpu_uuid"),
            (gpu("n2", "G2", 0), "patch.set_gpus[1].workloads[0].batch"),
            (gpu("n2", "G2", MAX_BATCH + 1), "patch.set_gpus[1].workloads[0].batch"),
        ] {
            let err = validate_plan_patch(&plan, &patch(vec![gpu("n1", "G1", 4), bad])).unwrap_err();
            assert_eq!(err.field, field);
            assert!(!err.reason.is_empty(), "{err}");
        }
    }
}
