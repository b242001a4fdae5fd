//! An HTTP balancer (`[BALANCE_HTTP*]`) at run time: the balancer as the HTTP engine's
//! [`Upstreams`] (choose with the balancer's policy, connect with the dialer, quarantine the
//! servers that fail, account for every request and upgraded connection), and each accepted
//! connection handed to the engine with a `MAX_CONNECTIONS` place.
//!
//! The query interface is routed by path here (`/TOTVS_BROKER_QUERY/...` is answered by the
//! balancer itself), so no client waits for a sniff. A request holds a [`Lease`] on its
//! server while in hand, and an upgraded connection (WebSocket) holds it until it ends: the
//! server's connections on the status page are the requests and WebSockets it serves now.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use hyper::Response;
use hyper::body::Bytes;
use hyper::header::{COOKIE, HeaderMap, HeaderValue, SET_COOKIE, UPGRADE};
use hyper::http::request::Parts;
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant};
use tokio_util::task::TaskTracker;
use tracing::{Span, info, warn};

use crate::balancer::{Balancer, Closed, Eligible, Lease, Pool, Server};
use crate::config::{BalancerConfig, Language};
use crate::context::{Context, Ending};
use crate::dial::{self, ConnectError};
use crate::events::{Event as BrokerEvent, Unserved};
use crate::http::{self, Choice, Downstream, Event, Exchange, Outcome, Proxy, Tunnel, Upstreams};
use crate::os_error::explain_connect;
use crate::query;
use crate::query::snapshot::{HttpFigures, SESSION_AGES_SHOWN, ServerSessions, SessionFigures};
use crate::relay;
use crate::sessions::{Sessions, Ticket};
use crate::stream::Stream;

/// An HTTP balancer's engine.
pub type HttpProxy = Proxy<Backends>;

/// A server of the balancer as the engine keys its pool: the balancer's own, compared by
/// identity, so a server a reload re-created never shares the old one's connections.
#[derive(Debug, Clone)]
pub struct Target(pub Arc<Server>);

impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Target {}

impl std::hash::Hash for Target {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.address)
    }
}

/// The balancer behind an HTTP engine.
#[derive(Debug)]
pub struct Backends {
    balancer: Arc<Balancer>,
    ctx: Arc<Context>,
    /// The engine, for the figures a query shows (set once it is made).
    proxy: OnceLock<Weak<HttpProxy>>,
    /// The balancer's span, made once: the access log writes a line per request in it.
    span: Span,
    /// The live sessions (issue 14), kept across reloads. One small lock, held for a table
    /// operation and a count per server.
    sessions: Arc<Mutex<Sessions>>,
}

/// What a request holds while in hand: its server's connection count and, for a WebSocket
/// upgrade of a session, the session's pin (it does not expire while the WebSocket is open).
#[derive(Debug)]
pub struct Held {
    /// The server's connection count.
    pub lease: Lease,
    /// The session pinned, and its table, when the request asked for an upgrade.
    pinned: Option<(Ticket, Arc<Mutex<Sessions>>)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((ticket, sessions)) = self.pinned.take() {
            let mut table = sessions.lock().unwrap_or_else(|p| p.into_inner());
            table.closed(ticket, Instant::now());
        }
    }
}

/// The engine of `balancer`, with its settings. Within a tokio runtime (its idle sweep and
/// the sessions' expiry run there).
pub fn proxy(balancer: &Arc<Balancer>, ctx: &Arc<Context>) -> Arc<HttpProxy> {
    let backends = Arc::new(Backends {
        balancer: Arc::clone(balancer),
        ctx: Arc::clone(ctx),
        proxy: OnceLock::new(),
        span: balancer.span(),
        sessions: Arc::default(),
    });
    let pool = balancer.pool();
    let language = ctx.config.load().general.language;
    let proxy = Proxy::new(Arc::clone(&backends), settings(&pool.config, language));
    let _ = backends.proxy.set(Arc::downgrade(&proxy));
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(expire_sessions(Arc::downgrade(&backends)));
    }
    proxy
}

/// How often the sessions idle past `SESSION_TIMEOUT` are ended and each server's count set
/// again, when no request or query does it first: so `appbroker ctl show` and the balancing
/// of new sessions see a count at most this old.
const SESSION_SWEEP: Duration = Duration::from_secs(1);

/// Ends expired sessions every [`SESSION_SWEEP`] until the engine is gone.
async fn expire_sessions(backends: Weak<Backends>) {
    loop {
        tokio::time::sleep(SESSION_SWEEP).await;
        let Some(backends) = backends.upgrade() else {
            return;
        };
        let pool = backends.balancer.pool();
        let mut table = backends.sessions.lock().unwrap_or_else(|p| p.into_inner());
        table.expire(Instant::now(), pool.config.http.session_timeout);
        backends.count_sessions(&table, &pool.servers);
    }
}

/// The engine's settings from a balancer's keys.
pub fn settings(config: &BalancerConfig, language: Language) -> http::Settings {
    let keys = &config.http;
    http::Settings {
        forwarded_headers: keys.forwarded_headers,
        upgrade_protocols: keys.upgrade_protocols.clone(),
        max_idle: keys.pool_max_idle as usize,
        idle_timeout: keys.pool_idle_timeout,
        request_timeout: keys.request_timeout,
        retry_idempotent: keys.retry_idempotent,
        tunnel_idle_timeout: config.idle_timeout,
        language,
        ..http::Settings::default()
    }
}

/// A reload applied to the engine: the new settings, and the idle connections of servers
/// that left the pool (`old`) closed.
pub fn reconfigure(proxy: &HttpProxy, old: &Pool, new: &Pool, language: Language) {
    proxy.set_settings(settings(&new.config, language));
    for gone in old
        .servers
        .iter()
        .filter(|o| !new.servers.iter().any(|n| Arc::ptr_eq(n, o)))
    {
        proxy.forget(&Target(Arc::clone(gone)));
    }
}

/// Serves one accepted connection of an HTTP balancer (`client`: who, and whether `stream`
/// is TLS, for `X-Forwarded-Proto`): a `MAX_CONNECTIONS` place (or the
/// connection is closed at once, as on a TCP balancer), then the engine until the client
/// closes; `ending.closing` answers the request in hand and closes, `ending.cut` ends it at
/// once (an upgraded connection too).
pub fn start<S: Stream>(
    proxy: &Arc<HttpProxy>,
    tasks: &TaskTracker,
    ending: &Ending,
    local: Option<SocketAddr>,
    stream: S,
    client: Downstream,
) {
    let balancer = &proxy.upstreams().balancer;
    let pool = balancer.pool();
    let Some(slot) = balancer.try_take_slot(&pool) else {
        balancer.refused(local);
        return;
    };
    balancer.admitted();
    slot.admit();
    let (proxy, closing, cut) = (
        Arc::clone(proxy),
        ending.closing.clone(),
        ending.cut.clone(),
    );
    tasks.spawn(async move {
        let _slot = slot;
        tokio::select! {
            _ = cut.cancelled() => {}
            _ = proxy.serve(stream, Bytes::new(), client, closing) => {}
        }
    });
}

impl Backends {
    /// A finished request: the server's traffic, the 503 counted, the access-log line.
    fn exchanged(&self, exchange: &Exchange<Target>) {
        if let Some(server) = &exchange.server {
            server.0.add_traffic(exchange.to_server, exchange.to_client);
        }
        let (balancer, span) = (&self.balancer, &self.span);
        if exchange.outcome == Outcome::NoServer {
            span.in_scope(|| balancer.unserved(exchange.client, Unserved::NoServer));
        }
        balancer.events().emit(|| BrokerEvent::Request {
            balancer: balancer.kind(),
            client: exchange.client,
            method: exchange.method.to_string(),
            path: exchange.uri.to_string(),
            status: exchange.status.map(|s| s.as_u16()),
            server: exchange.server.as_ref().map(|s| s.0.address.clone()),
        });
        if balancer.pool().config.http.log_requests {
            span.in_scope(|| access_line(exchange));
        }
    }

    /// An upgraded connection ended: its closing line, as a relayed connection's.
    fn tunnel_ended(&self, tunnel: &Tunnel<Target>) {
        let outcome = relay::Outcome {
            to_server: tunnel.to_server,
            to_client: tunnel.to_client,
            end: tunnel.end.clone(),
        };
        let closed = Closed {
            client: tunnel.client,
            duration: tunnel.duration,
            outcome: &outcome,
            log_connections: self.balancer.pool().config.log_connections,
        };
        tunnel
            .server
            .0
            .add_traffic(tunnel.to_server, tunnel.to_client);
        self.balancer
            .ended_on(&tunnel.server.0, &closed, &self.span);
    }

    /// Each server's live sessions as the table counts them (what SORT_METHOD=SESSION
    /// spreads and the pages show).
    fn count_sessions(&self, table: &Sessions, servers: &[Arc<Server>]) {
        for server in servers {
            server.set_sessions(table.count(server.id));
        }
    }

    /// The figures a query of this balancer shows.
    fn figures(&self) -> HttpFigures {
        let Some(proxy) = self.proxy.get().and_then(Weak::upgrade) else {
            return HttpFigures::default();
        };
        let pools = proxy.pool_figures();
        let pool = self.balancer.pool();
        let sessions = {
            let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            table.expire(now, pool.config.http.session_timeout);
            self.count_sessions(&table, &pool.servers);
            SessionFigures {
                live: table.len() as u64,
                total: table.total(),
                peak: table.peak(),
                moved: table.moved_count(),
                servers: pool
                    .servers
                    .iter()
                    .map(|s| {
                        let figures = ServerSessions {
                            live: table.count(s.id),
                            peak: table.peak_of(s.id),
                            ages: table.ages(s.id, now, SESSION_AGES_SHOWN),
                        };
                        (s.address.clone(), figures)
                    })
                    .collect(),
            }
        };
        HttpFigures {
            sessions,
            requests: proxy.stats().figures(),
            pools: self
                .balancer
                .pool()
                .servers
                .iter()
                .map(|s| {
                    let figures = pools
                        .iter()
                        .find(|(t, _)| Arc::ptr_eq(&t.0, s))
                        .map(|(_, f)| *f)
                        .unwrap_or_default();
                    (s.address.clone(), figures)
                })
                .collect(),
        }
    }
}

/// The access log's line for one request (`LOG_REQUESTS`): who, what, the answer, the bytes
/// each way, how long, which server.
fn access_line(exchange: &Exchange<Target>) {
    let status = exchange
        .status
        .map_or_else(|| "-".to_string(), |s| s.as_u16().to_string());
    let server = exchange
        .server
        .as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string);
    let error = match &exchange.outcome {
        Outcome::ServerFailed(error) => Some(error.as_str()),
        Outcome::ServerTimeout => Some("no answer within the response timeout"),
        Outcome::Incomplete => Some("answer incomplete"),
        Outcome::ClientFailed => Some("request body broken off"),
        _ => None,
    };
    info!(
        client = %exchange.client,
        method = %exchange.method,
        path = %exchange.uri,
        status = %status,
        bytes_from_client = exchange.to_server,
        bytes_to_client = exchange.to_client,
        duration = %format_args!("{:.3}s", exchange.duration.as_secs_f64()),
        server = %server,
        error = error,
        "request"
    );
}

impl Upstreams for Backends {
    type Server = Target;
    type Lease = Held;
    type Stream = TcpStream;

    /// A request's server: the one its `TOTVS_BROKER_SH_001` cookie names while that server
    /// can take it (disabled, draining or weight 0 included: only new sessions avoid those);
    /// else the balancer's pick among the servers not tried yet, up to `MAX_ATTEMPTS`, with a
    /// new cookie set on the answer (every server quarantined, they are tried anyway: a
    /// quarantine may be stale). A live session whose server is in quarantine, removed or
    /// failed this request is moved (logged once, counted), or refused with a 503 under
    /// `HTTP_STICKY_STRICT=1`.
    fn choose(
        &self,
        request: &Parts,
        client: &Downstream,
        tried: &[Target],
    ) -> Option<Choice<Self>> {
        let pool = self.balancer.pool();
        if tried.len() >= pool.config.max_attempts as usize {
            return None;
        }
        let keys = &pool.config.http;
        let now = self.balancer.clock_ms();
        let ticket = Ticket::from_cookies(
            request
                .headers
                .get_all(COOKIE)
                .iter()
                .map(HeaderValue::as_bytes),
        );
        let bound = ticket.and_then(|t| pool.servers.iter().position(|s| s.id == t.server));
        let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let upgrade = request.headers.contains_key(UPGRADE);
        let pin = |table: &mut Sessions, ticket: Ticket| {
            upgrade.then(|| {
                table.opened(ticket);
                (ticket, Arc::clone(&self.sessions))
            })
        };
        if let (Some(ticket), Some(index)) = (ticket, bound) {
            let server = &pool.servers[index];
            let failed = tried.iter().any(|t| Arc::ptr_eq(&t.0, server));
            if !failed && server.is_available(now) {
                table.touch(
                    ticket,
                    Instant::now(),
                    keys.session_timeout,
                    keys.max_sessions as usize,
                );
                let pinned = pin(&mut table, ticket);
                self.count_sessions(&table, &pool.servers);
                drop(table);
                let lease = pool.lease(index, false)?;
                let server = Target(Arc::clone(&lease.server));
                return Some(Choice::of(server, Held { lease, pinned }));
            }
        }
        // A cookie naming a server that is not configured is a live session's only while
        // the table knows it (the server was removed); else it is no cookie at all.
        let moving = ticket.filter(|t| bound.is_some() || table.knows(*t));
        if moving.is_some() && keys.sticky_strict {
            return None;
        }
        table.expire(Instant::now(), keys.session_timeout);
        // The pick below reads the counts: without the sessions just ended.
        self.count_sessions(&table, &pool.servers);
        let tried: Vec<usize> = pool
            .servers
            .iter()
            .enumerate()
            .filter(|(_, s)| tried.iter().any(|t| Arc::ptr_eq(&t.0, s)))
            .map(|(i, _)| i)
            .collect();
        let lease = pool
            .pick(now, &tried, Eligible::Available)
            .or_else(|| pool.pick(now, &tried, Eligible::EvenQuarantined))?;
        let fresh = Ticket::fresh(lease.server.id);
        // Every server in quarantine, the pick may be its own server again: no move.
        if let Some(old) = moving
            && old.server != lease.server.id
            && table.moved(old)
        {
            let from = bound.map_or_else(
                || format!("{} (no longer configured)", old.server),
                |i| format!("{} ({})", old.server, pool.servers[i].address),
            );
            self.span.in_scope(|| {
                warn!(client = %client.peer, from = %from, server = %lease.server.address, "session moved: its server cannot take it; cookie set anew")
            });
        }
        self.count_sessions(&table, &pool.servers);
        drop(table);
        let mut response_headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(&fresh.set_cookie(client.tls)) {
            response_headers.insert(SET_COOKIE, value);
        }
        Some(Choice {
            server: Target(Arc::clone(&lease.server)),
            lease: Held {
                lease,
                pinned: None,
            },
            response_headers,
        })
    }

    fn keeps(&self, server: &Target) -> bool {
        let pool = self.balancer.pool();
        pool.servers.iter().any(|s| Arc::ptr_eq(s, &server.0))
    }

    /// The broker's cookie is the broker's: the server sees the client's other cookies only.
    fn rewrite(&self, head: &mut HeaderMap) {
        let cookies: Vec<HeaderValue> = head.get_all(COOKIE).iter().cloned().collect();
        if !cookies.iter().any(|c| {
            c.to_str()
                .is_ok_and(|c| c.contains(crate::sessions::COOKIE))
        }) {
            return;
        }
        head.remove(COOKIE);
        for cookie in cookies {
            let kept = match cookie.to_str() {
                Ok(text) => Ticket::strip(text).and_then(|t| HeaderValue::from_str(&t).ok()),
                Err(_) => Some(cookie),
            };
            if let Some(kept) = kept {
                head.append(COOKIE, kept);
            }
        }
    }

    async fn connect(&self, server: &Target) -> io::Result<TcpStream> {
        let pool = self.balancer.pool();
        let config = &pool.config;
        let s = &server.0;
        match dial::connect(self.balancer.resolver(), &s.host, s.port, config).await {
            Ok(stream) => {
                dial::keep_alive(&stream, &config.keepalive, &s.address);
                self.balancer.connected_to(s, s.is_quarantined());
                Ok(stream)
            }
            // Kept whole, so the report tells whose fault it was.
            Err(e) => Err(io::Error::other(e)),
        }
    }

    fn report(&self, event: Event<'_, Target>) {
        match event {
            Event::ConnectFailed {
                server,
                client,
                error,
            } => {
                let explained = match error.get_ref().and_then(|e| e.downcast_ref()) {
                    // Not tried: no server is to blame, the next candidate is tried.
                    Some(ConnectError::ResolverBusy { .. }) => return,
                    Some(e) => ConnectError::explain(e),
                    None => explain_connect(error),
                };
                let s = &server.0;
                self.span.in_scope(|| {
                    self.balancer
                        .connect_failed_to(s, s.is_quarantined(), &explained, client)
                });
            }
            Event::Opened { .. } | Event::Closed { .. } => {}
            Event::Exchange(exchange) => self.exchanged(exchange),
            Event::Tunnel(tunnel) => self.tunnel_ended(tunnel),
        }
    }

    fn intercept(&self, request: &Parts, client: &Downstream) -> Option<Response<Bytes>> {
        query::intercept(&self.ctx, &self.balancer, client.peer, request, || {
            self.figures()
        })
    }
}
