//! One client's way through the broker: choose a server, connect (quarantining servers that
//! fail and trying the next candidate), relay, and account for it.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{Instrument, Span, debug};

use crate::balancer::Unserved;
use crate::balancer::{Balancer, Eligible, Lease, Pool};
use crate::context::{Context, Ending};
use crate::dial::{ConnectError, connect, keep_alive};
use crate::os_error::words;
use crate::query::{
    self,
    sniff::{Verdict, sniff},
};
use crate::relay::{Counters, relay};

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
    ctx: Arc<Context>,
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
        span.in_scope(|| balancer.refused(local));
        return;
    };
    balancer.admitted();
    let connected = choose_and_connect(&balancer, &pool, peer).instrument(span.clone());
    let Some((lease, mut upstream)) = connected.await else {
        return;
    };
    slot.admit();
    let (to_server, to_client) = lease.byte_counters();
    let outcome = relay(
        &mut client,
        &mut upstream,
        first,
        Counters {
            to_server,
            to_client,
        },
        pool.config.idle_timeout,
        ending.cut.cancelled(),
    )
    .await;
    let log_connections = pool.config.log_connections;
    span.in_scope(|| {
        balancer.ended(&lease, peer, started.elapsed(), &outcome, log_connections);
    });
}

/// A client that arrived while `MAX_CONNECTIONS` clients are open: answered when it is a
/// query (operators look when things are busy), refused and closed otherwise.
pub async fn serve_at_limit(
    ctx: Arc<Context>,
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
        balancer.refused(local);
    }
}

/// Reads the client's first bytes and serves it to the end when they are a query. Returns the
/// client with the bytes read when it is to be forwarded; `None` when nothing is left to do:
/// it was a query, or it closed or stalled first.
async fn answer_if_query(
    ctx: &Arc<Context>,
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
        let now = balancer.clock_ms();
        // Every server is in quarantine, and a quarantine may be stale (a short glitch can put
        // them all there): try them anyway.
        let Some(lease) = pool
            .pick(now, &tried, Eligible::Available)
            .or_else(|| pool.pick(now, &tried, Eligible::EvenQuarantined))
        else {
            break; // every server was tried
        };
        tried.push(lease.index);
        let server = &lease.server;
        match connect(balancer.resolver(), &server.host, server.port, config).await {
            Ok(stream) => {
                balancer.connected(&lease);
                keep_alive(&stream, &config.keepalive, &server.address);
                return Some((lease, stream));
            }
            Err(ConnectError::ResolverBusy { .. }) => {
                // As after a connect timeout, the next candidate; the resolver says it once.
                debug!(client = %peer, "server {} not tried: DNS_MAX_LOOKUPS lookups in flight", server.address);
            }
            Err(e) => {
                if !balancer.connect_failed(&lease, &e.explain(), peer) {
                    balancer.unserved(peer, Unserved::BrokerFault);
                    return None;
                }
            }
        }
    }
    balancer.unserved(peer, Unserved::NoServer);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::{Condvar, Mutex};

    use crate::config::Config;
    use crate::resolve::Resolver;

    /// A system resolver that hangs until released, counting its lookups.
    #[derive(Default)]
    struct Hung {
        released: Mutex<bool>,
        release: Condvar,
        lookups: AtomicUsize,
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
        let balancer = Balancer::new(config.balancers.remove(0), Arc::clone(&resolver));
        let pool = balancer.pool();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        for _ in 0..50 {
            let (lease, _stream) = choose_and_connect(&balancer, &pool, peer)
                .await
                .expect("served by the server given by address");
            assert_eq!(lease.index, 2);
        }
        // hung-a's lookup hung past CONNECT_TIMEOUT: blamed, as a connect timeout would be.
        assert!(pool.servers[0].is_quarantined());
        // hung-b was never looked up (one lookup in flight already): not blamed.
        assert!(!pool.servers[1].is_quarantined());
        assert_eq!(balancer.state().servers[1].failed_connects, 0);
        // Fifty clients, one lookup, one thread.
        assert_eq!(hung.lookups.load(Relaxed), 1);
        assert_eq!(resolver.in_flight(), 1);
        *hung.released.lock().unwrap() = true;
        hung.release.notify_all();
        accepting.abort();
    }
}
