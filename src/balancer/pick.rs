//! What a connection takes while it lives: a client's slot under `MAX_CONNECTIONS`
//! ([`ClientSlot`]), a query's place under `QUERY_MAX_CONNECTIONS`, and a server picked by the
//! policy and counted against it by a [`Lease`]. Each is given back when dropped, however the
//! connection's task ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::balancer::Balancer;
use crate::balancer::generation::Generation;
use crate::balancer::rules::places::Place;
use crate::balancer::rules::select::Load;
use crate::balancer::server::Server;
use crate::config::SortMethod;
use crate::support::clock::wall_ms;

impl Balancer {
    /// Takes a client place, counted against `generation`'s `MAX_CONNECTIONS` until the
    /// returned slot is dropped; `None` when the limit is reached. The limit is read at each
    /// take, so one lowered by a reload holds as soon as enough clients have left.
    pub fn try_take_slot(self: &Arc<Self>, generation: &Generation) -> Option<ClientSlot> {
        let open = take_under(&self.stats.active, generation.config.max_connections)?;
        fetch_max(&self.stats.peak, open);
        Some(ClientSlot {
            balancer: Arc::clone(self),
            counted: false,
        })
    }

    /// True when `MAX_CONNECTIONS` clients are open.
    pub fn at_limit(&self, generation: &Generation) -> bool {
        self.stats.active.load(Relaxed) >= u64::from(generation.config.max_connections)
    }

    /// Takes a query place, held under `QUERY_MAX_CONNECTIONS` until the returned place is
    /// dropped (or given up to another query while idle); `None` when every place is busy.
    /// Running out of them is logged once per episode.
    pub fn take_query_place(&self) -> Option<Place> {
        let places = &self.query_places;
        let max = self.generation().config.query.max_connections;
        match places.take(max) {
            Some(place) => {
                if let Some(refused) = places.exhausted.end() {
                    info!(
                        "answering queries again: {refused} refused while QUERY_MAX_CONNECTIONS was reached"
                    );
                }
                Some(place)
            }
            None => {
                if places.exhausted.strike() {
                    warn!(
                        "QUERY_MAX_CONNECTIONS ({max}) reached: queries are answered 503 until one \
                         of the {} open finishes; clients are not affected",
                        places.taken()
                    );
                }
                None
            }
        }
    }

    /// True while a query could take a place.
    pub fn query_room(&self) -> bool {
        self.query_places
            .has_room(self.generation().config.query.max_connections)
    }
}

/// A client counted as open (against `MAX_CONNECTIONS`) from the moment it is known to be no
/// query until dropped, however its task ends.
#[derive(Debug)]
pub struct ClientSlot {
    balancer: Arc<Balancer>,
    /// Its connection is counted in the clients accepted already: it held a slot before,
    /// given back while it waited ([`Admission::give_back`](super::Admission::give_back)).
    counted: bool,
}

impl ClientSlot {
    /// The slot of a connection counted in the clients accepted already: [`ClientSlot::admit`]
    /// counts it no more.
    pub(super) fn counted_already(mut self) -> ClientSlot {
        self.counted = true;
        self
    }

    /// Counts the client as forwarded: it is no query. Once per connection.
    pub fn admit(&self) {
        if self.counted {
            return;
        }
        let stats = &self.balancer.stats;
        stats.accepted.fetch_add(1, Relaxed);
        stats.last_connection_ms.store(wall_ms(), Relaxed);
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.balancer.stats.active.fetch_sub(1, Relaxed);
    }
}

/// Whether a pick may fall back to quarantined servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eligible {
    /// Only servers that are not in quarantine.
    Available,
    /// Servers in quarantine too: every server is quarantined, and a quarantine may be stale.
    EvenQuarantined,
}

impl Generation {
    /// Chooses the next server for a client, skipping those already `tried` for it and
    /// weight-0 (draining) servers, and counts the connection against it at once.
    pub fn pick(&self, clock_ms: u64, tried: &[usize], eligible: Eligible) -> Option<Lease> {
        // Choosing and counting are one step under the lock, so concurrent clients see each
        // other's choices and spreads stay exact. The lock is held for one scan.
        let mut guard = self.selector.lock().unwrap_or_else(|p| p.into_inner());
        let (selector, loads) = &mut *guard;
        loads.clear();
        loads.extend(self.servers.iter().enumerate().map(|(i, s)| {
            let weight = s.weight.load(Relaxed);
            let ok = weight > 0
                && !s.held.load(Relaxed)
                && !tried.contains(&i)
                && match eligible {
                    Eligible::Available => s.health.is_available(clock_ms),
                    // Not one an operator put there: that is no stale quarantine.
                    Eligible::EvenQuarantined => {
                        s.health.is_available(clock_ms) || !s.health.is_forced()
                    }
                };
            let sessions = match self.config.sort_method {
                SortMethod::Session => s.sessions.load(Relaxed),
                _ => 0,
            };
            ok.then_some(Load {
                weight,
                active: s.active.load(Relaxed) + sessions,
            })
        }));
        let index = selector.pick(loads)?;
        let lease = self.lease(index, eligible == Eligible::EvenQuarantined);
        drop(guard);
        lease
    }

    /// The policy's pick among the servers not `tried` that are not in quarantine, or, when
    /// every one is, among those in quarantine: a quarantine may be stale (a short glitch can
    /// put them all there), and a connect tells. The one pick of both connection paths.
    pub fn pick_with_fallback(&self, clock_ms: u64, tried: &[usize]) -> Option<Lease> {
        self.pick(clock_ms, tried, Eligible::Available)
            .or_else(|| self.pick(clock_ms, tried, Eligible::EvenQuarantined))
    }

    /// Counts a connection against the server at `index`, chosen by the caller (an HTTP
    /// session's server, which it keeps while disabled, draining or of weight 0).
    pub fn lease(&self, index: usize, stale: bool) -> Option<Lease> {
        let server = Arc::clone(self.servers.get(index)?);
        let active = server.active.fetch_add(1, Relaxed) + 1;
        fetch_max(&server.peak, active);
        let cut = server.cut.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Some(Lease {
            index,
            server,
            stale,
            cut,
        })
    }
}

/// A connection counted against a server; the count ends when the lease is dropped.
#[derive(Debug)]
pub struct Lease {
    /// Index of the server in its generation.
    pub index: usize,
    /// The server.
    pub server: Arc<Server>,
    /// Chosen although quarantined (every server was): its quarantine may be stale.
    pub stale: bool,
    /// Cancelled when an operator cuts the server's connections.
    pub cut: CancellationToken,
}

impl Lease {
    /// The server's byte counters (client to server, server to client), which the relay adds
    /// to as bytes move so pages show live figures.
    pub fn byte_counters(&self) -> (&AtomicU64, &AtomicU64) {
        (&self.server.bytes_to_server, &self.server.bytes_to_client)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.server.active.fetch_sub(1, Relaxed);
    }
}

/// Adds one to `open` unless it has reached `max`; returns the new count.
fn take_under(open: &AtomicU64, max: u32) -> Option<u64> {
    let max = u64::from(max);
    open.fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
        .ok()
        .map(|before| before + 1)
}

/// Raises `peak` to `value`, reading first: peaks are rarely beaten, and a read leaves the
/// cache line shared between worker threads where a read-modify-write would not.
fn fetch_max(peak: &AtomicU64, value: u64) {
    if peak.load(Relaxed) < value {
        peak.fetch_max(value, Relaxed);
    }
}
