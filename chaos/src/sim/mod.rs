//! Deterministic simulation of the replicated controller with turmoil: 3 or 5 real
//! controllers (Raft, state machine, gRPC services, leader-only loops) on in-memory disks,
//! simulated node agents and API clients, all in one seeded simulation with crashes,
//! partitions, message loss and delay and slow disks. Checked throughout: at most one
//! leader per term, every committed plan legal; after the faults heal: every agent holds the
//! latest plan; at the end: the clients' history is linearizable (so no acknowledged write
//! was lost).
//!
//! Replay. Everything the simulation draws comes from the seed (faults, client operations,
//! election timeouts: openraft draws them in `[min, max)`, so `max = min + 1` pins them;
//! turmoil's message latencies; with `--cfg tokio_unstable`, set in `.cargo/config.toml`,
//! the order in which `tokio::select!` polls its branches), time is turmoil's, the channels
//! keep h2 from reading the wall clock for reset streams (see `net`), and nothing iterates a
//! hash map in a way that sends messages (peer channels close in address order). A seed
//! replays identically, event for event (`chaos sim --seed S --trace` twice gives the same
//! trace; `--net-log FILE` writes every simulated segment to compare two runs). What still
//! differs between runs is hyper's `date` response header (wall clock): those bytes differ,
//! and the replay test checks that nothing the run does depends on them.

mod agents;
mod clients;
mod cluster;
mod faults;
mod fleet;
mod invariants;
mod net;
mod phase;
mod report;

pub use faults::Fault;
pub use report::{SimFailure, SimReport, Totals};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use controlplane::controller::Controller;
use controlplane::resources::Kind;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::history::{self, History};
use agents::{agent_host, node_name, AgentViews};
use clients::{client_host, keys, run_operator, run_register_client, OPERATOR_HOST};
use cluster::{add_controller, controller_addr, controller_host, Disk, Running};
use faults::Scheduled;
use invariants::{agents_with_work, check_plan, unconverged, unsettled, AppliedStates, LeadersPerTerm};
use phase::{Phase, Stage, Trace};

/// One simulated step.
const TICK: Duration = Duration::from_millis(2);
/// Message latency outside delay faults.
const MIN_LATENCY: Duration = Duration::from_millis(1);
const MAX_LATENCY: Duration = Duration::from_millis(10);
/// How often the settling stage looks for convergence.
const CONVERGENCE_POLL: Duration = Duration::from_millis(100);

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Controllers: 3 or 5.
    pub controllers: u64,
    pub agents: usize,
    pub clients: usize,
    /// Register keys the clients share.
    pub keys: usize,
    /// Faults drawn over the fault window.
    pub faults: usize,
    pub fault_window: Duration,
    /// After the faults heal, every agent must hold the latest plan within this.
    pub converge_within: Duration,
    /// Then every client's final reads must finish within this.
    pub final_reads_within: Duration,
    /// Keep every event of the trace in the report (for comparing two runs).
    pub keep_trace: bool,
}

impl SimOptions {
    /// A short run, as CI runs hundreds of seeds.
    pub fn ci() -> Self {
        Self {
            controllers: 3,
            agents: 3,
            clients: 3,
            keys: 3,
            faults: 4,
            fault_window: Duration::from_secs(10),
            converge_within: Duration::from_secs(30),
            final_reads_within: Duration::from_secs(30),
            keep_trace: false,
        }
    }

    /// A longer run with more faults and five controllers (`chaos sim --soak`).
    pub fn soak() -> Self {
        Self { controllers: 5, agents: 4, clients: 4, faults: 30, fault_window: Duration::from_secs(60), ..Self::ci() }
    }

    /// Refuses shapes the simulation does not support, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.controllers, 3 | 5) {
            return Err(format!("controllers: must be 3 or 5, got {}", self.controllers));
        }
        for (field, n) in [("agents", self.agents), ("clients", self.clients), ("keys", self.keys)] {
            if n == 0 {
                return Err(format!("{field}: must be at least 1"));
            }
        }
        if self.fault_window < Duration::from_secs(2) {
            return Err(format!("fault_window: must be at least 2 s, got {:?}", self.fault_window));
        }
        Ok(())
    }
}

/// Distinct election timeouts, drawn from the seed.
fn election_timeouts(rng: &mut SmallRng, members: u64) -> BTreeMap<u64, u64> {
    let mut slots: Vec<u64> = (0..members).map(|i| 200 + 60 * i).collect();
    slots.shuffle(rng);
    (1..=members).zip(slots).map(|(id, slot)| (id, slot + rng.random_range(0..30))).collect()
}

/// How to undo a fault when it ends.
enum Undo {
    Restart(u64),
    Repair(Vec<(String, String)>),
    RepairOneway(String, String),
    FailRate,
    Latency,
    Disk(u64),
    /// Nothing: the fault is over by itself.
    Nothing,
}

/// What the trace notes of a controller's Raft: term, leader, last log index, applied index.
type RaftView = (u64, Option<u64>, Option<u64>, Option<u64>);

/// The simulation, its shared state and the checks' state.
struct Run<'a> {
    seed: u64,
    sim: turmoil::Sim<'a>,
    running: Running,
    disks: BTreeMap<u64, Arc<Disk>>,
    hosts: Vec<String>,
    members: u64,
    crashed: BTreeSet<u64>,
    trace: Trace,
    leaders: LeadersPerTerm,
    applied: AppliedStates,
    plans: BTreeSet<u64>,
    /// Per controller: term, leader, last log index, applied index, as last traced.
    raft_seen: BTreeMap<u64, RaftView>,
    views: AgentViews,
}

impl Run<'_> {
    fn failure(&self, reason: String) -> SimFailure {
        let kept = self.trace.all();
        let recent_events = if kept.is_empty() { self.trace.tail() } else { kept };
        SimFailure { seed: self.seed, at: self.sim.elapsed(), reason, recent_events }
    }

    fn note(&self, what: String) {
        self.trace.event(self.sim.elapsed().as_millis(), what);
    }

    fn controllers(&self) -> Vec<Controller> {
        self.running.lock().unwrap().values().cloned().collect()
    }

    /// The leader with the highest term among the running controllers.
    fn leader(&self) -> Option<Controller> {
        self.controllers()
            .into_iter()
            .filter(|c| c.is_leader())
            .max_by_key(|c| controlplane::raft::consensus::metrics(&c.raft).current_term)
    }

    fn crash(&mut self, id: u64) {
        self.sim.crash(controller_host(id));
        self.running.lock().unwrap().remove(&id);
        self.crashed.insert(id);
    }

    fn restart(&mut self, id: u64) {
        if self.crashed.remove(&id) {
            self.sim.bounce(controller_host(id));
        }
    }

    fn partition(&self, pairs: &[(String, String)]) {
        for (a, b) in pairs {
            self.sim.partition(a.as_str(), b.as_str());
        }
    }

    /// Starts `s.fault`; returns how to undo it, `None` when it could not apply.
    fn start(&mut self, s: &Scheduled) -> Option<Undo> {
        let others = |me: &str, hosts: &[String]| -> Vec<(String, String)> {
            hosts.iter().filter(|h| *h != me).map(|h| (me.to_string(), h.clone())).collect()
        };
        match s.fault {
            Fault::Crash { node } => {
                if self.crashed.contains(&node) {
                    return None;
                }
                self.crash(node);
                Some(Undo::Restart(node))
            }
            Fault::Isolate { node } => {
                let pairs = others(&controller_host(node), &self.hosts);
                self.partition(&pairs);
                Some(Undo::Repair(pairs))
            }
            Fault::OneWay { from, to } => {
                let (a, b) = (controller_host(from), controller_host(to));
                self.sim.partition_oneway(a.as_str(), b.as_str());
                Some(Undo::RepairOneway(a, b))
            }
            Fault::IsolateLeader => {
                let leader = self.leader()?;
                let peers: Vec<String> = (1..=self.members).filter(|m| *m != leader.id).map(controller_host).collect();
                let pairs = others(&controller_host(leader.id), &peers);
                self.partition(&pairs);
                Some(Undo::Repair(pairs))
            }
            Fault::Loss { fail_rate_percent } => {
                self.sim.set_fail_rate(f64::from(fail_rate_percent) / 100.0);
                Some(Undo::FailRate)
            }
            Fault::Delay { max_ms } => {
                self.sim.set_max_message_latency(Duration::from_millis(max_ms));
                Some(Undo::Latency)
            }
            Fault::SlowDisk { node, delay_ms } => {
                self.disks[&node].set_write_delay(Duration::from_millis(delay_ms));
                Some(Undo::Disk(node))
            }
            Fault::TransferLeader { to } => {
                let leader = self.leader()?;
                if leader.id == to || self.crashed.contains(&to) {
                    return None;
                }
                // Queues the command for the leader's Raft core, which acts on it when the
                // simulation steps its host. Not waited for: with the core's queue full, or its
                // core stopped, the fault does not apply now.
                futures::FutureExt::now_or_never(leader.raft.trigger().transfer_leader(to))?.ok()?;
                Some(Undo::Nothing)
            }
        }
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Restart(id) => {
                self.note(format!("restart c{id}"));
                self.restart(id);
            }
            Undo::Repair(pairs) => {
                for (a, b) in pairs {
                    self.sim.repair(a.as_str(), b.as_str());
                }
            }
            Undo::RepairOneway(a, b) => self.sim.repair_oneway(a.as_str(), b.as_str()),
            Undo::FailRate => self.sim.set_fail_rate(0.0),
            Undo::Latency => self.sim.set_max_message_latency(MAX_LATENCY),
            Undo::Disk(id) => self.disks[&id].set_write_delay(Duration::ZERO),
            Undo::Nothing => {}
        }
    }

    /// The checks after every step.
    fn observe(&mut self) -> Result<(), SimFailure> {
        for c in self.controllers() {
            match self.leaders.observe(&c) {
                Err(e) => return Err(self.failure(e)),
                Ok(Some((term, leader))) => self.note(format!("term {term}: leader c{leader}")),
                Ok(None) => {}
            }
            self.applied.observe(&c).map_err(|e| self.failure(e))?;
            let m = controlplane::raft::consensus::metrics(&c.raft);
            let now = (m.current_term, m.current_leader, m.last_log_index, m.last_applied.map(|l| l.index));
            if self.raft_seen.insert(c.id, now) != Some(now) {
                self.note(format!("c{} term {} leader {:?} log {:?} applied {:?}", c.id, now.0, now.1, now.2, now.3));
            }
            let revision = c.read(|d| d.cluster.get(Kind::Plan, "current").map(|p| p.mod_revision));
            if let Some(revision) = revision.filter(|r| !self.plans.contains(r)) {
                c.read(|d| check_plan(&d.cluster)).map_err(|e| self.failure(format!("controller {}: {e}", c.id)))?;
                self.note(format!("plan at revision {revision} checked"));
                self.plans.insert(revision);
            }
        }
        let refused = self.views.lock().unwrap().iter().find_map(|(node, v)| v.refused.clone().map(|r| format!("agent {node}: {r}")));
        match refused {
            Some(r) => Err(self.failure(r)),
            None => Ok(()),
        }
    }

    fn step(&mut self) -> Result<bool, SimFailure> {
        let finished = self.sim.step().map_err(|e| self.failure(format!("simulation: {e}")))?;
        self.observe()?;
        Ok(finished)
    }
}

/// Runs one seeded simulation and checks it.
pub fn run_seed(seed: u64, opts: &SimOptions) -> Result<SimReport, SimFailure> {
    opts.validate().map_err(|reason| SimFailure { seed, at: Duration::ZERO, reason, recent_events: vec![] })?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let sim = turmoil::Builder::new()
        .simulation_duration(opts.fault_window + opts.converge_within + opts.final_reads_within)
        .tick_duration(TICK)
        .min_message_latency(MIN_LATENCY)
        .max_message_latency(MAX_LATENCY)
        .epoch(UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .rng_seed(seed)
        .build();
    let members = opts.controllers;
    let mut run = Run {
        seed,
        sim,
        running: Running::default(),
        disks: (1..=members).map(|id| (id, Arc::new(Disk::default()))).collect(),
        hosts: vec![],
        members,
        crashed: BTreeSet::new(),
        trace: Trace::new(opts.keep_trace),
        leaders: LeadersPerTerm::default(),
        applied: AppliedStates::default(),
        plans: BTreeSet::new(),
        raft_seen: BTreeMap::new(),
        views: AgentViews::default(),
    };
    let timeouts = election_timeouts(&mut rng, members);
    for id in 1..=members {
        add_controller(&mut run.sim, id, members, timeouts[&id], run.disks[&id].clone(), run.running.clone());
        run.hosts.push(controller_host(id));
    }
    let addrs: Vec<String> = (1..=members).map(controller_addr).collect();
    let phase = Phase::default();
    let history = History::new();
    let nodes: Vec<String> = (1..=opts.agents).map(node_name).collect();
    for (i, node) in nodes.iter().enumerate() {
        let agent = agents::run(node.clone(), addrs.clone(), phase.clone(), run.views.clone(), run.trace.clone());
        run.sim.client(agent_host(i + 1), agent);
        run.hosts.push(agent_host(i + 1));
    }
    run.sim.client(OPERATOR_HOST, run_operator(rng.random(), addrs.clone(), phase.clone(), run.trace.clone()));
    run.hosts.push(OPERATOR_HOST.to_string());
    for i in 1..=opts.clients {
        let client = run_register_client(
            client_host(i),
            rng.random(),
            keys(opts.keys),
            addrs.clone(),
            history.clone(),
            phase.clone(),
            run.trace.clone(),
        );
        run.sim.client(client_host(i), client);
        run.hosts.push(client_host(i));
    }

    let schedule = faults::schedule(&mut rng, members, opts.fault_window, opts.faults);
    let mut pending = schedule.iter().peekable();
    let mut active: Vec<(Duration, Undo)> = Vec::new();
    let mut healed_at = Duration::ZERO;
    let mut next_poll = Duration::ZERO;
    let mut converged_after = None;
    let mut working_agents = 0;
    let mut injected: Vec<Scheduled> = Vec::new();
    loop {
        let now = run.sim.elapsed();
        match phase.get() {
            Stage::Faults if now >= opts.fault_window => {
                for (_, undo) in std::mem::take(&mut active) {
                    run.undo(undo);
                }
                for id in run.crashed.clone() {
                    run.restart(id);
                }
                run.note("every fault healed".into());
                phase.set(Stage::Settling);
                healed_at = now;
            }
            Stage::Faults => {
                while let Some(s) = pending.next_if(|s| s.at <= now) {
                    match run.start(s) {
                        Some(undo) => {
                            run.note(format!("fault for {} ms: {}", s.lasts.as_millis(), s.fault));
                            active.push((now + s.lasts, undo));
                            injected.push(s.clone());
                        }
                        None => run.note(format!("fault not applicable now: {}", s.fault)),
                    }
                }
                let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut active).into_iter().partition(|(end, _)| *end <= now);
                active = later;
                for (_, undo) in due {
                    run.undo(undo);
                }
            }
            Stage::Settling if now >= next_poll => {
                next_poll = now + CONVERGENCE_POLL;
                let waiting = match run.leader() {
                    None => Some("no leader".to_string()),
                    Some(leader) => unsettled(&leader, &run.controllers(), members).or_else(|| unconverged(&leader, &nodes, &run.views)),
                };
                match waiting {
                    None => {
                        converged_after = Some(now - healed_at);
                        working_agents = agents_with_work(&run.views);
                        run.note("agents converged".into());
                        phase.set(Stage::FinalReads);
                    }
                    Some(why) if now - healed_at > opts.converge_within => {
                        return Err(run.failure(format!("agents did not converge within {:?} of healing: {why}", opts.converge_within)));
                    }
                    Some(_) => {}
                }
            }
            _ => {}
        }
        if run.step()? {
            break;
        }
    }
    let verdict = history::check(&history);
    if !verdict.linearizable {
        let why = verdict.failure.clone().unwrap_or_default();
        return Err(run.failure(format!("client history is not linearizable: {why}")));
    }
    Ok(SimReport {
        seed,
        faults_by_kind: faults::count_by_kind(&injected),
        faults: injected
            .iter()
            .map(|s| format!("at {:.2} s for {:.2} s: {}", s.at.as_secs_f64(), s.lasts.as_secs_f64(), s.fault))
            .collect(),
        terms_with_leader: run.leaders.terms(),
        plans_checked: run.plans.len(),
        verdict,
        converged_after: converged_after.unwrap_or_default(),
        agents_with_work: working_agents,
        simulated: run.sim.elapsed(),
        trace_digest: run.trace.digest(),
        events: run.trace.events(),
        trace: run.trace.all(),
    })
}
