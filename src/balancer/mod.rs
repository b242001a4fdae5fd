//! A balancer's live state: its servers with their counters and health, the selection policy,
//! the lease that counts a connection against its server while it lives, and one method per
//! event that changes any of it. Every counter and every quarantine transition is changed here
//! and nowhere else, and the log lines of a transition are written here, once.
//!
//! The current [`Generation`] (servers, weights, settings, TLS) sits behind an [`ArcSwap`] so a
//! connection takes one snapshot and the hot path never waits for a lock other than the
//! selection's own, which is held for one scan of the servers.
//!
//! This file holds the [`Balancer`] itself, its constructor and accessors; its state and its
//! methods are split by concern, several `impl Balancer` blocks across the files:
//!
//! - `server`: one configured server and its atomics (counters, weight, hold, samples,
//!   health).
//! - `generation`: one generation of the configuration (settings, servers, the policy's
//!   state, the TLS loaded for it), and the reload that builds the next.
//! - `pick`: what a connection takes while it lives: a client's slot under
//!   `MAX_CONNECTIONS`, a query's place, a server picked by the policy and its lease.
//! - `admission`: how one connection is counted, by what it asks: a query's place while it
//!   asks only queries, a client's slot from its first request to a server on.
//! - `connections`: a connection's events, one method each (accepts, PROXY protocol headers,
//!   handshakes, refusals, the dial and its outcome, unserved clients, the close).
//! - `client_limit`: `MAX_CONNECTIONS_PER_CLIENT` applied: each client address's
//!   connections in a sharded table, the hold a connection keeps, the refusals logged.
//! - `quarantine`: health events: quarantines started and released, the expiry sweep, the
//!   monitor's checks counted, and when no server is available or one is again.
//! - `operator`: an operator's actions on a server (hold, enable, weight, quarantine and
//!   release, cut, the overrides restored from the state file), and the record of a restart.
//! - [`operation`]: an operator's action on a server as one value, applied and kept: the one
//!   code path of `appbroker ctl` and of the status page's actions.
//! - [`state_file`]: operators' overrides and quarantines kept over a restart, written after
//!   every operation and read back at start.
//! - `state`: the read model: a server and a balancer read at one instant, what the query
//!   interface and `appbroker ctl` see.
//!
//! Beside it, its rules, the events it publishes and the state every connection reads it
//! from:
//!
//! - [`rules`]: the balancer's own rules, pure logic it applies and logs: quarantine,
//!   overrides, the policies, query places.
//! - [`events`]: what happens in a broker, as events to subscribe to (a balancer publishes
//!   most of them, so they sit here, below every publisher); the hub that holds the alerts'
//!   queue too.
//! - [`alert_queue`]: the alerts' own bounded queue (the few events worth telling people) and
//!   their counts, which the hub holds and the alerts machinery reads.
//! - [`shared`]: the broker's state every connection's task shares: every balancer, the
//!   running configuration and the shutdown state, and how a balancer tells its connections
//!   to end.

mod admission;
pub mod alert_queue;
mod client_limit;
mod connections;
pub mod events;
mod generation;
pub mod operation;
mod operator;
mod pick;
mod quarantine;
pub mod rules;
mod server;
pub mod shared;
mod state;
pub mod state_file;

pub use admission::Admission;
pub use client_limit::{ClientHold, RefusalHold};
pub use connections::{Attempt, Closed};
pub use generation::{Generation, GenerationTls};
pub use pick::{ClientSlot, Eligible, Lease};
pub use server::{RestartRefusal, Restarted, Server};
pub use state::{BalancerState, ServerState, Standing};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tracing::{Span, error, info_span, warn};

use crate::balancer::events::Events;
use crate::balancer::rules::health::Now;
use crate::balancer::rules::places::QueryPlaces;
use crate::config::{BalancerConfig, BalancerKind};
use crate::net::resolve::Resolver;
use crate::support::clock::{Clock, wall_ms};
use crate::support::throttle::{self, Throttle};
use crate::tls::Resumption;

/// Counters of a balancer as a whole.
#[derive(Debug, Default)]
struct BalancerTotals {
    /// Clients forwarded (queries are not counted).
    accepted: AtomicU64,
    /// Clients refused because `MAX_CONNECTIONS` was reached.
    rejected: AtomicU64,
    /// Clients closed because no server could be reached.
    unserved: AtomicU64,
    /// Client connections open now.
    active: AtomicU64,
    /// Highest `active` seen.
    peak: AtomicU64,
    /// Wall-clock time of the last accepted client, in ms since the Unix epoch (0: none yet).
    last_connection_ms: AtomicU64,
    /// Connections refused because their client had `MAX_CONNECTIONS_PER_CLIENT` open.
    client_limited: AtomicU64,
}

/// One `[BALANCE_*]` section at run time.
#[derive(Debug)]
pub struct Balancer {
    /// The current generation; a reload stores the next.
    generation: ArcSwap<Generation>,
    stats: BalancerTotals,
    /// The time base of quarantine deadlines.
    clock: Clock,
    /// Wakes the monitor when a quarantine starts, so it can log the release on time.
    health_changed: Notify,
    /// Throttles "no remote servers available", which would otherwise repeat per client.
    no_servers_log: Throttle,
    /// True while no server takes new clients: `no_servers_available` was told, and
    /// `servers_available_again` is next.
    none_available: AtomicBool,
    /// Query connections open now, held under `QUERY_MAX_CONNECTIONS` apart from the
    /// clients' `MAX_CONNECTIONS`.
    query_places: Arc<QueryPlaces>,
    /// Clients refused since `MAX_CONNECTIONS` was last reached, logged per episode.
    refusals: throttle::Episode,
    /// Clients closed (on an HTTP balancer, requests answered 503) because the broker itself
    /// lacked descriptors, ports or memory: one strike each, since neither engine tries
    /// another server after such a failure
    /// ([`ConnectError::try_next`](crate::net::dial::ConnectError::try_next)).
    broker_faults: throttle::Episode,
    /// Accepts that failed for the broker's own reasons, across the balancer's accept loops.
    accept_failures: throttle::Episode,
    /// The process's resolver, which its clients and monitor connect through.
    resolver: Arc<Resolver>,
    /// Where the balancer's events are published.
    events: Events,
    /// Session tickets' key and the session cache, kept across reloads.
    resumption: Option<Resumption>,
    /// Failed TLS handshakes with clients, by cause.
    handshake_failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Failed TLS handshakes with clients since the last good one, logged per episode.
    handshake_episode: throttle::Episode,
    /// Connections refused at the PROXY protocol step, by cause.
    proxy_refusals: Mutex<BTreeMap<&'static str, u64>>,
    /// PROXY protocol refusals since the last good header, logged per episode.
    proxy_episode: throttle::Episode,
    /// Each client address's connections, under `MAX_CONNECTIONS_PER_CLIENT`.
    clients: client_limit::ClientTable,
}

impl Balancer {
    /// A balancer over `config`'s servers, all available, resolving names with `resolver` and
    /// publishing its events on `events`.
    pub fn new(config: BalancerConfig, resolver: Arc<Resolver>, events: Events) -> Self {
        let servers = config
            .servers
            .iter()
            .map(|s| Arc::new(Server::new(s)))
            .collect();
        let resumption = Resumption::new()
            .inspect_err(|e| warn!("TLS session resumption is off: {e}"))
            .ok();
        // The doctor loaded these files when the configuration was validated; they can fail
        // here only if they changed since. Clients are then closed rather than served
        // without the TLS the file asks for (see `Generation::tls_missing`).
        let tls = GenerationTls::load(&config, resumption.as_ref()).unwrap_or_else(|findings| {
            for line in findings.to_string().lines() {
                error!("{line}");
            }
            error!(
                "{}: its TLS keys cannot be loaded; every client is closed",
                config.kind
            );
            GenerationTls::default()
        });
        Balancer {
            generation: ArcSwap::from_pointee(Generation::new(config, servers, Arc::new(tls))),
            resumption,
            handshake_failures: Mutex::default(),
            handshake_episode: throttle::Episode::default(),
            proxy_refusals: Mutex::default(),
            proxy_episode: throttle::Episode::default(),
            clients: client_limit::ClientTable::default(),
            stats: BalancerTotals::default(),
            clock: Clock::new(),
            health_changed: Notify::new(),
            no_servers_log: Throttle::new(1000),
            none_available: AtomicBool::new(false),
            query_places: Arc::default(),
            refusals: throttle::Episode::default(),
            broker_faults: throttle::Episode::default(),
            accept_failures: throttle::Episode::default(),
            resolver,
            events,
        }
    }

    /// The current generation; a connection keeps the one it started with.
    pub fn generation(&self) -> Arc<Generation> {
        self.generation.load_full()
    }

    /// Which section this balancer is (it never changes).
    pub fn kind(&self) -> BalancerKind {
        self.generation.load().config.kind
    }

    /// The span a balancer's accept loops and monitor log in, naming the balancer.
    pub fn span(&self) -> Span {
        info_span!("balancer", balancer = %self.kind().section())
    }

    /// The process's resolver, which the balancer's clients and monitor dial through.
    pub fn resolver(&self) -> &Arc<Resolver> {
        &self.resolver
    }

    /// Where the balancer's events are published.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// The instant now, on this balancer's clock and the wall clock.
    pub fn now(&self) -> Now {
        Now {
            ms: self.clock.now_ms(),
            wall_ms: wall_ms(),
        }
    }

    /// The current instant on the balancer's clock, for [`Generation::pick`].
    pub fn clock_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Balancer;
    use crate::balancer::events::Events;
    use crate::net::resolve::Resolver;

    /// A balancer over `servers` (`REMOTE_SERVER_*` lines), for the unit tests of its files.
    pub(super) fn balancer(servers: &str) -> Balancer {
        let text = format!("[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n{servers}");
        let loaded = crate::config::Config::from_text(&text, std::path::Path::new("t.ini"));
        let config = loaded.expect("valid").config.balancers.remove(0);
        Balancer::new(config, Arc::new(Resolver::new(32)), Events::default())
    }
}
