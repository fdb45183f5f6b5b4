//! The router: one local endpoint per service speaking the Open Inference Protocol
//! (KServe v2), forwarding each request to a backend of the active set.
//!
//! The active set is one `ArcSwap` pointer: a switch is a single store, and a request sees
//! either the old set or the new one, never a mix. Requests already sent to a backend that
//! leaves the set complete there; [`Backend::drained`] tells when the last one has.

use super::admission::{Admission, Callers, IN_FLIGHT_BATCHES_PER_BACKEND};
use super::backend::Backend;
use super::window::{Window, WindowStats};
use crate::inflight::InFlightGuard;
use arc_swap::ArcSwap;
use planner::policy::elsa::{schedule, ElsaConfig, Query, ServiceTimeModel};
use proto::oip::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::oip::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse, ModelReadyRequest, ModelReadyResponse,
    ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
};
use proto::open_inference;
use std::future::Future;
use std::sync::atomic::{fence, AtomicU64, Ordering, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

/// Static settings of one service's router.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// The service this endpoint serves: the model name its requests give; requests naming
    /// another get NOT_FOUND.
    pub service: String,
    /// Latency target, ms: ELSA's `SLA_target`.
    pub slo_ms: f64,
    pub elsa: ElsaConfig,
    /// Measurement window, ms (1000: per second).
    pub window_ms: u64,
    /// The least time a backend is given to answer one request before it counts as failed
    /// under it (the request is then sent to another): a server that hangs holds a request
    /// for this long, never for ever. The deadline is [`BACKEND_DEADLINE_SLOS`] SLOs when
    /// that is longer, and at most [`MAX_BACKEND_DEADLINE`].
    pub backend_deadline_floor: Duration,
}

/// A backend's deadline for one request, in SLOs: far past any answer worth having, so a
/// slow backend is not mistaken for a hung one.
pub const BACKEND_DEADLINE_SLOS: f64 = 20.0;
/// The default [`RouterConfig::backend_deadline_floor`].
pub const BACKEND_DEADLINE_FLOOR: Duration = Duration::from_secs(10);
/// The longest a backend is given for one request, whatever the SLO.
pub const MAX_BACKEND_DEADLINE: Duration = Duration::from_secs(120);

impl RouterConfig {
    /// The endpoint of `service` with its SLO and the defaults: one-second windows, ELSA's
    /// default settings, [`BACKEND_DEADLINE_FLOOR`].
    pub fn new(service: &str, slo_ms: f64) -> Self {
        RouterConfig {
            service: service.into(),
            slo_ms,
            elsa: ElsaConfig::default(),
            window_ms: 1000,
            backend_deadline_floor: BACKEND_DEADLINE_FLOOR,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("backend `{0}` is not in the active set")]
    NotActive(String),
    #[error("window histogram: {0}")]
    Histogram(#[from] hdrhistogram::CreationError),
    #[error("router gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The backends requests go to now.
#[derive(Debug, Default)]
pub struct ActiveSet {
    backends: Vec<Arc<Backend>>,
}

impl ActiveSet {
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    pub fn contains(&self, backend: &Arc<Backend>) -> bool {
        self.backends.iter().any(|b| Arc::ptr_eq(b, backend))
    }

    pub fn ids(&self) -> Vec<&str> {
        self.backends.iter().map(|b| b.id()).collect()
    }
}

/// What a switch did.
#[derive(Debug)]
pub struct Swap {
    pub previous: Arc<ActiveSet>,
    pub current: Arc<ActiveSet>,
    /// Time of the pointer store itself.
    pub store_time: Duration,
}

impl Swap {
    /// Backends that were active and no longer are: drain, then stop them.
    pub fn retired(&self) -> Vec<Arc<Backend>> {
        self.previous.backends.iter().filter(|b| !self.current.contains(b)).cloned().collect()
    }
}

/// Rounds of "pick, count, re-check" before a request gives up on a set that keeps changing.
const MAX_DISPATCH_ATTEMPTS: usize = 1000;
/// Backends a request may fail on before its caller gets the failure.
const MAX_RESENDS: usize = 2;
/// How long a request that failed on every active backend waits for another to become
/// active (a shadow's switch after its active process died), and how often it looks.
const RESEND_WAIT: Duration = Duration::from_secs(2);
const RESEND_POLL: Duration = Duration::from_millis(20);

/// Failures of a backend rather than of the request: sent again elsewhere. A refusal of
/// the request itself (INVALID_ARGUMENT, NOT_FOUND, ...) would be refused anywhere.
/// DEADLINE_EXCEEDED is the router's own deadline on a backend (a client's deadline ends
/// the whole call instead); INTERNAL is resent only when the transport raised it (a
/// backend that answered garbage), never a server's own INTERNAL answer.
fn resendable(status: &Status) -> bool {
    use tonic::Code;
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
        Code::Internal => std::error::Error::source(status).is_some(),
        _ => false,
    }
}

struct Inner {
    config: RouterConfig,
    model: Arc<dyn ServiceTimeModel + Send + Sync>,
    active: ArcSwap<ActiveSet>,
    /// Serialises writers so each `Swap::previous` is exactly what it replaced.
    switching: Mutex<()>,
    epoch: Instant,
    window: Mutex<Window>,
    windows: broadcast::Sender<WindowStats>,
    /// Who may call (the Service's `inference_tokens`), replaced when the desired state
    /// changes it.
    callers: ArcSwap<Callers>,
    admission: Arc<Admission>,
    /// The SLO ELSA routes for, ms (f64 bits): the Service's, which may change while the
    /// router runs.
    slo_ms: AtomicU64,
    counts: Arc<RouterCounters>,
}

/// What a router counts for operators, since it started.
#[derive(Debug, Default)]
pub struct RouterCounters {
    /// Requests sent again to another backend after one failed under them.
    pub resends: AtomicU64,
    /// Connections closed as they were accepted, the endpoint being full.
    pub connections_refused: Arc<AtomicU64>,
}

/// A router's counters read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouterCounts {
    pub resends: u64,
    pub connections_refused: u64,
}

/// One service's router; clones share state.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

/// A request sent to a backend: counted in flight and in its queue until dropped.
struct Dispatched {
    backend: Arc<Backend>,
    ticket: u64,
    epoch: Instant,
    _in_flight: InFlightGuard,
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        let now_ms = self.epoch.elapsed().as_secs_f64() * 1000.0;
        self.backend.queue().answered(self.ticket, now_ms);
    }
}

impl Router {
    /// `model` prices batches on partitions for ELSA (used only with several backends).
    pub fn new(
        config: RouterConfig,
        model: Arc<dyn ServiceTimeModel + Send + Sync>,
        backends: Vec<Arc<Backend>>,
    ) -> Result<Self, RouterError> {
        let window = Window::new(config.window_ms)?;
        let (windows, _) = broadcast::channel(256);
        let slo_ms = AtomicU64::new(config.slo_ms.to_bits());
        Ok(Router {
            inner: Arc::new(Inner {
                slo_ms,
                config,
                model,
                active: ArcSwap::from_pointee(ActiveSet { backends }),
                switching: Mutex::new(()),
                epoch: Instant::now(),
                window: Mutex::new(window),
                windows,
                callers: ArcSwap::from_pointee(Callers::default()),
                admission: Arc::default(),
                counts: Arc::default(),
            }),
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.inner.config
    }

    /// The SLO requests are routed for now, ms.
    pub fn slo_ms(&self) -> f64 {
        f64::from_bits(self.inner.slo_ms.load(Ordering::Relaxed))
    }

    /// The Service's SLO changed.
    pub fn set_slo_ms(&self, slo_ms: f64) {
        self.inner.slo_ms.store(slo_ms.to_bits(), Ordering::Relaxed);
    }

    pub fn active(&self) -> Arc<ActiveSet> {
        self.inner.active.load_full()
    }

    /// How long a backend may take to answer one request now.
    fn backend_deadline(&self) -> Duration {
        let slos = Duration::try_from_secs_f64(self.slo_ms() * BACKEND_DEADLINE_SLOS / 1000.0).unwrap_or(MAX_BACKEND_DEADLINE);
        slos.max(self.inner.config.backend_deadline_floor).min(MAX_BACKEND_DEADLINE)
    }

    /// Who may call this endpoint from now on (requests in flight are not re-checked).
    pub fn set_callers(&self, callers: Callers) {
        if **self.inner.callers.load() != callers {
            self.inner.callers.store(Arc::new(callers));
        }
    }

    /// Its counters now.
    pub fn counts(&self) -> RouterCounts {
        let c = &self.inner.counts;
        RouterCounts { resends: c.resends.load(Ordering::Relaxed), connections_refused: c.connections_refused.load(Ordering::Relaxed) }
    }

    /// Requests in flight through the router now.
    pub fn in_flight(&self) -> u32 {
        self.inner.admission.in_flight()
    }

    /// Requests the router holds in flight at most: [`IN_FLIGHT_BATCHES_PER_BACKEND`]
    /// batches of each active backend's max batch.
    fn in_flight_bound(&self) -> u32 {
        let set = self.inner.active.load();
        let batches: u32 = set.backends.iter().map(|b| b.spec().max_batch.max(1)).fold(0u32, u32::saturating_add);
        batches.saturating_mul(IN_FLIGHT_BATCHES_PER_BACKEND)
    }

    /// Makes `backends` the active set: one pointer store.
    pub fn set_active(&self, backends: Vec<Arc<Backend>>) -> Swap {
        let current = Arc::new(ActiveSet { backends });
        let _writer = self.inner.switching.lock().unwrap_or_else(|p| p.into_inner());
        self.store(current)
    }

    /// Replaces backend `old_id` in the active set by `new` (a shadow taking over).
    pub fn replace(&self, old_id: &str, new: Arc<Backend>) -> Result<Swap, RouterError> {
        let _writer = self.inner.switching.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.inner.active.load();
        if !now.backends.iter().any(|b| b.id() == old_id) {
            return Err(RouterError::NotActive(old_id.into()));
        }
        let backends = now.backends.iter().map(|b| if b.id() == old_id { Arc::clone(&new) } else { Arc::clone(b) }).collect();
        Ok(self.store(Arc::new(ActiveSet { backends })))
    }

    fn store(&self, current: Arc<ActiveSet>) -> Swap {
        let started = Instant::now();
        let previous = self.inner.active.swap(Arc::clone(&current));
        // Pairs with the fence in `dispatch`: a drain that reads 0 in flight after this
        // point is certain every later dispatch re-reads the new set.
        fence(SeqCst);
        Swap { previous, current, store_time: started.elapsed() }
    }

    /// Closed measurement windows, as they close.
    pub fn subscribe_windows(&self) -> broadcast::Receiver<WindowStats> {
        self.inner.windows.subscribe()
    }

    /// Closes the current window if its time is up (call periodically when idle).
    pub fn tick(&self) {
        self.record(|w, now| w.advance(now));
    }

    pub fn into_service(self) -> GrpcInferenceServiceServer<Router> {
        GrpcInferenceServiceServer::new(self)
            .max_decoding_message_size(open_inference::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(open_inference::MAX_MESSAGE_BYTES)
    }

    fn now_ms(&self) -> f64 {
        self.inner.epoch.elapsed().as_secs_f64() * 1000.0
    }

    fn record(&self, f: impl FnOnce(&mut Window, u64) -> Vec<WindowStats>) {
        let now = u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let closed = {
            let mut w = self.inner.window.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut w, now)
        };
        for stats in closed {
            // No subscriber is fine: nobody is watching this service's windows.
            let _ = self.inner.windows.send(stats);
        }
    }

    /// Picks a backend (none of `failed`, where this request was sent and failed) and
    /// counts the request on it, so that a drain of that backend cannot miss it: count
    /// first, then re-check it is still active; if a switch retired it meanwhile, un-count
    /// and pick again from the new set.
    fn dispatch(&self, batch: u32, arrival_ms: f64, failed: &[Arc<Backend>]) -> Result<Dispatched, Status> {
        for _ in 0..MAX_DISPATCH_ATTEMPTS {
            let active = self.inner.active.load_full();
            let set = if failed.is_empty() {
                active
            } else {
                let others = active.backends.iter().filter(|b| !failed.iter().any(|f| Arc::ptr_eq(f, b))).cloned().collect();
                Arc::new(ActiveSet { backends: others })
            };
            let backend = match set.backends.len() {
                0 => {
                    let which = if failed.is_empty() { "no" } else { "no other" };
                    return Err(Status::unavailable(format!("service `{}`: {which} active backend", self.inner.config.service)));
                }
                1 => Arc::clone(&set.backends[0]),
                _ => Arc::clone(&set.backends[self.choose(&set, batch, arrival_ms)?]),
            };
            let guard = backend.enter();
            fence(SeqCst);
            if self.inner.active.load().contains(&backend) {
                let ticket = backend.queue().sent(batch, self.now_ms());
                return Ok(Dispatched { backend, ticket, epoch: self.inner.epoch, _in_flight: guard });
            }
        }
        Err(Status::unavailable(format!(
            "service `{}`: active set changed {MAX_DISPATCH_ATTEMPTS} times while dispatching",
            self.inner.config.service
        )))
    }

    /// Sends `req` to a backend of the active set; if that backend fails under it (its
    /// process died, or is draining), to another, at most [`MAX_RESENDS`] times: inference
    /// is idempotent, and a request in flight on a process that dies is the router's to
    /// finish. With no other backend yet (a shadow about to take over), it waits for the
    /// active set to change, up to [`RESEND_WAIT`].
    async fn forward(&self, req: ModelInferRequest, batch: u32, arrival_ms: f64) -> Result<Response<ModelInferResponse>, Status> {
        let mut failed: Vec<Arc<Backend>> = Vec::new();
        let mut last_failure: Option<Status> = None;
        let waited_from = Instant::now();
        loop {
            let dispatched = match self.dispatch(batch, arrival_ms, &failed) {
                Ok(d) => d,
                Err(_) if !failed.is_empty() && waited_from.elapsed() < RESEND_WAIT => {
                    tokio::time::sleep(RESEND_POLL).await;
                    continue;
                }
                // The caller learns why the backend failed, not only that no other came.
                Err(status) => {
                    return Err(match last_failure {
                        Some(last) => Status::new(
                            last.code(),
                            format!("{} (and no other backend was active within {} s)", last.message(), RESEND_WAIT.as_secs()),
                        ),
                        None => status,
                    })
                }
            };
            // Cheap: the tensors' raw contents are shared (`Bytes`), not copied.
            let mut forwarded = req.clone();
            forwarded.model_name.clone_from(&dispatched.backend.spec().model);
            let deadline = self.backend_deadline();
            let answer = match tokio::time::timeout(deadline, dispatched.backend.client().model_infer(forwarded)).await {
                Ok(answer) => answer,
                // Dropping the call resets its stream: the backend's slot is freed with it.
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "backend `{}` did not answer in {} ms",
                    dispatched.backend.id(),
                    deadline.as_millis()
                ))),
            };
            let backend = Arc::clone(&dispatched.backend);
            drop(dispatched);
            match answer {
                Err(status) if resendable(&status) && failed.len() < MAX_RESENDS => {
                    tracing::debug!(service = %self.inner.config.service, backend = backend.id(), %status, "backend failed a request; sending it to another");
                    failed.push(backend);
                    last_failure = Some(status);
                    self.inner.counts.resends.fetch_add(1, Ordering::Relaxed);
                }
                other => return other,
            }
        }
    }

    /// ELSA (paris-elsa Alg. 2) over the queues this router has sent to each backend.
    fn choose(&self, set: &ActiveSet, batch: u32, arrival_ms: f64) -> Result<usize, Status> {
        let now_ms = self.now_ms().max(arrival_ms);
        let states: Vec<_> = set.backends.iter().map(|b| b.partition_state(now_ms)).collect();
        let query = Query { batch, arrival_ms, sla_target_ms: self.slo_ms() };
        let model = |gpcs: u32, batch: u32| self.inner.model.service_time_ms(gpcs, batch);
        let decision = schedule(&query, &states, &model, &self.inner.config.elsa, now_ms)
            .map_err(|e| Status::failed_precondition(format!("service `{}`: ELSA: {e}", self.inner.config.service)))?;
        Ok(decision.partition)
    }
}

impl Router {
    /// The model name a request on this endpoint must give: the service's own name (the
    /// backends may serve the model under another, which the router puts in what it
    /// forwards).
    fn is_mine(&self, name: &str) -> Result<(), Status> {
        let service = &self.inner.config.service;
        if name == service {
            Ok(())
        } else {
            Err(Status::not_found(format!("model `{name}` is not served here (this endpoint serves `{service}`)")))
        }
    }

    /// A request naming a version asks for one the backends serve (their ModelMetadata's
    /// versions); one naming none gets what they serve by default. A version nobody
    /// serves is NOT_FOUND here, before any backend sees the request.
    async fn check_version(&self, version: &str) -> Result<(), Status> {
        if version.is_empty() {
            return Ok(());
        }
        let service = &self.inner.config.service;
        let Some(backend) = self.active().backends.first().cloned() else { return Ok(()) };
        // A backend that cannot say fails the request below as it would have failed it.
        let Ok(versions) = backend.versions().await else { return Ok(()) };
        if versions.iter().any(|v| v == version) {
            return Ok(());
        }
        let mut status = Status::not_found(format!("model `{service}` has no version `{version}` (served: {versions:?})"));
        if let Ok(v) = "model_version".parse() {
            status.metadata_mut().insert(proto::meta::FIELD, v);
        }
        Err(status)
    }

    /// Every active backend's model is ready (and there is one).
    async fn all_ready(&self) -> bool {
        let set = self.active();
        let mut ready = !set.backends.is_empty();
        for b in set.backends() {
            ready &= b.ready().await.unwrap_or(false);
        }
        ready
    }
}

/// The Open Inference Protocol on the service's endpoint: requests name the service as
/// their model; ModelInfer goes to one backend of the active set (ELSA's choice), the
/// health and metadata RPCs answer for the set.
#[tonic::async_trait]
impl GrpcInferenceService for Router {
    async fn server_live(&self, _request: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _request: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.all_ready().await }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        self.is_mine(&request.get_ref().name)?;
        Ok(Response::new(ModelReadyResponse { ready: self.all_ready().await }))
    }

    async fn server_metadata(&self, _request: Request<ServerMetadataRequest>) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "gpuplane-router".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: Vec::new(),
        }))
    }

    /// The first active backend's metadata of its model, under the service's name.
    async fn model_metadata(&self, request: Request<ModelMetadataRequest>) -> Result<Response<ModelMetadataResponse>, Status> {
        let service = &self.inner.config.service;
        self.is_mine(&request.get_ref().name)?;
        let set = self.active();
        let backend = set.backends.first().ok_or_else(|| Status::unavailable(format!("service `{service}`: no active backend")))?;
        let forwarded = ModelMetadataRequest { name: backend.spec().model.clone(), version: request.into_inner().version };
        let mut metadata = backend.client().model_metadata(forwarded).await?.into_inner();
        metadata.name.clone_from(service);
        Ok(Response::new(metadata))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let service = &self.inner.config.service;
        // Before anything is counted or queued: a caller without a listed token is no
        // traffic of the service's, and one past its share is shed at once.
        let admitted = match self.inner.admission.admit(service, &self.inner.callers.load(), self.in_flight_bound(), request.metadata()) {
            Ok(a) => a,
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                self.record(|w, now| {
                    let mut closed = w.arrival(now);
                    closed.extend(w.failed(now));
                    closed
                });
                return Err(status);
            }
            Err(status) => return Err(status),
        };
        let req = request.into_inner();
        self.is_mine(&req.model_name)?;
        // A malformed request never reaches a backend, nor the service's windows.
        let batch = open_inference::check(&req)?;
        self.check_version(&req.model_version).await?;
        let started = Instant::now();
        let arrival_ms = self.now_ms();
        self.record(|w, now| w.arrival(now));
        let result = self.forward(req, batch, arrival_ms).await;
        drop(admitted);
        match result {
            Ok(response) => {
                let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.record(|w, now| w.completed(now, latency_us));
                let mut response = response.into_inner();
                response.model_name.clone_from(service);
                Ok(Response::new(response))
            }
            Err(status) => {
                self.record(|w, now| w.failed(now));
                Err(status)
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, closing idle windows on a timer.
pub async fn serve(router: Router, listener: TcpListener, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), RouterError> {
    let ticker = tokio::spawn({
        let router = router.clone();
        let period = Duration::from_millis((router.config().window_ms / 4).max(1));
        async move {
            let mut interval = tokio::time::interval(period);
            loop {
                interval.tick().await;
                router.tick();
            }
        }
    });
    // gRPC and REST on one port: tonic's routes are an axum router, and HTTP/1.1 is
    // accepted beside HTTP/2 for the REST clients.
    let refused = Arc::clone(&router.inner.counts.connections_refused);
    let routes = tonic::service::Routes::new(router.clone().into_service()).into_axum_router().merge(super::rest::routes(router));
    let incoming = super::connections::LimitedIncoming::new(listener, super::connections::MAX_ROUTER_CONNECTIONS, refused);
    let result = tonic::transport::Server::builder()
        .accept_http1(true)
        .max_concurrent_streams(Some(super::connections::MAX_STREAMS_PER_CONNECTION))
        .add_routes(tonic::service::Routes::from(routes))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    ticker.abort();
    Ok(result?)
}
