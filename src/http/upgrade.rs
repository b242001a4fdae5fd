//! A connection switched to another protocol (WebSocket) once the server said `101`: both
//! streams are taken back from hyper whole, with the bytes it had read ahead on each, and
//! relayed both ways like a TCP connection. It stays one of the server's connections until
//! it ends.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::io::{Prefixed, Upstream};
use super::{Tunnel, Upstreams};

/// An upgrade agreed on by the server, both sides not yet handed over by hyper.
pub(crate) struct Pending<U: Upstreams> {
    pub(crate) client: OnUpgrade,
    pub(crate) server: OnUpgrade,
    pub(crate) to: U::Server,
    pub(crate) peer: SocketAddr,
    /// The balancer's lease, held until the relay ends.
    pub(crate) lease: Option<U::Lease>,
}

/// Relays the upgraded connection until both sides closed or one failed.
pub(crate) async fn tunnel<U, I>(pending: Pending<U>) -> Tunnel<U::Server>
where
    U: Upstreams,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let mut record = Tunnel {
        client: pending.peer,
        server: pending.to,
        to_server: 0,
        to_client: 0,
        duration: std::time::Duration::ZERO,
        error: None,
    };
    match take_streams::<U, I>(pending.client, pending.server).await {
        Ok((mut client, client_ahead, mut server, server_ahead, _lifetime)) => {
            let relayed = relay(&mut client, client_ahead, &mut server, server_ahead).await;
            record.to_server = relayed.to_server;
            record.to_client = relayed.to_client;
            record.error = relayed.error.map(|e| crate::os_error::words(&e));
        }
        Err(e) => record.error = Some(e.to_string()),
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
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, server) = tokio::try_join!(client, server).map_err(io::Error::other)?;
    let client = client
        .downcast::<TokioIo<Prefixed<I>>>()
        .map_err(|_| io::Error::other("the client's upgraded stream is not the accepted one"))?;
    let server = server
        .downcast::<TokioIo<Upstream<U>>>()
        .map_err(|_| io::Error::other("the server's upgraded stream is not the dialed one"))?;
    let (unread, client_io) = client.io.into_inner().into_parts();
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

/// What a relay moved, and the error that ended it.
struct Relayed {
    to_server: u64,
    to_client: u64,
    error: Option<io::Error>,
}

/// Bytes both ways with half-close (EOF from one side shuts the other's write side), after
/// the bytes read ahead on each side. To be replaced by `crate::relay::relay` once it takes
/// any stream (issue 10), which splices when both ends are plain TCP.
async fn relay<C, S>(
    client: &mut C,
    client_ahead: Bytes,
    server: &mut S,
    server_ahead: Bytes,
) -> Relayed
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut relayed = Relayed {
        to_server: client_ahead.len() as u64,
        to_client: server_ahead.len() as u64,
        error: None,
    };
    let ahead = async {
        server.write_all(&client_ahead).await?;
        client.write_all(&server_ahead).await
    };
    if let Err(e) = ahead.await {
        relayed.error = Some(e);
        return relayed;
    }
    match tokio::io::copy_bidirectional_with_sizes(client, server, 64 * 1024, 64 * 1024).await {
        Ok((up, down)) => {
            relayed.to_server += up;
            relayed.to_client += down;
        }
        Err(e) => relayed.error = Some(e),
    }
    relayed
}
