//! The client workload: a few sequential clients doing register reads and writes on a few
//! keys, continuously, recording every operation in the run's [`History`].
//!
//! A key is a Tenant resource and its value the Tenant's `display_name` (a Tenant changes
//! no plan, so the workload does not disturb the agents). A write is an upsert with a
//! request id chosen once: every retry of it carries the same id and applies at most once.
//! A read is a linearizable Get.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controlplane::client::{Client, RetryPolicy};
use tonic::Code;

use super::cluster::Access;
use crate::history::{ClientRecorder, History, Op, Ret};

/// How long a write is retried (same request id) before its outcome is recorded unknown.
const WRITE_PATIENCE: Duration = Duration::from_secs(10);
const READ_PATIENCE: Duration = Duration::from_secs(5);
/// Pause between one client's operations: keeps the history small enough to check and the
/// 2-core machines this runs on responsive.
const THINK_TIME: Duration = Duration::from_millis(15);

pub fn key_name(i: usize) -> String {
    format!("chaos-k{i}")
}

fn tenant(key: &str, value: &str) -> proto::Resource {
    proto::Resource {
        kind: "Tenant".into(),
        name: key.into(),
        spec_json: serde_json::json!({ "display_name": value }).to_string(),
        ..Default::default()
    }
}

fn value_of(resource: &proto::Resource) -> Option<String> {
    let spec: serde_json::Value = serde_json::from_str(&resource.spec_json).ok()?;
    spec["display_name"].as_str().map(str::to_string)
}

/// Refusals that come before anything is proposed: the write certainly had no effect.
fn refused_before_proposal(code: Code) -> bool {
    matches!(code, Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists | Code::NotFound | Code::PermissionDenied)
}

fn client_for(access: &Access) -> Client {
    // Short attempts (as raft-bench's), retried without end: the patience above bounds the
    // whole operation, and an attempt stuck on a dead or paused node costs little of it.
    let attempt = RetryPolicy { attempts: u32::MAX, backoff: Duration::from_millis(20), timeout: Duration::from_millis(300) };
    access.client().with_retry(attempt)
}

/// An acknowledged write: when it was invoked and when its acknowledgement arrived.
#[derive(Clone, Copy, Debug)]
pub struct Ack {
    pub invoked: Instant,
    pub returned: Instant,
}

/// How one write ended.
pub enum WriteOutcome {
    Acknowledged(Ack),
    /// Refused before it was proposed: certainly no effect.
    Failed,
    /// No answer within the patience: it may or may not take effect.
    Unknown,
}

/// One write on `key`, recorded.
pub async fn write(client: &Client, rec: &mut ClientRecorder, key: &str, value: String) -> WriteOutcome {
    let invoked = Instant::now();
    let id = rec.invoke(key, Op::Write(value.clone()));
    let request_id = uuid::Uuid::new_v4().to_string();
    let put = client.put_with_id(tenant(key, &value), proto::WriteMode::Unspecified, &request_id);
    match tokio::time::timeout(WRITE_PATIENCE, put).await {
        Ok(Ok(_)) => {
            rec.returned(id, Ret::WriteOk);
            WriteOutcome::Acknowledged(Ack { invoked, returned: Instant::now() })
        }
        Ok(Err(status)) if refused_before_proposal(status.code()) => {
            rec.failed(id);
            WriteOutcome::Failed
        }
        _ => {
            rec.unknown(id);
            WriteOutcome::Unknown
        }
    }
}

/// One linearizable read of `key`, recorded; `Some` when it returned.
pub async fn read(client: &Client, rec: &mut ClientRecorder, key: &str) -> Option<Option<String>> {
    let id = rec.invoke(key, Op::Read);
    match tokio::time::timeout(READ_PATIENCE, client.get("Tenant", key, false)).await {
        Ok(Ok(resource)) => {
            let value = value_of(&resource);
            rec.returned(id, Ret::ReadOk(value.clone()));
            Some(value)
        }
        Ok(Err(status)) if status.code() == Code::NotFound => {
            rec.returned(id, Ret::ReadOk(None));
            Some(None)
        }
        // A read has no effect, whatever happened to it.
        _ => {
            rec.failed(id);
            None
        }
    }
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Counts {
    pub attempted: u64,
    pub acknowledged: u64,
    pub failed: u64,
    pub unknown: u64,
}

pub struct Workload {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Counts>>,
    /// Every acknowledged write, in the order acknowledged.
    pub acks: Arc<Mutex<Vec<Ack>>>,
    pub started: Instant,
}

impl Workload {
    /// Starts `clients` clients over `keys` keys against the cluster.
    pub fn start(history: &History, access: &Access, clients: usize, keys: usize) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|c| {
                let (stop, acks, mut rec, client) = (stop.clone(), acks.clone(), history.client(), client_for(access));
                tokio::spawn(async move {
                    let mut counts = Counts::default();
                    // A small deterministic mix per client: writes and reads alternate over the keys.
                    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let key = key_name((state % keys as u64) as usize);
                        counts.attempted += 1;
                        if (state >> 32).is_multiple_of(2) {
                            let value = format!("c{c}-{}", counts.attempted);
                            match write(&client, &mut rec, &key, value).await {
                                WriteOutcome::Acknowledged(ack) => {
                                    counts.acknowledged += 1;
                                    acks.lock().unwrap().push(ack);
                                }
                                WriteOutcome::Failed => counts.failed += 1,
                                WriteOutcome::Unknown => counts.unknown += 1,
                            }
                        } else if read(&client, &mut rec, &key).await.is_some() {
                            counts.acknowledged += 1;
                        } else {
                            counts.failed += 1;
                        }
                        tokio::time::sleep(THINK_TIME).await;
                    }
                    counts
                })
            })
            .collect();
        Workload { stop, tasks, acks, started: Instant::now() }
    }

    /// Stops the clients (each finishes its operation in flight) and sums their counts.
    pub async fn stop(self) -> Counts {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = Counts::default();
        for t in self.tasks {
            let c = t.await.unwrap_or_default();
            total.attempted += c.attempted;
            total.acknowledged += c.acknowledged;
            total.failed += c.failed;
            total.unknown += c.unknown;
        }
        total
    }
}

/// Reads every key once the faults are healed, retrying until each read returns (as history
/// operations, so the check sees the final values).
pub async fn final_reads(history: &History, access: &Access, keys: usize, within: Duration) -> Result<(), String> {
    let client = client_for(access);
    let mut rec = history.client();
    let deadline = Instant::now() + within;
    for k in 0..keys {
        let key = key_name(k);
        while read(&client, &mut rec, &key).await.is_none() {
            if Instant::now() > deadline {
                return Err(format!("the final read of {key} did not succeed within {within:?}"));
            }
        }
    }
    Ok(())
}
