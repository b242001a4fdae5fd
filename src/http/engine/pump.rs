//! One message's body on its way, from the buffer it is read into to the other side, as its
//! framing says ([`BodyReader`]): each read stepped over, the data (and the chunk framing, to
//! a recipient that speaks chunks) written on, trailers dropped, never past the body's end:
//! the bytes after it (a pipelined request, a server's stray bytes) stay in the buffer. The
//! buffer is bounded: a read waits until what was read before is written.
//!
//! A large rest of known length between two plain sockets (a long `Content-Length`, a long
//! chunk) goes by splice(2), socket to pipe to socket, without passing through user space
//! (`net::splice`, the relay's splice too).
//!
//! Each side's silence is the caller's to bound ([`IdleWatch`]): the pump says whether it waits
//! on its reader ([`Pump::reading`]); time spent waiting for the writer (the other side slow
//! to take the bytes) is never counted against the reader.

use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
#[cfg(target_os = "linux")]
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::buffers::Buffer;
use crate::http::h1::{BodyError, BodyReader, Part};
#[cfg(target_os = "linux")]
use crate::net::splice::{Splice, SpliceError, Spliced};
use crate::net::stream::Stream;

/// A body rest of at least this many bytes between plain sockets goes by splice: below it, a
/// pipe's two extra system calls a round cost more than the copy (the relay's bulk size).
#[cfg(target_os = "linux")]
const SPLICE_AT: u64 = 64 * 1024;

/// Why a body stopped before its end.
#[derive(Debug)]
pub(super) enum PumpError {
    /// Reading from the sending side failed.
    Read(io::Error),
    /// Writing to the receiving side failed.
    Write(io::Error),
    /// The body is malformed, or the sending side closed before its framed end.
    Body(BodyError),
}

/// A body passing through.
#[derive(Debug)]
pub(super) struct Pump {
    reader: BodyReader,
    /// The chunk framing goes with the data (false: an HTTP/1.0 client gets the data only).
    framing: bool,
    /// The next byte of the buffer not stepped over yet.
    at: usize,
    /// Bytes stepped over, still to write: from `pending.0` to `pending.1`.
    pending: (usize, usize),
    /// Data bytes passed on (stepped over to be written, or spliced).
    pub(super) moved: u64,
    /// The last poll waited on the reader (whose silence counts), not on the writer.
    pub(super) reading: bool,
    /// Reads that brought bytes from the reader: what its [`IdleWatch`] counts as progress.
    pub(super) progress: u64,
    /// The splice the body goes through, while one does.
    #[cfg(target_os = "linux")]
    splice: Option<Splice>,
}

impl Pump {
    /// The body `reader` frames, from byte `at` of the buffer on.
    pub(super) fn new(reader: BodyReader, framing: bool, at: usize) -> Pump {
        Pump {
            reader,
            framing,
            at,
            pending: (at, at),
            moved: 0,
            reading: false,
            progress: 0,
            #[cfg(target_os = "linux")]
            splice: None,
        }
    }

    /// Whether the body reached its framed end (written or not).
    pub(super) fn body_read(&self) -> bool {
        self.reader.is_done()
    }

    /// The next byte of the buffer not stepped over: where the body ended, once it did.
    pub(super) fn at(&self) -> usize {
        self.at
    }

    /// The first run of bytes from `at` that go on as they are (data, and framing when it
    /// goes), stepped over: what a head's write can carry with it. Its end; the pump goes on
    /// from there. An error (a malformed chunk) is left for the pump to meet again.
    pub(super) fn first_run(&mut self, buf: &[u8]) -> usize {
        let mut probe = self.reader;
        let mut at = self.at;
        let mut moved = 0;
        while at < buf.len() && !probe.is_done() {
            let Ok(step) = probe.step(&buf[at..]) else {
                break;
            };
            if step.len == 0 || !self.goes_on(step.part) {
                break;
            }
            if step.part == Part::Data {
                moved += step.len as u64;
            }
            at += step.len;
            self.reader = probe;
        }
        self.moved += moved;
        self.at = at;
        self.pending = (at, at);
        at
    }

    /// Whether the bytes from `at` on are a well-formed start of the body (a malformed chunk
    /// among the bytes already read is refused before any server sees the request), and
    /// where the body ends when it is whole among them.
    pub(super) fn check_ahead(&self, buf: &[u8]) -> Result<Option<usize>, BodyError> {
        let mut probe = self.reader;
        let mut at = self.at;
        while at < buf.len() && !probe.is_done() {
            let step = probe.step(&buf[at..])?;
            if step.len == 0 {
                break;
            }
            at += step.len;
        }
        Ok(probe.is_done().then_some(at))
    }

    fn goes_on(&self, part: Part) -> bool {
        part == Part::Data || (part == Part::Framing && self.framing)
    }

    /// Moves the body on until it is done (where it ended in `buf`: the bytes after belong to
    /// the next message), a side fails, or both would block; bytes spliced are counted in
    /// `spliced` too (the engine's figure).
    pub(super) fn poll<R: Stream, W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut Buffer,
        from: &mut R,
        to: &mut W,
        spliced: &AtomicU64,
    ) -> Poll<Result<usize, PumpError>> {
        loop {
            self.reading = false;
            ready!(self.poll_pending(cx, buf, to))?;
            #[cfg(target_os = "linux")]
            if self.splice.is_some() {
                ready!(self.poll_splice(cx, from, to, spliced))?;
                continue;
            }
            if self.reader.is_done() {
                ready!(poll_flush(cx, to))?;
                return Poll::Ready(Ok(self.at));
            }
            if self.at < buf.len() {
                self.step(buf.filled())?;
                continue;
            }
            // Everything read is written: the buffer starts again.
            buf.clear();
            self.at = 0;
            self.pending = (0, 0);
            #[cfg(target_os = "linux")]
            if self.splice_from_here(from, to) {
                continue;
            }
            ready!(poll_flush(cx, to))?;
            match buf.poll_read_from(cx, from) {
                Poll::Pending => {
                    self.reading = true;
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(PumpError::Read(e))),
                Poll::Ready(Ok(0)) => self.reader.at_eof().map_err(PumpError::Body)?,
                Poll::Ready(Ok(_)) => self.progress += 1,
            }
        }
    }

    /// Writes the bytes stepped over and not written yet.
    fn poll_pending<W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &Buffer,
        to: &mut W,
    ) -> Poll<Result<(), PumpError>> {
        while self.pending.0 < self.pending.1 {
            let bytes = &buf.filled()[self.pending.0..self.pending.1];
            let n = ready!(Pin::new(&mut *to).poll_write(cx, bytes)).map_err(PumpError::Write)?;
            if n == 0 {
                return Poll::Ready(Err(PumpError::Write(io::ErrorKind::WriteZero.into())));
            }
            self.pending.0 += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Steps over the bytes read: the first run that goes on becomes pending; a part that
    /// does not (a trailer, framing to an HTTP/1.0 client) is skipped.
    fn step(&mut self, buf: &[u8]) -> Result<(), PumpError> {
        let mut run: Option<(usize, usize)> = None;
        while self.at < buf.len() && !self.reader.is_done() {
            let before = self.at;
            let step = self.reader.step(&buf[self.at..]).map_err(PumpError::Body)?;
            if step.len == 0 {
                break;
            }
            if step.part == Part::Data {
                self.moved += step.len as u64;
            }
            self.at += step.len;
            if self.goes_on(step.part) {
                match run.as_mut() {
                    Some((_, end)) => *end = self.at,
                    None => run = Some((before, self.at)),
                }
            } else if run.is_some() {
                // The run so far is written first; the part after it is not written at all.
                break;
            }
        }
        self.pending = run.unwrap_or((self.at, self.at));
        Ok(())
    }

    /// Starts a splice when the body's rest is long and both sides are plain sockets (and a
    /// pipe is to be had).
    #[cfg(target_os = "linux")]
    fn splice_from_here<R: Stream, W: Stream>(&mut self, from: &R, to: &W) -> bool {
        if self.reader.data_ahead() < SPLICE_AT || from.plain().is_none() || to.plain().is_none() {
            return false;
        }
        self.splice = Splice::take();
        self.splice.is_some()
    }

    /// The spliced copy of the data due before any framing ([`Splice`]): socket to pipe to
    /// socket. Ready once that data went through and the pipe is given back.
    #[cfg(target_os = "linux")]
    fn poll_splice<R: Stream, W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        spliced: &AtomicU64,
    ) -> Poll<Result<(), PumpError>> {
        let (Some(splice), Some(source), Some(sink)) =
            (self.splice.as_mut(), from.plain(), to.plain())
        else {
            return Poll::Ready(Ok(()));
        };
        let before = splice.read;
        let polled = splice.poll_move(cx, source, sink, self.reader.data_ahead());
        let n = splice.read - before;
        if n > 0 {
            self.reader.skip_data(n);
            self.moved += n;
            self.progress += 1;
            spliced.fetch_add(n, Relaxed);
        }
        let waits_on_source = splice.waits_on_source();
        let ended = match polled {
            Poll::Pending => {
                self.reading = waits_on_source;
                return Poll::Pending;
            }
            Poll::Ready(ended) => ended,
        };
        // The pipe goes back to the pool (closed, when bytes are left in it).
        self.splice = None;
        match ended {
            Ok(Spliced::Limit) => Poll::Ready(Ok(())),
            // The source closed before the body's data was all there: a body cut short.
            Ok(Spliced::SourceClosed) => Poll::Ready(self.reader.at_eof().map_err(PumpError::Body)),
            Err(SpliceError::Read(e)) => Poll::Ready(Err(PumpError::Read(e))),
            Err(SpliceError::Write(e)) => Poll::Ready(Err(PumpError::Write(e))),
        }
    }
}

/// Sends what a stream holds back for its socket (TLS records): before waiting on the other
/// side, and at a message's end. A plain socket holds nothing.
pub(super) fn poll_flush<W: Stream>(
    cx: &mut Context<'_>,
    to: &mut W,
) -> Poll<Result<(), PumpError>> {
    if to.plain().is_some() {
        return Poll::Ready(Ok(()));
    }
    Pin::new(to).poll_flush(cx).map_err(PumpError::Write)
}

/// The longest a peer may stay silent while the engine waits on it for the next bytes of a
/// message: only a silence longer than the limit counts, never a steady transfer however long.
/// The silence runs from the later of the peer's last bytes ([`Pump::progress`]) and the
/// moment the engine began waiting on it, so the time the engine spends not asking (the other
/// side slow to take what was read) is never counted against this one.
///
/// The timer is not moved at each read (that would cost every request's polls): the instant
/// of the last progress is kept, and when the timer fires it is compared, the timer re-armed
/// for what is left of the limit when bytes came meanwhile.
pub(super) struct IdleWatch {
    pub(super) limit: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// Since when the peer is silent while waited on; `None` while it is not waited on.
    since: Option<Instant>,
    /// The peer's progress count at `since`.
    seen: u64,
}

impl IdleWatch {
    pub(super) fn new(limit: Duration) -> IdleWatch {
        IdleWatch {
            limit,
            timer: None,
            since: None,
            seen: 0,
        }
    }

    /// Called with whether the peer is waited on now and its progress count (bytes read from
    /// it, in reads): true once it has been silent for the limit while waited on (until then
    /// `cx` is woken when the limit may have passed).
    pub(super) fn expired(&mut self, cx: &mut Context<'_>, waiting: bool, progress: u64) -> bool {
        if !waiting {
            self.since = None;
            return false;
        }
        let since = match self.since {
            Some(since) if progress == self.seen => since,
            _ => {
                self.seen = progress;
                *self.since.insert(Instant::now())
            }
        };
        let deadline = since + self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                return true;
            }
            // It was set for an earlier silence: the rest of this one.
            timer.as_mut().reset(deadline);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::h1::Body;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    /// Polls `silence` once, as a pump waiting on its peer (which made `progress` reads so
    /// far) does.
    async fn expired(silence: &mut IdleWatch, waiting: bool, progress: u64) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(silence.expired(cx, waiting, progress))).await
    }

    #[tokio::test(start_paused = true)]
    async fn silence_counts_from_the_last_bytes_and_only_while_waiting() {
        let minute = Duration::from_secs(60);
        let mut silence = IdleWatch::new(minute);
        assert!(!expired(&mut silence, true, 0).await);
        tokio::time::advance(minute - Duration::from_millis(1)).await;
        assert!(
            !expired(&mut silence, true, 0).await,
            "just before the limit"
        );
        // Bytes came: the next wait has a minute of its own.
        assert!(!expired(&mut silence, false, 1).await);
        assert!(!expired(&mut silence, true, 1).await);
        tokio::time::advance(minute - Duration::from_millis(1)).await;
        assert!(!expired(&mut silence, true, 1).await);
        // Time while nobody waits on the peer is not the peer's silence.
        assert!(!expired(&mut silence, false, 1).await);
        tokio::time::advance(minute * 10).await;
        assert!(!expired(&mut silence, true, 1).await);
        tokio::time::advance(minute).await;
        assert!(
            expired(&mut silence, true, 1).await,
            "a minute of silence while waiting"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_trickle_is_never_silence_however_long() {
        let limit = Duration::from_secs(2);
        let mut silence = IdleWatch::new(limit);
        // A byte every half second for a minute, the engine waiting on the peer throughout:
        // each poll that follows a read sees the progress, and none in between expires.
        for read in 0..120 {
            assert!(!expired(&mut silence, true, read).await, "read {read}");
            tokio::time::advance(Duration::from_millis(500)).await;
        }
        // Then silence: it counts from the last bytes, to the limit and no further.
        assert!(!expired(&mut silence, true, 120).await);
        tokio::time::advance(limit - Duration::from_millis(1)).await;
        assert!(!expired(&mut silence, true, 120).await);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(expired(&mut silence, true, 120).await);
    }

    /// Pumps a body of `framing` from `input` (written in `pieces`) through two in-memory
    /// pipes; what the receiver got, and the bytes left after the body in the buffer.
    async fn pumped(body: Body, framing: bool, input: &[u8], pieces: usize) -> (Vec<u8>, Vec<u8>) {
        let (mut sender, mut from) = duplex(64);
        let (mut to, mut receiver) = duplex(1 << 20);
        let input = input.to_vec();
        let writing = tokio::spawn(async move {
            for piece in input.chunks(input.len().div_ceil(pieces).max(1)) {
                sender.write_all(piece).await.unwrap();
            }
            sender
        });
        let mut buf = Buffer::small();
        let mut pump = Pump::new(BodyReader::new(body), framing, 0);
        let spliced = AtomicU64::new(0);
        let end = std::future::poll_fn(|cx| pump.poll(cx, &mut buf, &mut from, &mut to, &spliced))
            .await
            .unwrap();
        let rest = buf.filled()[end..].to_vec();
        drop(to);
        let mut got = Vec::new();
        receiver.read_to_end(&mut got).await.unwrap();
        drop(writing.await.unwrap());
        (got, rest)
    }

    /// A body's framing, whether chunk framing goes on, its input, what is sent on, and what
    /// follows the body.
    type Case = (Body, bool, &'static [u8], &'static [u8], &'static [u8]);

    #[tokio::test]
    async fn a_body_goes_on_to_its_framed_end_and_no_further() {
        let chunked = b"5\r\nhello\r\n1;x=1\r\n \r\n0\r\nTrailer: t\r\n\r\nGET /next";
        let cases: &[Case] = &[
            (Body::Length(5), true, b"helloGET", b"hello", b"GET"),
            (
                Body::Chunked,
                true,
                chunked,
                b"5\r\nhello\r\n1;x=1\r\n \r\n0\r\n\r\n",
                b"GET /next",
            ),
            (Body::Chunked, false, chunked, b"hello ", b"GET /next"),
        ];
        for (body, framing, input, sent, rest) in cases {
            for pieces in [1, 3, input.len()] {
                let (got, left) = pumped(*body, *framing, input, pieces).await;
                assert_eq!(got, *sent, "{body:?} {framing} in {pieces}");
                // The bytes after the end were read with the body only if they came with it.
                assert!(rest.starts_with(&left), "{body:?} {pieces}: {left:?}");
            }
        }
    }
}
