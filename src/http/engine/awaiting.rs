//! The server's side while its answer's head is awaited: bytes read into a buffer of their
//! own, heads parsed as they complete ([`ResponseHead::parse`], which knows what the request
//! asked), interim ones (100, 103) passed to an HTTP/1.1 client as they come (RFC 9110
//! §15.2; an HTTP/1.0 client knows none), the final one handed back.
//!
//! Interim answers are bounded: nothing more is read from the server while one waits to be
//! written to the client (a client that does not read holds the server back, not the
//! broker's memory), and a request gets at most [`MOST_INTERIM_HEADS`] of them or
//! [`MOST_INTERIM_BYTES`], whichever comes first, forwarded or not (an HTTP/1.0 client is
//! held to the same bound); past it the server is failed ([`ServerHeard::Flood`]: a 502, and the
//! client's connection closed). They never extend the wait for the final head.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use super::buffers::Buffer;
use super::own::CONTINUE;
use crate::http::h1::{Asked, Framing, HeadError, HeadScan, ResponseHead, ToClient, Version};
use crate::net::stream::Stream;

/// What the server said, once it said enough.
pub(super) enum ServerHeard {
    /// A final head (interim ones before it were passed on).
    Final(ResponseHead),
    /// The server closed before a final head.
    Closed,
    /// Reading from the server failed.
    Failed(io::Error),
    /// The server's head is not one the broker passes on (every such one is a 502).
    Bad(HeadError),
    /// More interim answers than a request may get ([`MOST_INTERIM_HEADS`],
    /// [`MOST_INTERIM_BYTES`]): a 502, and the client's connection closed.
    Flood,
}

/// The most interim heads one request may get: a server that sends more (a `103` a few times
/// is all a real one sends) is failed, not followed forever.
pub(super) const MOST_INTERIM_HEADS: u32 = 32;

/// The most bytes of interim heads one request may get.
pub(super) const MOST_INTERIM_BYTES: usize = 64 * 1024;

/// The awaited answer's head.
pub(super) struct Awaiting {
    /// The server's bytes: heads, and what came after them.
    pub(super) resp: Buffer,
    scan: HeadScan,
    asked: Asked,
    /// The client's version: interim heads go to HTTP/1.1 clients only.
    client: Version,
    /// Some byte came from the server: the request may not be sent again.
    pub(super) heard: bool,
    /// Interim heads (and the broker's own `100 Continue`) to write to the client, and how
    /// much of them is written.
    interim: Vec<u8>,
    interim_at: usize,
    /// The client was sent an interim answer (it may send an `Expect`ed body now).
    pub(super) informed: bool,
    /// Interim heads received, and their bytes, forwarded or not.
    interim_heads: u32,
    interim_bytes: usize,
}

impl Awaiting {
    /// Waits for the answer to a request that `asked`, from a client of `client`'s version.
    pub(super) fn new(asked: Asked, client: Version) -> Awaiting {
        Awaiting {
            resp: Buffer::small(),
            scan: HeadScan::default(),
            asked,
            client,
            heard: false,
            interim: Vec::new(),
            interim_at: 0,
            informed: false,
            interim_heads: 0,
            interim_bytes: 0,
        }
    }

    /// Reads the server's side until its final head, writing the interim answers to the
    /// client as they come: `Err` when the client's connection failed.
    pub(super) fn poll_head<S: Stream, C: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        server: &mut S,
        client: &mut C,
    ) -> Poll<io::Result<ServerHeard>> {
        loop {
            // Until the interim answers in hand are written, the server waits.
            ready!(self.poll_interim(cx, client))?;
            match self.poll_server(cx, server) {
                Poll::Ready(heard) => return Poll::Ready(Ok(heard)),
                // An interim answer to write came: written before reading on.
                Poll::Pending if !self.interim.is_empty() => {}
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Reads and parses until the final head, the server's end, or a wait: an interim head to
    /// write is a wait too (nothing more is read until it is written, [`Awaiting::poll_head`]).
    fn poll_server<S: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        server: &mut S,
    ) -> Poll<ServerHeard> {
        loop {
            if self.resp.len() > 0 {
                match ResponseHead::parse(self.resp.filled_mut(), &mut self.scan, self.asked) {
                    Ok(Some(head)) if head.framing() == Framing::Interim => {
                        self.interim_heads += 1;
                        self.interim_bytes += head.len();
                        if self.interim_heads > MOST_INTERIM_HEADS
                            || self.interim_bytes > MOST_INTERIM_BYTES
                        {
                            return Poll::Ready(ServerHeard::Flood);
                        }
                        self.interim_head(&head);
                        self.resp.consume(head.len());
                        self.scan = HeadScan::default();
                        continue;
                    }
                    Ok(Some(head)) => return Poll::Ready(ServerHeard::Final(head)),
                    Err(e) => return Poll::Ready(ServerHeard::Bad(e)),
                    Ok(None) if self.resp.is_full() => {
                        // A head larger than the small tier: on in the large one (the core
                        // refuses one larger than that).
                        let resp = std::mem::replace(&mut self.resp, Buffer::small());
                        self.resp = resp.into_large();
                    }
                    Ok(None) => {}
                }
            }
            if !self.interim.is_empty() {
                return Poll::Pending;
            }
            match ready!(self.resp.poll_read_from(cx, server)) {
                Ok(0) => return Poll::Ready(ServerHeard::Closed),
                Ok(_) => self.heard = true,
                Err(e) => return Poll::Ready(ServerHeard::Failed(e)),
            }
        }
    }

    /// An interim head, queued for the client as the broker writes it.
    fn interim_head(&mut self, head: &ResponseHead) {
        if !head.forwards_interim_to(self.client) {
            return;
        }
        let buf = self.resp.filled();
        let how = ToClient {
            version: Version::Http11,
            keep_alive: true,
        };
        let out = head.write(buf, head.to_client(buf, &how));
        self.interim.extend_from_slice(&out.to_vec(buf));
        self.informed = true;
    }

    /// Queues the broker's own `100 Continue` (an HTTP/1.1 client's `Expect` that its server
    /// left unanswered).
    pub(super) fn say_continue(&mut self) {
        if self.client == Version::Http11 && !self.informed {
            self.interim.extend_from_slice(CONTINUE);
            self.informed = true;
        }
    }

    /// Writes the interim heads queued for the client; ready when none is left.
    pub(super) fn poll_interim<C: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut C,
    ) -> Poll<io::Result<()>> {
        while self.interim_at < self.interim.len() {
            let n =
                ready!(Pin::new(&mut *client).poll_write(cx, &self.interim[self.interim_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.interim_at += n;
        }
        if !self.interim.is_empty() {
            if client.plain().is_none() {
                ready!(Pin::new(&mut *client).poll_flush(cx))?;
            }
            self.interim.clear();
            self.interim_at = 0;
        }
        Poll::Ready(Ok(()))
    }
}
