//! One inference process as the router sees it: a lazily connected gRPC channel (the Open
//! Inference Protocol), the requests in flight on it (for draining) and its inferred queue
//! (for ELSA).

use super::queue::BackendQueue;
use crate::inflight::{InFlight, InFlightGuard};
use planner::policy::elsa::PartitionState;
use proto::oip::grpc_inference_service_client::GrpcInferenceServiceClient;
use proto::oip::{ModelMetadataRequest, ModelReadyRequest};
use proto::open_inference::MAX_MESSAGE_BYTES;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Where a backend is and what it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSpec {
    /// Unique among the router's backends, e.g. `resnet50/3g#shadow`.
    pub id: String,
    /// `host:port` or a full `http://` URI.
    pub addr: String,
    /// Partition size in GPCs (7 for a whole GPU), for ELSA.
    pub gpcs: u32,
    /// The backend's max batch: how the router groups what it sent into batches.
    pub max_batch: u32,
    /// The name the process serves its model under (the router's requests name the
    /// service; it forwards them naming this).
    pub model: String,
}

/// Versions of a backend's model the router keeps.
const MAX_MODEL_VERSIONS: usize = 256;

#[derive(Debug, thiserror::Error)]
#[error("backend `{id}`: invalid address `{addr}`: {source}")]
pub struct BackendAddrError {
    pub id: String,
    pub addr: String,
    source: tonic::transport::Error,
}

/// A backend the router may send requests to.
#[derive(Debug)]
pub struct Backend {
    spec: BackendSpec,
    client: GrpcInferenceServiceClient<Channel>,
    in_flight: Arc<InFlight>,
    queue: Mutex<BackendQueue>,
    /// The versions of its model the process serves, from its ModelMetadata (asked once,
    /// when a request first names a version).
    versions: tokio::sync::OnceCell<Vec<String>>,
}

impl Backend {
    /// Connects on first use, so a shadow's backend can be made before its process is up.
    pub fn connect_lazy(spec: BackendSpec) -> Result<Arc<Self>, BackendAddrError> {
        let uri = if spec.addr.contains("://") { spec.addr.clone() } else { format!("http://{}", spec.addr) };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|source| BackendAddrError { id: spec.id.clone(), addr: spec.addr.clone(), source })?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        let client = GrpcInferenceServiceClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let queue = Mutex::new(BackendQueue::new(spec.gpcs, spec.max_batch));
        Ok(Arc::new(Backend { spec, client, in_flight: InFlight::new(), queue, versions: Default::default() }))
    }

    pub fn id(&self) -> &str {
        &self.spec.id
    }

    pub fn spec(&self) -> &BackendSpec {
        &self.spec
    }

    /// A client for one request (cheap: shares the channel).
    pub(crate) fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        self.client.clone()
    }

    /// Requests sent here and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.count()
    }

    /// Time so far with at least one request sent here and not yet answered.
    pub fn busy_time(&self) -> Duration {
        self.in_flight.busy_time()
    }

    pub(crate) fn enter(&self) -> InFlightGuard {
        self.in_flight.enter()
    }

    /// Resolves once every request sent here has been answered.
    pub async fn drained(&self) {
        self.in_flight.wait_idle().await;
    }

    /// Asks the process whether its model is ready (loaded, not draining): the protocol's
    /// ModelReady for the backend's model.
    pub async fn ready(&self) -> Result<bool, tonic::Status> {
        let request = ModelReadyRequest { name: self.spec.model.clone(), version: String::new() };
        Ok(self.client().model_ready(request).await?.into_inner().ready)
    }

    /// The versions of its model the process serves (its ModelMetadata's `versions`).
    pub async fn versions(&self) -> Result<&[String], tonic::Status> {
        let versions = self
            .versions
            .get_or_try_init(|| async {
                let request = ModelMetadataRequest { name: self.spec.model.clone(), version: String::new() };
                let mut metadata = self.client().model_metadata(request).await?.into_inner();
                // A hostile server's list is bounded like any other input.
                metadata.versions.truncate(MAX_MODEL_VERSIONS);
                Ok::<_, tonic::Status>(metadata.versions)
            })
            .await?;
        Ok(versions)
    }

    /// The queue never holds invariants across a panic worth refusing service for (it is
    /// bookkeeping for estimates), so a poisoned lock is taken over.
    pub(crate) fn queue(&self) -> MutexGuard<'_, BackendQueue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn partition_state(&self, now_ms: f64) -> PartitionState {
        self.queue().partition_state(now_ms)
    }
}
