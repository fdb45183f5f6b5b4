//! The report loop: once per interval (as the controller paces it), what the node observes
//! and its routers' latest windows, to any controller.

use super::{Agent, RPC_TIMEOUT};
use crate::desired::NodeDesired;
use crate::executor::Executor;
use crate::reconcile;
use proto::agent_client::AgentClient;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

impl Agent {
    pub(super) async fn report_loop(self: Arc<Self>, rx: watch::Receiver<Option<NodeDesired>>) {
        let mut schedule = proto::report_pace::ReportSchedule::new(Duration::from_millis(self.cfg.interval_ms));
        let mut wait = schedule.interval();
        // Where the desired-state stream starts too: one connection for both.
        let mut k = self.cfg.first_controller();
        loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.report_now.notified() => schedule.sent_out_of_schedule(),
            }
            wait = schedule.interval();
            // The executor may be busy in a reconcile round (waiting for a process to be
            // ready): build the report off the async workers.
            let (me, watch) = (self.clone(), rx.clone());
            let Ok(report) = tokio::task::spawn_blocking(move || me.report(&watch)).await else { continue };
            for _ in 0..self.cfg.controllers.len() {
                let addr = &self.cfg.controllers[k % self.cfg.controllers.len()];
                let sent = async {
                    let mut req = tonic::Request::new(report.clone());
                    req.set_timeout(RPC_TIMEOUT);
                    AgentClient::new(self.channel(addr).await?).report(req).await.map_err(anyhow::Error::from)
                };
                match sent.await {
                    Ok(answer) => {
                        let answer = answer.into_inner();
                        self.telemetry.report_answered();
                        self.change_only.lock().expect("report lock").answered(&report, answer.observed_digest);
                        wait = schedule.answered(answer.report_interval_ms, rand::random());
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(controller = %addr, error = %e, "report not delivered");
                        k += 1;
                    }
                }
            }
        }
    }

    /// The report to send: built fresh when the executor is free; while a reconcile round
    /// holds it (a process may take seconds to become ready), the last observed state with
    /// fresh metrics, so the heartbeat never stalls behind a slow start.
    fn report(&self, rx: &watch::Receiver<Option<NodeDesired>>) -> proto::ReportRequest {
        let fresh = match self.executor.try_lock() {
            Ok(executor) => Some(self.build_report(&executor, rx)),
            Err(std::sync::TryLockError::WouldBlock) => None,
            Err(std::sync::TryLockError::Poisoned(p)) => Some(self.build_report(&p.into_inner(), rx)),
        };
        let mut last = self.last_report.lock().expect("report lock");
        let mut report = match fresh {
            Some(r) => {
                *last = Some(r.clone());
                r
            }
            None => last.clone().unwrap_or_else(|| proto::ReportRequest { node: self.cfg.node.clone(), ..Default::default() }),
        };
        report.metrics = self.routers.metrics();
        let cold_starts = self.telemetry.take_recent_cold_starts();
        let server = self.server_readings.lock().unwrap_or_else(|p| p.into_inner());
        for m in &mut report.metrics {
            m.cold_start_s = cold_starts.get(&m.service).copied().unwrap_or(0.0);
            m.server = server.get(&m.service).cloned();
        }
        drop(server);
        report.watch_session = self.watch_session.load(Ordering::Relaxed);
        // The controller accepts metrics only for services the committed plan places here;
        // a router of a service just planned away lingers until its workloads drain.
        if let Some(desired) = rx.borrow().as_ref() {
            let wanted: std::collections::BTreeSet<&str> =
                desired.gpus.values().flat_map(|g| g.workloads.iter().map(|w| w.service.as_str())).collect();
            report.metrics.retain(|m| wanted.contains(m.service.as_str()));
        }
        self.change_only.lock().expect("report lock").prepare(&mut report);
        report
    }

    fn build_report(&self, executor: &Executor, rx: &watch::Receiver<Option<NodeDesired>>) -> proto::ReportRequest {
        let observed = executor.observe().unwrap_or_default();
        let desired = rx.borrow().clone();
        let converged = desired.as_ref().is_some_and(|d| reconcile::plan(d, &observed).is_ok_and(|s| s.is_empty()));
        let gpus = executor
            .gpus
            .iter()
            .map(|g| {
                let o = observed.gpus.get(&g.uuid).cloned().unwrap_or_default();
                proto::ObservedGpu {
                    gpu_uuid: g.uuid.clone(),
                    model: self.model_name(g),
                    mig_enabled: g.mig_enabled,
                    instances: o
                        .layout
                        .iter()
                        .map(|p| proto::AgentMigInstance { profile: p.profile.to_string(), start: u32::from(p.start) })
                        .collect(),
                    workloads: o
                        .running
                        .iter()
                        .map(|r| proto::ObservedWorkload {
                            service: r.spec.service.clone(),
                            mig_instance: match r.spec.slot {
                                crate::desired::Slot::WholeGpu => -1,
                                crate::desired::Slot::Mig(p) => o.layout.iter().position(|q| *q == p).map_or(-1, |i| i as i32),
                            },
                            mps_percent: r.spec.mps_percent,
                            batch: r.spec.batch,
                            state: executor.supervisor.state(&r.id).into(),
                            shadow: r.role == reconcile::Role::Standby,
                            pid: executor.supervisor.get(&r.id).map_or(0, |p| p.pid),
                            process: r.id.clone(),
                        })
                        .collect(),
                }
            })
            .collect();
        proto::ReportRequest {
            node: self.cfg.node.clone(),
            applied_version: if converged { desired.map_or(0, |d| d.version) } else { 0 },
            gpus,
            ..Default::default()
        }
    }
}
