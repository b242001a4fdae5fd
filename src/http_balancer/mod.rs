//! An HTTP balancer (`[BALANCE_HTTP*]`) at run time: the balancer as the HTTP engine's
//! [`Upstreams`] (choose with the balancer's policy, connect with the dialer, quarantine the
//! servers that fail, account for every request and upgraded connection), and each accepted
//! connection handed to the engine with a `MAX_CONNECTIONS` place.
//!
//! The query interface is routed by path here (`/TOTVS_BROKER_QUERY/...` is answered by the
//! balancer itself), so no client waits for a sniff. A request holds a [`Lease`] on its
//! server while in hand, and an upgraded connection (WebSocket) holds it until it ends: the
//! server's connections on the status page are the requests and WebSockets it serves now.
//!
//! - [`sessions`]: HTTP session affinity, pure logic: the `TOTVS_BROKER_SH_001` cookie
//!   (signed, read from the `Cookie` header as bytes), its secrets, the table of live
//!   sessions.

pub mod sessions;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::time::{Duration, Instant};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, info, warn};

use crate::balancer::events::{Event, Unserved};
use crate::balancer::rules::health::Reason;
use crate::balancer::shared::{Ending, Shared};
use crate::balancer::{
    Admission, Balancer, ClientHold, Closed, Eligible, Generation, Lease, Server,
};
use crate::config::{BalancerConfig, Language, ServerId, show_duration};
use crate::http::h1::{Editor, FieldName};
use crate::http::{
    self, Choice, ClientAddr, ClientHead, ConnectFailure, Downstream, Engine, Exchange,
    ExchangeOutcome, LocalAnswer, LocalRequest, Report, Tunnel, Upstreams,
};
use crate::http_balancer::sessions::{
    Affinity, CookieKeys, Limits, SessionSecrets, Sessions, Ticket, Touched,
    mentions_broker_cookie, without_broker_cookie,
};
use crate::net::dial::{ConnectError, ServerStream};
use crate::net::proxy_protocol::{self, Header};
use crate::net::relay;
use crate::net::stream::Stream;
use crate::process::budget::Budget;
use crate::process::clock::wall_ms;
use crate::process::throttle::{Episode, Throttle};
use crate::query;
use crate::query::snapshot::{HttpFigures, SESSION_AGES_SHOWN, ServerSessions, SessionFigures};

/// An HTTP balancer's engine.
pub type HttpProxy = Engine<HttpBalancer>;

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

/// An HTTP balancer as its engine's [`Upstreams`]: the balancer, its session affinity and
/// its access log's state, behind the engine.
#[derive(Debug)]
pub struct HttpBalancer {
    balancer: Arc<Balancer>,
    ctx: Arc<Shared>,
    /// The keys of the session cookies, the broker's one set (a reload of `SESSION_SECRET` or
    /// `SESSION_SECRET_PREVIOUS` swaps them).
    session_secrets: Arc<SessionSecrets>,
    /// The engine, for the figures a query shows (set once it is made).
    proxy: OnceLock<Weak<HttpProxy>>,
    /// The balancer's span, made once: the access log writes a line per request in it.
    span: Span,
    /// The live sessions (affinity), kept across reloads. One small lock, held for a table
    /// operation and a count per server.
    sessions: Arc<Mutex<Sessions>>,
    /// Clients whose body stalled past `HTTP_BODY_TIMEOUT`: a line a second at most, with the
    /// count of those left out.
    body_timeouts_log: Throttle,
    /// Sessions moving off each server, per episode, and how the server is named in the log
    /// (at most one entry per configured id).
    moves: Mutex<HashMap<ServerId, (Episode, String)>>,
    /// Clients past `HTTP_MAX_SESSIONS_PER_CLIENT`, per episode: the first refusal is
    /// logged, the others counted (an entry per client refused in the last second or so).
    over_cap: Mutex<HashMap<IpAddr, Episode>>,
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

/// The engine of `balancer`, with its settings, its session cookies signed with
/// `session_secrets`. Within a tokio runtime (its idle sweep and the sessions' expiry run
/// there).
pub fn proxy(
    balancer: &Arc<Balancer>,
    ctx: &Arc<Shared>,
    session_secrets: &Arc<SessionSecrets>,
) -> Arc<HttpProxy> {
    let upstreams = Arc::new(HttpBalancer {
        balancer: Arc::clone(balancer),
        ctx: Arc::clone(ctx),
        session_secrets: Arc::clone(session_secrets),
        proxy: OnceLock::new(),
        span: balancer.span(),
        sessions: Arc::default(),
        body_timeouts_log: Throttle::new(1000),
        moves: Mutex::default(),
        over_cap: Mutex::default(),
    });
    let pool = balancer.generation();
    let language = ctx.config.load().general.language;
    let head_memory = Arc::clone(&ctx.head_memory);
    let settings = settings(&pool.config, language, head_memory);
    let proxy = Engine::new(Arc::clone(&upstreams), settings);
    let _ = upstreams.proxy.set(Arc::downgrade(&proxy));
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(expire_sessions(Arc::downgrade(&upstreams)));
    }
    proxy
}

/// How often the sessions idle past `SESSION_TIMEOUT` are ended and each server's count set
/// again, when no request or query does it first: so `appbroker ctl show` and the balancing
/// of new sessions see a count at most this old. Episodes of moved sessions end here too.
const SESSION_SWEEP: Duration = Duration::from_secs(1);

/// Ends expired sessions every [`SESSION_SWEEP`] until the engine is gone.
async fn expire_sessions(upstreams: Weak<HttpBalancer>) {
    loop {
        tokio::time::sleep(SESSION_SWEEP).await;
        let Some(upstreams) = upstreams.upgrade() else {
            return;
        };
        let pool = upstreams.balancer.generation();
        let mut table = upstreams.sessions.lock().unwrap_or_else(|p| p.into_inner());
        table.expire(Instant::now(), pool.config.http.session_timeout);
        upstreams.count_sessions(&table, &pool.servers);
        drop(table);
        upstreams.moves_ended();
        upstreams.over_cap_ended(pool.config.http.max_sessions_per_client);
    }
}

/// The engine's settings from a balancer's keys, and the broker's `HTTP_HEAD_MEMORY` budget.
pub fn settings(
    config: &BalancerConfig,
    language: Language,
    head_memory: Arc<Budget>,
) -> http::Settings {
    let keys = &config.http;
    http::Settings {
        forwarded_headers: keys.forwarded_headers,
        upgrade_protocols: keys.upgrade_protocols.clone(),
        max_idle: keys.pool_max_idle as usize,
        idle_timeout: keys.pool_idle_timeout,
        request_timeout: keys.request_timeout,
        response_timeout: keys.response_timeout,
        body_timeout: keys.body_timeout,
        retry_idempotent: keys.retry_idempotent,
        tunnel_idle_timeout: config.idle_timeout,
        language,
        trusted_proxies: keys.trusted_proxies.clone(),
        head_memory,
        ..http::Settings::default()
    }
}

/// A reload applied to the engine: the new settings, and the idle connections of servers
/// that left the pool (`old`) closed.
pub fn reconfigure(proxy: &HttpProxy, old: &Generation, new: &Generation, language: Language) {
    let head_memory = Arc::clone(&proxy.upstreams().ctx.head_memory);
    proxy.set_settings(settings(&new.config, language, head_memory));
    for gone in old
        .servers
        .iter()
        .filter(|o| !new.servers.iter().any(|n| Arc::ptr_eq(n, o)))
    {
        proxy.forget(&Target(Arc::clone(gone)));
    }
}

/// Serves one accepted connection of an HTTP balancer (`client`: who, and whether `stream`
/// is TLS, for `X-Forwarded-Proto`): a hold under `MAX_CONNECTIONS_PER_CLIENT`, then the engine
/// until the client closes, which counts it as a client (its `MAX_CONNECTIONS` place) at its
/// first request forwarded to a server ([`Upstreams::admit`]); `ending.closing` answers the
/// request in hand and closes, `ending.cut` ends it at once (an upgraded connection too).
///
/// A connection over its client's limit takes no place another client needs: it is answered
/// 503 with `Retry-After` (once its first head comes, within `HTTP_REQUEST_TIMEOUT`) while
/// few of its client's, and of all, are being answered so ([`Balancer::answer_refusal`]), and
/// is closed at once beyond that.
pub fn start<S: Stream>(
    proxy: &Arc<HttpProxy>,
    tasks: &TaskTracker,
    ending: &Ending,
    stream: S,
    mut client: Downstream,
) {
    let balancer = &proxy.upstreams().balancer;
    let pool = balancer.generation();
    if pool.config.proxy.send.is_some() && client.local.is_none() {
        // The header sent on names where the client connected: the socket's own address.
        client.local = stream.socket().and_then(|s| s.local_addr().ok());
    }
    let (closing, cut) = (ending.closing.clone(), ending.cut.clone());
    let span = balancer.span();
    // A trusted proxy's connection carries many clients: not it but each of its requests is
    // counted, for the client it names (`Upstreams::hold_client`). A front balancer's check
    // (a `LOCAL` header) is no client: never counted, never forwarded.
    let hold = if client.check || client.is_trusted_proxy(&pool.config.http.trusted_proxies) {
        None
    } else {
        let key = client_key(client.peer);
        let Some(hold) = span.in_scope(|| balancer.hold_for_client(&pool, key)) else {
            if let Some(refusal) = balancer.answer_refusal(key) {
                let refusing = Arc::clone(proxy).serve_unavailable(stream, client, cut);
                tasks.spawn(async move {
                    let _refusal = refusal;
                    refusing.await;
                });
            }
            return;
        };
        // Boxed, and only when the limit is on: the idle client's task carries a word, not
        // the hold, so it stays in tokio's 512-byte task cell.
        hold.counts().then(|| Box::new(hold))
    };
    // The engine's future is the task's whole future: a future around it would carry its
    // arguments twice for the connection's life.
    let serving = Arc::clone(proxy).serve(stream, client, closing, cut, hold);
    tasks.spawn(serving);
}

impl HttpBalancer {
    /// A finished request: the server's traffic and its timeouts, the 503 counted, the
    /// access-log line.
    fn exchanged(&self, exchange: &Exchange<Target>) {
        if let Some(server) = &exchange.server {
            server.0.add_traffic(exchange.to_server, exchange.to_client);
            self.span
                .in_scope(|| self.count_timeouts(&server.0, &exchange.outcome));
        }
        let (balancer, span) = (&self.balancer, &self.span);
        let unserved = match exchange.outcome {
            ExchangeOutcome::NoServer => Some(Unserved::NoServer),
            ExchangeOutcome::BrokerFault => Some(Unserved::BrokerFault),
            _ => None,
        };
        if let Some(why) = unserved {
            span.in_scope(|| balancer.unserved(exchange.client.or_unspecified(), why));
        }
        if exchange.outcome == ExchangeOutcome::ClientTimeout
            && let Some(suppressed) = self.body_timeouts_log.allow()
        {
            let timeout = show_duration(balancer.generation().config.http.body_timeout);
            span.in_scope(|| {
                warn!(
                    more_since_last_line = suppressed,
                    client = %exchange.client,
                    "a client's request body stopped arriving for HTTP_BODY_TIMEOUT={timeout}; \
                     answered 408 (or its connection closed, when the answer had begun)"
                );
            });
        }
        balancer.events().emit(|| Event::Request {
            balancer: balancer.kind(),
            client: exchange.client.or_unspecified(),
            method: exchange.method.to_string(),
            path: exchange.uri.to_string(),
            status: exchange.status.map(|s| s.as_u16()),
            server: exchange.server.as_ref().map(|s| s.0.address.clone()),
        });
        if balancer.generation().config.http.log_requests {
            span.in_scope(|| access_line(exchange));
        }
    }

    /// A server's requests that time out in a row: the first of a run is logged, every
    /// `HTTP_TIMEOUTS_TO_QUARANTINE` of them quarantine it (0: never), and an answer ends the
    /// run (logged when one was running). A failure of the client's, or a client gone before
    /// the answer, says nothing of the server.
    fn count_timeouts(&self, server: &Server, outcome: &ExchangeOutcome) {
        let keys = &self.balancer.generation().config.http;
        match outcome {
            ExchangeOutcome::ServerTimeout => {
                let in_a_row = server.timed_out();
                let timeout = show_duration(keys.response_timeout);
                if in_a_row == 1 {
                    warn!(
                        "server {} did not answer within HTTP_RESPONSE_TIMEOUT={timeout}; its \
                         requests are answered 504 (or cut, when the answer had begun)",
                        server.address
                    );
                }
                let limit = keys.timeouts_to_quarantine;
                if limit > 0 && in_a_row.is_multiple_of(limit) {
                    let words = format!("did not answer {limit} requests within {timeout}");
                    self.balancer.quarantine(server, Reason::Timeout, &words);
                }
            }
            ExchangeOutcome::Served | ExchangeOutcome::ServerFailed(_) => {
                let run = server.answered();
                if run > 0 {
                    info!(
                        "server {} answering again after {run} requests timed out in a row",
                        server.address
                    );
                }
            }
            _ => {}
        }
    }

    /// An upgraded connection ended: its closing line, as a relayed connection's. Its bytes
    /// are the server's traffic through its request's exchange, reported next.
    fn tunnel_ended(&self, tunnel: &Tunnel<Target>) {
        let outcome = relay::Outcome {
            to_server: tunnel.to_server,
            to_client: tunnel.to_client,
            end: tunnel.end.clone(),
        };
        let closed = Closed {
            client: tunnel.client.or_unspecified(),
            duration: tunnel.duration,
            outcome: &outcome,
            log_connections: self.balancer.generation().config.log_connections,
        };
        self.balancer.ended(&tunnel.server.0, &closed, &self.span);
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
        let pool = self.balancer.generation();
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
                .generation()
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

/// Where a signed cookie's session goes.
enum Sticky {
    /// To its server (or, `None`, a 503: its server has no room to count the request).
    Served(Option<Choice<HttpBalancer>>),
    /// Elsewhere: the live session moving (`Some`), or a cookie of no live session whose
    /// server cannot take it, balanced as none (`None`).
    Moving(Option<Ticket>),
}

impl HttpBalancer {
    /// A signed cookie: its session refreshed and the request on its server, while that
    /// server is configured, available and has not failed this request. `renewed`: the
    /// cookie signed anew after a rotation (or bound, from the earlier form), which the
    /// session goes on as (and the answer sets). A new session of a client past
    /// `HTTP_MAX_SESSIONS_PER_CLIENT` goes to its server all the same, uncounted.
    fn session(
        &self,
        pool: &Generation,
        ticket: Ticket,
        renewed: Option<Ticket>,
        tried: &[Target],
        upgrade: bool,
        client: &Downstream,
    ) -> Sticky {
        let index = pool.servers.iter().position(|s| s.id == ticket.server);
        let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = match renewed {
            Some(new) => {
                table.renew(ticket, new);
                new
            }
            None => ticket,
        };
        if let Some(index) = index {
            let server = &pool.servers[index];
            let failed = tried.iter().any(|t| Arc::ptr_eq(&t.0, server));
            if !failed && server.is_available(self.balancer.clock_ms()) {
                // Unknown clients (a trusted chain naming no usable address) share one count.
                let client_ip = client_key(client.peer);
                let limits = limits(&pool.config);
                let touched = table.touch(ticket, client_ip, Instant::now(), &limits);
                if touched == Touched::OverClientCap {
                    self.over_cap(client_ip, limits.per_client);
                }
                // A WebSocket pins its session: it does not expire while the WebSocket lives.
                let pinned = upgrade.then(|| {
                    table.opened(ticket);
                    (ticket, Arc::clone(&self.sessions))
                });
                self.count_sessions(&table, &pool.servers);
                drop(table);
                let cookie = renewed.map(|new| new.set_cookie(client.tls));
                let choice = pool
                    .lease(index, false)
                    .map(|lease| chosen(lease, pinned, cookie));
                return Sticky::Served(choice);
            }
        }
        // A cookie naming a server that is not configured is a live session's only while
        // the table knows it (the server was removed); else it is no cookie at all.
        Sticky::Moving(Some(ticket).filter(|t| index.is_some() || table.knows(*t)))
    }

    /// A cookie of the right form that does not verify: forged, issued by a version that
    /// did not sign cookies, or issued by another balancer. In the upgrade window (one
    /// `SESSION_TIMEOUT` after the first start that signed them, which opens only where an
    /// earlier state file was found) it is honoured when it names a server that takes new
    /// clients and no other balancer issued it, and signed anew for the same server, so
    /// upgrading moves no session; it never becomes a session (forged ones would fill the
    /// table and skew the spread). Otherwise, and always for a server an operator took out,
    /// it is no cookie (`None`).
    fn unsigned(
        &self,
        pool: &Generation,
        keys: &CookieKeys,
        ticket: Ticket,
        tried: &[Target],
        client: &Downstream,
    ) -> Option<Option<Choice<Self>>> {
        if !keys.honours_unsigned(wall_ms(), pool.config.http.session_timeout) {
            return None;
        }
        // A cookie another balancer of the file issued names a server of another pool: no
        // window honours it.
        let config = self.ctx.config.load();
        let own = self.balancer.kind();
        let others = config
            .balancers
            .iter()
            .filter(|b| b.kind.is_http() && b.kind != own)
            .map(|b| b.kind.section());
        if keys.bound_elsewhere(others, &ticket) {
            return None;
        }
        let index = pool.servers.iter().position(|s| s.id == ticket.server)?;
        let server = &pool.servers[index];
        let failed = tried.iter().any(|t| Arc::ptr_eq(&t.0, server));
        if failed || !server.takes_new_clients(self.balancer.clock_ms()) {
            return None;
        }
        let cookie = keys
            .issue(own.section(), ticket.server)
            .set_cookie(client.tls);
        Some(
            pool.lease(index, false)
                .map(|lease| chosen(lease, None, Some(cookie))),
        )
    }

    /// The balancer's pick for a request without a session (or whose session `moving` moves
    /// off its server), with a new cookie for the server picked.
    fn balance(
        &self,
        pool: &Generation,
        keys: &CookieKeys,
        moving: Option<Ticket>,
        tried: &[Target],
        client: &Downstream,
    ) -> Option<Choice<Self>> {
        let now = self.balancer.clock_ms();
        let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        table.expire(Instant::now(), pool.config.http.session_timeout);
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
        // Every server in quarantine, the pick may be its own server again: no move.
        if let Some(old) = moving
            && old.server != lease.server.id
            && table.moved(old)
        {
            self.session_moved(pool, old, &lease.server, client);
        }
        self.count_sessions(&table, &pool.servers);
        drop(table);
        let section = self.balancer.kind().section();
        let cookie = keys.issue(section, lease.server.id).set_cookie(client.tls);
        Some(chosen(lease, None, Some(cookie)))
    }

    /// A live session moved off its server (`old` names it) to `to`: the first of an episode
    /// of its server is logged, the others counted (see [`HttpBalancer::moves_ended`]), so a
    /// server in quarantine with thousands of sessions writes one line, not thousands.
    fn session_moved(&self, pool: &Generation, old: Ticket, to: &Server, client: &Downstream) {
        let mut moves = self.moves.lock().unwrap_or_else(|p| p.into_inner());
        let (episode, from) = moves.entry(old.server).or_insert_with(|| {
            let from = pool
                .servers
                .iter()
                .find(|s| s.id == old.server)
                .map_or_else(
                    || format!("{} (no longer configured)", old.server),
                    |s| format!("{} ({})", old.server, s.address),
                );
            (Episode::default(), from)
        });
        if episode.strike() {
            self.span.in_scope(|| {
                warn!(client = %client.peer, from = %from, server = %to.address, "session moved: its server cannot take it; cookie set anew")
            });
        }
    }

    /// The episodes of moved sessions that have been quiet for a second: each ends, with a
    /// line counting its moves when there was more than the one logged.
    fn moves_ended(&self) {
        let mut moves = self.moves.lock().unwrap_or_else(|p| p.into_inner());
        moves.retain(|_, (episode, from)| {
            let Some(moved) = episode.end() else {
                return true;
            };
            if moved > 1 {
                self.span.in_scope(|| {
                    info!(from = %from, moved, "sessions moved off their server: {moved} in this episode, the first one logged")
                });
            }
            false
        });
    }

    /// A new session of `client` was neither stored nor counted, the client having `cap`
    /// stored: the first of an episode of that client is logged, the others counted (see
    /// [`HttpBalancer::over_cap_ended`]).
    fn over_cap(&self, key: IpAddr, cap: usize) {
        let mut clients = self.over_cap.lock().unwrap_or_else(|p| p.into_inner());
        if clients.entry(key).or_default().strike() {
            let client = client_named(key);
            self.span.in_scope(|| {
                warn!(
                    client = %client,
                    "HTTP_MAX_SESSIONS_PER_CLIENT ({cap}) reached by client {client}: its new \
                     sessions keep their server (their cookie names it) but are neither stored \
                     nor counted, so it cannot move the balance of new sessions; users behind \
                     one address (a NAT, a terminal server, a front balancer without the PROXY \
                     protocol) need a higher cap, or their own addresses passed on"
                )
            });
        }
    }

    /// The episodes of clients over their cap that have been quiet for a second: each ends,
    /// with a line counting its sessions not counted when there was more than the one logged.
    fn over_cap_ended(&self, cap: u32) {
        let mut clients = self.over_cap.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|key, episode| {
            let Some(refused) = episode.end() else {
                return true;
            };
            if refused > 1 {
                let client = client_named(*key);
                self.span.in_scope(|| {
                    info!(client = %client, refused, "client {client}: {refused} new sessions past HTTP_MAX_SESSIONS_PER_CLIENT ({cap}) were not counted in this episode, the first one logged")
                });
            }
            false
        });
    }
}

/// A client counted by `key` ([`client_key`]), in words: its address, or `unknown` for the
/// clients no usable address names, which share the unspecified one.
fn client_named(key: IpAddr) -> String {
    if key.is_unspecified() {
        "unknown".to_string()
    } else {
        key.to_string()
    }
}

/// The bounds of a balancer's table of sessions, from its keys as they are now.
fn limits(config: &BalancerConfig) -> Limits {
    Limits {
        timeout: config.http.session_timeout,
        max: config.http.max_sessions as usize,
        per_client: config.http.max_sessions_per_client as usize,
    }
}

/// The request goes to `lease`'s server, holding `lease` (and the session `pinned`), with
/// `set_cookie` (handing a session's ticket to the browser) added to the answer.
fn chosen(
    lease: Lease,
    pinned: Option<(Ticket, Arc<Mutex<Sessions>>)>,
    set_cookie: Option<String>,
) -> Choice<HttpBalancer> {
    Choice {
        server: Target(Arc::clone(&lease.server)),
        lease: Held { lease, pinned },
        set_cookie,
    }
}

/// What an HTTP client is counted by under `MAX_CONNECTIONS_PER_CLIENT`, and owns pooled
/// connections by under `SEND_PROXY_PROTOCOL`: its IP address; every unknown client (behind a
/// trusted proxy whose chain named no usable address) shares one, the unspecified address,
/// which no client connects from and no chain can name.
fn client_key(client: ClientAddr) -> IpAddr {
    client.or_unspecified().ip()
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
    let error: Option<std::borrow::Cow<'_, str>> = match &exchange.outcome {
        ExchangeOutcome::ServerFailed(error) => Some(error.as_str().into()),
        ExchangeOutcome::ServerTimeout => {
            Some("the server was silent past HTTP_RESPONSE_TIMEOUT".into())
        }
        ExchangeOutcome::BrokerFault => {
            Some("the broker itself could not connect to a server".into())
        }
        ExchangeOutcome::Incomplete => Some("answer incomplete".into()),
        ExchangeOutcome::ClientFailed => Some("request body broken off".into()),
        ExchangeOutcome::ClientTimeout => {
            Some("the request body was silent past HTTP_BODY_TIMEOUT".into())
        }
        ExchangeOutcome::TunnelBroken(end) => Some(format!("the tunnel ended: {end}").into()),
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
        error = error.as_deref(),
        "request"
    );
}

/// The dialer's retry flag, for the engine: after a failure that is the broker's own it tries
/// no other server, so a request meets the broker's fault (and is counted in its episode)
/// once, as a TCP client does.
impl ConnectFailure for ConnectError {
    fn try_next(&self) -> bool {
        ConnectError::try_next(self)
    }
}

impl Upstreams for HttpBalancer {
    type Server = Target;
    type Lease = Held;
    type Stream = ServerStream;
    type ConnectError = ConnectError;
    type ClientHold = ClientHold;
    type Admission = Admission;

    /// Counted against `MAX_CONNECTIONS_PER_CLIENT` in the balancer's table of clients, with
    /// its direct connections; the refusal logged in the balancer's span.
    fn hold_client(&self, client: &Downstream) -> Option<ClientHold> {
        let pool = self.balancer.generation();
        let key = client_key(client.peer);
        self.span
            .in_scope(|| self.balancer.hold_for_proxied_request(&pool, key))
    }

    /// A request's server: the one its `TOTVS_BROKER_SH_001` cookie names while that server
    /// can take it (disabled, draining or weight 0 included: only new sessions avoid those),
    /// when the broker signed that cookie; else the balancer's pick among the servers not
    /// tried yet, up to `MAX_ATTEMPTS`, with a new cookie set on the answer (every server
    /// quarantined, they are tried anyway: a quarantine may be stale). A live session whose
    /// server is in quarantine, removed or failed this request is moved (logged once per
    /// server and episode, counted), or refused with a 503 under `HTTP_STICKY_STRICT=1`. A
    /// cookie that does not verify is no session: see [`HttpBalancer::unsigned`].
    fn choose(
        &self,
        request: &ClientHead<'_>,
        client: &Downstream,
        tried: &[Target],
    ) -> Option<Choice<Self>> {
        let pool = self.balancer.generation();
        if tried.len() >= pool.config.max_attempts as usize {
            return None;
        }
        let keys = self.session_secrets.keys();
        let section = self.balancer.kind().section();
        let mut affinity = Affinity::of(request.values(FieldName::Cookie), &keys, section);
        if let Affinity::Unbound(ticket) = affinity {
            // The earlier form: a session in its upgrade window, no cookie after it.
            let timeout = pool.config.http.session_timeout;
            affinity = if keys.honours_unbound(wall_ms(), timeout) {
                Affinity::Previous(ticket)
            } else {
                Affinity::None
            };
        }
        let moving = match affinity {
            Affinity::Signed(ticket) | Affinity::Previous(ticket) => {
                // Signed with SESSION_SECRET_PREVIOUS, or of the earlier form: the same
                // session, signed anew (bound to this balancer).
                let renewed =
                    matches!(affinity, Affinity::Previous(_)).then(|| keys.renew(section, &ticket));
                let upgrade = request.asks_upgrade();
                match self.session(&pool, ticket, renewed, tried, upgrade, client) {
                    Sticky::Served(choice) => return choice,
                    Sticky::Moving(moving) => moving,
                }
            }
            Affinity::Unsigned(ticket) => {
                if let Some(choice) = self.unsigned(&pool, &keys, ticket, tried, client) {
                    return choice;
                }
                None
            }
            Affinity::Unbound(_) | Affinity::None => None,
        };
        if moving.is_some() && pool.config.http.sticky_strict {
            return None;
        }
        self.balance(&pool, &keys, moving, tried, client)
    }

    fn keeps(&self, server: &Target) -> bool {
        let pool = self.balancer.generation();
        pool.servers.iter().any(|s| Arc::ptr_eq(s, &server.0))
    }

    /// The broker's cookie is the broker's: the server sees the client's other cookies only,
    /// byte for byte (whatever their encoding).
    fn rewrite(&self, request: &ClientHead<'_>, head: &mut Editor) {
        for (id, field) in request.fields() {
            if field.kind != FieldName::Cookie || !mentions_broker_cookie(field.value) {
                continue;
            }
            // The bytes left are bytes of a valid value: the editor takes them.
            match without_broker_cookie(field.value) {
                Some(kept) if head.set(id, &[&kept]).is_ok() => {}
                _ => head.remove(id),
            }
        }
    }

    /// The balancer's one dial path ([`Balancer::dial_with`]): the PROXY protocol header
    /// first with `SEND_PROXY_PROTOCOL`, TLS with `SSL_ENCRYPT_UPSTREAM=1`, the socket
    /// options, the connect accounted for (a server found in quarantine is taken as chosen
    /// although quarantined, as a TCP client's pick would be).
    async fn connect(
        &self,
        server: &Target,
        client: &Downstream,
    ) -> Result<ServerStream, ConnectError> {
        let pool = self.balancer.generation();
        let s = &server.0;
        let stale = s.is_quarantined();
        let preface = pool.config.proxy.send.map(|version| {
            // An unknown client is named to no server: `PROXY UNKNOWN`, or v2's family UNSPEC.
            let header = match (client.peer, client.local) {
                (ClientAddr::Known(source), Some(destination)) => Header::Proxied {
                    source,
                    destination,
                },
                _ => Header::Unknown,
            };
            proxy_protocol::write(version, &header)
        });
        let preface = preface.as_deref().unwrap_or_default();
        let dialed =
            self.balancer
                .dial_with(&pool, s, stale, client.peer.or_unspecified(), preface);
        dialed.instrument(self.span.clone()).await
    }

    /// With `SEND_PROXY_PROTOCOL` a server connection's header names one client: the
    /// connection is that client's alone (as HAProxy keeps a `send-proxy` connection private);
    /// one that names no one (`PROXY UNKNOWN`) is the unknown clients', never a named one's.
    fn connection_owner(&self, client: &Downstream) -> Option<IpAddr> {
        let sends = self.balancer.generation().config.proxy.send.is_some();
        sends.then(|| client_key(client.peer))
    }

    fn report(&self, report: Report<'_, Target>) {
        match report {
            Report::ConnectFailed {
                server,
                client,
                error,
            } => {
                let s = &server.0;
                let error = ConnectError::ClosedBeforeRequest(error.to_string());
                self.span.in_scope(|| {
                    self.balancer.connect_failed(
                        s,
                        s.is_quarantined(),
                        &error,
                        client.or_unspecified(),
                    )
                });
            }
            Report::Opened { .. } | Report::Closed { .. } => {}
            Report::Exchange(exchange) => self.exchanged(exchange),
            Report::Tunnel(tunnel) => self.tunnel_ended(tunnel),
        }
    }

    /// Counted in the balancer's `MAX_CONNECTIONS`, with the accepted count and the last
    /// connection's time, from the connection's first request to a server on.
    fn admit(&self, _client: &Downstream, admission: &mut Admission) -> bool {
        // A kept-alive client's next request: counted already, at no cost.
        if matches!(admission, Admission::Client(_)) {
            return true;
        }
        let pool = self.balancer.generation();
        self.span
            .in_scope(|| self.balancer.admit_client(&pool, admission))
    }

    fn waiting(&self, admission: &Admission) -> Option<Duration> {
        query::limits::waiting(admission)
    }

    fn intercepts(&self, target: &[u8]) -> bool {
        query::intercepts(&self.balancer, target)
    }

    /// A query is counted in a query place while the connection is no client (a monitor
    /// polling the status page is never one), or answered 503 when none is free.
    fn intercept(
        &self,
        request: LocalRequest,
        admission: &mut Admission,
    ) -> impl Future<Output = LocalAnswer> + Send {
        let figures = || Some(self.figures());
        query::answer(&self.ctx, &self.balancer, request, admission, figures)
    }
}
