//! One client's way through the broker: choose a server, connect (quarantining servers that
//! fail and trying the next candidate), relay, and account for it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, debug, error, info};

use crate::balancer::{Balancer, Eligible, Lease, Pool};
use crate::config::show_duration;
use crate::config::{Host, Monitoring};
use crate::health::{Reason, quarantine, release};
use crate::os_error::{PointsAt, explain_connect, words};
use crate::query::{
    self,
    sniff::{Verdict, sniff},
};
use crate::relay::{Counters, End, relay};

/// Connects to `host:port`, trying each address the host resolves to in turn, each connect
/// bounded by `timeout`. The error returned is the last address's.
pub async fn connect(host: &Host, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let name = match host {
        Host::Ip(ip) => return connect_to(SocketAddr::new(*ip, port), timeout).await,
        Host::Name(name) => name,
    };
    let resolved = tokio::time::timeout(timeout, tokio::net::lookup_host((name.as_str(), port)))
        .await
        .map_err(|_| timed_out(timeout))?
        .map_err(|e| match e.raw_os_error() {
            // The resolver failed for a system reason (out of descriptors, say): keep the
            // code, which says whose fault it is.
            Some(_) => e,
            None => io::Error::new(
                io::ErrorKind::NotFound,
                format!("cannot resolve {name}: {e}"),
            ),
        })?;
    let mut last = None;
    for address in resolved {
        match connect_to(address, timeout).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{name} resolves to no address"),
        )
    }))
}

/// One connect, bounded by `timeout`, with TCP_NODELAY on the result.
async fn connect_to(address: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .map_err(|_| timed_out(timeout))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn timed_out(after: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("timed out after {}", show_duration(after)),
    )
}

/// How a balancer tells its connections to end.
#[derive(Debug, Clone)]
pub struct Ending {
    /// Cancelled when the listener closes: a query connection answers the request in hand
    /// and closes; clients carry on.
    pub closing: CancellationToken,
    /// Cancelled when `SHUTDOWN_TIMEOUT` is over or the balancer is removed: everything ends
    /// at once.
    pub cut: CancellationToken,
}

/// Serves one accepted client to the end: forwards it to a server (or closes it when none can
/// be reached), or answers it when it is a query. Once known to be no query it takes a
/// `MAX_CONNECTIONS` place, or is refused when none is left. `ending` cuts the relay short.
/// Log lines carry `span` (the balancer's); the relay runs outside it, as entering a span at
/// every wake-up of a busy connection costs more than a log line gains.
///
/// With the query interface on, the client's first bytes are read before a server is chosen
/// (docs/architecture.md weighs this against connecting at once): a client that sends nothing
/// for `QUERY_SNIFF_TIMEOUT` is taken for a server-first protocol client and forwarded then,
/// and so is one whose first bytes could still begin a query but have not become one by then.
pub async fn serve(
    ctx: Arc<query::Context>,
    balancer: Arc<Balancer>,
    client: TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    ending: Ending,
    span: Span,
) {
    let started = Instant::now();
    let pool = balancer.pool();
    let (mut client, first) = if pool.config.query.enabled {
        let sniffed = answer_if_query(&ctx, &balancer, &pool, client, peer, &ending);
        match sniffed.instrument(span.clone()).await {
            Some(forward) => forward,
            None => return,
        }
    } else {
        (client, Vec::new())
    };
    // Only now is it a client: queries never take a MAX_CONNECTIONS place.
    let Some(slot) = balancer.try_take_slot(&pool) else {
        span.in_scope(|| balancer.refuse(local));
        return;
    };
    balancer.below_limit();
    let connected = choose_and_connect(&balancer, &pool, peer).instrument(span.clone());
    let Some((lease, mut upstream)) = connected.await else {
        return;
    };
    slot.admit();
    let server = &lease.server;
    server.total.fetch_add(1, Relaxed);
    let outcome = relay(
        &mut client,
        &mut upstream,
        first,
        Counters {
            to_server: &server.bytes_to_server,
            to_client: &server.bytes_to_client,
        },
        pool.config.idle_timeout,
        ending.cut.cancelled(),
    )
    .await;
    // An idle close is logged even without LOG_CONNECTIONS: the broker ended it.
    if pool.config.log_connections || matches!(outcome.end, End::Idle) {
        span.in_scope(|| {
            info!(
                duration = %format_args!("{:.3}s", started.elapsed().as_secs_f64()),
                bytes_from_client = outcome.to_server,
                bytes_to_client = outcome.to_client,
                ended_by = %outcome.end,
                client = %peer,
                server = %server.address,
                "connection closed"
            );
        });
    }
}

/// A client that arrived while `MAX_CONNECTIONS` clients are open: answered when it is a
/// query (operators look when things are busy), refused and closed otherwise.
pub async fn serve_at_limit(
    ctx: Arc<query::Context>,
    balancer: Arc<Balancer>,
    client: TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    ending: Ending,
) {
    let pool = balancer.pool();
    // With every query place busy, a query could only be told to retry: waiting for its
    // first bytes would hold a descriptor for nothing.
    let to_forward = !balancer.query_room()
        || answer_if_query(&ctx, &balancer, &pool, client, peer, &ending)
            .await
            .is_some();
    if to_forward {
        balancer.refuse(local);
    }
}

/// Reads the client's first bytes and serves it to the end when they are a query. Returns the
/// client with the bytes read when it is to be forwarded; `None` when nothing is left to do:
/// it was a query, or it closed or stalled first.
async fn answer_if_query(
    ctx: &Arc<query::Context>,
    balancer: &Arc<Balancer>,
    pool: &Pool,
    client: TcpStream,
    peer: SocketAddr,
    ending: &Ending,
) -> Option<(TcpStream, Vec<u8>)> {
    let mut first = Vec::new();
    match sniff(&client, &mut first, pool.config.query.sniff_timeout).await {
        Ok(Verdict::Forward) => return Some((client, first)),
        Ok(Verdict::Query) => {
            // Boxed: the query's state is large and rare, and every connection's task would
            // otherwise carry (and copy) room for it.
            let (ctx, balancer) = (Arc::clone(ctx), Arc::clone(balancer));
            Box::pin(query::serve(ctx, balancer, client, first, peer, ending)).await;
        }
        Ok(Verdict::Closed) => debug!(client = %peer, "client closed before sending anything"),
        Err(e) => debug!(client = %peer, "client gone before sending anything: {}", words(&e)),
    }
    None
}

/// Picks candidates and connects until one answers or `MAX_ATTEMPTS` are used. A server that
/// fails for a server-side cause is quarantined; a failure that is the broker's own blames no
/// server and closes the client.
async fn choose_and_connect(
    balancer: &Balancer,
    pool: &Pool,
    peer: SocketAddr,
) -> Option<(Lease, TcpStream)> {
    let config = &pool.config;
    let mut tried = Vec::with_capacity(config.max_attempts as usize);
    while tried.len() < config.max_attempts as usize {
        let (lease, stale) = match pool.pick(&balancer.clock, &tried, Eligible::Available) {
            Some(lease) => (lease, false),
            // Every server is in quarantine, and a quarantine may be stale (a short glitch can
            // put them all there): try them anyway.
            None => match pool.pick(&balancer.clock, &tried, Eligible::EvenQuarantined) {
                Some(lease) => (lease, true),
                None => break, // every server was tried
            },
        };
        tried.push(lease.index);
        let server = &lease.server;
        match connect(&server.host, server.port, config.connect_timeout).await {
            Ok(stream) => {
                // A connect proves what a CONNECTION check proves; it cannot overrule a
                // SEND_EXPECT check that found the application hung.
                if stale && !matches!(config.monitoring, Monitoring::SendExpect { .. }) {
                    release(server, "a client connected to it");
                }
                if let Some(closed) = balancer.broker_faults.end() {
                    info!(
                        "connecting clients again: {closed} were closed while the broker lacked resources"
                    );
                }
                if let Err(e) = crate::sys::set_keepalive(&stream, &config.keepalive) {
                    debug!(server = %server.address, "cannot set keepalive: {}", words(&e));
                }
                return Some((lease, stream));
            }
            Err(e) => {
                let explained = explain_connect(&e);
                if explained.points_at == PointsAt::Broker {
                    if balancer.broker_faults.strike() {
                        error!(
                            server = %server.address,
                            "cannot connect clients: {explained}; they are closed and no server is \
                             blamed until this clears"
                        );
                    }
                    balancer.stats.unserved.fetch_add(1, Relaxed);
                    return None;
                }
                server.failed_connects.fetch_add(1, Relaxed);
                if stale {
                    // Already quarantined; the monitor keeps it there. One line per client
                    // and server here would flood the log during an outage.
                    debug!(client = %peer, "server {} still unreachable: {explained}", server.address);
                } else {
                    error!(client = %peer, "cannot connect to server {}: {explained}", server.address);
                    quarantine(
                        balancer,
                        server,
                        config.quarantine_time,
                        Reason::Connect,
                        &explained.words,
                    );
                }
            }
        }
    }
    balancer.stats.unserved.fetch_add(1, Relaxed);
    if let Some(suppressed) = balancer.no_servers_log.allow() {
        error!(
            more_since_last_line = suppressed,
            client = %peer,
            "no remote servers available; the client is closed"
        );
    }
    None
}
