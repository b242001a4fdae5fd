//! A connection switched to another protocol (WebSocket) once the server said `101`: both
//! streams are taken back from hyper whole, with the bytes it had read ahead on each, and
//! relayed both ways like a TCP connection. It stays one of the server's connections until
//! it ends.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use super::head_errors::HeadErrors;
use super::io::{Prefixed, Upstream};
use crate::http::{Tunnel, Upstreams};
use crate::net::relay::{Counters, End, Side, relay};
use crate::net::stream::Stream;

/// An upgrade agreed on by the server, both sides not yet handed over by hyper.
pub(crate) struct Pending<U: Upstreams> {
    pub(crate) client: OnUpgrade,
    pub(crate) server: OnUpgrade,
    pub(crate) to: U::Server,
    pub(crate) peer: SocketAddr,
    /// The balancer's lease, held until the relay ends.
    pub(crate) lease: Option<U::Lease>,
}

/// Relays the upgraded connection until both sides closed, one failed, or nothing moved for
/// `idle`, with the broker's relay (splice when both ends are plain TCP).
pub(crate) async fn tunnel<U, I>(pending: Pending<U>, idle: Option<Duration>) -> Tunnel<U::Server>
where
    U: Upstreams,
    I: Stream,
{
    let started = Instant::now();
    let mut record = Tunnel {
        client: pending.peer,
        server: pending.to,
        to_server: 0,
        to_client: 0,
        duration: Duration::ZERO,
        end: End::Closed(Side::Client),
    };
    match take_streams::<U, I>(pending.client, pending.server).await {
        Ok((mut client, client_ahead, mut server, server_ahead, _lifetime)) => {
            let (to_server, to_client) = (AtomicU64::new(0), AtomicU64::new(0));
            // What the server sent right after its 101 goes first; the client's early bytes
            // are the relay's first.
            record.end = match client.write_all(&server_ahead).await {
                Ok(()) => {
                    to_client.fetch_add(server_ahead.len() as u64, Relaxed);
                    let counters = Counters {
                        to_server: &to_server,
                        to_client: &to_client,
                    };
                    let first = client_ahead.to_vec();
                    // The caller drops this future to cut the connection.
                    let stop = std::future::pending();
                    relay(&mut client, &mut server, first, counters, idle, stop)
                        .await
                        .end
                }
                Err(e) => End::Error(Side::Client, crate::process::os_error::words(&e)),
            };
            record.to_server = to_server.load(Relaxed);
            record.to_client = to_client.load(Relaxed);
        }
        Err(e) => record.end = End::Error(Side::Server, e.to_string()),
    }
    record.duration = started.elapsed();
    drop(pending.lease);
    record
}

type Streams<U, I> = (
    I,
    Bytes,
    <U as Upstreams>::Stream,
    Bytes,
    super::io::Lifetime<U>,
);

/// Both streams back from hyper, each with what was read from it and not yet passed on.
async fn take_streams<U, I>(client: OnUpgrade, server: OnUpgrade) -> io::Result<Streams<U, I>>
where
    U: Upstreams,
    I: Stream,
{
    let (client, server) = tokio::try_join!(client, server).map_err(io::Error::other)?;
    let client = client
        .downcast::<TokioIo<HeadErrors<Prefixed<I>>>>()
        .map_err(|_| io::Error::other("the client's upgraded stream is not the accepted one"))?;
    let server = server
        .downcast::<TokioIo<Upstream<U>>>()
        .map_err(|_| io::Error::other("the server's upgraded stream is not the dialed one"))?;
    let (unread, client_io) = client.io.into_inner().into_inner().into_parts();
    let client_ahead = if unread.is_empty() {
        client.read_buf
    } else {
        [client.read_buf, unread].concat().into()
    };
    let (server_io, lifetime) = server.io.into_inner().into_parts();
    Ok((
        client_io,
        client_ahead,
        server_io,
        server.read_buf,
        lifetime,
    ))
}
