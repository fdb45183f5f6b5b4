//! The thin gRPC shell around [`LatencyModel`]: one batcher task plays the GPU (one batch at
//! a time, as one inference process does), handlers queue requests to it and wait.

use super::latency::{model_shape, LatencyModel, LatencyModelError, Placement};
use super::rng::SplitMix64;
use crate::inflight::InFlight;
use proto::oip::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::oip::model_infer_response::InferOutputTensor;
use proto::oip::model_metadata_response::TensorMetadata;
use proto::oip::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse, ModelReadyRequest, ModelReadyResponse,
    ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
};
use proto::open_inference;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Everything a sim-infer process is told at start.
#[derive(Debug, Clone)]
pub struct SimInferConfig {
    /// Reported as `served_by`; empty means `<model>@<gpcs>g:<port>`.
    pub id: String,
    /// One of `planner::perf::synthetic::example_models()`.
    pub model: String,
    pub placement: Placement,
    /// Most samples executed in one batch.
    pub max_batch: u32,
    /// How long the batcher waits for more requests after the first of a batch.
    pub batch_window: Duration,
    /// Noise seed.
    pub seed: u64,
}

impl Default for SimInferConfig {
    fn default() -> Self {
        SimInferConfig {
            id: String::new(),
            model: "resnet50".into(),
            placement: Placement::default(),
            max_batch: 8,
            batch_window: Duration::from_millis(1),
            seed: 1,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimInferError {
    #[error("{0}")]
    UnknownModel(String),
    #[error(transparent)]
    Model(#[from] LatencyModelError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("sim-infer server task failed: {0}")]
    Task(String),
}

/// A request waiting for the batcher.
struct Pending {
    samples: u32,
    done: oneshot::Sender<u32>,
}

/// The Inference service of one simulated process.
#[derive(Clone)]
pub struct SimInfer {
    id: Arc<str>,
    model: LatencyModel,
    mps_percent: u32,
    max_batch: u32,
    queue: mpsc::Sender<Pending>,
    in_flight: Arc<InFlight>,
}

impl SimInfer {
    /// The service and the batcher future that must be spawned next to it.
    fn new(config: &SimInferConfig, port: u16) -> Result<(Self, impl Future<Output = ()> + Send + 'static), SimInferError> {
        let model = latency_model(config)?;
        let id = if config.id.is_empty() { format!("{}@{}g:{port}", config.model, model.gpcs()) } else { config.id.clone() };
        // Bounded: a full queue makes handlers wait (back-pressure), never drops.
        let (tx, rx) = mpsc::channel(4096);
        let batcher = run_batcher(rx, model.clone(), config.max_batch, config.batch_window, config.seed);
        let svc = SimInfer {
            id: id.into(),
            model,
            mps_percent: config.placement.mps_percent,
            max_batch: config.max_batch,
            queue: tx,
            in_flight: InFlight::new(),
        };
        Ok((svc, batcher))
    }
}

fn latency_model(config: &SimInferConfig) -> Result<LatencyModel, SimInferError> {
    let shape = model_shape(&config.model).map_err(SimInferError::UnknownModel)?;
    Ok(LatencyModel::new(shape, &config.placement, config.max_batch)?)
}

/// Whether a request of `next` samples joins a batch already holding `current`.
fn joins_batch(current: u32, next: u32, max_batch: u32) -> bool {
    current + next <= max_batch
}

/// Plays the GPU: collects a batch (until full or `window` after its first request), sleeps
/// the model's time for it, answers every request in it with the batch size.
async fn run_batcher(mut rx: mpsc::Receiver<Pending>, model: LatencyModel, max_batch: u32, window: Duration, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut samples = first.samples;
        let mut batch = vec![first];
        let deadline = Instant::now() + window;
        while samples < max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(p)) if joins_batch(samples, p.samples, max_batch) => {
                    samples += p.samples;
                    batch.push(p);
                }
                Ok(Some(p)) => {
                    carry = Some(p);
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let ms = model.sample_ms(samples, &mut rng);
        tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
        for p in batch {
            // A closed receiver is a client that gave up; nothing to answer.
            let _ = p.done.send(samples);
        }
    }
}

impl SimInfer {
    fn model_name(&self) -> &str {
        &self.model.shape().name
    }

    fn is_mine(&self, name: &str) -> Result<(), Status> {
        if name == self.model_name() {
            Ok(())
        } else {
            Err(Status::not_found(format!("{}: model `{name}` is not served here (this process serves `{}`)", self.id, self.model_name())))
        }
    }
}

/// The Open Inference Protocol, as a server of one model answers it: a request of batch
/// `b` (its first input's first dimension) waits for the batcher like `b` samples, and the
/// answer is its first input again (`OUTPUT0`, an identity model), so a client can check
/// what comes back.
#[tonic::async_trait]
impl GrpcInferenceService for SimInfer {
    async fn server_live(&self, _request: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _request: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: !self.in_flight.is_closed() }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        self.is_mine(&request.get_ref().name)?;
        Ok(Response::new(ModelReadyResponse { ready: !self.in_flight.is_closed() }))
    }

    async fn server_metadata(&self, _request: Request<ServerMetadataRequest>) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "sim-infer".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: Vec::new(),
        }))
    }

    async fn model_metadata(&self, request: Request<ModelMetadataRequest>) -> Result<Response<ModelMetadataResponse>, Status> {
        self.is_mine(&request.get_ref().name)?;
        let tensor = |name: &str| TensorMetadata { name: name.into(), datatype: "FP32".into(), shape: vec![-1, -1] };
        Ok(Response::new(ModelMetadataResponse {
            name: self.model_name().to_string(),
            versions: vec!["1".into()],
            platform: format!("gpuplane-sim-infer ({}g, MPS {}%, max batch {})", self.model.gpcs(), self.mps_percent, self.max_batch),
            inputs: vec![tensor("INPUT0")],
            outputs: vec![tensor("OUTPUT0")],
        }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let received = Instant::now();
        let Some(_guard) = self.in_flight.try_enter() else {
            return Err(Status::unavailable(format!("{}: draining, not accepting new requests", self.id)));
        };
        let mut req = request.into_inner();
        self.is_mine(&req.model_name)?;
        let samples = open_inference::check(&req)?;
        if samples > self.max_batch {
            return Err(Status::invalid_argument(format!(
                "{}: request batch {samples} exceeds this process's max batch {}",
                self.id, self.max_batch
            )));
        }
        let (done, answered) = oneshot::channel();
        self.queue.send(Pending { samples, done }).await.map_err(|_| Status::internal(format!("{}: batcher stopped", self.id)))?;
        let executed_batch = answered.await.map_err(|_| Status::internal(format!("{}: batcher dropped the request", self.id)))?;
        let input = req.inputs.swap_remove(0);
        let raw = if req.raw_input_contents.is_empty() { Vec::new() } else { vec![req.raw_input_contents.swap_remove(0)] };
        let output = InferOutputTensor {
            name: "OUTPUT0".into(),
            datatype: input.datatype,
            shape: input.shape,
            contents: input.contents,
            ..Default::default()
        };
        let latency_us = i64::try_from(received.elapsed().as_micros()).unwrap_or(i64::MAX);
        let parameters = [
            (open_inference::SERVED_BY.to_string(), open_inference::string_param(self.id.to_string())),
            (open_inference::SERVER_LATENCY_US.to_string(), open_inference::int_param(latency_us)),
            (open_inference::EXECUTED_BATCH.to_string(), open_inference::int_param(i64::from(executed_batch))),
        ]
        .into_iter()
        .collect();
        Ok(Response::new(ModelInferResponse {
            model_name: self.model_name().to_string(),
            model_version: "1".into(),
            id: req.id,
            parameters,
            outputs: vec![output],
            raw_output_contents: raw,
        }))
    }
}

/// Serves on `listener` until `shutdown` resolves, then drains: new requests get
/// UNAVAILABLE, requests already accepted complete, and only then the server stops.
pub async fn serve(
    config: &SimInferConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), SimInferError> {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let (svc, batcher) = SimInfer::new(config, port)?;
    let batcher = tokio::spawn(batcher);
    let in_flight = Arc::clone(&svc.in_flight);
    let drained = async move {
        shutdown.await;
        in_flight.close();
        in_flight.wait_idle().await;
    };
    let result = tonic::transport::Server::builder()
        .add_service(GrpcInferenceServiceServer::new(svc).max_decoding_message_size(open_inference::MAX_MESSAGE_BYTES))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), drained)
        .await;
    batcher.abort();
    Ok(result?)
}

/// An in-process sim-infer server (tests, benches).
#[derive(Debug)]
pub struct SimInferHandle {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), SimInferError>>,
}

/// Binds `addr` (e.g. `127.0.0.1:0`) and serves in a task.
pub async fn spawn(config: SimInferConfig, addr: &str) -> Result<SimInferHandle, SimInferError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| SimInferError::Bind { addr: addr.into(), source })?;
    let local = listener.local_addr().map_err(|source| SimInferError::Bind { addr: addr.into(), source })?;
    // Fail fast on a bad config instead of inside the task.
    latency_model(&config)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(&config, listener, async {
            // Dropping the handle's sender also stops the server.
            let _ = stopped.await;
        })
        .await
    });
    Ok(SimInferHandle { addr: local, stop: Some(stop), task })
}

impl SimInferHandle {
    /// Drains (in-flight requests complete) and stops; returns the server's result.
    pub async fn drain_and_stop(mut self) -> Result<(), SimInferError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join) => Err(SimInferError::Task(join.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_admission() {
        assert!(joins_batch(3, 5, 8));
        assert!(!joins_batch(4, 5, 8));
    }
}
