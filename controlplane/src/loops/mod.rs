//! Leader-only loops: they start when this controller wins leadership and stop when it
//! loses it. They read committed state and write back through Raft like any client, so a
//! new leader simply runs them again (level-triggered: each pass recomputes from the whole
//! state).

mod autoscaler;
pub mod failure_detector;
mod metering;
mod provisioner;
mod runner;
mod tuner;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::cloud::NodeProvider;
use crate::controller::Controller;
use crate::provision::MigStrategy;
use crate::raft::consensus::LeadershipWatch;
use crate::tuning::TuningSettings;

/// Settings of the leader-only loops.
#[derive(Clone)]
pub struct LoopSettings {
    /// Re-provision at least this often (also on every change of services, nodes, profiles,
    /// GPU models or instance types).
    pub provision_interval: Duration,
    pub mig_strategy: MigStrategy,
    /// How often agents report (their heartbeat) while the fleet is small, and how often
    /// the failure detector checks.
    pub heartbeat_interval: Duration,
    /// Reports a second the whole fleet may send: past `budget × heartbeat` nodes, agents
    /// are told to report less often (`agents::report_pace`).
    pub report_budget_per_s: u32,
    /// KiB of reports a second whose observed state is written to statuses
    /// (`agents::status_pace`).
    pub status_write_kib_per_s: u32,
    /// Heartbeats a node may miss before it is marked unhealthy.
    pub missed_heartbeats: u32,
    /// How long after its agent's desired-state stream ended (with no report from a new
    /// one) a node is marked unhealthy: time for a live agent to reconnect and report.
    pub watch_grace: Duration,
    /// `false` turns every loop off (tests of the bare Raft cluster).
    pub enabled: bool,
    /// The autoscaler's node provider; `None`: no node is launched or terminated (services
    /// are still re-sized).
    pub provider: Option<Arc<dyn NodeProvider>>,
    /// Seconds the load must stay up before a service is sized up (HetSev's window).
    pub scale_window_s: f64,
    /// Seconds before a service is sized down or an idle launched node terminated.
    pub cooldown_s: f64,
    /// HetSev's λ: weight of the launch latency against the price, per second.
    pub lambda_per_s: f64,
    /// The highest throughput saturation a service is sized to (HetSev's 80%); each is sized
    /// below it as far as its SLO needs (`planner::policy::slo_headroom`).
    pub target_saturation: f64,
    /// Run the GSLICE tuner on the MPS-only GPUs of the committed plan.
    pub tuner: bool,
    /// How often the tuner feeds the reported windows to GSLICE's Algorithm 1.
    pub tune_interval: Duration,
    /// The tuner's latency target (a fraction of the SLO) and Algorithm 1's parameters
    /// (hold-down included).
    pub tuning: TuningSettings,
    /// How often the leader writes each Tenant's usage and SLO attainment into its status
    /// (`loops::metering`).
    pub metering_interval: Duration,
    /// Longest a workload the plan moved keeps serving in its old slot while its
    /// replacements never report ready (`provision::handover`).
    pub handover_max: Duration,
    /// Run planning passes on tokio's blocking pool (true everywhere but the deterministic
    /// simulation, whose replay needs every step on its own scheduler: a blocking-pool
    /// thread runs outside it).
    pub plan_off_runtime: bool,
}

impl std::fmt::Debug for LoopSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopSettings")
            .field("provision_interval", &self.provision_interval)
            .field("mig_strategy", &self.mig_strategy)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("report_budget_per_s", &self.report_budget_per_s)
            .field("status_write_kib_per_s", &self.status_write_kib_per_s)
            .field("missed_heartbeats", &self.missed_heartbeats)
            .field("watch_grace", &self.watch_grace)
            .field("enabled", &self.enabled)
            .field("provider", &self.provider.is_some())
            .field("scale_window_s", &self.scale_window_s)
            .field("cooldown_s", &self.cooldown_s)
            .field("lambda_per_s", &self.lambda_per_s)
            .field("target_saturation", &self.target_saturation)
            .field("tuner", &self.tuner)
            .field("tune_interval", &self.tune_interval)
            .field("tuning", &self.tuning)
            .field("metering_interval", &self.metering_interval)
            .field("handover_max", &self.handover_max)
            .field("plan_off_runtime", &self.plan_off_runtime)
            .finish()
    }
}

impl LoopSettings {
    pub fn report_pace(&self) -> crate::agents::ReportPace {
        crate::agents::ReportPace { heartbeat: self.heartbeat_interval, budget_per_s: self.report_budget_per_s }
    }
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings {
            provision_interval: Duration::from_secs(30),
            mig_strategy: MigStrategy::default(),
            heartbeat_interval: Duration::from_secs(1),
            report_budget_per_s: crate::agents::ReportPace::default().budget_per_s,
            status_write_kib_per_s: crate::agents::status_pace::DEFAULT_KIB_PER_S,
            missed_heartbeats: 5,
            watch_grace: Duration::from_secs(2),
            enabled: true,
            provider: None,
            scale_window_s: 60.0,
            cooldown_s: 300.0,
            lambda_per_s: 0.001,
            target_saturation: 0.8,
            tuner: true,
            tune_interval: Duration::from_secs(5),
            tuning: TuningSettings::default(),
            metering_interval: Duration::from_secs(10),
            handover_max: crate::provision::handover::HANDOVER_MAX,
            plan_off_runtime: true,
        }
    }
}

/// Writes a new plan as the Plan named `current`, compare-and-set on the version it was
/// computed from: a plan computed from an older state never overwrites a newer one. A change
/// of more than [`MAX_PATCH_CHANGES`] GPUs and predictions goes as several patches in a row,
/// pipelined (so no Raft entry grows with the fleet); one that fails
/// leaves the plan part-way, without its inputs digest, and the next pass patches the rest.
/// Returns the outcome of the last write.
async fn commit_plan(
    controller: &Controller,
    settings: &LoopSettings,
    change: PlanChange,
) -> Result<crate::state::CommandOutcome, crate::api::ApiError> {
    use crate::resources::{PlanSpec, Spec, MAX_PATCH_CHANGES};
    // No request id: every write is compare-and-set on the plan's version, so a retry cannot
    // apply twice, and a de-duplication record would hold the whole plan after the write
    // (each one written out whole in every snapshot: at 3,000 hosts, 30 plan writes made a
    // 428 MB snapshot).
    let write = |command| crate::state::Request { request_id: String::new(), command, trace_parent: None };
    // The agents' status writes wait: the plan is what they are all waiting for.
    let _status_held = controller.status_writer.hold_back().await;
    let (version, patch) = match change {
        PlanChange::First(plan) => {
            // The first plan is whole: check it as a whole (a GPU named twice could otherwise
            // land in two parts), then create an empty one and patch it. Both O(plan), off
            // the async workers.
            let (empty, patch) = off_runtime(settings, "checking the first plan", move |_cancel| {
                let spec = Spec::Plan(plan);
                crate::resources::validate_spec(&spec)?;
                let Spec::Plan(plan) = spec else { unreachable!("built above") };
                let empty = PlanSpec { strategy: plan.strategy.clone(), ..PlanSpec::default() };
                let patch = empty.diff(&plan);
                Ok::<_, crate::resources::FieldError>((empty, patch))
            })
            .await??;
            let created = controller
                .write(write(crate::state::Command::Put {
                    name: "current".into(),
                    tenant: String::new(),
                    spec: Spec::Plan(empty.clone()),
                    mode: crate::state::WriteMode::Create,
                    expected_version: 0,
                }))
                .await?;
            (created.resource.resource_version, patch)
        }
        PlanChange::Patch { patch, base_version } => (base_version, patch),
    };
    // Each part expects the version the one before leaves (every write adds one), so the
    // parts can be in flight together, in order; should one be refused (another write to
    // the plan came between), those after it are refused too.
    let parts: Vec<_> = patch
        .split(MAX_PATCH_CHANGES)
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            write(crate::state::Command::PatchPlan { name: "current".into(), patch: part, expected_version: version + i as u64 })
        })
        .collect();
    controller.write_chain(parts, PLAN_PARTS_IN_FLIGHT).await
}

/// Plan parts proposed and not yet committed at once: about 1 MiB of log (a few
/// AppendEntries messages' worth), so a re-plan of the whole fleet takes a few commit
/// round trips per megabyte instead of one per part, and writes behind it wait for no
/// more than that.
const PLAN_PARTS_IN_FLIGHT: usize = 8;

/// A new plan, as proposed: whole when there is none yet, else as the patch from the
/// committed one (which the proposal must still find at `base_version`).
pub(crate) enum PlanChange {
    First(crate::resources::PlanSpec),
    Patch { patch: crate::resources::PlanPatch, base_version: u64 },
}

impl PlanChange {
    /// From the committed plan (`base`, at its resource version) to `next`. O(both plans):
    /// call it where CPU work belongs (`off_runtime`).
    pub(crate) fn between(base: Option<(u64, &crate::resources::PlanSpec)>, mut next: crate::resources::PlanSpec) -> PlanChange {
        next.normalise();
        match base {
            None => PlanChange::First(next),
            Some((base_version, current)) => PlanChange::Patch { patch: current.diff(&next), base_version },
        }
    }
}

/// Runs the loop `run` until aborted; should it panic, the panic is counted as a failed
/// pass (`gpuplane_loop_failures_total{loop}`), logged with its message, and the loop starts
/// again after a pause: one defect never stops a loop for the rest of a leadership.
fn supervise<F>(
    name: &'static str,
    controller: &Controller,
    settings: &LoopSettings,
    run: fn(Controller, LoopSettings) -> F,
) -> JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    /// Aborts the loop when the supervisor is aborted (a dropped JoinHandle would not).
    struct AbortOnDrop(tokio::task::AbortHandle);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let (controller, settings) = (controller.clone(), settings.clone());
    tokio::spawn(async move {
        loop {
            let task = tokio::spawn(run(controller.clone(), settings.clone()));
            let _guard = AbortOnDrop(task.abort_handle());
            match task.await {
                Err(e) if e.is_panic() => {
                    controller.telemetry.observe_loop_outcome(name, true);
                    tracing::error!(loop_name = name, panic = %panic_message(e.into_panic()), "a leader loop panicked; restarting it");
                    tokio::time::sleep(RESTART_PAUSE).await;
                }
                // Returned or cancelled: nothing to supervise any more.
                _ => return,
            }
        }
    })
}

/// Pause before a panicked loop starts again, so a loop that panics at once cannot spin.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// The message of a panic payload.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Set when the caller of [`off_runtime`] is gone (its loop was aborted: leadership moved):
/// the work checks it between steps and stops, instead of planning for nobody.
#[derive(Clone, Default)]
pub(crate) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Sets the flag when dropped: when the future awaiting the work is dropped, which is what
/// aborting a loop does.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        (self.0).0.store(true, Ordering::Relaxed);
    }
}

/// Runs CPU-bound work (a planning pass) on tokio's blocking pool: never on the runtime's
/// worker threads, where it would starve Raft's heartbeats and the API. A blocking task
/// cannot be aborted, so the work gets a [`Cancel`] that is set once nobody awaits it any
/// more, and stops at its next check; what runs between checks must be bounded (the
/// planner's bounds see to that). A panic comes back as an error naming `what`.
pub(crate) async fn off_runtime<T: Send + 'static>(
    settings: &LoopSettings,
    what: &str,
    work: impl FnOnce(Cancel) -> T + Send + 'static,
) -> Result<T, crate::api::ApiError> {
    let failed = |reason: String| crate::api::ApiError::Internal(format!("{what} failed: {reason}"));
    let cancel = Cancel::default();
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    if !settings.plan_off_runtime {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(cancel))).map_err(|p| failed(panic_message(p)));
    }
    tokio::task::spawn_blocking(move || work(cancel))
        .await
        .map_err(|e| failed(if e.is_panic() { panic_message(e.into_panic()) } else { e.to_string() }))
}

/// Watches leadership and runs the loops while this node leads.
pub fn spawn(controller: Controller, settings: LoopSettings) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !settings.enabled {
            return;
        }
        let mut leadership = LeadershipWatch::new(&controller.raft);
        let mut running: Vec<JoinHandle<()>> = Vec::new();
        loop {
            let leading = leadership.current().1 == Some(controller.id);
            match (leading, running.is_empty()) {
                (true, true) => {
                    tracing::info!(
                        tuner = settings.tuner,
                        "leader: starting the provisioner, the failure detector, the autoscaler, the metering and the tuner"
                    );
                    running.push(supervise("provisioner", &controller, &settings, provisioner::run));
                    running.push(supervise("failure_detector", &controller, &settings, failure_detector::run));
                    running.push(supervise("autoscaler", &controller, &settings, autoscaler::run));
                    running.push(supervise("metering", &controller, &settings, metering::run));
                    if settings.tuner {
                        running.push(supervise("tuner", &controller, &settings, tuner::run));
                    }
                }
                (false, false) => {
                    tracing::info!("no longer leader: stopping the loops");
                    for task in running.drain(..) {
                        task.abort();
                    }
                    // A failure streak is this leader's: a follower has no loop to be unready for.
                    controller.telemetry.reset_loop_outcomes();
                    // As are the services' usage series the metering set.
                    controller.telemetry.set_service_usage(&Default::default());
                }
                _ => {}
            }
            if !leadership.changed().await {
                break;
            }
        }
        for task in running {
            task.abort();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_whose_loop_is_aborted_is_told_to_stop() {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            off_runtime(&LoopSettings::default(), "test planning", move |cancel| {
                started_tx.send(()).unwrap();
                // Steps of planning, checking between them (bounded: a minute at most).
                let mut steps = 0;
                while !cancel.is_set() && steps < 60_000 {
                    std::thread::sleep(Duration::from_millis(1));
                    steps += 1;
                }
                done_tx.send(cancel.is_set()).unwrap();
            })
            .await
        });
        started_rx.await.unwrap();
        // Leadership moved: the loop (and the pass awaiting the work) is aborted.
        task.abort();
        assert!(done_rx.await.unwrap(), "the work stopped because it was told to, not at its bound");
    }

    #[tokio::test]
    async fn work_that_completes_is_never_told_to_stop() {
        let seen = off_runtime(&LoopSettings::default(), "test planning", |cancel| cancel.is_set()).await.unwrap();
        assert!(!seen);
    }
}
