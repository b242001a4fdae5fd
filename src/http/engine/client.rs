//! A client connection's loop: the idle wait with no buffer held, then each request's work in
//! a boxed future of its own (so the task of an idle connection holds little more than its
//! socket and a timer), until the client closes, a request ends the connection, or the
//! request timeout passes with no head.

use std::cell::RefCell;
use std::future::{pending, poll_fn};
use std::io::{self, IoSlice};
use std::net::IpAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::StatusCode;
use tokio::io::{AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::{info, warn};

use super::Engine;
use super::buffers::Buffer;
use super::ip_text::IpText;
use super::own::{self, AnswerEnding};
use super::pool::ServerConn;
use crate::http::h1::{HeadError, HeadScan, Method, OutHead, RequestHead, Version};
use crate::http::stats::Open;
use crate::http::{
    Choice, Downstream, Exchange, ExchangeOutcome, Protocol, Report, Settings, Tunnel, Upstreams,
};
use crate::net::relay::{Counters, End, relay};
use crate::net::stream::Stream;
use crate::support::budget::{Budget, Claim};

/// What follows a request on its connection.
pub(super) enum Next<U: Upstreams> {
    /// Another request: its bytes, when some came already (pipelined).
    Request(Option<Buffer>),
    /// The connection closes.
    Close,
    /// The connection was upgraded: a tunnel to relay until it ends.
    Tunnel(Box<SwitchedConnection<U>>),
}

/// The client's side of a request: its connection, who it is, and the head's deadline.
pub(super) struct ClientSide<'c, C> {
    pub(super) io: &'c mut C,
    pub(super) peer: Downstream,
    /// The trusted proxy (`HTTP_TRUSTED_PROXIES`) the request came through, when `peer` is
    /// the client its `X-Forwarded-For` named: appended to that chain on the way on.
    pub(super) via: Option<IpAddr>,
    /// The connection's peer as `X-Forwarded-For` says it.
    pub(super) ip: IpText,
    pub(super) closing: &'c CancellationToken,
    /// `HTTP_REQUEST_TIMEOUT` from the connection's start or the last answer's end.
    pub(super) deadline: Pin<&'c mut Sleep>,
}

impl<U: Upstreams> Engine<U> {
    /// Serves one client connection until it closes. Once `closing` is cancelled (a drain),
    /// the connection's next answer says `Connection: close` and the connection closes after
    /// it: the request in hand, or the next one to come within `HTTP_REQUEST_TIMEOUT`, as on
    /// any kept-alive connection. Once `cut` is cancelled, the connection ends at once
    /// (an upgraded one too). `place` is held for the connection's life (what the balancer
    /// counted it in as it was accepted: its client's hold under `MAX_CONNECTIONS_PER_CLIENT`):
    /// taken here rather than by a future around this one, whose copy of the arguments the
    /// idle task would carry twice. What the balancer counts it as later, at its first
    /// request ([`Upstreams::Admission`]), is held here too.
    pub fn serve<C: Stream, P: Send>(
        self: Arc<Self>,
        io: C,
        client: Downstream,
        closing: CancellationToken,
        cut: CancellationToken,
        place: P,
    ) -> impl Future<Output = ()> {
        self.serve_admitted(io, client, closing, cut, place, U::Admission::default())
    }

    /// [`Engine::serve`] for a connection the balancer counted already (`admission`: a TCP
    /// port's query connection, whose place was taken when its first bytes said it was one).
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice (below)
    pub fn serve_admitted<C: Stream, P: Send>(
        self: Arc<Self>,
        mut io: C,
        client: Downstream,
        closing: CancellationToken,
        cut: CancellationToken,
        place: P,
        mut admission: U::Admission,
    ) -> impl Future<Output = ()> {
        // Not an `async fn`: one copies its arguments into the body's own locals, and the
        // task would hold both copies (the sizes: docs/benchmarks.md).
        async move {
            // Held, not used: the place is given back when the connection ends.
            let _place = &place;
            let _open = Open::new(&self.stats, Protocol::of(io.protocol()));
            let first_wait = self.settings.load().request_timeout;
            let mut deadline = pin!(tokio::time::sleep(first_wait));
            let mut cut = pin!(cut.cancelled_owned());
            loop {
                let Some(mut buf) = first_bytes(&mut io, deadline.as_mut(), cut.as_mut()).await
                else {
                    return;
                };
                // The request, then any pipelined after it; the buffer carried from one to the
                // next is never held while the connection idles.
                let upgraded = loop {
                    // The client's parts are made in the statement that moves them into the
                    // boxed exchange, so this future holds none of them across its wait.
                    let exchange = boxed(|| {
                        self.exchange(
                            ClientSide::new(&mut io, client, &closing, deadline.as_mut()),
                            buf,
                            // The settings in force when the request came (a reload meanwhile applies).
                            self.settings.load_full(),
                            &mut admission,
                        )
                    });
                    let next = until_cut(cut.as_mut(), exchange).await;
                    let mut wait = self.settings.load().request_timeout;
                    buf = match next {
                        Some(Next::Request(Some(more))) => more,
                        Some(Next::Request(None)) => {
                            // What the connection holds may be given up while it waits, and
                            // the balancer may bound the wait more tightly.
                            let bound = self.upstreams.waiting(&admission);
                            wait = bound.map_or(wait, |bound| bound.min(wait));
                            deadline.as_mut().reset(Instant::now() + wait);
                            break None;
                        }
                        Some(Next::Tunnel(upgraded)) => break Some(upgraded),
                        Some(Next::Close) | None => return,
                    };
                    deadline.as_mut().reset(Instant::now() + wait);
                };
                if let Some(upgraded) = upgraded {
                    let relay = Box::pin(self.relay_tunnel(&mut io, *upgraded));
                    return until_cut(cut.as_mut(), relay).await.unwrap_or(());
                }
            }
        }
    }
}

impl<U: Upstreams> Engine<U> {
    /// Serves one stream of a connection that carries several (an HTTP/2 stream, whose reads
    /// give its request as HTTP/1.1 bytes ending the connection after it): one exchange, as
    /// any request of a connection, then its upgraded connection relayed when it switched.
    /// `admission` is the stream's share of what its connection holds, counted once for all
    /// its streams ([`Upstreams::stream_admission`]). The connection's cut drops this future.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub fn serve_stream<C: Stream>(
        self: Arc<Self>,
        mut io: C,
        client: Downstream,
        closing: CancellationToken,
        mut admission: U::Admission,
    ) -> impl Future<Output = ()> {
        async move {
            let settings = self.settings.load_full();
            let mut deadline = pin!(tokio::time::sleep(settings.request_timeout));
            let mut buf = Buffer::small();
            let first = poll_fn(|cx| {
                let read = buf.poll_read_from(cx, &mut io);
                if read.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                read.map(|read| matches!(read, Ok(n) if n > 0))
            });
            if !first.await {
                return;
            }
            // Boxed when it starts: the stream's future, moved into its connection's set of
            // streams as it is made, stays a few words until then.
            let client = ClientSide::new(&mut io, client, &closing, deadline.as_mut());
            let next = boxed(|| self.exchange(client, buf, settings, &mut admission)).await;
            if let Next::Tunnel(upgraded) = next {
                Box::pin(self.relay_tunnel(&mut io, *upgraded)).await;
            }
        }
    }
}

impl<U: Upstreams> Engine<U> {
    /// Answers a connection the balancer will not serve now (its client has
    /// `MAX_CONNECTIONS_PER_CLIENT` open) with the 503 page and its `Retry-After`, then
    /// closes it. The first request's head is waited for, within `HTTP_REQUEST_TIMEOUT`, so
    /// the answer meets a request (a browser shows it, a `HEAD` gets the head alone) and the
    /// close that follows does not reset the connection under it. It ends at once when `cut`
    /// is cancelled.
    pub async fn serve_unavailable<C: Stream>(
        self: Arc<Self>,
        mut io: C,
        client: Downstream,
        cut: CancellationToken,
    ) {
        let settings = self.settings.load_full();
        let mut deadline = pin!(tokio::time::sleep(settings.request_timeout));
        let mut cut = pin!(cut.cancelled_owned());
        let Some(mut buf) = first_bytes(&mut io, deadline.as_mut(), cut.as_mut()).await else {
            return;
        };
        let closing = CancellationToken::new();
        let mut conn = ClientSide::new(&mut io, client, &closing, deadline.as_mut());
        let (version, head_only) = match conn.read_head(&mut buf, &settings).await {
            Ok(head) => (head.version(), head.method() == Method::Head),
            Err(Headless::Refused(_)) => (Version::Http11, false),
            Err(Headless::Gone | Headless::Evicted) => return,
        };
        // Not held while the page is written and the rest lingers.
        drop(buf);
        let ending = AnswerEnding {
            close: true,
            version,
            head_only,
        };
        let retry_after = settings.retry_after.as_secs();
        let page = own::page(
            StatusCode::SERVICE_UNAVAILABLE,
            settings.language,
            retry_after,
            ending,
        );
        let answered = async {
            if conn.write(&page).await {
                conn.linger().await;
            }
        };
        until_cut(cut, pin!(answered)).await;
    }
}

/// The future `make` makes, in a box of its own, allocated first and the future written into
/// it: `Box::pin(future)` builds the future on the stack, then copies all of it into the box
/// (an exchange's some 9 KB, most of it state not used yet: a copy a request), where a future
/// made for a place that exists already is written there in place.
#[inline(always)]
fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let place = Box::new_uninit();
    Box::into_pin(Box::write(place, make()))
}

/// `work` until it is done (`Some` of its output), or until the connection is cut first
/// (`None`; the work is dropped).
fn until_cut<'a, F: Future + Unpin + 'a>(
    mut cut: Pin<&'a mut WaitForCancellationFutureOwned>,
    mut work: F,
) -> impl Future<Output = Option<F::Output>> + 'a {
    poll_fn(move |cx| {
        if cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Pin::new(&mut work).poll(cx).map(Some)
    })
}

/// The first bytes of the next request, in a buffer taken when they came; `None` when the
/// client closed, failed, or sent nothing before `deadline`. Waiting holds no buffer: a
/// socket says when it has bytes; any other stream is read into one given back at once when
/// nothing came.
fn first_bytes<'a, C: Stream>(
    io: &'a mut C,
    mut deadline: Pin<&'a mut Sleep>,
    mut cut: Pin<&'a mut WaitForCancellationFutureOwned>,
) -> impl Future<Output = Option<Buffer>> + 'a {
    poll_fn(move |cx| {
        if cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        if let Some(socket) = io.plain() {
            match socket.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(None),
                Poll::Pending => return deadline.as_mut().poll(cx).map(|()| None),
            }
        }
        let mut buf = Buffer::small();
        match buf.poll_read_from(cx, io) {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(None),
            Poll::Ready(Ok(_)) => Poll::Ready(Some(buf)),
            Poll::Pending => {
                drop(buf);
                deadline.as_mut().poll(cx).map(|()| None)
            }
        }
    })
}

/// Why no request head came.
pub(super) enum Headless {
    /// The client closed, failed, or was too slow: the connection closes without a word.
    Gone,
    /// The head is refused, for this reason.
    Refused(HeadError),
    /// The head was among the oldest still arriving when `HTTP_HEAD_MEMORY` was full: 408,
    /// and the connection closes.
    Evicted,
}

/// A head still arriving, holding a buffer of `size` bytes: claimed in `budget` (or its claim
/// grown); evictions that made room are logged once per episode, and a claim that needed
/// none ends an episode.
fn claim_head(claim: &mut Option<Claim>, budget: &Arc<Budget>, size: usize) {
    let evicted = match claim {
        Some(claim) => claim.grow(size),
        None => {
            let (new, evicted) = budget.claim(size);
            *claim = Some(new);
            evicted
        }
    };
    if evicted == 0 {
        if let Some(refused) = budget.evictions.end() {
            info!(
                "request heads in progress fit HTTP_HEAD_MEMORY again; {refused} were answered \
                 408 while it was full"
            );
        }
        return;
    }
    let mut first = false;
    for _ in 0..evicted {
        first |= budget.evictions.strike();
    }
    if first {
        warn!(
            "HTTP_HEAD_MEMORY is full: requests whose heads are still arriving hold {} MiB; the \
             oldest are answered 408 and closed first (many slow or unfinished heads at once: a \
             flood, or a very slow network)",
            budget.used() >> 20
        );
    }
}

impl<'c, C> ClientSide<'c, C> {
    /// A request's view of its connection: no trusted proxy named another client yet, and
    /// the peer's address written as the request begins.
    fn new(
        io: &'c mut C,
        peer: Downstream,
        closing: &'c CancellationToken,
        deadline: Pin<&'c mut Sleep>,
    ) -> Self {
        ClientSide {
            io,
            peer,
            via: None,
            ip: peer.peer.ip().map_or_else(IpText::none, IpText::of),
            closing,
            deadline,
        }
    }
}

impl<C: Stream> ClientSide<'_, C> {
    /// The request head at the start of `buf`, reading more as it comes (in the large tier
    /// when it outgrows the small one), within the head's deadline, parsed as `settings`
    /// say. A head not whole in its first read claims its buffer in `HTTP_HEAD_MEMORY` until
    /// it is, and gives up ([`Headless::Evicted`]) when the budget evicts it.
    pub(super) async fn read_head(
        &mut self,
        buf: &mut Buffer,
        settings: &Settings,
    ) -> Result<RequestHead, Headless> {
        let (budget, rule) = (&settings.head_memory, settings.host);
        let mut scan = HeadScan::default();
        let mut claim: Option<Claim> = None;
        let mut claimed = 0;
        loop {
            match RequestHead::parse_with(buf.filled_mut(), &mut scan, rule) {
                Ok(Some(head)) => return Ok(head),
                Err(e) => return Err(Headless::Refused(e)),
                Ok(None) => {}
            }
            if buf.is_full() {
                if buf.is_large() {
                    return Err(Headless::Refused(HeadError::HeadTooLarge));
                }
                let small = std::mem::replace(buf, Buffer::small());
                *buf = small.into_large();
            }
            if claimed != buf.size() {
                claimed = buf.size();
                claim_head(&mut claim, budget, claimed);
            }
            let io = &mut *self.io;
            let deadline = &mut self.deadline;
            let claimed = claim.as_ref();
            let read = poll_fn(|cx| {
                if claimed.is_some_and(|c| c.evicted(cx)) {
                    return Poll::Ready(Err(Headless::Evicted));
                }
                match buf.poll_read_from(cx, io) {
                    Poll::Ready(read) => Poll::Ready(Ok(read)),
                    Poll::Pending => deadline.as_mut().poll(cx).map(|()| Err(Headless::Gone)),
                }
            })
            .await?;
            match read {
                Ok(0) => {
                    // Closed mid-head: parsed once more afresh, a fault in it is told (a
                    // client that half-closes after a malformed head gets its page).
                    let mut scan = HeadScan::default();
                    return match RequestHead::parse_with(buf.filled_mut(), &mut scan, rule) {
                        Err(e) => Err(Headless::Refused(e)),
                        _ => Err(Headless::Gone),
                    };
                }
                Ok(_) => {}
                Err(_) => return Err(Headless::Gone),
            }
        }
    }

    /// Writes `bytes` whole; false when the client is gone.
    pub(super) async fn write(&mut self, bytes: &[u8]) -> bool {
        let written = self.io.write_all(bytes).await;
        written.is_ok() && self.flush().await
    }

    /// Sends what the stream holds back (TLS records); false when the client is gone.
    pub(super) async fn flush(&mut self) -> bool {
        self.io.plain().is_some() || self.io.flush().await.is_ok()
    }

    /// Closes the connection after an answer that left bytes of the request unread (an early
    /// answer, a refusal, a timeout): [`linger`].
    pub(super) async fn linger(&mut self) {
        linger(self.io).await;
    }

    /// Closes the connection after an answer that left nothing unread: a TLS stream says
    /// close_notify; a socket's close says the rest.
    pub(super) async fn close(&mut self) {
        if self.io.plain().is_none() {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.io.shutdown()).await;
        }
    }
}

/// Closes a connection after an answer that may have left bytes of the request unread: its
/// sending side is shut, then what the client still sends is read and dropped for a while, so
/// the close does not reset the connection under an answer the client has not read yet
/// (nginx's lingering close). The bytes are read into the worker's one scratch buffer, so a
/// flood of refused clients lingering at once holds no buffer each. The broker's one
/// lingering close: the engine's answers, and the listener's to plain HTTP on a TLS port.
pub async fn linger<C: Stream>(io: &mut C) {
    /// How long the client's last bytes are waited for, and how many are dropped at most.
    const LINGER: Duration = Duration::from_secs(2);
    const MOST: usize = 1 << 20;
    if io.shutdown().await.is_err() {
        return;
    }
    let mut dropped = 0;
    let drained = poll_fn(|cx| {
        while dropped < MOST {
            match ready!(drop_read(cx, io)) {
                Ok(0) | Err(_) => break,
                Ok(n) => dropped += n,
            }
        }
        Poll::Ready(())
    });
    let _ = tokio::time::timeout(LINGER, drained).await;
}

/// Writes `answer` (a whole answer of the broker's own, which closes its connection) within a
/// second, then [`linger`]s: for a connection no engine serves (plain HTTP on a TLS port).
pub async fn answer_and_close<C: Stream>(io: &mut C, answer: &[u8]) {
    let written = async {
        io.write_all(answer).await?;
        io.flush().await
    };
    if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(1), written).await {
        linger(io).await;
    }
}

/// Reads what `io` has and drops it, into the worker's scratch buffer (borrowed for the read
/// alone, never across a wait): how many bytes.
fn drop_read<C: Stream>(cx: &mut Context<'_>, io: &mut C) -> Poll<io::Result<usize>> {
    thread_local! {
        static SCRATCH: RefCell<[u8; 16 * 1024]> = const { RefCell::new([0; 16 * 1024]) };
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let mut read = ReadBuf::new(scratch);
        ready!(Pin::new(&mut *io).poll_read(cx, &mut read))?;
        Poll::Ready(Ok(read.filled().len()))
    })
}

/// Writes `out` (a head over `input`) whole, in as few vectored writes as the stream takes,
/// then what the stream holds back.
pub(super) async fn write_out<W: Stream>(
    to: &mut W,
    out: &mut OutHead,
    input: &[u8],
) -> io::Result<()> {
    poll_fn(|cx| {
        while !out.is_written() {
            let mut slices = [IoSlice::new(&[]); 32];
            let n = out.io_slices(input, &mut slices);
            let written = ready!(Pin::new(&mut *to).poll_write_vectored(cx, &slices[..n]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            out.advance(written);
        }
        if to.plain().is_none() {
            ready!(Pin::new(&mut *to).poll_flush(cx))?;
        }
        Poll::Ready(Ok(()))
    })
    .await
}

/// A connection switched to another protocol: what its relay needs, and nothing of the
/// exchange that agreed to it.
pub(super) struct SwitchedConnection<U: Upstreams> {
    pub(super) conn: ServerConn<U>,
    /// Holds the balancer's lease for the tunnel's life.
    pub(super) choice: Choice<U>,
    /// Behind a trusted proxy, what counts the tunnel for its client under
    /// `MAX_CONNECTIONS_PER_CLIENT`, for the tunnel's life (a direct client's connection is
    /// counted already).
    pub(super) client_hold: Option<U::ClientHold>,
    /// The client's bytes after its request, for the server first.
    pub(super) first: Vec<u8>,
    /// The server's bytes after its `101`, passed on with it.
    pub(super) to_client: u64,
    /// The request that asked for the switch (counted in the figures at its `101`), reported
    /// when the tunnel ends: the access log's line of a WebSocket says how it went.
    pub(super) exchange: Exchange<U::Server>,
    /// `IDLE_TIMEOUT`, if any.
    pub(super) idle: Option<Duration>,
    /// When the `101` was sent on.
    pub(super) started: Instant,
}

/// A tunnel being relayed, and what it moved: reported when it is dropped, however it ends
/// (its relay done, or its future dropped when the connection is cut: then as stopped).
struct Relaying<'e, U: Upstreams> {
    engine: &'e Engine<U>,
    upgraded: SwitchedConnection<U>,
    to_server: AtomicU64,
    to_client: AtomicU64,
    /// How the relay ended, once it did.
    end: Option<End>,
}

impl<U: Upstreams> Drop for Relaying<'_, U> {
    /// The tunnel's end for the balancer (its `connection closed` line), then its request's,
    /// with the tunnel's bytes and duration added: no error when both sides closed, else how
    /// it broke off.
    fn drop(&mut self) {
        let end = self.end.take().unwrap_or(End::Stopped);
        let upgraded = &mut self.upgraded;
        let tunnel = Tunnel {
            client: upgraded.exchange.client,
            server: upgraded.choice.server.clone(),
            to_server: *self.to_server.get_mut(),
            to_client: *self.to_client.get_mut(),
            duration: upgraded.started.elapsed(),
            end,
        };
        self.engine.upstreams.report(Report::Tunnel(&tunnel));
        let exchange = &mut upgraded.exchange;
        exchange.to_server += tunnel.to_server;
        exchange.to_client += tunnel.to_client;
        exchange.duration += tunnel.duration;
        exchange.outcome = match tunnel.end {
            End::Closed(_) => ExchangeOutcome::Served,
            end => ExchangeOutcome::TunnelBroken(end),
        };
        self.engine.upstreams.report(Report::Exchange(exchange));
    }
}

impl<U: Upstreams> Engine<U> {
    /// Relays `upgraded` over `client` (splice between plain sockets) until both sides
    /// closed, one failed, or nothing moved for `IDLE_TIMEOUT`; then reports the tunnel and
    /// its request. The caller drops this future to cut the connection (both are reported
    /// then too, the tunnel as stopped).
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold `upgraded` twice
    pub(super) fn relay_tunnel<'a, C: Stream>(
        &'a self,
        client: &'a mut C,
        upgraded: SwitchedConnection<U>,
    ) -> impl Future<Output = ()> + 'a {
        // Not an `async fn`, and `upgraded` moved once into what reports it and used there
        // in place: either would give its fields a second slot in the future, for the
        // tunnel's life.
        async move {
            let mut relaying = Relaying {
                engine: self,
                to_client: AtomicU64::new(upgraded.to_client),
                upgraded,
                to_server: AtomicU64::new(0),
                end: None,
            };
            let counters = Counters {
                to_server: &relaying.to_server,
                to_client: &relaying.to_client,
            };
            let first = std::mem::take(&mut relaying.upgraded.first);
            let (stream, idle) = (&mut relaying.upgraded.conn.stream, relaying.upgraded.idle);
            let outcome = relay(client, stream, first, counters, idle, pending()).await;
            relaying.end = Some(outcome.end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::http::engine::local::tests::echo_connection;
    use tokio::net::TcpStream;

    #[tokio::test]
    async fn an_idle_connection_holds_its_socket_a_timer_and_a_few_words() {
        let (client, serving) = echo_connection().await;
        let size = std::mem::size_of_val(&serving);
        let parts = [
            ("socket", std::mem::size_of::<TcpStream>()),
            ("timer", std::mem::size_of::<Sleep>()),
            ("cut", std::mem::size_of::<WaitForCancellationFutureOwned>()),
        ];
        // tokio puts a task's future in a cell aligned to 128 bytes, with about 112 bytes of
        // its own (header, scheduler, id, trailer) and the task tracker's 8: 400 bytes or
        // less is a 512-byte cell, a kept-alive idle client under nginx's 0.9 KB.
        assert!(size <= 400, "{size} bytes: {parts:?}");
        drop((serving, client));
    }
}
