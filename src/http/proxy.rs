//! One HTTP balancer's engine: client connections served with hyper, each request sent to
//! the server the balancer chooses over a pooled connection or a fresh one.
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
//!
//! hyper's low-level `client::conn::http1` is used rather than hyper-util's pooled client:
//! the pool has to be keyed by the balancer's servers (not by URI authority), a connect
//! failure has to reach the balancer's quarantine rather than be retried inside the client,
//! and an upgraded connection has to give back the dialed stream itself (for splice), which
//! the legacy client's boxed connector types hide.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1 as client;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::request::Parts;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::body::{Done, Ended, RequestBody, ResponseBody, Upload};
use super::head_errors::{Answers, Counted, HeadErrors};
use super::headers::{self, Refusal};
use super::io::{Lifetime, Prefixed, Upstream};
use super::pool::Traffic;
use super::pool::{Conn, Pool, PoolFigures};
use super::stats::Stats;
use super::upgrade::{self, Pending};
use super::{
    Choice, ConnectFailure, Downstream, Event, Exchange, Outcome, Settings, Upstreams, pages,
};
use crate::net::stream::Stream;

/// The answer's body as the client gets it.
type Answer<U> = ResponseBody<Finish<U>>;

/// An HTTP balancer's engine, shared by all its client connections.
pub struct Proxy<U: Upstreams> {
    upstreams: Arc<U>,
    settings: ArcSwap<Settings>,
    pool: Pool<U::Server>,
    stats: Stats,
}

impl<U: Upstreams> std::fmt::Debug for Proxy<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("settings", &self.settings.load())
            .finish_non_exhaustive()
    }
}

impl<U: Upstreams> Proxy<U> {
    /// The engine for `upstreams`. Within a tokio runtime, a task closes idle connections
    /// past their timeout until the engine is dropped.
    pub fn new(upstreams: Arc<U>, settings: Settings) -> Arc<Proxy<U>> {
        let proxy = Arc::new(Proxy {
            upstreams,
            settings: ArcSwap::from_pointee(settings),
            pool: Pool::new(),
            stats: Stats::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep_idle(Arc::downgrade(&proxy)));
        }
        proxy
    }

    /// The balancer behind the engine.
    pub fn upstreams(&self) -> &Arc<U> {
        &self.upstreams
    }

    /// The settings in force.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// New settings (a reload): requests from now on use them.
    pub fn set_settings(&self, settings: Settings) {
        self.settings.store(Arc::new(settings));
    }

    /// The engine's figures, for METRICS.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Each server's pool figures, for METRICS.
    pub fn pool_figures(&self) -> Vec<(U::Server, PoolFigures)> {
        self.pool.figures_all()
    }

    /// Closes `server`'s idle connections and forgets it (it left the balancer); its busy
    /// ones finish their request and close.
    pub fn forget(&self, server: &U::Server) {
        self.pool.forget(server);
    }

    /// Closes every idle connection (a drain).
    pub fn close_idle(&self) {
        self.pool.sweep(Duration::ZERO);
    }

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
            self.upstreams.report(Event::Tunnel(&tunnel));
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
            finish.exchange.outcome = Outcome::Local;
            return local(response, finish);
        }
        if let Some(refusal) = headers::refusal(&head) {
            finish.exchange.outcome = Outcome::Refused;
            return self.refuse(refusal, finish, &settings);
        }
        if headers::answered_here(&head) {
            finish.exchange.outcome = Outcome::Local;
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
                finish.exchange.outcome = Outcome::ClientTimeout;
                return self.page(StatusCode::REQUEST_TIMEOUT, finish, &settings, true);
            }
            Unanswered::Failed(_) if finish.upload.failed.load(Relaxed) => {
                finish.exchange.outcome = Outcome::ClientFailed;
                return self.refuse(Refusal::Body, finish, &settings);
            }
            Unanswered::Failed(failure) if failure.timeout => {
                finish.exchange.outcome = Outcome::ServerTimeout;
                StatusCode::GATEWAY_TIMEOUT
            }
            Unanswered::Failed(failure) => {
                finish.exchange.outcome = Outcome::ServerFailed(failure.error);
                StatusCode::BAD_GATEWAY
            }
            Unanswered::NoServer => {
                finish.exchange.outcome = Outcome::NoServer;
                StatusCode::SERVICE_UNAVAILABLE
            }
            Unanswered::BrokerFault => {
                finish.exchange.outcome = Outcome::BrokerFault;
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        self.page(status, finish, &settings, false)
    }

    /// Tries the servers the balancer chooses until one answers, or the broker itself cannot
    /// connect any; else why not: the last failure, or no server reached.
    async fn forward(
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
        let mut conn = match self.pool.take(server, settings.idle_timeout) {
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
                        self.upstreams.report(Event::ConnectFailed {
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
            self.pool.figures(server),
        );
        let io = TokioIo::new(Upstream::new(stream, Arc::clone(&traffic), lifetime));
        // An HTTP/1 handshake is local (no byte is exchanged): it fails only if hyper is
        // given a stream it cannot use, which would then be the dialer's fault.
        let (sender, connection) = match client::Builder::new().handshake(io).await {
            Ok(handshake) => handshake,
            Err(e) => {
                self.upstreams.report(Event::ConnectFailed {
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
                Outcome::ServerFailed("switched protocols unasked (101)".into());
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

    /// Gives `conn` back to `server`'s pool once hyper is ready to send on it again (it may
    /// still be flushing the request's last bytes).
    fn give_back(self: Arc<Self>, server: U::Server, mut conn: Conn) {
        conn.reused = true;
        if conn.sender.is_ready() {
            let max_idle = self.settings.load().max_idle;
            self.pool_again(&server, conn, max_idle);
            return;
        }
        if conn.sender.is_closed() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let settings = self.settings.load_full();
            let ready = tokio::time::timeout(settings.idle_timeout, conn.sender.ready()).await;
            if matches!(ready, Ok(Ok(()))) {
                self.pool_again(&server, conn, settings.max_idle);
            }
        });
    }

    /// Puts `conn` in `server`'s pool, or closes it when the server has left the balancer
    /// (its slot, made again by this connection's figures, goes with it).
    fn pool_again(&self, server: &U::Server, conn: Conn, max_idle: usize) {
        if self.upstreams.keeps(server) {
            self.pool.put(server, conn, max_idle);
        } else {
            self.pool.forget(server);
        }
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

/// Closes idle connections past their timeout, every half timeout (10 s at most), until the
/// engine is gone.
async fn sweep_idle<U: Upstreams>(proxy: Weak<Proxy<U>>) {
    loop {
        let every = match proxy.upgrade() {
            Some(proxy) => {
                let idle_timeout = proxy.settings.load().idle_timeout;
                proxy.pool.sweep(idle_timeout);
                (idle_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(10))
            }
            None => return,
        };
        tokio::time::sleep(every).await;
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
struct Attempt {
    request: Outgoing,
    /// The body for the next try: the client's until it is sent, then none.
    body: Option<RequestBody>,
    /// A pooled connection was found closed and the request sent again already.
    stale_retried: bool,
}

impl Attempt {
    /// The request of `head` with `body` (each wait for its next frame bounded by
    /// `body_timeout`), before any server is chosen.
    fn new<U: Upstreams>(
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
enum Unanswered {
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
struct Failure {
    error: String,
    /// The request, when hyper did not send any of it.
    returned: Option<Request<RequestBody>>,
    /// Some byte of an answer arrived.
    answered: bool,
    /// The server stayed silent past the response timeout.
    timeout: bool,
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

/// What is accounted once a request is finished with, whichever way: the access log's
/// exchange, the counters, and the connection given back when the answer went whole.
pub(crate) struct Finish<U: Upstreams> {
    proxy: Arc<Proxy<U>>,
    exchange: Exchange<U::Server>,
    started: Instant,
    /// How the request's body went.
    upload: Arc<Upload>,
    /// The server's connection the answer comes on (none once upgraded): given back when the
    /// exchange finished cleanly, else closed.
    conn: Option<(U::Server, Conn)>,
    /// The balancer's lease, dropped once the request is finished with (unless an upgrade
    /// took it).
    lease: Option<U::Lease>,
    continued: Option<CancellationToken>,
    /// The client was given an answer's head.
    answered: bool,
    /// Body bytes sent to the client.
    sent: u64,
    /// How the answer's body ended (`Cut` until it is known).
    ended: Ended,
}

impl<U: Upstreams> Finish<U> {
    fn new(proxy: Arc<Proxy<U>>, client: std::net::SocketAddr, head: &Parts) -> Finish<U> {
        Finish {
            proxy,
            exchange: Exchange {
                client,
                method: head.method.clone(),
                uri: head.uri.clone(),
                status: None,
                server: None,
                to_server: 0,
                to_client: 0,
                duration: Duration::ZERO,
                outcome: Outcome::Served,
            },
            started: Instant::now(),
            upload: Arc::default(),
            conn: None,
            lease: None,
            continued: None,
            answered: false,
            sent: 0,
            ended: Ended::Cut,
        }
    }
}

impl<U: Upstreams> Done for Finish<U> {
    fn done(mut self, sent: u64, ended: Ended) {
        self.sent = sent;
        self.ended = ended;
    }
}

impl<U: Upstreams> Drop for Finish<U> {
    /// Also when the request's future is dropped: the client went away before its answer.
    fn drop(&mut self) {
        let exchange = &mut self.exchange;
        exchange.to_server = self.upload.sent.load(Relaxed);
        exchange.to_client = self.sent;
        exchange.duration = self.started.elapsed();
        if !self.answered {
            exchange.status = None;
            exchange.outcome = Outcome::Incomplete;
        } else if exchange.outcome == Outcome::Served {
            exchange.outcome = match self.ended {
                Ended::Whole => Outcome::Served,
                Ended::ServerSilent => Outcome::ServerTimeout,
                Ended::Cut if self.upload.timed_out.load(Relaxed) => Outcome::ClientTimeout,
                Ended::Cut => Outcome::Incomplete,
            };
        }
        // Both messages framed and whole, the request's before the answer's end: else the
        // connection (dropped here) closes.
        let clean = self.ended == Ended::Whole && self.upload.is_finished();
        if let Some((server, conn)) = self.conn.take().filter(|_| clean) {
            Arc::clone(&self.proxy).give_back(server, conn);
        }
        self.proxy
            .stats
            .finished(exchange.status, exchange.duration, &exchange.outcome);
        self.proxy.upstreams.report(Event::Exchange(exchange));
    }
}
