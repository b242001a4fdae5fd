//! Dialing a server: resolve its name (cached, bounded), refuse a destination that is the
//! broker itself, connect to each address in turn within `CONNECT_TIMEOUT`, and set the socket
//! options, then, with `SSL_ENCRYPT_UPSTREAM=1`, the TLS handshake with the server (verified
//! unless told otherwise). Used alike by the clients' path and by the monitor's checks, so both
//! see a server the same way.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{Interest, Ready};
use tokio::net::TcpStream;
use tokio_util::either::Either;

use crate::config::{BalancerConfig, Host, show_duration};
use crate::net::resolve::{ResolveError, Resolver};
use crate::net::sys;
use crate::support::os_error::{Explained, PointsAt, explain_connect, words};
use crate::tls::{Cause, HandshakeFailure, UpstreamTls};

/// A connection to a server: plain TCP, or TLS with `SSL_ENCRYPT_UPSTREAM=1`. The TLS one is
/// boxed: a rustls connection is over a kilobyte, and a stream held inline makes every future
/// and pool slot that holds a server connection that large, to be copied as they move (an
/// HTTP request's boxed future among them: docs/decisions/2026-12-02-boxed-tls-server-stream.md).
pub type ServerStream = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// Why a server could not be connected to: what both engines get back from a dial, with
/// whom it blames ([`ConnectError::blame`]) and whether the next server is worth trying
/// ([`ConnectError::try_next`]), as pingora's errors carry their source and retry flag.
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
    /// Not tried: `SSL_ENCRYPT_UPSTREAM=1`, but this generation's TLS towards the servers did
    /// not load (its files changed between the check and the start). Nothing goes out in
    /// clear instead, and no server is blamed.
    #[error("SSL_ENCRYPT_UPSTREAM=1 but the TLS towards the servers is not loaded")]
    TlsNotLoaded,
    /// Connected, but the TLS handshake with the server failed (`SSL_ENCRYPT_UPSTREAM=1`).
    #[error("TLS handshake failed: {0}")]
    Handshake(HandshakeFailure),
    /// Connected, but the server closed the new connection before it took a request (the
    /// HTTP engine finds this out at the first request): nothing reached it.
    #[error("the server closed a new connection before taking the request: {0}")]
    ClosedBeforeRequest(String),
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
            ConnectError::TlsNotLoaded => other(
                PointsAt::Broker,
                "the balancer's SSL_* files did not load when it started: fix them (appbroker \
                 --check says how) and reload",
            ),
            ConnectError::Handshake(failure) => {
                let (points_at, advice) = handshake_advice(failure.cause);
                other(points_at, advice)
            }
            ConnectError::ClosedBeforeRequest(_) => other(
                PointsAt::Server,
                "the server accepts connections but closes them unused: its own log says why",
            ),
        }
    }

    /// Whom the failure blames. Only a failure that is not the broker's own counts against
    /// the server (and quarantines it).
    pub fn blame(&self) -> PointsAt {
        self.explain().points_at
    }

    /// Whether the next candidate may still serve the client: false only when the broker
    /// itself cannot connect anyone now (out of descriptors, local ports or memory; its TLS
    /// not loaded). A lookup not tried for `DNS_MAX_LOOKUPS` blames the broker too, but the
    /// next server may be given by address.
    pub fn try_next(&self) -> bool {
        matches!(self, ConnectError::ResolverBusy { .. }) || self.blame() != PointsAt::Broker
    }
}

/// Whom a failed handshake with a server points at, and what to change. The words of the
/// failure say what the certificate is and what was expected ([`HandshakeFailure`]).
fn handshake_advice(cause: Cause) -> (PointsAt, &'static str) {
    match cause {
        Cause::TimedOut | Cause::Closed | Cause::Io => (
            PointsAt::Network,
            "the server accepts connections but does not finish a TLS handshake: is TLS on at \
             its port?",
        ),
        Cause::NotTls => (
            PointsAt::Configuration,
            "the server does not speak TLS on this port: turn TLS on at the server or set \
             SSL_ENCRYPT_UPSTREAM=0",
        ),
        Cause::Incompatible => (
            PointsAt::Configuration,
            "appbroker speaks TLS 1.2 and 1.3 (as SSL_METHOD allows) with today's ciphers: \
             enable them at the server",
        ),
        Cause::CertificateRefused => (
            PointsAt::Configuration,
            "appbroker presents no client certificate to the servers: turn client-certificate \
             authentication off at the server's port",
        ),
        Cause::Protocol => (
            PointsAt::Server,
            "the server broke off the TLS handshake: its own log says why",
        ),
        Cause::Expired
        | Cause::NotYetValid
        | Cause::UnknownIssuer
        | Cause::NameMismatch
        | Cause::WrongPurpose
        | Cause::BadCertificate => (
            PointsAt::Configuration,
            "trust the server's certificate in SSL_UPSTREAM_CA (the CA that issued it, or the \
             certificate itself, pinned) for the name it is reached by \
             (SSL_UPSTREAM_SERVER_NAME), or say SSL_UPSTREAM_VERIFY=0",
        ),
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

/// Connects to `host:port` as [`connect`] does, writes `preface` first (a PROXY protocol
/// header, `SEND_PROXY_PROTOCOL`; nothing when empty), then, when `tls` is given
/// (`SSL_ENCRYPT_UPSTREAM=1`), makes the TLS handshake with the server, bounded by
/// `CONNECT_TIMEOUT` as the connect is (a handshake is a round trip or two, like a connect).
/// With `SSL_ENCRYPT_UPSTREAM=1` and no `tls` nothing is connected: never clear text instead.
pub async fn dial(
    resolver: &Arc<Resolver>,
    host: &Host,
    port: u16,
    config: &BalancerConfig,
    tls: Option<&UpstreamTls>,
    preface: &[u8],
) -> Result<ServerStream, ConnectError> {
    if config.tls.encrypt_upstream && tls.is_none() {
        return Err(ConnectError::TlsNotLoaded);
    }
    let stream = connect_with_preface(resolver, host, port, config, preface).await?;
    let Some(tls) = tls else {
        return Ok(Either::Left(stream));
    };
    let name = match host {
        Host::Ip(ip) => ip.to_string(),
        Host::Name(name) => name.clone(),
    };
    // Boxed: a handshake's state (a rustls connection) is over a kilobyte, which every dial's
    // future, and every task that awaits one, would otherwise carry and copy as it moves.
    Box::pin(tls.connect(&name, stream, config.connect_timeout))
        .await
        .map(|tls| Either::Right(Box::new(tls)))
        .map_err(ConnectError::Handshake)
}

/// Connects to `host:port` as [`connect`] does, and writes `preface` first (a PROXY protocol
/// header, `SEND_PROXY_PROTOCOL`; nothing when empty): a client's connection before its TLS
/// handshake, or the monitor's connect-only check.
pub async fn connect_with_preface(
    resolver: &Arc<Resolver>,
    host: &Host,
    port: u16,
    config: &BalancerConfig,
    preface: &[u8],
) -> Result<TcpStream, ConnectError> {
    let mut stream = connect(resolver, host, port, config).await?;
    if !preface.is_empty() {
        write_preface(&mut stream, preface, config.connect_timeout).await?;
    }
    Ok(stream)
}

/// Writes `preface` on a new connection within `timeout` (a few hundred bytes at most, which
/// a new socket's send buffer takes at once).
async fn write_preface(
    stream: &mut TcpStream,
    preface: &[u8],
    timeout: Duration,
) -> Result<(), ConnectError> {
    use tokio::io::AsyncWriteExt;
    match tokio::time::timeout(timeout, stream.write_all(preface)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ConnectError::Io(e)),
        Err(_) => Err(ConnectError::Io(timed_out(timeout))),
    }
}

/// One connect, bounded by `timeout`, with TCP_NODELAY on the result.
async fn connect_to(address: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut connecting = pin!(connect_once(address));
    // A connect to a loopback address is over when connect(2) returns (the kernel runs the
    // whole handshake inside the call), so one turn of the reactor reports it: waiting that
    // turn without arming the timer saves the runtime the wake-up that arming a timer costs
    // (tokio wakes its own reactor for every timer sooner than all others, a write to its
    // eventfd). A remote connect takes a round trip, in which the timer would be armed
    // anyway, one turn later.
    let done = match address.ip().is_loopback() {
        true => within_one_turn(connecting.as_mut()).await,
        false => None,
    };
    let stream = match done {
        Some(connected) => connected?,
        None => tokio::time::timeout_at(deadline, connecting)
            .await
            .map_err(|_| timed_out(timeout))??,
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// What `future` gives within one turn of the runtime's reactor (polled, then once more after
/// the reactor has been asked for what is ready), if it gives anything by then.
async fn within_one_turn<F: Future>(mut future: Pin<&mut F>) -> Option<F::Output> {
    for turn in 0..2 {
        if turn > 0 {
            // Deferred until the runtime has polled its reactor.
            tokio::task::yield_now().await;
        }
        if let Poll::Ready(output) = poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await {
            return Some(output);
        }
    }
    None
}

/// A connect, as tokio's `TcpStream::connect` makes it, but where the reactor's report tells
/// the outcome ([`sys::READINESS_TELLS_CONNECTED`]) the kernel is not asked again for the
/// connect's error: one system call fewer per server connection.
async fn connect_once(address: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::from_std(sys::start_connect(address)?)?;
    let ready = stream.ready(Interest::WRITABLE | Interest::ERROR).await?;
    if sys::READINESS_TELLS_CONNECTED && ready == Ready::WRITABLE {
        return Ok(stream);
    }
    match stream.take_error()? {
        Some(e) => Err(e),
        // Connected, and then something happened to it: the first read or write says what.
        None => Ok(stream),
    }
}

fn timed_out(after: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("timed out after {}", show_duration(after)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connect_is_told_apart_from_a_refusal_by_the_reactors_report() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let timeout = Duration::from_secs(5);
        let mut stream = connect_to(address, timeout).await.unwrap();
        let (mut accepted, _) = listener.accept().await.unwrap();
        stream.write_all(b"ping").await.unwrap();
        let mut got = [0; 4];
        accepted.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        assert!(stream.nodelay().unwrap());

        // Nobody listens there any more: refused, with the kernel's reason.
        drop((listener, accepted, stream));
        let refused = connect_to(address, timeout).await.unwrap_err();
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionRefused,
            "{refused}"
        );
    }

    #[tokio::test]
    async fn a_server_that_closes_at_once_is_still_a_connect_that_succeeded() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let closing = tokio::spawn(async move {
            let (accepted, _) = listener.accept().await.unwrap();
            drop(accepted);
        });
        let connected = connect_to(address, Duration::from_secs(5)).await;
        closing.await.unwrap();
        // The close is the first read's news, as it would be with tokio's own connect.
        let mut stream = connected.unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_loopback_connect_not_over_within_a_turn_is_bounded_by_the_timeout() {
        // A listener whose accept queue is full drops new SYNs: a connect stays under way.
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None);
        let socket = socket.unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).unwrap();
        socket.listen(0).unwrap();
        let address = socket.local_addr().unwrap().as_socket().unwrap();
        let timeout = Duration::from_millis(300);
        let mut queued = Vec::new();
        let started = std::time::Instant::now();
        let outcome = loop {
            match connect_to(address, timeout).await {
                Ok(stream) if queued.len() < 8 => queued.push(stream),
                other => break other,
            }
        };
        let e = outcome.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            !queued.is_empty(),
            "the queue's first place should have been taken"
        );
    }
}
