//! The routers' own threads: each a single-threaded tokio runtime, apart from the agent's
//! control work (reconcile, reports, scrapes), each service's router on one of them.
//!
//! Why not the agent's multi-threaded runtime: on a current-thread runtime a request's tasks
//! never cross threads, and `router-bench` measured the router's CPU per request lower there
//! (Triton, 64 clients, 2-core VM: median 65 µs over 5 runs against 85 µs over 4 on a
//! one-worker multi-threaded runtime; docs/performance-history.md); and a burst of control
//! work never delays a request.
//! One thread caps a service at one core's worth of routing; `router_threads` spreads the
//! services of a host over several.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The threads' name (15 bytes: Linux keeps no more), so `top -H` and `perf report --comm`
/// tell the data plane apart.
pub const ROUTER_THREAD: &str = "gpuplane-router";

/// Router threads an agent may run: more than a host's cores only adds switches.
pub const MAX_ROUTER_THREADS: usize = 64;

/// One thread driving one current-thread runtime until dropped.
struct RouterThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The router threads of an agent; the runtimes stop (their tasks dropped, listeners
/// closed) when this is dropped.
pub struct RouterThreads {
    threads: Vec<RouterThread>,
    /// Which thread the next service's router goes to.
    next: AtomicUsize,
}

impl RouterThreads {
    /// Starts `count` threads (at least 1, at most [`MAX_ROUTER_THREADS`]).
    pub fn start(count: usize) -> std::io::Result<Self> {
        let threads = (0..count.clamp(1, MAX_ROUTER_THREADS)).map(|_| RouterThread::start()).collect::<std::io::Result<_>>()?;
        Ok(RouterThreads { threads, next: AtomicUsize::new(0) })
    }

    /// The runtime of the next service's router, round-robin over the threads: services are
    /// spread evenly in the order they arrive.
    pub fn assign(&self) -> Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        self.threads[i].handle.clone()
    }

    /// Any one of the runtimes, for work that is no service's (a readiness probe).
    pub fn any(&self) -> Handle {
        self.threads[0].handle.clone()
    }
}

impl RouterThread {
    fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        // `Runtime::block_on` on this thread drives the runtime's IO and timers, so that
        // `Handle::block_on` from other threads (the executor's) works as well.
        let thread = std::thread::Builder::new().name(ROUTER_THREAD.into()).spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })?;
        Ok(RouterThread { handle, stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for RouterThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Its runtime drops its tasks and returns; a panic there was already printed.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_are_spread_round_robin_and_work_runs_on_named_threads() {
        let threads = RouterThreads::start(2).unwrap();
        let names: Vec<String> =
            (0..4).map(|_| threads.assign().block_on(async { std::thread::current().name().unwrap_or_default().to_string() })).collect();
        // Handle::block_on runs the future on the caller's thread; spawned tasks run on
        // the router thread.
        assert!(names.iter().all(|n| n != ROUTER_THREAD), "{names:?}");
        let spawned = threads
            .assign()
            .block_on(async { tokio::spawn(async { std::thread::current().name().unwrap_or_default().to_string() }).await.unwrap() });
        assert_eq!(spawned, ROUTER_THREAD);
        let ids: Vec<_> = (0..4)
            .map(|_| threads.assign().block_on(async { tokio::spawn(async { std::thread::current().id() }).await.unwrap() }))
            .collect();
        assert_eq!(ids[0], ids[2]);
        assert_eq!(ids[1], ids[3]);
        assert_ne!(ids[0], ids[1], "two threads take turns");
        assert_eq!(RouterThreads::start(0).unwrap().threads.len(), 1, "at least one");
    }

    #[test]
    fn timers_work_from_another_thread_and_dropping_stops_the_tasks() {
        let threads = RouterThreads::start(1).unwrap();
        let handle = threads.any();
        // Made inside the block: a timer is made in its runtime's context.
        handle.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(5)).await });
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // A task that holds `tx` until its runtime drops it.
        handle.spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        });
        drop(threads);
        assert!(rx.recv().is_err(), "the task was dropped with its runtime");
    }
}
