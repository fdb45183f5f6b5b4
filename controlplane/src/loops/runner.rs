//! The one way a leader loop runs. A loop is a [`Reconciler`]: what it reads of the committed
//! state and the agents' reports (its view), and a pure pass from that view and the time to
//! what it decides (writes, node-provider calls, when to run again). The runner owns the
//! rest: the schedule, the read barrier for loops that ask for one, running a long pass off
//! the async workers, request ids, proposing (several writes in flight), the provider calls,
//! and the loop's timing and outcome metrics (`gpuplane_loop_*{loop}`, `/readyz`).

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::{commit_plan, off_runtime, LoopSettings, PlanChange};
use crate::api::ApiError;
use crate::controller::Controller;
use crate::resources::InstanceTypeSpec;
use crate::state::{Command, Request};

/// Writes of one pass proposed at once: Raft entries share them (`raft::Proposer`), so a mass
/// failure of a hundred hosts is marked in a few commit round trips, not a hundred.
const WRITES_IN_FLIGHT: usize = 64;

/// A write a pass asks for.
pub(crate) enum Write {
    /// A command. `repeatable`: writing it again is the same write (an unhealthy mark, a
    /// usage figure), so it goes without a request id, whose de-duplication record would
    /// stay in the state (and in every snapshot) for 100,000 writes; otherwise the runner
    /// gives it a fresh one, so that a retried proposal cannot apply twice.
    Command { command: Command, repeatable: bool },
    /// A new plan, compare-and-set on the version it was computed from (`commit_plan`).
    Plan(PlanChange),
}

/// A call to the node provider (`cloud::NodeProvider`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ProviderCall {
    Launch { node: String, instance_type: String, spec: InstanceTypeSpec },
    Terminate { node: String },
}

/// What one pass decided.
#[derive(Default)]
pub(crate) struct Pass {
    /// Made first, in order.
    pub calls: Vec<ProviderCall>,
    /// Proposed after the calls, several at once.
    pub writes: Vec<Write>,
    /// When to run again, from this pass's start; the loop's interval when `None`.
    pub next_in: Option<Duration>,
}

/// What became of a pass's calls and writes, each in the pass's order. A write's `Ok` is the
/// resource version it left.
pub(crate) struct Settled {
    pub calls: Vec<Result<(), String>>,
    pub writes: Vec<Result<u64, ApiError>>,
    /// How long the pass itself took (the view and the writes not included).
    pub pass_time: Duration,
}

/// A leader loop.
pub(crate) trait Reconciler: Send + 'static {
    /// Its name in logs and metrics.
    const NAME: &'static str;
    /// Confirm leadership before reading (a pass that rewrites what a newer leader may have
    /// committed).
    const READ_BARRIER: bool = false;
    /// The pass is O(plan) or plans: it runs on the blocking pool, never on the async workers
    /// where it would starve Raft's heartbeats and the API.
    const LONG_PASS: bool = false;
    /// What a pass reads.
    type View: Send + 'static;

    /// How often it runs.
    fn interval(&self) -> Duration;
    /// How long a new leader waits before the first pass.
    fn first_wait(&self) -> Duration {
        Duration::ZERO
    }
    /// Resolves when something the loop depends on changed, to run the next pass before its
    /// interval is up; by default nothing does.
    fn woken(&mut self) -> impl std::future::Future<Output = ()> + Send {
        std::future::pending()
    }
    /// The span a pass runs in (by default none).
    fn span(&mut self) -> tracing::Span {
        tracing::Span::none()
    }
    /// Copies what the pass needs out of the committed state and the reports (cheap, under
    /// their locks: the work belongs in [`Reconciler::pass`]). With `LONG_PASS` it runs on
    /// the blocking pool as well.
    fn view(&mut self, controller: &Controller) -> Self::View;
    /// The pass: pure, from the view at `now` to what it decides. A long one checks
    /// `cancelled` between its steps and stops early once it is set (the loop was aborted:
    /// leadership moved).
    fn pass(&mut self, view: Self::View, now: Instant, cancelled: &dyn Fn() -> bool) -> Pass;
    /// What became of the pass's calls and writes (for the loop's memory and its logs).
    fn settled(&mut self, _controller: &Controller, _settled: Settled) {}
}

/// Runs `reconciler` until the task is aborted (this controller stopped leading). A pass that
/// panics takes the loop with it; `supervise` counts it and starts the loop afresh.
pub(crate) async fn run<R: Reconciler>(controller: Controller, settings: LoopSettings, mut reconciler: R) {
    tokio::time::sleep(reconciler.first_wait()).await;
    let mut next = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = reconciler.woken() => {}
        }
        let started = Instant::now();
        let interval = reconciler.interval();
        let span = reconciler.span();
        let (pass, failed) = match one_pass(&controller, &settings, reconciler, started).instrument(span).await {
            Ok((r, next_in, failed)) => {
                reconciler = r;
                (next_in, failed)
            }
            Err(Lost(message)) => std::panic::panic_any(message),
        };
        controller.telemetry.observe_loop_pass(R::NAME, started.elapsed());
        controller.telemetry.observe_loop_outcome(R::NAME, failed);
        next = started + pass.unwrap_or(interval);
    }
}

/// A pass that panicked on the blocking pool, with the loop's memory.
struct Lost(String);

/// One pass: the loop's memory back, its next wake-up and whether it failed.
async fn one_pass<R: Reconciler>(
    controller: &Controller,
    settings: &LoopSettings,
    mut reconciler: R,
    now: Instant,
) -> Result<(R, Option<Duration>, bool), Lost> {
    if R::READ_BARRIER {
        if let Err(e) = controller.read_barrier().await {
            tracing::warn!(loop_name = R::NAME, error = %e, "pass skipped: leadership not confirmed");
            return Ok((reconciler, None, true));
        }
    }
    // A long pass's view is read on the blocking pool too: it may copy what every node
    // reported.
    let (pass, pass_time) = if R::LONG_PASS {
        let handle = controller.clone();
        let done = off_runtime(settings, R::NAME, move |cancel| {
            let view = reconciler.view(&handle);
            let computing = std::time::Instant::now();
            let pass = reconciler.pass(view, now, &|| cancel.is_set());
            (reconciler, pass, computing.elapsed())
        })
        .await;
        match done {
            Ok((r, pass, pass_time)) => {
                reconciler = r;
                (pass, pass_time)
            }
            Err(e) => return Err(Lost(e.to_string())),
        }
    } else {
        let view = reconciler.view(controller);
        let computing = std::time::Instant::now();
        (reconciler.pass(view, now, &|| false), computing.elapsed())
    };
    let Pass { calls, writes, next_in } = pass;
    let calls = make_calls(settings, &calls);
    let writes: Vec<Result<u64, ApiError>> =
        futures::stream::iter(writes).map(|w| propose(controller, settings, w)).buffered(WRITES_IN_FLIGHT).collect().await;
    let failed = writes.iter().any(Result::is_err);
    for e in writes.iter().filter_map(|w| w.as_ref().err()) {
        tracing::debug!(loop_name = R::NAME, error = %e, "write failed");
    }
    reconciler.settled(controller, Settled { calls, writes, pass_time });
    Ok((reconciler, next_in, failed))
}

fn make_calls(settings: &LoopSettings, calls: &[ProviderCall]) -> Vec<Result<(), String>> {
    calls
        .iter()
        .map(|call| {
            let Some(provider) = &settings.provider else { return Err("no node provider is configured".to_string()) };
            match call {
                ProviderCall::Launch { node, instance_type, spec } => provider.launch(node, instance_type, spec),
                ProviderCall::Terminate { node } => provider.terminate(node),
            }
        })
        .collect()
}

async fn propose(controller: &Controller, settings: &LoopSettings, write: Write) -> Result<u64, ApiError> {
    match write {
        Write::Command { command, repeatable } => {
            let request_id = if repeatable { String::new() } else { uuid::Uuid::new_v4().to_string() };
            let outcome = controller.write(Request { request_id, command, trace_parent: None }).await?;
            Ok(outcome.resource.resource_version)
        }
        Write::Plan(change) => Ok(commit_plan(controller, settings, change).await?.resource.resource_version),
    }
}
