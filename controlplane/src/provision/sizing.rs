//! Each autoscaled service's provisioned rate, decided: HetSev's scaling controller
//! (`planner::policy::hetsev::decide_rate`) at the saturation the service's own SLO leaves it
//! (`planner::policy::slo_headroom`, learnt from its windows), within a restart budget. The
//! one place this decision is made: the leader's autoscaler (`loops::autoscaler`) and the
//! what-if simulator (`fleet-sim`) both run it. Pure: time comes in as seconds.
//!
//! A resize re-plans the service, which restarts its processes (an MPS share or a batch is
//! fixed when a process starts). A raise answers load the service cannot carry: it is always
//! made, and counted. A lowering only saves money: it is made only while the service has
//! restarts left in its budget ([`RestartBudget`]: at most [`OPTIONAL_RESTARTS_PER_HOUR`]
//! in any hour), so a service whose sizing oscillates (two plans that each ask for the
//! other) restarts a bounded number of times however the oscillation arises.

use std::collections::{BTreeMap, VecDeque};

use planner::policy::hetsev::{decide_rate, record_sample, AutoscaleConfig, HetSevError, LoadSample, RateDecision, RateRange};
use planner::policy::slo_headroom::{Prediction, SloHeadroom, Window};

/// Provisioned rates move only for a change of more than this fraction (no churn).
pub const MIN_CHANGE: f64 = 0.05;
/// Lowerings of one service's rate allowed in any [`BUDGET_WINDOW_S`], counting every
/// resize of it in that time: enough for a diurnal curve's steps (about one an hour in
/// fleet-sim's built-in scenario), few enough to bound an oscillation at 96 restarts a day.
pub const OPTIONAL_RESTARTS_PER_HOUR: usize = 4;
/// The budget's window, s.
pub const BUDGET_WINDOW_S: f64 = 3600.0;

/// At most `max` restarts of each service within any `window_s` may be optional: an
/// optional restart is made only while fewer than `max` restarts (optional or not) of the
/// service fall within the window before it.
#[derive(Clone, Debug)]
pub struct RestartBudget {
    max: usize,
    window_s: f64,
    /// Per service, the times of its restarts within the window (at most `max` kept: more
    /// say nothing the budget needs).
    spent: BTreeMap<String, VecDeque<f64>>,
}

impl RestartBudget {
    pub fn new(max: usize, window_s: f64) -> Self {
        RestartBudget { max, window_s, spent: BTreeMap::new() }
    }

    fn recent(&mut self, service: &str, now_s: f64) -> Option<&mut VecDeque<f64>> {
        let window_s = self.window_s;
        let times = self.spent.get_mut(service)?;
        while times.front().is_some_and(|&t| t <= now_s - window_s) {
            times.pop_front();
        }
        Some(times)
    }

    /// Whether `service` may make an optional restart at `now_s`.
    pub fn allows(&mut self, service: &str, now_s: f64) -> bool {
        let max = self.max;
        self.recent(service, now_s).is_none_or(|times| times.len() < max)
    }

    /// Counts a restart of `service` at `now_s`.
    pub fn spend(&mut self, service: &str, now_s: f64) {
        let max = self.max;
        if self.recent(service, now_s).is_none() {
            self.spent.insert(service.to_string(), VecDeque::new());
        }
        let times = self.spent.get_mut(service).expect("inserted above");
        times.push_back(now_s);
        while times.len() > max {
            times.pop_front();
        }
    }

    /// Restarts of `service` counted within the window before `now_s`.
    pub fn spent(&mut self, service: &str, now_s: f64) -> usize {
        self.recent(service, now_s).map_or(0, |times| times.len())
    }

    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.spent.retain(|s, _| keep(s));
    }
}

/// One service as a sizing pass reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SizingInput {
    pub range: RateRange,
    pub arrival_rps: f64,
    pub slo_ms: f64,
    /// What the committed plan predicts for it; `None` while it is not planned.
    pub prediction: Option<Prediction>,
}

/// The autoscaling decisions of every service, with what they remember: each one's load
/// history (HetSev's window and cool-down), its SLO headroom and its restart budget.
#[derive(Clone, Debug)]
pub struct ServiceSizing {
    policy: AutoscaleConfig,
    histories: BTreeMap<String, VecDeque<LoadSample>>,
    headroom: SloHeadroom,
    /// The saturation target each service is decided at: a new one is taken only when it
    /// differs by more than [`MIN_CHANGE`]. A target that drifts down by less would leave the
    /// load "saturated" by a margin too small to move on, and the window that guards a raise
    /// against a burst would already be full when the burst comes.
    targets: BTreeMap<String, f64>,
    budget: RestartBudget,
}

impl ServiceSizing {
    /// `policy.saturation_threshold` is the upper bound of every service's target.
    pub fn new(policy: AutoscaleConfig) -> Self {
        ServiceSizing {
            policy,
            histories: BTreeMap::new(),
            headroom: SloHeadroom::default(),
            targets: BTreeMap::new(),
            budget: RestartBudget::new(OPTIONAL_RESTARTS_PER_HOUR, BUDGET_WINDOW_S),
        }
    }

    /// Forgets the services `keep` refuses (no longer autoscaled).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.histories.retain(|s, _| keep(s));
        self.headroom.retain(&keep);
        self.targets.retain(|s, _| keep(s));
        self.budget.retain(&keep);
    }

    /// Learns from `service`'s window at `t_s` (of agents that run the current plan, whose
    /// `prediction` it is; its SLO `slo_ms`). A window the correction cannot learn from
    /// (idle, saturated) still counts as met or missed.
    pub fn learn(&mut self, service: &str, t_s: f64, slo_ms: f64, window: Window, prediction: Prediction) {
        let _ = self.headroom.observe(service, t_s, slo_ms, window, prediction);
    }

    /// The rate `service` is to be provisioned for from `t_s` on, when it moves.
    pub fn decide(&mut self, service: &str, t_s: f64, input: SizingInput) -> Result<Option<f64>, HetSevError> {
        let mut policy = self.policy.clone();
        if let Some(prediction) = input.prediction {
            let upper = self.policy.saturation_threshold;
            let wanted = self.headroom.saturation(service, t_s, input.slo_ms, prediction, upper).saturation;
            let target = match self.targets.get(service) {
                Some(&now) if (wanted - now).abs() <= MIN_CHANGE * now => now,
                _ => {
                    self.targets.insert(service.to_string(), wanted);
                    wanted
                }
            };
            policy.saturation_threshold = target;
        }
        let horizon = policy.window_s.max(policy.cooldown_s);
        let samples = self.histories.entry(service.to_string()).or_default();
        let sample = LoadSample { t_s, arrival_rate: input.arrival_rps, capacity: input.range.provisioned_rps };
        record_sample(samples, sample, t_s - horizon);
        let to = match decide_rate(samples.make_contiguous(), input.range, t_s, &policy, MIN_CHANGE)? {
            RateDecision::Raise { to_rps } => to_rps,
            RateDecision::Lower { to_rps } if self.budget.allows(service, t_s) => to_rps,
            RateDecision::Lower { .. } | RateDecision::Hold { .. } => return Ok(None),
        };
        self.budget.spend(service, t_s);
        Ok(Some(to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_restarts_stay_within_the_budget_in_any_window() {
        let mut b = RestartBudget::new(4, 3600.0);
        // Restarts asked for every 100 s for a day; those made are spent.
        let mut made = Vec::new();
        for i in 0..864 {
            let t = f64::from(i) * 100.0;
            if b.allows("web", t) {
                b.spend("web", t);
                made.push(t);
            }
        }
        // Never more than 4 in any hour, and the budget is used (4 an hour, 96 a day).
        for (i, &t) in made.iter().enumerate() {
            let within = made[i..].iter().take_while(|&&u| u < t + 3600.0).count();
            assert!(within <= 4, "{within} restarts from {t}");
        }
        assert_eq!(made.len(), 96);
        // Restarts that must be made count against what may be.
        let mut b = RestartBudget::new(2, 3600.0);
        b.spend("web", 0.0);
        b.spend("web", 10.0);
        b.spend("web", 20.0);
        assert!(!b.allows("web", 30.0));
        assert!(b.allows("other", 30.0), "each service has its own");
        assert!(!b.allows("web", 3_605.0), "the restarts at 10 and 20 s still count");
        assert!(b.allows("web", 3_610.0), "only the one at 20 s does");
        assert_eq!(b.spent("web", 3_620.0), 0);
    }

    fn policy() -> AutoscaleConfig {
        AutoscaleConfig { saturation_threshold: 0.8, window_s: 10.0, cooldown_s: 30.0, lambda_per_s: 0.001, min_instances: 0 }
    }

    #[test]
    fn a_raise_is_always_made_and_a_lowering_only_within_the_budget() {
        let mut sizing = ServiceSizing::new(policy());
        let input = |arrival_rps: f64, provisioned_rps: f64| SizingInput {
            range: RateRange { provisioned_rps, min_rps: 1.0, max_rps: 10_000.0 },
            arrival_rps,
            slo_ms: 100.0,
            prediction: None,
        };
        // The load swings between 100 and 400 req/s every 40 s (past the window and the
        // cool-down each time): HetSev would follow it, up and down, 90 times an hour.
        let (mut provisioned, mut raises, mut lowerings) = (125.0, 0, 0);
        for s in 0..3_600 {
            let arrival = if (s / 40) % 2 == 0 { 100.0 } else { 400.0 };
            if let Some(to) = sizing.decide("web", f64::from(s), input(arrival, provisioned)).unwrap() {
                if to > provisioned {
                    raises += 1;
                } else {
                    lowerings += 1;
                }
                provisioned = to;
            }
        }
        // Up at 50, down at 110, up at 130, down at 190, up at 210: four restarts in the
        // hour, then no more lowering (the fifth would be optional), so no more raising.
        assert_eq!((raises, lowerings), (3, 2));
        assert_eq!(provisioned, 500.0, "sized for the peak it keeps meeting");
    }
}
