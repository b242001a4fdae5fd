//! What a balancer's accept loops hand their connections to (the listener's [`Serve`], given
//! by the running balancer): each connection is refused at `MAX_CONNECTIONS` (unless it may
//! be a query), closed when the balancer's TLS keys did not load, made ready once at the
//! listener layer (its PROXY protocol header read with `PROXY_PROTOCOL=1`, then secure as its
//! port's TLS says: [`Accepted::proxy_header`], [`Accepted::handshake`]; each outcome
//! counted here), then handed by the balancer's kind to the TCP client or the HTTP engine,
//! with whom it serves ([`ClientOrigin`]: the client a header named, else the peer). A plain port's
//! connection without the PROXY protocol goes straight on, without a task of its own before
//! the one that serves it.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::either::Either;
use tracing::debug;

use crate::balancer::Generation;
use crate::config::{Keepalive, Language};
use crate::http::{self, Downstream};
use crate::http_balancer::{self, HttpProxy};
use crate::net::handshake::{
    Accepted, ClientOrigin, ClientStream, Handshake, PortProxy, PortTls, ProxyStep,
};
use crate::net::listener::Serve;
use crate::net::stream::Stream;
use crate::tcp::client::{ListenerShared, TcpClient};
use crate::tls::HandshakeFailure;

/// A listening socket's hand-off: what its connections share, and the engine that serves
/// them when the balancer speaks HTTP.
pub(super) struct Handoff {
    /// What every connection of the socket shares.
    pub(super) shared: Arc<ListenerShared>,
    /// The HTTP engine of an HTTP balancer; `None` for a TCP balancer, whose connections are
    /// [`TcpClient`]s.
    pub(super) http: Option<Arc<HttpProxy>>,
}

impl Serve for Handoff {
    fn keepalive(&self) -> Keepalive {
        self.shared.balancer.generation().config.keepalive
    }

    /// Past `MAX_CONNECTIONS` a client is closed at once (a clear refusal beats a hang in the
    /// backlog), unless it may turn out to be a query: operators look then. On a port with
    /// the PROXY protocol or TLS, those steps come first, in the task that then serves the
    /// connection.
    fn start(&self, accepted: Accepted) {
        let shared = &self.shared;
        let generation = shared.balancer.generation();
        let at_limit = shared.balancer.at_limit(&generation);
        if at_limit && !generation.config.query.enabled {
            shared.balancer.refused(shared.local);
        } else if generation.tls_missing() {
            debug!(client = %accepted.peer, "closed: the balancer's TLS keys are not loaded");
        } else if generation.tls.server.is_none() && !generation.config.proxy.accept {
            let Accepted { stream, origin, .. } = accepted;
            match &self.http {
                Some(proxy) => serve_http(proxy, shared, stream, downstream(&origin, false)),
                None => {
                    let client = TcpClient::new(Arc::clone(shared), generation, stream, origin);
                    shared.tasks.spawn(client.run(at_limit));
                }
            }
        } else {
            let owned = Arc::clone(shared);
            match self.http.clone() {
                Some(proxy) => shared.tasks.spawn(async move {
                    if let Some((stream, origin)) =
                        prepare(&owned, &generation, accepted, true).await
                    {
                        let tls = matches!(stream, Either::Right(_));
                        serve_http(&proxy, &owned, stream, downstream(&origin, tls));
                    }
                }),
                None => shared.tasks.spawn(async move {
                    if let Some((stream, origin)) =
                        prepare(&owned, &generation, accepted, false).await
                    {
                        TcpClient::new(owned, generation, stream, origin)
                            .run(at_limit)
                            .await;
                    }
                }),
            };
        }
    }

    fn accepted(&self) {
        self.shared.balancer.accepted();
    }

    fn accept_failed(&self, error: &io::Error, backoff: Duration) {
        self.shared.balancer.accept_failed(error, backoff);
    }
}

/// What the HTTP engine is told of a connection: who the client is (the PROXY protocol's
/// when there was a header), whether it came over TLS (for `X-Forwarded-Proto`), and whether
/// it is a front balancer's check (a `LOCAL` header), which the engine never forwards.
fn downstream(origin: &ClientOrigin, tls: bool) -> Downstream {
    Downstream {
        peer: origin.client.into(),
        front_off_host: origin.front_off_host(),
        tls,
        local: origin.destination,
        check: origin.check,
    }
}

/// The listener layer's steps of a connection accepted on a port of `generation` that
/// has the PROXY protocol or TLS (`answers_plain`: an HTTP port, which tells plain HTTP to use
/// https): its header read, then its handshake. The stream to serve (plain or TLS) and whom
/// it serves; `None` when it was refused or is gone.
async fn prepare(
    shared: &ListenerShared,
    generation: &Generation,
    mut accepted: Accepted,
    answers_plain: bool,
) -> Option<(ClientStream, ClientOrigin)> {
    let config = &generation.config;
    if config.proxy.accept {
        let proxy = PortProxy {
            from: &config.proxy.from,
            timeout: config.proxy.timeout,
            direct_wait: config.query.sniff_timeout,
        };
        let (balancer, peer) = (&shared.balancer, accepted.peer);
        match accepted.proxy_header(&proxy).await {
            ProxyStep::Read => balancer.proxy_header_read(),
            ProxyStep::Direct => {}
            ProxyStep::Refused(refusal) => {
                shared
                    .span
                    .in_scope(|| balancer.proxy_header_refused(peer, &refusal));
                return None;
            }
            ProxyStep::Gone => return None,
        }
    }
    let origin = accepted.origin;
    let stream = match generation.tls.server.as_ref() {
        Some(_) => secure(shared, generation, accepted, answers_plain).await?,
        None => Either::Left(accepted.stream),
    };
    Some((stream, origin))
}

/// The TLS step of a connection accepted on a TLS port of `generation` (`answers_plain`:
/// an HTTP port, which tells plain HTTP to use https), and its accounting: a finished
/// handshake ends an episode of failed ones; a failed one is counted and logged once per
/// episode, blaming no server. The stream to serve, plain or TLS; `None` when the client is
/// gone (failed, answered, or closed first).
async fn secure(
    shared: &ListenerShared,
    generation: &Generation,
    accepted: Accepted,
    answers_plain: bool,
) -> Option<ClientStream> {
    let server = generation.tls.server.as_ref()?;
    let port = PortTls {
        server,
        plain_on_same_port: generation.config.tls.plain_on_same_port,
        answers_plain,
        first_byte_wait: generation.config.query.sniff_timeout,
    };
    let (balancer, client) = (&shared.balancer, accepted.origin.client);
    let failed = |failure: &HandshakeFailure| {
        shared
            .span
            .in_scope(|| balancer.handshake_failed(client, failure));
    };
    match accepted.handshake(&port).await {
        Handshake::Tls(stream) => {
            balancer.handshake_done();
            Some(Either::Right(stream))
        }
        Handshake::Plain(stream) => Some(Either::Left(stream)),
        Handshake::Failed(failure) => {
            failed(&failure);
            None
        }
        Handshake::PlainRefused(stream) => {
            failed(&HandshakeFailure::plain_http());
            let language = shared.ctx.config.load().general.language;
            answer_plain_http(stream, language).await;
            None
        }
        Handshake::Gone => None,
    }
}

/// Hands a connection, its TLS step done, to its HTTP balancer's engine (`client`: who, and
/// whether it came over TLS, for `X-Forwarded-Proto`), which counts it as a client (its
/// `MAX_CONNECTIONS` place) at its first request forwarded to a server.
fn serve_http<S: Stream>(
    proxy: &Arc<HttpProxy>,
    shared: &ListenerShared,
    stream: S,
    client: Downstream,
) {
    let ListenerShared { tasks, ending, .. } = shared;
    http_balancer::start(proxy, tasks, ending, stream, client);
}

/// Answers a plain HTTP request sent to a TLS-only HTTP port with a 400 page that says to use
/// https, as nginx does, through the engine's formatter and its lingering close (what the
/// client still sends is read and dropped for a while, so the close does not reset the
/// connection before the answer is read).
async fn answer_plain_http(mut stream: TcpStream, language: Language) {
    let answer = http::engine::plain_http_to_tls_port(language);
    http::engine::answer_and_close(&mut stream, &answer).await;
}
