//! Simulated API clients: each runs register operations (a write is an upsert of a Tenant
//! whose display name holds the value, a read is a linearizable Get) on a few keys and
//! records them in the shared history; and the operator, who loads the catalogue and
//! changes a service's request rate now and then, so that new plans are committed.

use std::time::Duration;

use controlplane::client::{Client, RetryPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use super::fleet;
use super::net::sim_channels;
use super::phase::{now_ms, Phase, Stage, Trace};
use crate::history::{ClientRecorder, History, Op, Ret};

/// Register keys (Tenant names).
pub fn keys(count: usize) -> Vec<String> {
    (0..count).map(|k| format!("key{k}")).collect()
}

pub fn client_host(i: usize) -> String {
    format!("client{i}")
}

pub const OPERATOR_HOST: &str = "ops";

/// Times a client sends one write (same request id) before it calls the outcome unknown.
const WRITE_ROUNDS: u32 = 3;

fn sim_client(controllers: Vec<String>) -> Client {
    let retry = RetryPolicy { attempts: 4, backoff: Duration::from_millis(100), timeout: Duration::from_secs(1) };
    Client::new(controllers).with_channels(sim_channels()).with_retry(retry)
}

/// Errors that prove a write was refused before it was proposed.
fn refused(code: Code) -> bool {
    matches!(code, Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists | Code::NotFound)
}

struct RegisterClient {
    name: String,
    client: Client,
    recorder: ClientRecorder,
    trace: Trace,
    writes: u64,
}

impl RegisterClient {
    async fn write(&mut self, key: &str) {
        self.writes += 1;
        let value = format!("{}-{}", self.name, self.writes);
        let request_id = format!("{}-w{}", self.name, self.writes);
        let tenant = fleet::resource("Tenant", key, "", serde_json::json!({ "display_name": value }));
        let id = self.recorder.invoke(key, Op::Write(value.clone()));
        for _ in 0..WRITE_ROUNDS {
            match self.client.put_with_id(tenant.clone(), proto::WriteMode::Unspecified, &request_id).await {
                Ok(_) => {
                    self.trace.event(now_ms(), format!("{} write {key}={value} ok", self.name));
                    self.recorder.returned(id, Ret::WriteOk);
                    return;
                }
                Err(status) if refused(status.code()) => {
                    self.trace.event(now_ms(), format!("{} write {key}={value} refused", self.name));
                    self.recorder.failed(id);
                    return;
                }
                Err(_) => {}
            }
        }
        self.trace.event(now_ms(), format!("{} write {key}={value} unknown", self.name));
        self.recorder.unknown(id);
    }

    /// Returns whether the read got an answer.
    async fn read(&mut self, key: &str) -> bool {
        let id = self.recorder.invoke(key, Op::Read);
        let value = match self.client.get("Tenant", key, false).await {
            Ok(r) => {
                let spec: serde_json::Value = serde_json::from_str(&r.spec_json).unwrap_or_default();
                Some(spec["display_name"].as_str().unwrap_or_default().to_string())
            }
            Err(status) if status.code() == Code::NotFound => None,
            Err(_) => {
                self.trace.event(now_ms(), format!("{} read {key} failed", self.name));
                self.recorder.failed(id);
                return false;
            }
        };
        self.trace.event(now_ms(), format!("{} read {key}={value:?}", self.name));
        self.recorder.returned(id, Ret::ReadOk(value));
        true
    }
}

/// Runs one register client until the final reads, then reads every key until each read
/// gets an answer.
pub async fn run_register_client(
    name: String,
    seed: u64,
    keys: Vec<String>,
    controllers: Vec<String>,
    history: History,
    phase: Phase,
    trace: Trace,
) -> turmoil::Result {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut c = RegisterClient { name, client: sim_client(controllers), recorder: history.client(), trace, writes: 0 };
    while phase.get() != Stage::FinalReads {
        let key = keys[rng.random_range(0..keys.len())].clone();
        if rng.random_bool(0.5) {
            c.write(&key).await;
        } else {
            c.read(&key).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..300))).await;
    }
    for key in &keys {
        while !c.read(key).await {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    c.trace.event(now_ms(), format!("{} stopped", c.name));
    Ok(())
}

/// Loads the catalogue and the services, then moves the changing service between rates
/// while faults are injected.
pub async fn run_operator(seed: u64, controllers: Vec<String>, phase: Phase, trace: Trace) -> turmoil::Result {
    let mut rng = SmallRng::seed_from_u64(seed);
    let client = sim_client(controllers);
    let setup = fleet::catalogue().into_iter().chain(fleet::services(fleet::RATES[1]));
    for (i, resource) in setup.enumerate() {
        let request_id = format!("setup-{i}");
        while client.put_with_id(resource.clone(), proto::WriteMode::Unspecified, &request_id).await.is_err() {
            if phase.get() == Stage::FinalReads {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    trace.event(now_ms(), "operator: catalogue and services loaded".into());
    let mut change = 0;
    while phase.get() == Stage::Faults {
        // Wait in short steps, so that the operator stops as soon as the faults end.
        let pause = rng.random_range(20..60);
        for _ in 0..pause {
            if phase.get() != Stage::Faults {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if phase.get() != Stage::Faults {
            break;
        }
        change += 1;
        let rate = fleet::RATES[rng.random_range(0..fleet::RATES.len())];
        let service = fleet::service(fleet::CHANGING_SERVICE, "resnet50", rate);
        // A change that is never acknowledged is fine: the plan follows whatever committed.
        let outcome = client.put_with_id(service, proto::WriteMode::Unspecified, &format!("rate-{change}")).await;
        trace.event(now_ms(), format!("operator: {} at {rate} req/s: {}", fleet::CHANGING_SERVICE, outcome.is_ok()));
    }
    trace.event(now_ms(), "operator stopped".into());
    Ok(())
}
