//! What the runner learns from the controllers' own status: who leads in which term, how
//! far each node has applied, and a background poller that counts leader changes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controlplane::client::Client;
use controlplane::security::ClientCredentials;

/// Status of every controller in `addrs` that answers within the client's deadline.
pub async fn statuses(client: &Client, addrs: &[(u64, String)]) -> Vec<(u64, proto::ClusterStatusResponse)> {
    let polls = addrs.iter().map(|(id, addr)| async move { client.node_status(addr).await.ok().map(|s| (*id, s)) });
    futures::future::join_all(polls).await.into_iter().flatten().collect()
}

/// The node that says it leads, in the highest term any answering node reports.
pub async fn leader(client: &Client, addrs: &[(u64, String)]) -> Option<(u64, u64)> {
    let all = statuses(client, addrs).await;
    let top = all.iter().map(|(_, s)| s.term).max()?;
    all.iter().find(|(_, s)| s.state == "Leader" && s.term == top).map(|(id, s)| (*id, s.term))
}

pub async fn wait_leader(client: &Client, addrs: &[(u64, String)], within: Duration) -> Result<u64, String> {
    let deadline = Instant::now() + within;
    loop {
        if let Some((id, _)) = leader(client, addrs).await {
            return Ok(id);
        }
        if Instant::now() > deadline {
            return Err(format!("no leader within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until node `id` follows a leader and has applied everything that leader committed.
pub async fn wait_caught_up(client: &Client, addrs: &[(u64, String)], id: u64, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let addr = &addrs.iter().find(|(i, _)| *i == id).ok_or(format!("no controller {id}"))?.1;
    loop {
        let node = client.node_status(addr).await.ok();
        let leader = leader(client, addrs).await;
        if let (Some(node), Some((leader_id, _))) = (node, leader) {
            let commit = statuses(client, addrs).await.into_iter().find(|(i, _)| *i == leader_id).map(|(_, s)| s.commit_index);
            if node.leader_id == leader_id && commit.is_some_and(|c| node.applied_index >= c) {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > within {
            return Err(format!("controller {id} did not catch up with the leader within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls every controller in the background and records each (term, leader) it sees.
pub struct LeaderWatch {
    seen: Arc<Mutex<BTreeSet<(u64, u64)>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderWatch {
    pub fn start(addrs: Vec<(u64, String)>, credentials: ClientCredentials) -> LeaderWatch {
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let servers = addrs.iter().map(|(_, a)| a.clone()).collect();
            let client = Client::with_credentials(servers, credentials).expect("the runner's credentials are valid");
            while !st.load(Ordering::Relaxed) {
                for (_, status) in statuses(&client, &addrs).await {
                    if status.leader_id != 0 {
                        s.lock().unwrap().insert((status.term, status.leader_id));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        LeaderWatch { seen, stop, task }
    }

    /// Leader changes observed so far: distinct (term, leader) pairs after the first.
    pub fn changes(&self) -> u64 {
        self.seen.lock().unwrap().len().saturating_sub(1) as u64
    }

    pub async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let LeaderWatch { seen, task, .. } = self;
        let _ = task.await;
        let changes = seen.lock().unwrap().len().saturating_sub(1) as u64;
        changes
    }
}
