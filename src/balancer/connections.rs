//! A connection's events, one method each, as the connection paths report them: an accept
//! that failed or succeeded, a client's TLS handshake, a client refused at `MAX_CONNECTIONS`
//! or admitted, the dial of a server and its outcome (which may quarantine the server), a
//! client closed without a server, a relayed connection's end. Each counts what it must,
//! publishes its [`Event`] and writes its log line, once per episode where a line per client
//! would flood the log.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tracing::{Span, debug, error, info, warn};

use crate::balancer::Balancer;
use crate::balancer::events::{Event, Unserved};
use crate::balancer::generation::Generation;
use crate::balancer::rules::health::{Reason, Release};
use crate::balancer::server::Server;
use crate::config::Monitoring;
use crate::net::connector::{ConnectReport, Connector};
use crate::net::dial::ConnectError;
use crate::net::handshake::ProxyRefusal;
use crate::net::relay::{End, RelayOutcome};
use crate::support::os_error::PointsAt;
use crate::tls::HandshakeFailure;

/// A connect to one server for one client, as the balancer counts it: a [`Connector`]'s
/// outcome, accounted once ([`Balancer::connected`] or [`Balancer::connect_failed`]). A
/// lookup not tried for `DNS_MAX_LOOKUPS` is no failure of the server: it is not counted.
#[derive(Debug)]
pub struct Attempt<'a> {
    balancer: &'a Balancer,
    server: &'a Server,
    stale: bool,
    client: SocketAddr,
}

impl ConnectReport for Attempt<'_> {
    fn connected(&self) {
        self.balancer.connected(self.server, self.stale);
    }

    fn failed(&self, error: &ConnectError) {
        let (client, server) = (self.client, self.server);
        if let ConnectError::ResolverBusy { .. } = error {
            // As after a connect timeout, the next candidate; the resolver says it once.
            debug!(client = %client, server = %server.address, "not tried: DNS_MAX_LOOKUPS lookups in flight");
            return;
        }
        self.balancer
            .connect_failed(server, self.stale, error, client);
    }
}

/// A relayed connection as it ended, for [`Balancer::ended`]: a TCP client's, or an HTTP
/// connection's after its upgrade (a WebSocket's tunnel).
#[derive(Debug)]
pub struct Closed<'a> {
    /// The client's address.
    pub client: SocketAddr,
    /// How long the connection lasted, from its accept (a tunnel: from its upgrade).
    pub duration: Duration,
    /// Bytes from the client to the server.
    pub to_server: u64,
    /// Bytes from the server to the client.
    pub to_client: u64,
    /// How the relay ended.
    pub end: &'a End,
}

impl<'a> Closed<'a> {
    /// A connection of `client` that lasted `duration` and whose relay did `outcome`.
    pub fn relayed(
        client: SocketAddr,
        duration: Duration,
        outcome: &'a RelayOutcome,
    ) -> Closed<'a> {
        Closed {
            client,
            duration,
            to_server: outcome.to_server,
            to_client: outcome.to_client,
            end: &outcome.end,
        }
    }
}

impl Balancer {
    /// A client's TLS handshake failed: counted by cause; the first of an episode is logged
    /// with its cause (one line, not one per client). No server is to blame.
    pub fn handshake_failed(&self, client: SocketAddr, failure: &HandshakeFailure) {
        *self
            .handshake_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(failure.cause.label())
            .or_default() += 1;
        if self.handshake_episode.strike() {
            warn!(
                client = %client,
                "TLS handshake with a client failed: {failure}; further failures are counted \
                 in METRICS until one succeeds"
            );
        } else {
            debug!(client = %client, "TLS handshake failed: {failure}");
        }
    }

    /// A client's TLS handshake succeeded: ends an episode of failures with a line.
    pub fn handshake_done(&self) {
        if let Some(failed) = self.handshake_episode.end() {
            info!("TLS handshakes with clients succeed again; {failed} failed before");
        }
    }

    /// Failed TLS handshakes with clients so far, by cause.
    pub fn handshake_failures(&self) -> BTreeMap<&'static str, u64> {
        self.handshake_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A connection refused at the PROXY protocol step, from `peer`: counted by cause; the
    /// first of an episode is logged with its cause (one line, not one per connection).
    pub fn proxy_header_refused(&self, peer: SocketAddr, refusal: &ProxyRefusal) {
        *self
            .proxy_refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(refusal.label())
            .or_default() += 1;
        self.events.emit(|| Event::ProxyHeaderRefused {
            balancer: self.kind(),
            peer,
            cause: refusal.label(),
        });
        if self.proxy_episode.strike() {
            warn!(
                peer = %peer,
                "connection from {peer} closed: {refusal}; further ones are counted in METRICS \
                 until a PROXY protocol header is read again"
            );
        } else {
            debug!(peer = %peer, "connection closed: {refusal}");
        }
    }

    /// A PROXY protocol header was read: ends an episode of refusals with a line.
    pub fn proxy_header_read(&self) {
        if let Some(refused) = self.proxy_episode.end() {
            info!(
                "PROXY protocol headers are read again; {refused} connections were refused before"
            );
        }
    }

    /// Connections refused at the PROXY protocol step so far, by cause.
    pub fn proxy_refusals(&self) -> BTreeMap<&'static str, u64> {
        self.proxy_refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A client refused at `MAX_CONNECTIONS` (`local`: the socket it came to, when known; else
    /// the balancer's address is named); the first of an episode is logged.
    pub fn refused(&self, local: Option<SocketAddr>) {
        self.stats.rejected.fetch_add(1, Relaxed);
        self.events.emit(|| Event::Refused {
            balancer: self.kind(),
        });
        if self.refusals.strike() {
            let config = &self.generation().config;
            warn!(
                "MAX_CONNECTIONS ({}) reached on {}: new clients are closed at once until some leave",
                config.max_connections,
                local.unwrap_or(config.listen)
            );
        }
    }

    /// A client admitted below the limit: ends a refusal episode, if any, with a line.
    pub fn admitted(&self) {
        if let Some(refused) = self.refusals.end() {
            info!("accepting clients again: {refused} refused while MAX_CONNECTIONS was reached");
        }
    }

    /// The connector of `generation`'s servers ([`Connector`]): the one dial path of both
    /// engines, a TCP client's and an HTTP request's, each connect reported to an
    /// [`Attempt`] ([`Balancer::attempt`]).
    pub fn connector<'a>(&'a self, generation: &'a Generation) -> Connector<'a> {
        Connector {
            resolver: &self.resolver,
            config: &generation.config,
            tls: generation.tls.upstream.as_ref(),
        }
    }

    /// A connect to `server` for `client`, as the balancer counts it (`stale`: the server was
    /// chosen although quarantined): what a [`Connector`] reports to.
    pub fn attempt<'a>(
        &'a self,
        server: &'a Server,
        stale: bool,
        client: SocketAddr,
    ) -> Attempt<'a> {
        Attempt {
            balancer: self,
            server,
            stale,
            client,
        }
    }

    /// A connect to `server` succeeded (`stale`: it was chosen although quarantined). A
    /// connect proves what a CONNECTION check proves, so a stale quarantine ends (not one
    /// found by a SEND_EXPECT or HTTP check, which a connect cannot overrule, nor one for
    /// requests that timed out); a broker fault episode ends.
    fn connected(&self, server: &Server, stale: bool) {
        server.total.fetch_add(1, Relaxed);
        server.health.connected();
        // A connect proves the port accepts, nothing more: not that a server quarantined for
        // not answering its requests (`timeout`) answers them now.
        if stale
            && server.quarantine_reason() != Some(Reason::Timeout)
            && !matches!(
                self.generation.load().config.monitoring,
                Monitoring::SendExpect { .. } | Monitoring::Http { .. }
            )
        {
            self.release_recovered(server, Release::ClientConnected);
        }
        if let Some(unserved) = self.broker_faults.end() {
            let were = if self.kind().is_http() {
                "requests were answered 503"
            } else {
                "were closed"
            };
            info!("connecting clients again: {unserved} {were} while the broker lacked resources");
        }
    }

    /// A connect to `server` for `client` failed with `error` (`stale`: the server was chosen
    /// although quarantined). A cause that blames anyone but the broker counts against the
    /// server and quarantines it (unless its quarantine is what the choice went around); a
    /// cause that is the broker's own blames no server. Reported by a [`Connector`], and by
    /// the HTTP engine for a new connection the server closed before it took the request.
    pub fn connect_failed(
        &self,
        server: &Server,
        stale: bool,
        error: &ConnectError,
        client: SocketAddr,
    ) {
        let error = error.explain();
        let blamed = error.points_at != PointsAt::Broker;
        self.events.emit(|| Event::ConnectFailed {
            balancer: self.kind(),
            client,
            server: server.address.clone(),
            error: error.to_string(),
            blamed,
        });
        if !blamed {
            if self.broker_faults.strike() {
                let they = if self.kind().is_http() {
                    "their requests are answered 503"
                } else {
                    "they are closed"
                };
                error!(
                    server = %server.address,
                    "cannot connect clients: {error}; {they} and no server is blamed until \
                     this clears"
                );
            }
            return;
        }
        server.failed_connects.fetch_add(1, Relaxed);
        if stale {
            // Already quarantined; the monitor keeps it there. One line per client and
            // server here would flood the log during an outage.
            debug!(client = %client, "server {} still unreachable: {error}", server.address);
        } else {
            error!(client = %client, "cannot connect to server {}: {error}", server.address);
            self.quarantine(server, Reason::Connect, &error.words);
        }
    }

    /// A client closed without a server.
    pub fn unserved(&self, client: SocketAddr, why: Unserved) {
        self.stats.unserved.fetch_add(1, Relaxed);
        self.events.emit(|| Event::Unserved {
            balancer: self.kind(),
            client,
            why,
        });
        if why == Unserved::NoServer
            && let Some(suppressed) = self.no_servers_log.allow()
        {
            // An HTTP client is answered 503 and may send its next request.
            let then = if self.kind().is_http() {
                "the request is answered 503"
            } else {
                "the client is closed"
            };
            error!(
                more_since_last_line = suppressed,
                client = %client,
                "no remote servers available; {then}"
            );
        }
    }

    /// A connection relayed to `server` ended (a TCP client's, or an HTTP connection's after
    /// its upgrade): its closing line, in `span` (always for an idle close, which the broker
    /// decided; otherwise with `generation`'s `LOG_CONNECTIONS`; at debug for a connection
    /// that carried no byte either way). The one account of both paths' relayed connections.
    pub fn ended(
        &self,
        server: &Server,
        generation: &Generation,
        closed: &Closed<'_>,
        span: &Span,
    ) {
        self.events.emit(|| Event::ConnectionEnded {
            balancer: self.kind(),
            client: closed.client,
            server: server.address.clone(),
            duration: closed.duration,
            bytes_from_client: closed.to_server,
            bytes_to_client: closed.to_client,
            ended_by: closed.end.clone(),
        });
        if closed.to_server == 0 && closed.to_client == 0 {
            // Nothing either way: a browser's speculative connection, a port check. Counted as
            // any (its server took a connection), told at debug only: a demo session's page
            // views wrote a dozen such lines among the ones that matter.
            span.in_scope(|| {
                debug!(
                    duration = %format_args!("{:.3}s", closed.duration.as_secs_f64()),
                    ended_by = %closed.end,
                    client = %closed.client,
                    server = %server.address,
                    "connection closed without a byte either way"
                );
            });
            return;
        }
        if generation.config.log_connections || matches!(closed.end, End::Idle) {
            span.in_scope(|| {
                info!(
                    duration = %format_args!("{:.3}s", closed.duration.as_secs_f64()),
                    bytes_from_client = closed.to_server,
                    bytes_to_client = closed.to_client,
                    ended_by = %closed.end,
                    client = %closed.client,
                    server = %server.address,
                    "connection closed"
                );
            });
        }
    }

    /// An accept failed for the broker's own reasons (descriptors, memory); the first of an
    /// episode is logged, saying the accept loop retries every `backoff`.
    pub fn accept_failed(&self, error: &io::Error, backoff: Duration) {
        if self.accept_failures.strike() {
            error!(
                "cannot accept clients: {} ({}); retrying every {} ms, connections in \
                 progress are unaffected",
                crate::support::os_error::words(error),
                crate::support::os_error::errno_name(error).unwrap_or("error"),
                backoff.as_millis()
            );
        }
    }

    /// An accept succeeded: ends an episode of failed accepts, if any, with a line.
    pub fn accepted(&self) {
        if let Some(failed) = self.accept_failures.end() {
            info!("accepting clients again after {failed} failed accepts");
        }
    }
}
