//! Bytes both ways between a client and its server until both directions are finished, over
//! any [`Stream`]; when both ends are plain TCP sockets, bulk transfers go through splice(2)
//! without passing through user space.
//!
//! A half-close is passed on (EOF from one side becomes a shutdown of the write side towards
//! the other, while the other direction keeps flowing); an error on either side ends both.
//! Buffers are taken when a side has data and given back when it has none, so an idle
//! connection holds no buffer memory. Bytes are counted as they go, so pages show live figures.

use std::cell::RefCell;
use std::fmt;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::ReadBuf;
use tokio::time::{Instant, Sleep};

#[cfg(target_os = "linux")]
use crate::net::splice::{Splice, SpliceError};
use crate::net::stream::Stream;
use crate::support::os_error::words;

/// Bytes moved per read: more than HAProxy's and nginx's 16 KiB, which moved less through the
/// broker, at more CPU per byte (the figures, and how they were made: docs/benchmarks.md,
/// "Figures behind the code"). Buffers exist only while data moves, so idle connections do not
/// pay.
const BUFFER_SIZE: usize = 64 * 1024;

/// Buffers a thread keeps for its next bursts, so taking one is a pop rather than a 64 KiB
/// allocation and zeroing (which cost more than the read it serves, on small exchanges).
/// 16 per runtime thread: 1 MiB each at most.
const SPARE_BUFFERS: usize = 16;

thread_local! {
    static SPARE: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `BUFFER_SIZE` bytes (its contents are whatever the last user left).
fn take_buffer() -> Box<[u8]> {
    SPARE
        .with(|spare| spare.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; BUFFER_SIZE].into_boxed_slice())
}

/// Keeps a buffer for the next burst on this thread, or frees it when enough are kept.
fn give_buffer(buffer: Option<Box<[u8]>>) {
    let Some(buffer) = buffer.filter(|b| b.len() == BUFFER_SIZE) else {
        return;
    };
    SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS {
            spare.push(buffer);
        }
    });
}

/// One side of a relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client that connected to the broker.
    Client,
    /// The server the broker connected to.
    Server,
}

impl Side {
    /// The word used in log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }

    /// The side across the relay.
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// Why a relay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Both directions finished; the side that closed first.
    Closed(Side),
    /// An error on one side's socket (in words); the other side was closed too.
    Error(Side, String),
    /// The broker stopped it (shutdown timeout).
    Stopped,
    /// An operator cut its server's connections (`appbroker ctl cut`).
    Cut,
    /// No bytes either way for `IDLE_TIMEOUT`.
    Idle,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Closed(side) => f.write_str(side.as_str()),
            End::Error(side, words) => write!(f, "error ({} side: {words})", side.as_str()),
            End::Stopped => f.write_str("shutdown"),
            End::Cut => f.write_str("operator-cut"),
            End::Idle => f.write_str("idle-timeout"),
        }
    }
}

/// What a finished relay did.
#[derive(Debug)]
pub struct RelayOutcome {
    /// Bytes from the client to the server.
    pub to_server: u64,
    /// Bytes from the server to the client.
    pub to_client: u64,
    /// How it ended.
    pub end: End,
}

/// Live byte counters to add to as data moves (the server's totals).
pub struct Counters<'a> {
    /// Client to server.
    pub to_server: &'a AtomicU64,
    /// Server to client.
    pub to_client: &'a AtomicU64,
}

/// One direction's copy state.
#[derive(Default)]
struct Half {
    /// Taken when the reader has data, given back when it has none.
    buf: Option<Box<[u8]>>,
    /// Bytes of `buf` already written.
    pos: usize,
    /// Bytes of `buf` filled by the last read.
    cap: usize,
    /// The reader sent EOF.
    eof: bool,
    /// EOF was passed on: the writer's write side is shut down.
    done: bool,
    /// Bytes written.
    moved: u64,
    /// The last read filled the whole buffer: the peer is sending in bulk.
    bulk: bool,
    /// Set once the direction moves bulk data: bytes then go socket -> pipe -> socket.
    #[cfg(target_os = "linux")]
    splice: Option<Splice>,
}

/// A failure in one direction, by which socket failed.
enum DirectionFailure {
    Read(io::Error),
    Write(io::Error),
}

impl Half {
    /// Advances this direction unless it is finished; `Some` ends the relay with the failing
    /// side's error. `reader` is the side `from` belongs to.
    fn step<R: Stream, W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        counter: &AtomicU64,
        last: bool,
        reader: Side,
    ) -> Option<End> {
        if self.done {
            return None;
        }
        match self.poll_copy(cx, from, to, counter, last) {
            Poll::Ready(Err(DirectionFailure::Read(e))) => Some(End::Error(reader, words(&e))),
            Poll::Ready(Err(DirectionFailure::Write(e))) => {
                Some(End::Error(reader.other(), words(&e)))
            }
            Poll::Ready(Ok(())) | Poll::Pending => None,
        }
    }

    /// Moves bytes from `from` to `to` until it would block, or the direction is finished.
    /// `last` says the other direction is finished already: then EOF is not passed on with a
    /// shutdown, since both sockets are about to be closed, which sends the FIN anyway (one
    /// system call and one loopback round of TCP work fewer per connection); a TLS stream is
    /// shut down all the same, for its close_notify.
    fn poll_copy<R: Stream, W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        counter: &AtomicU64,
        last: bool,
    ) -> Poll<Result<(), DirectionFailure>> {
        loop {
            #[cfg(target_os = "linux")]
            if self.splice.is_some() {
                return self.poll_splice(cx, from, to, counter, last);
            }
            if let Some(buf) = self.buf.as_deref().filter(|_| self.pos < self.cap) {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &buf[self.pos..self.cap]))
                    .map_err(DirectionFailure::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(DirectionFailure::Write(
                        io::ErrorKind::WriteZero.into(),
                    )));
                }
                self.pos += n;
                self.moved += n as u64;
                counter.fetch_add(n as u64, Relaxed);
                continue;
            }
            if self.eof {
                return self.poll_finish(cx, to, last);
            }
            // A full buffer's worth at once means bulk: splice the rest, as HAProxy's
            // splice-auto does, and keep buffers for the chatty connections. Only from socket
            // to socket: a stream that transforms its bytes (TLS) has them in user space.
            #[cfg(target_os = "linux")]
            if self.bulk {
                self.bulk = false;
                if from.plain().is_some()
                    && to.plain().is_some()
                    && let Some(splice) = Splice::take()
                {
                    self.splice = Some(splice);
                    give_buffer(self.buf.take());
                    continue;
                }
            }
            // Everything read so far is written. A stream that holds bytes for its socket
            // (TLS records that did not fit the socket's buffer, session tickets queued by
            // the handshake) sends them now, before waiting for more to read: nothing else
            // would, and its peer would wait for them for ever.
            if to.plain().is_none() {
                ready!(Pin::new(&mut *to).poll_flush(cx)).map_err(DirectionFailure::Write)?;
            }
            // The client's first bytes came in a buffer of their own size: reading into it
            // would move the rest a few bytes at a time.
            if self.buf.as_ref().is_some_and(|b| b.len() != BUFFER_SIZE) {
                self.buf = None;
            }
            if self.buf.is_none() {
                // A socket says when it has bytes, so the buffer is taken only then; any other
                // stream is read into one, given back at once when nothing came.
                if let Some(socket) = from.plain() {
                    ready!(socket.poll_read_ready(cx)).map_err(DirectionFailure::Read)?;
                }
                self.buf = Some(take_buffer());
            }
            let Some(buf) = self.buf.as_deref_mut() else {
                continue;
            };
            let mut read = ReadBuf::new(buf);
            match Pin::new(&mut *from).poll_read(cx, &mut read) {
                Poll::Pending => {
                    // Nothing to read: give the memory back while the connection idles.
                    give_buffer(self.buf.take());
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(DirectionFailure::Read(e))),
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    self.pos = 0;
                    self.cap = n;
                    self.eof = n == 0;
                    self.bulk = n == BUFFER_SIZE;
                }
            }
        }
    }

    /// The reader's EOF, everything before it written: passes it on (unless `last` and `to`
    /// is a plain socket) and gives the buffer or pipe back.
    fn poll_finish<W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        to: &mut W,
        last: bool,
    ) -> Poll<Result<(), DirectionFailure>> {
        // A TLS stream is shut down even then: its close_notify tells the peer that the end
        // is the real end, not a connection cut short (a truncation).
        if !last || to.plain().is_none() {
            ready!(Pin::new(&mut *to).poll_shutdown(cx)).map_err(DirectionFailure::Write)?;
        }
        self.done = true;
        give_buffer(self.buf.take());
        #[cfg(target_os = "linux")]
        drop(self.splice.take());
        Poll::Ready(Ok(()))
    }

    /// The spliced copy ([`Splice`]): socket -> pipe -> socket, no byte through user space.
    /// Only ever set up between two plain sockets.
    #[cfg(target_os = "linux")]
    fn poll_splice<R: Stream, W: Stream>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        counter: &AtomicU64,
        last: bool,
    ) -> Poll<Result<(), DirectionFailure>> {
        let (Some(splice), Some(source), Some(sink)) =
            (self.splice.as_mut(), from.plain(), to.plain())
        else {
            return Poll::Ready(Ok(()));
        };
        let before = splice.written;
        let polled = splice.poll_move(cx, source, sink, u64::MAX);
        let n = splice.written - before;
        self.moved += n;
        counter.fetch_add(n, Relaxed);
        match ready!(polled) {
            Ok(_) => {
                self.eof = true;
                self.poll_finish(cx, to, last)
            }
            Err(SpliceError::Read(e)) => Poll::Ready(Err(DirectionFailure::Read(e))),
            Err(SpliceError::Write(e)) => Poll::Ready(Err(DirectionFailure::Write(e))),
        }
    }
}

/// Relays until both directions are finished, an error ends it, `stop` completes, or no byte
/// moves either way for `idle` (when given). `first` holds bytes already read from the
/// client, sent to the server before anything else.
///
/// Not an `async fn`: one gives each argument a second slot in its future, held for the
/// connection's life; the halves are made here and the block uses what it captured in place.
#[allow(clippy::manual_async_fn)]
pub fn relay<'a, C: Stream, S: Stream>(
    client: &'a mut C,
    server: &'a mut S,
    first: Vec<u8>,
    counters: Counters<'a>,
    idle: Option<Duration>,
    stop: impl Future<Output = ()> + 'a,
) -> impl Future<Output = RelayOutcome> + 'a {
    let mut up = Half::default();
    if !first.is_empty() {
        up.cap = first.len();
        up.buf = Some(first.into_boxed_slice());
    }
    async move {
        let mut stop = pin!(stop);
        let mut down = Half::default();
        let mut first_closed: Option<Side> = None;
        // See `idle_expired`.
        let mut last_activity = Instant::now();
        let mut idle_timer = pin!(idle.map(|d| tokio::time::sleep(d)));
        let end = poll_fn(|cx| {
            if stop.as_mut().poll(cx).is_ready() {
                return Poll::Ready(End::Stopped);
            }
            let moved_before = up.moved + down.moved;
            if let Some(end) = up
                .step(
                    cx,
                    client,
                    server,
                    counters.to_server,
                    down.done,
                    Side::Client,
                )
                .or_else(|| {
                    down.step(
                        cx,
                        server,
                        client,
                        counters.to_client,
                        up.done,
                        Side::Server,
                    )
                })
            {
                return Poll::Ready(end);
            }
            for (half, side) in [(&up, Side::Client), (&down, Side::Server)] {
                if half.eof {
                    first_closed.get_or_insert(side);
                }
            }
            if up.done && down.done {
                return Poll::Ready(End::Closed(first_closed.unwrap_or(Side::Client)));
            }
            let moved = up.moved + down.moved != moved_before;
            if idle_expired(cx, idle, idle_timer.as_mut(), &mut last_activity, moved) {
                return Poll::Ready(End::Idle);
            }
            Poll::Pending
        })
        .await;
        settle(client, server, &mut up, &mut down, end)
    }
}

/// Whether no byte moved for `idle` (when given). The timer is re-armed lazily: activity
/// (`moved` since the last poll) only records the time, and when the timer fires it either
/// ends the relay or is set again from the last activity.
fn idle_expired(
    cx: &mut Context<'_>,
    idle: Option<Duration>,
    timer: Pin<&mut Option<Sleep>>,
    last_activity: &mut Instant,
    moved: bool,
) -> bool {
    let (Some(limit), Some(mut timer)) = (idle, timer.as_pin_mut()) else {
        return false;
    };
    if moved {
        *last_activity = Instant::now();
    }
    while timer.as_mut().poll(cx).is_ready() {
        let deadline = *last_activity + limit;
        if deadline <= Instant::now() {
            return true;
        }
        timer.as_mut().reset(deadline);
    }
    false
}

/// A relay's end: its pipes given back, an abort passed on, its figures.
fn settle<C: Stream, S: Stream>(
    client: &mut C,
    server: &mut S,
    up: &mut Half,
    down: &mut Half,
    end: End,
) -> RelayOutcome {
    #[cfg(target_os = "linux")]
    drop((up.splice.take(), down.splice.take()));
    // Pass an abort on: the other side gets a reset, not a clean end of stream that could
    // pass for a complete answer.
    match &end {
        End::Error(Side::Client, _) => server.reset_on_close(),
        End::Error(Side::Server, _) => client.reset_on_close(),
        _ => {}
    }
    RelayOutcome {
        to_server: up.moved,
        to_client: down.moved,
        end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    /// Bytes that show where each came from: byte `i` of stream `seed`.
    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[tokio::test]
    async fn streams_that_are_no_socket_are_relayed_both_ways_with_half_close() {
        // Small pipes, so every direction blocks on the other side many times over, and more
        // than a buffer's worth each way, so the bulk path is taken (and finds no socket).
        let (mut client, mut client_side) = duplex(1024);
        let (mut server_side, mut server) = duplex(1024);
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let counters = Counters {
            to_server: &up,
            to_client: &down,
        };
        // The streams are dropped once the relay is over, as a client's task drops them: the
        // last direction's end goes out as the close.
        let relaying = async move {
            let outcome = relay(
                &mut client_side,
                &mut server_side,
                b"first ".to_vec(),
                counters,
                None,
                std::future::pending(),
            )
            .await;
            drop((client_side, server_side));
            outcome
        };
        let request = pattern(1, 200_000);
        let answer = pattern(2, 300_000);
        let client_talks = async {
            client.write_all(&request).await.unwrap();
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        };
        let server_talks = async {
            let mut got = Vec::new();
            // The client's half-close reaches the server as the end of its bytes...
            server.read_to_end(&mut got).await.unwrap();
            // ...while the other direction still flows.
            server.write_all(&answer).await.unwrap();
            server.shutdown().await.unwrap();
            got
        };
        let (outcome, to_client, to_server) = tokio::join!(relaying, client_talks, server_talks);
        let mut expected = b"first ".to_vec();
        expected.extend_from_slice(&request);
        assert!(to_server == expected, "the server got other bytes");
        assert!(to_client == answer, "the client got other bytes");
        assert!(
            matches!(outcome.end, End::Closed(Side::Client)),
            "{}",
            outcome.end
        );
        assert_eq!(outcome.to_server, expected.len() as u64);
        assert_eq!(outcome.to_client, answer.len() as u64);
        assert_eq!(up.load(Relaxed), outcome.to_server);
        assert_eq!(down.load(Relaxed), outcome.to_client);
    }
}
