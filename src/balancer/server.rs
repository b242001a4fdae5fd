//! One configured server and its atomics: the counters a connection adds to, its weight and an
//! operator's hold as the hot path reads them, its chart's samples and its health. Every field
//! is changed only by the balancer's methods and its leases.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::balancer::alert_queue::AlertServer;
use crate::balancer::rules::health::{Health, Reason};
use crate::balancer::rules::overrides::Overrides;
use crate::config::{Host, ServerConfig, ServerId, show_duration};
use crate::support::clock::{time_of_day, wall_ms};

/// One configured server and everything counted about it. Shared by the generation, the
/// leases of its connections, the monitor and the query interface; changed only by
/// [`Balancer`](super::Balancer)'s methods and its [`Lease`](super::Lease)s.
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
    pub(super) weight: AtomicU32,
    /// The weight the file gives, whatever an operator's override says.
    pub(super) file_weight: AtomicU32,
    /// True while an operator holds it out of the balancing (disabled or draining): the hot
    /// path reads this, `overrides` says why.
    pub(super) held: AtomicBool,
    /// The operator's overrides, changed only through [`Balancer`](super::Balancer)'s methods.
    pub(super) overrides: Mutex<Overrides>,
    /// Cancelled to cut every connection to it (`ctl cut`), then replaced by a fresh one.
    pub(super) cut: Mutex<CancellationToken>,
    /// Connections counted against it now (chosen, connecting or relaying).
    pub(super) active: AtomicU64,
    /// Connections relayed since start.
    pub(super) total: AtomicU64,
    /// Live HTTP sessions bound to it (affinity), as the HTTP balancer's table last counted
    /// them: what SORT_METHOD=SESSION spreads.
    pub(super) sessions: AtomicU64,
    /// Most connections counted against it at once.
    pub(super) peak: AtomicU64,
    /// Active connections sampled each minute over the last hour (wall ms, count), oldest
    /// first, for the status page's chart.
    pub(super) samples: Mutex<VecDeque<(u64, u64)>>,
    /// Connects by clients that failed.
    pub(super) failed_connects: AtomicU64,
    /// Bytes from clients to this server.
    pub(super) bytes_to_server: AtomicU64,
    /// Bytes from this server to clients.
    pub(super) bytes_to_client: AtomicU64,
    /// HTTP requests to it that timed out in a row (`HTTP_TIMEOUTS_TO_QUARANTINE`).
    pub(super) timeouts_in_a_row: AtomicU32,
    /// Quarantine state and check results.
    pub(super) health: Health,
    /// The last run of `RESTART_COMMAND` for it.
    pub(super) restarted: Mutex<Option<Restarted>>,
}

/// A run of `RESTART_COMMAND` for a server, as its page, the JSON and `ctl show` tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restarted {
    /// When it started (wall ms).
    pub at_wall_ms: u64,
    /// Its exit code; `None` when it was killed at its timeout or could not start.
    pub exit: Option<i32>,
    /// What happened, in words: `exit 0`, `killed after RESTART_TIMEOUT (2m)`.
    pub outcome: String,
    /// Its last lines of output (standard output and error).
    pub output: String,
    /// Why it ran: `in quarantine for 2m`, or the operator who asked.
    pub why: String,
}

/// Why a restart by hand (`ctl restart`, the page's) does not run now. Its words are its
/// asker's: [`RestartRefusal::words`] for `ctl`, the page's own in its language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartRefusal {
    /// The balancer has no `RESTART_COMMAND`.
    NoCommand,
    /// This AppServer is being restarted.
    Running,
    /// Its last restart was less than `RESTART_COOLDOWN` ago: the next may run `until`.
    CoolingDown {
        /// When the cooldown ends.
        until: Instant,
        /// `RESTART_COOLDOWN` as it was.
        cooldown: Duration,
    },
    /// `RESTART_MAX_PARALLEL` restarts of the balancer's servers run already.
    Busy(u32),
    /// `RESTART_ONLY_WITH_ADDRESS` is not on this host (or the interfaces cannot be read).
    AddressAbsent(String),
}

impl RestartRefusal {
    /// When a restart in cooldown may run (wall ms); `None` for any other refusal.
    pub fn cooling_until_wall_ms(&self) -> Option<u64> {
        match self {
            RestartRefusal::CoolingDown { until, .. } => {
                let left = until.saturating_duration_since(Instant::now());
                Some(wall_ms() + left.as_millis() as u64)
            }
            _ => None,
        }
    }

    /// The refusal in words, for `ctl restart`.
    pub fn words(&self) -> String {
        match self {
            RestartRefusal::NoCommand => "RESTART_COMMAND is not set for this balancer".into(),
            RestartRefusal::Running => "it is being restarted now".into(),
            RestartRefusal::CoolingDown { cooldown, .. } => format!(
                "it was restarted less than RESTART_COOLDOWN ({}) ago; the next restart may \
                 run at {} (add --force to run it now)",
                show_duration(*cooldown),
                time_of_day(self.cooling_until_wall_ms().unwrap_or_default())
            ),
            RestartRefusal::Busy(n) => format!(
                "{} already run (RESTART_MAX_PARALLEL)",
                crate::config::plural(*n as usize, "restart")
            ),
            RestartRefusal::AddressAbsent(why) => why.clone(),
        }
    }
}

/// Minutes of samples kept: one hour, plus the sample that starts it.
const SAMPLES: usize = 61;

impl Server {
    /// A server with zeroed counters, available, and a first sample: the chart draws a
    /// server added by a reload from when it joined, not as a lone dot at the next minute.
    pub(super) fn new(config: &ServerConfig) -> Self {
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
            restarted: Mutex::new(None),
        };
        server.sample();
        server
    }

    /// Records the active count now as this minute's sample, dropping those over an hour old.
    pub(super) fn sample(&self) {
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
    /// weight above 0 (what [`Generation::pick`](super::Generation::pick) asks of a server).
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

    /// While it is in a quarantine its health put it in (a failed check, a client's failed
    /// connect, timed-out requests), not an operator: when that quarantine started (wall ms).
    pub fn health_quarantine_since(&self) -> Option<u64> {
        match self.health.current() {
            Some((since, false)) => Some(since),
            _ => None,
        }
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

    pub(super) fn lock_overrides(&self) -> std::sync::MutexGuard<'_, Overrides> {
        self.overrides.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last run of `RESTART_COMMAND` for it.
    pub fn restarted(&self) -> Option<Restarted> {
        self.restarted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The server as an alert names it.
    pub fn alert_server(&self) -> AlertServer {
        AlertServer {
            id: self.id.to_string(),
            host: self.host.to_string(),
            port: self.port,
            address: self.address.clone(),
        }
    }

    /// True when `name` names this server: its id (`01`) or its `host:port`.
    pub fn is_named(&self, name: &str) -> bool {
        self.id.to_string().eq_ignore_ascii_case(name) || self.address.eq_ignore_ascii_case(name)
    }
}
