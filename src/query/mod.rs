//! `TOTVS_BROKER_QUERY` on each balancer's own port: STATUS, CFG, PING, JSON, METRICS and
//! ServerStatus, served with hyper (HTTP/1.1, keep-alive) to browsers and monitoring scripts.
//!
//! A connection reaches here when [`sniff`] found a query in its first bytes. Queries have
//! their own small limit (`QUERY_MAX_CONNECTIONS`) and timeouts, so slow or never-finished
//! requests cannot use up the broker's descriptors or slow the proxying.

mod json;
mod labels;
mod metrics;
mod page;
pub mod snapshot;
pub mod sniff;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::balancer::{Balancer, QueryPermit};
use crate::config::Config;
use crate::forward::Ending;
use crate::shutdown::Shutdown;
use snapshot::Snapshot;

/// Longest request line accepted (beyond it: 414). TOTVS monitors send short ones.
const MAX_REQUEST_LINE: usize = 8 * 1024;

/// Largest request head accepted (beyond it: 431).
const MAX_HEAD: usize = 16 * 1024;

/// A request head must arrive within this; an idle keep-alive connection is closed after it.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// No query connection lives longer than this, however busy; a browser simply reconnects.
const MAX_QUERY_CONNECTION: Duration = Duration::from_secs(300);

/// What every query may read: the configuration, every balancer (for links between them),
/// the start time, and the shutdown state (for PING).
#[derive(Debug)]
pub struct Context {
    /// The running configuration (swapped by a reload).
    pub config: ArcSwap<Config>,
    /// Every balancer of the process, in configuration order (swapped by a reload).
    pub balancers: ArcSwap<Vec<Arc<Balancer>>>,
    /// When the broker started, wall ms.
    pub started_wall_ms: u64,
    /// Draining state for PING.
    pub shutdown: Shutdown,
}

/// Answers a query connection whose first bytes (`first`) were already read. `place` is the
/// query place taken while its request line came in, if one was. When `ending.closing` is
/// cancelled the request in hand is answered and the connection closed (a refreshing page
/// would keep it open); `ending.cut` ends it at once.
pub async fn serve(
    ctx: Arc<Context>,
    balancer: Arc<Balancer>,
    stream: TcpStream,
    first: Vec<u8>,
    peer: SocketAddr,
    place: Option<QueryPermit>,
    ending: &Ending,
) {
    tokio::select! {
        _ = ending.cut.cancelled() => {}
        _ = answer_connection(ctx, balancer, stream, first, peer, place, &ending.closing) => {}
    }
}

/// [`serve`] until it is cut.
async fn answer_connection(
    ctx: Arc<Context>,
    balancer: Arc<Balancer>,
    mut stream: TcpStream,
    first: Vec<u8>,
    peer: SocketAddr,
    place: Option<QueryPermit>,
    closing: &CancellationToken,
) {
    let Some(_place) = place.or_else(|| balancer.try_take_query()) else {
        let _ = respond_raw(
            &mut stream,
            "503 Service Unavailable",
            "too many queries at once (QUERY_MAX_CONNECTIONS); try again shortly\n",
        )
        .await;
        return;
    };
    let mut head = first;
    match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream, &mut head)).await {
        Err(_) => {
            debug!(client = %peer, "query request not finished within {HEAD_TIMEOUT:?}; dropped");
            return;
        }
        Ok(Err(HeadError::LineTooLong)) => {
            let _ = respond_raw(&mut stream, "414 URI Too Long", "request line too long\n").await;
            return;
        }
        Ok(Err(HeadError::TooLarge)) => {
            let _ = respond_raw(
                &mut stream,
                "431 Request Header Fields Too Large",
                "request head too large\n",
            )
            .await;
            return;
        }
        Ok(Err(HeadError::Io(e))) => {
            debug!(client = %peer, "query connection ended before its request: {}", crate::os_error::words(&e));
            return;
        }
        Ok(Ok(())) => {}
    }
    let allowed = balancer
        .pool()
        .config
        .query
        .allow
        .iter()
        .any(|c| c.contains(peer.ip()));
    let service = service_fn(move |request: Request<Incoming>| {
        let response = answer(&ctx, &balancer, peer, allowed, &request);
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(Prefixed::new(head, stream)), service);
    let answering = async {
        let mut connection = std::pin::pin!(connection);
        tokio::select! {
            // The connection first: its request is read already, and hyper closes an idle
            // connection at once when told to shut down before it has seen one.
            biased;
            _ = connection.as_mut() => return,
            _ = closing.cancelled() => connection.as_mut().graceful_shutdown(),
        }
        let _ = connection.await;
    };
    let _ = tokio::time::timeout(MAX_QUERY_CONNECTION, answering).await;
}

/// Samples each server's active connections once a minute (for the STATUS chart) until
/// `stop` is cancelled.
pub async fn sample_every_minute(balancer: Arc<Balancer>, stop: CancellationToken) {
    loop {
        for server in &balancer.pool().servers {
            server.sample();
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
}

enum HeadError {
    LineTooLong,
    TooLarge,
    Io(io::Error),
}

/// Reads until the end of the first request head (a blank line), within the limits.
async fn read_head(stream: &mut TcpStream, head: &mut Vec<u8>) -> Result<(), HeadError> {
    let mut chunk = [0u8; 2048];
    loop {
        let line_end = find(head, b"\r\n").or_else(|| find(head, b"\n"));
        if line_end.unwrap_or(head.len()) > MAX_REQUEST_LINE {
            return Err(HeadError::LineTooLong);
        }
        if find(head, b"\r\n\r\n").is_some() || find(head, b"\n\n").is_some() {
            return Ok(());
        }
        if head.len() > MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        let n = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        head.extend_from_slice(&chunk[..n]);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A minimal response for a request hyper never sees (too long, too many queries).
async fn respond_raw(stream: &mut TcpStream, status: &str, body: &str) -> io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The commands, for the 404 answer.
const COMMANDS: &str = "Commands (after /TOTVS_BROKER_QUERY/, any case):\n  \
    STATUS                      the status page (HTML; ?refresh=N reloads every N seconds)\n  \
    CFG                         the effective configuration (HTML)\n  \
    PING                        200 while accepting clients, 503 while shutting down\n  \
    JSON                        the status for scripts\n  \
    METRICS                     Prometheus metrics\n  \
    SERVERSTATUS/<host>:<port>  one server and its quarantine history (HTML)\n\
    /TOTVS_BROKER_QUERY alone answers HTML to browsers and JSON to everyone else.\n";

/// Routes one request to its answer.
fn answer(
    ctx: &Context,
    balancer: &Balancer,
    peer: SocketAddr,
    allowed: bool,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are answered here\n".into(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    if !allowed {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "403 Forbidden: {} is not in QUERY_ALLOW of [{}]\n",
                peer.ip(),
                balancer.pool().config.kind.section()
            ),
        );
    }
    let path = request.uri().path();
    let Some(rest) = strip_prefix_ignore_case(path, "/TOTVS_BROKER_QUERY") else {
        return text(StatusCode::NOT_FOUND, COMMANDS.into());
    };
    let rest = rest.trim_start_matches('/');
    let (command, argument) = rest.split_once('/').unwrap_or((rest, ""));
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(host_name)
        .unwrap_or_else(|| "localhost".into());
    let snapshot = || {
        let others = ctx
            .balancers
            .load()
            .iter()
            .filter(|b| !std::ptr::eq(b.as_ref(), balancer))
            .map(|b| {
                let pool = b.pool();
                (pool.config.kind, pool.config.listen)
            })
            .collect();
        Snapshot::take(
            balancer,
            ctx.config.load().general.language,
            ctx.started_wall_ms,
            peer,
            ctx.shutdown.is_draining(),
            others,
        )
    };
    match command.to_ascii_uppercase().as_str() {
        "" if wants_html(request) => html(page::status(&snapshot(), &host, None)),
        "" | "JSON" => body(
            StatusCode::OK,
            "application/json",
            json::render(&snapshot()),
        ),
        "STATUS" => html(page::status(&snapshot(), &host, refresh(request))),
        "CFG" => html(page::config(&snapshot(), &ctx.config.load(), &host)),
        "PING" if ctx.shutdown.is_draining() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "DRAINING: appbroker is shutting down and will stop accepting clients\n".into(),
        ),
        "PING" => text(
            StatusCode::OK,
            "OK: appbroker is accepting clients\n".into(),
        ),
        "METRICS" => body(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(&snapshot()),
        ),
        "SERVERSTATUS" => {
            let snap = snapshot();
            match snap.server(argument.trim_end_matches('/')) {
                Some(server) => html(page::server(&snap, server, &host)),
                None => text(
                    StatusCode::NOT_FOUND,
                    format!("no server {argument} in [{}]\n", snap.kind.section()),
                ),
            }
        }
        _ => text(StatusCode::NOT_FOUND, COMMANDS.into()),
    }
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// The host part of a `Host` header (`broker:5000` -> `broker`, `[::1]:5000` -> `::1`).
fn host_name(value: &str) -> String {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("localhost").to_string();
    }
    value.split(':').next().unwrap_or("localhost").to_string()
}

/// A browser asks for HTML; scripts and monitors (no Accept, `*/*`, JSON) get JSON.
fn wants_html(request: &Request<Incoming>) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"))
}

/// `?refresh=N`, 1 to 3600 seconds.
fn refresh(request: &Request<Incoming>) -> Option<u32> {
    request.uri().query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        let seconds = value.parse::<u32>().ok()?;
        (key.eq_ignore_ascii_case("refresh") && (1..=3600).contains(&seconds)).then_some(seconds)
    })
}

fn html(page: String) -> Response<Full<Bytes>> {
    body(StatusCode::OK, "text/html; charset=utf-8", page)
}

fn text(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    body(status, "text/plain; charset=utf-8", message)
}

fn body(status: StatusCode, content_type: &'static str, content: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(content)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The client's stream with the bytes already read in front of it.
struct Prefixed {
    first: Vec<u8>,
    read: usize,
    stream: TcpStream,
}

impl Prefixed {
    fn new(first: Vec<u8>, stream: TcpStream) -> Self {
        Prefixed {
            first,
            read: 0,
            stream,
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read < this.first.len() {
            let n = (this.first.len() - this.read).min(buf.remaining());
            buf.put_slice(&this.first[this.read..this.read + n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert_eq!(host_name("broker:5000"), "broker");
        assert_eq!(host_name("[::1]:5000"), "::1");
        assert_eq!(host_name("10.0.0.1"), "10.0.0.1");
    }

    #[test]
    fn prefix_ignores_case() {
        assert_eq!(
            strip_prefix_ignore_case("/totvs_broker_query/ping", "/TOTVS_BROKER_QUERY"),
            Some("/ping")
        );
        assert_eq!(
            strip_prefix_ignore_case("/other", "/TOTVS_BROKER_QUERY"),
            None
        );
    }
}
