//! HetSev's resource-efficient instance scheduling (Sec. 4.2, Algorithm 1): where each new
//! model replica ("ML instance" in the paper) goes, GPU by GPU.
//!
//! * Step 1 (line 1): pending replicas are clustered into `k` queues by k-means with the L1
//!   distance over (1) GPU memory and (2) ML model ([`super::kmeans`]). Features: GPU memory
//!   scaled to `[0, 1]` over the pending set, and the model one-hot scaled by
//!   `model_weight / 2`, so two different models are `model_weight` apart — the same as the
//!   full memory range when `model_weight = 1`. (The paper names the features but not how a
//!   categorical model enters a distance; this is our resolution.)
//! * Step 2 (lines 2–3): each round picks β replicas into the scheduling buffer by weighted
//!   fairness, a queue's weight being "the product of the queue length and the instance's
//!   median waiting time per queue". The paper does not say how β is split across queues;
//!   we pick one replica at a time from the heaviest queue (ties: longer queue, longer head
//!   wait, lower queue number) and recompute that queue's weight, so β is shared roughly in
//!   proportion to weight and no queue starves. Within a queue, replicas leave FIFO.
//! * Step 3 (lines 4–17): for each buffered replica, the capacity check on GPU memory (per
//!   GPU), CPU cores and CPU memory (per instance) preselects GPUs (line 7); the anti-affinity
//!   check removes GPUs already hosting the same model (line 9; identical models interfere
//!   most, Sec. 3.2); if nothing is left the replica is skipped (lines 10–11) and reported
//!   unplaced with the reason; otherwise worst-fit picks the GPU with the most free GPU
//!   memory (line 13: "preferentially utilize the GPUs without any workload").
//! * Beyond the paper (on by default, `spread_across_instances`): among the GPUs left after
//!   line 9, those on instances not yet hosting the model are preferred when any exist, so
//!   two replicas of a model land on different instances whenever an alternative exists.
//!   The paper's anti-affinity is per GPU; this extends it softly to the instance.
//!
//! A replica skipped at line 11 would stay unplaceable in later rounds here (placements only
//! consume resources), so one pass over the weighted-fair order is the whole algorithm.

use super::kmeans::kmeans_l1;
use super::{finite, non_negative, positive, HetSevError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// A model replica awaiting placement, with its offline-profiled requirements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRequest {
    pub id: String,
    pub model: String,
    pub gpu_memory_gb: f64,
    pub cpu_cores: f64,
    pub cpu_memory_gb: f64,
    /// When it started waiting (for the fairness weight).
    pub enqueued_at_s: f64,
}

/// One GPU of an instance, with its anti-affinity labels (the models it hosts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuState {
    /// Device index within the instance.
    pub index: u32,
    pub memory_total_gb: f64,
    pub memory_used_gb: f64,
    #[serde(default)]
    pub models: Vec<String>,
}

impl GpuState {
    pub fn memory_free_gb(&self) -> f64 {
        self.memory_total_gb - self.memory_used_gb
    }
}

/// A machine of the cluster state `S`: CPU resources are shared by its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceState {
    pub id: String,
    pub cpu_cores_free: f64,
    pub cpu_memory_free_gb: f64,
    pub gpus: Vec<GpuState>,
}

/// Algorithm 1's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    /// `k`: number of k-means queues.
    pub queues: usize,
    /// `β`: replicas per scheduling round.
    pub beta: usize,
    /// L1 distance between two different models, in units of the pending set's GPU-memory
    /// range.
    pub model_weight: f64,
    pub max_kmeans_iters: usize,
    /// Prefer instances not yet hosting the model (see the module docs).
    pub spread_across_instances: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        // The paper gives no values for k and β; four queues matches its four models.
        SchedulerConfig { queues: 4, beta: 8, model_weight: 1.0, max_kmeans_iters: 100, spread_across_instances: true }
    }
}

/// Where one replica goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub replica_id: String,
    pub model: String,
    pub instance_id: String,
    /// [`GpuState::index`] of the chosen GPU.
    pub gpu_index: u32,
    /// The k-means queue it came from.
    pub queue: usize,
}

/// A replica that could not be placed, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unplaced {
    pub replica_id: String,
    pub model: String,
    pub queue: usize,
    pub reason: UnplacedReason,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UnplacedReason {
    /// Line 5: no GPU in the cluster has any free memory.
    ClusterFull,
    /// Line 7: no GPU passes the capacity check. Counts are of GPUs (a GPU's CPU resources
    /// are its instance's); one GPU may be short of several resources.
    NoCapacity { gpus: usize, short_of_gpu_memory: usize, short_of_cpu_cores: usize, short_of_cpu_memory: usize },
    /// Line 9: every GPU with capacity already hosts this model.
    AntiAffinity { gpus_with_capacity: usize },
}

/// The result of one run of Algorithm 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleOutcome {
    /// Replica ids per k-means queue (FIFO order).
    pub queues: Vec<Vec<String>>,
    /// The weighted-fair order in which replicas were considered.
    pub order: Vec<String>,
    pub placements: Vec<Placement>,
    pub unplaced: Vec<Unplaced>,
    /// The cluster state after the placements.
    pub cluster: Vec<InstanceState>,
}

/// Step 1 alone: the k-means queues of replica ids, each FIFO (by enqueue time, then id).
pub fn cluster_pending(pending: &[ReplicaRequest], config: &SchedulerConfig) -> Result<Vec<Vec<String>>, HetSevError> {
    validate_config(config)?;
    validate_pending(pending, f64::INFINITY)?;
    Ok(queues(pending, config).into_iter().map(|q| q.into_iter().map(|i| pending[i].id.clone()).collect()).collect())
}

/// Algorithm 1: places `pending` onto `cluster` at time `now_s`.
pub fn schedule(
    pending: &[ReplicaRequest],
    cluster: &[InstanceState],
    now_s: f64,
    config: &SchedulerConfig,
) -> Result<ScheduleOutcome, HetSevError> {
    validate_config(config)?;
    finite(|| "now_s".into(), now_s)?;
    validate_pending(pending, now_s)?;
    validate_cluster(cluster)?;

    let qs = queues(pending, config);
    let queue_ids = qs.iter().map(|q| q.iter().map(|&i| pending[i].id.clone()).collect()).collect();
    let waits: Vec<f64> = pending.iter().map(|r| now_s - r.enqueued_at_s).collect();
    let mut queue_of = vec![0; pending.len()];
    for (q, members) in qs.iter().enumerate() {
        for &i in members {
            queue_of[i] = q;
        }
    }
    let mut qs: Vec<VecDeque<usize>> = qs.into_iter().map(VecDeque::from).collect();
    let mut state = cluster.to_vec();
    let mut out =
        ScheduleOutcome { queues: queue_ids, order: Vec::new(), placements: Vec::new(), unplaced: Vec::new(), cluster: Vec::new() };
    // Line 2: while queues are not empty.
    while qs.iter().any(|q| !q.is_empty()) {
        // Line 3: β replicas into the buffer by weighted fairness.
        let mut buffer = Vec::new();
        while buffer.len() < config.beta {
            let Some(i) = pick(&mut qs, &waits) else { break };
            buffer.push(i);
        }
        // Lines 4–16.
        for i in buffer {
            let r = &pending[i];
            out.order.push(r.id.clone());
            match place(r, &state, config.spread_across_instances) {
                Ok((m, g)) => {
                    let inst = &mut state[m];
                    let gpu = &mut inst.gpus[g];
                    gpu.memory_used_gb += r.gpu_memory_gb;
                    gpu.models.push(r.model.clone());
                    let gpu_index = gpu.index;
                    inst.cpu_cores_free -= r.cpu_cores;
                    inst.cpu_memory_free_gb -= r.cpu_memory_gb;
                    out.placements.push(Placement {
                        replica_id: r.id.clone(),
                        model: r.model.clone(),
                        instance_id: inst.id.clone(),
                        gpu_index,
                        queue: queue_of[i],
                    });
                }
                Err(reason) => out.unplaced.push(Unplaced { replica_id: r.id.clone(), model: r.model.clone(), queue: queue_of[i], reason }),
            }
        }
    }
    out.cluster = state;
    Ok(out)
}

/// Step 1: k-means queues of pending indices, each in FIFO order.
fn queues(pending: &[ReplicaRequest], config: &SchedulerConfig) -> Vec<Vec<usize>> {
    let mut fifo: Vec<usize> = (0..pending.len()).collect();
    fifo.sort_by(|&a, &b| pending[a].enqueued_at_s.total_cmp(&pending[b].enqueued_at_s).then_with(|| pending[a].id.cmp(&pending[b].id)));
    let models: Vec<&str> = pending.iter().map(|r| r.model.as_str()).collect::<BTreeSet<_>>().into_iter().collect();
    let (lo, hi) =
        pending.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| (lo.min(r.gpu_memory_gb), hi.max(r.gpu_memory_gb)));
    let range = if hi > lo { hi - lo } else { 1.0 };
    let points: Vec<Vec<f64>> = fifo
        .iter()
        .map(|&i| {
            let r = &pending[i];
            let mut p = vec![(r.gpu_memory_gb - lo) / range];
            p.extend(models.iter().map(|m| if *m == r.model { config.model_weight / 2.0 } else { 0.0 }));
            p
        })
        .collect();
    kmeans_l1(&points, config.queues, config.max_kmeans_iters)
        .members()
        .into_iter()
        .map(|m| m.into_iter().map(|p| fifo[p]).collect())
        .collect()
}

/// Step 2: one replica from the queue with the greatest length × median wait.
fn pick(qs: &mut [VecDeque<usize>], waits: &[f64]) -> Option<usize> {
    let key = |q: &VecDeque<usize>| {
        let mut w: Vec<f64> = q.iter().map(|&i| waits[i]).collect();
        w.sort_by(f64::total_cmp);
        let n = w.len();
        let median = if n % 2 == 1 { w[n / 2] } else { (w[n / 2 - 1] + w[n / 2]) / 2.0 };
        (n as f64 * median, n, waits[q[0]])
    };
    let mut best: Option<(usize, (f64, usize, f64))> = None;
    for (qi, q) in qs.iter().enumerate().filter(|(_, q)| !q.is_empty()) {
        let k = key(q);
        if best.is_none_or(|(_, b)| k.0 > b.0 || (k.0 == b.0 && (k.1 > b.1 || (k.1 == b.1 && k.2 > b.2)))) {
            best = Some((qi, k));
        }
    }
    qs[best?.0].pop_front()
}

/// Step 3 for one replica: (instance, GPU position) or why not.
fn place(r: &ReplicaRequest, cluster: &[InstanceState], spread: bool) -> Result<(usize, usize), UnplacedReason> {
    // Line 5.
    if !cluster.iter().flat_map(|m| &m.gpus).any(|g| g.memory_free_gb() > 0.0) {
        return Err(UnplacedReason::ClusterFull);
    }
    // Line 7: capacity check.
    let (mut gpus, mut short_mem, mut short_cores, mut short_cpu_mem) = (0, 0, 0, 0);
    let mut fits = Vec::new();
    for (m, inst) in cluster.iter().enumerate() {
        for (g, gpu) in inst.gpus.iter().enumerate() {
            gpus += 1;
            let mem = r.gpu_memory_gb <= gpu.memory_free_gb();
            let cores = r.cpu_cores <= inst.cpu_cores_free;
            let cpu_mem = r.cpu_memory_gb <= inst.cpu_memory_free_gb;
            short_mem += usize::from(!mem);
            short_cores += usize::from(!cores);
            short_cpu_mem += usize::from(!cpu_mem);
            if mem && cores && cpu_mem {
                fits.push((m, g));
            }
        }
    }
    if fits.is_empty() {
        return Err(UnplacedReason::NoCapacity {
            gpus,
            short_of_gpu_memory: short_mem,
            short_of_cpu_cores: short_cores,
            short_of_cpu_memory: short_cpu_mem,
        });
    }
    // Line 9: anti-affinity labels.
    let hosts = |m: usize, g: usize| cluster[m].gpus[g].models.contains(&r.model);
    let mut candidates: Vec<(usize, usize)> = fits.iter().copied().filter(|&(m, g)| !hosts(m, g)).collect();
    if candidates.is_empty() {
        return Err(UnplacedReason::AntiAffinity { gpus_with_capacity: fits.len() });
    }
    if spread {
        let fresh: Vec<_> = candidates.iter().copied().filter(|&(m, _)| (0..cluster[m].gpus.len()).all(|g| !hosts(m, g))).collect();
        if !fresh.is_empty() {
            candidates = fresh;
        }
    }
    // Line 13: worst fit — most free GPU memory; then fewer tenants, more free CPU, then id.
    candidates
        .into_iter()
        .min_by(|&(ma, ga), &(mb, gb)| {
            let (ia, ib) = (&cluster[ma], &cluster[mb]);
            let (a, b) = (&ia.gpus[ga], &ib.gpus[gb]);
            b.memory_free_gb()
                .total_cmp(&a.memory_free_gb())
                .then(a.models.len().cmp(&b.models.len()))
                .then(ib.cpu_cores_free.total_cmp(&ia.cpu_cores_free))
                .then(ib.cpu_memory_free_gb.total_cmp(&ia.cpu_memory_free_gb))
                .then_with(|| ia.id.cmp(&ib.id))
                .then(a.index.cmp(&b.index))
        })
        .ok_or(UnplacedReason::ClusterFull)
}

fn validate_config(c: &SchedulerConfig) -> Result<(), HetSevError> {
    if c.queues == 0 {
        return Err(HetSevError::invalid("config.queues", "k must be >= 1"));
    }
    if c.beta == 0 {
        return Err(HetSevError::invalid("config.beta", "β must be >= 1"));
    }
    if c.max_kmeans_iters == 0 {
        return Err(HetSevError::invalid("config.max_kmeans_iters", "must be >= 1"));
    }
    positive(|| "config.model_weight".into(), c.model_weight)
}

fn validate_pending(pending: &[ReplicaRequest], now_s: f64) -> Result<(), HetSevError> {
    let mut ids = BTreeSet::new();
    for (i, r) in pending.iter().enumerate() {
        let f = |name: &str| format!("pending[{i}].{name}");
        if r.id.is_empty() || !ids.insert(r.id.as_str()) {
            return Err(HetSevError::invalid(f("id"), format!("must be non-empty and unique, got `{}`", r.id)));
        }
        if r.model.is_empty() {
            return Err(HetSevError::invalid(f("model"), "must not be empty"));
        }
        non_negative(|| f("gpu_memory_gb"), r.gpu_memory_gb)?;
        non_negative(|| f("cpu_cores"), r.cpu_cores)?;
        non_negative(|| f("cpu_memory_gb"), r.cpu_memory_gb)?;
        finite(|| f("enqueued_at_s"), r.enqueued_at_s)?;
        if r.enqueued_at_s > now_s {
            return Err(HetSevError::invalid(f("enqueued_at_s"), format!("{} is after now_s {now_s}", r.enqueued_at_s)));
        }
    }
    Ok(())
}

fn validate_cluster(cluster: &[InstanceState]) -> Result<(), HetSevError> {
    let mut ids = BTreeSet::new();
    for (m, inst) in cluster.iter().enumerate() {
        let f = |name: &str| format!("cluster[{m}].{name}");
        if inst.id.is_empty() || !ids.insert(inst.id.as_str()) {
            return Err(HetSevError::invalid(f("id"), format!("must be non-empty and unique, got `{}`", inst.id)));
        }
        non_negative(|| f("cpu_cores_free"), inst.cpu_cores_free)?;
        non_negative(|| f("cpu_memory_free_gb"), inst.cpu_memory_free_gb)?;
        let mut indices = BTreeSet::new();
        for (g, gpu) in inst.gpus.iter().enumerate() {
            let f = |name: &str| format!("cluster[{m}].gpus[{g}].{name}");
            if !indices.insert(gpu.index) {
                return Err(HetSevError::invalid(f("index"), format!("duplicate GPU index {}", gpu.index)));
            }
            positive(|| f("memory_total_gb"), gpu.memory_total_gb)?;
            non_negative(|| f("memory_used_gb"), gpu.memory_used_gb)?;
            if gpu.memory_used_gb > gpu.memory_total_gb {
                return Err(HetSevError::invalid(
                    f("memory_used_gb"),
                    format!("{} exceeds memory_total_gb {}", gpu.memory_used_gb, gpu.memory_total_gb),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rep(id: &str, model: &str, mem: f64, at: f64) -> ReplicaRequest {
        ReplicaRequest { id: id.into(), model: model.into(), gpu_memory_gb: mem, cpu_cores: 1.0, cpu_memory_gb: 2.0, enqueued_at_s: at }
    }

    fn gpu(index: u32, total: f64, used: f64) -> GpuState {
        GpuState { index, memory_total_gb: total, memory_used_gb: used, models: Vec::new() }
    }

    fn node(id: &str, gpus: Vec<GpuState>) -> InstanceState {
        InstanceState { id: id.into(), cpu_cores_free: 16.0, cpu_memory_free_gb: 64.0, gpus }
    }

    fn cfg(k: usize) -> SchedulerConfig {
        SchedulerConfig { queues: k, ..SchedulerConfig::default() }
    }

    fn where_(out: &ScheduleOutcome, id: &str) -> (String, u32) {
        let p = out.placements.iter().find(|p| p.replica_id == id).unwrap_or_else(|| panic!("{id} unplaced: {out:?}"));
        (p.instance_id.clone(), p.gpu_index)
    }

    fn hand_made() -> Vec<ReplicaRequest> {
        vec![
            rep("r1", "resnet50", 2.0, 0.0),
            rep("b1", "bert", 10.0, 1.0),
            rep("r2", "resnet50", 2.0, 2.0),
            rep("l1", "llama", 40.0, 3.0),
            rep("r3", "resnet50", 2.4, 4.0),
            rep("b2", "bert", 11.0, 5.0),
        ]
    }

    #[test]
    fn kmeans_queues_group_a_hand_made_fleet_by_model_and_memory() {
        // Memory range 2..40 GB; different models are 1.0 apart, bert is 0.21 from resnet
        // in memory, llama 1.0: three queues are exactly the three models.
        let q = cluster_pending(&hand_made(), &cfg(3)).unwrap();
        assert_eq!(q, vec![vec!["r1", "r2", "r3"], vec!["b1", "b2"], vec!["l1"]]);
        // Two queues: the two small models together, the 40 GB model alone.
        let q = cluster_pending(&hand_made(), &cfg(2)).unwrap();
        assert_eq!(q, vec![vec!["r1", "b1", "r2", "r3", "b2"], vec!["l1"]]);
        // One model, two memory sizes (e.g. quantised vs full): split by memory.
        let same =
            vec![rep("q1", "llama", 4.0, 0.0), rep("f1", "llama", 40.0, 1.0), rep("q2", "llama", 5.0, 2.0), rep("f2", "llama", 38.0, 3.0)];
        assert_eq!(cluster_pending(&same, &cfg(2)).unwrap(), vec![vec!["q1", "q2"], vec!["f1", "f2"]]);
    }

    #[test]
    fn anti_affinity_keeps_replicas_of_one_model_apart_when_it_can() {
        let pending = vec![rep("a", "resnet50", 5.0, 0.0), rep("b", "resnet50", 5.0, 1.0)];
        let cluster = vec![node("A", vec![gpu(0, 40.0, 0.0), gpu(1, 40.0, 2.0)]), node("B", vec![gpu(0, 24.0, 4.0)])];
        // a → A/0 (40 GB free, worst fit); b would fit best on A/1 (38 free) but A hosts
        // resnet50 already: B/0 (20 free).
        let out = schedule(&pending, &cluster, 10.0, &cfg(1)).unwrap();
        assert_eq!(where_(&out, "a"), ("A".into(), 0));
        assert_eq!(where_(&out, "b"), ("B".into(), 0));
        // Paper-only (per-GPU) anti-affinity: A/1 is a different GPU, so b goes there.
        let gpu_only = SchedulerConfig { spread_across_instances: false, ..cfg(1) };
        let out = schedule(&pending, &cluster, 10.0, &gpu_only).unwrap();
        assert_eq!(where_(&out, "b"), ("A".into(), 1));
        // No other instance: b still avoids A/0.
        let out = schedule(&pending, &cluster[..1], 10.0, &cfg(1)).unwrap();
        assert_eq!(where_(&out, "b"), ("A".into(), 1));
        // One GPU in all: b cannot be placed, and the reason says so.
        let one = vec![node("A", vec![gpu(0, 40.0, 0.0)])];
        let out = schedule(&pending, &one, 10.0, &cfg(1)).unwrap();
        assert_eq!(out.unplaced.len(), 1);
        assert_eq!(out.unplaced[0].replica_id, "b");
        assert_eq!(out.unplaced[0].reason, UnplacedReason::AntiAffinity { gpus_with_capacity: 1 });
        // A label already on a GPU counts too.
        let mut labelled = cluster.clone();
        labelled[0].gpus[0].models.push("resnet50".into());
        let out = schedule(&pending[..1], &labelled, 10.0, &cfg(1)).unwrap();
        assert_eq!(where_(&out, "a"), ("B".into(), 0));
    }

    #[test]
    fn worst_fit_picks_the_instance_with_most_free_capacity() {
        let cluster = vec![node("x", vec![gpu(0, 16.0, 6.0)]), node("y", vec![gpu(0, 32.0, 2.0)]), node("z", vec![gpu(0, 24.0, 4.0)])];
        let pending = vec![rep("a", "bert", 4.0, 0.0)];
        let out = schedule(&pending, &cluster, 1.0, &cfg(1)).unwrap();
        assert_eq!(where_(&out, "a"), ("y".into(), 0));
        assert_eq!(out.cluster[1].gpus[0].memory_used_gb, 6.0);
        assert_eq!(out.cluster[1].gpus[0].models, vec!["bert".to_string()]);
        // y out of CPU cores: the capacity filter drops it, z (20 free) beats x (10 free).
        let mut no_cpu = cluster.clone();
        no_cpu[1].cpu_cores_free = 0.5;
        let out = schedule(&pending, &no_cpu, 1.0, &cfg(1)).unwrap();
        assert_eq!(where_(&out, "a"), ("z".into(), 0));
    }

    #[test]
    fn no_capacity_reports_what_was_short() {
        let cluster = vec![node("x", vec![gpu(0, 16.0, 0.0), gpu(1, 16.0, 0.0)])];
        let out = schedule(&[rep("big", "llama", 40.0, 0.0)], &cluster, 1.0, &cfg(1)).unwrap();
        assert_eq!(
            out.unplaced[0].reason,
            UnplacedReason::NoCapacity { gpus: 2, short_of_gpu_memory: 2, short_of_cpu_cores: 0, short_of_cpu_memory: 0 }
        );
        let full = vec![node("x", vec![gpu(0, 16.0, 16.0)])];
        let out = schedule(&[rep("s", "bert", 1.0, 0.0)], &full, 1.0, &cfg(1)).unwrap();
        assert_eq!(out.unplaced[0].reason, UnplacedReason::ClusterFull);
    }

    #[test]
    fn weighted_fairness_serves_the_heaviest_queue_first() {
        // Queue of a: waits 40, 30, 10 → weight 3 × 30 = 90; queue of b: one waiting 50 → 50.
        // a1 first; then a's weight is 2 × 20 = 40 < 50, so b1; then a2, a3.
        let pending = vec![rep("b1", "b", 1.0, 0.0), rep("a1", "a", 1.0, 10.0), rep("a2", "a", 1.0, 20.0), rep("a3", "a", 1.0, 40.0)];
        let cluster = vec![node("n", (0..4).map(|g| gpu(g, 16.0, 0.0)).collect())];
        let out = schedule(&pending, &cluster, 50.0, &SchedulerConfig { beta: 2, ..cfg(2) }).unwrap();
        assert_eq!(out.queues, vec![vec!["b1"], vec!["a1", "a2", "a3"]]);
        assert_eq!(out.order, vec!["a1", "b1", "a2", "a3"]);
        assert_eq!(out.placements.len(), 4);
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let c = vec![node("n", vec![gpu(0, 16.0, 0.0)])];
        let p = vec![rep("a", "m", 1.0, 0.0)];
        let e = schedule(&p, &c, 1.0, &cfg(0)).unwrap_err();
        assert_eq!(e, HetSevError::invalid("config.queues", "k must be >= 1"));
        let mut bad = p.clone();
        bad.push(rep("b", "m", -2.0, 0.0));
        assert_eq!(schedule(&bad, &c, 1.0, &cfg(1)).unwrap_err().to_string(), "invalid `pending[1].gpu_memory_gb`: must be >= 0, got -2");
        let dup = vec![p[0].clone(), p[0].clone()];
        assert_eq!(schedule(&dup, &c, 1.0, &cfg(1)).unwrap_err().field(), "pending[1].id");
        let over = vec![node("n", vec![gpu(0, 16.0, 17.0)])];
        assert_eq!(schedule(&p, &over, 1.0, &cfg(1)).unwrap_err().field(), "cluster[0].gpus[0].memory_used_gb");
        assert_eq!(schedule(&p, &c, -1.0, &cfg(1)).unwrap_err().field(), "pending[0].enqueued_at_s");
        assert_eq!(schedule(&p, &c, f64::NAN, &cfg(1)).unwrap_err().field(), "now_s");
    }

    #[test]
    fn config_and_outcome_round_trip_through_serde() {
        let c = SchedulerConfig::default();
        assert_eq!(serde_json::from_str::<SchedulerConfig>(&serde_json::to_string(&c).unwrap()).unwrap(), c);
        let cluster = vec![node("n", vec![gpu(0, 16.0, 0.0)])];
        let out = schedule(&hand_made()[..2], &cluster, 9.0, &c).unwrap();
        assert_eq!(serde_json::from_str::<ScheduleOutcome>(&serde_json::to_string(&out).unwrap()).unwrap(), out);
    }

    fn arb_cluster() -> impl Strategy<Value = Vec<InstanceState>> {
        let g = (8.0f64..80.0, 0.0f64..1.0, proptest::option::of(0usize..3));
        let n = (proptest::collection::vec(g, 1..4), 0.0f64..8.0, 0.0f64..32.0);
        proptest::collection::vec(n, 1..5).prop_map(|nodes| {
            nodes
                .into_iter()
                .enumerate()
                .map(|(m, (gpus, cores, mem))| InstanceState {
                    id: format!("n{m}"),
                    cpu_cores_free: cores,
                    cpu_memory_free_gb: mem,
                    gpus: gpus
                        .into_iter()
                        .enumerate()
                        .map(|(g, (total, frac, label))| GpuState {
                            index: g as u32,
                            memory_total_gb: total,
                            memory_used_gb: total * frac,
                            models: label.map(|l| vec![format!("m{l}")]).unwrap_or_default(),
                        })
                        .collect(),
                })
                .collect()
        })
    }

    fn arb_pending() -> impl Strategy<Value = Vec<ReplicaRequest>> {
        proptest::collection::vec((0usize..3, 0.5f64..30.0, 0.0f64..3.0, 0.0f64..8.0, 0.0f64..100.0), 0..14).prop_map(|rs| {
            rs.into_iter()
                .enumerate()
                .map(|(i, (m, mem, cores, cmem, at))| ReplicaRequest {
                    id: format!("r{i}"),
                    model: format!("m{m}"),
                    gpu_memory_gb: mem,
                    cpu_cores: cores,
                    cpu_memory_gb: cmem,
                    enqueued_at_s: at,
                })
                .collect()
        })
    }

    proptest! {
        /// Placements never exceed GPU memory or instance CPU, never put a model twice on a
        /// GPU, and account for every replica exactly once.
        #[test]
        fn placements_never_exceed_capacity(
            cluster in arb_cluster(), pending in arb_pending(), k in 1usize..5, beta in 1usize..6, spread in any::<bool>(),
        ) {
            let c = SchedulerConfig { queues: k, beta, spread_across_instances: spread, ..SchedulerConfig::default() };
            let out = schedule(&pending, &cluster, 100.0, &c).unwrap();
            let mut seen: Vec<&str> = out.placements.iter().map(|p| p.replica_id.as_str())
                .chain(out.unplaced.iter().map(|u| u.replica_id.as_str())).collect();
            seen.sort();
            let mut all: Vec<&str> = pending.iter().map(|r| r.id.as_str()).collect();
            all.sort();
            prop_assert_eq!(seen, all);
            for inst in &cluster {
                let here: Vec<&Placement> = out.placements.iter().filter(|p| p.instance_id == inst.id).collect();
                let req = |p: &Placement| pending.iter().find(|r| r.id == p.replica_id).unwrap();
                let cores: f64 = here.iter().map(|p| req(p).cpu_cores).sum();
                let cmem: f64 = here.iter().map(|p| req(p).cpu_memory_gb).sum();
                prop_assert!(cores <= inst.cpu_cores_free + 1e-9);
                prop_assert!(cmem <= inst.cpu_memory_free_gb + 1e-9);
                for g in &inst.gpus {
                    let on: Vec<&ReplicaRequest> = here.iter().filter(|p| p.gpu_index == g.index).map(|p| req(p)).collect();
                    let mem: f64 = on.iter().map(|r| r.gpu_memory_gb).sum();
                    prop_assert!(g.memory_used_gb + mem <= g.memory_total_gb + 1e-9);
                    let mut models: Vec<&str> = g.models.iter().map(String::as_str).chain(on.iter().map(|r| r.model.as_str())).collect();
                    let n = models.len();
                    models.sort();
                    models.dedup();
                    prop_assert_eq!(models.len(), n, "a model twice on {}/{}", inst.id, g.index);
                }
            }
        }
    }
}
