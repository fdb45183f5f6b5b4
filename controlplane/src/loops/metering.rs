//! The metering loop: every `metering_interval` the leader writes each Tenant's usage (from
//! the committed plan) and SLO attainment (its stored count plus the windows counted from
//! reports since) into the Tenant's status, for the tenants whose figures moved, and sets
//! each service's usage series on its `/metrics` (leader only). Costs
//! one pass over the plan per interval, off the async workers, and a status write per
//! changed tenant, several to a Raft entry.

use std::collections::BTreeMap;

use super::LoopSettings;
use crate::api::ApiError;
use crate::controller::Controller;
use crate::metering::{by_service, changed_statuses, gpu_prices};
use crate::resources::limits::MAX_STATUSES_PER_ENTRY;
use crate::resources::{Kind, Spec};
use crate::resources::{SloCount, TenantStatus};
use crate::state::{Command, Request, StatusPut};

pub async fn run(controller: Controller, settings: LoopSettings) {
    let mut tick = tokio::time::interval(settings.metering_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let _pass = controller.telemetry.time_loop_pass("metering");
        let tally = controller.slo_tally.take();
        let result = pass(&controller, &settings, tally).await;
        controller.telemetry.observe_loop_outcome("metering", result.is_err());
        if let Err(e) = result {
            tracing::warn!(error = %e, "metering pass failed; its counts go with the next one");
        }
    }
}

/// One pass; the counts of tenants whose status was not written go back to the tally.
async fn pass(controller: &Controller, settings: &LoopSettings, tally: BTreeMap<String, SloCount>) -> Result<(), ApiError> {
    let sm = controller.sm.clone();
    let counted = tally.clone();
    let computed = super::off_runtime(settings, "metering", move |_| {
        // An O(1) copy under the lock; the pass over the plan outside it.
        let cluster = sm.data.read().expect("state lock").cluster.resources_only();
        let tenants: Vec<(String, TenantStatus)> = cluster.list(Kind::Tenant).map(|r| (r.name.clone(), TenantStatus::of(r))).collect();
        let plan = match cluster.get(Kind::Plan, "current").map(|r| &r.spec) {
            Some(Spec::Plan(p)) => Some(p),
            _ => None,
        };
        let services = plan.map(|p| by_service(p, gpu_prices(&cluster))).unwrap_or_default();
        (changed_statuses(&tenants, &services, &counted), services)
    })
    .await;
    let changed = match computed {
        Ok((changed, services)) => {
            controller.telemetry.set_service_usage(&services);
            changed
        }
        Err(e) => {
            controller.slo_tally.give_back(tally);
            return Err(e);
        }
    };
    let mut unwritten = tally;
    let mut failure = None;
    for chunk in changed.chunks(MAX_STATUSES_PER_ENTRY) {
        let statuses = chunk
            .iter()
            .map(|(name, status)| StatusPut { name: name.clone(), status: serde_json::to_value(status).unwrap_or_default().into() })
            .collect();
        // No request id: writing the same figures again is harmless (as the failure
        // detector's marks).
        let write =
            Request { request_id: String::new(), command: Command::PutStatuses { kind: Kind::Tenant, statuses }, trace_parent: None };
        match controller.write(write).await {
            Ok(_) => {
                for (name, _) in chunk {
                    unwritten.remove(name);
                }
            }
            Err(e) => failure = Some(e),
        }
    }
    // Counts of tenants that are gone, or whose figures did not move (no window came),
    // have nothing more to be written with.
    unwritten.retain(|name, _| changed.iter().any(|(t, _)| t == name));
    controller.slo_tally.give_back(unwritten);
    failure.map_or(Ok(()), Err)
}
