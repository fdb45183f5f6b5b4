//! The metering loop: every `metering_interval` the leader writes each Tenant's usage (from
//! the committed plan) and SLO attainment (its stored count plus the windows counted from
//! reports since) into the Tenant's status, for the tenants whose figures moved, and sets
//! each service's usage series on its `/metrics` (leader only). Costs one pass over the plan
//! per interval, off the async workers, and a status write per changed tenant, several to a
//! Raft entry.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::runner::{Pass, Reconciler, Settled, Write};
use super::LoopSettings;
use crate::controller::Controller;
use crate::metering::{by_service, changed_statuses, gpu_prices, Occupied};
use crate::resources::limits::MAX_STATUSES_PER_ENTRY;
use crate::resources::{Kind, SloCount, Spec, TenantStatus};
use crate::state::{ClusterState, Command, StatusPut};

pub async fn run(controller: Controller, settings: LoopSettings) {
    let metering = Metering::new(settings.metering_interval);
    super::runner::run(controller, settings, metering).await
}

/// The metering as a leader loop (`loops::runner`).
pub(crate) struct Metering {
    interval: Duration,
    /// The SLO windows counted since the last pass, taken for this one.
    counted: BTreeMap<String, SloCount>,
    /// The tenants of each of this pass's writes, in order.
    written: Vec<Vec<String>>,
    /// Tenants whose figures this pass found moved.
    changed: Vec<String>,
    /// What the plan gives each service, for the per-service series.
    services: BTreeMap<(String, String), Occupied>,
}

/// What a pass reads: the state (an O(1) copy) and the SLO windows counted since the last.
pub(crate) struct MeteringView {
    cluster: ClusterState,
    counted: BTreeMap<String, SloCount>,
}

impl Metering {
    pub(crate) fn new(interval: Duration) -> Self {
        Metering { interval, counted: BTreeMap::new(), written: Vec::new(), changed: Vec::new(), services: BTreeMap::new() }
    }
}

impl Reconciler for Metering {
    const NAME: &'static str = "metering";
    const LONG_PASS: bool = true;
    type View = MeteringView;

    fn interval(&self) -> Duration {
        self.interval
    }

    fn view(&mut self, controller: &Controller) -> MeteringView {
        let cluster = controller.read(|d| d.cluster.resources_only());
        MeteringView { cluster, counted: controller.slo_tally.take() }
    }

    fn pass(&mut self, view: MeteringView, _now: Instant, _cancelled: &dyn Fn() -> bool) -> Pass {
        let MeteringView { cluster, counted } = view;
        let tenants: Vec<(String, TenantStatus)> = cluster.list(Kind::Tenant).map(|r| (r.name.clone(), TenantStatus::of(r))).collect();
        self.services = match cluster.get(Kind::Plan, "current").map(|r| &r.spec) {
            Some(Spec::Plan(p)) => by_service(p, gpu_prices(&cluster)),
            _ => BTreeMap::new(),
        };
        let changed = changed_statuses(&tenants, &self.services, &counted);
        self.counted = counted;
        self.changed = changed.iter().map(|(name, _)| name.clone()).collect();
        self.written.clear();
        let mut pass = Pass::default();
        for chunk in changed.chunks(MAX_STATUSES_PER_ENTRY) {
            self.written.push(chunk.iter().map(|(name, _)| name.clone()).collect());
            let statuses = chunk
                .iter()
                .map(|(name, status)| StatusPut {
                    name: name.clone(),
                    status: crate::resources::StatusJson::of(status).unwrap_or_default(),
                })
                .collect();
            // Repeatable: writing the same figures again is harmless.
            pass.writes.push(Write::Command { command: Command::PutStatuses { kind: Kind::Tenant, statuses }, repeatable: true });
        }
        pass
    }

    fn settled(&mut self, controller: &Controller, settled: Settled) {
        controller.telemetry.set_service_usage(&self.services);
        let mut unwritten = std::mem::take(&mut self.counted);
        for (tenants, result) in self.written.drain(..).zip(settled.writes) {
            match result {
                Ok(_) => {
                    for name in tenants {
                        unwritten.remove(&name);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "metering: usage not written; its counts go with the next pass"),
            }
        }
        // Counts of tenants that are gone, or whose figures did not move (no window came),
        // have nothing more to be written with.
        unwritten.retain(|name, _| self.changed.contains(name));
        controller.slo_tally.give_back(unwritten);
    }
}
