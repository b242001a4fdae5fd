//! One request in hand: its head read, its way decided (the balancer's own answer, a
//! refusal, the broker's answer as the last recipient, or on to a server), and its record
//! for the access log and the figures, reported once whichever way it ends (its future
//! dropped too, when the client's connection is cut).

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use tokio::time::Instant;

use super::Engine;
use super::buffers::Buffer;
use super::client::{ClientSide, Headless, Next};
use super::own::{self, AnswerEnding, CLOSING};
use crate::http::h1::{Body, FieldName, HeadError, Method, RequestHead};
use crate::http::refusal::Refusal;
use crate::http::{
    ClientAddr, ClientHead, Exchange, ExchangeOutcome, Protocol, Report, Settings, Upstreams,
};
use crate::net::stream::Stream;

/// A request in hand: the client's side, its buffer (the head, then the body as it passes,
/// then what the client sent after), the head parsed, the settings it is served with, its
/// record.
pub(super) struct InHand<'e, C, U: Upstreams> {
    pub(super) engine: &'e Engine<U>,
    pub(super) client: ClientSide<'e, C>,
    pub(super) buf: Buffer,
    pub(super) head: RequestHead,
    pub(super) settings: Arc<Settings>,
    pub(super) record: ExchangeRecord<'e, U>,
    /// Where the request's body ended in the buffer, once it was read whole: the next
    /// request, if any came, starts there.
    pub(super) body_end: Option<usize>,
    /// How the balancer counts the connection ([`Upstreams::Admission`]).
    pub(super) admission: &'e mut U::Admission,
}

impl<U: Upstreams> Engine<U> {
    /// One request on `client`'s connection, from its first bytes in `buf` to its answer's
    /// end; what follows it.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn exchange<C: Stream>(
        &self,
        mut client: ClientSide<'_, C>,
        mut buf: Buffer,
        settings: Arc<Settings>,
        admission: &mut U::Admission,
    ) -> impl Future<Output = Next<U>> {
        async move {
            let head = match client.read_head(&mut buf, &settings).await {
                Ok(head) => head,
                Err(Headless::Gone) => return Next::Close,
                Err(Headless::Refused(error)) => {
                    return self.refuse_head(client, buf, error, &settings).await;
                }
                Err(Headless::Evicted) => return self.evicted(client, buf, &settings).await,
            };
            let proxied = client.peer.is_trusted_proxy(&settings.trusted_proxies);
            (client.peer, client.via) =
                client
                    .peer
                    .behind(&settings.trusted_proxies, &head, buf.filled());
            let protocol = Protocol::of(client.io.protocol());
            let record = ExchangeRecord::new(self, client.peer.peer, protocol, &head, buf.filled());
            let request = InHand {
                engine: self,
                client,
                buf,
                head,
                settings,
                record,
                body_end: None,
                admission,
            };
            // Held until the answer's end: the future returns once it is written.
            let hold = match proxied.then(|| self.upstreams.hold_client(&request.client.peer)) {
                // Boxed: the rare way's state would otherwise widen every request's future.
                Some(None) => return Box::pin(request.client_limited()).await,
                hold => hold.flatten(),
            };
            match request.route().await {
                // A tunnel stays its client's for its whole life: the hold goes with it.
                Next::Tunnel(mut upgraded) => {
                    upgraded.client_hold = hold;
                    Next::Tunnel(upgraded)
                }
                next => next,
            }
        }
    }

    /// The 408 of a head `HTTP_HEAD_MEMORY` evicted; the connection closes after it.
    async fn evicted<C: Stream>(
        &self,
        client: ClientSide<'_, C>,
        buf: Buffer,
        settings: &Settings,
    ) -> Next<U> {
        let status = StatusCode::REQUEST_TIMEOUT;
        let page = own::page(status, settings.language, 0, CLOSING);
        self.close_with(client, buf, status, &page).await
    }

    /// The page for a head the core refused; the connection closes after it.
    async fn refuse_head<C: Stream>(
        &self,
        client: ClientSide<'_, C>,
        buf: Buffer,
        error: HeadError,
        settings: &Settings,
    ) -> Next<U> {
        let refusal = Refusal::of_head(error, buf.filled());
        let page = own::refused(refusal, settings.language, CLOSING);
        self.close_with(client, buf, refusal.status(), &page).await
    }

    /// Reports a head refused with `status` (from what was read of it), writes `page` and
    /// lingers: the connection ends. The head's buffer is not held while the page is written
    /// and the rest lingers: a flood of heads too large would hold 64 KiB each, and an evicted
    /// head's budget freed it already.
    async fn close_with<C: Stream>(
        &self,
        mut client: ClientSide<'_, C>,
        buf: Buffer,
        status: StatusCode,
        page: &[u8],
    ) -> Next<U> {
        let protocol = Protocol::of(client.io.protocol());
        if let Some(mut record) =
            ExchangeRecord::of_line(self, client.peer.peer, protocol, buf.filled())
        {
            record.exchange.outcome = ExchangeOutcome::Refused;
            record.answered(status);
            record.report();
        }
        drop(buf);
        if client.write(page).await {
            client.linger().await;
        }
        Next::Close
    }
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// The request's way: the balancer's own answer, a refusal (any other request on a front
    /// balancer's check), the broker's answer as its last recipient, or on to a server.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    fn route(self) -> impl Future<Output = Next<U>> {
        async move {
            let view = ClientHead::new(&self.head, self.buf.filled());
            if self.engine.upstreams.intercepts(view.path_and_query()) {
                // Boxed: the balancer's answer may await, and its state would otherwise widen
                // every request's future.
                return Box::pin(self.intercepted()).await;
            }
            if self.client.peer.check {
                return self.refuse(Refusal::FrontCheck).await;
            }
            match self.head.method() {
                Method::Connect => return self.refuse(Refusal::Connect).await,
                Method::Trace => return self.refuse(Refusal::Trace).await,
                Method::Options if max_forwards(&view) == Some(0) => {
                    let ending = self.own_ending();
                    return self
                        .local(own::options(ending), StatusCode::OK, ending)
                        .await;
                }
                _ => {}
            }
            self.forward().await
        }
    }

    /// How an answer of the broker's own to this request ends: kept alive when the client
    /// wants it, the request has no body (none is read for it), and no drain is on.
    pub(super) fn own_ending(&self) -> AnswerEnding {
        let keep = self.head.keep_alive()
            && self.head.body() == Body::Empty
            && !self.client.closing.is_cancelled();
        AnswerEnding {
            close: !keep,
            version: self.head.version(),
            head_only: self.head.method() == Method::Head,
        }
    }

    /// An answer of the balancer's or the broker's own (`bytes`, of `status`), ending as
    /// `ending` says.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn local(
        mut self,
        bytes: Vec<u8>,
        status: StatusCode,
        ending: AnswerEnding,
    ) -> impl Future<Output = Next<U>> {
        async move {
            self.record.exchange.outcome = ExchangeOutcome::Local;
            self.record.answered(status);
            self.record.report();
            let written = self.client.write(&bytes).await;
            if written && !ending.close {
                let end = self.head.len();
                return self.next(end);
            }
            self.closed(written, false).await
        }
    }

    /// The 503 (with `Retry-After`) of a request whose client, behind a trusted proxy, has
    /// its fill of `MAX_CONNECTIONS_PER_CLIENT`: the proxy's connection goes on when the
    /// request had no body and the proxy wants it kept, as after any page of the broker's.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    fn client_limited(mut self) -> impl Future<Output = Next<U>> {
        async move {
            self.record.exchange.outcome = ExchangeOutcome::Refused;
            let next = (self.head.body() == Body::Empty).then(|| self.head.len());
            self.page(StatusCode::SERVICE_UNAVAILABLE, next, false)
                .await
        }
    }

    /// The page of a request the broker refused; the connection closes after it (the
    /// request's framing may be in doubt).
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn refuse(mut self, refusal: Refusal) -> impl Future<Output = Next<U>> {
        async move {
            self.record.exchange.outcome = ExchangeOutcome::Refused;
            self.record.answered(refusal.status());
            let ending = AnswerEnding {
                close: true,
                ..self.own_ending()
            };
            let page = own::refused(refusal, self.settings.language, ending);
            self.record.report();
            let written = self.client.write(&page).await;
            self.closed(written, false).await
        }
    }

    /// The broker's page for `status` (503, 502, 504, 408): the connection goes on with the
    /// next request from byte `next` of the buffer on, when one is given (the client wants
    /// it, its request was read whole, no drain is on), else it closes (`body_read`: the
    /// request's body was read whole, so nothing needs to be waited out).
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn page(
        mut self,
        status: StatusCode,
        next: Option<usize>,
        body_read: bool,
    ) -> impl Future<Output = Next<U>> {
        async move {
            self.record.answered(status);
            let next =
                next.filter(|_| self.head.keep_alive() && !self.client.closing.is_cancelled());
            let ending = AnswerEnding {
                close: next.is_none(),
                ..self.own_ending()
            };
            let retry_after = self.settings.retry_after.as_secs();
            let page = own::page(status, self.settings.language, retry_after, ending);
            self.record.report();
            let written = self.client.write(&page).await;
            match next {
                Some(end) if written => self.next(end),
                _ => self.closed(written, body_read).await,
            }
        }
    }

    /// The next request on this connection: what the client sent after this one (from `end`
    /// in the buffer), or nothing yet (the buffer goes back to the pool).
    pub(super) fn next(self, end: usize) -> Next<U> {
        let InHand { mut buf, .. } = self;
        buf.consume(end);
        if buf.len() == 0 {
            return Next::Request(None);
        }
        Next::Request(Some(buf))
    }

    /// The connection closes after an answer (`written`: it went whole); when the request's
    /// body may not have been read whole, lingering so the close does not reset the answer
    /// away.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn closed(self, written: bool, body_read: bool) -> impl Future<Output = Next<U>> {
        async move {
            let InHand {
                mut client,
                buf,
                head,
                record,
                ..
            } = self;
            drop((buf, record));
            if written && !(body_read || head.body() == Body::Empty) {
                client.linger().await;
            } else if written {
                client.close().await;
            }
            Next::Close
        }
    }
}

/// The request's `Max-Forwards`, when it has one line and that is a number.
pub(super) fn max_forwards(request: &ClientHead<'_>) -> Option<u64> {
    let mut lines = request.values(FieldName::MaxForwards);
    let (Some(value), None) = (lines.next(), lines.next()) else {
        return None;
    };
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// What is accounted once a request is finished with, whichever way: the access log's
/// exchange and the counters. Reported when dropped (its future too, when the client's
/// connection is cut).
pub(super) struct ExchangeRecord<'e, U: Upstreams> {
    engine: &'e Engine<U>,
    pub(super) exchange: Exchange<U::Server>,
    started: Instant,
    reported: bool,
}

impl<'e, U: Upstreams> ExchangeRecord<'e, U> {
    /// The record of `head` (read from `buf`) from `client`, in `protocol`, from now on.
    fn new(
        engine: &'e Engine<U>,
        client: ClientAddr,
        protocol: Protocol,
        head: &RequestHead,
        buf: &[u8],
    ) -> Self {
        let mut record =
            ExchangeRecord::of(engine, client, head.method_bytes(buf), head.target(buf));
        record.exchange.protocol = protocol;
        record
    }

    /// The record of a head refused before it was parsed, when its request line says a
    /// method and a target.
    fn of_line(
        engine: &'e Engine<U>,
        client: ClientAddr,
        protocol: Protocol,
        buf: &[u8],
    ) -> Option<Self> {
        let line = buf
            .split(|&b| b == b'\n')
            .find(|line| !line.is_empty() && *line != b"\r")?;
        let mut words = line.split(|&b| b == b' ');
        let (method, target) = (words.next()?, words.next()?);
        hyper::Method::from_bytes(method).ok()?;
        let mut record = ExchangeRecord::of(engine, client, method, target);
        record.exchange.protocol = protocol;
        Some(record)
    }

    fn of(engine: &'e Engine<U>, client: ClientAddr, method: &[u8], target: &[u8]) -> Self {
        ExchangeRecord {
            engine,
            exchange: Exchange {
                method: hyper::Method::from_bytes(method).unwrap_or_default(),
                uri: String::from_utf8_lossy(target).into_owned(),
                ..blank(client)
            },
            started: Instant::now(),
            reported: false,
        }
    }

    /// The client is sent an answer of `status`.
    pub(super) fn answered(&mut self, status: StatusCode) {
        self.exchange.status = Some(status);
    }

    /// The exchange ends as `outcome` says, reported when the record is dropped: a call, not
    /// an assignment to a field of a record dropped right after, which the compiler takes
    /// for a value never read.
    pub(super) fn ended(&mut self, outcome: ExchangeOutcome) {
        self.exchange.outcome = outcome;
    }

    /// The client is sent an answer whose status code is `code`.
    pub(super) fn answered_code(&mut self, code: u16) {
        self.exchange.status = StatusCode::from_u16(code).ok();
    }
}

impl<U: Upstreams> ExchangeRecord<'_, U> {
    /// The request was answered `101` and becomes a tunnel: counted in the figures now (the
    /// duration histogram keeps its time to the 101, so hour-long WebSockets do not skew it),
    /// and handed over, to be reported to the balancer when the tunnel ends, with the
    /// tunnel's bytes and its whole duration (the access line of a WebSocket says how it
    /// went, not that it was switched).
    pub(super) fn upgraded(mut self) -> Exchange<U::Server> {
        self.reported = true;
        let exchange = &mut self.exchange;
        exchange.duration = self.started.elapsed();
        exchange.outcome = ExchangeOutcome::Served;
        self.engine.stats.finished(
            exchange.protocol,
            exchange.status,
            exchange.duration,
            &exchange.outcome,
        );
        let client = exchange.client;
        std::mem::replace(exchange, blank(client))
    }
}

/// An exchange of `client` with nothing in it yet: no allocation.
fn blank<S>(client: ClientAddr) -> Exchange<S> {
    Exchange {
        client,
        protocol: Protocol::Http1,
        method: hyper::Method::default(),
        uri: String::new(),
        status: None,
        server: None,
        to_server: 0,
        to_client: 0,
        duration: Duration::ZERO,
        outcome: ExchangeOutcome::Incomplete,
    }
}

impl<U: Upstreams> ExchangeRecord<'_, U> {
    /// Counts and reports the exchange as it stands, once: as soon as its answer is known
    /// whole (before its last bytes are written, so a client that reads them and asks for
    /// the figures finds the request counted), or when the record is dropped.
    pub(super) fn report(&mut self) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        let exchange = &mut self.exchange;
        exchange.duration = self.started.elapsed();
        if exchange.status.is_none() {
            exchange.outcome = ExchangeOutcome::Incomplete;
        }
        self.engine.stats.finished(
            exchange.protocol,
            exchange.status,
            exchange.duration,
            &exchange.outcome,
        );
        self.engine.upstreams.report(Report::Exchange(exchange));
    }
}

impl<U: Upstreams> Drop for ExchangeRecord<'_, U> {
    fn drop(&mut self) {
        self.report();
    }
}
