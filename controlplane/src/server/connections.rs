//! The bounds on a listener's connections (README, "Limits and the threat model"): how many
//! may be open at once, in all and per client address; how long one may take to finish its
//! TLS handshake and send a first request; how long one may sit with no request in flight.
//!
//! Written here because neither tonic nor tower has them: tonic's server accepts every
//! connection, waits for a TLS handshake and for HTTP/2 traffic without a deadline (its
//! `ServerTlsConfig::timeout` covers the TLS handshake alone, not a plaintext connection
//! nor one that then sends nothing), and on an accept error such as EMFILE retries at once,
//! in a loop that keeps a worker busy while the listener serves nobody; tower's limits
//! (`ConcurrencyLimit`, `LoadShed`) count requests, not connections or their addresses.
//!
//! [`Incoming`] accepts from the listener, closes at once what is past a cap, pauses after
//! a failed accept, and hands tonic each connection as a [`Conn`]: the socket with its
//! count, which it gives back when dropped, and its deadline, which fails its reads once
//! passed. [`RequestLayer`] counts every request, and the response body it is answered with,
//! as activity of its connection; an open stream (an agent's desired-state watch) keeps its
//! connection busy for as long as it lasts. Applied only by `start_node`: the simulation's
//! connections are its own (turmoil), and it has no clock for these deadlines.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use super::watch_slots::WatchSlots;
use crate::security::RateLimits;
use crate::telemetry::ControllerMetrics;

/// Connections the peer listener (`peer_listen`) keeps open at once: a cluster's
/// controllers open a few each.
pub const MAX_PEER_CONNECTIONS: usize = 1024;

/// How long a failed accept, or a connection refused at the cap, keeps `/readyz` at 503.
pub const UNREADY_FOR: Duration = Duration::from_secs(5);

/// At most one warning per listener this often for refused connections, and for failed
/// accepts (each is counted in its metric).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The pause after a failed accept: doubled on each failure in a row, from the first to the
/// last (as Go's `net/http` server does), so that an EMFILE costs a few wake-ups a second.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LAST_PAUSE: Duration = Duration::from_secs(1);

/// The bounds of one listener's connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub max_connections: usize,
    pub per_ip: usize,
    pub exempt_loopback: bool,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Bounds {
    /// The API's listener: `max_connections` derived from the open-file limit when unset.
    pub fn api(limits: &RateLimits) -> Self {
        Self { max_connections: limits.max_connections(open_file_limit()), ..Self::peers(limits) }
    }

    /// The peer listener: the same per-address cap and deadlines, at most
    /// [`MAX_PEER_CONNECTIONS`].
    pub fn peers(limits: &RateLimits) -> Self {
        Self {
            max_connections: MAX_PEER_CONNECTIONS,
            per_ip: limits.connections_per_ip as usize,
            exempt_loopback: limits.exempt_loopback,
            handshake_timeout: limits.handshake_timeout(),
            idle_timeout: limits.idle_timeout(),
        }
    }
}

/// This process's soft limit of open files (`None` when it cannot be read).
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur)
}

/// Where a client is counted: its IPv4 address, or its IPv6 /64 (a host is usually given a
/// whole /64, so counting single IPv6 addresses would bound nothing); `None` when it is not
/// counted (loopback, with `exempt_loopback`).
fn client_key(ip: IpAddr, exempt_loopback: bool) -> Option<IpAddr> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    if exempt_loopback && ip.is_loopback() {
        return None;
    }
    Some(match ip {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    })
}

/// The connections of one listener: their counts, their activity and what the listener saw
/// lately (for `/readyz`).
pub struct Connections {
    /// `api` or `peer`, the label of its series.
    listener: &'static str,
    bounds: Bounds,
    metrics: ControllerMetrics,
    open: Gauge,
    table: Mutex<Table>,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Table {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
    /// By (local, remote) address, what a request finds its connection by.
    live: HashMap<(SocketAddr, SocketAddr), Arc<Activity>>,
}

#[derive(Default)]
struct Health {
    /// The last failed accept and its error, while none succeeded after it.
    accept_error: Option<(Instant, String)>,
    /// The last connection refused at `max_connections`.
    refused_at_cap: Option<Instant>,
    warned_refused: Option<Instant>,
    warned_accept: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `last` is unset or at least `every` ago (and if so, marks now).
fn due(last: &mut Option<Instant>, every: Duration) -> bool {
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < every) {
        return false;
    }
    *last = Some(now);
    true
}

impl Connections {
    pub fn new(listener: &'static str, bounds: Bounds, metrics: ControllerMetrics) -> Arc<Self> {
        let open = metrics.open_connections(listener);
        Arc::new(Self { listener, bounds, metrics, open, table: Mutex::default(), health: Mutex::default() })
    }

    pub fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.table).total
    }

    /// For `/readyz`: the error of the last accept, when it failed within [`UNREADY_FOR`]
    /// and none succeeded since; and the cap, when the listener is at it or refused a
    /// connection at it within [`UNREADY_FOR`].
    pub fn unready(&self) -> (Option<String>, Option<usize>) {
        let now = Instant::now();
        let recent = |at: &Instant| now.duration_since(*at) < UNREADY_FOR;
        let health = lock(&self.health);
        let accept = health.accept_error.as_ref().filter(|(at, _)| recent(at)).map(|(_, e)| e.clone());
        let at_cap = health.refused_at_cap.as_ref().is_some_and(recent) || self.open() >= self.bounds.max_connections;
        (accept, at_cap.then_some(self.bounds.max_connections))
    }

    /// Counts a connection from `peer` to `local` in, or says which cap it is past
    /// (`per_ip` or `max_connections`, the reasons of the series).
    fn admit(self: &Arc<Self>, local: SocketAddr, peer: SocketAddr) -> Result<Slot, &'static str> {
        let key = client_key(peer.ip(), self.bounds.exempt_loopback);
        let activity = Arc::new(Activity::new(Instant::now()));
        {
            let mut t = lock(&self.table);
            if key.is_some_and(|k| t.per_client.get(&k).copied().unwrap_or(0) >= self.bounds.per_ip) {
                return Err("per_ip");
            }
            if t.total >= self.bounds.max_connections {
                return Err("max_connections");
            }
            t.total += 1;
            if let Some(k) = key {
                *t.per_client.entry(k).or_insert(0) += 1;
            }
            t.live.insert((local, peer), activity.clone());
        }
        self.open.inc();
        Ok(Slot { conns: self.clone(), key, addrs: (local, peer), activity })
    }

    fn refused(&self, peer: SocketAddr, reason: &'static str) {
        self.metrics.observe_connection_refused(self.listener, reason);
        let mut health = lock(&self.health);
        if reason == "max_connections" {
            health.refused_at_cap = Some(Instant::now());
        }
        if due(&mut health.warned_refused, WARN_EVERY) {
            let (max, per_ip) = (self.bounds.max_connections, self.bounds.per_ip);
            tracing::warn!(
                listener = self.listener,
                %peer,
                reason,
                max_connections = max,
                connections_per_ip = per_ip,
                "refusing connections past a cap of [limits] (counted in gpuplane_connections_refused_total; warned at most every 10 s)"
            );
        }
    }

    fn accepted(&self) {
        let mut health = lock(&self.health);
        health.accept_error = None;
    }

    fn accept_failed(&self, error: &io::Error) {
        self.metrics.observe_accept_error(self.listener);
        let mut health = lock(&self.health);
        health.accept_error = Some((Instant::now(), error.to_string()));
        if due(&mut health.warned_accept, WARN_EVERY) {
            tracing::warn!(
                listener = self.listener,
                %error,
                "accepting a connection failed; retrying after a pause (counted in gpuplane_accept_errors_total, /readyz answers 503 meanwhile)"
            );
        }
    }

    fn closed(&self, reason: &'static str) {
        self.metrics.observe_connection_closed(self.listener, reason);
        tracing::debug!(listener = self.listener, reason, "closed a connection at its deadline");
    }

    /// The activity of the connection a request came on, counted busy until the returned
    /// guard drops (none for a connection this listener did not accept).
    fn busy(&self, extensions: &http::Extensions) -> Option<Busy> {
        let info = extensions
            .get::<TcpConnectInfo>()
            .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().map(TlsConnectInfo::get_ref))?;
        let key = (info.local_addr()?, info.remote_addr()?);
        let activity = lock(&self.table).live.get(&key)?.clone();
        Some(Busy::start(activity))
    }
}

/// What a connection did: its deadline is computed from it.
struct Activity {
    accepted: Instant,
    requests: AtomicU64,
    in_flight: AtomicUsize,
    /// When its last request ended, in milliseconds after `accepted`.
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new(accepted: Instant) -> Self {
        Self { accepted, requests: AtomicU64::new(0), in_flight: AtomicUsize::new(0), idle_since_ms: AtomicU64::new(0) }
    }

    /// `Ok(when to look again)`, or why the connection is to be closed now.
    fn verdict(&self, now: Instant, bounds: &Bounds) -> Result<Instant, &'static str> {
        if self.requests.load(Ordering::SeqCst) == 0 {
            let due = self.accepted + bounds.handshake_timeout;
            return if now >= due { Err("handshake_timeout") } else { Ok(due) };
        }
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Ok(now + bounds.idle_timeout);
        }
        let due = self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst)) + bounds.idle_timeout;
        if now >= due {
            Err("idle")
        } else {
            Ok(due)
        }
    }
}

/// A request (and its response body) in flight on a connection.
struct Busy(Arc<Activity>);

impl Busy {
    fn start(activity: Arc<Activity>) -> Self {
        activity.requests.fetch_add(1, Ordering::SeqCst);
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(activity)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let ms = Instant::now().saturating_duration_since(self.0.accepted).as_millis() as u64;
        // The end first: a deadline that sees no request in flight sees when it ended.
        self.0.idle_since_ms.fetch_max(ms, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's place in its listener's counts, given back when dropped.
struct Slot {
    conns: Arc<Connections>,
    key: Option<IpAddr>,
    addrs: (SocketAddr, SocketAddr),
    activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut t = lock(&self.conns.table);
            t.total -= 1;
            if let Some(k) = self.key {
                if let Some(n) = t.per_client.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        t.per_client.remove(&k);
                    }
                }
            }
            if t.live.get(&self.addrs).is_some_and(|a| Arc::ptr_eq(a, &self.activity)) {
                t.live.remove(&self.addrs);
            }
        }
        self.conns.open.dec();
    }
}

/// An accepted connection: the socket, its count and its deadline. Once the deadline has
/// passed its reads fail, which closes it (a TLS handshake in progress fails; hyper ends
/// the HTTP/2 connection).
pub struct Conn {
    io: TcpStream,
    slot: Slot,
    deadline: Pin<Box<Sleep>>,
    expired: bool,
}

impl Conn {
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.expired {
            while self.deadline.as_mut().poll(cx).is_ready() {
                match self.slot.activity.verdict(Instant::now(), &self.slot.conns.bounds) {
                    Ok(next) => self.deadline.as_mut().reset(next),
                    Err(reason) => {
                        self.expired = true;
                        self.slot.conns.closed(reason);
                        break;
                    }
                }
            }
        }
        if self.expired {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "closed by the controller: past its handshake or idle deadline"));
        }
        Ok(())
    }
}

impl Connected for Conn {
    // The TCP stream's own, so that tonic finds the peer's address and certificates.
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// An accept error that concerns only the connection it would have been (gone before it
/// was accepted, or a network error Linux passes on from it): the next accept may succeed
/// at once. Anything else (EMFILE, ENFILE, ENOBUFS, ENOMEM) is the listener's.
fn gone_already(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut | HostUnreachable | NetworkUnreachable | NetworkDown
    ) || matches!(e.raw_os_error(), Some(libc::EPROTO | libc::ENOPROTOOPT | libc::EHOSTDOWN | libc::EOPNOTSUPP))
}

/// What [`Incoming`] accepts from: a `TcpListener` (a trait so that a test can fail accepts).
pub trait Accept: Send + Unpin + 'static {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>>;
}

impl Accept for TcpListener {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        TcpListener::poll_accept(self, cx)
    }
}

/// The accepted connections of a listener, within its [`Bounds`] (see the module).
pub struct Incoming<L = TcpListener> {
    listener: L,
    conns: Arc<Connections>,
    pause: Option<Pin<Box<Sleep>>>,
    last_pause: Duration,
}

impl<L: Accept> Incoming<L> {
    pub fn new(listener: L, conns: Arc<Connections>) -> Self {
        Self { listener, conns, pause: None, last_pause: Duration::ZERO }
    }

    fn conn(&self, io: TcpStream, peer: SocketAddr) -> Option<Conn> {
        // No Nagle (see `start_node`).
        let _ = io.set_nodelay(true);
        let local = io.local_addr().ok()?;
        match self.conns.admit(local, peer) {
            Ok(slot) => {
                let deadline = Box::pin(tokio::time::sleep_until(slot.activity.accepted + self.conns.bounds.handshake_timeout));
                Some(Conn { io, slot, deadline, expired: false })
            }
            Err(reason) => {
                self.conns.refused(peer, reason);
                None
            }
        }
    }
}

impl<L: Accept> tokio_stream::Stream for Incoming<L> {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = this.pause.as_mut() {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(this.listener.poll_accept(cx)) {
                Ok((io, peer)) => {
                    this.last_pause = Duration::ZERO;
                    this.conns.accepted();
                    // A connection past a cap is dropped here: closed at once.
                    if let Some(conn) = this.conn(io, peer) {
                        return Poll::Ready(Some(Ok(conn)));
                    }
                }
                Err(e) if gone_already(&e) => {}
                Err(e) => {
                    this.conns.accept_failed(&e);
                    this.last_pause = (this.last_pause * 2).clamp(FIRST_PAUSE, LAST_PAUSE);
                    this.pause = Some(Box::pin(tokio::time::sleep(this.last_pause)));
                }
            }
        }
    }
}

/// A tower layer for a listener's gRPC server: each request counts as activity of its
/// connection until its response body ends (see the module), and carries the controller's
/// [`WatchSlots`] in its extensions, for `ResourceService::watch`.
#[derive(Clone, Default)]
pub struct RequestLayer {
    conns: Option<Arc<Connections>>,
    watch_slots: Option<WatchSlots>,
}

impl RequestLayer {
    pub fn new(conns: Option<Arc<Connections>>, watch_slots: Option<WatchSlots>) -> Self {
        Self { conns, watch_slots }
    }
}

impl<S> tower::Layer<S> for RequestLayer {
    type Service = RequestService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestService { inner, layer: self.clone() }
    }
}

#[derive(Clone)]
pub struct RequestService<S> {
    inner: S,
    layer: RequestLayer,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(slots) = &self.layer.watch_slots {
            request.extensions_mut().insert(slots.clone());
        }
        let busy = self.layer.conns.as_ref().and_then(|c| c.busy(request.extensions()));
        let response = self.inner.call(request);
        Box::pin(async move { Ok(response.await?.map(|inner| Tracked { inner, _busy: busy })) })
    }
}

/// A response body that keeps its connection busy until it is dropped (sent or reset).
pub struct Tracked<B> {
    inner: B,
    _busy: Option<Busy>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(max: usize, per_ip: usize) -> Bounds {
        Bounds {
            max_connections: max,
            per_ip,
            exempt_loopback: true,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn connections_past_a_clients_cap_or_the_listeners_are_refused_and_dropped_ones_free_their_place() {
        let conns = Connections::new("api", bounds(3, 2), ControllerMetrics::default());
        let local = addr("10.0.0.1:7400");
        let a1 = conns.admit(local, addr("10.0.0.9:1000")).unwrap();
        let _a2 = conns.admit(local, addr("10.0.0.9:1001")).unwrap();
        assert_eq!(conns.admit(local, addr("10.0.0.9:1002")).err(), Some("per_ip"));
        // An IPv6 client is counted by its /64, an IPv4-mapped one as IPv4.
        let _b = conns.admit(local, addr("[2001:db8::1]:1000")).unwrap();
        assert_eq!(conns.admit(local, addr("10.0.0.8:1000")).err(), Some("max_connections"));
        drop(a1);
        assert_eq!(conns.open(), 2);
        let _a3 = conns.admit(local, addr("[::ffff:10.0.0.9]:1003")).unwrap();
        assert_eq!(conns.admit(local, addr("[::ffff:10.0.0.9]:1004")).err(), Some("per_ip"));
        assert_eq!(client_key("2001:db8:0:7::5".parse().unwrap(), true), Some("2001:db8:0:7::".parse().unwrap()));
        // Loopback is left out of the per-address cap when exempt, never out of the total.
        assert_eq!(client_key("127.0.0.2".parse().unwrap(), true), None);
        assert_eq!(client_key("::1".parse().unwrap(), false), Some("::".parse().unwrap()));
        assert_eq!(conns.unready().1, Some(3), "at the cap");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_due_at_its_handshake_deadline_until_a_request_then_while_idle() {
        let b = bounds(10, 10);
        let start = Instant::now();
        let a = Arc::new(Activity::new(start));
        assert_eq!(a.verdict(start, &b), Ok(start + b.handshake_timeout));
        assert_eq!(a.verdict(start + b.handshake_timeout, &b), Err("handshake_timeout"));
        let busy = Busy::start(a.clone());
        let later = start + Duration::from_secs(3600);
        assert_eq!(a.verdict(later, &b), Ok(later + b.idle_timeout), "an open stream keeps it");
        tokio::time::advance(Duration::from_secs(20)).await;
        drop(busy);
        let ended = start + Duration::from_secs(20);
        assert_eq!(a.verdict(ended, &b), Ok(ended + b.idle_timeout));
        assert_eq!(a.verdict(ended + b.idle_timeout, &b), Err("idle"));
    }

    /// A listener whose first accepts fail as out of open files.
    struct OutOfFiles {
        listener: TcpListener,
        failures: usize,
    }

    impl Accept for OutOfFiles {
        fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
            if self.failures > 0 {
                self.failures -= 1;
                return Poll::Ready(Err(io::Error::from_raw_os_error(libc::EMFILE)));
            }
            self.listener.poll_accept(cx)
        }
    }

    #[tokio::test]
    async fn after_a_failed_accept_the_listener_pauses_is_unready_and_serves_again_once_an_accept_succeeds() {
        use tokio_stream::StreamExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let metrics = ControllerMetrics::default();
        let conns = Connections::new("api", bounds(10, 10), metrics.clone());
        let mut incoming = Incoming::new(OutOfFiles { listener, failures: 3 }, conns.clone());
        let _client = TcpStream::connect(at).await.unwrap();
        // The first failure pauses the listener (no loop of failures): nothing yet.
        assert!(futures::FutureExt::now_or_never(incoming.next()).is_none());
        assert!(conns.unready().0.unwrap().contains("os error 24"), "unready while accepts fail");
        let conn = tokio::time::timeout(Duration::from_secs(30), incoming.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(conns.unready(), (None, None), "ready again once a connection is accepted");
        assert!(metrics.render(&Default::default()).contains("gpuplane_accept_errors_total{listener=\"api\"} 3"));
        assert_eq!(conns.open(), 1);
        drop(conn);
        assert_eq!(conns.open(), 0, "a dropped connection gives its place back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_accept_makes_the_listener_unready_until_one_succeeds() {
        let conns = Connections::new("api", bounds(10, 10), ControllerMetrics::default());
        assert_eq!(conns.unready(), (None, None));
        conns.accept_failed(&io::Error::from_raw_os_error(libc::EMFILE));
        let (error, _) = conns.unready();
        assert!(error.unwrap().contains("os error 24"));
        conns.accepted();
        assert_eq!(conns.unready(), (None, None));
        conns.accept_failed(&io::Error::from_raw_os_error(libc::EMFILE));
        tokio::time::advance(UNREADY_FOR).await;
        assert_eq!(conns.unready(), (None, None), "a failure long ago with nothing to accept since");
        assert!(!gone_already(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(gone_already(&io::Error::from(io::ErrorKind::ConnectionAborted)));
    }
}
