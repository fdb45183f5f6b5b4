//! Simulated node agents: each registers its Node, watches its desired state (from any
//! controller, moving on when a stream breaks or the leader's reports say it is behind),
//! checks every state it receives the way the real agent does before applying it, and
//! reports as a heartbeat.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controlplane::client::{Client, RetryPolicy};
use planner::mig::GpuModel;
use proto::agent_client::AgentClient;

use super::fleet;
use super::net::sim_channels;
use super::phase::{now_ms, Phase, Stage, Trace};

/// What one agent last received.
#[derive(Clone, Debug, Default)]
pub struct AgentView {
    pub desired: Option<proto::DesiredState>,
    /// The first desired state the agent's check refused, with the reason.
    pub refused: Option<String>,
}

pub type AgentViews = Arc<Mutex<BTreeMap<String, AgentView>>>;

const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// Reports in a row that name a newer desired version before the agent re-subscribes.
const BEHIND_REPORTS: u32 = 3;

pub fn agent_host(i: usize) -> String {
    format!("a{i}")
}

pub fn node_name(i: usize) -> String {
    format!("n{i}")
}

fn gpu_models(node: &str) -> BTreeMap<String, GpuModel> {
    (0..2).map(|g| (format!("GPU-{node}-{g}"), GpuModel::A100_80GB)).collect()
}

/// Runs agent `node` until the run reaches its final reads.
pub async fn run(node: String, controllers: Vec<String>, phase: Phase, views: AgentViews, trace: Trace) -> turmoil::Result {
    let retry = RetryPolicy { attempts: 3, backoff: Duration::from_millis(200), timeout: Duration::from_secs(1) };
    let client = Client::new(controllers.clone()).with_channels(sim_channels()).with_retry(retry);
    let request_id = format!("register-{node}");
    while client.put_with_id(fleet::node(&node), proto::WriteMode::Unspecified, &request_id).await.is_err() {
        if phase.get() == Stage::FinalReads {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    trace.event(now_ms(), format!("agent {node} registered"));
    let channels = sim_channels();
    let mut target = 0usize;
    let mut behind = 0;
    // Each stream is named, as node-agent names its own (a random session there; numbered
    // here, so that a seed replays): the controllers relay the end of a stream to the leader's
    // failure detector, which the faults then exercise.
    let mut session = 0u64;
    while phase.get() != Stage::FinalReads {
        let addr = &controllers[target % controllers.len()];
        target += 1;
        let Ok(channel) = channels.get(addr) else { continue };
        let from_version = views.lock().unwrap().get(&node).and_then(|v| v.desired.as_ref()).map_or(0, |d| d.version);
        session += 1;
        let mut request = tonic::Request::new(proto::WatchDesiredRequest { node: node.clone(), from_version, session });
        request.set_timeout(Duration::from_secs(3600));
        let mut stream = match AgentClient::new(channel).watch_desired(request).await {
            Ok(s) => s.into_inner(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut report = tokio::time::interval(REPORT_INTERVAL);
        loop {
            tokio::select! {
                biased;
                message = stream.message() => {
                    match message {
                        Ok(Some(state)) => receive(&node, state, &views, &trace),
                        _ => break,
                    }
                }
                _ = report.tick() => {
                    if phase.get() == Stage::FinalReads {
                        trace.event(now_ms(), format!("agent {node} stopped"));
                        return Ok(());
                    }
                    let held = views.lock().unwrap().get(&node).and_then(|v| v.desired.as_ref()).map_or(0, |d| d.version);
                    // The first tick is at once: a new stream is reported before the
                    // leader's grace for the old one runs out.
                    let req = proto::ReportRequest { node: node.clone(), applied_version: held, watch_session: session, ..Default::default() };
                    let answer = client
                        .call(|ch, t| {
                            let mut r = tonic::Request::new(req.clone());
                            r.set_timeout(t);
                            async move { AgentClient::new(ch).report(r).await.map(|r| r.into_inner()) }
                        })
                        .await;
                    behind = match answer {
                        Ok(a) if a.desired_version != held => behind + 1,
                        _ => 0,
                    };
                    if behind >= BEHIND_REPORTS {
                        behind = 0;
                        trace.event(now_ms(), format!("agent {node} behind at {held}: re-subscribing"));
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn receive(node: &str, state: proto::DesiredState, views: &AgentViews, trace: &Trace) {
    trace.event(now_ms(), format!("agent {node} received version {}", state.version));
    let mut views = views.lock().unwrap();
    let view = views.entry(node.to_string()).or_default();
    if let Err(refused) = node_agent::desired::decode(&state, node, &gpu_models(node)) {
        view.refused.get_or_insert_with(|| format!("version {}: {refused}", state.version));
    }
    view.desired = Some(state);
}
