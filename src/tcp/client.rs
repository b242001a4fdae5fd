//! One accepted connection as a [`TcpClient`], with its way through the broker as methods, once
//! its port's PROXY protocol and TLS steps are done (`net::handshake`, which says whom it
//! serves: its [`ClientOrigin`]): sniff (a query is handed to the balancer's query engine, anything
//! else forwarded; a front balancer's check is answered or closed, never forwarded), take a `MAX_CONNECTIONS` place
//! and one of its client's under `MAX_CONNECTIONS_PER_CLIENT`, choose a server and connect
//! (the PROXY protocol header written first with `SEND_PROXY_PROTOCOL`; quarantining servers
//! that fail and trying the next candidate), relay, and account for it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, debug};

use crate::balancer::events::Unserved;
use crate::balancer::shared::{EndSignals, Shared};
use crate::balancer::{Admission, Balancer, Closed, Generation, Lease};
use crate::config::Host;
use crate::http::Downstream;
use crate::net::connector::ConnectReport;
use crate::net::dial::{ConnectError, ServerStream};
use crate::net::handshake::ClientOrigin;
use crate::net::proxy_protocol::{self, Header};
use crate::net::relay::{Counters, End, RelayOutcome, relay};
use crate::net::stream::Stream;
use crate::query::{self, QueryEngine};
use crate::support::os_error::words;
use crate::tcp::sniff::{Sniffed, Verdict, sniff};

/// What every connection of one listening socket shares: the broker's state, the balancer, how
/// the balancer ends its connections, and where its tasks are counted. Made once per accept
/// loop, so a client costs one reference to it rather than a copy of each. The broker's
/// hand-off reads it for the TLS step of either kind of balancer's connections too.
#[derive(Debug)]
pub struct ListenerShared {
    /// The broker's shared state.
    pub ctx: Arc<Shared>,
    /// The balancer the socket listens for.
    pub balancer: Arc<Balancer>,
    /// How the balancer tells its connections to end.
    pub ending: EndSignals,
    /// The socket's address, for the refusal line.
    pub local: Option<SocketAddr>,
    /// The balancer's connections, waited for on shutdown or removal.
    pub tasks: TaskTracker,
    /// The engine that answers a TCP balancer's queries (`None` on an HTTP balancer, whose
    /// own engine routes them by path).
    pub query: Option<Arc<QueryEngine>>,
    /// The balancer's span, which a client's few log lines are written in. Not one span per
    /// connection: creating and formatting a span per client cost more than the fields it
    /// adds, which the lines carry themselves (`client=`, `server=`).
    pub span: Span,
}

/// One accepted connection over any [`Stream`], from its first bytes to its closing line.
pub struct TcpClient<S> {
    shared: Arc<ListenerShared>,
    /// The balancer's generation when it arrived: the connection keeps its settings.
    generation: Arc<Generation>,
    stream: S,
    /// Whom it serves: `origin.client` is the address every line and rule uses.
    origin: ClientOrigin,
}

impl<S: Stream> TcpClient<S> {
    /// A client accepted on `shared`'s socket, serving `origin`, in `generation` (the
    /// one read when it arrived), its port's PROXY protocol and TLS steps done.
    pub fn new(
        shared: Arc<ListenerShared>,
        generation: Arc<Generation>,
        stream: S,
        origin: ClientOrigin,
    ) -> Self {
        TcpClient {
            generation,
            shared,
            stream,
            origin,
        }
    }

    /// Serves the client to the end: answers it when it is a query; otherwise forwards it to a
    /// server (or closes it when none can be reached) once it has a `MAX_CONNECTIONS` place,
    /// refusing it when none is left (`at_limit`: none was when it arrived). Log lines carry
    /// the balancer's span; the relay runs outside it, as entering a span at every wake-up of
    /// a busy connection costs more than a log line gains.
    ///
    /// With the query interface on, the client's first bytes are read before a server is
    /// chosen (docs/architecture.md weighs this against connecting at once): a client that
    /// sends nothing for `QUERY_SNIFF_TIMEOUT` is taken for a server-first protocol client
    /// and forwarded then, and so is one whose first bytes could still begin a query but have
    /// not become one by then.
    pub async fn run(mut self, at_limit: bool) {
        let started = Instant::now();
        let shared = Arc::clone(&self.shared);
        let span = &shared.span;
        if self.origin.check {
            return self.check().instrument(span.clone()).await;
        }
        let first = if self.generation.config.query.enabled {
            // With every query place busy, a query could only be told to retry: waiting for
            // its first bytes would hold a descriptor for nothing.
            if at_limit && !shared.balancer.query_room() {
                return self.refuse();
            }
            match self.sniff().await {
                Some((Verdict::Query, first)) => return self.query(first).await,
                Some((_, first)) => first,
                None => return,
            }
        } else {
            Vec::new()
        };
        // Only now is it a client: queries never take a MAX_CONNECTIONS place.
        if at_limit {
            return self.refuse();
        }
        // A client's place, then its hold under MAX_CONNECTIONS_PER_CLIENT: the steps an HTTP
        // connection takes too (`Balancer::admit_client`, `Balancer::hold_for_client`).
        let mut admission = Admission::default();
        let (balancer, generation, client) =
            (&shared.balancer, &self.generation, self.origin.client.ip());
        let held = span.in_scope(|| {
            let admitted = balancer.admit_client(generation, &mut admission, shared.local);
            admitted.then(|| balancer.hold_for_client(generation, client))?
        });
        let Some(_hold) = held else {
            return;
        };
        let Some((lease, mut upstream)) = self.choose_and_connect().await else {
            return;
        };
        admission.forwarded();
        let mut outcome = self.relay(&lease, &mut upstream, first).await;
        if outcome.end == End::Stopped
            && lease.cut.is_cancelled()
            && !self.shared.ending.cut.is_cancelled()
        {
            // Its server's connections were cut, not everyone's.
            outcome.end = End::Cut;
        }
        self.account(&lease, &outcome, started);
    }

    /// Serves a front balancer's own check (PROXY protocol `LOCAL`): a query is answered
    /// (`/TOTVS_BROKER_QUERY/READY`, say); anything else is closed. Never a client: it takes
    /// no place, and no server is bothered.
    async fn check(mut self) {
        let client = self.origin.client;
        if self.generation.config.query.enabled
            && self.shared.balancer.query_room()
            && let Some((Verdict::Query, first)) = self.sniff().await
        {
            self.query(first).await;
        }
        debug!(client = %client, "a front balancer's check (PROXY protocol LOCAL) ended");
    }

    /// Refuses the client: `MAX_CONNECTIONS` were open when it arrived.
    fn refuse(self) {
        let shared = &self.shared;
        shared
            .span
            .in_scope(|| shared.balancer.refused(shared.local));
    }

    /// Reads the client's first bytes: what they say (a query, or a client to forward), and
    /// the bytes read; `None` when it closed or stalled before sending anything.
    async fn sniff(&mut self) -> Option<(Verdict, Vec<u8>)> {
        let mut first = Vec::new();
        // What is left of it: a client watched silent already is not waited for again.
        let limit = self
            .generation
            .config
            .query
            .sniff_timeout
            .saturating_sub(self.origin.silent_for);
        let peer = self.origin.client;
        let span = &self.shared.span;
        match sniff(&mut self.stream, &mut first, limit).await {
            Ok(Verdict::Closed) => span.in_scope(|| {
                debug!(client = %peer, "client closed before sending anything");
            }),
            Ok(verdict) => return Some((verdict, first)),
            Err(e) => span.in_scope(|| {
                debug!(client = %peer, "client gone before sending anything: {}", words(&e));
            }),
        }
        None
    }

    /// Serves a client whose first bytes (`first`) were a query to the end: the balancer's
    /// query engine reads it from those bytes on, as an HTTP balancer's engine reads its
    /// queries. Boxed: the query's state is large and rare, and every connection's task would
    /// otherwise carry room for it.
    fn query(self, first: Vec<u8>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let Some(engine) = self.shared.query.as_ref() else {
            return Box::pin(std::future::ready(()));
        };
        let client = Downstream {
            peer: self.origin.client.into(),
            front_off_host: self.origin.front_off_host(),
            tls: self.stream.plain().is_none(),
            local: self.origin.destination,
            check: self.origin.check,
        };
        let stream = Sniffed::new(first, self.stream);
        Box::pin(query::port::serve(
            engine,
            stream,
            client,
            &self.shared.ending,
        ))
    }

    /// Picks candidates and connects until one answers or `MAX_ATTEMPTS` are used. A server
    /// that fails for a server-side cause is quarantined; a failure that is the broker's own
    /// blames no server and closes the client.
    async fn choose_and_connect(&self) -> Option<(Lease, ServerStream)> {
        let (balancer, generation, peer) =
            (&self.shared.balancer, &self.generation, self.origin.client);
        let (config, span) = (&generation.config, &self.shared.span);
        let preface = self.proxy_header();
        let connector = balancer.connector(generation);
        let mut tried = Vec::with_capacity(config.max_attempts as usize);
        while tried.len() < config.max_attempts as usize {
            let Some(lease) = generation.pick_with_fallback(balancer.clock_ms(), &tried) else {
                break; // every server was tried
            };
            tried.push(lease.index);
            let server = &lease.server;
            let attempt = InSpan {
                span,
                report: balancer.attempt(server, lease.stale, peer),
            };
            let connecting = connector.connect(
                &server.host,
                server.port,
                &server.address,
                &preface,
                &attempt,
            );
            // A name is looked up first, and the resolver's lines are written in the span
            // of the balancer whose client asked.
            let connected = match server.host {
                Host::Ip(_) => connecting.await,
                Host::Name(_) => connecting.instrument(span.clone()).await,
            };
            match connected {
                Ok(stream) => return Some((lease, stream)),
                Err(e) if !e.try_next() => {
                    span.in_scope(|| balancer.unserved(peer, Unserved::BrokerFault));
                    return None;
                }
                Err(_) => {}
            }
        }
        span.in_scope(|| balancer.unserved(peer, Unserved::NoServer));
        None
    }

    /// The PROXY protocol header each connection to a server begins with
    /// (`SEND_PROXY_PROTOCOL`), naming the client and where it connected (the address a
    /// header from a front balancer said, else the accepted socket's own); empty without.
    fn proxy_header(&self) -> Vec<u8> {
        proxy_protocol::preface(self.generation.config.proxy.send, || {
            let destination = self.origin.destination.or_else(|| {
                let socket = self.stream.socket()?;
                socket.local_addr().ok()
            });
            Header::for_client(Some(self.origin.client), destination)
        })
    }

    /// Relays the client and its server until both are done, an idle timeout or a cut
    /// (`first`: the client's bytes already read, sent first). The relay's own future, not
    /// one wrapped around it: a busy connection is woken at every exchange, and each layer of
    /// future costs its resumption.
    fn relay<'a>(
        &'a mut self,
        lease: &'a Lease,
        upstream: &'a mut ServerStream,
        first: Vec<u8>,
    ) -> impl Future<Output = RelayOutcome> + 'a {
        let (to_server, to_client) = lease.byte_counters();
        let counters = Counters {
            to_server,
            to_client,
        };
        let idle = self.generation.config.idle_timeout;
        // Cut with every connection of the balancer, or with those of its server alone.
        let (everyone, this_server) = (&self.shared.ending.cut, &lease.cut);
        // Biased: either ends the relay alike, and a fair select draws a random number at
        // every one of the relay's wake-ups to choose which to poll first.
        let cut = async move {
            tokio::select! {
                biased;
                _ = everyone.cancelled() => {}
                _ = this_server.cancelled() => {}
            }
        };
        relay(&mut self.stream, upstream, first, counters, idle, cut)
    }

    /// Accounts for a relayed connection that has ended.
    fn account(&self, lease: &Lease, outcome: &RelayOutcome, started: Instant) {
        let closed = Closed::relayed(self.origin.client, started.elapsed(), outcome);
        let shared = &self.shared;
        let balancer = &shared.balancer;
        balancer.ended(&lease.server, &self.generation, &closed, &shared.span);
    }
}

/// A connect's report with its lines written in the balancer's span. The connect itself runs
/// outside it: entering a span at each of its polls cost more than its lines gain.
struct InSpan<'a, R> {
    span: &'a Span,
    report: R,
}

impl<R: ConnectReport> ConnectReport for InSpan<'_, R> {
    fn connected(&self) {
        self.span.in_scope(|| self.report.connected());
    }

    fn failed(&self, error: &ConnectError) {
        self.span.in_scope(|| self.report.failed(error));
    }

    fn line(&self, write: impl FnOnce()) {
        self.span.in_scope(write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::{Condvar, Mutex};

    use tokio::net::TcpStream;

    use crate::config::Config;
    use crate::net::resolve::Resolver;

    /// A system resolver that hangs until released, counting its lookups.
    #[derive(Default)]
    struct Hung {
        released: Mutex<bool>,
        release: Condvar,
        lookups: AtomicUsize,
    }
    /// A client of `balancer` (its stream a loopback connection), to call its steps alone.
    async fn client_of(balancer: &Arc<Balancer>, config: Config) -> TcpClient<TcpStream> {
        let ctx = Arc::new(Shared {
            config: arc_swap::ArcSwap::from_pointee(config),
            balancers: arc_swap::ArcSwap::from_pointee(vec![Arc::clone(balancer)]),
            started_wall_ms: 0,
            shutdown: crate::support::shutdown::Shutdown::new(),
            head_memory: crate::support::budget::Budget::new(1 << 20),
        });
        let shared = Arc::new(ListenerShared {
            ctx,
            balancer: Arc::clone(balancer),
            ending: EndSignals::default(),
            local: None,
            tasks: TaskTracker::new(),
            query: None,
            span: Span::none(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        TcpClient::new(
            shared,
            balancer.generation(),
            stream,
            ClientOrigin {
                client: peer,
                front: None,
                destination: None,
                check: false,
                silent_for: std::time::Duration::ZERO,
            },
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_dns_max_lookups_a_client_goes_to_the_next_server_and_blames_none() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let text = format!(
            "[General]\nDNS_MAX_LOOKUPS=1\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n\
             MONITORING_TYPE=DISABLED\nCONNECT_TIMEOUT=100ms\nSORT_METHOD=ROUND_ROBIN\n\
             REMOTE_SERVER_01=hung-a.example 6001\nREMOTE_SERVER_02=hung-b.example 6002\n\
             REMOTE_SERVER_03=127.0.0.1 {port}\n"
        );
        let mut config = Config::from_text(&text, std::path::Path::new("t.ini"))
            .unwrap()
            .config;
        let hung = Arc::new(Hung::default());
        let lookup = {
            let hung = Arc::clone(&hung);
            Arc::new(move |_: &str| -> io::Result<Vec<IpAddr>> {
                hung.lookups.fetch_add(1, Relaxed);
                let mut released = hung.released.lock().unwrap();
                while !*released {
                    released = hung.release.wait(released).unwrap();
                }
                Err(io::Error::new(io::ErrorKind::NotFound, "no such name"))
            })
        };
        let max = config.general.dns_max_lookups as usize;
        let resolver = Arc::new(Resolver::with_lookup(max, lookup));
        let balancer = Arc::new(Balancer::new(
            config.balancers.remove(0),
            Arc::clone(&resolver),
            crate::balancer::events::Events::default(),
        ));
        let generation = balancer.generation();
        let client = client_of(&balancer, config).await;
        for _ in 0..50 {
            let (lease, _stream) = client
                .choose_and_connect()
                .await
                .expect("served by the server given by address");
            assert_eq!(lease.index, 2);
        }
        // hung-a's lookup hung past CONNECT_TIMEOUT: blamed, as a connect timeout would be.
        assert!(generation.servers[0].is_quarantined());
        // hung-b was never looked up (one lookup in flight already): not blamed.
        assert!(!generation.servers[1].is_quarantined());
        assert_eq!(balancer.state().servers[1].failed_connects, 0);
        // Fifty clients, one lookup, one thread.
        assert_eq!(hung.lookups.load(Relaxed), 1);
        assert_eq!(resolver.in_flight(), 1);
        *hung.released.lock().unwrap() = true;
        hung.release.notify_all();
        accepting.abort();
    }
}
