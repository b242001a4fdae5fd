//! One request's tries: the servers the balancer chooses, in turn, each over a pooled
//! connection of this worker or a new one; the head rewritten for the server and sent with
//! the body's first bytes in one write, the rest of the body passed on while the server is
//! watched for an early answer, and the answer's head awaited; the request sent again where
//! that is safe (once on a new connection when a pooled one turns out closed by its server;
//! on the next server with `HTTP_RETRY_IDEMPOTENT`), else the broker's page.
//!
//! A connect failure is reported for quarantine by the balancer's dialer and the next server
//! chosen, whatever the method (nothing reached the server); one that is the broker's own
//! (out of descriptors, say) is answered 503 at once, since no other server can be connected
//! either.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;

use hyper::StatusCode;
use tracing::debug;

use super::awaiting::{Awaiting, Heard, MOST_INTERIM_BYTES, MOST_INTERIM_HEADS};
use super::client::{IpText, Next, write_out};
use super::exchange::{InHand, max_forwards};
use super::pool::{Lifetime, ServerConn};
use super::pump::{Pump, PumpError, Silence};
use crate::http::h1::{
    Asked, BodyReader, Editor, FieldName, Forwarded, HeadError, Method, OutHead, Span, ToServer,
};
use crate::http::refusal::Refusal;
use crate::http::{Choice, ClientHead, ConnectFailure, ExchangeOutcome, Report, Upstreams};
use crate::net::stream::Stream;
use crate::process::os_error::words;

/// How long a server that says neither `100 Continue` nor a final status is waited for before
/// the client is told to send its body anyway (curl waits 1 s too): it may be a server that
/// ignores `Expect`.
const EXPECT_WAIT: Duration = Duration::from_secs(1);

/// How a try on one server went.
// The answered try is the common one, and the enum lives in the request's boxed future
// already: boxing its answer would allocate once more per request for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Tried<U: Upstreams> {
    /// The final answer's head arrived.
    Answered(Answered<U>),
    /// Nothing reached the server (reported as a connect failure): the next server may be
    /// tried, whatever the request.
    NotSent,
    /// No connection could be made for the broker's own reasons (reported): no other server
    /// can be connected now either.
    BrokerFault,
    /// The request (or part of it) was sent and no usable answer came.
    Failed(Failure),
    /// The client's side failed while its body was passed on.
    Client(ClientFault),
}

/// A server's answer, its head read.
pub(super) struct Answered<U: Upstreams> {
    pub(super) conn: ServerConn<U>,
    pub(super) awaiting: Awaiting,
    pub(super) head: crate::http::h1::ResponseHead,
    /// The request's body, still being passed on (the server answered before it was sent
    /// whole): `None` when it went whole, or was given up after a final status to `Expect`.
    pub(super) upload: Option<Pump>,
    /// The request went whole to the server before its answer began.
    pub(super) request_sent: bool,
    /// Request body bytes passed on.
    pub(super) to_server: u64,
}

/// A request that got no answer.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) error: String,
    /// Nothing of the request was written.
    unsent: bool,
    /// Some byte of an answer arrived.
    answered: bool,
    /// The server stayed silent past the response timeout.
    pub(super) timeout: bool,
    /// The client's connection closes after the page (the server flooded it with interim
    /// answers: what else it sent is in doubt).
    close_client: bool,
}

/// How the client's side failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientFault {
    /// It closed, or its connection failed, before its request was whole.
    Gone,
    /// Its body stopped coming for `HTTP_BODY_TIMEOUT`.
    Timeout,
    /// Its body is malformed, or ended before its framed end.
    Body,
}

/// Why a request got no server's answer.
enum Unanswered {
    /// No server could be reached: none was available, or each candidate failed to connect.
    NoServer,
    /// The broker itself could not connect to a server.
    BrokerFault,
    /// The last server tried failed the request after it was sent.
    Failed(Failure),
}

/// The upgrade a request asks for, as `HTTP_UPGRADE_PROTOCOLS` allows it.
#[derive(Debug, Clone, Copy, Default)]
struct Offer {
    /// Some protocol offered is allowed: the upgrade goes on.
    goes: bool,
    /// Some protocol offered is not: `Upgrade` is said anew with the allowed ones only.
    narrowed: bool,
    /// `h2c` is among the allowed ones.
    h2c: bool,
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// Tries the servers the balancer chooses until one answers, or the broker itself cannot
    /// connect any; else the page that says why. The connection is counted as the balancer's
    /// client first ([`Upstreams::admit`]), or refused with a 503 when the balancer takes no
    /// more.
    pub(super) async fn forward(mut self) -> Next<U> {
        let probe = Pump::new(BodyReader::new(self.head.body()), true, self.head.len());
        self.body_end = match probe.check_ahead(self.buf.filled()) {
            Ok(end) => end,
            Err(_) => {
                self.record.exchange.outcome = ExchangeOutcome::ClientFailed;
                return self.refuse(Refusal::Body).await;
            }
        };
        if !self
            .engine
            .upstreams
            .admit(&self.client.peer, self.admission)
        {
            // No client place is left: the connection closes after the page.
            self.record.exchange.outcome = ExchangeOutcome::Refused;
            return self
                .page(StatusCode::SERVICE_UNAVAILABLE, None, false)
                .await;
        }
        let replayable =
            self.head.body() == crate::http::h1::Body::Empty && self.head.method().is_idempotent();
        // The servers tried and failed, for the next choice: none on the common way (the
        // first server answers), so no allocation there.
        let mut tried: Vec<U::Server> = Vec::new();
        let mut failed = Unanswered::NoServer;
        while let Some(choice) = self.choose(&tried) {
            self.record.exchange.server = Some(choice.server.clone());
            let outcome = self.try_server(&choice, replayable).await;
            if matches!(outcome, Tried::NotSent | Tried::Failed(_)) {
                tried.push(choice.server.clone());
            }
            match outcome {
                Tried::Answered(answered) => return self.answer(answered, choice).await,
                Tried::NotSent => {}
                Tried::BrokerFault => {
                    failed = Unanswered::BrokerFault;
                    break;
                }
                Tried::Client(fault) => return self.client_failed(fault).await,
                Tried::Failed(failure) => {
                    debug!(client = %self.client.peer.peer, server = %choice.server, error = %failure.error, "request failed after it was sent");
                    let retry = self.settings.retry_idempotent
                        && replayable
                        && !failure.answered
                        && !failure.timeout;
                    failed = Unanswered::Failed(failure);
                    if !retry {
                        break;
                    }
                    self.engine.stats.retried_next.fetch_add(1, Relaxed);
                }
            }
        }
        self.unanswered(failed).await
    }

    /// The balancer's choice for this request, none of `tried`.
    fn choose(&self, tried: &[U::Server]) -> Option<Choice<U>> {
        let view = ClientHead::new(&self.head, self.buf.filled());
        self.engine
            .upstreams
            .choose(&view, &self.client.peer, tried)
    }

    /// The page for a request no server answered; the connection goes on when the request's
    /// body was read whole.
    async fn unanswered(mut self, failed: Unanswered) -> Next<U> {
        let closes = matches!(&failed, Unanswered::Failed(failure) if failure.close_client);
        let (status, outcome) = match failed {
            Unanswered::NoServer => (StatusCode::SERVICE_UNAVAILABLE, ExchangeOutcome::NoServer),
            Unanswered::BrokerFault => (
                StatusCode::SERVICE_UNAVAILABLE,
                ExchangeOutcome::BrokerFault,
            ),
            Unanswered::Failed(failure) if failure.timeout => {
                (StatusCode::GATEWAY_TIMEOUT, ExchangeOutcome::ServerTimeout)
            }
            Unanswered::Failed(failure) => (
                StatusCode::BAD_GATEWAY,
                ExchangeOutcome::ServerFailed(failure.error),
            ),
        };
        self.record.exchange.outcome = outcome;
        let body_end = self.body_end;
        let next = body_end.filter(|_| !closes);
        self.page(status, next, body_end.is_some()).await
    }

    /// The answer to a request whose client failed while its body was passed on: a 408 for
    /// a body too slow, a 400 for a malformed one; nothing to a client gone.
    pub(super) async fn client_failed(mut self, fault: ClientFault) -> Next<U> {
        match fault {
            ClientFault::Gone => {
                self.record.exchange.outcome = ExchangeOutcome::Incomplete;
                Next::Close
            }
            ClientFault::Timeout => {
                self.record.exchange.outcome = ExchangeOutcome::ClientTimeout;
                self.page(StatusCode::REQUEST_TIMEOUT, None, false).await
            }
            ClientFault::Body => {
                self.record.exchange.outcome = ExchangeOutcome::ClientFailed;
                self.refuse(Refusal::Body).await
            }
        }
    }

    /// Sends the request to `server`: on a pooled connection or a fresh one, and once more
    /// on a fresh one when a pooled connection turns out closed by the server.
    async fn try_server(&mut self, choice: &Choice<U>, replayable: bool) -> Tried<U> {
        let server = &choice.server;
        let idle_timeout = self.settings.idle_timeout;
        let owner = self.engine.upstreams.connection_owner(&self.client.peer);
        let mut conn = match self.engine.pool.take(server, idle_timeout, owner) {
            Some(conn) => conn,
            None => match self.dial(server).await {
                Ok(conn) => conn,
                Err(undialed) => return undialed,
            },
        };
        let mut stale_retried = false;
        loop {
            let failure = match self.send(&mut conn.stream, server).await {
                Sent::Answered(answered) => return Tried::Answered(answered.with(conn)),
                Sent::Client(fault) => return Tried::Client(fault),
                Sent::Failed(failure) => failure,
            };
            let stale = conn.reused
                && !stale_retried
                && !failure.answered
                && !failure.timeout
                && (failure.unsent || replayable);
            if stale {
                stale_retried = true;
                self.engine.stats.retried_stale.fetch_add(1, Relaxed);
                debug!(server = %server, error = %failure.error, "pooled connection closed by the server as it was reused; sending again on a new one");
                conn = match self.dial(server).await {
                    Ok(conn) => conn,
                    Err(undialed) => return undialed,
                };
                continue;
            }
            if failure.unsent && !conn.reused {
                // A fresh connection the server closed before taking the request: nothing
                // reached it, like a refused connect.
                self.engine.upstreams.report(Report::ConnectFailed {
                    server,
                    client: self.client.peer.peer,
                    error: &failure.error,
                });
                return Tried::NotSent;
            }
            return Tried::Failed(failure);
        }
    }

    /// A new connection to `server` for this request; else how the try ends, its failure
    /// reported by the balancer's dialer: [`Tried::NotSent`], or [`Tried::BrokerFault`] when
    /// no server can be connected now.
    async fn dial(&self, server: &U::Server) -> Result<ServerConn<U>, Tried<U>> {
        let upstreams = &self.engine.upstreams;
        // Boxed: a dialer's future (a TLS handshake's) is large, and only a new connection
        // needs it.
        match Box::pin(upstreams.connect(server, &self.client.peer)).await {
            Ok(stream) => {
                let figures = self.engine.pool.figures(server);
                let lifetime = Lifetime::opened(Arc::clone(upstreams), server.clone(), figures);
                Ok(ServerConn {
                    stream,
                    _lifetime: lifetime,
                    reused: false,
                    owner: upstreams.connection_owner(&self.client.peer),
                })
            }
            Err(error) if !error.try_next() => {
                debug!(server = %server, error = %error, "connect failed for the broker's own reasons; no other server tried");
                Err(Tried::BrokerFault)
            }
            Err(error) => {
                debug!(server = %server, error = %error, "connect failed; next server");
                Err(Tried::NotSent)
            }
        }
    }
}

/// How a request sent on one connection went.
#[allow(clippy::large_enum_variant)] // as `Tried`
enum Sent {
    Answered(Reply),
    Failed(Failure),
    Client(ClientFault),
}

/// An answer's head, before its connection is joined to it.
struct Reply {
    awaiting: Awaiting,
    head: crate::http::h1::ResponseHead,
    upload: Option<Pump>,
    request_sent: bool,
    to_server: u64,
}

impl Reply {
    fn with<U: Upstreams>(self, conn: ServerConn<U>) -> Answered<U> {
        Answered {
            conn,
            awaiting: self.awaiting,
            head: self.head,
            upload: self.upload,
            request_sent: self.request_sent,
            to_server: self.to_server,
        }
    }
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// Sends the request on `server` (its head, its body) and waits for the answer's head;
    /// `to` is the server, whose `host:port` a request without a `Host` is given.
    async fn send(&mut self, server: &mut U::Stream, to: &U::Server) -> Sent {
        let host = match self.head.host(self.buf.filled()) {
            Some(_) => String::new(),
            None => to.to_string(),
        };
        let (mut out, asked, mut upload) = self.request_out(&host);
        let expects = self.head.expects_continue(self.buf.filled());
        let whole = out.remaining();
        if let Err(e) = write_out(server, &mut out, self.buf.filled()).await {
            return Sent::Failed(Failure {
                error: words(&e),
                unsent: out.remaining() == whole,
                answered: false,
                timeout: false,
                close_client: false,
            });
        }
        let mut awaiting = Awaiting::new(asked, self.head.version());
        if upload.body_read() {
            self.body_end = Some(upload.at());
        } else {
            match self
                .upload(server, &mut upload, &mut awaiting, expects)
                .await
            {
                Uploaded::Sent(end) => self.body_end = Some(end),
                Uploaded::Early(head) => {
                    // A final status to `Expect: 100-continue`: no body follows it.
                    let to_server = upload.moved;
                    let upload = (!expects).then_some(upload);
                    return Sent::Answered(Reply {
                        awaiting,
                        head,
                        upload,
                        request_sent: false,
                        to_server,
                    });
                }
                Uploaded::Failed(failure) => return Sent::Failed(failure),
                Uploaded::Client(fault) => {
                    // The access log says what of the body was read before it broke off.
                    self.record.exchange.to_server = upload.moved;
                    return Sent::Client(fault);
                }
            }
        }
        let to_server = upload.moved;
        match self.await_head(server, &mut awaiting).await {
            Ok(head) => Sent::Answered(Reply {
                awaiting,
                head,
                upload: None,
                request_sent: true,
                to_server,
            }),
            Err(sent) => sent,
        }
    }
}

/// How the request's body went, while the server was watched.
enum Uploaded {
    /// Sent whole; the body ended there in the buffer.
    Sent(usize),
    /// The server gave its final answer first.
    Early(crate::http::h1::ResponseHead),
    Failed(Failure),
    Client(ClientFault),
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// The head for the server this try goes to (`server`: its `host:port`, the `Host` of a
    /// request that named none), with the body's first bytes; what the request asks, and the
    /// body's pump from after those bytes.
    fn request_out(&self, server: &str) -> (OutHead, Asked, Pump) {
        let (head, buf) = (&self.head, self.buf.filled());
        let offer = offer(head, buf, &self.settings.upgrade_protocols);
        // The connection's peer, as written when the request began; a client a trusted proxy
        // named for this request is written here, and an unknown one is named to no one.
        let named = self
            .client
            .via
            .map(|_| self.client.peer.peer.ip().map(IpText::of));
        let client = match &named {
            None => Some(&self.client.ip),
            Some(named) => named.as_ref(),
        };
        let how = ToServer {
            forwarded: self.settings.forwarded_headers.then(|| Forwarded {
                client: client.map(IpText::as_bytes),
                peer: self.client.ip.as_bytes(),
                https: self.client.peer.tls,
            }),
            upgrade: offer.goes,
            host: server.as_bytes(),
            http2_settings: offer.h2c,
        };
        let mut editor = head.to_server(buf, &how);
        if offer.goes && offer.narrowed {
            narrow_upgrade(head, buf, &self.settings.upgrade_protocols, &mut editor);
        }
        let view = ClientHead::new(head, buf);
        count_down_max_forwards(&view, &mut editor);
        self.engine.upstreams.rewrite(&view, &mut editor);
        let mut out = head.write(buf, editor);
        let mut pump = Pump::new(BodyReader::new(head.body()), true, head.len());
        let run_end = pump.first_run(buf);
        out.append_input(Span::between(head.len(), run_end));
        (out, head.asked(&how), pump)
    }

    /// Passes the body on while the server is watched: an answer may come before the body is
    /// whole (the server refused it, or answers as it reads). Interim answers go to the
    /// client as they come; with `Expect: 100-continue`, the client is told to send its body
    /// by the broker itself when the server says nothing for [`EXPECT_WAIT`].
    async fn upload(
        &mut self,
        server: &mut U::Stream,
        pump: &mut Pump,
        awaiting: &mut Awaiting,
        expects: bool,
    ) -> Uploaded {
        let mut silence = Silence::new(self.settings.body_timeout);
        let mut expect_wait = expects.then(|| Box::pin(tokio::time::sleep(EXPECT_WAIT)));
        let (client, buf) = (&mut *self.client.io, &mut self.buf);
        let spliced = &self.engine.stats.spliced;
        poll_fn(|cx| {
            if let Some(wait) = expect_wait.as_mut()
                && wait.as_mut().poll(cx).is_ready()
            {
                if pump.moved == 0 && !awaiting.heard {
                    awaiting.say_continue();
                }
                expect_wait = None;
            }
            match awaiting.poll_head(cx, server, client) {
                Poll::Ready(Ok(Heard::Final(head))) => return Poll::Ready(Uploaded::Early(head)),
                Poll::Ready(Ok(heard)) => {
                    return Poll::Ready(Uploaded::Failed(failed(heard, awaiting)));
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Uploaded::Client(ClientFault::Gone)),
                Poll::Pending => {}
            }
            match pump.poll(cx, buf, client, server, spliced) {
                Poll::Ready(Ok(end)) => return Poll::Ready(Uploaded::Sent(end)),
                Poll::Ready(Err(PumpError::Read(e))) => {
                    debug!(error = %e, "the client's connection failed within its body");
                    return Poll::Ready(Uploaded::Client(ClientFault::Gone));
                }
                Poll::Ready(Err(PumpError::Body(e))) => {
                    debug!(error = %e, "the client's body is refused");
                    return Poll::Ready(Uploaded::Client(ClientFault::Body));
                }
                Poll::Ready(Err(PumpError::Write(e))) => {
                    return Poll::Ready(Uploaded::Failed(Failure {
                        error: words(&e),
                        unsent: false,
                        answered: awaiting.heard,
                        timeout: false,
                        close_client: false,
                    }));
                }
                Poll::Pending => {}
            }
            if silence.expired(cx, pump.reading, pump.progress) {
                return Poll::Ready(Uploaded::Client(ClientFault::Timeout));
            }
            Poll::Pending
        })
        .await
    }

    /// The final answer's head, once the whole request was sent: within
    /// `HTTP_RESPONSE_TIMEOUT`, interim answers passed on meanwhile. The client is watched
    /// too: one that closes has gone away (a browser tab closed), and its request is dropped,
    /// which closes its server connection, as nginx does; what it sends meanwhile is kept
    /// (a pipelined request).
    async fn await_head(
        &mut self,
        server: &mut U::Stream,
        awaiting: &mut Awaiting,
    ) -> Result<crate::http::h1::ResponseHead, Sent> {
        let timeout = self.settings.response_timeout;
        let mut deadline = pin!(tokio::time::sleep(timeout));
        let (client, buf) = (&mut *self.client.io, &mut self.buf);
        poll_fn(|cx| {
            match awaiting.poll_head(cx, server, client) {
                Poll::Ready(Ok(Heard::Final(head))) => return Poll::Ready(Ok(head)),
                Poll::Ready(Ok(heard)) => {
                    return Poll::Ready(Err(Sent::Failed(failed(heard, awaiting))));
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Err(Sent::Client(ClientFault::Gone))),
                Poll::Pending => {}
            }
            while !buf.is_full() {
                match buf.poll_read_from(cx, client) {
                    Poll::Ready(Ok(0) | Err(_)) => {
                        return Poll::Ready(Err(Sent::Client(ClientFault::Gone)));
                    }
                    Poll::Ready(Ok(_)) => {}
                    Poll::Pending => break,
                }
            }
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Sent::Failed(Failure {
                    error: format!("no answer within {timeout:?} of the request"),
                    unsent: false,
                    answered: awaiting.heard,
                    timeout: true,
                    close_client: false,
                })));
            }
            Poll::Pending
        })
        .await
    }
}

/// The failure of a server that ended, failed or sent a head the broker does not pass on.
fn failed(heard: Heard, awaiting: &Awaiting) -> Failure {
    let error = match &heard {
        Heard::Final(_) | Heard::Closed => "the server closed the connection".to_string(),
        Heard::Failed(e) => words(e),
        Heard::Bad(HeadError::UnaskedSwitch) => "switched protocols unasked (101)".to_string(),
        Heard::Bad(e) => format!("a malformed answer: {e}"),
        Heard::Flood => format!(
            "more than {MOST_INTERIM_HEADS} interim answers (1xx), or {} KiB of them",
            MOST_INTERIM_BYTES / 1024
        ),
    };
    Failure {
        error,
        unsent: false,
        answered: awaiting.heard,
        timeout: false,
        close_client: matches!(heard, Heard::Flood),
    }
}

/// The upgrade `head` asks for, as `allowed` (`HTTP_UPGRADE_PROTOCOLS`) takes it: a name
/// without `/version` stands for every version of it, in any case.
fn offer(head: &crate::http::h1::RequestHead, buf: &[u8], allowed: &[String]) -> Offer {
    if !head.wants_upgrade() {
        return Offer::default();
    }
    let mut offer = Offer::default();
    for protocol in head.upgrade_protocols(buf) {
        if allowed.iter().any(|a| names(a.as_bytes(), protocol)) {
            offer.goes = true;
            let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
            offer.h2c |= name.eq_ignore_ascii_case(b"h2c");
        } else {
            offer.narrowed = true;
        }
    }
    offer
}

/// Whether the allowed protocol `allowed` names the offered `protocol` (`websocket` names
/// `WebSocket/13`; `h2c/1` names only itself).
fn names(allowed: &[u8], protocol: &[u8]) -> bool {
    let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
    protocol.eq_ignore_ascii_case(allowed)
        || (!allowed.contains(&b'/') && name.eq_ignore_ascii_case(allowed))
}

/// `Upgrade` said anew with the allowed protocols of the offer only.
fn narrow_upgrade(
    head: &crate::http::h1::RequestHead,
    buf: &[u8],
    allowed: &[String],
    editor: &mut Editor,
) {
    let kept: Vec<&[u8]> = head
        .upgrade_protocols(buf)
        .filter(|p| allowed.iter().any(|a| names(a.as_bytes(), p)))
        .collect();
    for id in head.fields().named(FieldName::Upgrade) {
        editor.remove(id);
    }
    let joined = kept.join(&b", "[..]);
    let _ = editor.add(b"Upgrade", &[&joined]);
}

/// An `OPTIONS` with hops left goes on with one less (RFC 9110 §7.6.2).
fn count_down_max_forwards(request: &ClientHead<'_>, editor: &mut Editor) {
    if request.method() != Method::Options {
        return;
    }
    let Some(hops) = max_forwards(request).filter(|&hops| hops > 0) else {
        return;
    };
    if let Some(id) = request.head().fields().named(FieldName::MaxForwards).next() {
        let _ = editor.set(id, &[(hops - 1).to_string().as_bytes()]);
    }
}
