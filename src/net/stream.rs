//! The streams the broker serves and relays: any `AsyncRead + AsyncWrite` (a plain TCP socket
//! today; a TLS stream or an upgraded HTTP connection tomorrow), with what a plain TCP socket
//! can do besides. Code that moves bytes is written once over [`Stream`] and takes the
//! socket's shortcuts only where [`Stream::plain`] says the bytes on the socket are the
//! stream's own: splice(2) from socket to socket, readiness without a read, a read without
//! waiting for the runtime.

use std::cell::RefCell;
use std::io::{self, Read};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::either::Either;

/// A byte stream the broker can serve, relay or answer.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {
    /// The TCP socket the stream runs over, for socket options (a TLS stream's inner socket);
    /// `None` when there is none.
    fn socket(&self) -> Option<&TcpStream> {
        None
    }

    /// The socket itself when the stream's bytes are the socket's bytes (no TLS, no framing):
    /// then they may go from socket to socket without passing through user space.
    fn plain(&self) -> Option<&TcpStream> {
        None
    }

    /// Reads what has arrived, appending it to `into` (at most [`READ_NOW`] bytes), without
    /// waiting: `WouldBlock` when nothing has (or when the stream cannot tell without the
    /// runtime, the default).
    fn read_now(&mut self, into: &mut Vec<u8>) -> io::Result<usize> {
        let _ = into;
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Makes the stream's close an abort: the peer gets a reset, not a clean end of stream
    /// that could pass for a complete answer.
    fn reset_on_close(&self) {
        if let Some(socket) = self.socket() {
            let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Most bytes [`Stream::read_now`] reads at once: enough for any request line's start.
pub const READ_NOW: usize = 4096;

impl Stream for TcpStream {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self)
    }

    fn plain(&self) -> Option<&TcpStream> {
        Some(self)
    }

    /// Straight from the socket, whatever the runtime knows of it yet (a new socket's
    /// readiness is unknown until the reactor reports it, a wake-up later), through a
    /// per-thread buffer, so `into` is sized to what came (usually a few bytes) rather than
    /// to the most that could.
    fn read_now(&mut self, into: &mut Vec<u8>) -> io::Result<usize> {
        thread_local! {
            static BUFFER: RefCell<[u8; READ_NOW]> = const { RefCell::new([0; READ_NOW]) };
        }
        BUFFER.with(|buffer| {
            let mut buf = buffer.borrow_mut();
            let n = (&*socket2::SockRef::from(&*self)).read(&mut buf[..])?;
            into.extend_from_slice(&buf[..n]);
            Ok(n)
        })
    }
}

/// In-memory pipes stand for streams that are no plain socket (TLS), so the paths that take
/// no socket shortcut are tested without a network.
#[cfg(test)]
impl Stream for tokio::io::DuplexStream {}

/// One of two streams (a plain or a TLS connection, decided at run time): the socket's
/// shortcuts are taken only when the one in hand allows them.
impl<A: Stream, B: Stream> Stream for Either<A, B> {
    fn socket(&self) -> Option<&TcpStream> {
        match self {
            Either::Left(a) => a.socket(),
            Either::Right(b) => b.socket(),
        }
    }

    fn plain(&self) -> Option<&TcpStream> {
        match self {
            Either::Left(a) => a.plain(),
            Either::Right(b) => b.plain(),
        }
    }

    fn read_now(&mut self, into: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Either::Left(a) => a.read_now(into),
            Either::Right(b) => b.read_now(into),
        }
    }
}

/// A client's TLS connection to a balancer: its bytes are not the socket's, so no shortcut
/// but socket options.
impl Stream for tokio_rustls::server::TlsStream<TcpStream> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.get_ref().0)
    }
}

/// A TLS connection to a server (`SSL_ENCRYPT_UPSTREAM=1`).
impl Stream for tokio_rustls::client::TlsStream<TcpStream> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.get_ref().0)
    }
}
