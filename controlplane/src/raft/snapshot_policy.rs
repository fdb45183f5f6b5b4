//! When to take a snapshot: once at least as many log bytes as the last snapshot held, and
//! either `snapshot_every` entries or [`ENOUGH_LOG_BYTES`], were appended since it. A
//! snapshot costs time in proportion to the whole state, so taking one per log of the same
//! size keeps its cost per logged byte constant whatever the fleet's size. A fixed entry
//! count did not: at 10,000 hosts (88 MB snapshots) a roll-out's status writes made every
//! controller encode one every few seconds, all three at once, and on two cores their
//! heartbeats timed out. Entries alone do not say how long a log is either: one entry
//! carries up to 64 nodes' states.
//!
//! The log kept behind a snapshot for slow followers is `keep_logs_after_snapshot` entries
//! (openraft's purge) and at most [`KEEP_LOG_BYTES`] (this task's purge, in steps of
//! [`PURGE_STEP_BYTES`]), so that large entries cannot keep gigabytes on disk.
//!
//! A due snapshot waits while the log grows fast (a roll-out), until it is overdue: see
//! [`waits_out_burst`].
//!
//! openraft's own policy only counts entries, so it is off (`SnapshotPolicy::Never`) and
//! this task triggers snapshots instead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::types::Raft;
use openraft::async_runtime::WatchReceiver;

/// How often the policy looks.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Log bytes since the last snapshot that make one due whatever the entry count (if the
/// last snapshot was no larger).
pub const ENOUGH_LOG_BYTES: u64 = 64 * 1024 * 1024;

/// Most log bytes kept behind a snapshot (about: the log's size is sampled once a check).
/// A roll-out's status writes at 10,000 hosts are about 30 MB.
pub const KEEP_LOG_BYTES: u64 = 64 * 1024 * 1024;

/// Most log bytes one purge removes (about: by the samples). A purge used to remove its
/// entries inside the Raft core, which sends no heartbeat meanwhile; at 10,000 hosts one
/// purge of the whole excess (about 600 entries, tens of MB) stopped the leader's core for
/// 365 ms and a follower started an election. The removal now runs on a thread of its own
/// (`LogStore::purge`); the steps still keep each removal's disk work small.
pub const PURGE_STEP_BYTES: u64 = 8 * 1024 * 1024;

/// Samples of the log's size kept to find where to purge; older ones are dropped (which can
/// only make a purge keep more).
const MAX_SIZE_SAMPLES: usize = 4096;

/// Whether a snapshot is due, `entries` and `bytes` having been appended since the last one
/// (which took `last_snapshot_bytes`).
pub fn snapshot_due(entries: u64, bytes: u64, last_snapshot_bytes: u64, every: u64) -> bool {
    bytes >= last_snapshot_bytes && (entries >= every || bytes >= ENOUGH_LOG_BYTES)
}

/// Up to which index to purge so that at most about `keep` bytes stay behind a snapshot at
/// `snapshot`, from samples of (last log index, bytes appended so far), oldest first; `None`
/// when the samples reach back less than `keep`.
pub fn purge_upto(samples: &VecDeque<(u64, u64)>, snapshot: u64, keep: u64) -> Option<u64> {
    let mut behind = samples.iter().rev().skip_while(|(index, _)| *index > snapshot);
    let (_, at_snapshot) = *behind.next()?;
    behind.find(|(_, bytes)| at_snapshot.saturating_sub(*bytes) >= keep).map(|(index, _)| *index)
}

/// The next purge point on the way from `purged` to `target`: the furthest sample index
/// at most `step` log bytes after `purged` (by the samples: (last log index, bytes appended
/// so far), oldest first, the first at or before `purged` giving its bytes), or, if even the
/// nearest sample is further, that one (a purge always advances). `None`: nothing to purge.
pub fn purge_step(samples: &VecDeque<(u64, u64)>, purged: u64, target: u64, step: u64) -> Option<u64> {
    if target <= purged {
        return None;
    }
    let base = samples.iter().rev().find(|(index, _)| *index <= purged).map(|(_, bytes)| *bytes);
    let mut candidates = samples.iter().filter(|(index, _)| *index > purged && *index <= target);
    let first = *candidates.next()?;
    let Some(base) = base else { return Some(first.0) };
    let within = std::iter::once(first).chain(candidates.copied()).take_while(|(_, bytes)| bytes.saturating_sub(base) <= step).last();
    Some(within.unwrap_or(first).0)
}

/// Controllers apply the same entries, so with the same policy they would all encode a
/// snapshot at the same moment. They take turns instead: the applied index is cut into
/// slots of a third of the entries after which a snapshot falls due, and controller `id`
/// starts one only in slots `id mod 3`. Those entries are `every`, or fewer when the log's
/// bytes fill first (by the average size of the entries since the last snapshot): with
/// slots of `every` alone, at 10,000 hosts (64 MiB in about 1,000 entries) all the first
/// snapshots fell in one slot, so two controllers waited until they were overdue, both at
/// the same entry, and built 87 MB snapshots at once with the roll-out's writes; a
/// follower's heartbeats then timed out and it started an election.
///
/// The leader, the busiest of them (every report, proposal and replication goes through
/// it), leaves snapshots to the followers: at 10,000 hosts the 5 s windows in which the
/// leader encoded its 87 MB snapshot had report p99s of 206 and 416 ms, those in which a
/// follower did about 110 ms (fleet-bench, two runs). It takes one in its turn once overdue
/// (twice the entries or bytes that make one due), and anyone takes one at three times,
/// whatever the turn.
const TURNS: u64 = 3;

/// Whether controller `id` (the leader if `leads`) may start a snapshot at `applied`,
/// `entries` and `bytes` after its last (of `last_snapshot_bytes`).
pub fn in_turn(id: u64, leads: bool, applied: u64, entries: u64, bytes: u64, last_snapshot_bytes: u64, every: u64) -> bool {
    let due_bytes = last_snapshot_bytes.max(ENOUGH_LOG_BYTES);
    let due_after = match bytes {
        0 => every,
        _ => u64::try_from(u128::from(due_bytes) * u128::from(entries) / u128::from(bytes)).unwrap_or(u64::MAX).min(every),
    };
    let slot = (due_after / TURNS).max(1);
    let turn = (applied / slot) % TURNS == id % TURNS;
    let past = |times: u64| overdue(times, entries, bytes, last_snapshot_bytes, every);
    past(3) || (turn && (!leads || past(2)))
}

/// Log bytes appended between two checks (a second) that make a burst: a fleet-wide
/// roll-out's status writes at 10,000 hosts, 10-20 MB a second; a quiet fleet's a few KB.
pub const BURST_BYTES_PER_CHECK: u64 = 4 * 1024 * 1024;

/// Whether a due snapshot waits for the log to stop growing, `recent` bytes having been
/// appended since the last check: until it is overdue (twice the entries or bytes that make
/// it due). A roll-out's status writes are what make a snapshot due, so without this the
/// controllers encoded their 100 MB snapshots while the roll-out still had both cores busy
/// (at 10,000 hosts three builds of 2-4 s each fell in its seconds, and the reports sent
/// then had a p99 of 180-440 ms, against mostly 14-53 ms in the quiet windows of the same
/// runs).
pub fn waits_out_burst(recent: u64, entries: u64, bytes: u64, last_snapshot_bytes: u64, every: u64) -> bool {
    recent >= BURST_BYTES_PER_CHECK && !overdue(2, entries, bytes, last_snapshot_bytes, every)
}

/// Whether `times` the entries or the log bytes that make a snapshot due have been appended.
fn overdue(times: u64, entries: u64, bytes: u64, last_snapshot_bytes: u64, every: u64) -> bool {
    let due_bytes = last_snapshot_bytes.max(ENOUGH_LOG_BYTES);
    entries >= every.saturating_mul(times) || bytes >= due_bytes.saturating_mul(times)
}

/// Runs the policy until the Raft node shuts down. `appended` counts the bytes this node's
/// log took; `snapshot_bytes` is the size of its latest snapshot (built or installed).
pub async fn run(id: u64, raft: Raft, appended: Arc<AtomicU64>, snapshot_bytes: Arc<AtomicU64>, every: u64) {
    let mut metrics = raft.metrics();
    let mut last_snapshot = metrics.borrow_watched().snapshot.map_or(0, |l| l.index);
    let mut appended_at_snapshot = appended.load(Ordering::Relaxed);
    let mut appended_at_check = appended_at_snapshot;
    let mut requested = false;
    let mut samples = VecDeque::new();
    // Purged up to `purged`; to purge up to `purge_target`, a step a check.
    let (mut purged, mut purge_target) = (0u64, 0u64);
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tick.tick().await;
        let (snapshot, applied, last_log, leads) = {
            let m = metrics.borrow_and_update();
            let leads = m.current_leader == Some(id);
            (m.snapshot.map_or(0, |l| l.index), m.last_applied.map_or(0, |l| l.index), m.last_log_index.unwrap_or(0), leads)
        };
        let appended_now = appended.load(Ordering::Relaxed);
        let recent = appended_now.saturating_sub(std::mem::replace(&mut appended_at_check, appended_now));
        if samples.back().is_none_or(|(index, _)| *index != last_log) {
            samples.push_back((last_log, appended_now));
            if samples.len() > MAX_SIZE_SAMPLES {
                samples.pop_front();
            }
        }
        if snapshot != last_snapshot {
            last_snapshot = snapshot;
            appended_at_snapshot = appended_now;
            requested = false;
            if let Some(upto) = purge_upto(&samples, snapshot, KEEP_LOG_BYTES) {
                purge_target = purge_target.max(upto);
            }
        }
        if let Some(upto) = purge_step(&samples, purged, purge_target, PURGE_STEP_BYTES) {
            purged = upto;
            // Keep the last sample at or before the purge point: the next step counts from it.
            while samples.get(1).is_some_and(|(index, _)| *index <= purged) {
                samples.pop_front();
            }
            if raft.trigger().purge_log(upto).await.is_err() {
                return; // shut down
            }
        }
        let bytes = appended_now.saturating_sub(appended_at_snapshot);
        let entries = applied.saturating_sub(snapshot);
        let last_bytes = snapshot_bytes.load(Ordering::Relaxed);
        if !requested
            && snapshot_due(entries, bytes, last_bytes, every)
            && in_turn(id, leads, applied, entries, bytes, last_bytes, every)
            && !waits_out_burst(recent, entries, bytes, last_bytes, every)
        {
            // Once per snapshot: openraft builds one at a time, and the next check finds
            // the new snapshot's index.
            requested = true;
            if raft.trigger().snapshot().await.is_err() {
                return; // shut down
            }
        }
        // A closed channel: Raft shut down. (A pending change is read at the next check.)
        if let Some(Err(_)) = futures::FutureExt::now_or_never(metrics.changed()) {
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
        // Few large entries (a status entry holds 64 nodes' states): the bytes decide.
        assert!(!snapshot_due(300, ENOUGH_LOG_BYTES - 1, 1_000, 10_000));
        assert!(snapshot_due(300, ENOUGH_LOG_BYTES, 1_000, 10_000));
        assert!(!snapshot_due(300, 80_000_000, 88_000_000, 10_000));
        assert!(snapshot_due(300, 88_000_000, 88_000_000, 10_000));
    }

    #[test]
    fn the_purge_keeps_about_the_bytes_asked_behind_the_snapshot() {
        // (last log index, bytes appended so far): 10 MB per 100 entries.
        let samples: VecDeque<(u64, u64)> = (0..=20).map(|i| (i * 100, i * 10_000_000)).collect();
        // Snapshot at 1,500 (150 MB): keeping 60 MB purges up to 900.
        assert_eq!(purge_upto(&samples, 1_500, 60_000_000), Some(900));
        // Between samples: the sample at or before the snapshot counts (1,450 → 1,400).
        assert_eq!(purge_upto(&samples, 1_450, 60_000_000), Some(800));
        // Samples after the snapshot are ignored; too short a history purges nothing.
        assert_eq!(purge_upto(&samples, 500, 60_000_000), None);
        assert_eq!(purge_upto(&VecDeque::new(), 500, 1), None);
    }

    #[test]
    fn a_large_purge_goes_in_steps_of_about_the_step_bytes_and_always_advances() {
        // 10 MB per 100 entries; purged up to 300, to purge up to 1,500.
        let samples: VecDeque<(u64, u64)> = (0..=20).map(|i| (i * 100, i * 10_000_000)).collect();
        assert_eq!(purge_step(&samples, 300, 1_500, 25_000_000), Some(500));
        assert_eq!(purge_step(&samples, 500, 1_500, 25_000_000), Some(700));
        // The last step stops at the target, between samples or not.
        assert_eq!(purge_step(&samples, 1_300, 1_500, 25_000_000), Some(1_500));
        assert_eq!(purge_step(&samples, 1_300, 1_450, 25_000_000), Some(1_400));
        // A step smaller than one sample's bytes still advances by one sample.
        assert_eq!(purge_step(&samples, 300, 1_500, 1), Some(400));
        // Nothing to do at or past the target, or without samples after the purge point.
        assert_eq!(purge_step(&samples, 1_500, 1_500, 25_000_000), None);
        assert_eq!(purge_step(&samples, 2_000, 2_500, 25_000_000), None);
        // No sample at or before the purge point: the nearest sample.
        let late: VecDeque<(u64, u64)> = samples.iter().copied().filter(|(i, _)| *i >= 1_000).collect();
        assert_eq!(purge_step(&late, 300, 1_500, 25_000_000), Some(1_000));
    }

    #[test]
    fn followers_take_turns_the_leader_leaves_them_and_none_waits_past_three_times_the_interval() {
        let every = 9_000;
        let turn = |applied: u64| (1..=3).filter(|&id| in_turn(id, false, applied, every, 0, 0, every)).collect::<Vec<_>>();
        assert_eq!(turn(0), vec![3]);
        assert_eq!(turn(3_000), vec![1]);
        assert_eq!(turn(6_500), vec![2]);
        assert_eq!(turn(9_000), vec![3]);
        // Out of turn: at three times the entries or the bytes, not before.
        assert!(!in_turn(1, false, 0, 2 * every, 0, 0, every));
        assert!(in_turn(1, false, 0, 3 * every, 0, 0, every));
        assert!(!in_turn(1, false, 0, 300, 176_000_000, 88_000_000, every));
        assert!(in_turn(1, false, 0, 300, 264_000_000, 88_000_000, every));
        // The leader leaves its turn to the followers, unless overdue.
        assert!(!in_turn(3, true, 0, every, 0, 0, every));
        assert!(in_turn(3, true, 0, 2 * every, 0, 0, every));
        assert!(!in_turn(3, true, 3_000, 2 * every, 0, 0, every), "overdue, but not its turn");
        assert!(in_turn(3, true, 3_000, 3 * every, 0, 0, every));
        // A tiny interval still has slots of one entry.
        assert!(in_turn(1, false, 1, 1, 0, 0, 1));
    }

    #[test]
    fn a_due_snapshot_waits_while_the_log_grows_fast_until_it_is_overdue() {
        let (every, last) = (10_000, 100_000_000);
        // Due: as many bytes as the last snapshot held.
        assert!(snapshot_due(500, last, last, every));
        assert!(waits_out_burst(BURST_BYTES_PER_CHECK, 500, last, last, every), "a roll-out is writing");
        assert!(!waits_out_burst(BURST_BYTES_PER_CHECK - 1, 500, last, last, every), "quiet again");
        // Overdue at twice the bytes or the entries: it waits no longer.
        assert!(!waits_out_burst(BURST_BYTES_PER_CHECK, 500, 2 * last, last, every));
        assert!(!waits_out_burst(BURST_BYTES_PER_CHECK, 2 * every, 1_000, 0, every));
        // A small state's snapshot (the entry count decides) waits the same way.
        assert!(waits_out_burst(u64::MAX, every, 1_000, 0, every));
    }

    /// Three controllers applying one log whose bytes make snapshots due long before
    /// `every` entries (10,000 hosts: 64 KiB entries), each snapshot taking 200 entries'
    /// time to build: builds never overlap, everyone builds, and no log grows past three
    /// times the bytes that make a snapshot due.
    #[test]
    fn when_the_bytes_decide_the_controllers_still_take_turns() {
        let (every, entry_bytes, snapshot_bytes, build_entries) = (10_000u64, 64 * 1024u64, 88_000_000u64, 200u64);
        let leader = 1;
        // Per controller: (index of its last snapshot, its snapshot's size, building until).
        let mut nodes: Vec<(u64, u64, Option<u64>)> = vec![(0, 0, None); 4];
        let mut builds: Vec<(u64, u64, u64)> = Vec::new(); // (id, from, until)
        for applied in 1..=30_000u64 {
            for id in 1..=3u64 {
                let (last, last_bytes, building) = nodes[id as usize];
                if building.is_some_and(|until| applied >= until) {
                    nodes[id as usize].2 = None;
                }
                if nodes[id as usize].2.is_some() {
                    continue;
                }
                let (entries, bytes) = (applied - last, (applied - last) * entry_bytes);
                assert!(
                    bytes < 3 * last_bytes.max(ENOUGH_LOG_BYTES) + entry_bytes,
                    "controller {id} waited too long: {bytes} bytes at {applied}"
                );
                if snapshot_due(entries, bytes, last_bytes, every) && in_turn(id, id == leader, applied, entries, bytes, last_bytes, every)
                {
                    nodes[id as usize] = (applied, snapshot_bytes, Some(applied + build_entries));
                    builds.push((id, applied, applied + build_entries));
                }
            }
        }
        for (i, a) in builds.iter().enumerate() {
            for b in &builds[i + 1..] {
                assert!(b.1 >= a.2 || a.1 >= b.2, "builds overlap: {a:?} and {b:?} (all: {builds:?})");
            }
        }
        for id in 1..=3 {
            assert!(builds.iter().filter(|b| b.0 == id).count() >= 3, "controller {id} built too rarely: {builds:?}");
        }
    }
}
