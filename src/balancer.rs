//! A balancer's live state: its servers with their counters and health, the selection policy,
//! and the lease that counts a connection against its server while it lives.
//!
//! The pool (servers, weights, settings) sits behind an [`ArcSwap`] so a connection takes one
//! snapshot and the hot path never waits for a lock other than the selection's own, which is
//! held for one scan of the servers.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::{BalancerConfig, BalancerKind, Host, ServerConfig, ServerId};
use crate::health::Health;
use crate::places::{Place, QueryPlaces};
use crate::resolve::Resolver;
use crate::select::{Load, Selector};
use crate::throttle::{Episode, Throttle};

/// One configured server and everything counted about it. Shared by the pool, the leases of
/// its connections, the monitor and the query interface.
#[derive(Debug)]
pub struct Server {
    /// The `REMOTE_SERVER_<id>` id.
    pub id: ServerId,
    /// Address or name, resolved at each connect.
    pub host: Host,
    /// TCP port.
    pub port: u16,
    /// `host:port` as configured, the name logs and pages use.
    pub address: String,
    /// Share of new clients; 0 drains the server. A reload may change it.
    pub weight: AtomicU32,
    /// Connections counted against it now (chosen, connecting or relaying).
    pub active: AtomicU64,
    /// Connections relayed since start.
    pub total: AtomicU64,
    /// Most connections counted against it at once.
    pub peak: AtomicU64,
    /// Active connections sampled each minute over the last hour (wall ms, count), oldest
    /// first, for the status page's chart.
    pub samples: Mutex<VecDeque<(u64, u64)>>,
    /// Connects by clients that failed.
    pub failed_connects: AtomicU64,
    /// Bytes from clients to this server.
    pub bytes_to_server: AtomicU64,
    /// Bytes from this server to clients.
    pub bytes_to_client: AtomicU64,
    /// Quarantine state and check results.
    pub health: Health,
}

/// Minutes of samples kept: one hour, plus the sample that starts it.
const SAMPLES: usize = 61;

impl Server {
    /// Records the active count now as this minute's sample, dropping those over an hour old.
    pub fn sample(&self) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back((crate::clock::wall_ms(), self.active.load(Relaxed)));
    }

    /// A server with zeroed counters, available, and a first sample: the chart draws a
    /// server added by a reload from when it joined, not as a lone dot at the next minute.
    pub fn new(config: &ServerConfig) -> Self {
        let server = Server {
            id: config.id,
            host: config.host.clone(),
            port: config.port,
            address: config.address(),
            weight: AtomicU32::new(config.weight),
            active: AtomicU64::new(0),
            total: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            samples: Mutex::new(VecDeque::with_capacity(SAMPLES)),
            failed_connects: AtomicU64::new(0),
            bytes_to_server: AtomicU64::new(0),
            bytes_to_client: AtomicU64::new(0),
            health: Health::default(),
        };
        server.sample();
        server
    }
}

/// The servers of one configuration generation and the policy's state over them.
#[derive(Debug)]
pub struct Pool {
    /// The balancer's settings for this generation.
    pub config: BalancerConfig,
    /// The servers, in configuration order.
    pub servers: Vec<Arc<Server>>,
    /// The policy's state, and a scratch list of loads reused by every pick.
    selector: Mutex<(Selector, Vec<Option<Load>>)>,
}

/// Counters of a balancer as a whole.
#[derive(Debug, Default)]
pub struct BalancerStats {
    /// Clients forwarded (queries are not counted).
    pub accepted: AtomicU64,
    /// Clients refused because `MAX_CONNECTIONS` was reached.
    pub rejected: AtomicU64,
    /// Clients closed because no server could be reached.
    pub unserved: AtomicU64,
    /// Client connections open now.
    pub active: AtomicU64,
    /// Highest `active` seen.
    pub peak: AtomicU64,
    /// Wall-clock time of the last accepted client, in ms since the Unix epoch (0: none yet).
    pub last_connection_ms: AtomicU64,
}

/// One `[BALANCE_*]` section at run time.
#[derive(Debug)]
pub struct Balancer {
    pool: ArcSwap<Pool>,
    /// Counters of the balancer as a whole.
    pub stats: BalancerStats,
    /// The time base of quarantine deadlines.
    pub clock: Clock,
    /// Wakes the monitor when a quarantine starts, so it can log the release on time.
    pub health_changed: Notify,
    /// Throttles "no remote servers available", which would otherwise repeat per client.
    pub no_servers_log: Throttle,
    /// Query connections open now, held under `QUERY_MAX_CONNECTIONS` apart from the
    /// clients' `MAX_CONNECTIONS`.
    pub query_places: Arc<QueryPlaces>,
    /// Clients refused since `MAX_CONNECTIONS` was last reached, logged per episode.
    refusals: Episode,
    /// Clients closed because the broker itself lacked descriptors, ports or memory.
    pub broker_faults: Episode,
    /// Accepts that failed for the broker's own reasons, across the balancer's accept loops.
    pub accept_failures: Episode,
    /// The process's resolver, which its clients and monitor connect through.
    pub resolver: Arc<Resolver>,
}

impl Balancer {
    /// A balancer over `config`'s servers, all available, resolving names with `resolver`.
    pub fn new(config: BalancerConfig, resolver: Arc<Resolver>) -> Self {
        let servers = config
            .servers
            .iter()
            .map(|s| Arc::new(Server::new(s)))
            .collect();
        Balancer {
            pool: ArcSwap::from_pointee(Pool::new(config, servers)),
            stats: BalancerStats::default(),
            clock: Clock::new(),
            health_changed: Notify::new(),
            no_servers_log: Throttle::new(1000),
            query_places: Arc::default(),
            refusals: Episode::default(),
            broker_faults: Episode::default(),
            accept_failures: Episode::default(),
            resolver,
        }
    }

    /// The current pool; a connection keeps the snapshot it started with.
    pub fn pool(&self) -> Arc<Pool> {
        self.pool.load_full()
    }

    /// Which section this balancer is (it never changes).
    pub fn kind(&self) -> BalancerKind {
        self.pool.load().config.kind
    }

    /// Applies a reloaded configuration of this balancer. Servers that remain (same id and
    /// `host:port`) keep their state, counters and connections, taking the new weight; new
    /// ones start available; removed ones leave the pool, and their connections finish on
    /// their own. Returns what changed, for the log.
    pub fn reconfigure(&self, config: BalancerConfig) -> Vec<String> {
        let old = self.pool();
        let mut changes = Vec::new();
        let servers: Vec<Arc<Server>> = config
            .servers
            .iter()
            .map(|s| {
                let same = old
                    .servers
                    .iter()
                    .find(|o| o.id == s.id && o.address.eq_ignore_ascii_case(&s.address()));
                match same {
                    Some(server) => {
                        let was = server.weight.swap(s.weight, Relaxed);
                        if was != s.weight {
                            changes.push(format!(
                                "server {} weight {was} -> {}",
                                server.address, s.weight
                            ));
                        }
                        Arc::clone(server)
                    }
                    None => {
                        changes.push(format!(
                            "server {} added as REMOTE_SERVER_{}",
                            s.address(),
                            s.id
                        ));
                        Arc::new(Server::new(s))
                    }
                }
            })
            .collect();
        for gone in old
            .servers
            .iter()
            .filter(|o| !servers.iter().any(|n| Arc::ptr_eq(n, o)))
        {
            let open = gone.active.load(Relaxed) as usize;
            let finishing = if open == 0 {
                String::new()
            } else {
                format!(
                    "; its {} finish on their own",
                    crate::config::plural(open, "connection")
                )
            };
            changes.push(format!(
                "server {} (REMOTE_SERVER_{}) removed{finishing}",
                gone.address, gone.id
            ));
        }
        changes.extend(crate::config::setting_changes(
            &config.kind.to_string(),
            &old.config.settings(),
            &config.settings(),
        ));
        self.pool.store(Arc::new(Pool::new(config, servers)));
        // The monitor reads the new interval and servers when it wakes.
        self.health_changed.notify_one();
        changes
    }

    /// Takes a client place, counted against `pool`'s `MAX_CONNECTIONS` until the returned
    /// slot is dropped; `None` when the limit is reached. The limit is read at each take, so
    /// one lowered by a reload holds as soon as enough clients have left.
    pub fn try_take_slot(self: &Arc<Self>, pool: &Pool) -> Option<ClientSlot> {
        let open = take_under(&self.stats.active, pool.config.max_connections)?;
        fetch_max(&self.stats.peak, open);
        Some(ClientSlot(Arc::clone(self)))
    }

    /// True when `MAX_CONNECTIONS` clients are open.
    pub fn at_limit(&self, pool: &Pool) -> bool {
        self.stats.active.load(Relaxed) >= u64::from(pool.config.max_connections)
    }

    /// Takes a query place, held under `QUERY_MAX_CONNECTIONS` until the returned place is
    /// dropped (or given up to another query while idle); `None` when every place is busy.
    pub fn try_take_query(&self) -> Option<Place> {
        self.query_places
            .take(self.pool().config.query.max_connections)
    }

    /// True while a query could take a place.
    pub fn query_room(&self) -> bool {
        self.query_places
            .has_room(self.pool().config.query.max_connections)
    }

    /// Counts a client refused at `MAX_CONNECTIONS`; the first of an episode is logged.
    pub fn refuse(&self, local: Option<SocketAddr>) {
        self.stats.rejected.fetch_add(1, Relaxed);
        if self.refusals.strike() {
            warn!(
                "MAX_CONNECTIONS ({}) reached on {}: new clients are closed at once until some leave",
                self.pool().config.max_connections,
                local.map_or_else(|| "?".into(), |a| a.to_string())
            );
        }
    }

    /// A client was admitted below the limit: ends a refusal episode, if any, with a line.
    pub fn below_limit(&self) {
        if let Some(refused) = self.refusals.end() {
            info!("accepting clients again: {refused} refused while MAX_CONNECTIONS was reached");
        }
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
pub fn fetch_max(peak: &AtomicU64, value: u64) {
    if peak.load(Relaxed) < value {
        peak.fetch_max(value, Relaxed);
    }
}

/// A client counted as open (against `MAX_CONNECTIONS`) from the moment it is known to be no
/// query until dropped, however its task ends.
#[derive(Debug)]
pub struct ClientSlot(Arc<Balancer>);

impl ClientSlot {
    /// Counts the client as forwarded: it is no query.
    pub fn admit(&self) {
        let stats = &self.0.stats;
        stats.accepted.fetch_add(1, Relaxed);
        stats
            .last_connection_ms
            .store(crate::clock::wall_ms(), Relaxed);
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.stats.active.fetch_sub(1, Relaxed);
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

impl Pool {
    /// A pool over `servers` (built from `config.servers`, same order).
    pub fn new(config: BalancerConfig, servers: Vec<Arc<Server>>) -> Self {
        Pool {
            selector: Mutex::new((
                Selector::new(config.sort_method, servers.len()),
                Vec::with_capacity(servers.len()),
            )),
            config,
            servers,
        }
    }

    /// Chooses the next server for a client, skipping those already `tried` for it and
    /// weight-0 (draining) servers, and counts the connection against it at once.
    pub fn pick(&self, clock: &Clock, tried: &[usize], eligible: Eligible) -> Option<Lease> {
        let now = clock.now_ms();
        // Choosing and counting are one step under the lock, so concurrent clients see each
        // other's choices and spreads stay exact. The lock is held for one scan.
        let mut guard = self.selector.lock().unwrap_or_else(|p| p.into_inner());
        let (selector, loads) = &mut *guard;
        loads.clear();
        loads.extend(self.servers.iter().enumerate().map(|(i, s)| {
            let weight = s.weight.load(Relaxed);
            let ok = weight > 0
                && !tried.contains(&i)
                && (eligible == Eligible::EvenQuarantined || s.health.is_available(now));
            ok.then_some(Load {
                weight,
                active: s.active.load(Relaxed),
            })
        }));
        let index = selector.pick(loads)?;
        let server = Arc::clone(&self.servers[index]);
        let active = server.active.fetch_add(1, Relaxed) + 1;
        fetch_max(&server.peak, active);
        drop(guard);
        Some(Lease { index, server })
    }
}

/// A connection counted against a server; the count ends when the lease is dropped.
#[derive(Debug)]
pub struct Lease {
    /// Index of the server in its pool.
    pub index: usize,
    /// The server.
    pub server: Arc<Server>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.server.active.fetch_sub(1, Relaxed);
    }
}
