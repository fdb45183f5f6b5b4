//! A leader's check of stream ends it cannot judge from reports. The end of a stream of a
//! node the leader has no report of (it took over since) may be old news: the agent may have
//! moved to another controller and reported there to the former leader. Rather than wait a
//! report interval (5 s at 10,000 hosts) for the agent to report here, the leader asks every
//! controller which of those nodes hold a stream open on it: a node that holds another one
//! has moved (its end is dropped), a node that holds none anywhere is gone (its end counts
//! from the question, and the failure detector's grace runs from there). One question per
//! batch of ends to each controller, so the cost follows the ends, not the fleet.

use std::time::Duration;

use tokio::time::Instant;

use crate::controller::Controller;
use crate::raft::NodeId;

/// How long a controller has to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// What the controllers' answers say of one end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No controller holds a stream of the node open.
    Gone,
    /// A controller holds another stream of the node open: the agent moved.
    Moved,
    /// Not every controller answered and none holds another stream: the end keeps its
    /// report-interval wait.
    Unknown,
}

/// The verdict on each of `ended` (node, session), from `answers`: per controller, the
/// streams open on it of the nodes asked about, or `None` when it did not answer.
pub fn verdicts(ended: &[(String, u64)], answers: &[Option<Vec<proto::OpenWatch>>]) -> Vec<Verdict> {
    let all_answered = answers.iter().all(Option::is_some);
    let mut open: std::collections::HashMap<&str, Vec<u64>> = std::collections::HashMap::new();
    for o in answers.iter().flatten().flatten() {
        open.entry(o.node.as_str()).or_default().push(o.session);
    }
    let moved = |node: &str, session: u64| open.get(node).is_some_and(|sessions| sessions.iter().any(|s| *s != session));
    ended
        .iter()
        .map(|(node, session)| match (moved(node, *session), all_answered) {
            (true, _) => Verdict::Moved,
            (false, true) => Verdict::Gone,
            (false, false) => Verdict::Unknown,
        })
        .collect()
}

/// Asks every controller (this one included) about `ended` and settles each end at the
/// leader's reports. Runs as a task of its own: the relay that brought the ends is answered
/// at once.
pub async fn check(controller: Controller, ended: Vec<(String, u64)>) {
    let asked_at = Instant::now();
    let nodes: Vec<String> = ended.iter().map(|(n, _)| n.clone()).collect();
    let status = controller.raft_status();
    let others = status.members.iter().filter(|(id, _)| **id != controller.id);
    let asks = others.map(|(id, addr)| ask(&controller, *id, addr, &nodes, status.matched.get(id).copied().flatten()));
    let mut answers = futures::future::join_all(asks).await;
    answers.push(Some(controller.watch_ends.open_of(&nodes)));
    if !controller.is_leader() {
        return; // Reports are the leader's: a new one keeps its own.
    }
    for ((node, session), verdict) in ended.iter().zip(verdicts(&ended, &answers)) {
        match verdict {
            Verdict::Gone => controller.reports.end_confirmed(node, *session, asked_at),
            Verdict::Moved => controller.reports.end_refuted(node, *session),
            Verdict::Unknown => {}
        }
        tracing::debug!(node, session, ?verdict, "checked an ended stream with the controllers");
    }
}

/// The streams open on controller `id` of `nodes`. A controller that does not answer and
/// has acknowledged nothing of this leader's (`matched` is `None`: it is down or cut off
/// from the leader) holds no stream that counts: the agents on it get no new desired state
/// through it. One that has but does not answer leaves the question open.
async fn ask(controller: &Controller, id: NodeId, addr: &str, nodes: &[String], matched: Option<u64>) -> Option<Vec<proto::OpenWatch>> {
    let answer = async {
        let channel = controller.channels.get(addr).map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(proto::OpenWatchesRequest { nodes: nodes.to_vec() });
        request.set_timeout(ASK_TIMEOUT);
        proto::agent_client::AgentClient::new(channel).open_watches(request).await
    };
    match tokio::time::timeout(ASK_TIMEOUT, answer).await {
        // A peer's answer is bounded by the client's 4 MiB message limit (tonic's default),
        // and holds at most one stream per node asked about: more is not looked at.
        Ok(Ok(r)) => {
            let mut open = r.into_inner().open;
            open.truncate(nodes.len());
            Some(open)
        }
        failed => {
            let why = match failed {
                Ok(Err(status)) => status.message().to_string(),
                _ => "timed out".to_string(),
            };
            tracing::debug!(controller = id, why, ?matched, "no answer about open agent streams");
            matched.is_none().then(Vec::new)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(node: &str, session: u64) -> proto::OpenWatch {
        proto::OpenWatch { node: node.into(), session }
    }

    #[test]
    fn an_end_is_gone_moved_or_unknown_by_the_controllers_answers() {
        let ended: Vec<(String, u64)> = [("dead", 1), ("moved", 2), ("same", 3)].map(|(n, s)| (n.to_string(), s)).into();
        // Every controller answered: "moved" holds another stream on one of them; the
        // stream that ended, named as open (a forged or garbled answer), refutes nothing.
        let answered = [Some(vec![open("moved", 9)]), Some(vec![open("same", 3)]), Some(vec![])];
        assert_eq!(verdicts(&ended, &answered), [Verdict::Gone, Verdict::Moved, Verdict::Gone]);
        // One did not answer: only a stream seen open settles anything.
        let one_silent = [Some(vec![open("moved", 9)]), None];
        assert_eq!(verdicts(&ended, &one_silent), [Verdict::Unknown, Verdict::Moved, Verdict::Unknown]);
        assert_eq!(verdicts(&[], &answered), []);
    }
}
