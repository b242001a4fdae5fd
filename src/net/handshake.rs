//! An accepted connection made ready to serve, at the listener layer as in pingora-core
//! (accept yields an uninitialised stream, `handshake()` makes it a stream to serve), in two
//! steps before anything serves it, each returning what became of it for the caller to
//! account for:
//!
//! - the PROXY protocol step ([`Accepted::proxy_header`], `PROXY_PROTOCOL=1`): from a front
//!   balancer, the header that names the client is read first, within its timeout, and the
//!   client it names becomes the connection's [`ClientOrigin`], the one place both paths read the
//!   client's address from; a header from any other source is refused;
//! - the TLS step ([`Accepted::handshake`]): a connection on a TLS port is made secure once,
//!   with the [`PortTls`] of the generation it arrived in, or told apart as plain by its first
//!   byte (`SSL_PLAIN_ON_SAME_PORT=1`, plain HTTP on a TLS-only HTTP port). A plain port has
//!   no TLS step: its stream is served as accepted.
//!
//! The header comes before TLS, as HAProxy and every front balancer send it. Nothing here
//! knows of balancers or of what serves a connection.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use crate::config::Cidr;
use crate::net::proxy_protocol::{self, Header, HeaderError, MAX_HEADER, ProxyParsed};
use crate::tls::first_byte::{self, Arrival};
use crate::tls::{HandshakeFailure, ServerTls};

/// A client's stream once its port's TLS step is done: plain TCP, or TLS.
pub type ClientStream = Either<TcpStream, TlsStream<TcpStream>>;

/// How long a client of a TLS port has to finish its handshake: a real client needs a round
/// trip or two (well under a second even across a continent), and one that connects and
/// stalls must not hold its descriptor long. nginx allows 60 s, HAProxy its client timeout;
/// 10 s leaves room for a slow mobile link and frees a stalled slot soon.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection just accepted, before its PROXY protocol and TLS steps (pingora-core's
/// `UninitializedStream`): what an accept loop hands on.
#[derive(Debug)]
pub struct Accepted {
    /// The accepted socket, its options set.
    pub stream: TcpStream,
    /// Who connected: the socket's peer (a front balancer, under the PROXY protocol).
    pub peer: SocketAddr,
    /// Whom the connection serves: the peer, until a PROXY protocol header names another.
    pub origin: ClientOrigin,
}

/// Whom an accepted connection serves, as the listener layer found out: the one place both
/// paths (the TCP client, the HTTP engine's `Downstream`) read the client's address from, so
/// log lines, `QUERY_ALLOW`, `MAX_CONNECTIONS_PER_CLIENT`, the per-client figures and
/// `X-Forwarded-For` all name the same client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOrigin {
    /// The client: the socket's peer, or the client a PROXY protocol header named.
    pub client: SocketAddr,
    /// The front balancer whose PROXY protocol header named `client`: the socket's peer, which
    /// what trusts only this host's own connections (ADMIN over plain HTTP) asks too. `None`
    /// when `client` is the socket's peer.
    pub front: Option<IpAddr>,
    /// Where the client connected, when a header said (the front balancer's address, as the
    /// client saw it); `None`: the accepted socket's own address.
    pub destination: Option<SocketAddr>,
    /// A front balancer's own connection (PROXY protocol v2 `LOCAL`): a health check. It may
    /// be answered (a query), but it is never counted nor forwarded as a client.
    pub check: bool,
    /// How long the client was watched already for its first bytes, from its accept, and
    /// sent none (a source not in `PROXY_PROTOCOL_FROM`, watched for a header it may not
    /// send): the later waits for a first byte (TLS's, the query sniff's) take only what is
    /// left of `QUERY_SNIFF_TIMEOUT`, so a server-first client waits for it once, not twice.
    pub silent_for: Duration,
}

impl ClientOrigin {
    /// Whether a PROXY protocol header named the client and the front that sent it is off
    /// this host (not on loopback, an IPv4-mapped loopback counted as loopback): what trusts
    /// only this host's own connections (ADMIN over plain HTTP) asks of the socket's peer too.
    pub fn front_off_host(&self) -> bool {
        self.front.is_some_and(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback(),
            IpAddr::V6(v6) => {
                !(v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()))
            }
        })
    }
}

/// What the PROXY protocol step needs, from the generation the connection arrived in.
#[derive(Debug, Clone, Copy)]
pub struct PortProxy<'a> {
    /// `PROXY_PROTOCOL_FROM`: the sources that send a header (empty: every source).
    pub from: &'a [Cidr],
    /// `PROXY_PROTOCOL_TIMEOUT`: how long a header may take to arrive whole.
    pub timeout: Duration,
    /// How long a source that sends no header is watched for one anyway
    /// (`QUERY_SNIFF_TIMEOUT`): a client silent that long speaks a server-first protocol.
    pub direct_wait: Duration,
}

/// Why a connection was refused at the PROXY protocol step: it is closed, never forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyRefusal {
    /// From a source that must send a header: the bytes are no valid one.
    #[error("{0}")]
    Invalid(HeaderError),
    /// From a source that must send a header: it did not arrive whole in time.
    #[error("no whole PROXY protocol header within {} ({got} bytes of one came)", crate::config::show_duration(*.timeout))]
    TimedOut {
        /// `PROXY_PROTOCOL_TIMEOUT`.
        timeout: Duration,
        /// The header's bytes that came.
        got: usize,
    },
    /// From a source that must send a header: it closed in the middle of one.
    #[error("it closed after {0} bytes of a PROXY protocol header")]
    Cut(usize),
    /// A header from a source not in `PROXY_PROTOCOL_FROM`, which may not name a client.
    #[error("it sent a PROXY protocol header but is not in PROXY_PROTOCOL_FROM")]
    NotAllowed,
}

impl ProxyRefusal {
    /// A short name of the cause, for METRICS' labels.
    pub fn label(&self) -> &'static str {
        match self {
            ProxyRefusal::Invalid(e) => e.label(),
            ProxyRefusal::TimedOut { .. } => "timed_out",
            ProxyRefusal::Cut(_) => "incomplete",
            ProxyRefusal::NotAllowed => "not_allowed",
        }
    }
}

/// What became of an accepted connection's PROXY protocol step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyStep {
    /// A header was read: the connection's [`ClientOrigin`] says whom it serves (the client it
    /// named; the peer for `UNKNOWN`; a check for `LOCAL`).
    Read,
    /// A source `PROXY_PROTOCOL_FROM` does not name, which sent no header: served as it is.
    Direct,
    /// Refused: close it.
    Refused(ProxyRefusal),
    /// The peer closed, or its socket failed, before it sent a byte: nothing to do.
    Gone,
}

/// What the TLS step of a TLS port needs, borrowed from the generation of the configuration
/// the connection arrived in: a connection keeps that generation's certificate and settings.
#[derive(Debug, Clone, Copy)]
pub struct PortTls<'a> {
    /// The acceptor.
    pub server: &'a ServerTls,
    /// `SSL_PLAIN_ON_SAME_PORT=1`: a plain client, told apart by its first byte, is served
    /// as it is.
    pub plain_on_same_port: bool,
    /// On a TLS-only port, look at the first byte anyway and refuse a plain client with an
    /// answer (an HTTP port tells plain HTTP to use https) rather than fail its handshake.
    pub answers_plain: bool,
    /// How long the first byte is waited for (`QUERY_SNIFF_TIMEOUT`): a client silent that
    /// long speaks a server-first protocol, plain, which only a same-port listener serves.
    pub first_byte_wait: Duration,
}

/// What became of an accepted connection's TLS step.
///
/// The TLS variant is large (rustls's connection state) and the others small: boxing it would
/// cost an allocation per TLS client, where the value is moved once, into the task's state, as
/// the stream is anyway.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "a box would allocate per TLS client; the stream is moved once"
)]
pub enum Handshake {
    /// A TLS client whose handshake is done.
    Tls(TlsStream<TcpStream>),
    /// A plain client of a port that speaks plain too (`SSL_PLAIN_ON_SAME_PORT=1`).
    Plain(TcpStream),
    /// A plain client of a TLS-only port that answers one ([`PortTls::answers_plain`]): for
    /// the caller to answer and close.
    PlainRefused(TcpStream),
    /// The handshake failed (within [`HANDSHAKE_TIMEOUT`]): no server is to blame.
    Failed(HandshakeFailure),
    /// The client closed, or its socket failed, before it sent a byte: nothing to do.
    Gone,
}

impl Accepted {
    /// A connection just accepted from `peer`, which it serves until a PROXY protocol header
    /// names another client.
    pub fn new(stream: TcpStream, peer: SocketAddr) -> Accepted {
        Accepted {
            stream,
            peer,
            origin: ClientOrigin {
                client: peer,
                front: None,
                destination: None,
                check: false,
                silent_for: Duration::ZERO,
            },
        }
    }

    /// The PROXY protocol step (`PROXY_PROTOCOL=1`): from a source `proxy.from` names (any,
    /// when it names none), the header is read whole within `proxy.timeout`, no byte past it,
    /// and the client it names becomes the connection's [`ClientOrigin`]; a source it does not name
    /// is served as it is, unless its first bytes, watched for `proxy.direct_wait`, are a
    /// header, which it may not send.
    pub async fn proxy_header(&mut self, proxy: &PortProxy<'_>) -> ProxyStep {
        let listed = proxy.from.is_empty() || proxy.from.iter().any(|c| c.contains(self.peer.ip()));
        if !listed {
            return self.direct_source(proxy.direct_wait).await;
        }
        let mut buffer = vec![0u8; MAX_HEADER];
        let mut got = 0;
        let read = read_header(&mut self.stream, &mut buffer, &mut got);
        let header = match tokio::time::timeout(proxy.timeout, read).await {
            Ok(Ok(header)) => header,
            Ok(Err(step)) => return step,
            Err(_) => {
                return ProxyStep::Refused(ProxyRefusal::TimedOut {
                    timeout: proxy.timeout,
                    got,
                });
            }
        };
        self.origin = match header {
            Header::Proxied {
                source,
                destination,
            } => ClientOrigin {
                client: source,
                front: Some(self.peer.ip()),
                destination: Some(destination),
                check: false,
                silent_for: Duration::ZERO,
            },
            Header::Unknown => self.origin,
            Header::Local => ClientOrigin {
                check: true,
                ..self.origin
            },
        };
        ProxyStep::Read
    }

    /// The TLS step on a port that speaks TLS: the first byte looked at where a plain client
    /// is served or answered, then the handshake within [`HANDSHAKE_TIMEOUT`]. A TCP client
    /// of a TLS-only port goes straight to the handshake.
    pub async fn handshake(self, tls: &PortTls<'_>) -> Handshake {
        let stream = self.stream;
        if tls.plain_on_same_port || tls.answers_plain {
            let wait = tls.first_byte_wait.saturating_sub(self.origin.silent_for);
            match first_byte::peek(&stream, wait).await {
                Ok(Arrival::Tls) => {}
                Ok(Arrival::Plain) if tls.plain_on_same_port => return Handshake::Plain(stream),
                Ok(Arrival::Plain) => return Handshake::PlainRefused(stream),
                Ok(Arrival::Silent) if tls.plain_on_same_port => return Handshake::Plain(stream),
                Ok(Arrival::Silent) => {}
                Ok(Arrival::Closed) | Err(_) => return Handshake::Gone,
            }
        }
        match tls.server.accept(stream, HANDSHAKE_TIMEOUT).await {
            Ok(stream) => Handshake::Tls(stream),
            Err(failure) => Handshake::Failed(failure),
        }
    }
}

/// Reads a PROXY protocol header from `stream` into `buffer` (at least [`MAX_HEADER`] long),
/// `got` counting its bytes read so far: each round peeks what has arrived, and consumes it
/// only as far as it is header (all of it while the header is not whole, else exactly to the
/// header's end), so the client's own bytes stay in the socket.
async fn read_header(
    stream: &mut TcpStream,
    buffer: &mut [u8],
    got: &mut usize,
) -> Result<Header, ProxyStep> {
    let gone = |got: usize| {
        if got == 0 {
            ProxyStep::Gone
        } else {
            ProxyStep::Refused(ProxyRefusal::Cut(got))
        }
    };
    loop {
        let Some(room) = buffer.get_mut(*got..).filter(|room| !room.is_empty()) else {
            // Unreachable: `parse` decides within MAX_HEADER bytes (its tests hold it).
            return Err(ProxyStep::Refused(ProxyRefusal::Invalid(
                HeaderError::V1TooLong,
            )));
        };
        let arrived = match stream.peek(room).await {
            Ok(0) | Err(_) => return Err(gone(*got)),
            Ok(n) => n,
        };
        let (header, take) = match proxy_protocol::parse(&buffer[..*got + arrived]) {
            Err(e) => return Err(ProxyStep::Refused(ProxyRefusal::Invalid(e))),
            Ok(ProxyParsed::Partial) => (None, arrived),
            Ok(ProxyParsed::Complete { header, length }) => (Some(header), length - *got),
        };
        if stream
            .read_exact(&mut buffer[*got..*got + take])
            .await
            .is_err()
        {
            return Err(gone(*got));
        }
        *got += take;
        if let Some(header) = header {
            return Ok(header);
        }
    }
}

impl Accepted {
    /// The first bytes of a source that sends no header, watched for `wait`: a header there
    /// is refused (it would name a client of its choosing); anything else, or silence, is
    /// served, its silence noted in its origin.
    async fn direct_source(&mut self, wait: Duration) -> ProxyStep {
        let mut first = [0u8; proxy_protocol::V2_SIGNATURE.len()];
        match tokio::time::timeout(wait, self.stream.peek(&mut first)).await {
            Err(_) => {
                self.origin.silent_for = wait;
                ProxyStep::Direct
            }
            Ok(Ok(0) | Err(_)) => ProxyStep::Gone,
            Ok(Ok(n)) if proxy_protocol::begins_header(&first[..n]) => {
                ProxyStep::Refused(ProxyRefusal::NotAllowed)
            }
            Ok(Ok(_)) => ProxyStep::Direct,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A connection accepted on a loopback port, and its other end.
    async fn pair() -> (Accepted, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (far, peer) = listener.accept().await.unwrap();
        (Accepted::new(far, peer), near)
    }

    fn every_source(timeout: Duration) -> PortProxy<'static> {
        PortProxy {
            from: &[],
            timeout,
            direct_wait: Duration::from_millis(50),
        }
    }

    #[tokio::test]
    async fn a_header_in_pieces_is_read_to_its_end_and_the_client_bytes_stay() {
        let (mut accepted, mut client) = pair().await;
        let proxy = every_source(Duration::from_secs(5));
        let writing = async {
            for piece in [
                &b"PRO"[..],
                b"XY TCP4 192.0.2.7 ",
                b"198.51.100.1 5",
                b"6324 443\r",
            ] {
                client.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            client.write_all(b"\n\x16\x03\x01 hello").await.unwrap();
        };
        let (step, ()) = tokio::join!(accepted.proxy_header(&proxy), writing);
        assert_eq!(step, ProxyStep::Read);
        assert_eq!(
            accepted.origin,
            ClientOrigin {
                client: "192.0.2.7:56324".parse().unwrap(),
                front: Some(accepted.peer.ip()),
                destination: Some("198.51.100.1:443".parse().unwrap()),
                check: false,
                silent_for: Duration::ZERO,
            }
        );
        // The front is this host's; one elsewhere is told apart.
        assert!(!accepted.origin.front_off_host());
        let afar = ClientOrigin {
            front: Some("192.0.2.1".parse().unwrap()),
            ..accepted.origin
        };
        assert!(afar.front_off_host());
        let mut rest = [0u8; 9];
        accepted.stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"\x16\x03\x01 hello");
    }

    #[tokio::test]
    async fn a_v2_local_header_makes_a_check_of_the_peer() {
        let (mut accepted, mut client) = pair().await;
        let mut local = proxy_protocol::V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x11, 0, 12]);
        local.extend_from_slice(&[0; 12]);
        local.extend_from_slice(b"GET /");
        client.write_all(&local).await.unwrap();
        let step = accepted
            .proxy_header(&every_source(Duration::from_secs(5)))
            .await;
        assert_eq!(step, ProxyStep::Read);
        assert!(accepted.origin.check);
        assert_eq!(accepted.origin.client, accepted.peer);
        let mut rest = [0u8; 5];
        accepted.stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"GET /");
    }

    #[tokio::test]
    async fn no_whole_header_in_time_broken_or_cut_ones_are_refused() {
        let proxy = every_source(Duration::from_millis(200));
        let (mut accepted, mut client) = pair().await;
        client.write_all(b"PROXY TCP4 192.0.2.7").await.unwrap();
        let started = tokio::time::Instant::now();
        let step = accepted.proxy_header(&proxy).await;
        assert_eq!(
            step,
            ProxyStep::Refused(ProxyRefusal::TimedOut {
                timeout: Duration::from_millis(200),
                got: 20
            })
        );
        assert!(started.elapsed() < Duration::from_secs(2));

        let (mut accepted, mut client) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let step = accepted.proxy_header(&proxy).await;
        assert!(
            matches!(
                step,
                ProxyStep::Refused(ProxyRefusal::Invalid(HeaderError::Missing(_)))
            ),
            "{step:?}"
        );

        let (mut accepted, mut client) = pair().await;
        client.write_all(b"PROXY TCP4 192.0.2.7").await.unwrap();
        client.shutdown().await.unwrap();
        let step = accepted.proxy_header(&proxy).await;
        assert_eq!(step, ProxyStep::Refused(ProxyRefusal::Cut(20)));

        let (mut accepted, client) = pair().await;
        drop(client);
        assert_eq!(accepted.proxy_header(&proxy).await, ProxyStep::Gone);
    }

    #[tokio::test]
    async fn a_source_not_listed_is_served_as_it_is_and_its_header_refused() {
        let others: &[Cidr] = &[Cidr {
            network: "192.0.2.0".parse().unwrap(),
            prefix: 24,
        }];
        let proxy = PortProxy {
            from: others,
            timeout: Duration::from_secs(5),
            direct_wait: Duration::from_millis(50),
        };
        let (mut accepted, mut client) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert_eq!(accepted.proxy_header(&proxy).await, ProxyStep::Direct);
        assert_eq!(accepted.origin.client, accepted.peer);
        assert_eq!(accepted.origin.silent_for, Duration::ZERO, "it spoke");
        let mut first = [0u8; 3];
        accepted.stream.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"GET", "nothing consumed");
        // Silent (a server-first client): served once the wait is over, which the later
        // waits for a first byte take off theirs.
        let (mut accepted, _client) = pair().await;
        assert_eq!(accepted.proxy_header(&proxy).await, ProxyStep::Direct);
        assert_eq!(accepted.origin.silent_for, proxy.direct_wait);
        let (mut accepted, mut client) = pair().await;
        client
            .write_all(b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n")
            .await
            .unwrap();
        assert_eq!(
            accepted.proxy_header(&proxy).await,
            ProxyStep::Refused(ProxyRefusal::NotAllowed)
        );
    }
}
