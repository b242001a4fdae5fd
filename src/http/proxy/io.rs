//! The streams hyper reads and writes: the client's with the bytes already read in front of
//! it, and a server's with its traffic counted and its life reported to the balancer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::idle::{Figures, Traffic};
use crate::http::{Report, Upstreams};

/// A client's stream with the bytes the listener already read from it (to tell a query from
/// a client, say) given out first.
pub(crate) struct Prefixed<I> {
    first: Bytes,
    inner: I,
}

impl<I> Prefixed<I> {
    pub(crate) fn new(first: Bytes, inner: I) -> Prefixed<I> {
        Prefixed { first, inner }
    }

    /// The stream, and what of the first bytes was not read yet.
    pub(crate) fn into_parts(self) -> (Bytes, I) {
        (self.first, self.inner)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.first.is_empty() {
            let n = self.first.len().min(buf.remaining());
            buf.put_slice(&self.first[..n]);
            self.first.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Reports a server connection's end to the balancer (and the pool's figures) when dropped:
/// with hyper's connection, or with the relay when the connection was upgraded.
pub(crate) struct Lifetime<U: Upstreams> {
    upstreams: Arc<U>,
    server: U::Server,
    figures: Arc<Figures>,
}

impl<U: Upstreams> Lifetime<U> {
    /// A connection to `server` just opened: says so.
    pub(crate) fn opened(upstreams: Arc<U>, server: U::Server, figures: Arc<Figures>) -> Self {
        figures.opened();
        upstreams.report(Report::Opened { server: &server });
        Lifetime {
            upstreams,
            server,
            figures,
        }
    }
}

impl<U: Upstreams> Drop for Lifetime<U> {
    fn drop(&mut self) {
        self.figures.closed();
        self.upstreams.report(Report::Closed {
            server: &self.server,
        });
    }
}

/// A connection to a server as hyper's client side drives it.
pub(crate) struct Upstream<U: Upstreams> {
    stream: U::Stream,
    traffic: Arc<Traffic>,
    lifetime: Lifetime<U>,
}

impl<U: Upstreams> Upstream<U> {
    pub(crate) fn new(stream: U::Stream, traffic: Arc<Traffic>, lifetime: Lifetime<U>) -> Self {
        Upstream {
            stream,
            traffic,
            lifetime,
        }
    }

    /// The stream itself (for the relay of an upgraded connection), and the report of its
    /// end, to drop when the relay ends.
    pub(crate) fn into_parts(self) -> (U::Stream, Lifetime<U>) {
        (self.stream, self.lifetime)
    }
}

impl<U: Upstreams> AsyncRead for Upstream<U> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.traffic.read.fetch_add(n as u64, Relaxed);
        }
        polled
    }
}

impl<U: Upstreams> AsyncWrite for Upstream<U> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
