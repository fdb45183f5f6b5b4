//! The real-process chaos runner (`chaos real`): three controllers and two node agents
//! (simulated GPUs) as real processes, each in its own network namespace joined by a bridge
//! ([`net`]), a recorded client workload of register reads and writes ([`workload`], checked
//! by [`crate::history::check`]), and faults on processes, network and disks ([`faults`]).
//!
//! Scenarios ([`scenario`]): `ci` injects kill -9 of the leader, SIGSTOP/SIGCONT of the
//! leader, the leader cut off from its followers (clients still reach it), a one-way
//! partition (followers stop hearing the leader), an isolated follower, a full disk (a
//! 32 MiB tmpfs filled up under controller 3), a truncated and an overwritten database on a
//! stopped follower before its restart (it must refuse to start; the runner then removes
//! it, wipes it and adds it back as an operator would), and the agents cut off from every
//! controller while the plan changes. `kills` kills the leader N times. `hostile` sends a
//! tenant's, an operator's and a compromised node's attacks ([`hostile`]) and floods
//! ([`floods`]: unread watches, idle connections, anonymous data-plane callers). The [`report`]
//! gives operations attempted, acknowledged, failed, unknown and lost, the linearizability
//! verdict, leader changes, unavailability, agent convergence and the storage outcomes;
//! `chaos` exits 1 on any lost or non-linearizable operation or failed expectation.
//!
//! Needs root (network namespaces, iptables, tmpfs) and the `controlplane`, `node-agent`
//! and `sim-infer` binaries next to `chaos`.

pub mod cluster;
pub mod faults;
pub mod floods;
pub mod hostile;
pub mod net;
pub mod observe;
pub mod report;
pub mod scenario;
pub mod workload;
