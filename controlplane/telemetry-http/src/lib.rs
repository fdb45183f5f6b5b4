//! A bare HTTP/1 server for the probes and the scrape: GET (or HEAD) a path, get a text body.
//! Shared by the controller and the node agent (hyper directly: a web framework would be
//! most of the code for three text endpoints).

mod labels;

pub use labels::{labels, LabelValue, Labels};

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The answer to one path.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Response { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }

    /// The OpenMetrics text format that `prometheus-client` writes (Prometheus reads it).
    pub fn metrics(body: String) -> Self {
        Response { status: 200, content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8", body }
    }
}

/// Handlers running at once; further requests wait for one to finish (without a thread).
/// The listener takes anyone's connections: unbounded, a flood of scrapes would have each
/// taken a thread of the blocking pool (up to 512) to render the same page.
pub const MAX_RUNNING_HANDLERS: usize = 2;

/// Serves `handler(path)` for every GET or HEAD until the task is aborted. The handler runs
/// on tokio's blocking pool, at most [`MAX_RUNNING_HANDLERS`] at once: rendering a
/// 10,000-host leader's series takes tens of milliseconds, which on an async worker would
/// hold up the agents' reports queued behind it.
pub async fn serve(listener: TcpListener, handler: Arc<dyn Fn(&str) -> Response + Send + Sync>) {
    let running = Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING_HANDLERS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (handler, running) = (handler.clone(), running.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (handler, running, path) = (handler.clone(), running.clone(), req.uri().path().to_string());
                let allowed = matches!(*req.method(), Method::GET | Method::HEAD);
                async move {
                    let r = if allowed {
                        // Never closed, so acquiring cannot fail.
                        let permit = running.acquire_owned().await.ok();
                        tokio::task::spawn_blocking(move || {
                            let _permit = permit;
                            handler(&path)
                        })
                        .await
                        .unwrap_or_else(|e| Response::text(500, format!("the handler failed: {e}\n")))
                    } else {
                        Response::text(405, "only GET and HEAD\n")
                    };
                    let answer = hyper::Response::builder()
                        .status(r.status)
                        .header(CONTENT_TYPE, r.content_type)
                        .body(Full::new(Bytes::from(r.body)))
                        .expect("a valid status and header");
                    Ok::<_, Infallible>(answer)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// GETs `path` from a server at `addr` and returns the status code and body: what a probe
/// or a scrape does, for tests and tools that check these endpoints.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    get_bounded(addr, path, usize::MAX).await
}

/// Bytes of an answer's status line and headers a bounded request reads besides the body.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

/// [`get`] of an untrusted server: reads at most `max_body` bytes of body (plus about
/// [`MAX_HEAD_BYTES`] of head) and fails on more or on a body that is not UTF-8.
pub async fn get_bounded(addr: std::net::SocketAddr, path: &str, max_body: usize) -> std::io::Result<(u16, String)> {
    request_bounded(addr, Method::GET, path, max_body).await
}

/// POSTs an empty body to `path`, the answer read as by [`get_bounded`]: an action on an
/// untrusted server's API (the agent loading a model through the repository extension).
pub async fn post_bounded(addr: std::net::SocketAddr, path: &str, max_body: usize) -> std::io::Result<(u16, String)> {
    request_bounded(addr, Method::POST, path, max_body).await
}

/// One HTTP/1.1 request on a connection of its own, through hyper's client: the answer's
/// end is its length or its chunks, not the server closing the connection (Triton 2.51
/// answers a first model load without closing it).
async fn request_bounded(addr: std::net::SocketAddr, method: Method, path: &str, max_body: usize) -> std::io::Result<(u16, String)> {
    use http_body_util::{BodyExt, Empty, Limited};
    use std::io::{Error, ErrorKind};
    let bad = |why: String| Error::new(ErrorKind::InvalidData, format!("{addr}{path}: {why}"));
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES.max(8192))
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| bad(e.to_string()))?;
    // Ends when the answer is read and `sender` is dropped.
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| bad(e.to_string()))?;
    let answer = sender.send_request(request).await.map_err(|e| bad(e.to_string()))?;
    let status = answer.status().as_u16();
    let body = Limited::new(answer.into_body(), max_body)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                bad(format!("a body over {max_body} bytes"))
            } else {
                bad(e.to_string())
            }
        })?
        .to_bytes();
    let body = String::from_utf8(body.to_vec()).map_err(|_| bad("the answer is not UTF-8".into()))?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_run_at_most_the_bound_of_handlers_at_once_and_all_are_answered() {
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n, m) = (now.clone(), most.clone());
        let handler = Arc::new(move |_: &str| {
            let running = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(running, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(50));
            n.fetch_sub(1, Ordering::SeqCst);
            Response::text(200, "ok\n")
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, handler));
        let gets: Vec<_> = (0..8).map(|_| tokio::spawn(get(addr, "/metrics"))).collect();
        for g in gets {
            assert_eq!(g.await.unwrap().unwrap(), (200, "ok\n".to_string()));
        }
        server.abort();
        let most = most.load(Ordering::SeqCst);
        assert!((1..=MAX_RUNNING_HANDLERS).contains(&most), "{most} handlers ran at once");
    }

    /// A server that never answers: the caller gives up, and its connection does not stay
    /// open behind it (the scrape asks every server each interval).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_given_up_on_closes_its_connection() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = tokio::spawn(async move { listener.accept().await.unwrap().0 });
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(100), get_bounded(addr, "/metrics", 1000)).await;
        assert!(gave_up.is_err(), "the server never answers");
        let mut conn = accepted.await.unwrap();
        let mut buf = vec![0u8; 4096];
        // The request, then the end of the stream: the client closed. (Bounded so that a
        // connection left open fails the test instead of hanging it.)
        let closed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                if conn.read(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection stayed open after its caller gave up");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bounded_get_refuses_a_body_over_its_bound_and_reads_one_at_it() {
        let handler = Arc::new(|path: &str| Response::text(200, if path == "/big" { "x".repeat(1001) } else { "x".repeat(1000) }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, handler));
        assert_eq!(get_bounded(addr, "/", 1000).await.unwrap(), (200, "x".repeat(1000)));
        let over = get_bounded(addr, "/big", 1000).await.unwrap_err();
        assert!(over.to_string().contains("a body over 1000 bytes"), "{over}");
        server.abort();
    }
}
