//! The scrape loop: once per interval, the metrics page of every process whose runtime
//! declares one is read on the loopback (bounded in size by [`MAX_METRICS_BYTES`] and in
//! time by [`PAGE_TIMEOUT`]), and each service's server-side reading is kept for the next
//! report. Pages are read concurrently, so one server that hangs delays no other's.

use super::server_metrics::{self, MetricsError, MAX_METRICS_BYTES};
use super::server_windows::{Page, PageSource, ServerWindows};
use super::Agent;
use crate::executor::Executor;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How long one page may take; a server that has not answered by then is refused this round.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(1);

/// One process's page to read.
#[derive(Debug, Clone)]
struct Target {
    source: PageSource,
    model: String,
    port: u16,
    path: String,
}

/// What reading a page gave, before it is believed or not.
enum Fetched {
    Text(String),
    Unreachable,
}

fn targets(executor: &Executor) -> Vec<Target> {
    executor
        .supervisor
        .records()
        .filter_map(|r| {
            let m = r.metrics.as_ref()?;
            let source = PageSource { process: r.id.clone(), service: r.spec.service.clone() };
            Some(Target { source, model: r.spec.model.clone(), port: m.port, path: m.path.clone() })
        })
        .collect()
}

async fn fetch(port: u16, path: String) -> Fetched {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match tokio::time::timeout(PAGE_TIMEOUT, telemetry_http::get_bounded(addr, &path, MAX_METRICS_BYTES)).await {
        Ok(Ok((200, text))) => Fetched::Text(text),
        Ok(Ok((status, _))) => {
            tracing::debug!(%addr, %path, status, "metrics page not served");
            Fetched::Unreachable
        }
        Ok(Err(e)) => {
            tracing::debug!(%addr, %path, error = %e, "metrics page not read");
            Fetched::Unreachable
        }
        Err(_) => Fetched::Unreachable,
    }
}

/// Believes a page or not, and says which outcome it counts as.
fn believe(text: &Fetched, model: &str) -> (Page, &'static str) {
    let Fetched::Text(text) = text else { return (Page::Refused, "unreachable") };
    match server_metrics::parse(text, model) {
        Ok(counters) => (Page::Believed(counters), "read"),
        // MLServer exports a model's series once it has served a request: nothing yet.
        Err(MetricsError::NoSeries { .. }) => (Page::Believed(Default::default()), "read"),
        Err(e) => {
            tracing::debug!(model, error = %e, "metrics page refused");
            (Page::Refused, "refused")
        }
    }
}

impl Agent {
    pub(super) async fn scrape_loop(self: Arc<Self>) {
        let started = Instant::now();
        let mut windows = ServerWindows::default();
        let mut listed = Vec::new();
        let mut interval = tokio::time::interval(Duration::from_millis(self.cfg.interval_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            // While a reconcile round holds the executor, last round's processes.
            if let Ok(executor) = self.executor.try_lock() {
                listed = targets(&executor);
            }
            let mut reads = JoinSet::new();
            for (i, t) in listed.iter().enumerate() {
                let (port, path) = (t.port, t.path.clone());
                reads.spawn(async move { (i, fetch(port, path).await) });
            }
            let mut fetched: Vec<Option<Fetched>> = (0..listed.len()).map(|_| None).collect();
            // A read that panicked is unreachable; the others are still awaited.
            while let Some(joined) = reads.join_next().await {
                if let Ok((i, page)) = joined {
                    fetched[i] = Some(page);
                }
            }
            let at_s = started.elapsed().as_secs_f64();
            let round = listed.clone();
            // Parsing up to a mebibyte per page is kept off the async workers.
            let me = self.clone();
            let Ok(back) = tokio::task::spawn_blocking(move || {
                let pages = round
                    .into_iter()
                    .zip(fetched)
                    .map(|(t, f)| {
                        let (page, outcome) = believe(f.as_ref().unwrap_or(&Fetched::Unreachable), &t.model);
                        me.telemetry.server_page(&t.source.service, outcome);
                        (t.source, page)
                    })
                    .collect();
                let readings = windows.round(at_s, pages);
                *me.server_readings.lock().unwrap_or_else(|p| p.into_inner()) = readings;
                windows
            })
            .await
            else {
                return;
            };
            windows = back;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_silence_are_refused_and_a_fresh_mlserver_page_is_read_as_nothing_yet() {
        let (page, outcome) = believe(&Fetched::Text("nv_inference_request_success{model=\"m\"} -3\n".into()), "m");
        assert_eq!((page, outcome), (Page::Refused, "refused"));
        assert_eq!(believe(&Fetched::Unreachable, "m"), (Page::Refused, "unreachable"));
        let (page, outcome) = believe(&Fetched::Text("# HELP python_info x\npython_info{version=\"3.11\"} 1\n".into()), "m");
        assert_eq!((page, outcome), (Page::Believed(Default::default()), "read"));
        let (page, _) = believe(&Fetched::Text("nv_inference_request_success{model=\"m\",version=\"1\"} 4\n".into()), "m");
        assert_eq!(page, Page::Believed(server_metrics::ServerCounters { success: 4.0, ..Default::default() }));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_never_answers_is_unreachable_after_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts and holds the connection, answering nothing.
        let hold = tokio::spawn(async move {
            let (_stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        assert!(matches!(fetch(port, "/metrics".into()).await, Fetched::Unreachable));
        hold.abort();
    }
}
