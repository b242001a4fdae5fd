//! A TCP balancer's query connections, served by the HTTP engine like an HTTP balancer's:
//! [`QueryPort`] is the engine's upstreams there, answering every request itself (no server is
//! ever chosen), so a query is read, bounded, answered and closed the same way on both kinds
//! of port. The TCP client hands a connection here once its first bytes said it is a query
//! ([`serve`]); the engine's settings are the query interface's limits ([`limits`]).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpStream;

use super::limits::{self, HEAD_TIMEOUT};
use super::operate::Operators;
use super::route;
use crate::balancer::shared::{EndSignals, Shared};
use crate::balancer::{Admission, Balancer};
use crate::config::Language;
use crate::http::h1::HostRule;
use crate::http::{
    Choice, ClientHead, ConnectFailure, Downstream, Engine, LocalAnswer, LocalRequest, Report,
    Settings, Upstreams,
};
use crate::net::stream::Stream;

/// The query interface as the HTTP engine's upstreams on a TCP balancer's port.
#[derive(Debug)]
pub struct QueryPort {
    shared: Arc<Shared>,
    balancer: Arc<Balancer>,
    operators: Arc<Operators>,
}

/// The engine that serves a TCP balancer's query connections.
pub type QueryEngine = Engine<QueryPort>;

/// A server of a port that has none: no value exists, so the engine's server side is never
/// reached here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NoServer {}

impl std::fmt::Display for NoServer {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

/// The connect error of a port that connects to no server.
#[derive(Debug, thiserror::Error)]
#[error("a query port connects to no server")]
pub struct NoConnect;

impl ConnectFailure for NoConnect {
    fn try_next(&self) -> bool {
        false
    }
}

/// The engine for the query connections of `balancer` (a TCP balancer), with the query
/// interface's limits, its page of actions run by `operators`.
pub fn engine(
    shared: &Arc<Shared>,
    balancer: &Arc<Balancer>,
    operators: &Arc<Operators>,
) -> Arc<QueryEngine> {
    let language = shared.config.load().general.language;
    let port = QueryPort {
        shared: Arc::clone(shared),
        balancer: Arc::clone(balancer),
        operators: Arc::clone(operators),
    };
    let settings = settings(&port.shared, language);
    Engine::new(Arc::new(port), settings)
}

/// A reload: the engine's own pages (a malformed head's 400...) speak the new `LANGUAGE`.
pub fn reconfigure(engine: &QueryEngine, language: Language) {
    engine.set_settings(settings(&engine.upstreams().shared, language));
}

/// The engine's settings on a query port: the query head's time (for the body too: a query's
/// is a form's at most), the broker's budget for heads, and a head that names no `Host`
/// taken, as monitors and scripts have always been answered on these ports.
fn settings(shared: &Shared, language: Language) -> Settings {
    Settings {
        request_timeout: HEAD_TIMEOUT,
        body_timeout: HEAD_TIMEOUT,
        language,
        head_memory: Arc::clone(&shared.head_memory),
        host: HostRule::Optional,
        ..Settings::default()
    }
}

/// Serves a connection of a TCP balancer whose first bytes were a query (`stream`: those
/// bytes in front) until it closes, on `ending` as the balancer's connections are. Its
/// client is counted in a query place at once while one is free and it may query (as it
/// was on this port before the engine served it: a query whose head is still coming holds
/// its place); else its first request is answered as the engine answers any (403, 503).
pub fn serve<S: Stream>(
    engine: &Arc<QueryEngine>,
    stream: S,
    client: Downstream,
    ending: &EndSignals,
) -> impl Future<Output = ()> + use<S> {
    let balancer = &engine.upstreams().balancer;
    let allowed = client.peer.known().is_some_and(|peer| {
        let generation = balancer.generation();
        super::access::refusal(&generation, peer).is_none()
    });
    // Taken only while there is room, so a query refused here is counted once, at its request.
    let place = (allowed && balancer.query_room())
        .then(|| balancer.take_query_place())
        .flatten();
    let admission = place.map_or(Admission::Unknown, Admission::Query);
    let (closing, cut) = (ending.closing.clone(), ending.cut.clone());
    Arc::clone(engine).serve_admitted(stream, client, closing, cut, (), admission)
}

impl Upstreams for QueryPort {
    type Server = NoServer;
    type Lease = ();
    type Stream = TcpStream;
    type ConnectError = NoConnect;
    type ClientHold = ();
    type Admission = Admission;

    fn hold_client(&self, _client: &Downstream) -> Option<()> {
        Some(())
    }

    /// Never asked: every request is the port's own.
    fn admit(&self, _client: &Downstream, _admission: &mut Admission) -> bool {
        false
    }

    fn waiting(&self, admission: &Admission) -> Option<std::time::Duration> {
        limits::waiting(admission)
    }

    fn choose(
        &self,
        _request: &ClientHead<'_>,
        _client: &Downstream,
        _tried: &[NoServer],
    ) -> Option<Choice<Self>> {
        None
    }

    async fn connect(
        &self,
        server: &NoServer,
        _client: &Downstream,
    ) -> Result<TcpStream, NoConnect> {
        match *server {}
    }

    fn report(&self, _report: Report<'_, NoServer>) {}

    /// Every request on a query connection is a query: another path is answered with the
    /// list of commands.
    fn intercepts(&self, _target: &[u8]) -> bool {
        true
    }

    fn intercept(
        &self,
        request: LocalRequest,
        admission: &mut Admission,
    ) -> impl Future<Output = LocalAnswer> + Send {
        let (shared, operators) = (&self.shared, &self.operators);
        route::answer(
            shared,
            &self.balancer,
            operators,
            request,
            admission,
            || None,
        )
    }
}
