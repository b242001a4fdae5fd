//! One request's tries: the servers the balancer chooses, in turn, each over a pooled
//! connection or a new one; the request sent, and sent again where that is safe (once on a
//! new connection when a pooled one turns out closed by its server; on the next server with
//! `retry_idempotent`); and how a try went when no answer came.
//!
//! hyper's low-level `client::conn::http1` is used rather than hyper-util's pooled client:
//! the pool has to be keyed by the balancer's servers (not by URI authority), a connect
//! failure has to reach the balancer's quarantine rather than be retried inside the client,
//! and an upgraded connection has to give back the dialed stream itself (for splice), which
//! the legacy client's boxed connector types hide.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::client::conn::http1 as client;
use hyper::header::{self, HeaderMap};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Proxy;
use super::body::{RequestBody, Upload};
use super::finish::Finish;
use super::idle::{Conn, Traffic};
use super::io::{Lifetime, Upstream};
use crate::http::headers;
use crate::http::{Choice, ConnectFailure, Downstream, Report, Settings, Upstreams};

impl<U: Upstreams> Proxy<U> {
    /// Tries the servers the balancer chooses until one answers, or the broker itself cannot
    /// connect any; else why not: the last failure, or no server reached.
    pub(super) async fn forward(
        self: &Arc<Self>,
        head: &Parts,
        client: Downstream,
        attempt: &mut Attempt,
        settings: &Settings,
        finish: &mut Finish<U>,
    ) -> Result<(Response<Incoming>, Conn, Choice<U>), Unanswered> {
        let mut tried = Vec::new();
        let mut failed = Unanswered::NoServer;
        while let Some(choice) = self.upstreams.choose(head, &client, &tried) {
            let server = &choice.server;
            tried.push(server.clone());
            finish.exchange.server = Some(server.clone());
            if tried.len() == 1 {
                let mut headers = headers::request_headers(head, &client, settings);
                self.upstreams.rewrite(&mut headers);
                attempt.request.headers = headers;
            }
            headers::host_of_server(head, &mut attempt.request.headers, server);
            match self
                .try_server(server, client.peer, attempt, settings, &finish.upload)
                .await
            {
                Tried::Answered(response, conn) => return Ok((response, conn, choice)),
                Tried::NotSent => continue,
                Tried::BrokerFault => return Err(Unanswered::BrokerFault),
                Tried::Failed(failure) => {
                    debug!(client = %client.peer, server = %server, error = %failure.error, "request failed after it was sent");
                    let retry = settings.retry_idempotent
                        && attempt.request.replayable
                        && !finish.upload.clients_fault()
                        && !failure.answered
                        && !failure.timeout;
                    failed = Unanswered::Failed(Box::new(failure));
                    if !retry {
                        break;
                    }
                    self.stats.retried_next.fetch_add(1, Relaxed);
                }
            }
        }
        Err(failed)
    }

    /// Sends the request to `server`: on a pooled connection or a fresh one, and once more
    /// on a fresh one when a pooled connection turns out closed by the server.
    async fn try_server(
        self: &Arc<Self>,
        server: &U::Server,
        client: SocketAddr,
        attempt: &mut Attempt,
        settings: &Settings,
        upload: &Upload,
    ) -> Tried {
        let mut conn = match self.idle.take(server, settings.idle_timeout) {
            Some(conn) => conn,
            None => match self.dial(server, client).await {
                Ok(conn) => conn,
                Err(undialed) => return undialed,
            },
        };
        loop {
            let Some(body) = attempt.take_body() else {
                // Cannot happen: a request without its body is never sent again.
                return Tried::NotSent;
            };
            let request = attempt.request.build(body);
            match send(&mut conn, request, upload, settings.response_timeout).await {
                Ok(response) => return Tried::Answered(response, conn),
                Err(mut failure) => {
                    let unsent = failure.returned.is_some();
                    attempt.body = failure.returned.take().map(Request::into_body);
                    let stale = conn.reused
                        && !attempt.stale_retried
                        && !failure.answered
                        && !failure.timeout
                        && (unsent || attempt.request.replayable);
                    if stale {
                        attempt.stale_retried = true;
                        self.stats.retried_stale.fetch_add(1, Relaxed);
                        debug!(server = %server, error = %failure.error, "pooled connection closed by the server as it was reused; sending again on a new one");
                        conn = match self.dial(server, client).await {
                            Ok(conn) => conn,
                            Err(undialed) => return undialed,
                        };
                        continue;
                    }
                    if unsent {
                        // A fresh connection the server closed before taking the request:
                        // nothing reached it, like a refused connect.
                        self.upstreams.report(Report::ConnectFailed {
                            server,
                            client,
                            error: &failure.error,
                        });
                        return Tried::NotSent;
                    }
                    return Tried::Failed(failure);
                }
            }
        }
    }

    /// A new connection to `server` for `client`'s request; else how the try ends, its
    /// failure reported: [`Tried::NotSent`], or [`Tried::BrokerFault`] when no server can be
    /// connected now.
    async fn dial(self: &Arc<Self>, server: &U::Server, client: SocketAddr) -> Result<Conn, Tried> {
        let stream = match self.upstreams.connect(server, client).await {
            Ok(stream) => stream,
            // The balancer accounted for it (quarantine, or the broker's fault, and its line).
            Err(error) if !error.try_next() => {
                debug!(server = %server, error = %error, "connect failed for the broker's own reasons; no other server tried");
                return Err(Tried::BrokerFault);
            }
            Err(error) => {
                debug!(server = %server, error = %error, "connect failed; next server");
                return Err(Tried::NotSent);
            }
        };
        let traffic = Arc::new(Traffic::default());
        let lifetime = Lifetime::opened(
            Arc::clone(&self.upstreams),
            server.clone(),
            self.idle.figures(server),
        );
        let io = TokioIo::new(Upstream::new(stream, Arc::clone(&traffic), lifetime));
        // An HTTP/1 handshake is local (no byte is exchanged): it fails only if hyper is
        // given a stream it cannot use, which would then be the dialer's fault.
        let (sender, connection) = match client::Builder::new().handshake(io).await {
            Ok(handshake) => handshake,
            Err(e) => {
                self.upstreams.report(Report::ConnectFailed {
                    server,
                    client,
                    error: &e.to_string(),
                });
                return Err(Tried::NotSent);
            }
        };
        let closing = CancellationToken::new();
        let closed = closing.clone();
        tokio::spawn(async move {
            tokio::select! {
                ended = connection.with_upgrades() => {
                    if let Err(e) = ended {
                        debug!(error = %e, "server connection ended");
                    }
                }
                // Dropping hyper's connection closes the socket, whatever it was doing.
                () = closed.cancelled() => {}
            }
        });
        Ok(Conn {
            sender,
            traffic,
            reused: false,
            closer: closing.drop_guard(),
        })
    }
}

/// Methods whose request may be sent twice with the effect of once (RFC 9110 9.2.2).
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The request as it goes to the servers, rebuilt for each try.
struct Outgoing {
    method: Method,
    target: hyper::Uri,
    headers: HeaderMap,
    /// No body and an idempotent method: it may be sent again whatever happened.
    replayable: bool,
    /// `Expect: 100-continue`: cancelled when the server says `100 Continue`.
    continued: Option<CancellationToken>,
}

impl Outgoing {
    fn build(&self, body: RequestBody) -> Request<RequestBody> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.target.clone();
        *request.headers_mut() = self.headers.clone();
        if let Some(continued) = self.continued.clone() {
            hyper::ext::on_informational(&mut request, move |informational| {
                if informational.status() == StatusCode::CONTINUE {
                    continued.cancel();
                }
            });
        }
        request
    }
}

/// One request's tries.
pub(super) struct Attempt {
    request: Outgoing,
    /// The body for the next try: the client's until it is sent, then none.
    body: Option<RequestBody>,
    /// A pooled connection was found closed and the request sent again already.
    stale_retried: bool,
}

impl Attempt {
    /// The request of `head` with `body` (each wait for its next frame bounded by
    /// `body_timeout`), before any server is chosen.
    pub(super) fn new<U: Upstreams>(
        head: &Parts,
        body: Incoming,
        finish: &mut Finish<U>,
        body_timeout: Duration,
    ) -> Attempt {
        let continued = head
            .headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
            .then(CancellationToken::new);
        finish.continued = continued.clone();
        let body = RequestBody::new(
            body,
            Arc::clone(&finish.upload),
            continued.clone(),
            body_timeout,
        );
        Attempt {
            request: Outgoing {
                method: head.method.clone(),
                target: headers::origin_form(&head.uri),
                headers: HeaderMap::new(),
                replayable: body.is_end_stream() && is_idempotent(&head.method),
                continued,
            },
            body: Some(body),
            stale_retried: false,
        }
    }

    /// The body for a try: the client's when it was never sent, an empty one for a request
    /// without a body; `None` when the body went to a server already.
    fn take_body(&mut self) -> Option<RequestBody> {
        match self.body.take() {
            Some(body) if body.untouched() => Some(body),
            _ if self.request.replayable => Some(RequestBody::empty()),
            _ => None,
        }
    }
}

/// How a try on one server went.
enum Tried {
    /// An answer's head arrived.
    Answered(Response<Incoming>, Conn),
    /// Nothing reached the server (reported as a connect failure): the next server may be
    /// tried, whatever the request.
    NotSent,
    /// No connection could be made for the broker's own reasons (reported): no other server
    /// can be connected now either.
    BrokerFault,
    /// The request (or part of it) was sent and no usable answer came.
    Failed(Failure),
}

/// Why a request got no server's answer.
pub(super) enum Unanswered {
    /// No server could be reached: none was available, or each candidate failed to connect.
    NoServer,
    /// The broker itself could not connect to a server (its descriptors, local ports or
    /// memory).
    BrokerFault,
    /// The last server tried failed the request after it was sent (boxed: it carries the
    /// request hyper gave back, and the other variants nothing).
    Failed(Box<Failure>),
}

/// A request that got no answer.
pub(super) struct Failure {
    pub(super) error: String,
    /// The request, when hyper did not send any of it.
    returned: Option<Request<RequestBody>>,
    /// Some byte of an answer arrived.
    answered: bool,
    /// The server stayed silent past the response timeout.
    pub(super) timeout: bool,
}

/// Sends `request` on `conn` and waits for the answer's head, at most `timeout` once the
/// whole request was handed to the connection (`upload`): a long upload, or a slow client's
/// body (bounded by its own timeout), does not count against the server.
async fn send(
    conn: &mut Conn,
    request: Request<RequestBody>,
    upload: &Upload,
    timeout: Duration,
) -> Result<Response<Incoming>, Failure> {
    let before = conn.traffic.read.load(Relaxed);
    let mut sent = pin!(conn.sender.try_send_request(request));
    let outcome = loop {
        if upload.is_finished() {
            break tokio::time::timeout(timeout, sent.as_mut()).await.ok();
        }
        tokio::select! {
            outcome = sent.as_mut() => break Some(outcome),
            () = upload.finished() => {}
        }
    };
    let answered = conn.traffic.read.load(Relaxed) != before;
    match outcome {
        Some(Ok(response)) => Ok(response),
        Some(Err(mut e)) => Err(Failure {
            returned: e.take_message(),
            error: e.into_error().to_string(),
            answered,
            timeout: false,
        }),
        None => Err(Failure {
            error: format!("no answer within {timeout:?} of the request"),
            returned: None,
            answered,
            timeout: true,
        }),
    }
}
