//! The instances a policy runs, what they cost, and which of them serve.

use std::collections::BTreeMap;

use controlplane::provision::scaling::launches_for;
use controlplane::provision::FleetGpu;
use controlplane::resources::InstanceTypeSpec;

/// HetSev's λ per second of launch latency (README, `[loops] lambda_per_s`).
pub const LAMBDA_PER_S: f64 = 0.001;
/// Seconds from a host's death until the failure detector marks it unhealthy, when the
/// provisioner plans around it and its replacement is asked for, in a fleet of `hosts`.
/// Decided by the detector's own rule (`failure_detector::overdue`, with the patience its
/// passes use under the default settings), checked once a heartbeat as its passes run, on
/// what a dead host leaves the leader: its last report, at the death at the latest, and its
/// desired-state stream's end once the connection's keep-alive goes unanswered.
pub fn detection_s(hosts: usize) -> u32 {
    use controlplane::agents::report_pace::OverdueTimeout;
    use controlplane::loops::failure_detector::{overdue, Patience};
    use controlplane::loops::LoopSettings;
    use controlplane::server::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
    let settings = LoopSettings::default();
    let interval = settings.report_pace().interval(hosts);
    let report_timeout = OverdueTimeout::new(settings.missed_heartbeats, interval, 0.0).at(interval, 0.0);
    let patience = Patience { report_timeout, watch_grace: settings.watch_grace };
    // An origin for the detector's instants; only their differences count.
    let died = tokio::time::Instant::now();
    let host = vec!["dead".to_string()];
    let heard = controlplane::agents::Heard {
        reported: [(host[0].clone(), died)].into(),
        watch_ended: [(host[0].clone(), died + KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT)].into(),
    };
    // The report timeout marks it by the pass after it at the latest.
    let last_pass = 1 + (report_timeout.as_secs_f64() / settings.heartbeat_interval.as_secs_f64()).ceil() as u32;
    let marked_at = (1..=last_pass)
        .map(|pass| died + settings.heartbeat_interval * pass)
        .find(|&at| !overdue(&host, &heard, died, at, patience).is_empty())
        .expect("overdue once the report timeout has passed");
    marked_at.duration_since(died).as_secs_f64().ceil() as u32
}

#[derive(Clone, Debug, PartialEq)]
struct Instance {
    /// Unique in the fleet's life: its host's name is `host-<id>`.
    id: u64,
    /// Launched by the autoscaler (the node assignment fills such hosts last).
    autoscaled: bool,
    instance_type: String,
    gpu_model: String,
    gpus: u32,
    /// Serves from this second on.
    ready_at: u32,
}

/// One policy's fleet: instances billed from their launch to their termination.
#[derive(Clone, Debug)]
pub struct Fleet {
    types: BTreeMap<String, InstanceTypeSpec>,
    instances: Vec<Instance>,
    pub cost: f64,
    pub gpu_hours: f64,
    /// Launches after the start (the initial fleet is already running).
    pub launches: u32,
    next_id: u64,
    /// Hosts that died, until the failure detector marks them: the controllers still
    /// place work on them meanwhile.
    undetected: Vec<(Instance, u32)>,
}

impl Fleet {
    pub fn new(types: &BTreeMap<String, InstanceTypeSpec>) -> Self {
        Fleet { types: types.clone(), instances: Vec::new(), cost: 0.0, gpu_hours: 0.0, launches: 0, next_id: 0, undetected: Vec::new() }
    }

    /// The hosts the node assignment places work on at `now`, in launch order (as the
    /// Nodes are listed): those that have registered (launched and ready) and dead ones
    /// not yet marked unhealthy (the controllers still place work on them).
    fn placeable_hosts(&mut self, now: u32) -> Vec<&Instance> {
        self.undetected.retain(|(_, detected_at)| *detected_at > now);
        let mut hosts: Vec<&Instance> =
            self.instances.iter().filter(|i| i.ready_at <= now).chain(self.undetected.iter().map(|(i, _)| i)).collect();
        hosts.sort_by_key(|i| i.id);
        hosts
    }

    /// Which hosts [`Fleet::placeable`] has (cheap, to see whether they changed).
    pub fn placeable_ids(&mut self, now: u32) -> Vec<u64> {
        self.placeable_hosts(now).iter().map(|i| i.id).collect()
    }

    /// The GPUs of the hosts the node assignment places work on at `now`.
    pub fn placeable(&mut self, now: u32) -> Vec<FleetGpu> {
        self.placeable_hosts(now)
            .into_iter()
            .flat_map(|i| {
                (0..i.gpus).map(move |k| FleetGpu {
                    node: format!("host-{}", i.id),
                    uuid: format!("GPU-{}-{k}", i.id),
                    model: i.gpu_model.clone(),
                    autoscaled: i.autoscaled,
                })
            })
            .collect()
    }

    /// Adds instances for `gpus` more GPUs per model, the cheapest way (HetSev's objective,
    /// as the autoscaler launches): `initial` ones serve at once (the fleet a run starts
    /// with), others after their type's launch latency from `now`.
    pub fn add_gpus(&mut self, gpus: &BTreeMap<String, u32>, now: u32, initial: bool) {
        self.add_with(gpus, now, initial, &self.types.clone());
    }

    /// As [`Self::add_gpus`], choosing only among `types`.
    pub fn add_with(&mut self, gpus: &BTreeMap<String, u32>, now: u32, initial: bool, types: &BTreeMap<String, InstanceTypeSpec>) {
        for launch in launches_for(gpus, types, &BTreeMap::new(), LAMBDA_PER_S) {
            for _ in 0..launch.count {
                self.launch(&launch.instance_type, now, initial);
            }
        }
    }

    /// Launches one instance of `instance_type`.
    pub fn launch(&mut self, instance_type: &str, now: u32, initial: bool) {
        let t = &self.types[instance_type];
        let ready_at = if initial { now } else { now + t.launch_latency_s.ceil() as u32 };
        if !initial {
            self.launches += 1;
        }
        self.next_id += 1;
        self.instances.push(Instance {
            id: self.next_id,
            autoscaled: !initial,
            instance_type: instance_type.into(),
            gpu_model: t.gpu_model.clone(),
            gpus: t.gpu_count,
            ready_at,
        });
    }

    /// GPUs of `model` serving at `now`, and all of them (launching included).
    pub fn gpus(&self, model: &str, now: u32) -> (u32, u32) {
        self.instances
            .iter()
            .filter(|i| i.gpu_model == model)
            .fold((0, 0), |(ready, all), i| (ready + if i.ready_at <= now { i.gpus } else { 0 }, all + i.gpus))
    }

    /// Instances of `instance_type`, launching included.
    pub fn count(&self, instance_type: &str) -> usize {
        self.instances.iter().filter(|i| i.instance_type == instance_type).count()
    }

    /// Terminates the most expensive instance of `model` holding at most `surplus` GPUs;
    /// its GPUs, or 0 if none fits.
    pub fn terminate_within(&mut self, model: &str, surplus: u32) -> u32 {
        let pick = self
            .instances
            .iter()
            .enumerate()
            .filter(|(_, i)| i.gpu_model == model && i.gpus <= surplus)
            .max_by(|(_, a), (_, b)| self.types[&a.instance_type].price_per_hour.total_cmp(&self.types[&b.instance_type].price_per_hour))
            .map(|(n, _)| n);
        pick.map_or(0, |n| self.instances.remove(n).gpus)
    }

    /// Terminates one instance of `instance_type` (the newest).
    pub fn terminate_one(&mut self, instance_type: &str) -> bool {
        match self.instances.iter().rposition(|i| i.instance_type == instance_type) {
            Some(n) => {
                self.instances.remove(n);
                true
            }
            None => false,
        }
    }

    /// A host failure at `now`: one serving instance of the GPU model with the most GPUs
    /// dies, and a replacement of its type is launched once the failure is detected.
    /// Returns the model hit.
    pub fn fail_one(&mut self, now: u32) -> Option<String> {
        let mut by_model: BTreeMap<&str, u32> = BTreeMap::new();
        for i in self.instances.iter().filter(|i| i.ready_at <= now) {
            *by_model.entry(&i.gpu_model).or_default() += i.gpus;
        }
        let model = by_model.into_iter().max_by_key(|&(m, n)| (n, std::cmp::Reverse(m)))?.0.to_string();
        let n = self.instances.iter().position(|i| i.gpu_model == model && i.ready_at <= now)?;
        let dead = self.instances.remove(n);
        let hosts = self.instances.len() + 1;
        let detected_at = now + detection_s(hosts);
        self.launch(&dead.instance_type, detected_at, false);
        self.undetected.push((dead, detected_at));
        Some(model)
    }

    /// Bills one second.
    pub fn bill_second(&mut self) {
        for i in &self.instances {
            self.cost += self.types[&i.instance_type].price_per_hour / 3600.0;
            self.gpu_hours += f64::from(i.gpus) / 3600.0;
        }
    }

    /// Cost per hour of everything running now.
    pub fn cost_per_hour(&self) -> f64 {
        self.instances.iter().map(|i| self.types[&i.instance_type].price_per_hour).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::detection_s;

    #[test]
    fn a_dead_host_is_detected_by_its_streams_end_at_any_fleet_size() {
        // The keep-alive's 1 + 2 s, then the 2 s grace, seen at the next 1 s pass; the
        // report timeout alone (5 missed reports) would take 6 s here and 26 s at 10,000
        // hosts, which report every 5 s.
        assert_eq!(detection_s(10), 6);
        assert_eq!(detection_s(10_000), 6);
    }
}
