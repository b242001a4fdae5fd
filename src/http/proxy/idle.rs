//! Kept-alive connections to the servers, by server and by worker thread: at most `max_idle`
//! idle ones each, the most recently used taken first (so the surplus ages out), none older
//! than the idle timeout, none the server has closed. A connection comes back only after an
//! exchange that finished cleanly: after any error it is dropped, never reused.
//!
//! A connection's driver (hyper's connection task) runs on the worker that opened it, so a
//! request is only given a connection of its own worker: one from another worker would cost a
//! wake-up of that thread, and one back, on every request (nginx's upstream keepalive is per
//! worker for the same reason).
//!
//! One small lock, held to push or pop a connection; the figures are atomics.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

use super::body::RequestBody;
use crate::net::workers;

/// A connection's sending half; hyper's connection task holds the rest.
pub(crate) type Sender = SendRequest<RequestBody>;

/// A connection to a server, ready for a request.
pub(crate) struct Conn {
    pub(crate) sender: Sender,
    pub(crate) traffic: Arc<Traffic>,
    /// Taken from the pool (it served a request before), rather than just opened: a failure
    /// may then be the server closing it at the moment of reuse.
    pub(crate) reused: bool,
    /// Closes the connection when dropped, whatever hyper's task for it is still doing
    /// (sending a body the server answered without); disarmed when an upgrade takes the
    /// stream.
    pub(crate) closer: DropGuard,
}

/// Bytes a server connection read so far: a request's retry is decided on them (nothing read
/// means no byte of an answer arrived).
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    pub(crate) read: AtomicU64,
}

/// A server's connection figures, for METRICS.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    open: AtomicU64,
    opened: AtomicU64,
    reused: AtomicU64,
}

impl Figures {
    pub(crate) fn opened(&self) {
        self.open.fetch_add(1, Relaxed);
        self.opened.fetch_add(1, Relaxed);
    }

    pub(crate) fn closed(&self) {
        self.open.fetch_sub(1, Relaxed);
    }
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

struct Idle {
    sender: Sender,
    traffic: Arc<Traffic>,
    closer: DropGuard,
    since: Instant,
}

#[derive(Default)]
struct Slot {
    /// By the worker thread whose runtime drives them (`None`: off the workers, where one
    /// runtime may run a task on any of its threads); oldest first.
    idle: HashMap<Option<usize>, Vec<Idle>>,
    figures: Arc<Figures>,
}

impl Slot {
    /// The calling worker's idle connections.
    fn here(&mut self) -> &mut Vec<Idle> {
        self.idle.entry(workers::current()).or_default()
    }
}

/// The kept-alive connections of one balancer's servers, idle between two requests, kept per
/// server and worker thread: the engine's pool.
pub(crate) struct IdleConnections<S> {
    slots: Mutex<HashMap<S, Slot>>,
}

impl<S: Clone + Eq + Hash> IdleConnections<S> {
    pub(crate) fn new() -> IdleConnections<S> {
        IdleConnections {
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<S, Slot>> {
        // A panic elsewhere while the lock was held leaves plain data behind: go on with it.
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The figures a new connection to `server` counts in.
    pub(crate) fn figures(&self, server: &S) -> Arc<Figures> {
        let mut slots = self.slots();
        Arc::clone(&slots.entry(server.clone()).or_default().figures)
    }

    /// The most recently pooled connection to `server` of the calling worker that is still
    /// usable; the expired and closed ones met on the way are dropped.
    pub(crate) fn take(&self, server: &S, idle_timeout: Duration) -> Option<Conn> {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let taken = {
            let mut slots = self.slots();
            let slot = slots.get_mut(server)?;
            let mut taken = None;
            while let Some(idle) = slot.here().pop() {
                if now.duration_since(idle.since) < idle_timeout
                    && !idle.sender.is_closed()
                    && idle.sender.is_ready()
                {
                    slot.figures.reused.fetch_add(1, Relaxed);
                    taken = Some(idle);
                    break;
                }
                dropped.push(idle);
            }
            taken
        };
        drop(dropped);
        taken.map(|idle| Conn {
            sender: idle.sender,
            traffic: idle.traffic,
            reused: true,
            closer: idle.closer,
        })
    }

    /// Keeps `conn` for `server`'s next request on the calling worker (the one that opened
    /// it); beyond `max_idle` the worker's oldest goes. A server forgotten meanwhile (removed
    /// by a reload) keeps nothing: the connection closes.
    pub(crate) fn put(&self, server: &S, conn: Conn, max_idle: usize) {
        if conn.sender.is_closed() || max_idle == 0 {
            return;
        }
        let surplus = {
            let mut slots = self.slots();
            let Some(slot) = slots.get_mut(server) else {
                return;
            };
            let here = slot.here();
            here.push(Idle {
                sender: conn.sender,
                traffic: conn.traffic,
                closer: conn.closer,
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
                let (keep, old) = std::mem::take(idle).into_iter().partition(|idle| {
                    now.duration_since(idle.since) < idle_timeout && !idle.sender.is_closed()
                });
                *idle = keep;
                dropped.push(old);
            }
        }
        drop(dropped);
    }

    /// Closes `server`'s idle connections and forgets its figures (it left the balancer).
    pub(crate) fn forget(&self, server: &S) {
        let slot = self.slots().remove(server);
        drop(slot);
    }

    /// Every server's figures.
    pub(crate) fn figures_all(&self) -> Vec<(S, PoolFigures)> {
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
