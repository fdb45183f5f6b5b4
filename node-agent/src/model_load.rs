//! Models the agent loads itself (a runtime with `model_control = repository`): once per
//! launch of a process, `POST /v2/repository/models/{model}/load` on its HTTP port (the Open
//! Inference Protocol's repository extension, which Triton serves with
//! `--model-control-mode=explicit`, and MLServer), retried until the server answers 200 or
//! the process goes; a model that is ready already is not loaded again. Readiness stays the server's own `ModelReady`: a load that succeeded
//! shows there, and nothing is routed before it.
//!
//! A load starts as its process is launched (a move waits for the new process to be ready
//! before it drains the old one) and runs as a task of its own, so a server that takes
//! minutes to load (an LLM's weights) holds up no reconcile round; each round asks again for
//! processes the supervisor relaunched.

use crate::telemetry::AgentMetrics;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

/// How long one load may take: Triton answers once the model is loaded, and loading a large
/// model's weights takes minutes. A load not answered by then is asked again.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// Bytes of a server's answer to a load that are read (its reason when it refuses).
pub const MAX_LOAD_ANSWER_BYTES: usize = 64 << 10;

/// How long asking whether the model is ready already may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Delay between attempts while the server does not take connections yet (it is starting).
const STARTING_RETRY: Duration = Duration::from_millis(200);

/// A process whose model the agent loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadTarget {
    pub process: String,
    /// Its pid: a process the supervisor restarted is another launch, loaded again.
    pub pid: u32,
    pub service: String,
    pub model: String,
    pub http_port: u16,
}

/// The loads under way or done, by process id, run on `runtime`.
pub struct ModelLoads {
    runtime: Handle,
    telemetry: AgentMetrics,
    loads: BTreeMap<String, Load>,
}

struct Load {
    pid: u32,
    task: AbortHandle,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What `sync` does: the loads to start, and the processes whose load is dropped (the
/// process is gone or was launched again).
#[derive(Debug, PartialEq, Eq)]
pub struct LoadChanges {
    pub start: Vec<LoadTarget>,
    pub drop: Vec<String>,
}

/// The changes from the loads under way (`pid` by process) to `targets`: one load per
/// launch, never two.
pub fn changes(under_way: &BTreeMap<String, u32>, targets: &[LoadTarget]) -> LoadChanges {
    let wanted: BTreeMap<&str, &LoadTarget> = targets.iter().map(|t| (t.process.as_str(), t)).collect();
    let drop =
        under_way.iter().filter(|(id, pid)| wanted.get(id.as_str()).is_none_or(|t| t.pid != **pid)).map(|(id, _)| id.clone()).collect();
    let start = targets.iter().filter(|t| under_way.get(&t.process) != Some(&t.pid)).cloned().collect();
    LoadChanges { start, drop }
}

impl ModelLoads {
    pub fn new(runtime: Handle, telemetry: AgentMetrics) -> Self {
        ModelLoads { runtime, telemetry, loads: BTreeMap::new() }
    }

    /// Starts a load for each target launched since its last one, and stops the loads of
    /// processes that are no longer targets.
    pub fn sync(&mut self, targets: &[LoadTarget]) {
        let under_way = self.loads.iter().map(|(id, l)| (id.clone(), l.pid)).collect();
        let LoadChanges { start, drop } = changes(&under_way, targets);
        for id in drop {
            self.loads.remove(&id);
        }
        for t in start {
            let task = self.runtime.spawn(load(t.clone(), self.telemetry.clone())).abort_handle();
            self.loads.insert(t.process, Load { pid: t.pid, task });
        }
    }
}

/// Asks the server to load its model until it answers 200; a refusal is logged with the
/// server's own reason and asked again after a back-off that doubles up to 30 s.
async fn load(t: LoadTarget, telemetry: AgentMetrics) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, t.http_port));
    let path = format!("/v2/repository/models/{}/load", t.model);
    let ready_path = format!("/v2/models/{}/ready", t.model);
    let mut refusals = 0;
    loop {
        // A model that is ready already (a process adopted after an agent restart) is not
        // loaded again: Triton would reload it, its weights twice in memory for a while.
        if let Ok(Ok((200, _))) =
            tokio::time::timeout(STATUS_TIMEOUT, telemetry_http::get_bounded(addr, &ready_path, MAX_LOAD_ANSWER_BYTES)).await
        {
            tracing::debug!(process = t.process, model = t.model, "model ready already");
            return;
        }
        let answer = tokio::time::timeout(LOAD_TIMEOUT, telemetry_http::post_bounded(addr, &path, MAX_LOAD_ANSWER_BYTES)).await;
        match answer {
            Ok(Ok((200, _))) => {
                tracing::info!(process = t.process, service = t.service, model = t.model, "model loaded");
                telemetry.model_load(&t.service, "loaded");
                return;
            }
            Ok(Ok((status, reason))) => {
                tracing::warn!(
                    process = t.process,
                    service = t.service,
                    model = t.model,
                    status,
                    reason = reason.trim(),
                    "the server refused to load the model; asking again"
                );
                telemetry.model_load(&t.service, "refused");
                tokio::time::sleep(crate::supervisor::restart_delay(refusals)).await;
                refusals += 1;
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => tokio::time::sleep(STARTING_RETRY).await,
            Ok(Err(e)) => {
                tracing::warn!(process = t.process, model = t.model, error = %e, "the model load was not answered; asking again");
                tokio::time::sleep(crate::supervisor::restart_delay(refusals)).await;
                refusals += 1;
            }
            Err(_) => tracing::warn!(process = t.process, model = t.model, "the model load took over {LOAD_TIMEOUT:?}; asking again"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(process: &str, pid: u32) -> LoadTarget {
        LoadTarget { process: process.into(), pid, service: "web".into(), model: "m".into(), http_port: 1 }
    }

    #[test]
    fn each_launch_is_loaded_once_and_a_gone_or_relaunched_process_drops_its_load() {
        let under_way: BTreeMap<String, u32> = [("a".to_string(), 10), ("b".to_string(), 11), ("c".to_string(), 12)].into();
        let targets = [target("a", 10), target("b", 21), target("d", 13)];
        let c = changes(&under_way, &targets);
        // a is under way: nothing; b was restarted: dropped and loaded again; c is gone; d is new.
        assert_eq!(c.drop, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(c.start, vec![target("b", 21), target("d", 13)]);
        let none = changes(&[("a".to_string(), 10)].into(), &[target("a", 10)]);
        assert_eq!(none, LoadChanges { start: vec![], drop: vec![] });
    }

    /// A server that refuses the first load (its reason logged, counted) and takes the second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_load_is_counted_and_asked_again_until_the_server_takes_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let asked = Arc::new(AtomicUsize::new(0));
        let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (a, p) = (asked.clone(), paths.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut held = Vec::new();
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                let line = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_string();
                if line.starts_with("GET /v2/models/m/ready ") {
                    s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 21\r\n\r\n{\"error\":\"not ready\"}").await.unwrap();
                    continue;
                }
                p.lock().unwrap().push(line);
                let answer = if a.fetch_add(1, Ordering::SeqCst) == 0 {
                    "HTTP/1.1 400 Bad Request\r\nContent-Length: 42\r\n\r\n{\"error\":\"failed to load 'm': no version\"}"
                } else {
                    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
                };
                s.write_all(answer.as_bytes()).await.unwrap();
                // As Triton 2.51 does after a first load: the connection stays open.
                held.push(s);
            }
        });
        let telemetry = AgentMetrics::default();
        let t = LoadTarget { http_port: port, ..target("a", 1) };
        load(t.clone(), telemetry.clone()).await;
        server.abort();
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert_eq!(paths.lock().unwrap()[0], "POST /v2/repository/models/m/load HTTP/1.1");
        let text = telemetry.render(&Default::default());
        assert!(text.contains("gpuplane_agent_model_loads_total{service=\"web\",outcome=\"refused\"} 1"), "{text}");
        assert!(text.contains("gpuplane_agent_model_loads_total{service=\"web\",outcome=\"loaded\"} 1"), "{text}");
    }

    /// A process adopted after an agent restart serves its model already: no load.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_model_ready_already_is_not_loaded_again() {
        use std::sync::{Arc, Mutex};
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                l.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_string());
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.unwrap();
            }
        });
        let telemetry = AgentMetrics::default();
        load(LoadTarget { http_port: port, ..target("a", 1) }, telemetry.clone()).await;
        server.abort();
        assert_eq!(*lines.lock().unwrap(), vec!["GET /v2/models/m/ready HTTP/1.1".to_string()]);
        assert!(!telemetry.render(&Default::default()).contains("model_loads_total{"));
    }
}
