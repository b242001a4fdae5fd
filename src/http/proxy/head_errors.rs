//! hyper's own answer to a request head it cannot parse, replaced by the broker's page.
//!
//! hyper's HTTP/1 server answers such a head itself, before any service sees it: 400 for a
//! malformed line (a folded header, a `Content-Length` that is no number), 431 past the size
//! or header-count limit, 414 for a target too long; each with an empty body, then it closes
//! the connection. Its builder offers no hook for that answer (hyper 1.12,
//! `proto/h1/conn.rs`, `on_parse_error`, and `role.rs`, `Server::on_error`). So the client's
//! stream is wrapped where hyper writes to it. hyper writes that answer only while it holds
//! no request: its writing side idle, which it reaches only once the previous answer was
//! flushed. The service counts the requests it was given and the answers that finished
//! ([`Answers`]); a write that comes after a flush that found every answer finished, with no
//! request given since, can only be hyper's own answer. It is swallowed, and the broker's page
//! for the same status is written in its place, saying what was wrong as the bytes of that
//! head tell ([`headers::hyper_refusal`]). Whatever this cannot tell for sure (an answer's
//! tail that was not flushed yet, as after an early answer) is passed on as hyper wrote it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::config::Language;
use crate::http::headers::{self, MAX_HEAD};
use crate::http::pages;

/// The requests hyper gave the service on one connection, and the answers to them that
/// finished (their body done with, or dropped).
#[derive(Debug, Default)]
pub(crate) struct Answers {
    given: AtomicU64,
    finished: AtomicU64,
}

impl Answers {
    /// A request was given to the service: it is in hand until the guard is dropped (with
    /// the answer's body, or the request's future).
    pub(crate) fn given(self: &Arc<Self>) -> InHand {
        self.given.fetch_add(1, Relaxed);
        InHand(Arc::clone(self))
    }

    /// `given` when every answer is finished, else `None`.
    fn all_finished(&self) -> Option<u64> {
        let given = self.given.load(Relaxed);
        (self.finished.load(Relaxed) == given).then_some(given)
    }
}

/// A request in hand, until dropped.
pub(crate) struct InHand(Arc<Answers>);

impl Drop for InHand {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Relaxed);
    }
}

/// An answer's body, with its request in hand until hyper is done with it.
pub(crate) struct Counted<B> {
    body: B,
    _in_hand: InHand,
}

impl<B> Counted<B> {
    pub(crate) fn new(body: B, in_hand: InHand) -> Counted<B> {
        Counted {
            body,
            _in_hand: in_hand,
        }
    }
}

impl<B: Body + Unpin> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The client's stream as hyper's server sees it, with hyper's own answers to heads it could
/// not parse replaced by the broker's page.
pub(crate) struct HeadErrors<I> {
    inner: I,
    answers: Arc<Answers>,
    language: Language,
    /// `given` when a flush last found every answer finished: while no request is given
    /// after it, hyper holds none, and what it writes is its own.
    idle_at: Option<u64>,
    /// The bytes read while hyper held no request: the next head, as far as it came, at most
    /// one byte past [`MAX_HEAD`] (enough to tell it too large).
    head: Vec<u8>,
    /// The broker's page in place of hyper's answer, what of it is not written yet; once set,
    /// whatever hyper writes after is its answer's rest, and swallowed.
    page: Option<Bytes>,
}

impl<I> HeadErrors<I> {
    pub(crate) fn new(inner: I, answers: Arc<Answers>, language: Language) -> HeadErrors<I> {
        HeadErrors {
            inner,
            answers,
            language,
            idle_at: Some(0),
            head: Vec::new(),
            page: None,
        }
    }

    /// The stream (an upgrade takes it back).
    pub(crate) fn into_inner(self) -> I {
        self.inner
    }

    /// Whether hyper holds no request now.
    fn idle(&self) -> bool {
        self.idle_at.is_some() && self.idle_at == self.answers.all_finished()
    }

    /// The broker's page for `written` when it is hyper's own answer to a head: its status
    /// line is one of a refused head's.
    fn page_for(&self, written: &[u8]) -> Option<Bytes> {
        let status = match written.get(..13)? {
            [
                b'H',
                b'T',
                b'T',
                b'P',
                b'/',
                b'1',
                b'.',
                b'1',
                b' ',
                code @ ..,
                b' ',
            ] => code,
            _ => return None,
        };
        let status = std::str::from_utf8(status).ok()?.parse().ok()?;
        let refusal = headers::hyper_refusal(status, &self.head)?;
        Some(pages::refused_answer(refusal, self.language))
    }

    /// Whether `written` is taken in place of hyper's answer (the page is written at the
    /// next flush); a write that is not forgets the idle state until the next flush.
    fn swallows(&mut self, written: &[u8]) -> bool {
        if self.page.is_some() {
            return true;
        }
        if self.idle()
            && let Some(page) = self.page_for(written)
        {
            self.page = Some(page);
            return true;
        }
        self.idle_at = None;
        false
    }
}

impl<I: AsyncWrite + Unpin> HeadErrors<I> {
    /// Writes what is left of the page, if any.
    fn poll_page(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(page) = self.page.as_mut().filter(|p| !p.is_empty()) {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, page))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            page.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for HeadErrors<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        if self.idle() {
            let read = &buf.filled()[before..];
            let room = (MAX_HEAD + 1).saturating_sub(self.head.len());
            self.head.extend_from_slice(&read[..read.len().min(room)]);
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for HeadErrors<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.swallows(buf) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        if self.swallows(first) {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_page(cx))?;
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        let finished = self.answers.all_finished();
        if self.page.is_none() && finished.is_some() && self.idle_at != finished {
            // Every answer is out: what is read from now on is the next head.
            self.idle_at = finished;
            self.head = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_page(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
