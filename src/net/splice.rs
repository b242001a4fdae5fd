//! Bytes from one plain TCP socket to another through a pipe, socket to pipe to socket, never
//! through user space (Linux splice(2)): the one splice loop of the relay's bulk transfers and
//! of the HTTP engine's long bodies, over a pipe of one bounded pool ([`PIPES`]). Whoever
//! drives a [`Splice`] counts what it moved from its figures ([`Splice::read`],
//! [`Splice::written`]) after each poll.

use std::io;
use std::task::{Context, Poll, ready};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::net::sys::{Pipe, PipePool};

/// The pipes bulk connections and long bodies splice through. 256 pipes of 256 KiB are 512
/// descriptors and 64 MiB of pipe memory, a non-root user's default allowance
/// (`fs.pipe-user-pages-soft`); past that, connections keep the buffered copy.
static PIPES: PipePool = PipePool::new(256);

/// A pipe of the pool, between two plain sockets while bytes go through it; given back to the
/// pool when dropped (closed instead when bytes are left in it).
#[derive(Debug)]
pub struct Splice {
    /// Always there until the drop takes it.
    pipe: Option<Pipe>,
    /// The source's end of stream was read.
    source_closed: bool,
    /// Bytes read from the source so far.
    pub read: u64,
    /// Bytes written to the sink so far.
    pub written: u64,
}

/// Why a splice stopped moving bytes, everything it read written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spliced {
    /// The source's end of stream.
    SourceClosed,
    /// As many bytes as the caller allowed were read.
    Limit,
}

/// A failed splice, by the socket that failed.
#[derive(Debug)]
pub enum SpliceError {
    /// Reading the source failed.
    Read(io::Error),
    /// Writing the sink failed.
    Write(io::Error),
}

impl Splice {
    /// A pipe of the pool, if the pool's bound allows one and the system gives it.
    pub fn take() -> Option<Splice> {
        PIPES.take().map(|pipe| Splice {
            pipe: Some(pipe),
            source_closed: false,
            read: 0,
            written: 0,
        })
    }

    /// Whether the splice waits on its source (nothing is left in the pipe to write): after a
    /// pending poll, the source's silence, not the sink's slowness.
    pub fn waits_on_source(&self) -> bool {
        self.pipe.as_ref().is_none_or(|pipe| pipe.pending == 0)
    }

    /// Moves bytes from `source` to `sink` until the source's end, or until `limit` more bytes
    /// have been read from it (`u64::MAX`: no limit), everything read then written; pending
    /// while either socket is not ready.
    pub fn poll_move(
        &mut self,
        cx: &mut Context<'_>,
        source: &TcpStream,
        sink: &TcpStream,
        limit: u64,
    ) -> Poll<Result<Spliced, SpliceError>> {
        let Some(pipe) = self.pipe.as_mut() else {
            return Poll::Ready(Ok(Spliced::SourceClosed));
        };
        let mut left = limit;
        loop {
            if pipe.pending > 0 {
                ready!(sink.poll_write_ready(cx)).map_err(SpliceError::Write)?;
                match sink.try_io(Interest::WRITABLE, || pipe.drain_to(sink)) {
                    Ok(n) => self.written += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(SpliceError::Write(e))),
                }
                continue;
            }
            if self.source_closed {
                return Poll::Ready(Ok(Spliced::SourceClosed));
            }
            if left == 0 {
                return Poll::Ready(Ok(Spliced::Limit));
            }
            ready!(source.poll_read_ready(cx)).map_err(SpliceError::Read)?;
            let most = usize::try_from(left).unwrap_or(usize::MAX);
            match source.try_io(Interest::READABLE, || pipe.fill_from_at_most(source, most)) {
                Ok(0) => self.source_closed = true,
                Ok(n) => {
                    self.read += n as u64;
                    left -= n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(SpliceError::Read(e))),
            }
        }
    }
}

impl Drop for Splice {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            PIPES.give(pipe);
        }
    }
}
