//! Shadow failover: every workload has an active backend and a standby ("shadow") started in
//! advance (iGniter Sec. 4.2: a pre-launched shadow Triton process, activated when the p99
//! violates the SLO, the original killed; GSLICE Sec. 3.2.4: the shadow takes over with
//! overlapped execution — the old process finishes what it has, then terminates).
//!
//! [`ShadowPolicy`] is the sans-IO core of one workload: events in, actions out.
//! [`workloads::ShadowPolicies`] keeps one per workload in step with what the supervisor
//! runs; the reconcile loop feeds them the routers' windows and the executor carries out
//! their actions (`Executor::carry_out`). This is the agent's one failover mechanism; a
//! resize (a new configuration from the controller) is the reconcile plan's
//! (`reconcile::Step::Promote`), which starts the new size as the standby and promotes it
//! once ready.
//!
//! Rules:
//! * p99 > SLO in `consecutive_windows` (2) windows in a row, and a standby that has reported
//!   Ready → switch to the standby. A window without completions breaks the streak.
//! * the retired backend drains (its in-flight requests complete), then is stopped; after
//!   every switch a new standby is wanted.
//! * the active process exited (crashed, killed) and a standby has reported Ready → switch to
//!   the standby at once, instead of waiting for the supervisor to restart the dead one and
//!   its server to load the model again; the router sends the requests the dead one failed
//!   to the new active set. An exited standby is probed again once restarted.
//! * a process that is gone (stopped) is forgotten: a standby no longer counts.

use crate::router::WindowStats;

pub mod workloads;

pub type BackendId = String;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A measurement window of the workload's router closed.
    Window(WindowStats),
    /// The supervisor started a standby process.
    ShadowStarted(BackendId),
    /// A Ready probe of this backend answered ready.
    Ready(BackendId),
    /// This retired backend has no request in flight any more.
    Drained(BackendId),
    /// This process no longer runs (stopped, or exited on its own).
    Gone(BackendId),
    /// This process exited on its own; the supervisor will restart it after its back-off.
    Exited(BackendId),
}

#[derive(Debug, Clone, PartialEq)]
pub enum SwitchReason {
    /// The last `windows` windows' p99 exceeded the SLO; `p99_ms` is the latest.
    SloViolation { p99_ms: f64, windows: u32 },
    /// The active process exited.
    ActiveExited,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Probe until it reports Ready, then feed [`Event::Ready`].
    ProbeReady(BackendId),
    /// Swap the router's active pointer from `from` to `to`, then drain `from` and feed
    /// [`Event::Drained`].
    Switch { from: BackendId, to: BackendId, reason: SwitchReason },
    /// Stop this process: drained, or a standby no longer wanted.
    Stop(BackendId),
    /// There is no standby: the supervisor should start one and feed [`Event::ShadowStarted`].
    WantShadow,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FailoverConfig {
    pub slo_ms: f64,
    /// Windows in a row with p99 > SLO before a switch (2).
    pub consecutive_windows: u32,
}

#[derive(Debug, Clone, PartialEq)]
struct Standby {
    id: BackendId,
    ready: bool,
}

/// One workload's active/standby pair.
#[derive(Debug, Clone)]
pub struct ShadowPolicy {
    config: FailoverConfig,
    active: BackendId,
    standby: Option<Standby>,
    violations: u32,
    last_p99_ms: f64,
    draining: Vec<BackendId>,
}

impl ShadowPolicy {
    /// `active` serves now; no standby yet (feed [`Event::ShadowStarted`]).
    pub fn new(config: FailoverConfig, active: impl Into<BackendId>) -> Self {
        ShadowPolicy { config, active: active.into(), standby: None, violations: 0, last_p99_ms: 0.0, draining: Vec::new() }
    }

    pub fn active(&self) -> &str {
        &self.active
    }

    pub fn config(&self) -> &FailoverConfig {
        &self.config
    }

    /// The standby and whether it has reported Ready.
    pub fn standby(&self) -> Option<(&str, bool)> {
        self.standby.as_ref().map(|s| (s.id.as_str(), s.ready))
    }

    pub fn draining(&self) -> &[BackendId] {
        &self.draining
    }

    /// Windows in a row over the SLO so far.
    pub fn violations(&self) -> u32 {
        self.violations
    }

    pub fn on_event(&mut self, event: Event) -> Vec<Action> {
        match event {
            Event::Window(stats) => self.on_window(&stats),
            Event::ShadowStarted(id) => self.on_shadow_started(id),
            Event::Ready(id) => self.on_ready(&id),
            Event::Drained(id) => self.on_drained(&id),
            Event::Gone(id) => self.on_gone(&id),
            Event::Exited(id) => self.on_exited(&id),
        }
    }

    fn on_window(&mut self, stats: &WindowStats) -> Vec<Action> {
        match stats.p99_ms {
            Some(p99) if p99 > self.config.slo_ms => {
                self.violations = self.violations.saturating_add(1);
                self.last_p99_ms = p99;
            }
            _ => self.violations = 0,
        }
        if !self.violated() {
            return Vec::new();
        }
        match &self.standby {
            Some(s) if s.ready => self.switch_to_standby(self.slo_violation()),
            Some(_) => Vec::new(),
            // Ask once, when the streak first reaches the threshold.
            None if self.violations == self.config.consecutive_windows => vec![Action::WantShadow],
            None => Vec::new(),
        }
    }

    fn on_shadow_started(&mut self, id: BackendId) -> Vec<Action> {
        if id == self.active || self.draining.contains(&id) {
            return Vec::new();
        }
        match &self.standby {
            Some(s) if s.id == id => Vec::new(),
            Some(s) => {
                let old = s.id.clone();
                self.standby = Some(Standby { id: id.clone(), ready: false });
                vec![Action::Stop(old), Action::ProbeReady(id)]
            }
            None => {
                self.standby = Some(Standby { id: id.clone(), ready: false });
                vec![Action::ProbeReady(id)]
            }
        }
    }

    fn on_ready(&mut self, id: &str) -> Vec<Action> {
        let Some(s) = self.standby.as_mut().filter(|s| s.id == id) else {
            return Vec::new();
        };
        s.ready = true;
        if self.violated() {
            return self.switch_to_standby(self.slo_violation());
        }
        Vec::new()
    }

    fn on_drained(&mut self, id: &str) -> Vec<Action> {
        match self.draining.iter().position(|d| d == id) {
            Some(pos) => vec![Action::Stop(self.draining.remove(pos))],
            None => Vec::new(),
        }
    }

    fn on_gone(&mut self, id: &str) -> Vec<Action> {
        if self.standby.as_ref().is_some_and(|s| s.id == id) {
            self.standby = None;
        }
        self.draining.retain(|d| d != id);
        Vec::new()
    }

    fn on_exited(&mut self, id: &str) -> Vec<Action> {
        if let Some(s) = self.standby.as_mut().filter(|s| s.id == id) {
            // Restarted, it must load its model again before it counts.
            s.ready = false;
            return Vec::new();
        }
        if id == self.active && self.standby.as_ref().is_some_and(|s| s.ready) {
            return self.switch_to_standby(SwitchReason::ActiveExited);
        }
        Vec::new()
    }

    fn violated(&self) -> bool {
        self.violations >= self.config.consecutive_windows
    }

    fn slo_violation(&self) -> SwitchReason {
        SwitchReason::SloViolation { p99_ms: self.last_p99_ms, windows: self.violations }
    }

    fn switch_to_standby(&mut self, reason: SwitchReason) -> Vec<Action> {
        let Some(standby) = self.standby.take() else {
            return Vec::new();
        };
        let from = std::mem::replace(&mut self.active, standby.id.clone());
        self.draining.push(from.clone());
        self.violations = 0;
        vec![Action::Switch { from, to: standby.id, reason }, Action::WantShadow]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(index: u64, p99_ms: Option<f64>) -> Event {
        Event::Window(WindowStats { index, length_ms: 1000, p99_ms, p50_ms: p99_ms, completed: 10, failed: 0, arrivals: 10 })
    }

    fn with_ready_shadow() -> ShadowPolicy {
        let mut p = ShadowPolicy::new(FailoverConfig { slo_ms: 10.0, consecutive_windows: 2 }, "a");
        assert_eq!(p.on_event(Event::ShadowStarted("b".into())), vec![Action::ProbeReady("b".into())]);
        assert_eq!(p.on_event(Event::Ready("b".into())), vec![]);
        assert_eq!(p.standby(), Some(("b", true)));
        p
    }

    #[test]
    fn switches_after_two_consecutive_windows_over_the_slo() {
        let mut p = with_ready_shadow();
        assert_eq!(p.on_event(window(0, Some(12.0))), vec![]);
        assert_eq!(p.violations(), 1);
        let actions = p.on_event(window(1, Some(15.0)));
        assert_eq!(
            actions,
            vec![
                Action::Switch { from: "a".into(), to: "b".into(), reason: SwitchReason::SloViolation { p99_ms: 15.0, windows: 2 } },
                Action::WantShadow
            ]
        );
        assert_eq!((p.active(), p.standby(), p.draining()), ("b", None, &["a".to_string()][..]));
        // The old one is stopped only once drained.
        assert_eq!(p.on_event(Event::Drained("x".into())), vec![]);
        assert_eq!(p.on_event(Event::Drained("a".into())), vec![Action::Stop("a".into())]);
        assert!(p.draining().is_empty());
    }

    #[test]
    fn a_good_or_empty_window_breaks_the_streak() {
        let mut p = with_ready_shadow();
        p.on_event(window(0, Some(12.0)));
        assert_eq!(p.on_event(window(1, Some(10.0))), vec![], "exactly the SLO is not a violation");
        assert_eq!(p.on_event(window(2, Some(12.0))), vec![]);
        assert_eq!(p.on_event(window(3, None)), vec![], "no completions: no evidence");
        assert_eq!(p.on_event(window(4, Some(12.0))), vec![]);
        assert_eq!(p.violations(), 1);
        assert_eq!(p.active(), "a");
    }

    #[test]
    fn without_a_ready_standby_it_waits_and_switches_once_ready() {
        let mut p = ShadowPolicy::new(FailoverConfig { slo_ms: 10.0, consecutive_windows: 2 }, "a");
        p.on_event(window(0, Some(20.0)));
        assert_eq!(p.on_event(window(1, Some(20.0))), vec![Action::WantShadow]);
        assert_eq!(p.on_event(window(2, Some(20.0))), vec![], "asked once");
        assert_eq!(p.on_event(Event::ShadowStarted("b".into())), vec![Action::ProbeReady("b".into())]);
        assert_eq!(p.on_event(window(3, Some(20.0))), vec![], "standby not ready yet");
        let actions = p.on_event(Event::Ready("b".into()));
        assert!(matches!(&actions[0], Action::Switch { to, reason: SwitchReason::SloViolation { windows: 4, .. }, .. } if to == "b"));
    }

    #[test]
    fn a_standby_that_is_gone_no_longer_counts() {
        let mut p = with_ready_shadow();
        assert_eq!(p.on_event(Event::Gone("b".into())), vec![]);
        assert_eq!(p.standby(), None);
        p.on_event(window(0, Some(20.0)));
        assert_eq!(p.on_event(window(1, Some(20.0))), vec![Action::WantShadow], "no switch to a process that is gone");
        assert_eq!(p.active(), "a");
        // A retired process that exits before it drained is not stopped again.
        let mut p = with_ready_shadow();
        p.on_event(window(0, Some(20.0)));
        p.on_event(window(1, Some(20.0)));
        assert_eq!(p.draining(), &["a".to_string()][..]);
        p.on_event(Event::Gone("a".into()));
        assert_eq!(p.on_event(Event::Drained("a".into())), vec![]);
    }

    #[test]
    fn a_dead_active_process_fails_over_to_a_ready_standby_at_once() {
        let mut p = with_ready_shadow();
        assert_eq!(
            p.on_event(Event::Exited("a".into())),
            vec![Action::Switch { from: "a".into(), to: "b".into(), reason: SwitchReason::ActiveExited }, Action::WantShadow]
        );
        assert_eq!((p.active(), p.draining()), ("b", &["a".to_string()][..]));
        assert_eq!(p.on_event(Event::Exited("a".into())), vec![], "seen again next round: nothing more");
        // Without a ready standby there is nothing to switch to: the supervisor restarts it.
        let mut p = ShadowPolicy::new(FailoverConfig { slo_ms: 10.0, consecutive_windows: 2 }, "a");
        p.on_event(Event::ShadowStarted("b".into()));
        assert_eq!(p.on_event(Event::Exited("a".into())), vec![]);
        assert_eq!(p.active(), "a");
        // A standby that exited must answer Ready again before it counts.
        let mut p = with_ready_shadow();
        assert_eq!(p.on_event(Event::Exited("b".into())), vec![]);
        assert_eq!(p.standby(), Some(("b", false)));
        assert_eq!(p.on_event(Event::Exited("a".into())), vec![], "no switch to a standby that is restarting");
    }

    #[test]
    fn a_new_standby_replaces_an_old_one() {
        let mut p = with_ready_shadow();
        assert_eq!(p.on_event(Event::ShadowStarted("c".into())), vec![Action::Stop("b".into()), Action::ProbeReady("c".into())]);
        assert_eq!(p.standby(), Some(("c", false)));
        assert_eq!(p.on_event(Event::ShadowStarted("a".into())), vec![], "the active one is no standby");
    }
}
