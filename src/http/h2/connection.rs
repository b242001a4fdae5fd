//! One HTTP/2 connection: the `h2` crate's server with the broker's settings, its streams
//! served each as one exchange of the engine, in the connection's own task (no task per
//! stream: a cut drops them all, and the drain waits for the connection's task alone), and
//! the connection's bounds.
//!
//! - **Settings**: `max_header_list_size` 64 KiB (the engine's head; the crate's default is
//!   16 MiB), `HTTP2_MAX_STREAMS` concurrent streams, the stream and connection windows, the
//!   HPACK table at its 4 KiB default, `SETTINGS_ENABLE_CONNECT_PROTOCOL` when WebSocket over
//!   HTTP/2 is on.
//! - **Streams in hand**: a stream the client reset leaves the crate's count at once, while
//!   the engine may still be finishing it; the streams the broker has in hand are bounded
//!   too, by the same `HTTP2_MAX_STREAMS` (a stream past it is refused with
//!   `REFUSED_STREAM`, which a client retries safely). A client's streams in hand are so at
//!   most `HTTP2_MAX_STREAMS` for each connection `MAX_CONNECTIONS_PER_CLIENT` lets it open.
//! - **Rapid reset**: streams the client reset are counted ([`Resets`]); past 1,000 within
//!   10 s the connection ends with `GOAWAY ENHANCE_YOUR_CALM`.
//! - **Idle**: a connection with no stream for `HTTP_REQUEST_TIMEOUT` (and one that has not
//!   sent its preface within it) is closed with `GOAWAY`, as an idle HTTP/1.1 connection is;
//!   with no stream in hand it is held to its balancer's wait for a next request
//!   ([`Upstreams::waiting`]: a query connection's place may go to a new query, its wait is
//!   shorter), and each new stream to what that request would meet ([`Upstreams::resumed`]:
//!   refused once the place went, the connection's last past a query connection's life).
//! - **Drain** (`closing`): `GOAWAY` with the last stream id taken (the crate's graceful
//!   shutdown: a first `GOAWAY` and a `PING`, then the last id once the client answered, so
//!   no stream in flight is lost); the streams in hand finish, a stream past the last id is
//!   refused, which the client may send again elsewhere. **Cut**: everything ends at once.
//! - CONTINUATION floods, HPACK bombs, PING and SETTINGS floods and DATA after `END_STREAM`
//!   are the crate's to refuse (since 0.4.4); the tests send each.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use h2::Reason;
use h2::server::{Builder, SendResponse};
use hyper::http::Request;
use tokio::time::Instant;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::request;
use super::resets::{MOST_RESETS, ResetTally, Resets, WINDOW_SECONDS};
use super::response::websocket_key;
use super::stream::H2Stream;
use crate::http::stats::Open;
use crate::http::{Downstream, Engine, NewStream, Protocol, Settings, Upstreams};
use crate::net::stream::Stream;
use crate::support::throttle::Throttle;

/// The most bytes of header fields a request may have, decoded (`SETTINGS_MAX_HEADER_LIST_SIZE`):
/// the engine's largest head, so an HTTP/2 request is held to what an HTTP/1.1 one is.
const MOST_HEADER_LIST: u32 = 64 * 1024;

/// Each stream's receive window: what a client may send of one request body before the
/// engine takes it (HTTP/2's default, and nginx's).
const STREAM_WINDOW: u32 = 65_535;

/// The connection's receive window: what a client may have sent of all its bodies before the
/// engine takes them. Bounds a connection's buffered request bytes.
const CONNECTION_WINDOW: u32 = 256 * 1024;

/// The most of an answer one stream queues ahead of the socket: a buffer's worth, as an
/// HTTP/1.1 connection holds (the crate's default is 400 KiB, for each of 100 streams).
const SEND_BUFFER: usize = 64 * 1024;

/// One line a second at most for connections ended for their resets.
static CALM_LOG: Throttle = Throttle::new(1000);

/// The connection's server, with the broker's settings.
fn builder(settings: &Settings, websocket: bool) -> Builder {
    let mut builder = Builder::new();
    builder
        .max_header_list_size(MOST_HEADER_LIST)
        .max_concurrent_streams(settings.http2_max_streams)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(SEND_BUFFER)
        // Streams reset before they are accepted: as many as may be open (the crate's 20
        // would cut a browser that cancels a page's requests in one burst); the rapid reset
        // attack is bounded by the broker's own count of resets.
        .max_pending_accept_reset_streams(settings.http2_max_streams.max(20) as usize);
    if websocket {
        builder.enable_connect_protocol();
    }
    builder
}

/// Serves an HTTP/2 connection (TLS with ALPN `h2`) until it closes: each stream one exchange
/// of `engine`'s, as an HTTP/1.1 request is. `place` (the client's hold under
/// `MAX_CONNECTIONS_PER_CLIENT`) is held for the connection's life, and the connection is
/// counted once as the balancer's client, however many streams it carries. `closing` drains
/// it (`GOAWAY`), `cut` ends it at once.
#[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
pub fn serve<U: Upstreams, S: Stream, P: Send + 'static>(
    engine: Arc<Engine<U>>,
    io: S,
    client: Downstream,
    closing: CancellationToken,
    cut: CancellationToken,
    place: P,
) -> impl Future<Output = ()> {
    async move {
        let _place = place;
        connection(engine, io, client, closing, cut, false).await;
    }
}

/// Answers an HTTP/2 connection the balancer will not serve now (its client has
/// `MAX_CONNECTIONS_PER_CLIENT` open), as [`Engine::serve_unavailable`] answers an HTTP/1.1
/// one: its first stream, and those the client sent with it, answered with the 503 page and
/// its `Retry-After`, then `GOAWAY`.
pub fn refuse<U: Upstreams, S: Stream>(
    engine: Arc<Engine<U>>,
    io: S,
    client: Downstream,
    cut: CancellationToken,
) -> impl Future<Output = ()> {
    connection(engine, io, client, CancellationToken::new(), cut, true)
}

/// An HTTP/2 connection, its streams served (or `refusing`, answered 503) until it ends.
async fn connection<U: Upstreams, S: Stream>(
    engine: Arc<Engine<U>>,
    io: S,
    client: Downstream,
    closing: CancellationToken,
    cut: CancellationToken,
    refusing: bool,
) {
    let settings = engine.settings();
    let websocket = settings.http2_websocket
        && settings
            .upgrade_protocols
            .iter()
            .any(|p| p.eq_ignore_ascii_case("websocket"));
    let cut_token = cut.clone();
    let mut cut = pin!(cut.cancelled_owned());
    let handshake = tokio::time::timeout(
        settings.request_timeout,
        builder(&settings, websocket).handshake::<S, Bytes>(io),
    );
    let mut handshake = pin!(handshake);
    let connection = poll_fn(|cx| {
        if cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        handshake.as_mut().poll(cx).map(|done| done.ok()?.ok())
    })
    .await;
    let Some(connection) = connection else {
        return;
    };
    let _open = Open::new(engine.stats(), Protocol::H2);
    let serving = Serving {
        engine: &engine,
        client,
        closing: &closing,
        refusing: refusing.then_some(cut_token),
        websocket,
        stall: settings.body_timeout,
        idle: settings.request_timeout,
        most: settings.http2_max_streams as usize,
    };
    serving.run(connection, cut).await;
}

/// A connection being served: what its streams share.
struct Serving<'a, U: Upstreams> {
    engine: &'a Arc<Engine<U>>,
    client: Downstream,
    closing: &'a CancellationToken,
    /// The connection is refused: each stream is answered 503 (and the cut, for that answer).
    refusing: Option<CancellationToken>,
    /// WebSocket over HTTP/2 is offered.
    websocket: bool,
    /// How long a stream's answer may wait on the client's window.
    stall: Duration,
    /// How long the connection may go without a stream.
    idle: Duration,
    /// The streams in hand at most.
    most: usize,
}

impl<U: Upstreams> Serving<'_, U> {
    /// Accepts and serves streams until the connection ends, or `cut` ends it.
    async fn run<S: Stream>(
        self,
        mut connection: h2::server::Connection<S, Bytes>,
        mut cut: std::pin::Pin<&mut tokio_util::sync::WaitForCancellationFutureOwned>,
    ) {
        let shared = Arc::new(ResetTally::default());
        // The connection's admission, shared by its streams: counted once.
        let admission = Arc::new(Mutex::new(U::Admission::default()));
        let mut streams = FuturesUnordered::new();
        let mut resets = Resets::new(Instant::now());
        let mut idle = pin!(tokio::time::sleep(self.idle));
        let mut draining = pin!(self.closing.cancelled());
        let (mut shutting, mut accepting, mut busy) = (false, true, false);
        poll_fn(|cx| {
            if cut.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            if !shutting && draining.as_mut().poll(cx).is_ready() {
                connection.graceful_shutdown();
                shutting = true;
            }
            loop {
                let mut accepted = false;
                while accepting {
                    match connection.poll_accept(cx) {
                        Poll::Ready(Some(Ok((request, respond)))) => {
                            accepted = true;
                            if streams.len() >= self.most
                                || !self.resumed(&admission, &mut connection, &mut shutting)
                            {
                                refuse_stream(respond);
                                continue;
                            }
                            let serve = self.stream(request, respond, &shared, &admission);
                            streams.push(serve);
                            // Set here too: a stream may end in the poll that took it.
                            busy = true;
                            if self.refusing.is_some() && !shutting {
                                // A refused connection answers what the client sent until
                                // its GOAWAY, as an HTTP/1.1 one answers its first request.
                                connection.graceful_shutdown();
                                shutting = true;
                            }
                        }
                        Poll::Ready(Some(Err(e))) => {
                            debug!(client = %self.client.peer, error = %e, "HTTP/2 connection ended");
                            accepting = false;
                        }
                        Poll::Ready(None) => accepting = false,
                        Poll::Pending => break,
                    }
                }
                while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {
                    self.engine.stats().h2_streams_ended(1);
                }
                if accepting && self.too_many_resets(&shared, &mut resets) {
                    self.calm(&mut connection);
                    // The GOAWAY goes with the connection's next poll.
                    cx.waker().wake_by_ref();
                }
                // Streams that ended or wrote: the connection sends what they queued.
                if !accepted || !accepting {
                    break;
                }
            }
            if !accepting && streams.is_empty() {
                return Poll::Ready(());
            }
            if !streams.is_empty() {
                return Poll::Pending;
            }
            if std::mem::take(&mut busy) {
                // The last stream ended: the idle time starts now.
                idle.as_mut().reset(Instant::now() + self.waiting(&admission));
            }
            self.idled(cx, idle.as_mut(), &mut connection, &mut shutting)
        })
        .await;
        // Cut, or the connection ended with streams still in hand: they end with it.
        self.engine.stats().h2_streams_ended(streams.len() as u64);
    }

    /// Counts the streams reset since last asked: whether the connection has now reset more
    /// than it may.
    fn too_many_resets(&self, shared: &ResetTally, resets: &mut Resets) -> bool {
        let reset = shared.take();
        if reset == 0 {
            return false;
        }
        self.engine.stats().h2_reset(reset);
        resets.add(Instant::now(), reset)
    }

    /// A new stream, held to its balancer's rules as an HTTP/1.1 connection's next request
    /// is ([`Upstreams::resumed`]): false when it is to be refused. The connection ends
    /// (`GOAWAY`) when the balancer says so.
    fn resumed<S: Stream>(
        &self,
        admission: &Mutex<U::Admission>,
        connection: &mut h2::server::Connection<S, Bytes>,
        shutting: &mut bool,
    ) -> bool {
        let held = admission.lock().unwrap_or_else(|p| p.into_inner());
        let new = self.engine.upstreams().resumed(&held);
        if new != NewStream::Serve && !*shutting {
            connection.graceful_shutdown();
            *shutting = true;
        }
        new != NewStream::Refuse
    }

    /// The connection has no stream in hand: what it holds may go to another meanwhile (a
    /// query connection's place), and how long it may idle, bounded as an HTTP/1.1
    /// connection's wait for its next request is ([`Upstreams::waiting`]).
    fn waiting(&self, admission: &Mutex<U::Admission>) -> Duration {
        let held = admission.lock().unwrap_or_else(|p| p.into_inner());
        let bound = self.engine.upstreams().waiting(&held);
        bound.map_or(self.idle, |bound| bound.min(self.idle))
    }

    /// The exchange of one stream, its request written for the engine.
    fn stream(
        &self,
        request: Request<h2::RecvStream>,
        respond: SendResponse<Bytes>,
        shared: &Arc<ResetTally>,
        admission: &Arc<Mutex<U::Admission>>,
    ) -> impl Future<Output = ()> + use<U> {
        self.engine.stats().h2_stream();
        let (parts, recv) = request.into_parts();
        let key = (self.websocket && request::is_websocket(&parts)).then(websocket_key);
        let written = request::written(&parts, recv.is_end_stream(), key.as_deref());
        let stream = H2Stream::new(written, recv, respond, key, self.stall, Arc::clone(shared));
        let engine = Arc::clone(self.engine);
        if let Some(cut) = &self.refusing {
            return Either::Left(engine.serve_unavailable(stream, self.client, cut.clone()));
        }
        let admission = self.engine.upstreams().stream_admission(admission);
        Either::Right(engine.serve_stream(stream, self.client, self.closing.clone(), admission))
    }

    /// A connection without streams: `GOAWAY` once it idled for the idle time, and its end
    /// once it idled as long again after it (the client does not close).
    fn idled<S: Stream>(
        &self,
        cx: &mut std::task::Context<'_>,
        mut idle: std::pin::Pin<&mut tokio::time::Sleep>,
        connection: &mut h2::server::Connection<S, Bytes>,
        shutting: &mut bool,
    ) -> Poll<()> {
        if idle.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if *shutting {
            return Poll::Ready(());
        }
        connection.graceful_shutdown();
        *shutting = true;
        idle.as_mut().reset(Instant::now() + self.idle);
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Ends the connection of a client that reset too many streams.
    fn calm<S: Stream>(&self, connection: &mut h2::server::Connection<S, Bytes>) {
        connection.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
        self.engine.stats().h2_calmed();
        if let Some(suppressed) = CALM_LOG.allow() {
            warn!(
                client = %self.client.peer,
                more_since_last_line = suppressed,
                "an HTTP/2 client reset more than {MOST_RESETS} streams within {WINDOW_SECONDS}s \
                 (the rapid reset attack, or a broken client); its connection is ended with \
                 GOAWAY ENHANCE_YOUR_CALM"
            );
        }
    }
}

/// A stream past those the connection may have in hand: refused, which the client may send
/// again (RFC 9113 §8.7: `REFUSED_STREAM` means it was not processed).
fn refuse_stream(mut respond: SendResponse<Bytes>) {
    respond.send_reset(Reason::REFUSED_STREAM);
}
