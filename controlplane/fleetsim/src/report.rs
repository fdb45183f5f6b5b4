//! What a run reports: per policy its cost, GPU-hours, SLO attainment, reconfigurations and
//! launches; a table for the terminal and JSON for tools.

use serde::Serialize;

/// A point of a policy's timeline (for the plots).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    pub t_s: u32,
    pub cost_per_hour: f64,
    pub demand_rps: f64,
    pub capacity_rps: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyReport {
    pub name: String,
    pub cost: f64,
    pub gpu_hours: f64,
    /// Service-seconds with load, and those whose p99 met the SLO.
    pub windows: u64,
    pub windows_met: u64,
    pub reconfigurations: u32,
    pub launches: u32,
    /// Where a re-planning policy's reconfigurations come from (gpuplane's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replanning: Option<Replanning>,
    /// The windows that missed the SLO, by what the service was going through then.
    pub missed: MissedWindows,
    /// (service, windows, windows met).
    #[serde(skip)]
    pub per_service: Vec<(String, u64, u64)>,
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

impl PolicyReport {
    pub fn attainment(&self) -> f64 {
        if self.windows == 0 {
            1.0
        } else {
            self.windows_met as f64 / self.windows as f64
        }
    }
}

/// Re-plans and the reconfigurations they caused, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Replanning {
    pub replans: u32,
    /// Re-plans that planned every service again rather than the few whose rate moved.
    pub full_replans: u32,
    /// Reconfigurations of the services whose rate moved.
    pub of_resized: u32,
    /// Reconfigurations of services whose rate did not move (moved by the plan around them).
    pub of_others: u32,
    /// Of those, in full re-plans.
    pub of_others_in_full: u32,
    /// Reconfigurations when hosts came (launched, replaced) or went (marked failed) and
    /// the node assignment placed the same plan again, and of services a placement had
    /// left short of their plan (waiting for hosts) when a re-plan placed what they lacked.
    pub of_fleet_changes: u32,
    /// Reconfigurations by the GSLICE tuner (an MPS share changed; the process restarts).
    pub of_tuner: u32,
    /// Reconfigurations, of any cause, in which some of the service's capacity stopped
    /// before what replaced it served (a move off its slot: the agents start the new
    /// process cold while the old one drains).
    pub break_before_make: u32,
}

/// What a service was going through in a window (`Policy::condition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Serving as planned.
    Steady,
    /// Its processes were switching to a new configuration (reconfigure_s after a change),
    /// the old ones serving until the new ones do.
    Switching,
    /// Switching, after some of its capacity stopped before its replacement served.
    SwitchingBroken,
    /// The hosts placed less than its plan (waiting for a launch or a replacement).
    ShortOfPlan,
}

/// Windows that missed the SLO, by the service's [`Condition`] in each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MissedWindows {
    pub steady: u64,
    pub switching: u64,
    pub switching_broken: u64,
    pub short_of_plan: u64,
}

impl MissedWindows {
    pub fn count(&mut self, condition: Condition) {
        match condition {
            Condition::Steady => self.steady += 1,
            Condition::Switching => self.switching += 1,
            Condition::SwitchingBroken => self.switching_broken += 1,
            Condition::ShortOfPlan => self.short_of_plan += 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub services: usize,
    pub seconds: u32,
    pub policies: Vec<PolicyReport>,
    /// Wall-clock seconds the simulation took.
    pub wall_s: f64,
}

impl Report {
    /// The terminal table, with gpuplane's saving against each baseline.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} services, {:.1} simulated hours, {:.1} s of wall clock\n{:<22} {:>10} {:>10} {:>12} {:>9} {:>8} {:>16}\n",
            self.services,
            f64::from(self.seconds) / 3600.0,
            self.wall_s,
            "policy",
            "cost",
            "GPU-hours",
            "SLO met",
            "reconfig",
            "launches",
            "gpuplane saves"
        );
        let ours = self.policies.iter().find(|p| p.name == "gpuplane").map(|p| p.cost);
        for p in &self.policies {
            let saving = match ours {
                Some(c) if p.name != "gpuplane" && p.cost > 0.0 => format!("{:.1}%", 100.0 * (1.0 - c / p.cost)),
                _ => "-".into(),
            };
            out.push_str(&format!(
                "{:<22} {:>10.2} {:>10.1} {:>11.3}% {:>9} {:>8} {:>16}\n",
                p.name,
                p.cost,
                p.gpu_hours,
                100.0 * p.attainment(),
                p.reconfigurations,
                p.launches,
                saving
            ));
        }
        for p in &self.policies {
            if let Some(r) = p.replanning {
                out.push_str(&format!(
                    "{}: {} re-plans, {} of them of every service; reconfigured: {} resized services, {} others ({} of them in the full re-plans), {} as hosts came and went, {} by the tuner; {} break-before-make\n",
                    p.name,
                    r.replans,
                    r.full_replans,
                    r.of_resized,
                    r.of_others,
                    r.of_others_in_full,
                    r.of_fleet_changes,
                    r.of_tuner,
                    r.break_before_make
                ));
                let m = p.missed;
                out.push_str(&format!(
                    "{}: windows missed {}: while switching {} (after a break-before-make {}), short of the plan (hosts) {}, serving as planned {}\n",
                    p.name,
                    m.steady + m.switching + m.switching_broken + m.short_of_plan,
                    m.switching + m.switching_broken,
                    m.switching_broken,
                    m.short_of_plan,
                    m.steady
                ));
                let per = |n: u32| self.per_service_day(n);
                out.push_str(&format!(
                    "{}: restarts per service per day {:.2}: of services resized {:.2}, not resized {:.2} (moved by re-plans {:.2}, by host changes {:.2}, by the tuner {:.2})\n",
                    p.name,
                    per(p.reconfigurations),
                    per(r.of_resized),
                    per(r.of_others + r.of_fleet_changes + r.of_tuner),
                    per(r.of_others),
                    per(r.of_fleet_changes),
                    per(r.of_tuner)
                ));
            }
        }
        out
    }

    /// `count` over the run as a rate per service per day.
    fn per_service_day(&self, count: u32) -> f64 {
        let service_days = self.services as f64 * f64::from(self.seconds) / 86_400.0;
        if service_days > 0.0 {
            f64::from(count) / service_days
        } else {
            0.0
        }
    }
}
