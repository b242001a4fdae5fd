//! The engine's buffers, from a per-worker pool in two tiers: a small one for ordinary heads
//! and bodies, a large one ([`MAX_HEAD`] and a byte) for the rare head that outgrows it. A
//! connection takes one when bytes arrive and gives it back when its exchange is done (at
//! once, when a read finds nothing: nginx frees its header buffer likewise), so an idle
//! kept-alive client holds none. The pool is thread-local: a worker takes and gives without
//! a lock or an atomic shared with the other workers.
//!
//! What each worker keeps free is bounded ([`KEEP_SMALL`], [`KEEP_LARGE`]); beyond it a buffer
//! given back is freed, so a wave of clients leaves no pile of buffers behind. What is lent
//! out is bounded by the connections: at most two buffers each (the client's and the
//! server's), and `MAX_CONNECTIONS` bounds the connections.

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::http::h1::MAX_HEAD;

/// The small tier's size: a browser's head (1-2 KiB, cookies included) with room to spare,
/// and a body's bytes per read (sozu's size; large bodies between plain sockets go by splice).
pub(crate) const SMALL: usize = 16 * 1024;

/// The large tier's size: the largest head accepted and one byte more, which says it is too
/// large.
pub(crate) const LARGE: usize = MAX_HEAD + 1;

/// Small buffers a worker keeps free for its next requests: 1 MiB at most.
const KEEP_SMALL: usize = 64;

/// Large buffers a worker keeps free: 256 KiB at most.
const KEEP_LARGE: usize = 4;

/// Buffers lent out by one thread, by tier (its own atomics: no other thread writes them).
#[derive(Debug, Default)]
struct Lent {
    small: AtomicUsize,
    large: AtomicUsize,
}

/// Every thread's counts, for the process' figures (threads that ended keep theirs: zero).
static ALL: Mutex<Vec<Arc<Lent>>> = Mutex::new(Vec::new());

/// A thread's free buffers and its counts.
struct Pool {
    small: Vec<Box<[u8]>>,
    large: Vec<Box<[u8]>>,
    lent: Arc<Lent>,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::new());
}

impl Pool {
    fn new() -> Pool {
        let lent = Arc::new(Lent::default());
        ALL.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::clone(&lent));
        Pool {
            small: Vec::new(),
            large: Vec::new(),
            lent,
        }
    }
}

/// Buffers lent out, by tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferFigures {
    /// Small buffers in use.
    pub small: usize,
    /// Large buffers in use.
    pub large: usize,
}

/// The buffers the calling thread has lent out now (a test's engine on a current-thread
/// runtime: exactly its own).
pub fn lent_here() -> BufferFigures {
    POOL.with(|pool| figures_of(&pool.borrow().lent))
}

/// The buffers every thread has lent out now.
pub fn lent() -> BufferFigures {
    let all = ALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    all.iter().fold(BufferFigures::default(), |sum, lent| {
        let one = figures_of(lent);
        BufferFigures {
            small: sum.small + one.small,
            large: sum.large + one.large,
        }
    })
}

fn figures_of(lent: &Lent) -> BufferFigures {
    BufferFigures {
        small: lent.small.load(Relaxed),
        large: lent.large.load(Relaxed),
    }
}

/// A pooled buffer: bytes read into it from the start, up to `len`. Given back to the
/// thread's pool when dropped.
#[derive(Debug)]
pub(crate) struct Buffer {
    bytes: Box<[u8]>,
    len: usize,
}

impl Buffer {
    /// A small buffer, empty.
    pub(crate) fn small() -> Buffer {
        Buffer::take(SMALL)
    }

    fn take(size: usize) -> Buffer {
        let bytes = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let (free, count) = if size == SMALL {
                (pool.small.pop(), &pool.lent.small)
            } else {
                (pool.large.pop(), &pool.lent.large)
            };
            count.fetch_add(1, Relaxed);
            free
        });
        // A new buffer is zeroed once (calloc: pages the kernel zeroes); a pooled one keeps
        // what its last user left, never read past `len`.
        let bytes = bytes.unwrap_or_else(|| vec![0; size].into_boxed_slice());
        Buffer { bytes, len: 0 }
    }

    /// A large buffer holding this one's bytes (a head that did not fit the small tier).
    pub(crate) fn into_large(self) -> Buffer {
        let mut large = Buffer::take(LARGE);
        large.bytes[..self.len].copy_from_slice(self.filled());
        large.len = self.len;
        large
    }

    /// Whether it is of the large tier.
    pub(crate) fn is_large(&self) -> bool {
        self.bytes.len() == LARGE
    }

    /// The bytes the buffer holds, read or not: what it costs.
    pub(crate) fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The bytes read so far.
    pub(crate) fn filled(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The bytes read so far, to mend in place (a head's version, a folded line).
    pub(crate) fn filled_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }

    /// How many bytes were read.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no room left.
    pub(crate) fn is_full(&self) -> bool {
        self.len == self.bytes.len()
    }

    /// Forgets every byte read.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Forgets the first `n` bytes: the rest moves to the start (a pipelined request, the
    /// final head after an interim one; a few bytes, usually none).
    pub(crate) fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.bytes.copy_within(n..self.len, 0);
        self.len -= n;
    }

    /// Reads what `from` has into the room left: the bytes read (0 at the end of the stream,
    /// or when there is no room, which callers avoid).
    pub(crate) fn poll_read_from<R: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
    ) -> Poll<std::io::Result<usize>> {
        let mut room = ReadBuf::new(&mut self.bytes[self.len..]);
        match Pin::new(from).poll_read(cx, &mut room) {
            Poll::Ready(Ok(())) => {
                let n = room.filled().len();
                self.len += n;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        let size = bytes.len();
        // A thread being torn down has no pool left: the buffer is simply freed.
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let (free, count, keep) = if size == SMALL {
                let pool = &mut *pool;
                (&mut pool.small, &pool.lent.small, KEEP_SMALL)
            } else {
                let pool = &mut *pool;
                (&mut pool.large, &pool.lent.large, KEEP_LARGE)
            };
            count.fetch_sub(1, Relaxed);
            if free.len() < keep {
                free.push(bytes);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_go_back_to_their_tier_and_the_figures_follow() {
        let before = lent_here();
        let mut small = Buffer::small();
        small.bytes[..5].copy_from_slice(b"hello");
        small.len = 5;
        assert_eq!(lent_here().small, before.small + 1);
        let large = small.into_large();
        assert!(large.is_large());
        assert_eq!(large.filled(), b"hello");
        assert_eq!(
            lent_here(),
            BufferFigures {
                small: before.small,
                large: before.large + 1
            }
        );
        drop(large);
        assert_eq!(lent_here(), before);
        // The pool hands back what it kept.
        let again = Buffer::small();
        assert_eq!(again.len(), 0);
        assert!(!again.is_large());
    }

    #[test]
    fn consume_moves_the_rest_to_the_start() {
        let mut buf = Buffer::small();
        buf.bytes[..10].copy_from_slice(b"0123456789");
        buf.len = 10;
        buf.consume(4);
        assert_eq!(buf.filled(), b"456789");
        buf.consume(99);
        assert_eq!(buf.len(), 0);
    }
}
