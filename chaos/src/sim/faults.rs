//! The fault schedule, drawn from the seed: crashes and restarts, symmetric and one-way
//! partitions, a leader cut off from its followers (still reachable by agents and
//! clients), link failures (message loss), message delay, slow disks and planned leader
//! transfers (`gpuctl cluster transfer`). Each fault starts
//! at a time within the fault window and ends after a drawn duration; everything is healed
//! when the window closes.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;

/// One kind of fault, with what it applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Controller `node` crashes and restarts with what its disk holds.
    Crash { node: u64 },
    /// Controller `node` can reach no host and no host can reach it.
    Isolate { node: u64 },
    /// Messages from controller `from` to controller `to` are dropped; the other way works.
    OneWay { from: u64, to: u64 },
    /// Whoever leads when the fault starts is cut off from the other controllers only.
    IsolateLeader,
    /// Links fail at random (turmoil's fail rate) and are repaired at random.
    Loss { fail_rate_percent: u32 },
    /// Messages take up to `max_ms` to arrive.
    Delay { max_ms: u64 },
    /// Controller `node`'s log writes take `delay_ms` longer.
    SlowDisk { node: u64, delay_ms: u64 },
    /// Whoever leads when the fault starts hands leadership to controller `to` (openraft's
    /// transfer, as `gpuctl cluster transfer` asks for it); over by itself.
    TransferLeader { to: u64 },
}

impl Fault {
    /// The kind's name in reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Crash { .. } => "crash-restart",
            Fault::Isolate { .. } => "partition",
            Fault::OneWay { .. } => "one-way-partition",
            Fault::IsolateLeader => "leader-isolated",
            Fault::Loss { .. } => "message-loss",
            Fault::Delay { .. } => "message-delay",
            Fault::SlowDisk { .. } => "slow-disk",
            Fault::TransferLeader { .. } => "leader-transfer",
        }
    }

    pub const KINDS: [&'static str; 8] = [
        "crash-restart",
        "partition",
        "one-way-partition",
        "leader-isolated",
        "message-loss",
        "message-delay",
        "slow-disk",
        "leader-transfer",
    ];
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash { node } => write!(f, "crash c{node}"),
            Fault::Isolate { node } => write!(f, "isolate c{node}"),
            Fault::OneWay { from, to } => write!(f, "drop c{from} -> c{to}"),
            Fault::IsolateLeader => write!(f, "cut the leader off from its followers"),
            Fault::Loss { fail_rate_percent } => write!(f, "link failures at {fail_rate_percent}%"),
            Fault::Delay { max_ms } => write!(f, "message delay up to {max_ms} ms"),
            Fault::SlowDisk { node, delay_ms } => write!(f, "slow disk on c{node} (+{delay_ms} ms per write)"),
            Fault::TransferLeader { to } => write!(f, "the leader hands over to c{to}"),
        }
    }
}

/// A fault with its start and length.
#[derive(Clone, Debug)]
pub struct Scheduled {
    pub at: Duration,
    pub lasts: Duration,
    pub fault: Fault,
}

/// Draws `count` faults over `window` for a cluster of `members` controllers.
pub fn schedule(rng: &mut SmallRng, members: u64, window: Duration, count: usize) -> Vec<Scheduled> {
    let window_ms = window.as_millis() as u64;
    let mut faults: Vec<Scheduled> = (0..count)
        .map(|_| {
            let node = rng.random_range(1..=members);
            let fault = match rng.random_range(0..8) {
                0 => Fault::Crash { node },
                1 => Fault::Isolate { node },
                2 => {
                    // Any other controller, uniformly.
                    let to = rng.random_range(1..members);
                    Fault::OneWay { from: node, to: if to >= node { to + 1 } else { to } }
                }
                3 => Fault::IsolateLeader,
                4 => Fault::Loss { fail_rate_percent: rng.random_range(1..=5) },
                5 => Fault::Delay { max_ms: rng.random_range(20..=300) },
                6 => Fault::SlowDisk { node, delay_ms: rng.random_range(20..=400) },
                _ => Fault::TransferLeader { to: node },
            };
            // Starts in the first 80% of the window; heal-all closes it anyway.
            let at = Duration::from_millis(rng.random_range(500..window_ms * 4 / 5));
            let lasts = Duration::from_millis(rng.random_range(300..=4_000));
            Scheduled { at, lasts, fault }
        })
        .collect();
    faults.sort_by_key(|s| s.at);
    faults
}

/// Faults injected, per kind.
pub fn count_by_kind(faults: &[Scheduled]) -> BTreeMap<&'static str, u64> {
    let mut counts: BTreeMap<&'static str, u64> = Fault::KINDS.iter().map(|k| (*k, 0)).collect();
    for s in faults {
        *counts.entry(s.fault.kind()).or_default() += 1;
    }
    counts
}
