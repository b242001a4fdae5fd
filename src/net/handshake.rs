//! The TLS step of an accepted connection, at the listener layer as in pingora-core (accept
//! yields an uninitialised stream, `handshake()` makes it a stream to serve): a connection
//! [`Accepted`] on a TLS port is made secure once, with the [`PortTls`] of the generation it
//! arrived in, or told apart as plain by its first byte (`SSL_PLAIN_ON_SAME_PORT=1`, plain
//! HTTP on a TLS-only HTTP port), before anything serves it. What became of it is returned
//! ([`Handshake`]); the caller accounts for it and hands the stream on, so nothing here knows
//! of balancers or of what serves a connection. A plain port has no step: its stream is
//! served as accepted.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use crate::tls::first_byte::{self, Arrival};
use crate::tls::{HandshakeFailure, ServerTls};

/// A client's stream once its port's TLS step is done: plain TCP, or TLS.
pub type ClientStream = Either<TcpStream, TlsStream<TcpStream>>;

/// How long a client of a TLS port has to finish its handshake: a real client needs a round
/// trip or two (well under a second even across a continent), and one that connects and
/// stalls must not hold its descriptor long. nginx allows 60 s, HAProxy its client timeout;
/// 10 s leaves room for a slow mobile link and frees a stalled slot soon.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection just accepted, before its TLS step (pingora-core's `UninitializedStream`):
/// what an accept loop hands on.
#[derive(Debug)]
pub struct Accepted {
    /// The accepted socket, its options set.
    pub stream: TcpStream,
    /// Who connected.
    pub peer: SocketAddr,
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
    /// The TLS step on a port that speaks TLS: the first byte looked at where a plain client
    /// is served or answered, then the handshake within [`HANDSHAKE_TIMEOUT`]. A TCP client
    /// of a TLS-only port goes straight to the handshake.
    pub async fn handshake(self, tls: &PortTls<'_>) -> Handshake {
        let stream = self.stream;
        if tls.plain_on_same_port || tls.answers_plain {
            match first_byte::peek(&stream, tls.first_byte_wait).await {
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
