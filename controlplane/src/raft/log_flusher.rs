//! Makes appended log entries durable behind `LogStore::append`, on a thread of its own.
//!
//! openraft 0.10 replicates an entry as soon as `append` returns, and counts the leader
//! toward the entry's commit only once the leader's own flush completes (Raft thesis
//! §10.2.1: "the leader may write to its disk in parallel with replicating"). So the
//! leader's `fdatasync` (0.17-0.22 ms per write here) overlaps the followers' round trip
//! instead of preceding it. A thread, not a task: Raft's runtime is one thread
//! (`own_runtime`), and a flush awaited there would stop replication too.
//!
//! Jobs are flushed in the order queued, several with one flush when they queue up behind
//! a running one (group commit); their callbacks run in order. The queue holds no more than
//! the leader's appends in flight: the proposer keeps two entries of client writes in flight
//! (`proposer::ENTRIES_IN_FLIGHT`), plus openraft's own blank and membership entries.

use std::sync::{Arc, Condvar, Mutex};

use openraft::storage::IOFlushed;

use super::types::TypeConfig;

/// Makes entries durable up to the given index (flush, then the watermark), or says why not.
pub type FlushFn = Box<dyn FnMut(u64) -> Result<(), String> + Send>;

/// The handle to one log's flusher thread. Clones share it; the thread drains what is queued
/// and ends when the last clone is dropped.
#[derive(Clone)]
pub struct LogFlusher {
    shared: Arc<Shared>,
    _stop: Arc<StopOnDrop>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    queued: Vec<Job>,
    /// A flush is running (its jobs are no longer in `queued`).
    flushing: bool,
    closed: bool,
    /// The first failed flush: every job after it fails too, and the log stops.
    fault: Option<String>,
}

struct Job {
    last_index: u64,
    done: IOFlushed<TypeConfig>,
}

struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.state.lock().expect("flusher lock").closed = true;
        self.0.changed.notify_all();
    }
}

impl LogFlusher {
    /// Starts the thread that runs `flush`.
    pub fn start(flush: FlushFn) -> std::io::Result<Self> {
        let shared = Arc::new(Shared { state: Mutex::default(), changed: Condvar::new() });
        let worker = shared.clone();
        std::thread::Builder::new().name("log-flush".into()).spawn(move || run(&worker, flush))?;
        Ok(Self { _stop: Arc::new(StopOnDrop(shared.clone())), shared })
    }

    /// Queues entries written up to `last_index`; `done` is called once they are durable.
    /// After a failed flush, fails `done` at once and returns the fault.
    pub fn queue(&self, last_index: u64, done: IOFlushed<TypeConfig>) -> Result<(), String> {
        let mut state = self.shared.state.lock().expect("flusher lock");
        if let Some(fault) = &state.fault {
            let fault = fault.clone();
            drop(state);
            done.io_completed(Err(std::io::Error::other(fault.clone())));
            return Err(fault);
        }
        state.queued.push(Job { last_index, done });
        drop(state);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Waits until everything queued is durable (or failed), and returns the fault if a flush
    /// failed. Blocks the calling thread for at most the flush under way and one more: for
    /// the log's rare writes that must not overtake an append (a vote, a truncation, a
    /// purge: openraft requires the log's writes to complete in order).
    pub fn wait_idle(&self) -> Result<(), String> {
        let mut state = self.shared.state.lock().expect("flusher lock");
        while !state.queued.is_empty() || state.flushing {
            state = self.shared.changed.wait(state).expect("flusher lock");
        }
        match &state.fault {
            Some(fault) => Err(fault.clone()),
            None => Ok(()),
        }
    }
}

fn run(shared: &Shared, mut flush: FlushFn) {
    loop {
        let (jobs, earlier_fault) = {
            let mut state = shared.state.lock().expect("flusher lock");
            while state.queued.is_empty() && !state.closed {
                state = shared.changed.wait(state).expect("flusher lock");
            }
            if state.queued.is_empty() {
                return;
            }
            state.flushing = true;
            (std::mem::take(&mut state.queued), state.fault.clone())
        };
        let upto = jobs.iter().map(|j| j.last_index).max().unwrap_or(0);
        let result = match earlier_fault {
            Some(fault) => Err(fault),
            None => flush(upto),
        };
        if let Err(e) = &result {
            tracing::error!(error = %e, "flushing the Raft log failed; the node stops");
            // Recorded before any callback reports it: from the moment a write is known to
            // have failed, every later one is refused at once (`queue`), not queued.
            shared.state.lock().expect("flusher lock").fault.get_or_insert_with(|| e.clone());
        }
        for job in jobs {
            job.done.io_completed(result.clone().map_err(std::io::Error::other));
        }
        shared.state.lock().expect("flusher lock").flushing = false;
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    type Seen = Arc<Mutex<Vec<u64>>>;

    /// A flusher whose flushes say they started (`started`), then wait for `gate`, and
    /// record the index flushed up to.
    struct Gated {
        flusher: LogFlusher,
        seen: Seen,
        gate: mpsc::Sender<()>,
        started: mpsc::Receiver<u64>,
    }

    fn gated(fail_at: Option<u64>) -> Gated {
        let (gate, wait) = mpsc::channel::<()>();
        let (starts, started) = mpsc::channel::<u64>();
        let seen = Seen::default();
        let recorded = seen.clone();
        let flush: FlushFn = Box::new(move |upto| {
            let _ = starts.send(upto);
            wait.recv().map_err(|e| e.to_string())?;
            recorded.lock().unwrap().push(upto);
            match fail_at {
                Some(at) if upto >= at => Err("injected: no space left on device".into()),
                _ => Ok(()),
            }
        });
        Gated { flusher: LogFlusher::start(flush).unwrap(), seen, gate, started }
    }

    fn callback() -> (IOFlushed<TypeConfig>, tokio::sync::oneshot::Receiver<Result<(), std::io::Error>>) {
        use openraft::type_config::TypeConfigExt;
        let (tx, rx) = TypeConfig::oneshot();
        (IOFlushed::signal(tx), rx)
    }

    #[test]
    fn jobs_queued_behind_a_flush_share_the_next_one_and_complete_in_order() {
        let Gated { flusher, seen, gate, started } = gated(None);
        let (first, mut first_done) = callback();
        flusher.queue(1, first).unwrap();
        // Once the first flush has started (it waits for the gate), these two queue behind it.
        assert_eq!(started.recv().unwrap(), 1);
        let (second, mut second_done) = callback();
        let (third, mut third_done) = callback();
        flusher.queue(2, second).unwrap();
        flusher.queue(3, third).unwrap();
        assert!(first_done.try_recv().is_err(), "completed before its flush");
        gate.send(()).unwrap();
        gate.send(()).unwrap();
        flusher.wait_idle().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![1, 3], "the two jobs behind the first share one flush");
        assert!(first_done.try_recv().unwrap().is_ok());
        assert!(second_done.try_recv().unwrap().is_ok());
        assert!(third_done.try_recv().unwrap().is_ok());
    }

    #[test]
    fn a_failed_flush_fails_its_jobs_and_every_later_one() {
        let Gated { flusher, seen, gate, .. } = gated(Some(2));
        let (ok, mut ok_done) = callback();
        flusher.queue(1, ok).unwrap();
        gate.send(()).unwrap();
        flusher.wait_idle().unwrap();
        let (failing, failing_done) = callback();
        flusher.queue(2, failing).unwrap();
        gate.send(()).unwrap();
        assert!(ok_done.try_recv().unwrap().is_ok());
        let err = failing_done.blocking_recv().unwrap().unwrap_err().to_string();
        assert!(err.contains("no space left on device"), "{err}");
        // From the moment the failure is reported, later jobs fail at once, without a
        // flush (this queues while the flusher thread may still be finishing that flush).
        let (later, mut later_done) = callback();
        assert!(flusher.queue(3, later).unwrap_err().contains("no space left on device"));
        let fault = flusher.wait_idle().unwrap_err();
        assert!(fault.contains("no space left on device"), "{fault}");
        assert!(later_done.try_recv().unwrap().is_err());
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn the_thread_drains_its_queue_and_ends_when_the_last_handle_is_dropped() {
        let Gated { flusher, seen, gate, .. } = gated(None);
        let (job, mut done) = callback();
        flusher.queue(7, job).unwrap();
        drop(flusher);
        gate.send(()).unwrap();
        for _ in 0..500 {
            if let Ok(result) = done.try_recv() {
                assert!(result.is_ok());
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(*seen.lock().unwrap(), vec![7]);
        // The thread has ended: it dropped the gate's receiver.
        for _ in 0..500 {
            if gate.send(()).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the flusher thread did not end");
    }
}
