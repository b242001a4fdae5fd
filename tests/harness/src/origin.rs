//! Origin servers on loopback for the HTTP balancer: a hyper one ([`Origin`]) that records
//! every request and routes by path, and raw ones ([`raw_origin`]) for what hyper would not
//! send.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::{PatternBody, check_body};

/// The body type of the origins' answers and of the tests' requests.
pub type OriginBody = BoxBody<Bytes, Infallible>;

/// A whole body of `text`.
pub fn full(text: impl Into<Bytes>) -> OriginBody {
    Full::new(text.into()).boxed()
}

/// A request as an origin server parsed it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its method.
    pub method: String,
    /// Its request target, as it came.
    pub target: String,
    /// Its HTTP version.
    pub version: hyper::Version,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, read whole.
    pub body: Bytes,
}

/// A hyper origin server on loopback. Routes:
/// - `/upload`: reads the body through a [`PatternCheck`], answers `<bytes> <bad offset>`;
/// - `/bytes/<n>` (`/bytes/chunked/<n>`): `n` pattern bytes with a length (chunked);
/// - `/status/<code>`: that status;
/// - `/deny`: 401 without reading the body;
/// - `/hold`: answers once the test releases it ([`Origin::release`]);
/// - `/hop`: an answer with hop-by-hop headers that must not reach the client;
/// - anything else: 200 with the body read whole, and the request recorded in `seen`.
pub struct Origin {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    /// Connections open now.
    pub open: Arc<AtomicUsize>,
    /// The requests of the default route, in order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Raw bytes received, per connection.
    pub raw: Arc<Mutex<HashMap<usize, Vec<u8>>>>,
    hold: Arc<tokio::sync::Semaphore>,
    /// Requests to `/hold` that came so far, released or not.
    pub held: Arc<AtomicUsize>,
}

impl Origin {
    /// An origin on a fresh port.
    pub async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin {
            addr: listener.local_addr().unwrap(),
            accepted: Arc::default(),
            open: Arc::default(),
            seen: Arc::default(),
            raw: Arc::default(),
            hold: Arc::new(tokio::sync::Semaphore::new(0)),
            held: Arc::default(),
        };
        let (accepted, open, seen, raw, hold, held) = (
            Arc::clone(&origin.accepted),
            Arc::clone(&origin.open),
            Arc::clone(&origin.seen),
            Arc::clone(&origin.raw),
            Arc::clone(&origin.hold),
            Arc::clone(&origin.held),
        );
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let id = accepted.fetch_add(1, SeqCst);
                open.fetch_add(1, SeqCst);
                let (open, seen, hold, held) = (
                    Arc::clone(&open),
                    Arc::clone(&seen),
                    Arc::clone(&hold),
                    Arc::clone(&held),
                );
                let io = Recording {
                    inner: stream,
                    id,
                    raw: Arc::clone(&raw),
                };
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let (seen, hold, held) =
                            (Arc::clone(&seen), Arc::clone(&hold), Arc::clone(&held));
                        async move { Ok::<_, Infallible>(route(request, seen, hold, held).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(io), service)
                        .with_upgrades()
                        .await;
                    open.fetch_sub(1, SeqCst);
                });
            }
        });
        origin
    }

    /// Lets `n` held requests answer.
    pub fn release(&self, n: usize) {
        self.hold.add_permits(n);
    }

    /// The requests of the default route so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Everything every connection received, in connection order.
    pub fn raw_all(&self) -> Vec<u8> {
        let raw = self.raw.lock().unwrap();
        let mut ids: Vec<_> = raw.keys().copied().collect();
        ids.sort_unstable();
        ids.iter().flat_map(|id| raw[id].clone()).collect()
    }
}

async fn route(
    request: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    hold: Arc<tokio::sync::Semaphore>,
    held: Arc<AtomicUsize>,
) -> Response<OriginBody> {
    let path = request.uri().path().to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["upload"] => {
            let (bytes, bad) = check_body(request.into_body()).await;
            Response::new(full(format!("{bytes} {bad:?}")))
        }
        ["bytes", n] => Response::new(PatternBody::new(n.parse().unwrap(), true).boxed()),
        ["bytes", "chunked", n] => {
            Response::new(PatternBody::new(n.parse().unwrap(), false).boxed())
        }
        ["status", code] => {
            let mut response = Response::new(full("status"));
            *response.status_mut() = StatusCode::from_u16(code.parse().unwrap()).unwrap();
            response
        }
        ["deny"] => {
            let mut response = Response::new(full("denied"));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
        }
        ["hold"] => {
            held.fetch_add(1, SeqCst);
            hold.acquire().await.unwrap().forget();
            Response::new(full("released"))
        }
        ["hop"] => Response::builder()
            .header("connection", "x-private")
            .header("x-private", "secret")
            .header("keep-alive", "timeout=5")
            .header("proxy-connection", "keep-alive")
            .header("x-kept", "yes")
            .body(full("hop"))
            .unwrap(),
        _ => {
            let (parts, body) = request.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let target = parts.uri.to_string();
            seen.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                target: target.clone(),
                version: parts.version,
                headers: parts.headers,
                body: body.clone(),
            });
            Response::new(full(format!("seen {target} {}", body.len())))
        }
    }
}

/// A stream that records what it reads.
struct Recording {
    inner: TcpStream,
    id: usize,
    raw: Arc<Mutex<HashMap<usize, Vec<u8>>>>,
}

impl AsyncRead for Recording {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let new = &buf.filled()[before..];
        // The big transfers are not recorded (only heads and small bodies matter).
        if !new.is_empty() {
            let mut raw = self.raw.lock().unwrap();
            let kept = raw.entry(self.id).or_default();
            if kept.len() < 1 << 20 {
                kept.extend_from_slice(new);
            }
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Recording {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A raw origin: each connection is handed to `behave` (read what it wants, answer or not).
pub async fn raw_origin<F, Fut>(behave: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let behave = Arc::new(behave);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let n = count.fetch_add(1, SeqCst);
            tokio::spawn(behave(stream, n));
        }
    });
    (addr, accepted)
}

/// Reads until the end of a request head (a blank line); what was read.
pub async fn read_head(stream: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    head
}

/// An address where nothing listens (connections refused).
pub async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
