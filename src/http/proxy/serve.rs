//! A client connection served by the engine with hyper, each request sent to the server the
//! balancer chooses over a pooled connection or a fresh one, its answer on its way back.
//!
//! A request's way: refused by the broker ([`headers::refusal`]), answered by it as its last
//! recipient (an `OPTIONS` with `Max-Forwards: 0`), or rewritten; a server chosen; a
//! connection taken from the pool, else dialed (a connect failure is reported for quarantine
//! and the next server chosen, whatever the method: nothing reached the server; a failure
//! that is the broker's own, out of descriptors say, is answered 503 at once, since no other
//! server can be connected either); sent; the answer streamed back, and the connection given
//! back to the pool once both ways finished cleanly: the whole request handed to the
//! connection before its answer ended, and the answer read to its framed end. Any other
//! connection is closed as soon as the engine lets go of it (a server that answered before
//! reading the body, and keeps its connection, would otherwise read the rest of that body,
//! perhaps a request of its own, as the next user's request); the client then gets the
//! answer with `Connection: close`. When a request fails after it was sent:
//! - on a pooled connection that the server closed as it was reused (no byte of an answer,
//!   and either nothing of the request written or a request that may be sent twice: no body,
//!   idempotent method), it is sent once more on a fresh connection, as Go's and hyper-util's
//!   clients do;
//! - with `retry_idempotent`, an idempotent request with no body and no byte of an answer
//!   goes to the next server;
//! - otherwise the client gets a 502 (504 when the server stayed silent past the response
//!   timeout, counted from the whole request sent) for that request only; a client whose
//!   body stalls past the body timeout gets a 408.
//!
//! A drain ends each client connection after its next answer, which says `Connection:
//! close`: no connection is closed while its client may be sending a request (see
//! [`last_answer`]).

use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Proxy;
use super::attempt::{Attempt, Unanswered};
use super::body::ResponseBody;
use super::finish::Finish;
use super::head_errors::{Answers, Counted, HeadErrors};
use super::idle::Conn;
use super::io::Prefixed;
use super::upgrade::{self, Pending};
use crate::http::headers::{self, Refusal};
use crate::http::{Choice, Downstream, ExchangeOutcome, Report, Settings, Upstreams, pages};
use crate::net::stream::Stream;

/// The answer's body as the client gets it.
type Answer<U> = ResponseBody<Finish<U>>;

impl<U: Upstreams> Proxy<U> {
    /// Serves one client connection until it closes: `read_ahead` holds bytes already read
    /// from it, given to the HTTP parser first. Once `closing` is cancelled (a drain), the
    /// connection's next answer says `Connection: close` and the connection closes after it:
    /// the request in hand, or the next one to come, within `HTTP_REQUEST_TIMEOUT` as on any
    /// kept-alive connection (see [`last_answer`]). An upgraded connection goes on until the
    /// caller drops this future.
    pub async fn serve<I>(
        self: Arc<Self>,
        io: I,
        read_ahead: Bytes,
        client: Downstream,
        closing: CancellationToken,
    ) where
        I: Stream,
    {
        let settings = self.settings.load();
        let upgraded: Arc<Mutex<Option<Pending<U>>>> = Arc::default();
        let answers: Arc<Answers> = Arc::default();
        let service = {
            let proxy = Arc::clone(&self);
            let upgraded = Arc::clone(&upgraded);
            let answers = Arc::clone(&answers);
            service_fn(move |request| {
                let proxy = Arc::clone(&proxy);
                let upgraded = Arc::clone(&upgraded);
                let in_hand = answers.given();
                let closing = closing.clone();
                async move {
                    let mut response = proxy.handle(request, client, &upgraded).await;
                    if closing.is_cancelled() {
                        last_answer(&mut response);
                    }
                    Ok::<_, Infallible>(response.map(|body| Counted::new(body, in_hand)))
                }
            })
        };
        let io = HeadErrors::new(Prefixed::new(read_ahead, io), answers, settings.language);
        let connection = server::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(settings.request_timeout)
            .keep_alive(true)
            // A client that closes while its request is in hand has gone away (a browser
            // tab closed): the request is dropped, which closes its server connection, as
            // nginx does. The price: a client that shuts only its sending side after the
            // request (`nc -q`) gets no answer.
            .half_close(false)
            .max_header_size(headers::MAX_HEAD)
            .max_headers(headers::MAX_HEADERS)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        drop(settings);
        if let Err(e) = connection.await {
            debug!(client = %client.peer, error = %e, "HTTP connection ended");
        }
        let pending = upgraded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(pending) = pending {
            let idle = self.settings.load().tunnel_idle_timeout;
            let tunnel = upgrade::tunnel::<U, I>(pending, idle).await;
            self.upstreams.report(Report::Tunnel(&tunnel));
        }
    }

    /// One request, to its answer.
    async fn handle(
        self: &Arc<Self>,
        mut request: Request<Incoming>,
        client: Downstream,
        upgraded: &Mutex<Option<Pending<U>>>,
    ) -> Response<Answer<U>> {
        let settings = self.settings.load_full();
        let upgrade_to = headers::upgrade_to(
            request.version(),
            request.headers(),
            &settings.upgrade_protocols,
        );
        let client_upgrade = upgrade_to.map(|_| hyper::upgrade::on(&mut request));
        let (head, body) = request.into_parts();
        let mut finish = Finish::new(Arc::clone(self), client.peer, &head);
        if let Some(response) = self.upstreams.intercept(&head, &client) {
            finish.exchange.outcome = ExchangeOutcome::Local;
            return local(response, finish);
        }
        if let Some(refusal) = headers::refusal(&head) {
            finish.exchange.outcome = ExchangeOutcome::Refused;
            return self.refuse(refusal, finish, &settings);
        }
        if headers::answered_here(&head) {
            finish.exchange.outcome = ExchangeOutcome::Local;
            return local(headers::options_answer(), finish);
        }
        let mut attempt = Attempt::new(&head, body, &mut finish, settings.body_timeout);
        let failed = match self
            .forward(&head, client, &mut attempt, &settings, &mut finish)
            .await
        {
            Ok((response, conn, choice)) => {
                let upgrade = client_upgrade.map(|client| (client, upgraded));
                return self.answer(response, conn, choice, upgrade, finish, &settings);
            }
            Err(failed) => failed,
        };
        let status = match failed {
            Unanswered::Failed(_) if finish.upload.timed_out.load(Relaxed) => {
                finish.exchange.outcome = ExchangeOutcome::ClientTimeout;
                return self.page(StatusCode::REQUEST_TIMEOUT, finish, &settings, true);
            }
            Unanswered::Failed(_) if finish.upload.failed.load(Relaxed) => {
                finish.exchange.outcome = ExchangeOutcome::ClientFailed;
                return self.refuse(Refusal::Body, finish, &settings);
            }
            Unanswered::Failed(failure) if failure.timeout => {
                finish.exchange.outcome = ExchangeOutcome::ServerTimeout;
                StatusCode::GATEWAY_TIMEOUT
            }
            Unanswered::Failed(failure) => {
                finish.exchange.outcome = ExchangeOutcome::ServerFailed(failure.error);
                StatusCode::BAD_GATEWAY
            }
            Unanswered::NoServer => {
                finish.exchange.outcome = ExchangeOutcome::NoServer;
                StatusCode::SERVICE_UNAVAILABLE
            }
            Unanswered::BrokerFault => {
                finish.exchange.outcome = ExchangeOutcome::BrokerFault;
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        self.page(status, finish, &settings, false)
    }

    /// The server's answer, on its way to the client, with the balancer's headers.
    fn answer(
        self: &Arc<Self>,
        mut response: Response<Incoming>,
        conn: Conn,
        choice: Choice<U>,
        upgrade: Option<(OnUpgrade, &Mutex<Option<Pending<U>>>)>,
        mut finish: Finish<U>,
        settings: &Settings,
    ) -> Response<Answer<U>> {
        let status = response.status();
        let switching = status == StatusCode::SWITCHING_PROTOCOLS;
        if switching && upgrade.is_none() {
            // A 101 to a request that asked for no upgrade: the server is broken.
            finish.exchange.outcome =
                ExchangeOutcome::ServerFailed("switched protocols unasked (101)".into());
            return self.page(StatusCode::BAD_GATEWAY, finish, settings, false);
        }
        let mut lease = Some(choice.lease);
        if let Some((client, slot)) = upgrade.filter(|_| switching) {
            let pending = Pending {
                client,
                server: hyper::upgrade::on(&mut response),
                to: choice.server.clone(),
                peer: finish.exchange.client,
                lease: lease.take(),
            };
            *slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(pending);
            self.stats.upgrades.fetch_add(1, Relaxed);
        }
        let conn = if switching {
            // hyper's connection hands its stream to the upgrade: it must not be closed.
            let _ = conn.closer.disarm();
            None
        } else {
            Some(conn)
        };
        let early = !finish.upload.is_finished();
        if early && finish.continued.is_some() {
            // A final status to an `Expect: 100-continue`: no body follows it.
            finish.upload.abandon();
        }
        let (mut parts, incoming) = response.into_parts();
        headers::response_headers(&mut parts.headers, switching);
        for (name, value) in &choice.response_headers {
            parts.headers.append(name, value.clone());
        }
        if early && !switching {
            // Answered before the request was sent whole: should the answer end first, the
            // rest of the body is not read, so the client's connection cannot carry another
            // request.
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        parts.version = Version::HTTP_11;
        finish.exchange.status = Some(status);
        finish.answered = true;
        finish.conn = conn.map(|conn| (choice.server, conn));
        finish.lease = lease;
        let body = ResponseBody::server(incoming, finish, settings.response_timeout);
        Response::from_parts(parts, body)
    }

    /// The broker's own answer: a short page in the balancer's language.
    fn page(
        &self,
        status: StatusCode,
        finish: Finish<U>,
        settings: &Settings,
        close: bool,
    ) -> Response<Answer<U>> {
        let page = pages::page(status, settings.language);
        self.own_answer(status, page, finish, settings, close)
    }

    /// The broker's answer to a request it refused: what was wrong, in the balancer's
    /// language; nothing more is read from the connection. A 405 says the methods allowed.
    fn refuse(
        &self,
        refusal: Refusal,
        finish: Finish<U>,
        settings: &Settings,
    ) -> Response<Answer<U>> {
        let page = pages::refused(refusal, settings.language);
        let mut answer = self.own_answer(refusal.status(), page, finish, settings, true);
        if refusal == Refusal::Trace {
            let allow = HeaderValue::from_static(headers::ALLOW);
            answer.headers_mut().insert(header::ALLOW, allow);
        }
        answer
    }

    /// An answer of the broker's own with `page` for its body.
    fn own_answer(
        &self,
        status: StatusCode,
        page: Bytes,
        mut finish: Finish<U>,
        settings: &Settings,
        close: bool,
    ) -> Response<Answer<U>> {
        finish.exchange.status = Some(status);
        finish.answered = true;
        let mut response = Response::new(ResponseBody::page(page, finish));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(settings.retry_after.as_secs().max(1)),
            );
        }
        if close {
            // The request's framing is in doubt: nothing more is read from this connection.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// The answer of a connection that drains: it says `Connection: close`, and hyper closes the
/// connection once it is sent (a `101` excepted: its connection becomes the upgrade's).
///
/// hyper's own graceful shutdown is not used: it closes at once a connection that has not
/// read a byte of its first request yet, or that waits kept alive between two requests, and
/// a client sending its request just then (one accepted the instant before the drain, or
/// one reusing its connection) would get no answer at all. Waiting for that request instead
/// costs the drain at most `HTTP_REQUEST_TIMEOUT` (hyper's head timeout, which also bounds
/// a kept-alive connection's silence), within `SHUTDOWN_TIMEOUT`; the only close a client
/// can meet is the one it meets any day when its kept-alive connection times out.
fn last_answer<B>(response: &mut Response<B>) {
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let close = HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, close);
    }
}

/// An answer the balancer gave itself (a query of the status page).
fn local<U: Upstreams>(response: Response<Bytes>, mut finish: Finish<U>) -> Response<Answer<U>> {
    let (parts, page) = response.into_parts();
    finish.exchange.status = Some(parts.status);
    finish.answered = true;
    Response::from_parts(parts, ResponseBody::page(page, finish))
}
