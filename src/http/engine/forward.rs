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

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use hyper::StatusCode;
use tracing::debug;

use super::awaiting::Awaiting;
use super::client::Next;
use super::exchange::InHand;
use super::pool::{Lifetime, ServerConn};
use super::pump::Pump;
use super::send::{ClientFault, Reply, SendFailure, Sent};
use crate::http::h1::BodyReader;
use crate::http::refusal::Refusal;
use crate::http::{Choice, ClientHead, ConnectFailure, ExchangeOutcome, Report, Upstreams};
use crate::net::stream::Stream;

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
    Failed(SendFailure),
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

impl Reply {
    pub(super) fn with<U: Upstreams>(self, conn: ServerConn<U>) -> Answered<U> {
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

/// Why a request got no server's answer.
enum Unanswered {
    /// No server could be reached: none was available, or each candidate failed to connect.
    NoServer,
    /// The broker itself could not connect to a server.
    BrokerFault,
    /// The last server tried failed the request after it was sent.
    Failed(SendFailure),
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// Tries the servers the balancer chooses until one answers, or the broker itself cannot
    /// connect any; else the page that says why. The connection is counted as the balancer's
    /// client first ([`Upstreams::admit`]), or refused with a 503 when the balancer takes no
    /// more.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn forward(mut self) -> impl Future<Output = Next<U>> {
        async move {
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
            let replayable = self.head.body() == crate::http::h1::Body::Empty
                && self.head.method().is_idempotent();
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
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    fn unanswered(mut self, failed: Unanswered) -> impl Future<Output = Next<U>> {
        async move {
            let closes = matches!(&failed, Unanswered::Failed(failure) if failure.close_client);
            let (status, outcome) = match failed {
                Unanswered::NoServer => {
                    (StatusCode::SERVICE_UNAVAILABLE, ExchangeOutcome::NoServer)
                }
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
    }

    /// The answer to a request whose client failed while its body was passed on: a 408 for
    /// a body too slow, a 400 for a malformed one; nothing to a client gone.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn client_failed(mut self, fault: ClientFault) -> impl Future<Output = Next<U>> {
        async move {
            match fault {
                ClientFault::Gone => {
                    self.record.ended(ExchangeOutcome::Incomplete);
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
