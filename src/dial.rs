//! Dialing a server: resolve its name (cached, bounded), refuse a destination that is the
//! broker itself, connect to each address in turn within `CONNECT_TIMEOUT`, and set the socket
//! options, then, with `SSL_ENCRYPT_UPSTREAM=1`, the TLS handshake with the server (verified
//! unless told otherwise). Used alike by the clients' path and by the monitor's checks, so both
//! see a server the same way.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::either::Either;
use tracing::debug;

use crate::config::{BalancerConfig, Host, Keepalive, show_duration};
use crate::os_error::{Explained, PointsAt, explain_connect, words};
use crate::resolve::{ResolveError, Resolver};
use crate::tls::{Cause, HandshakeFailure, UpstreamTls};

/// A connection to a server: plain TCP, or TLS with `SSL_ENCRYPT_UPSTREAM=1`.
pub type ServerStream = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// Why a server could not be connected to.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connect, or the lookup of the server's name, failed.
    #[error("{}", words(.0))]
    Io(io::Error),
    /// The lookup of the server's name did not answer in time.
    #[error("{0}")]
    ResolveTimedOut(String),
    /// Not tried: `DNS_MAX_LOOKUPS` lookups are in flight. No one is blamed.
    #[error("not tried: DNS_MAX_LOOKUPS ({limit}) name lookups are in flight")]
    ResolverBusy {
        /// `DNS_MAX_LOOKUPS`.
        limit: usize,
    },
    /// Not tried: the destination is one of the broker's own listening addresses.
    #[error(
        "{destination} is this broker's own listening address ({listener}): every client sent \
         there would come back into the broker, in a loop"
    )]
    OwnAddress {
        /// Where the server's address led.
        destination: SocketAddr,
        /// The broker's listener it reaches.
        listener: SocketAddr,
    },
    /// Connected, but the TLS handshake with the server failed (`SSL_ENCRYPT_UPSTREAM=1`).
    #[error("TLS handshake failed: {0}")]
    Handshake(HandshakeFailure),
}

impl ConnectError {
    /// The failure explained for an operator, with what it points at.
    pub fn explain(&self) -> Explained {
        let other = |points_at, advice| Explained {
            words: self.to_string(),
            errno: None,
            windows: None,
            points_at,
            advice,
        };
        match self {
            ConnectError::Io(e) => explain_connect(e),
            ConnectError::ResolveTimedOut(_) => other(
                PointsAt::Network,
                "the system's resolver (DNS) answers slowly or not at all: check the DNS servers \
                 in /etc/resolv.conf",
            ),
            ConnectError::ResolverBusy { .. } => other(
                PointsAt::Broker,
                "the system's resolver (DNS) is slow or hung: check it, raise DNS_MAX_LOOKUPS, or \
                 give servers by address",
            ),
            ConnectError::OwnAddress { .. } => other(
                PointsAt::Configuration,
                "give the address of an application server in REMOTE_SERVER",
            ),
            ConnectError::Handshake(failure) => match failure.cause {
                Cause::TimedOut | Cause::Closed | Cause::Io => other(
                    PointsAt::Network,
                    "the server accepts connections but does not finish a TLS handshake: is TLS \
                     on at its port?",
                ),
                Cause::NotTls => other(
                    PointsAt::Configuration,
                    "the server does not speak TLS on this port: turn TLS on at the server or \
                     set SSL_ENCRYPT_UPSTREAM=0",
                ),
                _ => other(
                    PointsAt::Configuration,
                    "give the server a certificate the broker trusts (SSL_UPSTREAM_CA) for the \
                     name it is reached by (SSL_UPSTREAM_SERVER_NAME), or say \
                     SSL_UPSTREAM_VERIFY=0",
                ),
            },
        }
    }
}

/// Connects to `host:port` with `config`'s `CONNECT_TIMEOUT` and `DNS_CACHE_TIME`, trying each
/// address a name resolves to in turn. A destination that is one of the broker's own
/// listening addresses is refused without a connect. The error returned is the last
/// address's.
pub async fn connect(
    resolver: &Arc<Resolver>,
    host: &Host,
    port: u16,
    config: &BalancerConfig,
) -> Result<TcpStream, ConnectError> {
    let timeout = config.connect_timeout;
    let addresses: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => resolver
            .resolve(name, config.dns_cache_time, timeout)
            .await
            .map_err(|e| match e {
                ResolveError::Failed(e) => ConnectError::Io(e),
                ResolveError::TimedOut { .. } => ConnectError::ResolveTimedOut(e.to_string()),
                ResolveError::Busy { limit } => ConnectError::ResolverBusy { limit },
            })?
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect(),
    };
    for &destination in &addresses {
        if let Some(listener) = resolver.own_listener(destination) {
            return Err(ConnectError::OwnAddress {
                destination,
                listener,
            });
        }
    }
    let mut last = None;
    for address in addresses {
        match connect_to(address, timeout).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(ConnectError::Io(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} resolves to no address"),
        )
    })))
}

/// Connects to `host:port` as [`connect`] does, then, when `tls` is given
/// (`SSL_ENCRYPT_UPSTREAM=1`), makes the TLS handshake with the server, bounded by
/// `CONNECT_TIMEOUT` as the connect is (a handshake is a round trip or two, like a connect).
pub async fn dial(
    resolver: &Arc<Resolver>,
    host: &Host,
    port: u16,
    config: &BalancerConfig,
    tls: Option<&UpstreamTls>,
) -> Result<ServerStream, ConnectError> {
    let stream = connect(resolver, host, port, config).await?;
    let Some(tls) = tls else {
        return Ok(Either::Left(stream));
    };
    let name = match host {
        Host::Ip(ip) => ip.to_string(),
        Host::Name(name) => name.clone(),
    };
    tls.connect(&name, stream, config.connect_timeout)
        .await
        .map(Either::Right)
        .map_err(ConnectError::Handshake)
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

/// Sets TCP keepalive on a server connection that will carry a client's bytes; a failure only
/// costs the early notice of a vanished server, so it is logged at debug and the connection
/// goes on.
pub fn keep_alive(stream: &TcpStream, keepalive: &Keepalive, server: &str) {
    if let Err(e) = crate::sys::set_keepalive(stream, keepalive) {
        debug!(server = %server, "cannot set keepalive: {}", words(&e));
    }
}
