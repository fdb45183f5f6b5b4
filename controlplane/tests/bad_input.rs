//! Bad bytes on the wire: a malformed protobuf and an oversized message to the client API,
//! and a malformed payload to the Raft peer service. Each is refused with a clear error,
//! nothing reaches the Raft log, and the cluster keeps serving.

mod common;

use bytes::{Buf, BufMut};
use common::*;
use proto::WriteMode;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Sends and receives raw message bytes, so a test can put anything on the wire.
#[derive(Clone, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

async fn raw_call(addr: &str, path: &'static str, body: Vec<u8>) -> Result<Vec<u8>, Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(tonic::Request::new(body), tonic::codegen::http::uri::PathAndQuery::from_static(path), RawCodec)
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_and_oversized_messages_are_refused_and_change_nothing() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let leader = cluster.wait_leader().await;
    let addr = cluster.addrs[&leader].to_string();
    let before = cluster.node(leader).controller.status().last_log_index;

    // Not a protobuf: field 31 with a wire type that does not exist.
    let err = raw_call(&addr, "/gpuplane.v1.ControlPlane/Put", vec![0xff, 0xff, 0xff, 0xff]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{}", err.message());
    assert!(err.message().contains("decode"), "{}", err.message());

    // A truncated but otherwise valid Put: a length prefix promising more than follows.
    let mut truncated = prost::Message::encode_to_vec(&proto::PutRequest {
        resource: Some(service("s", 10.0, 50.0)),
        mode: WriteMode::Create as i32,
        request_id: "r".into(),
        status_only: false,
    });
    truncated.truncate(truncated.len() / 2);
    let err = raw_call(&addr, "/gpuplane.v1.ControlPlane/Put", truncated).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{}", err.message());

    // Larger than the server accepts (4 MiB by default on the client API).
    let err = raw_call(&addr, "/gpuplane.v1.ControlPlane/Put", vec![0u8; 5 << 20]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{}", err.message());
    assert!(err.message().contains("too large"), "{}", err.message());

    // The peer service: a well-formed frame whose payload is not a Raft message.
    let payload = prost::Message::encode_to_vec(&proto::RaftPayload { data: b"{\"not\": \"raft\"}".to_vec(), ..Default::default() });
    let err = raw_call(&addr, "/gpuplane.v1.RaftService/AppendEntries", payload).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains("malformed raft payload"), "{}", err.message());

    assert_eq!(cluster.node(leader).controller.status().last_log_index, before, "refused input must not reach the log");
    // Still serving.
    client.put(service("after", 10.0, 50.0), WriteMode::Create).await.expect("a valid write after the bad ones");
}
