//! tonic over turmoil's simulated TCP: the server side takes a stream of accepted simulated
//! connections, the client side opens channels through a connector that dials simulated
//! hosts, so the real gRPC services and clients run unchanged inside the simulation.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use controlplane::raft::PeerChannels;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::Stream;
use tonic::transport::server::Connected;
use tonic::transport::{Endpoint, Uri};

/// The port every controller serves on inside the simulation.
pub const CONTROLLER_PORT: u16 = 7000;

/// An accepted simulated connection, as tonic's server wants it.
pub struct SimConnection(turmoil::net::TcpStream);

impl Connected for SimConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The connections accepted on `listener`, one after the other.
pub fn incoming(listener: turmoil::net::TcpListener) -> impl Stream<Item = io::Result<SimConnection>> + Send + 'static {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| SimConnection(stream));
        Some((accepted, listener))
    })
}

/// Peer channels that dial simulated hosts (`http://HOST:PORT` endpoints).
///
/// turmoil's TCP does not retransmit: a segment dropped by a partition or a link failure
/// leaves a gap that wedges the connection for good, silently (real TCP would resume after
/// the network heals). Only HTTP/2 keep-alive notices that, so the channels ping while idle
/// too, every second; otherwise a wedged peer connection outlives the fault by any length
/// of time.
///
/// h2 forgets a locally reset stream (a call past its deadline) after a span of wall-clock
/// time, and treats a late frame differently before and after, which makes a run depend on
/// how fast the machine runs it. The span is set beyond any run here, so only the bounded
/// number of remembered streams applies, which does not depend on time.
pub fn sim_channels() -> PeerChannels {
    PeerChannels::with_connector(Arc::new(|endpoint: Endpoint| {
        let endpoint = endpoint
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(1))
            .keep_alive_while_idle(true)
            .http2_reset_stream_duration(Duration::from_secs(24 * 3600));
        endpoint.connect_with_connector_lazy(tower::service_fn(|uri: Uri| async move {
            let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?.to_string();
            let port = uri.port_u16().unwrap_or(CONTROLLER_PORT);
            let stream = turmoil::net::TcpStream::connect((host, port)).await?;
            Ok::<_, io::Error>(TokioIo::new(stream))
        }))
    }))
}
