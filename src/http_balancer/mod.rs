//! An HTTP balancer (`[BALANCE_HTTP*]`) at run time: the balancer as the HTTP engine's
//! [`Upstreams`](crate::http::Upstreams) (choose with the balancer's policy, connect with the
//! dialer, quarantine the servers that fail, account for every request and upgraded
//! connection), and each accepted connection handed to the engine with a `MAX_CONNECTIONS`
//! place.
//!
//! The query interface is routed by path here (`/TOTVS_BROKER_QUERY/...` is answered by the
//! balancer itself), so no client waits for a sniff. A request holds a [`Lease`] on its
//! server while in hand, and an upgraded connection (WebSocket) holds it until it ends: the
//! server's connections on the status page are the requests and WebSockets it serves now.
//!
//! This file holds the [`HttpBalancer`] and what a connection and a request hold; the rest is
//! a file per job:
//!
//! - `build`: the engine made for a balancer, its settings from the keys, and a reload
//!   applied to it.
//! - `upstreams`: the [`Upstreams`](crate::http::Upstreams) impl, a thin layer over the
//!   files beside it, its methods in the order a request calls them.
//! - `affinity`: where a request goes: its session's server, a cookie of the upgrade window,
//!   or the balancer's pick with a new cookie; the moves and the per-client cap logged per
//!   episode.
//! - `accounting`: a finished request and an ended tunnel accounted for: the server's
//!   traffic, its timeouts in a row (which may quarantine it), the access log; the figures a
//!   query shows.
//! - `sweep`: the sessions' expiry every second, and each server's count of sessions.
//! - [`sessions`]: HTTP session affinity, pure logic: the `TOTVS_BROKER_SH_001` cookie
//!   (signed, read from the `Cookie` header as bytes), its secrets, the table of live
//!   sessions.

mod accounting;
mod affinity;
mod build;
pub mod sessions;
mod sweep;
mod upstreams;

pub use build::{proxy, reconfigure};

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::time::Instant;
use tokio_util::either::Either;
use tokio_util::task::TaskTracker;
use tracing::Span;

use crate::balancer::shared::{EndSignals, Shared};
use crate::balancer::{Balancer, Lease, Server};
use crate::config::ServerId;
use crate::http::{self, ClientAddr, Downstream, Engine, Protocol};
use crate::http_balancer::sessions::{SessionSecrets, Sessions, Ticket};
use crate::net::stream::Stream;
use crate::support::throttle::{Episode, Throttle};

/// An HTTP balancer's engine.
pub type HttpProxy = Engine<HttpBalancer>;

/// A server of the balancer as the engine keys its pool: the balancer's own, compared by
/// identity, so a server a reload re-created never shares the old one's connections.
#[derive(Debug, Clone)]
pub struct ServerTarget(pub Arc<Server>);

impl PartialEq for ServerTarget {
    fn eq(&self, other: &ServerTarget) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ServerTarget {}

impl std::hash::Hash for ServerTarget {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

impl std::fmt::Display for ServerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.address)
    }
}

/// An HTTP balancer as its engine's [`Upstreams`](crate::http::Upstreams): the balancer, its session affinity and
/// its access log's state, behind the engine.
#[derive(Debug)]
pub struct HttpBalancer {
    balancer: Arc<Balancer>,
    ctx: Arc<Shared>,
    /// The keys of the session cookies, the broker's one set (a reload of `SESSION_SECRET` or
    /// `SESSION_SECRET_PREVIOUS` swaps them).
    session_secrets: Arc<SessionSecrets>,
    /// Who may act on servers from the status page (the broker's one set).
    operators: Arc<crate::query::Operators>,
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
pub struct RequestHold {
    /// The server's connection count.
    pub lease: Lease,
    /// The session pinned, and its table, when the request asked for an upgrade.
    pinned: Option<(Ticket, Arc<Mutex<Sessions>>)>,
}

impl Drop for RequestHold {
    fn drop(&mut self) {
        if let Some((ticket, sessions)) = self.pinned.take() {
            let mut table = sessions.lock().unwrap_or_else(|p| p.into_inner());
            table.closed(ticket, Instant::now());
        }
    }
}

/// Serves one accepted connection of an HTTP balancer (`client`: who, and whether `stream`
/// is TLS, for `X-Forwarded-Proto`): a hold under `MAX_CONNECTIONS_PER_CLIENT`, then the engine
/// until the client closes, which counts it as a client (its `MAX_CONNECTIONS` place) at its
/// first request forwarded to a server ([`Upstreams::admit`](crate::http::Upstreams::admit)); `ending.closing` answers the
/// request in hand and closes, `ending.cut` ends it at once (an upgraded connection too).
///
/// A connection over its client's limit takes no place another client needs: it is answered
/// 503 with `Retry-After` (once its first head comes, within `HTTP_REQUEST_TIMEOUT`) while
/// few of its client's, and of all, are being answered so ([`Balancer::answer_refusal`]), and
/// is closed at once beyond that.
pub fn start<S: Stream>(
    proxy: &Arc<HttpProxy>,
    tasks: &TaskTracker,
    ending: &EndSignals,
    stream: S,
    mut client: Downstream,
) {
    let balancer = &proxy.upstreams().balancer;
    let generation = balancer.generation();
    if generation.config.proxy.send.is_some() && client.local.is_none() {
        // The header sent on names where the client connected: the socket's own address.
        client.local = stream.socket().and_then(|s| s.local_addr().ok());
    }
    let (closing, cut) = (ending.closing.clone(), ending.cut.clone());
    let span = balancer.span();
    // A trusted proxy's connection carries many clients: not it but each of its requests is
    // counted, for the client it names (`Upstreams::hold_client`). A front balancer's check
    // (a `LOCAL` header) is no client: never counted, never forwarded.
    let hold = if client.check || client.is_trusted_proxy(&generation.config.http.trusted_proxies) {
        None
    } else {
        let key = client_key(client.peer);
        let Some(hold) = span.in_scope(|| balancer.hold_for_client(&generation, key)) else {
            if let Some(refusal) = balancer.answer_refusal(key) {
                let refusing = match Protocol::of(stream.protocol()) {
                    Protocol::H2 => {
                        Either::Left(http::h2::refuse(Arc::clone(proxy), stream, client, cut))
                    }
                    Protocol::Http1 => {
                        Either::Right(Arc::clone(proxy).serve_unavailable(stream, client, cut))
                    }
                };
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
    if Protocol::of(stream.protocol()) == Protocol::H2 {
        tasks.spawn(http::h2::serve(
            Arc::clone(proxy),
            stream,
            client,
            closing,
            cut,
            hold,
        ));
        return;
    }
    // The engine's future is the task's whole future: a future around it would carry its
    // arguments twice for the connection's life.
    let serving = Arc::clone(proxy).serve(stream, client, closing, cut, hold);
    tasks.spawn(serving);
}

/// What an HTTP client is counted by under `MAX_CONNECTIONS_PER_CLIENT`, and owns pooled
/// connections by under `SEND_PROXY_PROTOCOL`: its IP address; every unknown client (behind a
/// trusted proxy whose chain named no usable address) shares one, the unspecified address,
/// which no client connects from and no chain can name.
fn client_key(client: ClientAddr) -> IpAddr {
    client.or_unspecified().ip()
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
