//! Runs a [`ShadowPolicy`] for one workload: feeds it the router's windows, probes Ready,
//! performs switches on the router, drains and stops retired processes.

use super::{Action, BackendId, Event, FailoverConfig, ShadowPolicy, SwitchReason};
use crate::router::{Backend, BackendSpec, Router, RouterError};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

/// What the supervisor does for the controller.
pub trait ProcessControl: Send + Sync + 'static {
    /// Stops a process that has drained (or a standby no longer wanted).
    fn stop(&self, backend: &BackendSpec) -> impl Future<Output = Result<(), String>> + Send;
    /// The workload has no standby: start one and call [`ShadowHandle::shadow_started`].
    fn shadow_wanted(&self);
}

/// A switch the controller performed.
#[derive(Debug, Clone)]
pub struct SwitchRecord {
    pub from: BackendId,
    pub to: BackendId,
    pub reason: SwitchReason,
    /// When the policy decided.
    pub decided_at: Instant,
    /// The router's pointer store.
    pub store_time: Duration,
}

enum Command {
    ShadowStarted(Arc<Backend>),
    Resize(Arc<Backend>),
}

/// Feeds the controller from outside (the supervisor).
#[derive(Clone)]
pub struct ShadowHandle {
    commands: mpsc::Sender<Command>,
    switches: broadcast::Sender<SwitchRecord>,
}

#[derive(Debug, thiserror::Error)]
#[error("the shadow controller has stopped")]
pub struct ControllerStopped;

impl ShadowHandle {
    /// A standby process is up (or starting): probe it and keep it for failover.
    pub async fn shadow_started(&self, backend: Arc<Backend>) -> Result<(), ControllerStopped> {
        self.commands.send(Command::ShadowStarted(backend)).await.map_err(|_| ControllerStopped)
    }

    /// `backend` runs the workload at its new size: switch to it once Ready.
    pub async fn resize(&self, backend: Arc<Backend>) -> Result<(), ControllerStopped> {
        self.commands.send(Command::Resize(backend)).await.map_err(|_| ControllerStopped)
    }

    pub fn subscribe_switches(&self) -> broadcast::Receiver<SwitchRecord> {
        self.switches.subscribe()
    }
}

/// One workload's failover loop.
pub struct ShadowController<P: ProcessControl> {
    router: Router,
    policy: ShadowPolicy,
    backends: HashMap<BackendId, Arc<Backend>>,
    control: Arc<P>,
    probe_interval: Duration,
    commands: mpsc::Receiver<Command>,
    switches: broadcast::Sender<SwitchRecord>,
}

impl<P: ProcessControl> ShadowController<P> {
    /// `active` must be in the router's active set. The loop runs while a handle lives.
    pub fn new(router: Router, active: Arc<Backend>, config: FailoverConfig, control: Arc<P>) -> (Self, ShadowHandle) {
        let (tx, commands) = mpsc::channel(64);
        let (switches, _) = broadcast::channel(1024);
        let handle = ShadowHandle { commands: tx, switches: switches.clone() };
        let policy = ShadowPolicy::new(config, active.id());
        let backends = HashMap::from([(active.id().to_string(), active)]);
        let controller =
            ShadowController { router, policy, backends, control, probe_interval: Duration::from_millis(50), commands, switches };
        (controller, handle)
    }

    pub fn with_probe_interval(mut self, every: Duration) -> Self {
        self.probe_interval = every;
        self
    }

    /// Runs until every [`ShadowHandle`] is dropped; background probes, drains and stops
    /// are cancelled then.
    pub async fn run(mut self) {
        let mut windows = self.router.subscribe_windows();
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let mut tasks = JoinSet::new();
        loop {
            let event = tokio::select! {
                command = self.commands.recv() => match command {
                    None => break,
                    Some(Command::ShadowStarted(b)) => self.register(b, Event::ShadowStarted),
                    Some(Command::Resize(b)) => self.register(b, Event::Resize),
                },
                window = windows.recv() => match window {
                    Ok(stats) => Event::Window(stats),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "shadow controller lagged behind the router's windows");
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                Some(event) = events.recv() => event,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            };
            let decided_at = Instant::now();
            for action in self.policy.on_event(event) {
                self.execute(action, decided_at, &events_tx, &mut tasks);
            }
        }
        tasks.abort_all();
    }

    fn register(&mut self, backend: Arc<Backend>, event: fn(BackendId) -> Event) -> Event {
        let id = backend.id().to_string();
        self.backends.insert(id.clone(), backend);
        event(id)
    }

    fn execute(&mut self, action: Action, decided_at: Instant, events: &mpsc::UnboundedSender<Event>, tasks: &mut JoinSet<()>) {
        match action {
            Action::ProbeReady(id) => {
                let Some(backend) = self.backends.get(&id).cloned() else { return };
                let (events, every) = (events.clone(), self.probe_interval);
                tasks.spawn(async move {
                    loop {
                        if let Ok(r) = backend.ready().await {
                            if r.ready {
                                let _ = events.send(Event::Ready(id));
                                return;
                            }
                        }
                        tokio::time::sleep(every).await;
                    }
                });
            }
            Action::Switch { from, to, reason } => {
                let Some(new) = self.backends.get(&to).cloned() else {
                    tracing::error!(%to, "switch to an unknown backend");
                    return;
                };
                match self.router.replace(&from, new) {
                    Ok(swap) => {
                        for retired in swap.retired() {
                            let events = events.clone();
                            tasks.spawn(async move {
                                retired.drained().await;
                                let _ = events.send(Event::Drained(retired.id().to_string()));
                            });
                        }
                        let record = SwitchRecord { from, to, reason, decided_at, store_time: swap.store_time };
                        let _ = self.switches.send(record);
                    }
                    Err(e @ RouterError::NotActive(_)) => tracing::error!(error = %e, "switch not applied"),
                    Err(e) => tracing::error!(error = %e, "switch failed"),
                }
            }
            Action::Stop(id) => {
                let Some(backend) = self.backends.remove(&id) else { return };
                let control = Arc::clone(&self.control);
                tasks.spawn(async move {
                    if let Err(e) = control.stop(backend.spec()).await {
                        tracing::error!(backend = %backend.id(), error = %e, "stopping a retired process failed");
                    }
                });
            }
            Action::WantShadow => self.control.shadow_wanted(),
        }
    }
}
