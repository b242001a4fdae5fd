//! The HTTP engine's test harness: the engine on a real loopback listener, over a test
//! balancer (servers in order, every event recorded), with loopback origin servers (hyper, or
//! raw TCP for what hyper would not send), clients, and bodies of a known pattern that can be
//! checked as they stream.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod scripted;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use appbroker::http::{
    Choice, ConnectFailure, Downstream, Exchange, Proxy, Report, Settings, Tunnel, Upstreams,
};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::HeaderMap;
use hyper::http::request::Parts;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long any awaited condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Waits until `condition` holds, polling; panics with `what` after [`DEADLINE`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An event as the test balancer recorded it.
#[derive(Debug, Clone)]
pub enum Recorded {
    ConnectFailed(SocketAddr, String),
    Opened(SocketAddr),
    Closed(SocketAddr),
    Exchange(Exchange<SocketAddr>),
    Tunnel(Tunnel<SocketAddr>),
}

/// A balancer for tests: its servers in order (the first not tried yet is chosen), headers
/// it adds to every answer, every event kept.
#[derive(Default)]
pub struct TestUpstreams {
    pub servers: Mutex<Vec<SocketAddr>>,
    pub response_headers: Mutex<HeaderMap>,
    pub events: Mutex<Vec<Recorded>>,
    /// Leases held by the engine now: requests in hand and upgraded connections.
    pub leased: Arc<AtomicUsize>,
    /// Every connect fails as the broker's own failure would (out of descriptors).
    pub broker_fault: AtomicBool,
}

/// A lease of the test balancer: counted in `leased` while it lives.
pub struct TestLease(Arc<AtomicUsize>);

impl Drop for TestLease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl TestUpstreams {
    pub fn new(servers: &[SocketAddr]) -> Arc<TestUpstreams> {
        Arc::new(TestUpstreams {
            servers: Mutex::new(servers.to_vec()),
            ..TestUpstreams::default()
        })
    }

    pub fn events(&self) -> Vec<Recorded> {
        self.events.lock().unwrap().clone()
    }

    pub fn exchanges(&self) -> Vec<Exchange<SocketAddr>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::Exchange(x) => Some(x),
                _ => None,
            })
            .collect()
    }

    pub fn tunnels(&self) -> Vec<Tunnel<SocketAddr>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::Tunnel(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    pub fn connect_failures(&self) -> Vec<SocketAddr> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::ConnectFailed(s, _) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Upstream connections opened and closed so far.
    pub fn opened_closed(&self) -> (usize, usize) {
        let events = self.events();
        let opened = events
            .iter()
            .filter(|e| matches!(e, Recorded::Opened(_)))
            .count();
        let closed = events
            .iter()
            .filter(|e| matches!(e, Recorded::Closed(_)))
            .count();
        (opened, closed)
    }
}

/// A failed connect of the test balancer: a server's (the next one is tried), or with
/// [`TestUpstreams::broker_fault`] the broker's own.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct TestConnectError {
    error: std::io::Error,
    brokers: bool,
}

impl ConnectFailure for TestConnectError {
    fn try_next(&self) -> bool {
        !self.brokers
    }
}

impl Upstreams for TestUpstreams {
    type Server = SocketAddr;
    type Lease = TestLease;
    type Stream = TcpStream;
    type ConnectError = TestConnectError;

    fn choose(
        &self,
        _request: &Parts,
        _client: &Downstream,
        tried: &[SocketAddr],
    ) -> Option<Choice<Self>> {
        let servers = self.servers.lock().unwrap();
        let server = servers.iter().find(|s| !tried.contains(s))?;
        self.leased.fetch_add(1, SeqCst);
        Some(Choice {
            server: *server,
            lease: TestLease(Arc::clone(&self.leased)),
            response_headers: self.response_headers.lock().unwrap().clone(),
        })
    }

    /// Accounts for a failed connect itself, as a balancer does.
    fn connect(
        &self,
        server: &SocketAddr,
        _client: SocketAddr,
    ) -> impl Future<Output = Result<TcpStream, TestConnectError>> + Send {
        let server = *server;
        let brokers = self.broker_fault.load(SeqCst);
        async move {
            let connected = if brokers {
                Err(std::io::Error::from_raw_os_error(24)) // EMFILE
            } else {
                tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(server))
                    .await
                    .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut)))
            };
            connected.map_err(|error| {
                let failed = Recorded::ConnectFailed(server, error.to_string());
                self.events.lock().unwrap().push(failed);
                TestConnectError { error, brokers }
            })
        }
    }

    fn report(&self, report: Report<'_, SocketAddr>) {
        let recorded = match report {
            Report::ConnectFailed { server, error, .. } => {
                Recorded::ConnectFailed(*server, error.to_string())
            }
            Report::Opened { server } => Recorded::Opened(*server),
            Report::Closed { server } => Recorded::Closed(*server),
            Report::Exchange(x) => Recorded::Exchange(x.clone()),
            Report::Tunnel(t) => Recorded::Tunnel(t.clone()),
        };
        self.events.lock().unwrap().push(recorded);
    }
}

/// The engine on a loopback port.
pub struct Broker {
    pub addr: SocketAddr,
    pub proxy: Arc<Proxy<TestUpstreams>>,
    pub upstreams: Arc<TestUpstreams>,
    /// Cancelling it asks every connection to finish its request and close.
    pub closing: CancellationToken,
    /// Client connections being served now.
    pub serving: Arc<AtomicUsize>,
}

impl Broker {
    pub async fn start(upstreams: Arc<TestUpstreams>, settings: Settings) -> Broker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let proxy = Proxy::new(Arc::clone(&upstreams), settings);
        let closing = CancellationToken::new();
        let serving = Arc::new(AtomicUsize::new(0));
        {
            let proxy = Arc::clone(&proxy);
            let closing = closing.clone();
            let serving = Arc::clone(&serving);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, peer)) = listener.accept().await else {
                        continue;
                    };
                    let client = Downstream { peer, tls: false };
                    let proxy = Arc::clone(&proxy);
                    let closing = closing.clone();
                    let serving = Arc::clone(&serving);
                    serving.fetch_add(1, SeqCst);
                    tokio::spawn(async move {
                        proxy.serve(stream, Bytes::new(), client, closing).await;
                        serving.fetch_sub(1, SeqCst);
                    });
                }
            });
        }
        Broker {
            addr,
            proxy,
            upstreams,
            closing,
            serving,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// An ini with one `[BALANCE_HTTP]` on `@PORT@` over `servers`, plus `extra` lines in the
/// section. Monitoring is disabled unless `extra` sets it, so tests decide when checks run.
pub fn http_ini(servers: &[SocketAddr], extra: &str) -> String {
    let mut text = String::from(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nQUERY_ALLOW=127.0.0.1\n",
    );
    if !extra.to_ascii_uppercase().contains("MONITORING_TYPE") {
        text.push_str("MONITORING_TYPE=DISABLED\n");
    }
    for line in extra.lines() {
        text.push_str(line);
        text.push('\n');
    }
    for (i, server) in servers.iter().enumerate() {
        text.push_str(&format!(
            "REMOTE_SERVER_{:02}={} {}\n",
            i + 1,
            server.ip(),
            server.port()
        ));
    }
    text
}

/// An address where nothing listens (connections refused).
pub async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

// ---- bodies of a known pattern ------------------------------------------------------------

/// Pattern blocks: 1 MiB of pseudo-random bytes whose first 8 bytes are the block's number,
/// so a lost, repeated or reordered block is seen, not only a changed byte.
pub const BLOCK: usize = 1 << 20;

fn base_block() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..BLOCK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

fn block(n: u64) -> Bytes {
    let mut b = BytesMut::from(base_block());
    b[..8].copy_from_slice(&n.to_le_bytes());
    b.freeze()
}

/// A body of `total` pattern bytes, 1 MiB a frame; `exact` says its length up front
/// (Content-Length), else it goes chunked.
pub struct PatternBody {
    sent: u64,
    total: u64,
    exact: bool,
}

impl PatternBody {
    pub fn new(total: u64, exact: bool) -> PatternBody {
        PatternBody {
            sent: 0,
            total,
            exact,
        }
    }
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent >= self.total {
            return Poll::Ready(None);
        }
        let n = (self.total - self.sent).min(BLOCK as u64);
        let data = block(self.sent / BLOCK as u64).slice(..n as usize);
        self.sent += n;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.total
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.total - self.sent)
        } else {
            SizeHint::default()
        }
    }
}

/// Checks bytes against the pattern as they arrive.
#[derive(Default)]
pub struct PatternCheck {
    pub seen: u64,
    pub bad_at: Option<u64>,
}

impl PatternCheck {
    pub fn feed(&mut self, mut data: &[u8]) {
        let base = base_block();
        while !data.is_empty() {
            let block = self.seen / BLOCK as u64;
            let within = (self.seen % BLOCK as u64) as usize;
            let n = data.len().min(BLOCK - within);
            let (now, rest) = data.split_at(n);
            let header = block.to_le_bytes();
            let ok = now
                .iter()
                .enumerate()
                .take(8usize.saturating_sub(within))
                .all(|(i, b)| *b == header[within + i])
                && {
                    let skip = 8usize.saturating_sub(within).min(n);
                    now[skip..] == base[within + skip..within + n]
                };
            if !ok && self.bad_at.is_none() {
                self.bad_at = Some(self.seen);
            }
            self.seen += n as u64;
            data = rest;
        }
    }
}

/// Reads a whole body through a [`PatternCheck`]: (bytes, first bad offset).
pub async fn check_body<B>(mut body: B) -> (u64, Option<u64>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut check = PatternCheck::default();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("body frame").into_data() {
            check.feed(&data);
        }
    }
    (check.seen, check.bad_at)
}

// ---- origin servers -----------------------------------------------------------------------

pub type OriginBody = BoxBody<Bytes, Infallible>;

pub fn full(text: impl Into<Bytes>) -> OriginBody {
    Full::new(text.into()).boxed()
}

/// A request as an origin server parsed it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub version: hyper::Version,
    pub headers: HeaderMap,
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
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    /// Connections open now.
    pub open: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Raw bytes received, per connection.
    pub raw: Arc<Mutex<HashMap<usize, Vec<u8>>>>,
    hold: Arc<tokio::sync::Semaphore>,
    pub held: Arc<AtomicUsize>,
}

impl Origin {
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

// ---- clients ------------------------------------------------------------------------------

/// A kept-alive client connection to `addr`.
pub async fn client(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<OriginBody> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection.with_upgrades());
    sender
}

/// A request with `host`, ready to send.
pub fn request(
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: OriginBody,
) -> Request<OriginBody> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .body(body)
        .unwrap()
}

/// One GET on a new connection: status, headers, body.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, HeaderMap, Bytes) {
    let mut sender = client(addr).await;
    send(&mut sender, request("GET", addr, path, full(""))).await
}

/// Sends on `sender` and reads the whole answer.
pub async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<OriginBody>,
    request: Request<OriginBody>,
) -> (StatusCode, HeaderMap, Bytes) {
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

pub fn body(text: &'static str) -> OriginBody {
    full(text)
}

/// Sends raw bytes on a new connection and reads until the broker closes it: everything it
/// answered.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the broker did not close the connection");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status lines in `answer` (one per HTTP answer it holds).
pub fn status_lines(answer: &str) -> Vec<&str> {
    answer
        .lines()
        .filter(|l| l.starts_with("HTTP/1."))
        .collect()
}
