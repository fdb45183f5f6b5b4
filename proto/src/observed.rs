//! The digest of what an agent's report observes. The agent computes it to leave its GPUs
//! out of a report when the controllers already hold them; the leader computes its own from
//! a report that carries them, to tell whether the Node's status changes and to store with
//! it. SHA-256 rather than std's hasher, whose output is not promised stable across Rust
//! releases: agents and controllers of different builds must agree. Should they not, agents
//! only keep sending whole reports; a status is never wrong for it.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::ReportRequest;

/// The digest of `report`'s applied version, GPUs (as encoded) and routers' endpoints (in
/// service order): what a Node's status shows of a report. Never 0 (0 means "none").
pub fn observed_digest(report: &ReportRequest) -> u64 {
    let mut hash = Sha256::new();
    hash.update(report.applied_version.to_le_bytes());
    hash.update((report.gpus.len() as u64).to_le_bytes());
    let mut encoded = Vec::new();
    for gpu in &report.gpus {
        encoded.clear();
        gpu.encode_length_delimited(&mut encoded).expect("a Vec grows as needed");
        hash.update(&encoded);
    }
    let mut endpoints: Vec<(&str, &str)> =
        report.metrics.iter().filter(|m| !m.endpoint.is_empty()).map(|m| (m.service.as_str(), m.endpoint.as_str())).collect();
    endpoints.sort_unstable();
    for (service, endpoint) in endpoints {
        for text in [service, endpoint] {
            hash.update((text.len() as u64).to_le_bytes());
            hash.update(text.as_bytes());
        }
    }
    let first: [u8; 8] = hash.finalize()[..8].try_into().expect("SHA-256 has 32 bytes");
    u64::from_be_bytes(first).max(1)
}

/// Sets `report`'s digest, and leaves its GPUs out when the digest is `stored`.
pub fn leave_out_unchanged(report: &mut ReportRequest, stored: u64) {
    let digest = observed_digest(report);
    leave_out_if_held(report, digest, stored);
}

/// Sets `report`'s digest to `digest` (its own), and leaves its GPUs out when it is `held`.
fn leave_out_if_held(report: &mut ReportRequest, digest: u64, held: u64) {
    report.observed_digest = digest;
    report.gpus_unchanged = digest == held;
    if report.gpus_unchanged {
        report.gpus.clear();
    }
}

/// The agent's side of change-only reports: which of its reports leave their GPUs out.
///
/// A report carries its GPUs when its digest is new to the controllers. The answer to that
/// report names the digest stored before it (its status write commits a few milliseconds
/// later), so the next report leaves them out if the one before delivered them: sending
/// them again until an answer named them sent every changed node's GPUs twice, half of a
/// 10,000-host fleet's report bytes after a re-plan. Should that write never land (a relay
/// dropped, a leader change), the answer to the slim report names what is stored instead,
/// and the report after it carries the GPUs: one report interval late, never wrong.
#[derive(Debug, Default, Clone)]
pub struct ChangeOnlyReports {
    /// The digest the last answer said the controllers hold (0: none).
    stored: u64,
    /// The digest whose GPUs the last answered report carried (0: it carried none).
    delivered: u64,
}

impl ChangeOnlyReports {
    /// Sets `report`'s digest and leaves its GPUs out when the controllers hold them or the
    /// last answered report delivered them.
    pub fn prepare(&self, report: &mut ReportRequest) {
        let digest = observed_digest(report);
        let held = if digest == self.delivered { self.delivered } else { self.stored };
        leave_out_if_held(report, digest, held);
    }

    /// A controller answered `sent` (as `prepare` left it), naming `stored`.
    pub fn answered(&mut self, sent: &ReportRequest, stored: u64) {
        self.stored = stored;
        self.delivered = if sent.gpus_unchanged { 0 } else { sent.observed_digest };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ObservedGpu, ObservedWorkload, ServiceMetrics};

    fn report() -> ReportRequest {
        ReportRequest {
            node: "n1".into(),
            applied_version: 7,
            gpus: vec![ObservedGpu {
                gpu_uuid: "GPU-1".into(),
                workloads: vec![ObservedWorkload { service: "web".into(), mps_percent: 50.0, ..Default::default() }],
                ..Default::default()
            }],
            metrics: vec![
                ServiceMetrics { service: "web".into(), endpoint: "n1:9000".into(), p99_ms: 20.0, ..Default::default() },
                ServiceMetrics { service: "ocr".into(), endpoint: "n1:9001".into(), ..Default::default() },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_digest_follows_what_the_status_shows_and_nothing_else() {
        let base = observed_digest(&report());
        // Per-window numbers, the stream's session and the node's name are not observed state.
        let mut same = report();
        same.metrics[0].p99_ms = 99.0;
        same.metrics.reverse();
        same.node = "n2".into();
        same.watch_session = 9;
        same.observed_digest = 123;
        assert_eq!(observed_digest(&same), base);
        // Each part the status shows changes it.
        let mut version = report();
        version.applied_version = 8;
        let mut share = report();
        share.gpus[0].workloads[0].mps_percent = 51.0;
        let mut endpoint = report();
        endpoint.metrics[1].endpoint = "n1:9002".into();
        let mut no_gpus = report();
        no_gpus.gpus.clear();
        for changed in [version, share, endpoint, no_gpus] {
            assert_ne!(observed_digest(&changed), base, "{changed:?}");
        }
        assert_ne!(observed_digest(&ReportRequest::default()), 0);
    }

    #[test]
    fn gpus_go_once_per_change_and_again_when_an_answer_says_they_did_not_land() {
        let mut agent = ChangeOnlyReports::default();
        let mut first = report();
        agent.prepare(&mut first);
        assert!(!first.gpus_unchanged && first.gpus.len() == 1, "nothing is stored yet");
        let digest = first.observed_digest;
        // Answered before its write committed: the answer names nothing stored.
        agent.answered(&first, 0);
        let mut second = report();
        agent.prepare(&mut second);
        assert!(second.gpus_unchanged && second.gpus.is_empty(), "delivered once: left out");
        assert_eq!(second.observed_digest, digest);
        // The write landed: answers name it, and the GPUs stay out.
        agent.answered(&second, digest);
        let mut third = report();
        agent.prepare(&mut third);
        assert!(third.gpus_unchanged);
        agent.answered(&third, digest);

        // A change goes once; when the answer to the slim report after it still names the
        // old digest (its write was lost), the next report carries the GPUs again.
        let changed = || ReportRequest { applied_version: 8, ..report() };
        let mut sent = changed();
        agent.prepare(&mut sent);
        assert!(!sent.gpus_unchanged);
        agent.answered(&sent, digest);
        let mut slim = changed();
        agent.prepare(&mut slim);
        assert!(slim.gpus_unchanged);
        agent.answered(&slim, digest);
        let mut again = changed();
        agent.prepare(&mut again);
        assert!(!again.gpus_unchanged && again.gpus.len() == 1, "an answer said the change did not land");

        // An unanswered report changes nothing: its retry is prepared alike.
        let mut retry = changed();
        agent.prepare(&mut retry);
        assert!(!retry.gpus_unchanged);
    }

    #[test]
    fn gpus_are_left_out_only_while_the_controllers_hold_the_same_digest() {
        let mut sent = report();
        leave_out_unchanged(&mut sent, 0);
        assert!(!sent.gpus_unchanged && sent.gpus.len() == 1 && sent.observed_digest == observed_digest(&report()));
        let held = sent.observed_digest;
        let mut again = report();
        leave_out_unchanged(&mut again, held);
        assert!(again.gpus_unchanged && again.gpus.is_empty());
        assert_eq!(again.observed_digest, held, "the digest of what is left out");
        let mut changed = report();
        changed.applied_version += 1;
        leave_out_unchanged(&mut changed, held);
        assert!(!changed.gpus_unchanged && changed.gpus.len() == 1);
    }
}
