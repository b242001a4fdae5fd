//! The HTTP broker's engine: an HTTP/1.1 reverse proxy for `[BALANCE_HTTP*]` balancers, of
//! the broker's own over the pure HTTP/1.1 core ([`h1`]). It knows nothing of balancers: the
//! balancer stands behind the small [`Upstreams`] trait, which sees the client's head
//! borrowed ([`ClientHead`]) and is told what happened ([`Exchange`]), so the engine is built
//! and tested alone. [`Engine::serve`] serves one accepted client connection; its steps, in
//! order, and why each is as it is, are told once, in docs/architecture.md ("The HTTP
//! engine").
//!
//! # Layout
//!
//! - [`h1`]: the pure HTTP/1.1 core: heads parsed in place, framing, bodies checked as they
//!   pass, the outgoing head as slices, the reuse rule.
//! - [`engine`]: the wiring: client connections served, requests tried on the servers,
//!   answers passed back, the idle server connections, the buffers' pool, upgrades.
//! - [`h2`]: HTTP/2 towards clients: each stream one exchange of the engine's.
//! - `client_head`: the client's head as the balancer sees it.
//! - `local`: a request the balancer answers itself, and its answer, as any front gives them.
//! - `refusal`: why the broker answers a request itself.
//! - `real_client`: `HTTP_TRUSTED_PROXIES`: the client a trusted proxy's `X-Forwarded-For`
//!   names.
//! - `pages`: the broker's own answers (502, 503, 504, refusals) in the page language.
//! - [`stats`]: the figures METRICS reads.

mod client_head;
pub mod engine;
pub mod h1;
pub mod h2;
mod local;
pub mod pages;
mod real_client;
mod refusal;
pub mod stats;

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::{Method, StatusCode};

use crate::config::{BalancerConfig, BalancerKind, Cidr, General, Language};
use crate::net::relay::End;
use crate::net::stream::Stream;
use crate::support::budget::Budget;

pub use client_head::ClientHead;
pub use engine::{Engine, PoolFigures};
pub use local::{LocalAnswer, LocalBody, LocalRequest, MOST_LOCAL_BODY};
pub use stats::Stats;

/// The balancer as the HTTP engine sees it: who serves a request, how to reach it, and what
/// to account. Kept narrow so the engine knows nothing of configuration, quarantine or pages.
/// Its methods are declared in the order a request calls them (as pingora's `ProxyHttp`
/// phases read): its client held, the balancer's own answer, the connection admitted, the
/// server chosen and connected, the head rewritten, the connection kept or not, the report,
/// the wait for the next request.
pub trait Upstreams: Send + Sync + 'static {
    /// A server as the balancer knows it, displayed as its `host:port` (the `Host` of a
    /// request that named none). The pool keeps connections by it, so two values
    /// are equal exactly when they are the same server (the HTTP balancer's is a newtype over
    /// `Arc<balancer::Server>` compared by identity, so a reload that re-creates a server
    /// does not mix its connections with the old one's).
    type Server: Clone + Eq + Hash + fmt::Display + Send + Sync + Unpin + 'static;

    /// What the balancer counts while a request is in hand, and while an upgraded connection
    /// lives: the engine holds it that long and drops it after (the HTTP balancer's holds a
    /// `balancer::Lease`, which counts a connection against its server, and with session
    /// affinity what keeps a session alive while its WebSocket is open).
    type Lease: Send + Unpin + 'static;

    /// A connection to a server: plain TCP, or TLS when the balancer encrypts upstream (the
    /// dialer's stream, either). The pool keeps it as it is, so a kept-alive
    /// connection is reused over TLS as over TCP; an upgraded connection hands it back whole
    /// to the relay (splice when it is plain TCP).
    type Stream: Stream;

    /// Why a connect failed, as the balancer's dialer says (its typed error, which knows whom
    /// it blames).
    type ConnectError: ConnectFailure;

    /// What a request that came through a trusted proxy (`HTTP_TRUSTED_PROXIES`) holds for
    /// its client from its head to its answer's end: a proxy's connection carries many
    /// clients, so the HTTP balancer counts each such request against its own client's
    /// `MAX_CONNECTIONS_PER_CLIENT`, as it counts a direct client's connections.
    type ClientHold: Send + 'static;

    /// What a client connection holds as the balancer counts it, for the connection's life:
    /// nothing (the default) until its first request; while it asks only the balancer's own
    /// answers ([`Upstreams::intercept`]: queries), what a query connection holds; from its
    /// first request forwarded to a server on, what a client holds ([`Upstreams::admit`]).
    type Admission: Default + Send + 'static;

    /// A hold for `client`, whose request came through a trusted proxy (the client the
    /// proxy's `X-Forwarded-For` named, perhaps unknown, or the proxy itself when it sent
    /// none); `None` when that client has its fill: the request is answered 503 with
    /// `Retry-After`.
    fn hold_client(&self, client: &Downstream) -> Option<Self::ClientHold>;

    /// Whether the request for `target` (its path and query) is the balancer's to answer
    /// itself ([`Upstreams::intercept`]: the query interface, routed by path on an HTTP
    /// balancer) rather than a server's. Asked of every request before any server is chosen,
    /// so it is a comparison of bytes, allocating nothing. False (the default): every request
    /// goes to a server.
    fn intercepts(&self, _target: &[u8]) -> bool {
        false
    }

    /// The balancer's own answer to a request [`Upstreams::intercepts`] took, counted in what
    /// the connection holds (`admission`: a query's place while it is no client). It may
    /// await (a body is read already; a check that blocks runs elsewhere meanwhile), and the
    /// request is the balancer's own type, whatever front it came by.
    fn intercept(
        &self,
        _request: LocalRequest,
        _admission: &mut Self::Admission,
    ) -> impl Future<Output = LocalAnswer> + Send {
        std::future::ready(LocalAnswer::new(404, "not found\n"))
    }

    /// Counts the connection of `client` as the balancer's client, at a request that goes to
    /// a server (its first: `admission` says what the connection holds so far, and keeps
    /// what it holds from now on). False when the balancer takes no more clients now: the
    /// request is answered 503 with `Retry-After` and the connection closed.
    fn admit(&self, client: &Downstream, admission: &mut Self::Admission) -> bool;

    /// What one stream of a connection that carries several at once (HTTP/2) holds as the
    /// balancer counts it: its share of `connection`'s admission, which all the connection's
    /// streams share, so the connection is counted once (one `MAX_CONNECTIONS` place, one
    /// query place) however many streams it carries. The default: each stream counted as a
    /// connection of its own.
    fn stream_admission(&self, _connection: &Arc<Mutex<Self::Admission>>) -> Self::Admission {
        Self::Admission::default()
    }

    /// The server for this request, none of `tried` (servers that already failed it); `None`
    /// when no server is available, answered 503. `request` is the client's head as received
    /// (its cookies are there for affinity).
    fn choose(
        &self,
        request: &ClientHead<'_>,
        client: &Downstream,
        tried: &[Self::Server],
    ) -> Option<Choice<Self>>;

    /// The client a new server connection for `client`'s request belongs to, when it names
    /// one to the server (a PROXY protocol header, `SEND_PROXY_PROTOCOL`): the pool then
    /// gives it to that client's requests only, never another's. `None` (the default): any
    /// request may reuse it.
    fn connection_owner(&self, _client: &Downstream) -> Option<IpAddr> {
        None
    }

    /// A new connection to `server` for `client`'s request, within the balancer's connect
    /// timeout, its TLS handshake done when the balancer encrypts upstream. The balancer
    /// accounts for the connect itself, either way (a failure quarantines the server as it
    /// says); an error means nothing of the request reached the server, and the next
    /// candidate is tried, unless the error says none can be reached now
    /// ([`ConnectFailure::try_next`]).
    fn connect(
        &self,
        server: &Self::Server,
        client: &Downstream,
    ) -> impl Future<Output = Result<Self::Stream, Self::ConnectError>> + Send;

    /// A last change of the balancer's own to the head a server is sent (the affinity takes
    /// its cookie out here), made on `head`, the changes the engine made already (hop-by-hop
    /// lines out, `X-Forwarded-*`); `request` is the client's head as received.
    fn rewrite(&self, _request: &ClientHead<'_>, _head: &mut h1::Editor) {}

    /// False once `server` has left the balancer (a reload removed it): a connection to it
    /// that finishes its request is closed, not pooled. A request chosen just before the
    /// reload may still be connecting when the pool forgets the server; without this its
    /// connection would wait in the pool, open, until the idle timeout.
    fn keeps(&self, _server: &Self::Server) -> bool {
        true
    }

    /// What happened, for quarantine, accounting and the access log. Called on the data
    /// path: keep it short (counters, a log line), never blocking.
    fn report(&self, report: Report<'_, Self::Server>);

    /// The connection waits for its next request: what it holds may be given to another
    /// (a query connection's place, to a new query that finds none free). What it returns
    /// bounds that wait when it is shorter than `HTTP_REQUEST_TIMEOUT` (a query connection's
    /// head and life); `None` (the default) leaves the setting.
    fn waiting(&self, _admission: &Self::Admission) -> Option<Duration> {
        None
    }

    /// A connection that carries several requests at once (HTTP/2), which has no next
    /// request to wait for, is sent a new one: what it holds is held again (a query
    /// connection's place, no longer to be given to another), or the connection ends as an
    /// HTTP/1.1 one would at that request ([`NewStream`]). The default: served.
    fn resumed(&self, _admission: &Self::Admission) -> NewStream {
        NewStream::Serve
    }
}

/// What a connection carrying several requests at once (HTTP/2) does with a new one, as its
/// balancer says ([`Upstreams::resumed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewStream {
    /// Served as usual.
    Serve,
    /// Served, and the connection ends after it (`GOAWAY`): a query connection past its life.
    ServeLast,
    /// Refused unprocessed (`REFUSED_STREAM`, which the client sends again on a new
    /// connection) and the connection ended: a query connection whose place went to another
    /// query while it idled, as an idle HTTP/1.1 one is closed unanswered.
    Refuse,
}

/// A failed connect as the engine weighs it: whether the next server is worth trying.
pub trait ConnectFailure: std::error::Error + Send + Sync + 'static {
    /// False when the failure is the broker's own (out of descriptors, local ports or
    /// memory; its TLS towards the servers not loaded): no other server can be connected now
    /// either, so the request is answered 503 at once ([`ExchangeOutcome::BrokerFault`]) instead of
    /// failing once more per server, each failure counted against the broker again (at
    /// wiring: the dialer's retry flag, as pingora's errors carry one).
    fn try_next(&self) -> bool;
}

/// The balancer's decision for one request.
pub struct Choice<U: Upstreams + ?Sized> {
    /// Where the request goes.
    pub server: U::Server,
    /// Held while the request (or its upgraded connection) is in hand.
    pub lease: U::Lease,
    /// A `Set-Cookie` value added to the server's answer (the affinity's); not to the
    /// broker's own pages.
    pub set_cookie: Option<String>,
}

impl<U: Upstreams + ?Sized> Choice<U> {
    /// A choice of `server` that adds nothing to the answer.
    pub fn of(server: U::Server, lease: U::Lease) -> Choice<U> {
        Choice {
            server,
            lease,
            set_cookie: None,
        }
    }
}

/// The client's end of a connection, as the request's rewriting and the access log need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Downstream {
    /// The client (`X-Real-IP`, `QUERY_ALLOW`, the access log): the connection's peer, or,
    /// for one request, the client a trusted proxy's `X-Forwarded-For` names
    /// (`HTTP_TRUSTED_PROXIES`), which may be unknown.
    pub peer: ClientAddr,
    /// A PROXY protocol header named the client, sent by a front off this host (the
    /// connection's own peer not on loopback: `ClientOrigin::front_off_host`). A flag, not the
    /// address: it is all that is asked of it, and every idle connection carries it.
    pub front_off_host: bool,
    /// Whether the client came over TLS (`X-Forwarded-Proto: https`, the cookie's `Secure`).
    pub tls: bool,
    /// Where the client connected, when known (a PROXY protocol header's destination, or the
    /// accepted socket's own address): the destination a header sent on to a server names.
    pub local: Option<SocketAddr>,
    /// The connection is a front balancer's own health check (a PROXY protocol v2 `LOCAL`
    /// header): its queries are answered (HAProxy's `check-send-proxy` with an `httpchk` of
    /// `READY`), any other request refused with a page saying why, never forwarded, as on a
    /// TCP balancer.
    pub check: bool,
}

/// Who a request is for, as far as the broker can tell. Its own connections' peers, and the
/// clients PROXY protocol headers name, are addresses; behind a trusted proxy
/// (`HTTP_TRUSTED_PROXIES`) the client is the one its `X-Forwarded-For` names, and unknown when
/// an item that is no address comes before any untrusted one. A distinct value rather than
/// an address of the proxy's, so that nothing a request says can make its client the proxy:
/// an unknown client is refused every query, named to no server, and shares one count under
/// `MAX_CONNECTIONS_PER_CLIENT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientAddr {
    /// A client at this address (a chain's client carries the proxy's port: a chain has
    /// none, and the log wants one).
    Known(SocketAddr),
    /// A client no usable address names.
    Unknown,
}

impl ClientAddr {
    /// Its address, when it is known.
    pub fn known(self) -> Option<SocketAddr> {
        match self {
            ClientAddr::Known(address) => Some(address),
            ClientAddr::Unknown => None,
        }
    }

    /// Its IP address, when it is known.
    pub fn ip(self) -> Option<IpAddr> {
        self.known().map(|address| address.ip())
    }

    /// Its address for what names clients by address only (the balancer's events, its
    /// per-client lines): an unknown client as the unspecified address `[::]:0`, which no
    /// client connects from and no trusted chain names.
    pub fn or_unspecified(self) -> SocketAddr {
        self.known()
            .unwrap_or(SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)))
    }
}

impl From<SocketAddr> for ClientAddr {
    fn from(address: SocketAddr) -> ClientAddr {
        ClientAddr::Known(address)
    }
}

/// The address, or `unknown`, as the access log writes it.
impl fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientAddr::Known(address) => address.fmt(f),
            ClientAddr::Unknown => f.write_str("unknown"),
        }
    }
}

/// What the engine tells the balancer.
#[derive(Debug)]
pub enum Report<'a, S> {
    /// A new connection to `server` (its connect accounted for already) failed before any
    /// byte of the request reached the server: the server closed it first. Quarantine it, as
    /// a failed connect; the request goes on to the next candidate.
    ConnectFailed {
        /// The server.
        server: &'a S,
        /// The client whose request it was for.
        client: ClientAddr,
        /// Why, in the engine's words.
        error: &'a str,
    },
    /// A connection to `server` opened (pooled, then perhaps upgraded): one more of the
    /// server's connections.
    Opened {
        /// The server.
        server: &'a S,
    },
    /// A connection to `server` closed (idle too long, closed by the server, failed, or an
    /// upgraded connection ended).
    Closed {
        /// The server.
        server: &'a S,
    },
    /// A request is finished (its answer sent, or given up; an upgraded one when its tunnel
    /// ends): the access log's line.
    Exchange(&'a Exchange<S>),
    /// An upgraded connection (WebSocket) ended. Its request is reported just after it, as an
    /// [`Exchange`] whose bytes and duration include the tunnel's.
    Tunnel(&'a Tunnel<S>),
}

/// The HTTP version a client spoke, for the access log and the figures by protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// HTTP/1.1 (or 1.0), over TCP or TLS.
    #[default]
    Http1,
    /// HTTP/2, over TLS (ALPN `h2`): a stream of a connection.
    H2,
}

impl Protocol {
    /// Every protocol, in the order the figures count them.
    pub const ALL: [Protocol; 2] = [Protocol::Http1, Protocol::H2];

    /// The protocol of a stream that says `protocol` ([`Stream::protocol`]): HTTP/2 when it
    /// is `h2`, else HTTP/1.1.
    pub fn of(protocol: Option<&[u8]>) -> Protocol {
        match protocol {
            Some(b"h2") => Protocol::H2,
            _ => Protocol::Http1,
        }
    }

    /// Its name as ALPN writes it (`http/1.1`, `h2`): the access log's and METRICS' label.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http1 => "http/1.1",
            Protocol::H2 => "h2",
        }
    }

    /// Its place in [`Protocol::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One request, as the access log and the counters see it once it is finished.
#[derive(Debug, Clone)]
pub struct Exchange<S> {
    /// Who asked.
    pub client: ClientAddr,
    /// The HTTP version it came in.
    pub protocol: Protocol,
    /// The request's method.
    pub method: Method,
    /// The request's target as received (path and query), as text.
    pub uri: String,
    /// The status the client was sent (the server's, or the broker's own); `None` when the
    /// client went away before any answer.
    pub status: Option<StatusCode>,
    /// The server that answered (or last failed); `None` when none was reached.
    pub server: Option<S>,
    /// Request body bytes sent to the server.
    pub to_server: u64,
    /// Response body bytes sent to the client.
    pub to_client: u64,
    /// From the request's head received to its answer's last byte sent.
    pub duration: Duration,
    /// How it went.
    pub outcome: ExchangeOutcome,
}

/// How a request went: the broker's part in its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeOutcome {
    /// The server's answer was sent whole.
    Served,
    /// The balancer answered it itself ([`Upstreams::intercept`]: a query), or the broker did
    /// as its last recipient (an `OPTIONS` with `Max-Forwards: 0`).
    Local,
    /// The broker refused the request itself (CONNECT, TRACE, a transfer coding it cannot
    /// frame, a missing or invalid `Host`, a request line too long).
    Refused,
    /// No server could take it: 503.
    NoServer,
    /// The broker itself could not connect to a server (out of descriptors, local ports or
    /// memory): 503 at once, no other server tried and none blamed.
    BrokerFault,
    /// The server failed after the request was sent (closed, reset, answered garbage): 502.
    ServerFailed(String),
    /// The server sent no answer within the response timeout (504), or stopped sending its
    /// answer's body for that long (the client's connection cut).
    ServerTimeout,
    /// The client's body broke off or was malformed (a bad chunk) while it was sent on: 400,
    /// the client's fault.
    ClientFailed,
    /// The client's body stopped coming for the body timeout: 408, or the connection closed
    /// when the answer had begun. The client's fault too.
    ClientTimeout,
    /// The answer started but did not finish: the server or the client broke off midway.
    Incomplete,
    /// The request's upgraded connection (WebSocket) ended otherwise than by both sides
    /// closing: an error on one side, `IDLE_TIMEOUT`, the broker's stop or an operator's cut.
    /// (One that both sides closed is [`ExchangeOutcome::Served`]: a tunnel is a byte relay,
    /// its protocol's own close codes are not read.)
    TunnelBroken(End),
}

/// The engine's settings, from the balancer's keys (swapped by a reload with
/// [`Engine::set_settings`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `HTTP_FORWARDED_HEADERS`: add `X-Forwarded-For`, `-Proto`, `-Host` and `X-Real-IP`.
    pub forwarded_headers: bool,
    /// `HTTP_UPGRADE_PROTOCOLS`: the protocols a request may switch to (`websocket`), matched
    /// in any case; a request asking for another goes on as plain HTTP.
    pub upgrade_protocols: Vec<String>,
    /// `HTTP_POOL_MAX_IDLE`: idle connections kept per server and worker thread.
    pub max_idle: usize,
    /// `HTTP_POOL_IDLE_TIMEOUT`: an idle connection older than this is closed, not reused.
    pub idle_timeout: Duration,
    /// `HTTP_REQUEST_TIMEOUT`: a request's head must arrive within this (from the end of the
    /// previous answer on a kept-alive connection); past it the connection is closed.
    pub request_timeout: Duration,
    /// `HTTP_RESPONSE_TIMEOUT`: the longest wait for an answer's head once the whole request
    /// was sent (past it, 504), and the longest silence within the answer's body (past it,
    /// the client's connection is cut).
    pub response_timeout: Duration,
    /// `HTTP_BODY_TIMEOUT`: the longest silence within a request's body; past it, 408 when
    /// no answer has begun, else the client's connection is closed.
    pub body_timeout: Duration,
    /// `HTTP_RETRY_IDEMPOTENT`: a request with an idempotent method and no body that failed
    /// after it was sent, with no byte of an answer, is tried on the next server.
    pub retry_idempotent: bool,
    /// `IDLE_TIMEOUT`: an upgraded connection (WebSocket) with no bytes either way for this
    /// long is closed, as a relayed TCP connection is. `None`: never.
    pub tunnel_idle_timeout: Option<Duration>,
    /// `LANGUAGE`: the language of the broker's own pages (503...).
    pub language: Language,
    /// The `Retry-After` of a 503.
    pub retry_after: Duration,
    /// `HTTP_TRUSTED_PROXIES`: the peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<Cidr>,
    /// `HTTP_HEAD_MEMORY`: the broker's one budget for request heads still arriving, shared
    /// by every HTTP balancer.
    pub head_memory: Arc<Budget>,
    /// `HTTP2_MAX_STREAMS`: the streams one HTTP/2 connection may have in hand at once.
    pub http2_max_streams: u32,
    /// `HTTP2_WEBSOCKET`: WebSocket over HTTP/2 is offered (when `websocket` is among the
    /// upgrade protocols too).
    pub http2_websocket: bool,
    /// Whether an HTTP/1.1 request must name its `Host`: it must where requests go on to
    /// servers; a TCP port's query connection takes one that names none, as it always has.
    pub host: h1::HostRule,
}

impl Settings {
    /// The engine's settings from a balancer's keys (`config`), the page language, and the
    /// broker's `HTTP_HEAD_MEMORY` budget.
    pub fn from_config(
        config: &BalancerConfig,
        language: Language,
        head_memory: Arc<Budget>,
    ) -> Settings {
        let keys = &config.http;
        Settings {
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
            retry_after: Duration::from_secs(5),
            trusted_proxies: keys.trusted_proxies.clone(),
            head_memory,
            host: h1::HostRule::Required,
            http2_max_streams: keys.http2_max_streams,
            http2_websocket: keys.http2_websocket,
        }
    }
}

impl Default for Settings {
    /// The keys' defaults, written once, in the configuration's model
    /// ([`BalancerConfig::defaults`], [`General::defaults`]).
    fn default() -> Settings {
        let general = General::defaults();
        let config = BalancerConfig::defaults(BalancerKind::Http("BALANCE_HTTP"));
        let head_memory = Budget::new(general.http_head_memory);
        Settings::from_config(&config, general.language, head_memory)
    }
}

/// An upgraded connection (WebSocket), once it ended.
#[derive(Debug, Clone)]
pub struct Tunnel<S> {
    /// Who asked for it.
    pub client: ClientAddr,
    /// The server it went to.
    pub server: S,
    /// Bytes from the client to the server after the upgrade.
    pub to_server: u64,
    /// Bytes from the server to the client after the upgrade.
    pub to_client: u64,
    /// How long it was open.
    pub duration: Duration,
    /// Why it ended, as the relay says.
    pub end: End,
}
