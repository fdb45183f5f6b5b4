//! When to take a snapshot: once at least `snapshot_every` entries, and at least as many
//! log bytes as the last snapshot held, were appended since it. A snapshot costs time in
//! proportion to the whole state, so taking one per log of the same size keeps its cost per
//! logged byte constant whatever the fleet's size. A fixed entry count did not: at 10,000
//! hosts (88 MB snapshots) a roll-out's status writes made every controller encode one every
//! few seconds, all three at once, and on two cores their heartbeats timed out.
//!
//! openraft's own policy only counts entries, so it is off (`SnapshotPolicy::Never`) and
//! this task triggers snapshots instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::types::Raft;

/// How often the policy looks.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Whether a snapshot is due, `entries` and `bytes` having been appended since the last one
/// (which took `last_snapshot_bytes`).
pub fn snapshot_due(entries: u64, bytes: u64, last_snapshot_bytes: u64, every: u64) -> bool {
    entries >= every && bytes >= last_snapshot_bytes
}

/// Controllers apply the same entries, so with the same policy they would all encode a
/// snapshot at the same moment. They take turns instead: the applied index is cut into
/// slots of a third of `every`, and controller `id` starts one only in slots `id mod 3`,
/// unless twice `every` entries went by without one.
const TURNS: u64 = 3;

/// Whether controller `id` may start a snapshot at `applied`, `entries` after its last.
pub fn in_turn(id: u64, applied: u64, entries: u64, every: u64) -> bool {
    let slot = (every / TURNS).max(1);
    (applied / slot) % TURNS == id % TURNS || entries >= every.saturating_mul(2)
}

/// Runs the policy until the Raft node shuts down. `appended` counts the bytes this node's
/// log took; `snapshot_bytes` is the size of its latest snapshot (built or installed).
pub async fn run(id: u64, raft: Raft, appended: Arc<AtomicU64>, snapshot_bytes: Arc<AtomicU64>, every: u64) {
    let mut metrics = raft.metrics();
    let mut last_snapshot = metrics.borrow().snapshot.map_or(0, |l| l.index);
    let mut appended_at_snapshot = appended.load(Ordering::Relaxed);
    let mut requested = false;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tick.tick().await;
        let (snapshot, applied) = {
            let m = metrics.borrow_and_update();
            (m.snapshot.map_or(0, |l| l.index), m.last_applied.map_or(0, |l| l.index))
        };
        if snapshot != last_snapshot {
            last_snapshot = snapshot;
            appended_at_snapshot = appended.load(Ordering::Relaxed);
            requested = false;
        }
        let bytes = appended.load(Ordering::Relaxed).saturating_sub(appended_at_snapshot);
        let entries = applied.saturating_sub(snapshot);
        if !requested && snapshot_due(entries, bytes, snapshot_bytes.load(Ordering::Relaxed), every) && in_turn(id, applied, entries, every)
        {
            // Once per snapshot: openraft builds one at a time, and the next check finds
            // the new snapshot's index.
            requested = true;
            if raft.trigger().snapshot().await.is_err() {
                return; // shut down
            }
        }
        if metrics.has_changed().is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_due_after_enough_entries_and_as_many_log_bytes_as_it_holds() {
        // Small state: the entry count decides.
        assert!(!snapshot_due(9_999, 50_000_000, 1_000, 10_000));
        assert!(snapshot_due(10_000, 50_000, 1_000, 10_000));
        // Large state (88 MB): 10,000 entries of 2 KB are not enough.
        assert!(!snapshot_due(10_000, 20_000_000, 88_000_000, 10_000));
        assert!(snapshot_due(45_000, 90_000_000, 88_000_000, 10_000));
        // No snapshot yet.
        assert!(snapshot_due(10_000, 0, 0, 10_000));
    }

    #[test]
    fn three_controllers_take_turns_and_none_waits_past_twice_the_interval() {
        let every = 9_000;
        let turn = |applied: u64| (1..=3).filter(|&id| in_turn(id, applied, every, every)).collect::<Vec<_>>();
        assert_eq!(turn(0), vec![3]);
        assert_eq!(turn(3_000), vec![1]);
        assert_eq!(turn(6_500), vec![2]);
        assert_eq!(turn(9_000), vec![3]);
        // Out of turn, but overdue.
        assert!(in_turn(1, 0, 2 * every, every));
        // A tiny interval still has slots of one entry.
        assert!(in_turn(1, 1, 1, 1));
    }
}
