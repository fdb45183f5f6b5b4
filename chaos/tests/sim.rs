//! The deterministic simulation: many seeds pass every invariant check, and a seed replays
//! identically. `CHAOS_SIM_SEEDS` changes how many seeds run (default 200).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use chaos::sim::{run_seed, SimOptions, Totals};

fn seed_count() -> u64 {
    std::env::var("CHAOS_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200)
}

#[test]
fn every_seed_keeps_the_invariants_under_faults() {
    let seeds = seed_count();
    let next = AtomicU64::new(0);
    let totals = Mutex::new(Totals::default());
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    // Each simulation is single-threaded and independent: run several side by side.
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= seeds || !failures.lock().unwrap().is_empty() {
                    return;
                }
                match run_seed(seed, &SimOptions::ci()) {
                    Ok(report) => totals.lock().unwrap().add(&report),
                    Err(failure) => failures.lock().unwrap().push(failure),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"));
    let totals = totals.into_inner().unwrap();
    println!("{totals}");
    assert_eq!(totals.seeds, seeds);
    for (kind, n) in &totals.faults_by_kind {
        assert!(seeds < 50 || *n > 0, "no {kind} fault was injected over {seeds} seeds: {totals}");
    }
}

/// A seed replays identically as `chaos sim --seed S` replays it, in a process of its own:
/// the same faults at the same times and the same trace, event for event and millisecond for
/// millisecond. Seeds 3, 5 and 14 used to drift at the end of their runs (channels closed in
/// hash order); 7 is an ordinary one.
///
/// Two runs of a seed in one process do not always agree (in about one seed in ten, after a
/// crash): most likely because tokio numbers tasks from one counter per process and a crashed
/// host's runtime drops its tasks in an order that follows those numbers, so the connections
/// close in another order the second time. The replay command starts a new process.
#[test]
fn a_seed_replays_identically_and_seeds_differ() {
    let replay = |seed: u64| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_chaos")).args(["sim", "--seed", &seed.to_string()]).output().unwrap();
        assert!(out.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&out.stderr));
        // What the run did: its faults, its verdict and its trace's digest (not the totals'
        // wall time).
        let text = String::from_utf8(out.stdout).unwrap();
        let run: Vec<String> = text.lines().take_while(|l| l.starts_with("seed ") || l.starts_with("  ")).map(str::to_string).collect();
        assert!(run.iter().any(|l| l.starts_with("  fault ")), "seed {seed} drew no faults: {text}");
        run
    };
    let mut digests = Vec::new();
    for seed in [3, 5, 7, 14] {
        let (first, again) = (replay(seed), replay(seed));
        assert_eq!(first, again, "seed {seed} ran differently the second time");
        digests.push(first.into_iter().find(|l| l.contains("digest")).expect("the trace's digest"));
    }
    digests.dedup();
    assert_eq!(digests.len(), 4, "two seeds gave the same trace");
}

#[test]
fn unsupported_shapes_are_refused_naming_the_field() {
    let opts = SimOptions { controllers: 4, ..SimOptions::ci() };
    let failure = run_seed(1, &opts).unwrap_err();
    assert_eq!(failure.reason, "controllers: must be 3 or 5, got 4");
    let opts = SimOptions { keys: 0, ..SimOptions::ci() };
    assert_eq!(run_seed(1, &opts).unwrap_err().reason, "keys: must be at least 1");
}
