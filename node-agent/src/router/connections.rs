//! The connections a router endpoint holds: at most [`MAX_ROUTER_CONNECTIONS`] at once. A
//! client past it is closed as soon as it is accepted, so one tenant opening connections in
//! a loop takes the agent's file descriptors from nobody else: the other services'
//! endpoints, the agent's links to the controllers and its workloads keep theirs.
//!
//! Written here rather than taken from tower's `ConcurrencyLimit`: that bounds requests in
//! flight, not sockets held open with nothing in flight. The controller's
//! `server::connections` does more (caps per client address, handshake and idle deadlines,
//! metrics) but is bound to the controller's metrics and settings; the two should become one
//! crate shared by both (left for the architecture pass, issue 61).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections one service's endpoint holds open at once: far above what a service's
/// clients need through a connection pool, far below the descriptors an agent has.
pub const MAX_ROUTER_CONNECTIONS: usize = 512;
/// HTTP/2 streams (requests) one connection may have open at once (its SETTINGS).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// After an accept that failed on the agent's side (out of descriptors), the endpoint waits
/// this long before accepting again, as tonic's own listener does, instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// An accepted connection holding one of the endpoint's slots until it closes.
pub struct Limited {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

/// The endpoint's accepted connections, within [`MAX_ROUTER_CONNECTIONS`] (or `max`).
pub struct LimitedIncoming {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    refused: Arc<AtomicU64>,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LimitedIncoming {
    /// Accepts from `listener`, at most `max` at once; counts in `refused` the connections
    /// closed at once, the endpoint being full.
    pub fn new(listener: TcpListener, max: usize, refused: Arc<AtomicU64>) -> Self {
        LimitedIncoming { listener, slots: Arc::new(Semaphore::new(max)), refused, backoff: None }
    }
}

impl Stream for LimitedIncoming {
    type Item = io::Result<Limited>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(sleep) = this.backoff.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.backoff = None;
            }
            match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, peer))) => match Arc::clone(&this.slots).try_acquire_owned() {
                    Ok(slot) => {
                        // Requests are small and latency-bound: no Nagle delay.
                        let _ = stream.set_nodelay(true);
                        return Poll::Ready(Some(Ok(Limited { stream, _slot: slot })));
                    }
                    Err(_) => {
                        let n = this.refused.fetch_add(1, Ordering::Relaxed) + 1;
                        // Logged at 1, 2, 4, 8, ...: a flood does not flood the log too.
                        if n.is_power_of_two() {
                            tracing::warn!(%peer, refused = n, max = MAX_ROUTER_CONNECTIONS, "router endpoint full: connection closed");
                        }
                        drop(stream);
                    }
                },
                // The peer gave up before it was accepted: nothing of ours is short.
                Poll::Ready(Err(e)) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) => {}
                Poll::Ready(Err(e)) => {
                    tracing::warn!(error = %e, "router endpoint: accept failed; retrying shortly");
                    this.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
            }
        }
    }
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn past_the_bound_a_connection_is_closed_and_a_closed_one_frees_its_slot() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refused = Arc::new(AtomicU64::new(0));
        let mut incoming = LimitedIncoming::new(listener, 2, Arc::clone(&refused));
        // An echo server over what is accepted.
        tokio::spawn(async move {
            while let Some(Ok(mut conn)) = incoming.next().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 16];
                    while let Ok(n @ 1..) = conn.read(&mut buf).await {
                        if conn.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let echo = |mut c: TcpStream| async move {
            c.write_all(b"x").await.ok()?;
            let mut b = [0u8; 1];
            match c.read(&mut b).await {
                Ok(1) => Some(c),
                _ => None,
            }
        };
        let first = echo(TcpStream::connect(addr).await.unwrap()).await.expect("first is served");
        let second = echo(TcpStream::connect(addr).await.unwrap()).await.expect("second is served");
        assert!(echo(TcpStream::connect(addr).await.unwrap()).await.is_none(), "third is closed");
        assert_eq!(refused.load(Ordering::Relaxed), 1);
        drop(first);
        // The slot comes back once the server side sees the close.
        let mut third = None;
        for _ in 0..100 {
            if let Some(c) = echo(TcpStream::connect(addr).await.unwrap()).await {
                third = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(third.is_some(), "a freed slot is given to the next connection");
        assert!(echo(second).await.is_some(), "the held connection was served throughout");
    }
}
