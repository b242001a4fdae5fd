//! TLS or plain on one port (`SSL_PLAIN_ON_SAME_PORT=1`, like the AppServer's multiprotocol
//! port): every TLS connection starts with a handshake record, whose first byte is 22 (0x16);
//! no plain protocol a broker carries starts with it (HTTP starts with a method's letter,
//! SmartClient's protocol with its own header, and 0x16 is a control character no text protocol
//! sends first). The byte is peeked, not read, so whichever path takes the connection reads it
//! from the start.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

/// The first byte of a TLS record carrying a handshake (RFC 8446, 5.1: `handshake(22)`).
pub const TLS_HANDSHAKE: u8 = 0x16;

/// What a connection on a same-port listener turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A TLS client: hand it to the TLS acceptor.
    Tls,
    /// A plain client that sent first.
    Plain,
    /// Sent nothing within the wait: a client of a server-first protocol, which is plain (a
    /// TLS client always speaks first).
    Silent,
    /// Closed before sending anything.
    Closed,
}

/// Whether a first byte starts TLS.
pub fn classify(first: u8) -> Arrival {
    if first == TLS_HANDSHAKE {
        Arrival::Tls
    } else {
        Arrival::Plain
    }
}

/// Waits at most `wait` for a client's first byte and classifies it, leaving it in the socket.
pub async fn peek(stream: &TcpStream, wait: Duration) -> io::Result<Arrival> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(wait, stream.peek(&mut first)).await {
        Err(_) => Ok(Arrival::Silent),
        Ok(Ok(0)) => Ok(Arrival::Closed),
        Ok(Ok(_)) => Ok(classify(first[0])),
        Ok(Err(e)) => Err(e),
    }
}
