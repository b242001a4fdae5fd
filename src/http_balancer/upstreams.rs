//! The HTTP balancer as the engine's [`Upstreams`]: a thin layer over the files beside it
//! (`affinity` chooses, `accounting` accounts), its methods in the order a request calls
//! them.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Duration;
use tracing::Instrument;

use crate::balancer::{Admission, ClientHold};
use crate::http::h1::Editor;
use crate::http::{
    Choice, ClientHead, ConnectFailure, Downstream, LocalAnswer, LocalRequest, NewStream, Report,
    Upstreams,
};
use crate::http_balancer::{HttpBalancer, RequestHold, ServerTarget, client_key};
use crate::net::dial::{ConnectError, ServerStream};
use crate::net::proxy_protocol::{self, Header};
use crate::query;

/// The dialer's retry flag, for the engine: after a failure that is the broker's own it tries
/// no other server, so a request meets the broker's fault (and is counted in its episode)
/// once, as a TCP client does.
impl ConnectFailure for ConnectError {
    fn try_next(&self) -> bool {
        ConnectError::try_next(self)
    }
}

impl Upstreams for HttpBalancer {
    type Server = ServerTarget;
    type Lease = RequestHold;
    type Stream = ServerStream;
    type ConnectError = ConnectError;
    type ClientHold = ClientHold;
    type Admission = Admission;

    /// Counted against `MAX_CONNECTIONS_PER_CLIENT` in the balancer's table of clients, with
    /// its direct connections; the refusal logged in the balancer's span.
    fn hold_client(&self, client: &Downstream) -> Option<ClientHold> {
        let generation = self.balancer.generation();
        let key = client_key(client.peer);
        self.span
            .in_scope(|| self.balancer.hold_for_proxied_request(&generation, key))
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
        let operators = &self.operators;
        query::answer(
            &self.ctx,
            &self.balancer,
            operators,
            request,
            admission,
            figures,
        )
    }

    /// Counted in the balancer's `MAX_CONNECTIONS`, with the accepted count and the last
    /// connection's time, from the connection's first request to a server on. A stream's
    /// request (HTTP/2) is counted on its connection's admission: the connection once.
    fn admit(&self, _client: &Downstream, admission: &mut Admission) -> bool {
        let mut shared;
        let admission = match admission {
            Admission::Stream(connection) => {
                shared = connection.lock().unwrap_or_else(|p| p.into_inner());
                &mut *shared
            }
            admission => admission,
        };
        // A kept-alive client's next request: counted already, at no cost.
        if matches!(admission, Admission::Client(_)) {
            return true;
        }
        let generation = self.balancer.generation();
        let admitted = self
            .span
            .in_scope(|| self.balancer.admit_client(&generation, admission, None));
        admission.forwarded();
        admitted
    }

    /// A request's server: its session's, or the balancer's pick with a new cookie
    /// ([`HttpBalancer::choose_server`]).
    fn choose(
        &self,
        request: &ClientHead<'_>,
        client: &Downstream,
        tried: &[ServerTarget],
    ) -> Option<Choice<Self>> {
        self.choose_server(request, client, tried)
    }

    /// With `SEND_PROXY_PROTOCOL` a server connection's header names one client: the
    /// connection is that client's alone (as HAProxy keeps a `send-proxy` connection private);
    /// one that names no one (`PROXY UNKNOWN`) is the unknown clients', never a named one's.
    fn connection_owner(&self, client: &Downstream) -> Option<IpAddr> {
        let sends = self.balancer.generation().config.proxy.send.is_some();
        sends.then(|| client_key(client.peer))
    }

    /// The balancer's connector ([`Balancer::connector`](crate::balancer::Balancer::connector)): the PROXY protocol header first
    /// with `SEND_PROXY_PROTOCOL`, TLS with `SSL_ENCRYPT_UPSTREAM=1`, the socket options, the
    /// connect accounted for (a server found in quarantine is taken as chosen although
    /// quarantined, as a TCP client's pick would be).
    async fn connect(
        &self,
        server: &ServerTarget,
        client: &Downstream,
    ) -> Result<ServerStream, ConnectError> {
        let generation = self.balancer.generation();
        let s = &server.0;
        let preface = proxy_protocol::preface(generation.config.proxy.send, || {
            Header::for_client(client.peer.known(), client.local)
        });
        let attempt = self
            .balancer
            .attempt(s, s.is_quarantined(), client.peer.or_unspecified());
        let connector = self.balancer.connector(&generation);
        let connecting = connector.connect(&s.host, s.port, &s.address, &preface, &attempt);
        connecting.instrument(self.span.clone()).await
    }

    /// The broker's cookie taken out ([`HttpBalancer::without_broker_cookie`]).
    fn rewrite(&self, request: &ClientHead<'_>, head: &mut Editor) {
        self.without_broker_cookie(request, head);
    }

    fn keeps(&self, server: &ServerTarget) -> bool {
        let generation = self.balancer.generation();
        generation.servers.iter().any(|s| Arc::ptr_eq(s, &server.0))
    }

    fn report(&self, report: Report<'_, ServerTarget>) {
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

    fn waiting(&self, admission: &Admission) -> Option<Duration> {
        query::limits::waiting(admission)
    }

    fn resumed(&self, admission: &Admission) -> NewStream {
        query::limits::resumed(admission)
    }

    /// A stream's requests are counted on its connection's admission: the connection is one
    /// client (or one query connection) however many streams it carries.
    fn stream_admission(&self, connection: &Arc<Mutex<Admission>>) -> Admission {
        Admission::Stream(Arc::clone(connection))
    }
}
