//! The query connection on a TCP balancer's port: a client whose first bytes were a query
//! (the TCP client's sniff) is answered here, with hyper (HTTP/1.1, keep-alive), within
//! bounds of its own: a query place (`QUERY_MAX_CONNECTIONS`), a request head's size and
//! time, a connection's age. Who may query is decided first; each request then goes to
//! [`route::answer`].

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::access::{BUSY, refusal};
use super::reply::text;
use super::route;
use crate::balancer::Balancer;
use crate::balancer::rules::places::Place;
use crate::balancer::shared::{Ending, Shared};
use crate::process::os_error::words;

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
    shared: Arc<Shared>,
    balancer: Arc<Balancer>,
    stream: S,
    first: Vec<u8>,
    peer: SocketAddr,
    ending: &Ending,
) {
    tokio::select! {
        _ = ending.cut.cancelled() => {}
        _ = answer_connection(shared, balancer, stream, first, peer, &ending.closing) => {}
    }
}

/// [`serve`] until it is cut.
async fn answer_connection<S: Connection>(
    shared: Arc<Shared>,
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
        refuse(stream, "503 Service Unavailable", BUSY, head_only).await;
        return;
    };
    let mut head = first;
    if !first_head(&mut stream, &mut head, peer).await {
        return;
    }
    let place = Arc::new(place);
    let stream = QueryStream::new(head, stream, Arc::clone(&place));
    answer_requests(shared, balancer, stream, peer, place, closing).await;
}

/// Reads the first request head into `head` within [`HEAD_TIMEOUT`] and the limits, so a
/// request hyper would refuse late is answered at once; `false` when the connection is done
/// (answered 414 or 431, stalled, or gone).
async fn first_head<S: Connection>(stream: &mut S, head: &mut Vec<u8>, peer: SocketAddr) -> bool {
    let (status, body) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(stream, head)).await {
        Ok(Ok(())) => return true,
        Err(_) => {
            debug!(client = %peer, "query request not finished within {HEAD_TIMEOUT:?}; dropped");
            return false;
        }
        Ok(Err(FirstHeadError::Io(e))) => {
            debug!(client = %peer, "query connection ended before its request: {}", words(&e));
            return false;
        }
        Ok(Err(FirstHeadError::LineTooLong)) => ("414 URI Too Long", "request line too long\n"),
        Ok(Err(FirstHeadError::TooLarge)) => (
            "431 Request Header Fields Too Large",
            "request head too large\n",
        ),
    };
    let _ = respond_raw(stream, status, body, false).await;
    false
}

/// Serves the connection's requests with hyper, each answered by [`route::answer`], until the
/// client is done, the broker is closing, the place went to another query, or the connection
/// is [`MAX_QUERY_CONNECTION`] old; then the request in hand is answered, within
/// [`LAST_ANSWER`].
async fn answer_requests<S: Connection>(
    shared: Arc<Shared>,
    balancer: Arc<Balancer>,
    stream: QueryStream<S>,
    peer: SocketAddr,
    place: Arc<Place>,
    closing: &CancellationToken,
) {
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
                    route::answer(&shared, &balancer, peer, &head, None).map(Full::new)
                }
            };
            // The request is read and answered: until the next one comes, the connection
            // may give its place up to another query.
            place.idle();
            async move { Ok::<_, Infallible>(response) }
        })
    };
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(true)
        // A client may shut its sending side once its request is out (`nc -q`, shell health
        // checks): it still gets its answer.
        .half_close(true)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(stream), service);
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

/// Why the first request head was not read: too long a line (414), too large a head (431),
/// or the connection failed or ended.
enum FirstHeadError {
    LineTooLong,
    TooLarge,
    Io(io::Error),
}

/// Reads until the end of the first request head (a blank line), within the limits.
async fn read_head<S: Connection>(
    stream: &mut S,
    head: &mut Vec<u8>,
) -> Result<(), FirstHeadError> {
    let mut chunk = [0u8; 2048];
    loop {
        let line_end = find(head, b"\r\n").or_else(|| find(head, b"\n"));
        if line_end.unwrap_or(head.len()) > MAX_REQUEST_LINE {
            return Err(FirstHeadError::LineTooLong);
        }
        if find(head, b"\r\n\r\n").is_some() || find(head, b"\n\n").is_some() {
            return Ok(());
        }
        if head.len() > MAX_HEAD {
            return Err(FirstHeadError::TooLarge);
        }
        let n = stream.read(&mut chunk).await.map_err(FirstHeadError::Io)?;
        if n == 0 {
            return Err(FirstHeadError::Io(io::ErrorKind::UnexpectedEof.into()));
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

/// The client's stream with the bytes already read in front of it. Bytes coming in mark its
/// query place busy; once the place was given to another query, it reads as closed.
struct QueryStream<S> {
    first: Vec<u8>,
    read: usize,
    stream: S,
    place: Arc<Place>,
}

impl<S> QueryStream<S> {
    fn new(first: Vec<u8>, stream: S, place: Arc<Place>) -> Self {
        QueryStream {
            first,
            read: 0,
            stream,
            place,
        }
    }
}

impl<S: Connection> AsyncRead for QueryStream<S> {
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

impl<S: Connection> AsyncWrite for QueryStream<S> {
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
