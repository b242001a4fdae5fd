//! Kept-alive connections to the servers, by server and by worker thread: at most `max_idle`
//! idle ones each, the most recently used taken first (so the surplus ages out), none older
//! than the idle timeout, none the server has closed. A connection comes back only after an
//! exchange whose two messages were framed and whole ([`h1::reuse`]): after anything else it is
//! closed, never reused.
//!
//! An idle connection is its socket and a timestamp: no task, no buffer. Whether anything
//! waits on it is looked at when it is put back, when it is taken, and by the sweep, without
//! waiting ([`alive`]): the end of the stream, or any byte nobody asked for (an answer a
//! server sent unasked, on plain and TLS connections alike), mean it is closed, never handed
//! to the next request, as nginx's upstream keepalive does with a one-byte peek.
//!
//! A socket is registered with the runtime of the worker that opened it, so a request is only
//! given a connection of its own worker: one from another worker would be woken through that
//! worker's event loop on every read (nginx's upstream keepalive is per worker for the same
//! reason). One small lock, held to push or pop a connection; the figures are atomics.
//!
//! [`h1::reuse`]: crate::http::h1::reuse

use std::future::Future;
use std::net::IpAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use foldhash::HashMap;
use tokio::io::ReadBuf;
use tokio::time::Instant;

use crate::http::{Report, Upstreams};
use crate::net::stream::Stream;
use crate::net::workers;

/// A connection to a server, with the report of its end.
pub(crate) struct ServerConn<U: Upstreams> {
    pub(crate) stream: U::Stream,
    /// Says the connection closed (to the balancer and the figures) when dropped.
    pub(crate) _lifetime: Lifetime<U>,
    /// Taken from the pool (it served a request before), rather than just opened: a failure
    /// may then be the server closing it at the moment of reuse.
    pub(crate) reused: bool,
    /// The client it was opened for, when it belongs to that client alone
    /// ([`Upstreams::connection_owner`]).
    pub(crate) owner: Option<IpAddr>,
}

/// A server's connection figures, for METRICS.
#[derive(Debug, Default)]
pub(crate) struct PoolCounters {
    open: AtomicU64,
    opened: AtomicU64,
    reused: AtomicU64,
}

/// A server's pool, as METRICS shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolFigures {
    /// Connections waiting in the pool now.
    pub idle: usize,
    /// Connections open now: idle, busy with a request, or upgraded.
    pub open: u64,
    /// Connections opened since start.
    pub opened: u64,
    /// Requests sent on a connection taken from the pool.
    pub reused: u64,
}

/// Reports a server connection's end to the balancer (and the pool's figures) when dropped:
/// with the connection, or with the relay when it was upgraded.
pub(crate) struct Lifetime<U: Upstreams> {
    upstreams: Arc<U>,
    server: U::Server,
    figures: Arc<PoolCounters>,
}

impl<U: Upstreams> Lifetime<U> {
    /// A connection to `server` just opened: says so.
    pub(crate) fn opened(upstreams: Arc<U>, server: U::Server, figures: Arc<PoolCounters>) -> Self {
        figures.open.fetch_add(1, Relaxed);
        figures.opened.fetch_add(1, Relaxed);
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
        self.figures.open.fetch_sub(1, Relaxed);
        self.upstreams.report(Report::Closed {
            server: &self.server,
        });
    }
}

/// An idle connection, since when.
struct Idle<U: Upstreams> {
    conn: ServerConn<U>,
    since: Instant,
}

/// One server's idle connections and figures.
struct Slot<U: Upstreams> {
    /// By the worker thread whose runtime drives them (`None`: off the workers, where one
    /// runtime may run a task on any of its threads); oldest first.
    idle: HashMap<Option<usize>, Vec<Idle<U>>>,
    figures: Arc<PoolCounters>,
}

impl<U: Upstreams> Default for Slot<U> {
    fn default() -> Self {
        Slot {
            idle: HashMap::default(),
            figures: Arc::default(),
        }
    }
}

/// The kept-alive connections of one balancer's servers, idle between two requests, kept per
/// server and worker thread: the engine's pool.
pub(crate) struct ServerPool<U: Upstreams> {
    slots: Mutex<HashMap<U::Server, Slot<U>>>,
}

impl<U: Upstreams> ServerPool<U> {
    pub(crate) fn new() -> ServerPool<U> {
        ServerPool {
            slots: Mutex::new(HashMap::default()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<U::Server, Slot<U>>> {
        // A panic elsewhere while the lock was held leaves plain data behind: go on with it.
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The figures a new connection to `server` counts in.
    pub(crate) fn figures(&self, server: &U::Server) -> Arc<PoolCounters> {
        let mut slots = self.slots();
        Arc::clone(&slots.entry(server.clone()).or_default().figures)
    }

    /// The most recently pooled connection to `server` of the calling worker that is still
    /// usable and belongs to `owner` (`None`: one that belongs to no client); the expired and
    /// closed ones met on the way are closed. The list is at most `max_idle` long, so looking
    /// past other clients' connections is bounded.
    pub(crate) fn take(
        &self,
        server: &U::Server,
        idle_timeout: Duration,
        owner: Option<IpAddr>,
    ) -> Option<ServerConn<U>> {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let taken = {
            let mut slots = self.slots();
            let slot = slots.get_mut(server)?;
            let here = slot.idle.get_mut(&workers::current())?;
            let mut taken = None;
            while let Some(at) = here.iter().rposition(|idle| idle.conn.owner == owner) {
                let mut idle = here.remove(at);
                if now.duration_since(idle.since) < idle_timeout && alive(&mut idle.conn.stream) {
                    slot.figures.reused.fetch_add(1, Relaxed);
                    taken = Some(idle.conn);
                    break;
                }
                dropped.push(idle);
            }
            taken
        };
        drop(dropped);
        taken.map(|mut conn| {
            conn.reused = true;
            conn
        })
    }

    /// Keeps `conn` for `server`'s next request on the calling worker (the one that opened
    /// it), when nothing waits on it ([`alive`]: the caller saw its own buffer empty, this
    /// sees the stream's); beyond `max_idle` the worker's oldest goes. A server forgotten
    /// meanwhile (removed by a reload) keeps nothing: the connection closes.
    pub(crate) fn put(&self, server: &U::Server, mut conn: ServerConn<U>, max_idle: usize) {
        if max_idle == 0 || !alive(&mut conn.stream) {
            return;
        }
        let surplus = {
            let mut slots = self.slots();
            let Some(slot) = slots.get_mut(server) else {
                return;
            };
            let here = slot.idle.entry(workers::current()).or_default();
            here.push(Idle {
                conn,
                since: Instant::now(),
            });
            let over = here.len().saturating_sub(max_idle);
            here.drain(..over).collect::<Vec<_>>()
        };
        drop(surplus);
    }

    /// Closes every idle connection older than `idle_timeout` or closed by its server.
    pub(crate) fn sweep(&self, idle_timeout: Duration) {
        let now = Instant::now();
        let mut dropped = Vec::new();
        {
            let mut slots = self.slots();
            for idle in slots.values_mut().flat_map(|slot| slot.idle.values_mut()) {
                dropped.extend(idle.extract_if(.., |idle| {
                    now.duration_since(idle.since) >= idle_timeout || !alive(&mut idle.conn.stream)
                }));
            }
        }
        drop(dropped);
    }

    /// Closes `server`'s idle connections and forgets its figures (it left the balancer).
    pub(crate) fn forget(&self, server: &U::Server) {
        let slot = self.slots().remove(server);
        drop(slot);
    }

    /// Every server's figures.
    pub(crate) fn figures_all(&self) -> Vec<(U::Server, PoolFigures)> {
        self.slots()
            .iter()
            .map(|(server, slot)| {
                let figures = PoolFigures {
                    idle: slot.idle.values().map(Vec::len).sum(),
                    open: slot.figures.open.load(Relaxed),
                    opened: slot.figures.opened.load(Relaxed),
                    reused: slot.figures.reused.load(Relaxed),
                };
                (server.clone(), figures)
            })
            .collect()
    }
}

/// Whether an idle connection is still the server's to use: nothing waits on it. Any byte
/// waiting (an answer nobody asked for), the end of the stream or an error mean it is not;
/// only "nothing yet" means it is, on plain and TLS connections alike.
///
/// A plain socket is peeked without waiting, and only when the runtime last saw it readable
/// (a drained socket costs no system call). A TLS stream is read instead, without waiting (a
/// no-op waker, the task's budget set aside): a peek at its socket cannot see plaintext the
/// TLS layer decrypted already, and records without application data (a TLS 1.3 session
/// ticket, a key update) are taken in by the TLS layer and yield nothing, so they do not
/// count. Reading is harmless: a connection that gives a byte is closed.
pub(crate) fn alive<S: Stream>(stream: &mut S) -> bool {
    if let Some(socket) = stream.plain() {
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        return match socket.try_io(tokio::io::Interest::READABLE, || {
            socket2::SockRef::from(socket).peek(&mut byte)
        }) {
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        };
    }
    let mut byte = [0u8; 1];
    let mut read = ReadBuf::new(&mut byte);
    let polled = tokio::task::coop::unconstrained(std::future::poll_fn(|cx| {
        Poll::Ready(Pin::new(&mut *stream).poll_read(cx, &mut read))
    }));
    match pin!(polled).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Poll::Pending) => true,
        Poll::Ready(Poll::Ready(_)) | Poll::Pending => false,
    }
}
