//! The AppendEntries stream to one peer.
//!
//! openraft 0.10 hands each follower's AppendEntries to the network as a stream of requests.
//! Its default (and `openraft_legacy`'s adapter) sends them one unary call at a time, and
//! each call went out as three HTTP/2 writes (headers, the message, an empty end-of-stream
//! frame), each a system call and a wake-up of the follower: 6 of the leader's 7 `writev`s
//! per write at one client (`strace`). Here they travel on one gRPC stream per follower
//! (`RaftService::append_entries_stream`), one frame per request, and a request no longer
//! waits for the answer to the one before it. A peer that lacks the stream (an older
//! controller) gets unary calls, as before.
//!
//! A request that carries only a new commit index waits a moment for the next request,
//! which carries that commit too, and is dropped if one comes. openraft sends every
//! follower such a request after each commit: with one client that was two more requests
//! and answers per write to encode, carry and decode, on a 2-core machine the three
//! controllers share. The commit still reaches an idle follower: after
//! [`COMMIT_ONLY_GRACE`], or with the next heartbeat, which carries it as well.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{stream_append_sequential, Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, TransferLeaderRequest, TransferLeaderResponse,
    VoteRequest, VoteResponse,
};
use openraft_legacy::network_v1::Adapter;
use proto::RaftPayload;

use super::network::{status_error, PeerClient};
use super::types::*;

/// How long an entry-less request waits for the next one. A client that writes again as soon
/// as it is answered does so within a millisecond on a LAN; the commit index of an idle
/// leader reaches its followers this much later, which delays only what they apply.
pub const COMMIT_ONLY_GRACE: Duration = Duration::from_millis(5);

type Request = AppendEntriesRequest<TypeConfig>;

/// `input` in order, except that an entry-less request is held for up to `grace` and dropped
/// when another request comes within it. Sound because a later request of the stream
/// carries a commit index at least as high, from the same leader, and its range starts where
/// the dropped one's did (openraft generates the next request from what was sent, and nothing
/// follows a probe, its other kind of entry-less request, in the same stream). openraft
/// counts a dropped request as acknowledged with the one that replaced it (the inflight
/// queue drains every request up to the acknowledged log id), and takes the replacement's
/// later sending time for its lease.
pub fn drop_superseded_commits<S>(input: S, grace: Duration) -> impl Stream<Item = Request> + Send + Unpin + 'static
where
    S: Stream<Item = Request> + Send + Unpin + 'static,
{
    // openraft's request stream must not be polled once it has ended.
    let input = input.fuse();
    Box::pin(futures::stream::unfold(input, move |mut input| async move {
        let mut held = input.next().await?;
        if !held.entries.is_empty() {
            return Some((held, input));
        }
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Dropping `next()` at the deadline keeps the stream's pending request: it is
            // the stream's own state, polled again on the next call.
            match tokio::time::timeout_at(deadline, input.next()).await {
                Ok(Some(next)) if next.entries.is_empty() => held = next,
                Ok(Some(next)) => return Some((next, input)),
                Ok(None) | Err(_) => return Some((held, input)),
            }
        }
    }))
}

/// A peer's network: openraft 0.9's protocol through `openraft_legacy`'s adapter
/// (`network.rs` says why) for votes, heartbeats and snapshots; AppendEntries streamed.
pub struct PeerNetwork {
    adapter: Adapter<TypeConfig, PeerClient, SnapshotData>,
    /// The peer has no AppendEntries stream (it answered UNIMPLEMENTED): unary calls.
    unary_only: bool,
}

impl PeerNetwork {
    pub fn new(adapter: Adapter<TypeConfig, PeerClient, SnapshotData>) -> Self {
        Self { adapter, unary_only: false }
    }
}

/// The log ids a request covers, `(prev, last]`: what its answer acknowledges.
type Range = (Option<LogId>, Option<LogId>);

/// The requests sent on a stream and not answered yet, oldest first, with when each was
/// sent: answers come in the same order. Bounded by HTTP/2's flow control: hyper takes the
/// next request from the stream only while the follower's window has room for it.
#[derive(Default)]
struct Unanswered {
    sent: std::sync::Mutex<VecDeque<(Range, tokio::time::Instant)>>,
    /// Told when a request is sent (one stored permit: a send between a look at `sent` and
    /// the wait is not missed).
    more: tokio::sync::Notify,
}

impl Unanswered {
    fn push(&self, range: Range) {
        self.sent.lock().expect("unanswered lock").push_back((range, tokio::time::Instant::now()));
        self.more.notify_one();
    }

    fn oldest_sent_at(&self) -> Option<tokio::time::Instant> {
        self.sent.lock().expect("unanswered lock").front().map(|(_, at)| *at)
    }

    fn pop(&self) -> Option<Range> {
        self.sent.lock().expect("unanswered lock").pop_front().map(|(range, _)| range)
    }
}

fn range_of(request: &Request) -> Range {
    let last = request.entries.last().map(|e| e.log_id).or(request.prev_log_id);
    (request.prev_log_id, last)
}

/// `requests` as the stream's messages (JSON, as the unary call's), each noted in
/// `unanswered` as it goes. A request that cannot be encoded ends the stream (openraft then
/// starts another).
fn encode_requests(
    requests: impl Stream<Item = Request> + Send + 'static,
    unanswered: Arc<Unanswered>,
    peer: String,
) -> impl Stream<Item = RaftPayload> + Send + 'static {
    requests.scan(unanswered, move |unanswered, request| {
        let payload = match serde_json::to_vec(&request) {
            Ok(data) => {
                unanswered.push(range_of(&request));
                Some(RaftPayload { data, ..Default::default() })
            }
            Err(e) => {
                tracing::error!(%peer, "encoding an AppendEntries request: {e}");
                None
            }
        };
        futures::future::ready(payload)
    })
}

type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// What the answers of `peer`'s stream say, in openraft's terms (a failed stream as a failed
/// unary call says it: `network::status_error`). Each answer must come within `ttl` of
/// its request being sent or of the answer before it, whichever is later: the follower
/// handles one request at a time, so a request sent behind others waits for them there, and
/// a unary AppendEntries, sent only after the answer before it, has `ttl` for itself. The
/// stream ends after the first error, and after an answer that took only part of its
/// request's entries (openraft then starts another stream from there, as its sequential
/// sender does).
fn read_answers(
    answers: impl Stream<Item = Result<RaftPayload, tonic::Status>> + Send + Unpin + 'static,
    unanswered: Arc<Unanswered>,
    ttl: Duration,
    peer: String,
) -> impl Stream<Item = Answer> + Send + 'static {
    let reading = Reading { answers, unanswered, ttl, peer, last_answer_at: tokio::time::Instant::now() };
    futures::stream::unfold(Some(reading), |reading| async move {
        let mut reading = reading?;
        match reading.next().await {
            Ok(Some((answer, go_on))) => Some((Ok(answer), go_on.then_some(reading))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// [`read_answers`]' state between answers.
struct Reading<A> {
    answers: A,
    unanswered: Arc<Unanswered>,
    ttl: Duration,
    /// The peer, as errors name it.
    peer: String,
    /// When the last answer came (the stream's start before the first).
    last_answer_at: tokio::time::Instant,
}

impl<A> Reading<A>
where
    A: Stream<Item = Result<RaftPayload, tonic::Status>> + Unpin,
{
    fn network_error(&self, what: &str) -> RPCError<TypeConfig> {
        RPCError::Network(NetworkError::new(&std::io::Error::other(format!("{}: {what}", self.peer))))
    }

    /// The next answer, and whether the stream goes on after it; `None` when the peer ended
    /// the stream with every request answered. An error ends it.
    async fn next(&mut self) -> Result<Option<(StreamAppendResult<TypeConfig>, bool)>, RPCError<TypeConfig>> {
        let message = loop {
            match self.unanswered.oldest_sent_at() {
                Some(sent_at) => match tokio::time::timeout_at(sent_at.max(self.last_answer_at) + self.ttl, self.answers.next()).await {
                    Ok(message) => break message,
                    Err(_) => return Err(self.network_error(&format!("no AppendEntries answer within {:?}", self.ttl))),
                },
                // Nothing to answer: wait for a request (or the stream's end or error).
                None => tokio::select! {
                    message = self.answers.next() => break message,
                    _ = self.unanswered.more.notified() => {}
                },
            }
        };
        let payload = match message {
            Some(Ok(payload)) => payload,
            Some(Err(status)) => return Err(status_error(&self.peer, &status)),
            None if self.unanswered.oldest_sent_at().is_some() => {
                return Err(self.network_error("the AppendEntries stream ended unanswered"))
            }
            None => return Ok(None),
        };
        self.last_answer_at = tokio::time::Instant::now();
        let (prev, last) = self.unanswered.pop().ok_or_else(|| self.network_error("an AppendEntries answer to no request"))?;
        let answer: Result<AppendEntriesResponse<TypeConfig>, RaftError> =
            serde_json::from_slice(&payload.data).map_err(|e| self.network_error(&format!("a malformed AppendEntries answer: {e}")))?;
        match answer {
            Ok(response) => {
                let whole = response.is_success();
                let result = response.into_stream_result(prev, last);
                let go_on = result.is_ok() && whole;
                Ok(Some((result, go_on)))
            }
            // The peer's Raft has stopped: as the unary call says it.
            Err(RaftError::Fatal(fatal)) => Err(RPCError::Unreachable(Unreachable::new(&fatal))),
            Err(RaftError::APIError(never)) => match never {},
        }
    }
}

impl RaftNetworkV2<TypeConfig> for PeerNetwork {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.append_entries(rpc, option).await
    }

    fn stream_append<'s, S>(&'s mut self, input: S, option: RPCOption) -> BoxFuture<'s, Result<BoxStream<'s, Answer>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = Request> + Send + Unpin + 'static,
    {
        let input = drop_superseded_commits(input, COMMIT_ONLY_GRACE);
        if self.unary_only {
            return stream_append_sequential(&mut self.adapter, input, option);
        }
        Box::pin(async move {
            // The first request before the call: taking a request is where openraft waits
            // out its backoff after errors. A call opened first failed at once against an
            // unreachable peer, and openraft opened the next one at once: in the simulation
            // a partitioned controller ran out of ports connecting.
            let mut input = input;
            let Some(first) = input.next().await else {
                let nothing: BoxStream<'s, Answer> = Box::pin(futures::stream::empty());
                return Ok(nothing);
            };
            let input = futures::stream::once(futures::future::ready(first)).chain(input);
            let peer = self.adapter.inner();
            let name = peer.name();
            let unanswered = Arc::new(Unanswered::default());
            let requests = encode_requests(input, unanswered.clone(), name.clone());
            match peer.open_append_stream(requests).await {
                Ok(answers) => {
                    let answers: BoxStream<'s, Answer> = Box::pin(read_answers(answers, unanswered, option.hard_ttl(), name));
                    Ok(answers)
                }
                Err(status) => {
                    if status.code() == tonic::Code::Unimplemented {
                        tracing::warn!(peer = %name, "the peer has no AppendEntries stream (an older controller): sending it unary AppendEntries");
                        self.unary_only = true;
                    }
                    Err(status_error(&name, &status))
                }
            }
        })
    }

    async fn vote(&mut self, rpc: VoteRequest<TypeConfig>, option: RPCOption) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.vote(rpc, option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.pre_vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.adapter.full_snapshot(vote, snapshot, cancel, option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.transfer_leader(req, option).await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.adapter.backoff()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::network::RaftNetworkFactory;
    use proto::raft_service_server::{RaftService, RaftServiceServer};

    fn request(prev: u64, entries: u64, commit: u64) -> Request {
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(2, prev)),
            entries: (prev + 1..=prev + entries).map(|i| Entry { log_id: log_id(2, i), payload: EntryPayload::Blank }).collect(),
            leader_commit: Some(log_id(2, commit)),
        }
    }

    /// What the stream yields, with the (paused) clock's time of each, for requests given at
    /// the times listed.
    async fn sent(schedule: Vec<(u64, Request)>) -> Vec<(u64, u64, usize, u64)> {
        let start = tokio::time::Instant::now();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        tokio::spawn(async move {
            for (at_ms, req) in schedule {
                tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
                tx.unbounded_send(req).unwrap();
            }
            // The stream stays open a while after its last request, as openraft's does.
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        drop_superseded_commits(rx, COMMIT_ONLY_GRACE)
            .map(|r| {
                let at = (tokio::time::Instant::now() - start).as_millis() as u64;
                (at, r.prev_log_id.unwrap().index, r.entries.len(), r.leader_commit.unwrap().index)
            })
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_followed_within_the_grace_is_dropped_and_entries_never_wait() {
        let grace = COMMIT_ONLY_GRACE.as_millis() as u64;
        let got = sent(vec![
            // Entries go at once.
            (0, request(10, 1, 10)),
            // Their commit, then the next write's entries 1 ms later: only the entries go,
            // at once, carrying the commit.
            (1, request(11, 0, 11)),
            (2, request(11, 1, 11)),
            // A commit, then a later commit within the grace: the later one goes, when the
            // grace from the first ends.
            (3, request(12, 0, 11)),
            (4, request(12, 0, 12)),
            // A commit with nothing after it goes when its grace ends.
            (20, request(12, 0, 12)),
        ])
        .await;
        assert_eq!(got, vec![(0, 10, 1, 10), (2, 11, 1, 11), (3 + grace, 12, 0, 12), (20 + grace, 12, 0, 12)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_commit_goes_at_once_when_the_stream_ends() {
        // A probe (openraft's other entry-less request) is the last of its stream: it goes
        // without waiting.
        let (tx, rx) = futures::channel::mpsc::unbounded();
        tx.unbounded_send(request(7, 0, 3)).unwrap();
        drop(tx);
        let start = tokio::time::Instant::now();
        let got: Vec<_> = drop_superseded_commits(rx, COMMIT_ONLY_GRACE).collect().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(format!("{got:?}"), format!("{:?}", [request(7, 0, 3)]));
    }

    fn answer(response: AppendEntriesResponse<TypeConfig>) -> Result<RaftPayload, tonic::Status> {
        let answer: Result<_, RaftError> = Ok(response);
        Ok(RaftPayload { data: serde_json::to_vec(&answer).unwrap(), ..Default::default() })
    }

    /// `read_answers` over answers fed by the test, with requests noted as sent by it.
    fn reader(
        ttl: Duration,
    ) -> (Arc<Unanswered>, futures::channel::mpsc::UnboundedSender<Result<RaftPayload, tonic::Status>>, BoxStream<'static, Answer>) {
        let unanswered = Arc::new(Unanswered::default());
        let (tx, rx) = futures::channel::mpsc::unbounded();
        (unanswered.clone(), tx, Box::pin(read_answers(rx, unanswered, ttl, "peer 2".into())))
    }

    #[tokio::test(start_paused = true)]
    async fn answers_acknowledge_their_requests_in_order_and_a_partial_one_ends_the_stream() {
        let (unanswered, tx, mut answers) = reader(Duration::from_millis(100));
        unanswered.push(range_of(&request(10, 2, 10)));
        unanswered.push(range_of(&request(12, 0, 12)));
        unanswered.push(range_of(&request(12, 3, 12)));
        tx.unbounded_send(answer(AppendEntriesResponse::Success)).unwrap();
        tx.unbounded_send(answer(AppendEntriesResponse::Success)).unwrap();
        tx.unbounded_send(answer(AppendEntriesResponse::PartialSuccess(Some(log_id(2, 13))))).unwrap();
        tx.unbounded_send(answer(AppendEntriesResponse::Success)).unwrap();
        let got: Vec<_> = (&mut answers).map(|a| a.unwrap()).collect().await;
        assert_eq!(got, [Ok(Some(log_id(2, 12))), Ok(Some(log_id(2, 12))), Ok(Some(log_id(2, 13)))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_ends_the_stream_naming_the_requests_start() {
        let (unanswered, tx, answers) = reader(Duration::from_millis(100));
        unanswered.push(range_of(&request(10, 2, 10)));
        tx.unbounded_send(answer(AppendEntriesResponse::Conflict)).unwrap();
        tx.unbounded_send(answer(AppendEntriesResponse::Success)).unwrap();
        let got: Vec<_> = answers.map(|a| a.unwrap()).collect().await;
        assert_eq!(got, [Err(openraft::raft::StreamAppendError::Conflict(log_id(2, 10)))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_stream_is_the_error_a_unary_call_would_be() {
        let (unanswered, tx, answers) = reader(Duration::from_millis(100));
        unanswered.push(range_of(&request(10, 1, 10)));
        tx.unbounded_send(Err(tonic::Status::unavailable("connection reset"))).unwrap();
        let got: Vec<_> = answers.collect().await;
        // Unreachable: openraft waits before it tries again, as after a failed unary call.
        assert!(matches!(got[..], [Err(RPCError::Unreachable(_))]), "{got:?}");
        assert!(format!("{got:?}").contains("peer 2: connection reset"), "{got:?}");

        // A stream the peer ends with a request unanswered is an error; with none, its end.
        let (unanswered, tx, answers) = reader(Duration::from_millis(100));
        unanswered.push(range_of(&request(10, 1, 10)));
        drop(tx);
        let got: Vec<_> = answers.collect().await;
        assert!(matches!(got[..], [Err(RPCError::Network(_))]) && format!("{got:?}").contains("ended unanswered"), "{got:?}");
        let (_, tx, answers) = reader(Duration::from_millis(100));
        drop(tx);
        assert!(answers.collect::<Vec<_>>().await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_sent_together_each_have_the_time_to_live_from_the_answer_before() {
        let ttl = Duration::from_millis(100);
        let (unanswered, tx, answers) = reader(ttl);
        for prev in [10, 11, 12] {
            unanswered.push(range_of(&request(prev, 1, 10)));
        }
        // The follower takes 80 ms for each, one after another: the third answer comes 240 ms
        // after it was sent, 80 ms after the second answer.
        tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(80)).await;
                tx.unbounded_send(answer(AppendEntriesResponse::Success)).unwrap();
            }
        });
        let got: Vec<_> = answers.take(3).map(|a| a.unwrap().unwrap()).collect().await;
        assert_eq!(got, [Some(log_id(2, 11)), Some(log_id(2, 12)), Some(log_id(2, 13))]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_later_than_its_time_to_live_is_an_error_and_an_idle_stream_waits() {
        let ttl = Duration::from_millis(100);
        let (unanswered, _tx, mut answers) = reader(ttl);
        // Nothing sent: no time limit.
        let idle = tokio::time::timeout(Duration::from_secs(60), answers.next()).await;
        assert!(idle.is_err(), "an idle stream ended or failed: {:?}", idle.map(|a| a.map(|a| a.is_ok())));
        let start = tokio::time::Instant::now();
        unanswered.push(range_of(&request(10, 1, 10)));
        let late = answers.next().await.expect("an error").unwrap_err();
        assert_eq!(start.elapsed(), ttl);
        assert!(matches!(late, RPCError::Network(_)) && late.to_string().contains("no AppendEntries answer within"), "{late}");
        assert!(answers.next().await.is_none(), "the stream ends after the error");
    }

    /// A peer that answers every AppendEntries with success, on the stream if it has it.
    struct Follower {
        has_stream: bool,
        unary_calls: Arc<std::sync::atomic::AtomicUsize>,
        streams_opened: Arc<std::sync::atomic::AtomicUsize>,
    }

    #[tonic::async_trait]
    impl RaftService for Follower {
        async fn append_entries(&self, _: tonic::Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            self.unary_calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            answer(AppendEntriesResponse::Success).map(tonic::Response::new)
        }

        type AppendEntriesStreamStream = BoxStream<'static, Result<RaftPayload, tonic::Status>>;

        async fn append_entries_stream(
            &self,
            requests: tonic::Request<tonic::Streaming<RaftPayload>>,
        ) -> Result<tonic::Response<Self::AppendEntriesStreamStream>, tonic::Status> {
            self.streams_opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if !self.has_stream {
                return Err(tonic::Status::unimplemented("no such method"));
            }
            Ok(tonic::Response::new(requests.into_inner().map(|r| r.and_then(|_| answer(AppendEntriesResponse::Success))).boxed()))
        }

        async fn vote(&self, _: tonic::Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }

        async fn install_snapshot(&self, _: tonic::Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }

        /// A follower that has not flushed the leader's last entry: it says so, as
        /// `Raft::handle_transfer_leader` does.
        async fn transfer_leader(&self, request: tonic::Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            let req: TransferLeaderRequest<TypeConfig> = serde_json::from_slice(&request.into_inner().data).unwrap();
            let not_flushed: TransferLeaderResponse<TypeConfig> =
                Err(openraft::raft::TransferLeaderError::LogNotFlushed { expected: req.last_log_id().cloned(), actual: None });
            let answer: Result<_, openraft::error::Fatal<TypeConfig>> = Ok(not_flushed);
            Ok(tonic::Response::new(RaftPayload { data: serde_json::to_vec(&answer).unwrap(), ..Default::default() }))
        }
    }

    /// The acknowledgements of one `stream_append` of `requests` to `network`.
    async fn stream(network: &mut PeerNetwork, requests: Vec<Request>) -> Result<Vec<Option<LogId>>, String> {
        let option = RPCOption::new(Duration::from_secs(10));
        let answers = network.stream_append(futures::stream::iter(requests), option).await.map_err(|e| e.to_string())?;
        Ok(answers.map(|a| a.unwrap().unwrap()).collect().await)
    }

    /// Serves `follower` on a local port; a network to it, as a leader's.
    async fn network_to(follower: Follower) -> PeerNetwork {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(RaftServiceServer::new(follower)).serve_with_incoming(incoming));
        let mut factory = super::super::Network::new(super::super::PeerChannels::with_tls(None), Default::default());
        factory.new_client(2, &Node::new(addr.to_string())).await
    }

    fn counter() -> Arc<std::sync::atomic::AtomicUsize> {
        Arc::new(std::sync::atomic::AtomicUsize::new(0))
    }

    fn count(counter: &Arc<std::sync::atomic::AtomicUsize>) -> usize {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn append_entries_travel_on_one_stream_and_an_older_peer_gets_unary_calls() {
        let requests = || vec![request(10, 1, 10), request(11, 2, 11)];
        let acknowledged = Ok(vec![Some(log_id(2, 11)), Some(log_id(2, 13))]);

        let (unary_calls, streams_opened) = (counter(), counter());
        let follower = Follower { has_stream: true, unary_calls: unary_calls.clone(), streams_opened: streams_opened.clone() };
        let mut network = network_to(follower).await;
        assert_eq!(stream(&mut network, requests()).await, acknowledged);
        assert_eq!((count(&unary_calls), count(&streams_opened)), (0, 1), "all on one stream");

        let (unary_calls, streams_opened) = (counter(), counter());
        let follower = Follower { has_stream: false, unary_calls: unary_calls.clone(), streams_opened: streams_opened.clone() };
        let mut network = network_to(follower).await;
        // The first stream fails (openraft starts another), and the next go as unary calls.
        let refused = stream(&mut network, requests()).await.unwrap_err();
        assert!(refused.contains("no such method"), "{refused}");
        assert_eq!(stream(&mut network, requests()).await, acknowledged);
        assert_eq!((count(&unary_calls), count(&streams_opened)), (2, 1));
    }

    /// A call is opened only once openraft has given a request: taking one is where it
    /// waits out its backoff after errors, so a call opened before failed again at once
    /// against a peer that was down, in a loop (the simulation's partitioned controller ran
    /// out of ports connecting).
    #[tokio::test]
    async fn no_call_is_opened_before_a_request_is_taken() {
        let (unary_calls, streams_opened) = (counter(), counter());
        let mut network = network_to(Follower { has_stream: true, unary_calls, streams_opened: streams_opened.clone() }).await;
        assert_eq!(stream(&mut network, Vec::new()).await, Ok(Vec::new()));
        assert_eq!(count(&streams_opened), 0);
    }

    /// The leader's transfer request reaches the peer whole and the peer's answer comes back
    /// as it was given (the cluster test `membership_add_promote_remove_and_leader_transfer`
    /// runs a real transfer).
    #[tokio::test]
    async fn a_transfer_request_and_its_answer_cross_the_wire_unchanged() {
        let (unary_calls, streams_opened) = (counter(), counter());
        let mut network = network_to(Follower { has_stream: true, unary_calls, streams_opened }).await;
        let req = TransferLeaderRequest::new(Vote::new_committed(2, 1), 2, Some(log_id(2, 40)));
        let answer = network.transfer_leader(req, RPCOption::new(Duration::from_secs(5))).await.unwrap();
        let expected = openraft::raft::TransferLeaderError::LogNotFlushed { expected: Some(log_id(2, 40)), actual: None };
        assert_eq!(answer, Err(expected));
    }
}
