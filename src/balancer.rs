//! A balancer's live state: its servers with their counters and health, the selection policy,
//! the lease that counts a connection against its server while it lives, and one method per
//! event that changes any of it. Every counter and every quarantine transition is changed here
//! and nowhere else, and the log lines of a transition are written here, once.
//!
//! The pool (servers, weights, settings) sits behind an [`ArcSwap`] so a connection takes one
//! snapshot and the hot path never waits for a lock other than the selection's own, which is
//! held for one scan of the servers.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tracing::{Span, debug, error, info, info_span, warn};

use crate::clock::{Clock, time_of_day, wall_ms};
use crate::config::{
    BalancerConfig, BalancerKind, Host, Monitoring, ServerConfig, ServerId, SortMethod, plural,
    setting_changes,
};
use crate::events::{Event, Events, Unserved};
use crate::health::{Check, CheckFailed, Episode, Health, Now, Reason, Release};
use crate::os_error::{Explained, PointsAt};
use crate::places::{Place, QueryPlaces};
use crate::relay::{End, Outcome};
use crate::resolve::Resolver;
use crate::select::{Load, Selector};
use crate::throttle::{self, Throttle};

/// One configured server and everything counted about it. Shared by the pool, the leases of
/// its connections, the monitor and the query interface; changed only by [`Balancer`]'s
/// methods and its [`Lease`]s.
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
    weight: AtomicU32,
    /// Connections counted against it now (chosen, connecting or relaying).
    active: AtomicU64,
    /// Connections relayed since start.
    total: AtomicU64,
    /// Most connections counted against it at once.
    peak: AtomicU64,
    /// Active connections sampled each minute over the last hour (wall ms, count), oldest
    /// first, for the status page's chart.
    samples: Mutex<VecDeque<(u64, u64)>>,
    /// Connects by clients that failed.
    failed_connects: AtomicU64,
    /// Bytes from clients to this server.
    bytes_to_server: AtomicU64,
    /// Bytes from this server to clients.
    bytes_to_client: AtomicU64,
    /// Quarantine state and check results.
    health: Health,
}

/// Minutes of samples kept: one hour, plus the sample that starts it.
const SAMPLES: usize = 61;

impl Server {
    /// A server with zeroed counters, available, and a first sample: the chart draws a
    /// server added by a reload from when it joined, not as a lone dot at the next minute.
    fn new(config: &ServerConfig) -> Self {
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

    /// Records the active count now as this minute's sample, dropping those over an hour old.
    fn sample(&self) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back((wall_ms(), self.active.load(Relaxed)));
    }

    /// Counts bytes moved to and from the server outside a relay (HTTP requests' bodies).
    pub fn add_traffic(&self, to_server: u64, to_client: u64) {
        self.bytes_to_server.fetch_add(to_server, Relaxed);
        self.bytes_to_client.fetch_add(to_client, Relaxed);
    }

    /// True when the server may get new clients at `now_ms` on its balancer's clock (no
    /// quarantine, or it is over).
    pub fn is_available(&self, now_ms: u64) -> bool {
        self.health.is_available(now_ms)
    }

    /// True while a quarantine is recorded (it may have run out and await its release line).
    pub fn is_quarantined(&self) -> bool {
        self.health.is_quarantined()
    }

    /// How the server stands at `now_ms` on its balancer's clock.
    fn standing(&self, now_ms: u64) -> Standing {
        if !self.health.is_available(now_ms) {
            Standing::Quarantined
        } else if self.weight.load(Relaxed) == 0 {
            Standing::Draining
        } else {
            Standing::Available
        }
    }

    /// The server read now.
    fn snapshot(&self, now_ms: u64) -> ServerState {
        let detail = self.health.detail();
        let standing = self.standing(now_ms);
        let samples = self
            .samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        ServerState {
            id: self.id.to_string(),
            address: self.address.clone(),
            weight: self.weight.load(Relaxed),
            state: standing,
            active: self.active.load(Relaxed),
            peak: self.peak.load(Relaxed),
            total: self.total.load(Relaxed),
            failed_connects: self.failed_connects.load(Relaxed),
            bytes_to_server: self.bytes_to_server.load(Relaxed),
            bytes_to_client: self.bytes_to_client.load(Relaxed),
            quarantine: (standing == Standing::Quarantined)
                .then_some((detail.since_wall_ms, detail.until_wall_ms)),
            reason: detail.reason,
            last_error: detail.last_error,
            quarantines: detail.quarantines,
            last_check: detail.last_check,
            history: detail.history.into_iter().collect(),
            samples,
        }
    }
}

/// Where a server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Takes new clients.
    Available,
    /// In quarantine: no new clients.
    Quarantined,
    /// Weight 0: no new clients, existing ones stay.
    Draining,
}

/// A server read at one instant: what pages render and tests assert on.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// `REMOTE_SERVER_<id>`.
    pub id: String,
    /// `host:port` as configured.
    pub address: String,
    /// Configured weight.
    pub weight: u32,
    /// Where it stands.
    pub state: Standing,
    /// Connections counted against it now.
    pub active: u64,
    /// Most at once since start.
    pub peak: u64,
    /// Connections relayed since start.
    pub total: u64,
    /// Client connects that failed.
    pub failed_connects: u64,
    /// Bytes from clients to it.
    pub bytes_to_server: u64,
    /// Bytes from it to clients.
    pub bytes_to_client: u64,
    /// When the current quarantine started and ends (wall ms), if in one.
    pub quarantine: Option<(u64, u64)>,
    /// Why the current or last quarantine started.
    pub reason: Option<Reason>,
    /// The last connect error in words.
    pub last_error: Option<String>,
    /// Quarantines since start.
    pub quarantines: u64,
    /// The last monitor check.
    pub last_check: Option<Check>,
    /// Recent quarantines, oldest first.
    pub history: Vec<Episode>,
    /// Active connections each minute over the last hour, (wall ms, count).
    pub samples: Vec<(u64, u64)>,
}

/// A balancer read at one instant: its counters, settings and servers.
#[derive(Debug, Clone)]
pub struct BalancerState {
    /// Which section.
    pub kind: BalancerKind,
    /// Configured listen address.
    pub listen: SocketAddr,
    /// Client connections open now.
    pub active: u64,
    /// Clients forwarded since start.
    pub accepted: u64,
    /// Clients refused at `MAX_CONNECTIONS`.
    pub rejected: u64,
    /// Clients closed because no server answered.
    pub unserved: u64,
    /// Most clients at once since start.
    pub peak: u64,
    /// Last client's arrival (wall ms), 0 for none yet.
    pub last_connection_wall_ms: u64,
    /// `MAX_CONNECTIONS`.
    pub max_connections: u32,
    /// `SORT_METHOD`.
    pub sort_method: SortMethod,
    /// `MONITORING_TYPE`.
    pub monitoring: Monitoring,
    /// `MONITOR_INTERVAL`.
    pub monitor_interval: Duration,
    /// `QUARANTINE_TIME`.
    pub quarantine_time: Duration,
    /// The servers, in configuration order.
    pub servers: Vec<ServerState>,
}

impl BalancerState {
    /// The server whose `host:port` is `address` (case-insensitive).
    pub fn server(&self, address: &str) -> Option<&ServerState> {
        self.servers
            .iter()
            .find(|s| s.address.eq_ignore_ascii_case(address))
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
struct Stats {
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
}

/// A relayed connection as it ended, for [`Balancer::ended`].
#[derive(Debug)]
pub struct Closed<'a> {
    /// The client's address.
    pub client: SocketAddr,
    /// How long the connection lasted, from its accept.
    pub duration: Duration,
    /// What the relay did.
    pub outcome: &'a Outcome,
    /// `LOG_CONNECTIONS` of the connection's generation.
    pub log_connections: bool,
}

/// One `[BALANCE_*]` section at run time.
#[derive(Debug)]
pub struct Balancer {
    pool: ArcSwap<Pool>,
    stats: Stats,
    /// The time base of quarantine deadlines.
    clock: Clock,
    /// Wakes the monitor when a quarantine starts, so it can log the release on time.
    health_changed: Notify,
    /// Throttles "no remote servers available", which would otherwise repeat per client.
    no_servers_log: Throttle,
    /// Query connections open now, held under `QUERY_MAX_CONNECTIONS` apart from the
    /// clients' `MAX_CONNECTIONS`.
    query_places: Arc<QueryPlaces>,
    /// Clients refused since `MAX_CONNECTIONS` was last reached, logged per episode.
    refusals: throttle::Episode,
    /// Clients closed because the broker itself lacked descriptors, ports or memory.
    broker_faults: throttle::Episode,
    /// Accepts that failed for the broker's own reasons, across the balancer's accept loops.
    accept_failures: throttle::Episode,
    /// The process's resolver, which its clients and monitor connect through.
    resolver: Arc<Resolver>,
    /// Where the balancer's events are published.
    events: Events,
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
        Balancer {
            pool: ArcSwap::from_pointee(Pool::new(config, servers)),
            stats: Stats::default(),
            clock: Clock::new(),
            health_changed: Notify::new(),
            no_servers_log: Throttle::new(1000),
            query_places: Arc::default(),
            refusals: throttle::Episode::default(),
            broker_faults: throttle::Episode::default(),
            accept_failures: throttle::Episode::default(),
            resolver,
            events,
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

    /// The current instant on the balancer's clock, for [`Pool::pick`].
    pub fn clock_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The balancer's counters, settings and servers, read now.
    pub fn state(&self) -> BalancerState {
        let pool = self.pool();
        let config = &pool.config;
        let now = self.clock.now_ms();
        let stats = &self.stats;
        BalancerState {
            kind: config.kind,
            listen: config.listen,
            active: stats.active.load(Relaxed),
            accepted: stats.accepted.load(Relaxed),
            rejected: stats.rejected.load(Relaxed),
            unserved: stats.unserved.load(Relaxed),
            peak: stats.peak.load(Relaxed),
            last_connection_wall_ms: stats.last_connection_ms.load(Relaxed),
            max_connections: config.max_connections,
            sort_method: config.sort_method,
            monitoring: config.monitoring.clone(),
            monitor_interval: config.monitor_interval,
            quarantine_time: config.quarantine_time,
            servers: pool.servers.iter().map(|s| s.snapshot(now)).collect(),
        }
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
            .map(|s| match old.same_server(s) {
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
                format!("; its {} finish on their own", plural(open, "connection"))
            };
            changes.push(format!(
                "server {} (REMOTE_SERVER_{}) removed{finishing}",
                gone.address, gone.id
            ));
        }
        changes.extend(setting_changes(
            &config.kind.to_string(),
            &old.config.settings(),
            &config.settings(),
        ));
        self.pool.store(Arc::new(Pool::new(config, servers)));
        // The monitor reads the new interval and servers when it wakes.
        self.health_changed.notify_one();
        changes
    }

    // -----------------------------------------------------------------------------------
    // Clients: places and accounting, one method per event
    // -----------------------------------------------------------------------------------

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

    /// A client refused at `MAX_CONNECTIONS`; the first of an episode is logged.
    pub fn refused(&self, local: Option<SocketAddr>) {
        self.stats.rejected.fetch_add(1, Relaxed);
        self.events.emit(|| Event::Refused {
            balancer: self.kind(),
        });
        if self.refusals.strike() {
            warn!(
                "MAX_CONNECTIONS ({}) reached on {}: new clients are closed at once until some leave",
                self.pool().config.max_connections,
                local.map_or_else(|| "?".into(), |a| a.to_string())
            );
        }
    }

    /// A client admitted below the limit: ends a refusal episode, if any, with a line.
    pub fn admitted(&self) {
        if let Some(refused) = self.refusals.end() {
            info!("accepting clients again: {refused} refused while MAX_CONNECTIONS was reached");
        }
    }

    /// A client's connect through `lease` succeeded: see [`Balancer::connected_to`].
    pub fn connected(&self, lease: &Lease) {
        self.connected_to(&lease.server, lease.stale);
    }

    /// A connect to `server` succeeded (`stale`: it was chosen although quarantined). A
    /// connect proves what a CONNECTION check proves, so a stale quarantine ends (not one
    /// found by a SEND_EXPECT or HTTP check, which a connect cannot overrule); a broker fault
    /// episode ends.
    pub fn connected_to(&self, server: &Server, stale: bool) {
        server.total.fetch_add(1, Relaxed);
        if stale
            && !matches!(
                self.pool.load().config.monitoring,
                Monitoring::SendExpect { .. } | Monitoring::Http { .. }
            )
        {
            self.release(server, Release::ClientConnected);
        }
        if let Some(closed) = self.broker_faults.end() {
            info!(
                "connecting clients again: {closed} were closed while the broker lacked resources"
            );
        }
    }

    /// A client's connect through `lease` failed with `error`. A server-side cause counts
    /// against the server and quarantines it (unless its quarantine is what the lease went
    /// around); a cause that is the broker's own blames no server. Returns false then: the
    /// client is to be closed rather than sent to the next server.
    pub fn connect_failed(&self, lease: &Lease, error: &Explained, client: SocketAddr) -> bool {
        self.connect_failed_to(&lease.server, lease.stale, error, client)
    }

    /// As [`Balancer::connect_failed`], for a connect to `server` (`stale`: it was chosen
    /// although quarantined).
    pub fn connect_failed_to(
        &self,
        server: &Server,
        stale: bool,
        error: &Explained,
        client: SocketAddr,
    ) -> bool {
        let blamed = error.points_at != PointsAt::Broker;
        self.events.emit(|| Event::ConnectFailed {
            balancer: self.kind(),
            client,
            server: server.address.clone(),
            error: error.to_string(),
            blamed,
        });
        if !blamed {
            if self.broker_faults.strike() {
                error!(
                    server = %server.address,
                    "cannot connect clients: {error}; they are closed and no server is \
                     blamed until this clears"
                );
            }
            return false;
        }
        server.failed_connects.fetch_add(1, Relaxed);
        if stale {
            // Already quarantined; the monitor keeps it there. One line per client and
            // server here would flood the log during an outage.
            debug!(client = %client, "server {} still unreachable: {error}", server.address);
        } else {
            error!(client = %client, "cannot connect to server {}: {error}", server.address);
            self.quarantine(server, Reason::Connect, &error.words);
        }
        true
    }

    /// A client closed without a server.
    pub fn unserved(&self, client: SocketAddr, why: Unserved) {
        self.stats.unserved.fetch_add(1, Relaxed);
        self.events.emit(|| Event::Unserved {
            balancer: self.kind(),
            client,
            why,
        });
        if why == Unserved::NoServer
            && let Some(suppressed) = self.no_servers_log.allow()
        {
            // An HTTP client is answered 503 and may send its next request.
            let then = if self.kind().is_http() {
                "the request is answered 503"
            } else {
                "the client is closed"
            };
            error!(
                more_since_last_line = suppressed,
                client = %client,
                "no remote servers available; {then}"
            );
        }
    }

    /// A relayed connection ended: its closing line, in `span` (always for an idle close,
    /// which the broker decided; otherwise with `LOG_CONNECTIONS`).
    pub fn ended(&self, lease: &Lease, closed: &Closed<'_>, span: &Span) {
        self.ended_on(&lease.server, closed, span);
    }

    /// As [`Balancer::ended`], for a connection relayed to `server` (an upgraded HTTP
    /// connection, whose lease the HTTP engine holds).
    pub fn ended_on(&self, server: &Server, closed: &Closed<'_>, span: &Span) {
        let outcome = closed.outcome;
        self.events.emit(|| Event::ConnectionEnded {
            balancer: self.kind(),
            client: closed.client,
            server: server.address.clone(),
            duration: closed.duration,
            bytes_from_client: outcome.to_server,
            bytes_to_client: outcome.to_client,
            ended_by: outcome.end.clone(),
        });
        if closed.log_connections || matches!(outcome.end, End::Idle) {
            span.in_scope(|| {
                info!(
                    duration = %format_args!("{:.3}s", closed.duration.as_secs_f64()),
                    bytes_from_client = outcome.to_server,
                    bytes_to_client = outcome.to_client,
                    ended_by = %outcome.end,
                    client = %closed.client,
                    server = %server.address,
                    "connection closed"
                );
            });
        }
    }

    /// An accept failed for the broker's own reasons (descriptors, memory); the first of an
    /// episode is logged, saying the accept loop retries every `backoff`.
    pub fn accept_failed(&self, error: &io::Error, backoff: Duration) {
        if self.accept_failures.strike() {
            error!(
                "cannot accept clients: {} ({}); retrying every {} ms, connections in \
                 progress are unaffected",
                crate::os_error::words(error),
                crate::sys::errno_name(error).unwrap_or("error"),
                backoff.as_millis()
            );
        }
    }

    /// An accept succeeded: ends an episode of failed accepts, if any, with a line.
    pub fn accepted(&self) {
        if let Some(failed) = self.accept_failures.end() {
            info!("accepting clients again after {failed} failed accepts");
        }
    }

    // -----------------------------------------------------------------------------------
    // Queries
    // -----------------------------------------------------------------------------------

    /// Takes a query place, held under `QUERY_MAX_CONNECTIONS` until the returned place is
    /// dropped (or given up to another query while idle); `None` when every place is busy.
    /// Running out of them is logged once per episode.
    pub fn take_query_place(&self) -> Option<Place> {
        let places = &self.query_places;
        let max = self.pool().config.query.max_connections;
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
            .has_room(self.pool().config.query.max_connections)
    }

    // -----------------------------------------------------------------------------------
    // Health: the quarantine transitions applied and logged, the monitor's checks counted
    // -----------------------------------------------------------------------------------

    /// Puts `server` in quarantine for `reason` (or moves its end out) for `QUARANTINE_TIME`,
    /// and logs it: the TOTVS line byte for byte, then the end in local time for people.
    pub fn quarantine(&self, server: &Server, reason: Reason, error: &str) {
        let duration = self.pool.load().config.quarantine_time;
        let q = server.health.failed(reason, error, duration, self.now());
        if q.expired_first {
            self.released(server, Release::TimeUp);
        }
        let (start, stop) = (q.at_wall_ms / 1000, q.until_wall_ms / 1000);
        self.events.emit(|| Event::Quarantined {
            balancer: self.kind(),
            server: server.address.clone(),
            reason,
            error: error.to_string(),
            started: q.started,
            at_wall_ms: q.at_wall_ms,
            until_wall_ms: q.until_wall_ms,
        });
        warn!(
            "putting server {} in quarantine start={start} stop={stop} ({}) until={}",
            server.address,
            reason.as_str(),
            time_of_day(stop * 1000)
        );
        // The monitor sleeps until the earliest deadline; a new one may be earlier.
        self.health_changed.notify_one();
    }

    /// Releases `server` from quarantine, if it is in one, and logs why.
    pub fn release(&self, server: &Server, why: Release) {
        if server.health.passed(why, self.now()) {
            self.released(server, why);
        }
    }

    /// The one place a release is told: its line and its event.
    fn released(&self, server: &Server, why: Release) {
        info!(
            "releasing server {} from quarantine ({})",
            server.address,
            why.as_str()
        );
        self.events.emit(|| Event::Released {
            balancer: self.kind(),
            server: server.address.clone(),
            why,
        });
    }

    /// Releases the servers whose quarantine's time is up, logging each; returns the earliest
    /// deadline left (on the balancer's clock), for the monitor to wake then.
    pub fn release_expired(&self) -> Option<tokio::time::Instant> {
        let now = self.now();
        let mut earliest: Option<u64> = None;
        for server in &self.pool().servers {
            if server.health.expired(now) {
                self.released(server, Release::TimeUp);
            }
            let until = server.health.until_ms();
            if until != 0 {
                earliest = Some(earliest.map_or(until, |e| e.min(until)));
            }
        }
        earliest.map(|ms| self.clock.instant(ms))
    }

    /// Completes when a quarantine starts or the pool is reloaded.
    pub async fn health_changed(&self) {
        self.health_changed.notified().await;
    }

    /// Records a passed monitor check of `server`; returns the checks passed in a row.
    pub fn check_passed(&self, server: &Server, check: Check) -> u32 {
        server.health.check_passed(check)
    }

    /// Records a failed monitor check of `server` (the check's error is set).
    pub fn check_failed(&self, server: &Server, check: Check) -> CheckFailed {
        server.health.check_failed(check, self.now())
    }

    /// Records every server's active connections as this minute's sample (the chart).
    pub fn sample(&self) {
        for server in &self.pool().servers {
            server.sample();
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
fn fetch_max(peak: &AtomicU64, value: u64) {
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
        stats.last_connection_ms.store(wall_ms(), Relaxed);
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
    fn new(config: BalancerConfig, servers: Vec<Arc<Server>>) -> Self {
        Pool {
            selector: Mutex::new((
                Selector::new(config.sort_method, servers.len()),
                Vec::with_capacity(servers.len()),
            )),
            config,
            servers,
        }
    }

    /// The server of this pool that `config` names again (same id and `host:port`).
    fn same_server(&self, config: &ServerConfig) -> Option<&Arc<Server>> {
        let address = config.address();
        self.servers
            .iter()
            .find(|o| o.id == config.id && o.address.eq_ignore_ascii_case(&address))
    }

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
                && !tried.contains(&i)
                && (eligible == Eligible::EvenQuarantined || s.health.is_available(clock_ms));
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
        Some(Lease {
            index,
            server,
            stale: eligible == Eligible::EvenQuarantined,
        })
    }
}

/// A connection counted against a server; the count ends when the lease is dropped.
#[derive(Debug)]
pub struct Lease {
    /// Index of the server in its pool.
    pub index: usize,
    /// The server.
    pub server: Arc<Server>,
    /// Chosen although quarantined (every server was): its quarantine may be stale.
    pub stale: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn balancer(servers: &str) -> Balancer {
        let text = format!("[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n{servers}");
        let loaded = crate::config::Config::from_text(&text, std::path::Path::new("t.ini"));
        let config = loaded.expect("valid").config.balancers.remove(0);
        Balancer::new(config, Arc::new(Resolver::new(32)), Events::default())
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_after_the_time_is_up_starts_a_new_quarantine() {
        let balancer = balancer("REMOTE_SERVER_01=127.0.0.1 6001\n");
        let server = Arc::clone(&balancer.pool().servers[0]);
        balancer.quarantine(&server, Reason::Monitor, "refused");
        tokio::time::advance(Duration::from_secs(121)).await;
        // The monitor has not woken to apply the release yet; a client's connect fails.
        balancer.quarantine(&server, Reason::Connect, "timed out");
        let state = balancer.state();
        let server = &state.servers[0];
        assert_eq!(server.quarantines, 2);
        assert_eq!(server.history.len(), 2);
        assert_eq!(server.history[0].released, Some(Release::TimeUp));
        assert_eq!(server.history[1].reason, Reason::Connect);
        assert!(server.history[1].end_wall_ms.is_none());
        assert_eq!(server.state, Standing::Quarantined);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_quarantines_are_released_and_the_next_deadline_returned() {
        let balancer =
            balancer("REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n");
        let pool = balancer.pool();
        assert_eq!(balancer.release_expired(), None);
        balancer.quarantine(&pool.servers[0], Reason::Monitor, "refused");
        tokio::time::advance(Duration::from_secs(60)).await;
        balancer.quarantine(&pool.servers[1], Reason::Monitor, "refused");
        let first_end = tokio::time::Instant::now() + Duration::from_secs(60);
        assert_eq!(balancer.release_expired(), Some(first_end));
        tokio::time::advance(Duration::from_secs(60)).await;
        let second_end = tokio::time::Instant::now() + Duration::from_secs(60);
        assert_eq!(balancer.release_expired(), Some(second_end));
        assert!(!pool.servers[0].is_quarantined());
        assert!(pool.servers[1].is_quarantined());
    }
}
