//! `TOTVS_BROKER_QUERY` on each balancer's own port: STATUS, CFG, PING, JSON, METRICS and
//! ServerStatus, served with hyper (HTTP/1.1, keep-alive) to browsers and monitoring scripts.
//!
//! On a TCP balancer a connection reaches here when its first bytes were a query (the TCP
//! client's sniff, [`crate::tcp::sniff`]); there queries have their own small limit
//! (`QUERY_MAX_CONNECTIONS`) and timeouts, so slow or never-finished requests cannot use up
//! the broker's descriptors or slow the proxying. On an HTTP balancer each request is routed
//! here by its path ([`intercept`]), on a connection that is the balancer's client, with the
//! HTTP engine's limits.
//!
//! - [`snapshot`]: one consistent read of a balancer's state, which every answer is rendered
//!   from.
//! - `page`: the HTML pages (STATUS, CFG, one server's detail), pure.
//! - `json`: the JSON answer, a superset of the TOTVS broker's schema, pure.
//! - `metrics`: METRICS, the Prometheus text format, pure.
//! - `labels`: the pages' words in English and Brazilian Portuguese.

mod json;
mod labels;
mod metrics;
mod page;
pub mod snapshot;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::balancer::places::Place;
use crate::balancer::shared::{Ending, Shared};
use crate::balancer::{Balancer, Generation};
use crate::config::Config;
use crate::process::os_error::words;
use snapshot::{HttpFigures, Snapshot, Standing};

/// What a query is answered over: any byte stream (the client's own connection, lent by its
/// task, plain or TLS).
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Connection for S {}

/// Longest request line accepted (beyond it: 414). TOTVS monitors send short ones.
const MAX_REQUEST_LINE: usize = 8 * 1024;

/// Largest request head accepted (beyond it: 431).
const MAX_HEAD: usize = 16 * 1024;

/// A request head must arrive within this; an idle keep-alive connection is closed after it
/// (hyper's header timer starts as soon as it waits for the next request).
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A query connection older than this answers the request in hand and closes, so no one
/// keeps a place for long however busy; a browser or a monitor simply reconnects.
const MAX_QUERY_CONNECTION: Duration = Duration::from_secs(60);

/// How long the answer in hand may take once [`MAX_QUERY_CONNECTION`] is over.
const LAST_ANSWER: Duration = Duration::from_secs(10);

/// After a refusal (403, 503) the broker waits this long at most for the client to close,
/// reading and dropping what it still sends: closing with unread bytes would reset the
/// connection, and a reset can make the client lose the answer it was sent.
const LINGER: Duration = Duration::from_secs(2);

/// Answers a query connection whose first bytes (`first`) were already read. Who may query
/// is decided before anything else, and again at every request (a reload may have changed
/// `QUERY_ALLOW`): a refused client is answered 403 and closed, holding no query place. When
/// `ending.closing` is cancelled the request in hand is answered and the connection closed (a
/// refreshing page would keep it open); `ending.cut` ends it at once.
pub async fn serve<S: Connection>(
    ctx: Arc<Shared>,
    balancer: Arc<Balancer>,
    stream: S,
    first: Vec<u8>,
    peer: SocketAddr,
    ending: &Ending,
) {
    tokio::select! {
        _ = ending.cut.cancelled() => {}
        _ = answer_connection(ctx, balancer, stream, first, peer, &ending.closing) => {}
    }
}

/// [`serve`] until it is cut.
async fn answer_connection<S: Connection>(
    ctx: Arc<Shared>,
    balancer: Arc<Balancer>,
    mut stream: S,
    first: Vec<u8>,
    peer: SocketAddr,
    closing: &CancellationToken,
) {
    let head_only = first.starts_with(b"HEAD ");
    if let Some(refusal) = refusal(&balancer.generation(), peer) {
        debug!(client = %peer, "query refused: {}", refusal.trim_end());
        refuse(stream, "403 Forbidden", &refusal, head_only).await;
        return;
    }
    let Some(place) = balancer.take_query_place() else {
        let busy = "too many queries at once (QUERY_MAX_CONNECTIONS); try again shortly\n";
        refuse(stream, "503 Service Unavailable", busy, head_only).await;
        return;
    };
    let mut head = first;
    match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream, &mut head)).await {
        Err(_) => {
            debug!(client = %peer, "query request not finished within {HEAD_TIMEOUT:?}; dropped");
            return;
        }
        Ok(Err(HeadError::LineTooLong)) => {
            let _ = respond_raw(
                &mut stream,
                "414 URI Too Long",
                "request line too long\n",
                false,
            )
            .await;
            return;
        }
        Ok(Err(HeadError::TooLarge)) => {
            let _ = respond_raw(
                &mut stream,
                "431 Request Header Fields Too Large",
                "request head too large\n",
                false,
            )
            .await;
            return;
        }
        Ok(Err(HeadError::Io(e))) => {
            debug!(client = %peer, "query connection ended before its request: {}", words(&e));
            return;
        }
        Ok(Ok(())) => {}
    }
    let place = Arc::new(place);
    let service = {
        let place = Arc::clone(&place);
        service_fn(move |request: Request<Incoming>| {
            let response = match refusal(&balancer.generation(), peer) {
                Some(refusal) => {
                    let mut response = text(StatusCode::FORBIDDEN, refusal);
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    response.map(Full::new)
                }
                None => {
                    let (head, _) = request.into_parts();
                    answer(&ctx, &balancer, peer, &head, None).map(Full::new)
                }
            };
            // The request is read and answered: until the next one comes, the connection
            // may give its place up to another query.
            place.idle();
            async move { Ok::<_, Infallible>(response) }
        })
    };
    let io = Prefixed::new(head, stream, Arc::clone(&place));
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(true)
        // A client may shut its sending side once its request is out (`nc -q`, shell health
        // checks): it still gets its answer.
        .half_close(true)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    let end = tokio::time::sleep(MAX_QUERY_CONNECTION);
    tokio::select! {
        // The connection first: its request is read already, and hyper closes an idle
        // connection at once when told to shut down before it has seen one.
        biased;
        _ = connection.as_mut() => return,
        _ = closing.cancelled() => {}
        _ = place.given_up() => debug!(client = %peer, "idle query connection closed: its place went to a new query"),
        _ = end => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(LAST_ANSWER, connection).await;
}

/// Why `peer` may not query `pool`'s balancer now (the 403's text), or `None` when it may.
fn refusal(pool: &Generation, peer: SocketAddr) -> Option<String> {
    let query = &pool.config.query;
    let section = pool.config.kind.section();
    if !query.enabled {
        return Some(format!(
            "403 Forbidden: queries are turned off on this port (QUERY_ENABLED=0 in [{section}])\n"
        ));
    }
    if query.allow.iter().any(|c| c.contains(peer.ip())) {
        return None;
    }
    Some(format!(
        "403 Forbidden: {} is not in QUERY_ALLOW of [{section}]\n",
        peer.ip()
    ))
}

/// Answers a query that is not served (403, 503) and closes it: the answer, then the end of
/// the broker's sending side, then whatever the client still sends is read and dropped for up
/// to [`LINGER`], so the answer is not lost to a reset. Holds no query place.
async fn refuse<S: Connection>(mut stream: S, status: &str, body: &str, head_only: bool) {
    if respond_raw(&mut stream, status, body, head_only)
        .await
        .is_err()
    {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

enum HeadError {
    LineTooLong,
    TooLarge,
    Io(io::Error),
}

/// Reads until the end of the first request head (a blank line), within the limits.
async fn read_head<S: Connection>(stream: &mut S, head: &mut Vec<u8>) -> Result<(), HeadError> {
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

/// A minimal response for a request hyper never sees (refused, too long, too many queries);
/// `head_only` for a HEAD request, which gets no body.
async fn respond_raw<S: Connection>(
    stream: &mut S,
    status: &str,
    body: &str,
    head_only: bool,
) -> io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{}",
        body.len(),
        if head_only { "" } else { body }
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The commands, for the 404 answer.
const COMMANDS: &str = "Commands (after /TOTVS_BROKER_QUERY/, any case):\n  \
    STATUS                      the status page (HTML; ?refresh=N reloads every N seconds)\n  \
    CFG                         the effective configuration (HTML)\n  \
    PING                        200 while accepting clients, 503 while shutting down\n  \
    READY                       200 while a client would be served, 503 (and why) otherwise\n  \
    JSON                        the status for scripts\n  \
    METRICS                     Prometheus metrics\n  \
    SERVERSTATUS/<host>:<port>  one server and its quarantine history (HTML)\n\
    /TOTVS_BROKER_QUERY alone answers HTML to browsers and JSON to everyone else.\n";

/// The answer to a request on an HTTP balancer's port when it is a query (its path starts
/// with `/TOTVS_BROKER_QUERY`, in any case, and `QUERY_ENABLED` is on): routed by path, no
/// sniffing, no query place (the connection is the balancer's client). `None` for a request
/// to forward. `http` reads the balancer's HTTP figures, for the pages that show them.
pub fn intercept(
    ctx: &Shared,
    balancer: &Balancer,
    peer: SocketAddr,
    head: &Parts,
    http: impl FnOnce() -> HttpFigures,
) -> Option<Response<Bytes>> {
    let pool = balancer.generation();
    if !pool.config.query.enabled {
        return None;
    }
    strip_prefix_ignore_case(head.uri.path(), "/TOTVS_BROKER_QUERY")?;
    if let Some(refusal) = refusal(&pool, peer) {
        debug!(client = %peer, "query refused: {}", refusal.trim_end());
        return Some(text(StatusCode::FORBIDDEN, refusal));
    }
    Some(answer(ctx, balancer, peer, head, Some(http())))
}

/// Routes one request (from an allowed client) to its answer; `http`: the figures of an HTTP
/// balancer.
fn answer(
    ctx: &Shared,
    balancer: &Balancer,
    peer: SocketAddr,
    request: &Parts,
    http: Option<HttpFigures>,
) -> Response<Bytes> {
    if request.method != Method::GET && request.method != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are answered here\n".into(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let path = request.uri.path();
    let Some(rest) = strip_prefix_ignore_case(path, "/TOTVS_BROKER_QUERY") else {
        return text(StatusCode::NOT_FOUND, COMMANDS.into());
    };
    // `ServerStatus/%5B::1%5D:5000` is `ServerStatus/[::1]:5000`.
    let rest = percent_decode(rest);
    let rest = rest.trim_start_matches('/');
    let (command, argument) = rest.split_once('/').unwrap_or((rest, ""));
    let host = request
        .headers
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
            // A link to a balancer this client may not query would give its address away.
            .filter(|b| refusal(&b.generation(), peer).is_none())
            .map(|b| {
                let pool = b.generation();
                (pool.config.kind, pool.config.listen)
            })
            .collect();
        let mut snapshot = Snapshot::take(
            balancer,
            ctx.config.load().general.language,
            ctx.started_wall_ms,
            peer,
            ctx.shutdown.is_draining(),
            others,
        );
        snapshot.http = http.clone();
        snapshot
    };
    match command.to_ascii_uppercase().as_str() {
        "" if wants_html(request) => html(page::status(&snapshot(), &host, None)),
        "" | "JSON" => body(
            StatusCode::OK,
            "application/json",
            json::render(&snapshot()),
        ),
        "STATUS" => html(page::status(&snapshot(), &host, refresh(request))),
        "CFG" => html(page::config(&snapshot(), &visible_config(ctx, peer), &host)),
        "PING" if ctx.shutdown.is_draining() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "DRAINING: appbroker is shutting down and will stop accepting clients\n".into(),
        ),
        "PING" => text(
            StatusCode::OK,
            "OK: appbroker is accepting clients\n".into(),
        ),
        "READY" => {
            let (ready, why) = readiness(ctx, balancer);
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, why)
        }
        "METRICS" => body(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(&snapshot()),
        ),
        "SERVERSTATUS" => {
            let snap = snapshot();
            match snap.server(argument.trim_end_matches('/')) {
                Some(server) => html(page::server(&snap, server, &host)),
                None => {
                    let known: Vec<&str> = snap
                        .state
                        .servers
                        .iter()
                        .map(|s| s.address.as_str())
                        .collect();
                    let message = format!(
                        "no server {argument} in [{}]; its servers are {}\n",
                        snap.state.kind.section(),
                        known.join(", ")
                    );
                    text(StatusCode::NOT_FOUND, message)
                }
            }
        }
        _ => text(StatusCode::NOT_FOUND, COMMANDS.into()),
    }
}

/// The configuration as `peer` may see it: the sections of the balancers whose `QUERY_ALLOW`
/// admits it, and the file paths (the configuration's, `ConsoleFile`) only when every
/// balancer does, as those belong to the process as a whole.
fn visible_config(ctx: &Shared, peer: SocketAddr) -> Config {
    let mut config = Config::clone(&ctx.config.load());
    let balancers = ctx.balancers.load();
    let may_query = |kind| {
        balancers
            .iter()
            .find(|b| b.kind() == kind)
            .is_some_and(|b| refusal(&b.generation(), peer).is_none())
    };
    let everywhere = config.balancers.iter().all(|b| may_query(b.kind));
    config.balancers.retain(|b| may_query(b.kind));
    if !everywhere {
        let hidden = PathBuf::from(labels::of(config.general.language).hidden);
        config.source = hidden.clone();
        if config.general.console_file.is_some() {
            config.general.console_file = Some(hidden);
        }
    }
    config
}

/// READY: whether a client arriving now would be served (the balancer accepts clients and a
/// server is available to it), and the answer's text saying why, in the pages' language.
fn readiness(ctx: &Shared, balancer: &Balancer) -> (bool, String) {
    let l = labels::of(ctx.config.load().general.language);
    let pool = balancer.generation();
    if ctx.shutdown.is_draining() {
        return (false, format!("NOT READY: {}\n", l.ready_shutting_down));
    }
    let max = pool.config.max_connections;
    if balancer.at_limit(&pool) {
        return (
            false,
            format!("NOT READY: MAX_CONNECTIONS ({max}) {}\n", l.ready_full),
        );
    }
    let servers = balancer.state().servers;
    let total = servers.len();
    let count = |standing| servers.iter().filter(|s| s.state == standing).count();
    let (quarantined, drained) = (count(Standing::Quarantined), count(Standing::Draining));
    let disabled = count(Standing::Disabled);
    let available = total - quarantined - drained - disabled;
    if available == 0 {
        let mut why = Vec::new();
        if quarantined > 0 {
            why.push(format!("{quarantined} {}", l.quarantined));
        }
        if drained > 0 {
            why.push(format!("{drained} {}", l.draining_server));
        }
        if disabled > 0 {
            why.push(format!("{disabled} {}", l.disabled_server));
        }
        return (
            false,
            format!("NOT READY: {} ({})\n", l.ready_no_server, why.join(", ")),
        );
    }
    let (one, many) = l.servers_available;
    let servers = if total == 1 { one } else { many };
    (
        true,
        format!(
            "READY: {available} {} {total} {servers}, {}\n",
            l.of, l.ready_accepting
        ),
    )
}

/// `%XX` escapes of a path decoded; a malformed escape is kept as it is (and then names
/// nothing), and bytes that are not UTF-8 are replaced.
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(hi), Some(lo)) if hex(hi).is_some() && hex(lo).is_some() => {
                out.push((hex(hi).unwrap_or(0) * 16 + hex(lo).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
fn wants_html(request: &Parts) -> bool {
    request
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"))
}

/// `?refresh=N`, 1 to 3600 seconds.
fn refresh(request: &Parts) -> Option<u32> {
    request.uri.query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        let seconds = value.parse::<u32>().ok()?;
        (key.eq_ignore_ascii_case("refresh") && (1..=3600).contains(&seconds)).then_some(seconds)
    })
}

fn html(page: String) -> Response<Bytes> {
    body(StatusCode::OK, "text/html; charset=utf-8", page)
}

fn text(status: StatusCode, message: String) -> Response<Bytes> {
    body(status, "text/plain; charset=utf-8", message)
}

fn body(status: StatusCode, content_type: &'static str, content: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(content));
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

/// The client's stream with the bytes already read in front of it. Bytes coming in mark its
/// query place busy; once the place was given to another query, it reads as closed.
struct Prefixed<S> {
    first: Vec<u8>,
    read: usize,
    stream: S,
    place: Arc<Place>,
}

impl<S> Prefixed<S> {
    fn new(first: Vec<u8>, stream: S, place: Arc<Place>) -> Self {
        Prefixed {
            first,
            read: 0,
            stream,
            place,
        }
    }
}

impl<S: Connection> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read < this.first.len() {
            let n = (this.first.len() - this.read).min(buf.remaining());
            buf.put_slice(&this.first[this.read..this.read + n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        if this.place.is_given_up() {
            return Poll::Ready(Ok(())); // as if the client had closed
        }
        let filled = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(())))
            && buf.filled().len() > filled
            && !this.place.busy()
        {
            // The place went to another query just as a request began: the connection
            // closes, as an idle keep-alive connection may (clients send such a request
            // again on a new connection).
            buf.set_filled(filled);
        }
        polled
    }
}

impl<S: Connection> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
