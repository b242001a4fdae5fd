//! The streams the broker serves and relays: any `AsyncRead + AsyncWrite` (a plain TCP socket
//! today; a TLS stream or an upgraded HTTP connection tomorrow), with what a plain TCP socket
//! can do besides. Code that moves bytes is written once over [`Stream`] and takes the
//! socket's shortcuts only where [`Stream::plain`] says the bytes on the socket are the
//! stream's own: splice(2) from socket to socket, readiness without a read, a first read that
//! does not wait.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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

    /// The application protocol the stream speaks, when one was agreed on: a TLS stream's
    /// ALPN (`h2`, `http/1.1`), or `h2` for a stream of an HTTP/2 connection. `None`: none
    /// was agreed (plain TCP, or a TLS client that offered none).
    fn protocol(&self) -> Option<&[u8]> {
        None
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

    /// Through the runtime, without waiting: an accepted socket is taken to be readable until a
    /// read finds it empty, so this reads at once (the client's first bytes are usually there),
    /// and a read shorter than asked tells the runtime the socket is drained, so the next read
    /// waits for the reactor to report new bytes instead of trying the socket (and failing)
    /// first. Through a per-thread buffer, so `into` is sized to what came (usually a few
    /// bytes) rather than to the most that could.
    fn read_now(&mut self, into: &mut Vec<u8>) -> io::Result<usize> {
        thread_local! {
            static BUFFER: RefCell<[u8; READ_NOW]> = const { RefCell::new([0; READ_NOW]) };
        }
        BUFFER.with(|buffer| {
            let mut buf = buffer.borrow_mut();
            let mut read = ReadBuf::new(&mut buf[..]);
            // No task waits on this read: when nothing has come, the caller waits for it with
            // its own waker, which replaces the no-op one registered here.
            let mut cx = Context::from_waker(Waker::noop());
            match Pin::new(&mut *self).poll_read(&mut cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    into.extend_from_slice(read.filled());
                    Ok(read.filled().len())
                }
                Poll::Ready(Err(e)) => Err(e),
                Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
            }
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

    fn protocol(&self) -> Option<&[u8]> {
        match self {
            Either::Left(a) => a.protocol(),
            Either::Right(b) => b.protocol(),
        }
    }
}

/// A stream kept on the heap (a TLS connection, large, held where it would be moved often).
impl<S: Stream> Stream for Box<S> {
    fn socket(&self) -> Option<&TcpStream> {
        (**self).socket()
    }

    fn plain(&self) -> Option<&TcpStream> {
        (**self).plain()
    }

    fn read_now(&mut self, into: &mut Vec<u8>) -> io::Result<usize> {
        (**self).read_now(into)
    }

    fn protocol(&self) -> Option<&[u8]> {
        (**self).protocol()
    }

    fn reset_on_close(&self) {
        (**self).reset_on_close();
    }
}

/// A client's TLS connection to a balancer: its bytes are not the socket's, so no shortcut
/// but socket options.
impl Stream for tokio_rustls::server::TlsStream<TcpStream> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.get_ref().0)
    }

    fn protocol(&self) -> Option<&[u8]> {
        self.get_ref().1.alpn_protocol()
    }
}

/// A TLS connection to a server (`SSL_ENCRYPT_UPSTREAM=1`).
impl Stream for tokio_rustls::client::TlsStream<TcpStream> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.get_ref().0)
    }
}
