//! One interval's server-side reading per service, from each process's metrics page: the
//! growth of its counters since its previous page ([`server_metrics::window`]), summed over
//! the service's processes on the node. Pure: pages come in with the time they were read.
//!
//! A page that was not believed (unreachable, over its bounds, malformed) is counted and
//! drops that process's previous reading, so its next window starts afresh instead of
//! spanning a gap of unknown length; a process no longer listed is forgotten.

use super::server_metrics::{self, ServerCounters};
use std::collections::{BTreeMap, HashMap};

/// A process whose page is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PageSource {
    pub process: String,
    pub service: String,
}

/// What reading one page gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Page {
    Believed(ServerCounters),
    /// Unreachable, over its bounds or malformed.
    Refused,
}

/// Each process's previous believed page.
#[derive(Debug, Default)]
pub struct ServerWindows {
    previous: HashMap<String, (f64, ServerCounters)>,
}

/// Sums of one service's windows; means are weighted by successes.
#[derive(Debug, Default)]
struct Sums {
    success_rps: f64,
    failure_rps: f64,
    request_ms_x_rps: f64,
    queue_ms_x_rps: f64,
    compute_ms_x_rps: f64,
    pages_read: u32,
    pages_refused: u32,
}

impl ServerWindows {
    /// One round of pages, all read at `at_s` (seconds on any monotonic clock): the reading
    /// of each service that has a page in the round.
    pub fn round(&mut self, at_s: f64, pages: Vec<(PageSource, Page)>) -> BTreeMap<String, proto::ServerReading> {
        let listed: std::collections::HashSet<&str> = pages.iter().map(|(s, _)| s.process.as_str()).collect();
        self.previous.retain(|process, _| listed.contains(process.as_str()));
        let mut sums: BTreeMap<String, Sums> = BTreeMap::new();
        for (source, page) in pages {
            let sum = sums.entry(source.service).or_default();
            let counters = match page {
                Page::Refused => {
                    sum.pages_refused += 1;
                    self.previous.remove(&source.process);
                    continue;
                }
                Page::Believed(c) => c,
            };
            sum.pages_read += 1;
            let before = self.previous.insert(source.process, (at_s, counters));
            // The first page of a process, or one after a restart, opens its window.
            let Some(w) = before.and_then(|(then, b)| server_metrics::window(&b, &counters, at_s - then)) else { continue };
            sum.success_rps += w.success_rps;
            sum.failure_rps += w.failure_rps;
            sum.request_ms_x_rps += w.mean_request_ms * w.success_rps;
            sum.queue_ms_x_rps += w.mean_queue_ms * w.success_rps;
            sum.compute_ms_x_rps += w.mean_compute_ms * w.success_rps;
        }
        sums.into_iter()
            .map(|(service, s)| {
                let mean = |x: f64| if s.success_rps > 0.0 { x / s.success_rps } else { 0.0 };
                let reading = proto::ServerReading {
                    success_rps: s.success_rps,
                    failure_rps: s.failure_rps,
                    mean_request_ms: mean(s.request_ms_x_rps),
                    mean_queue_ms: mean(s.queue_ms_x_rps),
                    mean_compute_ms: mean(s.compute_ms_x_rps),
                    pages_read: s.pages_read,
                    pages_refused: s.pages_refused,
                };
                (service, reading)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(process: &str, service: &str) -> PageSource {
        PageSource { process: process.into(), service: service.into() }
    }

    fn page(success: f64, request_ms: f64, queue_ms: f64) -> Page {
        Page::Believed(ServerCounters {
            success,
            failure: 0.0,
            request_us: request_ms * 1000.0,
            queue_us: queue_ms * 1000.0,
            compute_us: (request_ms - queue_ms) * 1000.0,
        })
    }

    #[test]
    fn two_processes_of_a_service_sum_their_rates_and_weigh_their_means_by_successes() {
        let mut w = ServerWindows::default();
        let first = w.round(0.0, vec![(source("a", "web"), page(0.0, 0.0, 0.0)), (source("b", "web"), page(0.0, 0.0, 0.0))]);
        // A first page opens a window: nothing measured yet, but it was read.
        assert_eq!(first["web"].success_rps, 0.0);
        assert_eq!(first["web"].pages_read, 2);
        // In 2 s, `a` did 300 requests of 10 ms (2 queued), `b` 100 of 30 ms (6 queued).
        let second = w.round(2.0, vec![(source("a", "web"), page(300.0, 3000.0, 600.0)), (source("b", "web"), page(100.0, 3000.0, 600.0))]);
        let r = &second["web"];
        assert_eq!(r.success_rps, 200.0);
        assert!((r.mean_request_ms - 15.0).abs() < 1e-9, "(300×10 + 100×30) / 400 = 15: {r:?}");
        assert!((r.mean_queue_ms - 3.0).abs() < 1e-9, "{r:?}");
        assert!((r.mean_compute_ms - 12.0).abs() < 1e-9, "{r:?}");
        assert_eq!((r.pages_read, r.pages_refused), (2, 0));
    }

    #[test]
    fn a_refused_page_is_counted_and_its_process_starts_a_new_window() {
        let mut w = ServerWindows::default();
        w.round(0.0, vec![(source("a", "web"), page(10.0, 100.0, 0.0))]);
        let refused = w.round(1.0, vec![(source("a", "web"), Page::Refused)]);
        assert_eq!((refused["web"].pages_read, refused["web"].pages_refused, refused["web"].success_rps), (0, 1, 0.0));
        // The next page opens a window rather than spanning the gap since t=0.
        let after = w.round(2.0, vec![(source("a", "web"), page(1000.0, 10_000.0, 0.0))]);
        assert_eq!(after["web"].success_rps, 0.0);
        let next = w.round(3.0, vec![(source("a", "web"), page(1010.0, 10_100.0, 0.0))]);
        assert_eq!(next["web"].success_rps, 10.0);
        assert!((next["web"].mean_request_ms - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_restarted_server_and_a_forgotten_process_measure_nothing_false() {
        let mut w = ServerWindows::default();
        w.round(0.0, vec![(source("a", "web"), page(500.0, 5000.0, 0.0)), (source("z", "api"), page(5.0, 50.0, 0.0))]);
        // `a` restarted (its counters went down): no window, not a negative rate.
        let restarted = w.round(1.0, vec![(source("a", "web"), page(3.0, 30.0, 0.0))]);
        assert_eq!(restarted["web"].success_rps, 0.0);
        assert!(!restarted.contains_key("api"), "a service with no page this round has no reading");
        // `z` was not listed last round: it is forgotten, so its return opens a new window.
        let back = w.round(2.0, vec![(source("z", "api"), page(50.0, 500.0, 0.0))]);
        assert_eq!(back["api"].success_rps, 0.0);
    }
}
