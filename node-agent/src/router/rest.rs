//! The Open Inference Protocol over HTTP/REST (KServe v2) on a service's endpoint, on the
//! same port as its gRPC: `/v2/health/live|ready`, `/v2`, `/v2/models/{m}[/versions/{v}]`
//! and its `/ready` and `/infer`. Each route turns its body into the gRPC message
//! ([`super::rest_json`]) and runs the gRPC path, so admission, bounds, ELSA and windows
//! are one code path. JSON tensors only: Triton's binary-data extension is refused, as
//! MLServer does.

use super::rest_json;
use super::service::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use proto::oip::grpc_inference_service_server::GrpcInferenceService;
use proto::oip::{ModelMetadataRequest, ModelReadyRequest, ServerLiveRequest, ServerMetadataRequest, ServerReadyRequest};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;
use tonic::metadata::MetadataMap;

/// The header of Triton's binary-data extension (a JSON header followed by raw tensors).
const BINARY_HEADER: &str = "inference-header-content-length";

/// The REST routes of `router`'s endpoint.
pub fn routes(router: Router) -> axum::Router {
    axum::Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route("/v2/models/{model}/versions/{version}/ready", get(model_ready))
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
        .layer(DefaultBodyLimit::max(proto::open_inference::MAX_MESSAGE_BYTES))
        .with_state(router)
}

fn body(status: StatusCode, value: Value) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

/// A gRPC status as the protocol's REST error: `{"error": message}` with the HTTP code.
fn error(status: &tonic::Status) -> Response {
    use tonic::Code;
    let code = match status.code() {
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    body(code, json!({"error": status.message()}))
}

fn request<T>(message: T, headers: &HeaderMap) -> tonic::Request<T> {
    tonic::Request::from_parts(MetadataMap::from_headers(headers.clone()), Default::default(), message)
}

fn ready_body(ready: bool) -> Response {
    body(if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, json!({"ready": ready}))
}

async fn live(State(r): State<Router>) -> Response {
    match r.server_live(tonic::Request::new(ServerLiveRequest {})).await {
        Ok(a) => body(StatusCode::OK, json!({"live": a.into_inner().live})),
        Err(e) => error(&e),
    }
}

async fn ready(State(r): State<Router>) -> Response {
    match r.server_ready(tonic::Request::new(ServerReadyRequest {})).await {
        Ok(a) => ready_body(a.into_inner().ready),
        Err(e) => error(&e),
    }
}

async fn server_metadata(State(r): State<Router>) -> Response {
    match r.server_metadata(tonic::Request::new(ServerMetadataRequest {})).await {
        Ok(a) => {
            let m = a.into_inner();
            body(StatusCode::OK, json!({"name": m.name, "version": m.version, "extensions": m.extensions}))
        }
        Err(e) => error(&e),
    }
}

fn name_and_version(path: &HashMap<String, String>) -> (String, String) {
    (path.get("model").cloned().unwrap_or_default(), path.get("version").cloned().unwrap_or_default())
}

async fn model_metadata(State(r): State<Router>, Path(path): Path<HashMap<String, String>>, headers: HeaderMap) -> Response {
    let (name, version) = name_and_version(&path);
    match r.model_metadata(request(ModelMetadataRequest { name, version }, &headers)).await {
        Ok(a) => body(StatusCode::OK, rest_json::model_metadata(&a.into_inner())),
        Err(e) => error(&e),
    }
}

async fn model_ready(State(r): State<Router>, Path(path): Path<HashMap<String, String>>, headers: HeaderMap) -> Response {
    let (name, version) = name_and_version(&path);
    match r.model_ready(request(ModelReadyRequest { name, version }, &headers)).await {
        Ok(a) => ready_body(a.into_inner().ready),
        Err(e) => error(&e),
    }
}

/// How long a client may take to send a request's body; a slower one gets 408 and its
/// connection's slot back, rather than holding it for ever.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The body of `headers`' request, refused at once when its declared length is over the
/// message limit (before a byte of it is read), when more than that arrives, or when it
/// takes longer than [`BODY_TIMEOUT`].
async fn bounded_body(headers: &HeaderMap, payload: Body) -> Result<Bytes, Response> {
    let max = proto::open_inference::MAX_MESSAGE_BYTES;
    let over = || body(StatusCode::PAYLOAD_TOO_LARGE, json!({"error": format!("body: over the {max} bytes of a message")}));
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(over());
    }
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(payload, max)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(over()),
        Err(_) => {
            Err(body(StatusCode::REQUEST_TIMEOUT, json!({"error": format!("body: not received within {} s", BODY_TIMEOUT.as_secs())})))
        }
    }
}

async fn infer(State(r): State<Router>, Path(path): Path<HashMap<String, String>>, headers: HeaderMap, payload: Body) -> Response {
    if headers.contains_key(BINARY_HEADER) {
        let why = "the binary tensor data extension is not supported on gpuplane endpoints: send JSON tensors, or use gRPC";
        return body(StatusCode::BAD_REQUEST, json!({ "error": why }));
    }
    let payload = match bounded_body(&headers, payload).await {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    let (name, version) = name_and_version(&path);
    let parsed: Value = match serde_json::from_slice(&payload) {
        Ok(v) => v,
        Err(e) => return body(StatusCode::BAD_REQUEST, json!({"error": format!("body: not JSON: {e}")})),
    };
    let message = match rest_json::infer_request(&name, &version, &parsed) {
        Ok(m) => m,
        Err(e) => return body(StatusCode::BAD_REQUEST, json!({"error": e.to_string(), "field": e.field})),
    };
    match r.model_infer(request(message, &headers)).await {
        Ok(a) => match rest_json::infer_response(&a.into_inner()) {
            Ok(v) => body(StatusCode::OK, v),
            Err(e) => body(StatusCode::INTERNAL_SERVER_ERROR, json!({ "error": e })),
        },
        Err(e) => error(&e),
    }
}
