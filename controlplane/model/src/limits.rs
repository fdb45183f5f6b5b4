//! Every bound on a number or a list that drives memory or computation, in one place.
//! Validation checks them before anything is proposed (and `gpuctl plan` offline uses the
//! same checks); README's "Limits" table lists [`LIMITS`] and a test keeps the two equal.
//!
//! The bounds are generous for real fleets and small enough that the planner's work per
//! service stays bounded: a hostile manifest that passes them still plans in bounded time
//! and memory (the planner guards its own arithmetic too, see `planner::bounds`).

/// Longest resource or field name.
pub const MAX_NAME_LEN: usize = 128;
/// Largest latency SLO and profiled latency, ms: a minute is far beyond interactive inference.
pub const MAX_LATENCY_MS: f64 = 60_000.0;
/// Largest request rate of one service (and profiled throughput of one process), req/s.
pub const MAX_REQUEST_RATE: f64 = 10_000_000.0;
/// Smallest profiled throughput of one process, req/s. The planner divides rates by
/// throughputs; at 10^7 req/s over 10^-2 req/s a service would want 10^9 processes, which
/// the planner refuses as too large rather than allocating for.
pub const MIN_THROUGHPUT_RPS: f64 = 0.01;
/// Smallest request rate of a service, req/s (one request in about 17 minutes): a rate
/// far below it is no demand the planner can size (1e-300 req/s sized nothing and failed).
pub const MIN_REQUEST_RATE: f64 = 0.001;
/// Longest client request id (the idempotency key of a write), bytes: every controller
/// remembers the last 100,000 of them (the state machine's de-duplication window).
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Bearer tokens a Service's endpoints accept (`spec.inference_tokens`): each gets an equal
/// share of a router's requests in flight, so more would leave each too little.
pub const MAX_INFERENCE_TOKENS: usize = 16;
/// A ServingRuntime's launch: its arguments, its environment variables, the length of the
/// program, of one argument or value, and of an environment variable's name. A server's
/// command line is a few dozen arguments; these bound what every agent copies per process.
pub const MAX_RUNTIME_ARGS: usize = 128;
pub const MAX_RUNTIME_ENV: usize = 64;
pub const MAX_RUNTIME_TEXT_LEN: usize = 4096;
pub const MAX_ENV_NAME_LEN: usize = 128;
/// A ServingRuntime's expected cold start (launch to ready), s: an LLM server loading
/// weights takes minutes, not hours.
pub const MAX_COLD_START_S: f64 = 3600.0;
/// A Service's `model_uri` (a path or URI its runtime understands).
pub const MAX_MODEL_URI_LEN: usize = 4096;
/// Encoded bytes of the observed state (GPUs, MIG instances, workloads) of one agent
/// report, and so of a Node's status: an 8-GPU host running 7 instances with a shadow each
/// reports about 17 KB.
pub const MAX_REPORTED_OBSERVED_BYTES: usize = 128 * 1024;
/// A tenant's `max_gpus` when its spec sets none, GPUs-worth: every tenant's demand is
/// bounded, and planning work with it (`provision::budget`). An operator gives a tenant
/// more by setting `max_gpus`, up to [`MAX_TENANT_GPUS`].
pub const DEFAULT_TENANT_MAX_GPUS: f64 = 1000.0;
/// Largest batch size anywhere (profile points, batch distributions, plans). Inference
/// servers batch tens to a few hundred requests; PARIS tabulates its distribution per batch.
pub const MAX_BATCH: u32 = planner::bounds::MAX_BATCH;
/// Most MPS client processes of one workload (NVIDIA MPS serves up to 48 clients per GPU).
pub const MAX_PROCESSES: u32 = 48;
/// Bounds of a log-normal batch distribution's µ and σ (of ln batch): beyond them the
/// distribution is all at batch 1 or all at `max_batch`.
pub const MAX_LOGNORMAL_MU_ABS: f64 = 20.0;
pub const MAX_LOGNORMAL_SIGMA: f64 = 10.0;
/// Points of one ModelProfile.
pub const MAX_PROFILE_POINTS: usize = 1024;
/// GPU models a service may be restricted to, and instance types it may scale on.
pub const MAX_ALLOWED_GPU_MODELS: usize = 32;
pub const MAX_ALLOWED_INSTANCE_TYPES: usize = 64;
/// GPUs of one node and of one instance type (the largest servers carry 16).
pub const MAX_GPUS_PER_NODE: usize = 64;
/// Labels of one node, and the length of a label key and value (Kubernetes' figures).
pub const MAX_LABELS: usize = 64;
pub const MAX_LABEL_KEY_LEN: usize = 63;
pub const MAX_LABEL_VALUE_LEN: usize = 256;
/// Length of a node agent's `host:port` and of a GPU uuid.
pub const MAX_ADDRESS_LEN: usize = 261;
pub const MAX_UUID_LEN: usize = 128;
/// Free text (a tenant's display name).
pub const MAX_DISPLAY_NAME_LEN: usize = 256;
/// Services one tenant may declare (`max_services` may be set lower, not higher).
pub const MAX_SERVICES_PER_TENANT: u32 = 10_000;
/// A Service's `priority` (within its tenant).
pub const MAX_SERVICE_PRIORITY: u32 = 1_000_000;
/// Streaming multiprocessors of a GPU model (an H100 has 132).
pub const MAX_SM_COUNT: u32 = 1024;
/// MIG geometry: slices per GPU, profiles per GPU model, legal starts per profile.
pub const MAX_MIG_SLICES: u8 = 8;
pub const MAX_MIG_PROFILES: usize = 16;
/// iGniter's allocation unit, percent: the search steps from r_unit to r_max one unit at a
/// time, so a tiny unit would make it take unbounded time (the planner refuses below 1%).
pub const MIN_IGNITER_R_UNIT_PCT: f64 = 1.0;
/// Magnitude of any fitted iGniter coefficient.
pub const MAX_COEFFICIENT_ABS: f64 = 1e9;
/// Launch latency of an instance type, s (a day).
pub const MAX_LAUNCH_LATENCY_S: f64 = 86_400.0;
/// Price of an instance type per hour.
pub const MAX_PRICE_PER_HOUR: f64 = 10_000.0;
/// An instance type's `max_instances`: a fleet never needs more instances than GPUs.
pub const MAX_INSTANCES_PER_TYPE: u32 = MAX_PLAN_GPUS as u32;
/// Tenant weight in fair sharing.
pub const MAX_TENANT_WEIGHT: f64 = 1e6;
/// A tenant's `max_gpus` (GPUs-worth): every GPU a plan may hold.
pub const MAX_TENANT_GPUS: f64 = MAX_PLAN_GPUS as f64;
/// A tenant's `max_cost_per_hour`: every GPU a plan may hold at the highest price.
pub const MAX_TENANT_COST_PER_HOUR: f64 = MAX_TENANT_GPUS * MAX_PRICE_PER_HOUR;
/// Encoded size of one resource's spec (a Plan is the provisioner's and may be larger), so
/// that a page of a list and a watch event always fit a gRPC message.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
/// GPUs of one Plan (the fleet design point is 10,000 hosts of 8 GPUs) and workloads or MIG
/// instances on one GPU.
pub const MAX_PLAN_GPUS: usize = 200_000;
pub const MAX_WORKLOADS_PER_GPU: usize = 128;
/// A node's report: metrics rows (one per service it serves) and observed workloads per GPU.
pub const MAX_REPORTED_SERVICES: usize = 1024;
pub const MAX_REPORTED_WORKLOADS_PER_GPU: usize = 256;
/// Largest reported latency (ms), rate (req/s) and failure count per report.
pub const MAX_REPORTED_LATENCY_MS: f64 = 3_600_000.0;
pub const MAX_REPORTED_FAILED: u64 = 1_000_000_000;

/// Puts in one batch (`PutMany`, what `gpuctl apply` sends) and the encoded size of their
/// specs together: one batch is one Raft entry, which must stay well inside one
/// AppendEntries message (`raft::log_store::MAX_APPEND_BYTES`).
pub const MAX_BATCH_PUTS: usize = 500;
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// Node statuses one Raft entry carries (`PutStatuses`, the leader's status writer). It
/// also stops adding reports to an entry at [`MAX_STATUS_ENTRY_BYTES`] of reports (one
/// larger report still goes alone), so an entry stays well inside one AppendEntries message.
pub const MAX_STATUSES_PER_ENTRY: usize = 64;
pub const MAX_STATUS_ENTRY_BYTES: usize = 256 * 1024;

/// Client requests the leader's proposer puts in one Raft entry (group commit), and their
/// encoded size together (one larger request goes alone): one flush and one round of
/// replication for many writes, and an entry well inside one AppendEntries message.
pub const MAX_REQUESTS_PER_ENTRY: usize = 256;
pub const MAX_PROPOSAL_BYTES: usize = 256 * 1024;

/// One row of README's "Limits" table.
pub struct Limit {
    pub name: &'static str,
    pub value: String,
    pub why: &'static str,
}

fn row(name: &'static str, value: impl ToString, why: &'static str) -> Limit {
    Limit { name, value: value.to_string(), why }
}

/// Every bound above, as README's "Limits" table lists it.
pub fn limits() -> Vec<Limit> {
    vec![
        row("MAX_NAME_LEN", MAX_NAME_LEN, "resource and referenced names"),
        row(
            "MAX_LATENCY_MS",
            MAX_LATENCY_MS,
            "SLO, profiled latency and a plan's predicted batch time (`batch_ms`); a minute is far beyond interactive inference",
        ),
        row("MAX_REQUEST_RATE", MAX_REQUEST_RATE, "request rate of a service, profiled throughput of a process"),
        row("MIN_THROUGHPUT_RPS", MIN_THROUGHPUT_RPS, "the planner divides rates by throughputs"),
        row("MAX_REQUEST_ID_LEN", MAX_REQUEST_ID_LEN, "a write's request id (its idempotency key, remembered by every controller)"),
        row(
            "MIN_REQUEST_RATE",
            MIN_REQUEST_RATE,
            "request rate of a service (and an autoscaling range's ends): one request in about 17 minutes",
        ),
        row("MAX_BATCH", MAX_BATCH, "batch sizes; PARIS tabulates its distribution per batch"),
        row("MAX_PROCESSES", MAX_PROCESSES, "MPS serves up to 48 clients per GPU"),
        row("MAX_LOGNORMAL_MU_ABS", MAX_LOGNORMAL_MU_ABS, "beyond it the distribution is all at one end"),
        row("MAX_LOGNORMAL_SIGMA", MAX_LOGNORMAL_SIGMA, "beyond it the distribution is all at the ends"),
        row("MAX_PROFILE_POINTS", MAX_PROFILE_POINTS, "points of one ModelProfile"),
        row("MAX_ALLOWED_GPU_MODELS", MAX_ALLOWED_GPU_MODELS, "a service's GPU model restriction (no duplicates)"),
        row("MAX_ALLOWED_INSTANCE_TYPES", MAX_ALLOWED_INSTANCE_TYPES, "a service's instance type restriction (no duplicates)"),
        row("MAX_GPUS_PER_NODE", MAX_GPUS_PER_NODE, "GPUs of a node and of an instance type"),
        row("MAX_LABELS", MAX_LABELS, "labels of a node"),
        row("MAX_LABEL_KEY_LEN", MAX_LABEL_KEY_LEN, "Kubernetes' label name length"),
        row("MAX_LABEL_VALUE_LEN", MAX_LABEL_VALUE_LEN, "label values"),
        row("MAX_ADDRESS_LEN", MAX_ADDRESS_LEN, "host:port of an agent or a router"),
        row("MAX_UUID_LEN", MAX_UUID_LEN, "GPU uuids"),
        row("MAX_DISPLAY_NAME_LEN", MAX_DISPLAY_NAME_LEN, "a tenant's display name"),
        row("MAX_SERVICES_PER_TENANT", MAX_SERVICES_PER_TENANT, "services of one tenant; `max_services` may only lower it"),
        row("MAX_SM_COUNT", MAX_SM_COUNT, "streaming multiprocessors of a GPU model"),
        row("MAX_MIG_SLICES", MAX_MIG_SLICES, "MIG compute and memory slices of a GPU"),
        row("MAX_MIG_PROFILES", MAX_MIG_PROFILES, "MIG profiles of a GPU model"),
        row("MIN_IGNITER_R_UNIT_PCT", MIN_IGNITER_R_UNIT_PCT, "iGniter steps shares by r_unit up to r_max"),
        row("MAX_COEFFICIENT_ABS", MAX_COEFFICIENT_ABS, "any fitted iGniter coefficient"),
        row("MAX_LAUNCH_LATENCY_S", MAX_LAUNCH_LATENCY_S, "an instance type's launch latency"),
        row("MAX_PRICE_PER_HOUR", MAX_PRICE_PER_HOUR, "an instance type's price"),
        row("MAX_INSTANCES_PER_TYPE", MAX_INSTANCES_PER_TYPE, "an instance type's max_instances (the cloud account's limit)"),
        row("MAX_TENANT_WEIGHT", MAX_TENANT_WEIGHT, "a tenant's fair-share weight"),
        row("MAX_TENANT_GPUS", MAX_TENANT_GPUS, "a tenant's `max_gpus` quota (GPUs-worth)"),
        row(
            "DEFAULT_TENANT_MAX_GPUS",
            DEFAULT_TENANT_MAX_GPUS,
            "a tenant's `max_gpus` when its spec sets none: no tenant is unlimited by default",
        ),
        row("MAX_TENANT_COST_PER_HOUR", MAX_TENANT_COST_PER_HOUR, "a tenant's `max_cost_per_hour` quota"),
        row(
            "MAX_INFERENCE_TOKENS",
            MAX_INFERENCE_TOKENS,
            "bearer tokens a Service's endpoints accept, each with an equal share of a router",
        ),
        row("MAX_SPEC_BYTES", MAX_SPEC_BYTES, "encoded spec of a resource other than a Plan"),
        row("MAX_PLAN_GPUS", MAX_PLAN_GPUS, "GPUs of one Plan"),
        row("MAX_WORKLOADS_PER_GPU", MAX_WORKLOADS_PER_GPU, "workloads and MIG instances on one planned GPU"),
        row("MAX_REPORTED_SERVICES", MAX_REPORTED_SERVICES, "metrics rows of one agent report"),
        row("MAX_REPORTED_WORKLOADS_PER_GPU", MAX_REPORTED_WORKLOADS_PER_GPU, "observed workloads per GPU in a report"),
        row(
            "MAX_REPORTED_OBSERVED_BYTES",
            MAX_REPORTED_OBSERVED_BYTES,
            "encoded observed state of one agent report, and so of a Node's status",
        ),
        row("MAX_REPORTED_LATENCY_MS", MAX_REPORTED_LATENCY_MS, "a reported p99"),
        row("MAX_REPORTED_FAILED", MAX_REPORTED_FAILED, "failed requests in one report"),
        row("MAX_BATCH_PUTS", MAX_BATCH_PUTS, "resources in one batch of puts (one Raft entry)"),
        row("MAX_BATCH_BYTES", MAX_BATCH_BYTES, "encoded specs of one batch of puts, together"),
        row("MAX_STATUSES_PER_ENTRY", MAX_STATUSES_PER_ENTRY, "agents' observed states the leader writes in one Raft entry"),
        row(
            "MAX_STATUS_ENTRY_BYTES",
            MAX_STATUS_ENTRY_BYTES,
            "encoded reports whose states share one Raft entry (a larger one goes alone)",
        ),
        row("MAX_REQUESTS_PER_ENTRY", MAX_REQUESTS_PER_ENTRY, "client requests the leader commits together in one Raft entry"),
        row("MAX_PROPOSAL_BYTES", MAX_PROPOSAL_BYTES, "encoded requests that share one Raft entry (a larger one goes alone)"),
        row("MAX_RUNTIME_ARGS", MAX_RUNTIME_ARGS, "arguments of a ServingRuntime's launch"),
        row("MAX_RUNTIME_ENV", MAX_RUNTIME_ENV, "environment variables of a ServingRuntime's launch"),
        row("MAX_RUNTIME_TEXT_LEN", MAX_RUNTIME_TEXT_LEN, "bytes of a ServingRuntime's program, one argument or one value"),
        row("MAX_ENV_NAME_LEN", MAX_ENV_NAME_LEN, "bytes of an environment variable's name"),
        row("MAX_COLD_START_S", MAX_COLD_START_S, "a ServingRuntime's expected launch-to-ready time, s"),
        row("MAX_MODEL_URI_LEN", MAX_MODEL_URI_LEN, "bytes of a Service's `model_uri`"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README's "Limits" table must list every bound with its value.
    #[test]
    fn readme_lists_every_limit_with_its_value() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
        for limit in limits() {
            let row = format!("| `{}` | {} | {} |", limit.name, limit.value, limit.why);
            assert!(readme.contains(&row), "README.md lacks the row {row}");
        }
    }
}
