//! A balancer's live state: its servers with their counters and health, the selection policy,
//! the lease that counts a connection against its server while it lives, and one method per
//! event that changes any of it. Every counter and every quarantine transition is changed here
//! and nowhere else, and the log lines of a transition are written here, once.
//!
//! The pool (servers, weights, settings) sits behind an [`ArcSwap`] so a connection takes one
//! snapshot and the hot path never waits for a lock other than the selection's own, which is
//! held for one scan of the servers.
//!
//! The balancer's own rules, pure logic it applies and logs, sit beside it, with the events it
//! publishes and the context every connection reads it from:
//!
//! - [`health`]: a server's quarantine as pure transitions returning what changed.
//! - [`overrides`]: an operator's overrides of a server (disabled, drain, weight) as pure
//!   transitions.
//! - [`select`]: the balancing policies (`CONNECTION`, `ROUND_ROBIN`), pure logic.
//! - [`places`]: query places (`QUERY_MAX_CONNECTIONS`), given up by idle connections.
//! - [`events`]: what happens in a broker, as events to subscribe to (a balancer publishes
//!   most of them, so they sit here, below every publisher).
//! - [`context`]: every balancer with the running configuration and the shutdown state, as
//!   each connection's task reads them, and how a balancer tells its connections to end.

pub mod context;
pub mod events;
pub mod health;
pub mod overrides;
pub mod places;
pub mod select;

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Span, debug, error, info, info_span, warn};

use crate::balancer::events::{Event, Events, Unserved};
use crate::balancer::health::{
    Asked, Check, CheckFailed, Episode, Health, Now, Quarantined, Reason, Release,
};
use crate::balancer::overrides::{Hold, Overrides};
use crate::balancer::places::{Place, QueryPlaces};
use crate::balancer::select::{Load, Selector};
use crate::config::{
    BalancerConfig, BalancerKind, Host, Monitoring, ServerConfig, ServerId, SortMethod, plural,
    setting_changes,
};
use crate::net::dial::{self, ConnectError, ServerStream};
use crate::net::relay::{End, Outcome};
use crate::net::resolve::Resolver;
use crate::net::stream::Stream;
use crate::process::clock::{Clock, time_of_day, wall_ms};
use crate::process::os_error::PointsAt;
use crate::process::throttle::{self, Throttle};
use crate::tls::{
    CertificateSummary, Finding, Findings, HandshakeFailure, Resumption, ServerTls, UpstreamTls,
    upstream::system_roots,
};

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
    /// Share of new clients; 0 drains the server. A reload may change it, unless an operator's
    /// weight overrides it.
    weight: AtomicU32,
    /// The weight the file gives, whatever an operator's override says.
    file_weight: AtomicU32,
    /// True while an operator holds it out of the balancing (disabled or draining): the hot
    /// path reads this, `overrides` says why.
    held: AtomicBool,
    /// The operator's overrides, changed only through [`Balancer`]'s methods.
    overrides: Mutex<Overrides>,
    /// Cancelled to cut every connection to it (`ctl cut`), then replaced by a fresh one.
    cut: Mutex<CancellationToken>,
    /// Connections counted against it now (chosen, connecting or relaying).
    active: AtomicU64,
    /// Connections relayed since start.
    total: AtomicU64,
    /// Live HTTP sessions bound to it (affinity), as the HTTP balancer's table last counted
    /// them: what SORT_METHOD=SESSION spreads.
    sessions: AtomicU64,
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
    /// HTTP requests to it that timed out in a row (`HTTP_TIMEOUTS_TO_QUARANTINE`).
    timeouts_in_a_row: AtomicU32,
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
            file_weight: AtomicU32::new(config.weight),
            held: AtomicBool::new(false),
            overrides: Mutex::new(Overrides::default()),
            cut: Mutex::new(CancellationToken::new()),
            active: AtomicU64::new(0),
            total: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            samples: Mutex::new(VecDeque::with_capacity(SAMPLES)),
            failed_connects: AtomicU64::new(0),
            bytes_to_server: AtomicU64::new(0),
            bytes_to_client: AtomicU64::new(0),
            timeouts_in_a_row: AtomicU32::new(0),
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

    /// An HTTP request to it timed out: the requests timed out in a row now, this one
    /// included.
    pub fn timed_out(&self) -> u32 {
        self.timeouts_in_a_row
            .fetch_add(1, Relaxed)
            .saturating_add(1)
    }

    /// It answered an HTTP request: the requests that had timed out in a row before (0:
    /// none), a run now ended.
    pub fn answered(&self) -> u32 {
        // Read first: this runs for every request, and a write would bounce the cache line
        // between cores for nothing.
        if self.timeouts_in_a_row.load(Relaxed) == 0 {
            return 0;
        }
        self.timeouts_in_a_row.swap(0, Relaxed)
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

    /// True when new clients may go to it: out of quarantine, not disabled or draining, of a
    /// weight above 0 (what [`Pool::pick`] asks of a server).
    pub fn takes_new_clients(&self, now_ms: u64) -> bool {
        self.weight.load(Relaxed) > 0 && !self.held.load(Relaxed) && self.is_available(now_ms)
    }

    /// Live HTTP sessions bound to it.
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Relaxed)
    }

    /// The HTTP balancer's session table counted `n` live sessions bound to it.
    pub fn set_sessions(&self, n: u64) {
        self.sessions.store(n, Relaxed);
    }

    /// True while a quarantine is recorded (it may have run out and await its release line).
    pub fn is_quarantined(&self) -> bool {
        self.health.is_quarantined()
    }

    /// Why the current (or last) quarantine started.
    pub fn quarantine_reason(&self) -> Option<Reason> {
        self.health.reason()
    }

    /// Connections counted against it now.
    pub fn active(&self) -> u64 {
        self.active.load(Relaxed)
    }

    /// A copy of the operator's overrides.
    pub fn overrides(&self) -> Overrides {
        self.lock_overrides().clone()
    }

    fn lock_overrides(&self) -> std::sync::MutexGuard<'_, Overrides> {
        self.overrides.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when `name` names this server: its id (`01`) or its `host:port`.
    pub fn is_named(&self, name: &str) -> bool {
        self.id.to_string().eq_ignore_ascii_case(name) || self.address.eq_ignore_ascii_case(name)
    }

    /// How the server stands at `now_ms` on its balancer's clock. An operator's hold is told
    /// before a quarantine: a page reader must not take a server in maintenance for a failing
    /// one.
    fn standing(&self, now_ms: u64) -> Standing {
        if self.held.load(Relaxed) {
            Standing::Disabled
        } else if !self.health.is_available(now_ms) {
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
            file_weight: self.file_weight.load(Relaxed),
            overrides: self.overrides(),
            forced: detail.forced,
            state: standing,
            active: self.active.load(Relaxed),
            sessions: self.sessions.load(Relaxed),
            peak: self.peak.load(Relaxed),
            total: self.total.load(Relaxed),
            failed_connects: self.failed_connects.load(Relaxed),
            bytes_to_server: self.bytes_to_server.load(Relaxed),
            bytes_to_client: self.bytes_to_client.load(Relaxed),
            quarantine: (!self.health.is_available(now_ms))
                .then_some((detail.since_wall_ms, detail.until_wall_ms)),
            reason: detail.reason,
            last_error: detail.last_failure.as_ref().map(|f| f.words.clone()),
            last_error_wall_ms: detail.last_failure.as_ref().map_or(0, |f| f.at_wall_ms),
            error_current: detail.last_failure.as_ref().is_some_and(|f| f.current),
            asked: detail.asked,
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
    /// Held out by an operator (`ctl disable` or `ctl drain`): no new clients, existing ones
    /// stay; any quarantine it is in as well is shown beside it, not instead.
    Disabled,
}

/// A server read at one instant: what pages render and tests assert on.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// `REMOTE_SERVER_<id>`.
    pub id: String,
    /// `host:port` as configured.
    pub address: String,
    /// The weight in use (an operator's override, else the file's).
    pub weight: u32,
    /// The file's weight.
    pub file_weight: u32,
    /// The operator's overrides.
    pub overrides: Overrides,
    /// The current quarantine was asked for by an operator.
    pub forced: bool,
    /// Where it stands.
    pub state: Standing,
    /// Connections counted against it now.
    pub active: u64,
    /// Live HTTP sessions bound to it (0 on a TCP balancer), as the HTTP balancer's table
    /// last counted them (at least every second).
    pub sessions: u64,
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
    /// The last failure's error in words (a failed check's or client's connect that
    /// quarantined it), current or not.
    pub last_error: Option<String>,
    /// When that failure came (wall ms); 0 when none did.
    pub last_error_wall_ms: u64,
    /// True while that failure stands: the server has not proved itself since (no check
    /// passed, no client's connect succeeded after a connect failure). Pages show the error
    /// only then.
    pub error_current: bool,
    /// Who asked for the current quarantine and why, while an operator's lasts.
    pub asked: Option<Asked>,
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
    /// The certificate clients are served, when the port speaks TLS.
    pub certificate: Option<CertificateSummary>,
    /// What the status page says when the servers' certificates are not verified.
    pub upstream_warning: Option<&'static str>,
    /// Failed TLS handshakes with clients, by cause (METRICS' label).
    pub handshake_failures: Vec<(&'static str, u64)>,
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
    /// TLS towards clients and servers, loaded for this generation.
    pub tls: Arc<Secured>,
}

/// A balancer's TLS for one generation of its configuration, loaded from its `SSL_*` keys.
/// A reload loads it again (certificates renewed on disk are taken even when no key
/// changed); connections keep the generation they started with.
#[derive(Debug, Default)]
pub struct Secured {
    /// Towards clients (`SSL_CERTIFICATE` and `SSL_KEY`); `None`: the port speaks plain TCP.
    pub server: Option<ServerTls>,
    /// Towards servers (`SSL_ENCRYPT_UPSTREAM=1`).
    pub upstream: Option<UpstreamTls>,
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

/// Loads `config`'s TLS towards clients and servers (nothing when it has none), reading the
/// system's trusted roots only when they are needed.
fn load_tls(config: &BalancerConfig, resumption: Option<&Resumption>) -> Result<Secured, Findings> {
    let server = config.tls.server(config.kind.is_http());
    let upstream = config.tls.upstream(config.kind.is_http());
    if server.is_none() && upstream.is_none() {
        return Ok(Secured::default());
    }
    let roots = system_roots();
    let now = std::time::SystemTime::now();
    let server = match (server, resumption) {
        (Some(settings), Some(resumption)) => {
            Some(ServerTls::load(&settings, resumption, &roots.store, now)?)
        }
        (Some(settings), None) => {
            let fresh = Resumption::new().map_err(|e| Finding::Unexpected {
                key: "SSL_CERTIFICATE",
                detail: e.to_string(),
            })?;
            Some(ServerTls::load(&settings, &fresh, &roots.store, now)?)
        }
        (None, _) => None,
    };
    let upstream = upstream
        .map(|settings| UpstreamTls::load(&settings, &roots))
        .transpose()?;
    Ok(Secured { server, upstream })
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
    /// Clients closed (on an HTTP balancer, requests answered 503) because the broker itself
    /// lacked descriptors, ports or memory: one strike each, since neither engine tries
    /// another server after such a failure ([`ConnectError::try_next`]).
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
        // without the TLS the file asks for (see `Pool::tls_missing`).
        let tls = load_tls(&config, resumption.as_ref()).unwrap_or_else(|findings| {
            for line in findings.to_string().lines() {
                error!("{line}");
            }
            error!(
                "{}: its TLS keys cannot be loaded; every client is closed",
                config.kind
            );
            Secured::default()
        });
        Balancer {
            pool: ArcSwap::from_pointee(Pool::new(config, servers, Arc::new(tls))),
            resumption,
            handshake_failures: Mutex::default(),
            handshake_episode: throttle::Episode::default(),
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
            certificate: pool.tls.server.as_ref().map(|t| t.certificate.clone()),
            upstream_warning: pool.tls.upstream.as_ref().and_then(UpstreamTls::warning),
            handshake_failures: self.handshake_failures().into_iter().collect(),
        }
    }

    /// Applies a reloaded configuration of this balancer. Servers that remain (same id and
    /// `host:port`) keep their state, counters and connections, taking the new weight; new
    /// ones start available; removed ones leave the pool, and their connections finish on
    /// their own. `tls` is the new generation's TLS ([`Balancer::load_tls`]): new handshakes
    /// use it, established connections keep theirs. Returns what changed, for the log.
    pub fn reconfigure(&self, config: BalancerConfig, tls: Secured) -> Vec<String> {
        let old = self.pool();
        let mut changes = Vec::new();
        let servers: Vec<Arc<Server>> = config
            .servers
            .iter()
            .map(|s| match old.same_server(s) {
                Some(server) => {
                    let overrides = server.lock_overrides();
                    server.file_weight.store(s.weight, Relaxed);
                    let weight = overrides.effective_weight(s.weight);
                    let was = server.weight.swap(weight, Relaxed);
                    if was != weight {
                        changes.push(format!(
                            "server {} weight {was} -> {weight}",
                            server.address
                        ));
                    } else if overrides.weight.is_some() {
                        changes.push(format!(
                            "server {} keeps the operator's weight {weight} (the file says {})",
                            server.address, s.weight
                        ));
                    }
                    drop(overrides);
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
        if let (Some(old), Some(new)) = (&old.tls.server, &tls.server)
            && old.certificate != new.certificate
        {
            changes.push(format!(
                "{} certificate {} (until {})",
                config.kind,
                new.certificate.subject,
                crate::tls::doctor::utc(new.certificate.not_after)
            ));
        }
        self.pool
            .store(Arc::new(Pool::new(config, servers, Arc::new(tls))));
        // The monitor reads the new interval and servers when it wakes.
        self.health_changed.notify_one();
        changes
    }

    /// Loads the TLS of `config` (this balancer's next generation) with the balancer's
    /// session resumption, so clients resume across the swap. Every finding when it cannot:
    /// the caller rejects the reload and everything stays as it was.
    pub fn load_tls(&self, config: &BalancerConfig) -> Result<Secured, Findings> {
        load_tls(config, self.resumption.as_ref())
    }

    /// A client's TLS handshake failed: counted by cause; the first of an episode is logged
    /// with its cause (one line, not one per client). No server is to blame.
    pub fn handshake_failed(&self, client: SocketAddr, failure: &HandshakeFailure) {
        *self
            .handshake_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(failure.cause.label())
            .or_default() += 1;
        if self.handshake_episode.strike() {
            warn!(
                client = %client,
                "TLS handshake with a client failed: {failure}; further failures are counted \
                 in METRICS until one succeeds"
            );
        } else {
            debug!(client = %client, "TLS handshake failed: {failure}");
        }
    }

    /// A client's TLS handshake succeeded: ends an episode of failures with a line.
    pub fn handshake_done(&self) {
        if let Some(failed) = self.handshake_episode.end() {
            info!("TLS handshakes with clients succeed again; {failed} failed before");
        }
    }

    /// Failed TLS handshakes with clients so far, by cause.
    pub fn handshake_failures(&self) -> BTreeMap<&'static str, u64> {
        self.handshake_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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

    /// Dials `server` for `client` with `pool`'s settings: the dialer (resolve, the broker
    /// itself refused, connect within `CONNECT_TIMEOUT`), the upstream TLS of `pool`'s
    /// generation (`SSL_ENCRYPT_UPSTREAM=1`, verified as its keys say), TCP keepalive; then
    /// the connect accounted for, once ([`Balancer::connected`] or
    /// [`Balancer::connect_failed`]; `stale`: the server was chosen although quarantined).
    /// The one dial path of both engines, a TCP client's and an HTTP request's, so every
    /// `SSL_*` and socket key means the same on both. A lookup not tried for
    /// `DNS_MAX_LOOKUPS` is no failure of the server: it is not counted.
    pub async fn dial(
        &self,
        pool: &Pool,
        server: &Server,
        stale: bool,
        client: SocketAddr,
    ) -> Result<ServerStream, ConnectError> {
        let config = &pool.config;
        let tls = pool.tls.upstream.as_ref();
        match dial::dial(&self.resolver, &server.host, server.port, config, tls).await {
            Ok(stream) => {
                if let Some(socket) = stream.socket() {
                    dial::keep_alive(socket, &config.keepalive, &server.address);
                }
                self.connected(server, stale);
                Ok(stream)
            }
            Err(e @ ConnectError::ResolverBusy { .. }) => {
                // As after a connect timeout, the next candidate; the resolver says it once.
                debug!(client = %client, server = %server.address, "not tried: DNS_MAX_LOOKUPS lookups in flight");
                Err(e)
            }
            Err(e) => {
                self.connect_failed(server, stale, &e, client);
                Err(e)
            }
        }
    }

    /// A connect to `server` succeeded (`stale`: it was chosen although quarantined). A
    /// connect proves what a CONNECTION check proves, so a stale quarantine ends (not one
    /// found by a SEND_EXPECT or HTTP check, which a connect cannot overrule, nor one for
    /// requests that timed out); a broker fault episode ends.
    fn connected(&self, server: &Server, stale: bool) {
        server.total.fetch_add(1, Relaxed);
        server.health.connected();
        // A connect proves the port accepts, nothing more: not that a server quarantined for
        // not answering its requests (`timeout`) answers them now.
        if stale
            && server.quarantine_reason() != Some(Reason::Timeout)
            && !matches!(
                self.pool.load().config.monitoring,
                Monitoring::SendExpect { .. } | Monitoring::Http { .. }
            )
        {
            self.release(server, Release::ClientConnected);
        }
        if let Some(unserved) = self.broker_faults.end() {
            let were = if self.kind().is_http() {
                "requests were answered 503"
            } else {
                "were closed"
            };
            info!("connecting clients again: {unserved} {were} while the broker lacked resources");
        }
    }

    /// A connect to `server` for `client` failed with `error` (`stale`: the server was chosen
    /// although quarantined). A cause that blames anyone but the broker counts against the
    /// server and quarantines it (unless its quarantine is what the choice went around); a
    /// cause that is the broker's own blames no server. Called by [`Balancer::dial`], and by
    /// the HTTP engine for a new connection the server closed before it took the request.
    pub fn connect_failed(
        &self,
        server: &Server,
        stale: bool,
        error: &ConnectError,
        client: SocketAddr,
    ) {
        let error = error.explain();
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
                let they = if self.kind().is_http() {
                    "their requests are answered 503"
                } else {
                    "they are closed"
                };
                error!(
                    server = %server.address,
                    "cannot connect clients: {error}; {they} and no server is blamed until \
                     this clears"
                );
            }
            return;
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

    /// A connection relayed to `server` ended (a TCP client's, or an HTTP connection's after
    /// its upgrade): its closing line, in `span` (always for an idle close, which the broker
    /// decided; otherwise with `LOG_CONNECTIONS`; at debug for a connection that carried no
    /// byte either way).
    pub fn ended(&self, server: &Server, closed: &Closed<'_>, span: &Span) {
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
        if outcome.to_server == 0 && outcome.to_client == 0 {
            // Nothing either way: a browser's speculative connection, a port check. Counted as
            // any (its server took a connection), told at debug only: a demo session's page
            // views wrote a dozen such lines among the ones that matter.
            span.in_scope(|| {
                debug!(
                    duration = %format_args!("{:.3}s", closed.duration.as_secs_f64()),
                    ended_by = %outcome.end,
                    client = %closed.client,
                    server = %server.address,
                    "connection closed without a byte either way"
                );
            });
            return;
        }
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
                crate::process::os_error::words(error),
                crate::process::os_error::errno_name(error).unwrap_or("error"),
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
    // An operator's overrides (`appbroker ctl`), applied and logged once with who asked
    // -----------------------------------------------------------------------------------

    /// The server of the current pool that `name` names (its id or `host:port`).
    pub fn find_server(&self, name: &str) -> Option<Arc<Server>> {
        self.pool()
            .servers
            .iter()
            .find(|s| s.is_named(name))
            .cloned()
    }

    /// Holds `server` out of the balancing (disabled or draining): no new clients, its open
    /// connections stay. True when this changed anything.
    pub fn hold(&self, server: &Server, hold: Hold) -> bool {
        let (mode, reason, by) = (hold.mode, hold.reason.clone(), hold.by.clone());
        let old = {
            let mut overrides = server.lock_overrides();
            // Under the lock, so `held` always says what `overrides` does.
            server.held.store(true, Relaxed);
            overrides.hold(hold)
        };
        if old
            .as_ref()
            .is_some_and(|o| o.mode == mode && o.reason == reason)
        {
            return false;
        }
        let why = if reason.is_empty() {
            String::new()
        } else {
            format!(" ({reason})")
        };
        let done = match mode {
            crate::balancer::overrides::Mode::Drain => "draining",
            crate::balancer::overrides::Mode::Disabled => "disabled",
        };
        warn!(
            "server {} {done} by {by}{why}: no new clients, its {} stay",
            server.address,
            plural(server.active() as usize, "open connection")
        );
        true
    }

    /// Ends an operator's hold of `server`; true when it was held.
    pub fn enable(&self, server: &Server, by: &str) -> bool {
        let mut overrides = server.lock_overrides();
        let Some(old) = overrides.enable() else {
            return false;
        };
        server.held.store(false, Relaxed);
        drop(overrides);
        info!(
            "server {} enabled by {by} (was {})",
            server.address,
            old.mode.as_str()
        );
        true
    }

    /// Gives `server` an operator's weight (`None`: the file's again); the weight it takes.
    pub fn set_weight(&self, server: &Server, weight: Option<u32>, by: &str) -> u32 {
        let file = server.file_weight.load(Relaxed);
        let now = server.lock_overrides().set_weight(weight, file);
        let was = server.weight.swap(now, Relaxed);
        match weight {
            Some(_) => {
                info!(
                    "server {} weight {was} -> {now} by {by} (the file says {file})",
                    server.address
                )
            }
            None => {
                info!(
                    "server {} weight {was} -> {now} by {by}: the file's again",
                    server.address
                )
            }
        }
        now
    }

    /// Puts `server` in quarantine for `duration` on an operator's word (`asked`: who, or who
    /// and why): passing checks do not end it, only its time or [`Balancer::release_by`].
    pub fn force_quarantine(&self, server: &Server, duration: Duration, asked: impl Into<Asked>) {
        let asked = asked.into();
        let (by, words) = (asked.by.clone(), asked.words());
        let why = match asked.reason.as_str() {
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        let q = server.health.forced(asked, duration, self.now());
        self.quarantined(server, Reason::Operator, &words, q);
        info!(
            "server {} put in quarantine by {by}{why} for {}: checks do not end it; `appbroker ctl release` does",
            server.address,
            crate::config::show_duration(duration)
        );
    }

    /// Ends `server`'s quarantine, whoever started it, on an operator's word; true when it was
    /// in one.
    pub fn release_by(&self, server: &Server, by: &str) -> bool {
        let released = server.health.passed(Release::Operator, self.now());
        if released {
            self.released_because(server, Release::Operator, &format!("released by {by}"));
        }
        released
    }

    /// Closes every open connection to `server` now (what each relay has written is flushed
    /// by the close); returns how many were open.
    pub fn cut(&self, server: &Server, by: &str) -> u64 {
        let open = server.active();
        let token = std::mem::take(&mut *server.cut.lock().unwrap_or_else(|p| p.into_inner()));
        token.cancel();
        warn!(
            "server {}: cutting its {} at the request of {by}",
            server.address,
            plural(open as usize, "open connection")
        );
        open
    }

    /// Applies overrides read back from the state file to `server` (its hold as it was, its
    /// weight); logged once.
    pub fn restore(&self, server: &Server, overrides: Overrides) {
        if let Some(weight) = overrides.weight {
            let file = server.file_weight.load(Relaxed);
            let now = server.lock_overrides().set_weight(Some(weight), file);
            server.weight.store(now, Relaxed);
        }
        if let Some(hold) = overrides.hold {
            let mut held = server.lock_overrides();
            server.held.store(true, Relaxed);
            held.hold(hold);
        }
        let o = server.overrides();
        info!(
            "server {}: restored from the state file: {}",
            server.address,
            describe(&o)
        );
    }

    // -----------------------------------------------------------------------------------
    // Health: the quarantine transitions applied and logged, the monitor's checks counted
    // -----------------------------------------------------------------------------------

    /// Puts `server` in quarantine for `reason` (or moves its end out) for `QUARANTINE_TIME`,
    /// and logs it: the TOTVS line byte for byte, then the end in local time for people.
    pub fn quarantine(&self, server: &Server, reason: Reason, error: &str) {
        let duration = self.pool.load().config.quarantine_time;
        self.quarantine_for(server, reason, error, duration);
    }

    /// Puts `server` in quarantine for `reason` for `duration` (or moves its end), and logs it.
    fn quarantine_for(&self, server: &Server, reason: Reason, error: &str, duration: Duration) {
        let q = server.health.failed(reason, error, duration, self.now());
        self.quarantined(server, reason, error, q);
    }

    /// What a quarantine's start (or its end moved) tells: the release of the one before, if
    /// its time was up, the event and the TOTVS line.
    fn quarantined(&self, server: &Server, reason: Reason, error: &str, q: Quarantined) {
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
        self.released_because(server, why, why.as_str());
    }

    /// A release told with `words` for its cause.
    fn released_because(&self, server: &Server, why: Release, words: &str) {
        info!(
            "releasing server {} from quarantine ({words})",
            server.address
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

/// Overrides in words, for logs: `disabled (reason) by uid 0, weight 3`.
fn describe(o: &Overrides) -> String {
    let mut words = Vec::new();
    if let Some(h) = &o.hold {
        let reason = if h.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", h.reason)
        };
        words.push(format!("{}{reason} by {}", h.mode.as_str(), h.by));
    }
    if let Some(w) = o.weight {
        words.push(format!("weight {w}"));
    }
    if words.is_empty() {
        "no override".to_string()
    } else {
        words.join(", ")
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
    /// True when the keys ask for TLS this generation could not load (the files changed
    /// between the doctor's check and the balancer's start): its clients are closed rather
    /// than served, or sent to their servers, without it.
    pub fn tls_missing(&self) -> bool {
        let keys = &self.config.tls;
        (keys.certificate.is_some() && self.tls.server.is_none())
            || (keys.encrypt_upstream && self.tls.upstream.is_none())
    }

    /// A pool over `servers` (built from `config.servers`, same order).
    fn new(config: BalancerConfig, servers: Vec<Arc<Server>>, tls: Arc<Secured>) -> Self {
        Pool {
            tls,
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
    /// Index of the server in its pool.
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

    fn hold(mode: crate::balancer::overrides::Mode) -> Hold {
        Hold {
            mode,
            reason: "patch".into(),
            by: "uid 0".into(),
            since_wall_ms: 1,
        }
    }

    /// The servers (by index) the next `n` picks choose, each lease dropped at once.
    fn picks(balancer: &Balancer, n: usize) -> Vec<usize> {
        let pool = balancer.pool();
        (0..n)
            .filter_map(|_| {
                let now = balancer.clock_ms();
                pool.pick(now, &[], Eligible::Available)
                    .or_else(|| pool.pick(now, &[], Eligible::EvenQuarantined))
                    .map(|lease| lease.index)
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_server_gets_no_client_until_enabled() {
        let balancer =
            balancer("REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n");
        let first = balancer.find_server("01").expect("by id");
        assert!(
            balancer.find_server("127.0.0.1:6002").is_some(),
            "by address"
        );
        assert!(balancer.hold(&first, hold(crate::balancer::overrides::Mode::Disabled)));
        assert!(picks(&balancer, 10).iter().all(|&i| i == 1));
        assert_eq!(balancer.state().servers[0].state, Standing::Disabled);
        // Even with every other server quarantined, a held one is not tried.
        let second = balancer.find_server("02").expect("by id");
        balancer.quarantine(&second, Reason::Monitor, "refused");
        assert!(picks(&balancer, 3).iter().all(|&i| i == 1));
        assert!(balancer.enable(&first, "uid 0"));
        assert!(!balancer.enable(&first, "uid 0"), "nothing left to enable");
        assert_eq!(picks(&balancer, 2), vec![0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_weight_is_followed_and_outlives_a_reload() {
        let text = "REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n";
        let balancer = balancer(text);
        let first = balancer.find_server("01").expect("by id");
        assert_eq!(balancer.set_weight(&first, Some(0), "uid 0"), 0);
        assert!(picks(&balancer, 4).iter().all(|&i| i == 1));
        let again = super::tests::balancer(
            "REMOTE_SERVER_01=127.0.0.1 6001 5\nREMOTE_SERVER_02=127.0.0.1 6002\n",
        );
        let changes = balancer.reconfigure(again.pool().config.clone(), Secured::default());
        assert!(
            changes
                .iter()
                .any(|c| c.contains("keeps the operator's weight 0")),
            "{changes:?}"
        );
        let state = balancer.state();
        assert_eq!(
            (state.servers[0].weight, state.servers[0].file_weight),
            (0, 5)
        );
        assert_eq!(
            balancer.set_weight(&first, None, "uid 0"),
            5,
            "the file's again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_quarantine_is_no_stale_one_to_fall_back_on() {
        let balancer = balancer("REMOTE_SERVER_01=127.0.0.1 6001\n");
        let server = balancer.find_server("01").expect("by id");
        balancer.quarantine(&server, Reason::Monitor, "refused");
        assert_eq!(picks(&balancer, 1), vec![0], "a stale quarantine is tried");
        balancer.force_quarantine(&server, Duration::from_secs(600), "uid 0");
        assert!(picks(&balancer, 1).is_empty());
        balancer.release(&server, Release::CheckPassed);
        assert!(picks(&balancer, 1).is_empty(), "checks do not end it");
        assert!(balancer.release_by(&server, "uid 0"));
        assert_eq!(picks(&balancer, 1), vec![0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_ends_the_leases_of_that_server_only() {
        let balancer =
            balancer("REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n");
        let pool = balancer.pool();
        let a = pool.pick(0, &[1], Eligible::Available).expect("01");
        let b = pool.pick(0, &[0], Eligible::Available).expect("02");
        assert_eq!(balancer.cut(&a.server, "uid 0"), 1);
        assert!(a.cut.is_cancelled() && !b.cut.is_cancelled());
        let later = pool.pick(0, &[1], Eligible::Available).expect("01");
        assert!(!later.cut.is_cancelled(), "a new connection is not cut");
    }
}
