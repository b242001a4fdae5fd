//! Health: each server's quarantine state, the monitor that checks every server each
//! `MONITOR_INTERVAL`, and the transitions with the log lines operators grep.
//!
//! The TOTVS semantics: a server that fails a check, or refuses a client's connection, is put
//! in quarantine until now + `QUARANTINE_TIME` (an existing quarantine has its end moved out);
//! a quarantined server that passes a check is released at once; a quarantine also ends when
//! its time is up. `MONITOR_FALL` and `MONITOR_RISE` (1 by default, which is TOTVS) ask for
//! that many failed or passed checks in a row first; a client's failed connect quarantines at
//! once. Quarantined servers get no new clients; their connections are left alone.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::balancer::{Balancer, Pool, Server};
use crate::clock::{Clock, time_of_day, wall_ms};
use crate::config::show_escaped;
use crate::config::{BalancerConfig, Host, Monitoring, plural, show_duration};
use crate::dial::{ConnectError, connect};
use crate::os_error::PointsAt;
use crate::resolve::Resolver;

/// Why a server was put in quarantine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// It failed a monitor check.
    Monitor,
    /// A client's connect to it failed.
    Connect,
}

impl Reason {
    /// The word in the quarantine log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Monitor => "monitor",
            Reason::Connect => "connect",
        }
    }
}

/// The outcome of one monitor check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Wall-clock time of the check, ms since the Unix epoch.
    pub at_wall_ms: u64,
    /// How long it took.
    pub duration: Duration,
    /// `None` when it passed, else the error in words.
    pub error: Option<String>,
}

/// One quarantine of a server, for its detail page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    /// When it started (wall ms).
    pub start_wall_ms: u64,
    /// When it ended (wall ms); `None` while it lasts.
    pub end_wall_ms: Option<u64>,
    /// Why it started.
    pub reason: Reason,
    /// The error that started it, in words.
    pub error: String,
    /// Why it ended, as the release line says it.
    pub released: Option<String>,
}

/// Quarantines kept per server for its detail page.
const HISTORY: usize = 20;

/// What is known of a server's quarantine beyond its deadline, for logs and pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detail {
    /// When the current quarantine started (wall ms), 0 when not quarantined.
    pub since_wall_ms: u64,
    /// When the current quarantine ends (wall ms), 0 when not quarantined.
    pub until_wall_ms: u64,
    /// Why the current (or last) quarantine started.
    pub reason: Option<Reason>,
    /// The last connect error, in words.
    pub last_error: Option<String>,
    /// Quarantines started since the broker started.
    pub quarantines: u64,
    /// The last monitor check.
    pub last_check: Option<Check>,
    /// The last quarantines, oldest first.
    pub history: std::collections::VecDeque<Episode>,
    /// Monitor checks failed in a row (for `MONITOR_FALL`).
    pub fails_in_a_row: u32,
    /// Monitor checks passed in a row since the last failure or quarantine (for `MONITOR_RISE`).
    pub passes_in_a_row: u32,
}

/// A server's quarantine state. The deadline is an atomic so selection reads it without a lock;
/// the rest changes rarely and sits behind a small mutex.
#[derive(Debug, Default)]
pub struct Health {
    /// Quarantine end on the balancer's [`Clock`], in ms; 0 when not in quarantine.
    until_ms: AtomicU64,
    detail: Mutex<Detail>,
}

impl Health {
    /// True when the server may get new clients at `now_ms` (no quarantine, or it is over).
    pub fn is_available(&self, now_ms: u64) -> bool {
        let until = self.until_ms.load(Relaxed);
        until == 0 || until <= now_ms
    }

    /// True while a quarantine is recorded (it may have run out and await its release line).
    pub fn is_quarantined(&self) -> bool {
        self.until_ms.load(Relaxed) != 0
    }

    /// The quarantine deadline on the balancer's clock (0: none).
    pub fn until_ms(&self) -> u64 {
        self.until_ms.load(Relaxed)
    }

    /// A copy of the details.
    pub fn detail(&self) -> Detail {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts or extends a quarantine until now + `duration`. Returns its (start, stop) in
    /// wall-clock seconds since the Unix epoch, as the log line prints them.
    fn enter(&self, clock: &Clock, duration: Duration, reason: Reason, error: &str) -> (u64, u64) {
        let mut detail = self.lock();
        let now_wall = wall_ms();
        let until_wall = now_wall + duration.as_millis() as u64;
        if self.until_ms.load(Relaxed) == 0 {
            detail.since_wall_ms = now_wall;
            detail.quarantines += 1;
            if detail.history.len() == HISTORY {
                detail.history.pop_front();
            }
            detail.history.push_back(Episode {
                start_wall_ms: now_wall,
                end_wall_ms: None,
                reason,
                error: error.to_string(),
                released: None,
            });
        }
        detail.until_wall_ms = until_wall;
        // Any failure, a client's included, starts the count to MONITOR_RISE again.
        detail.passes_in_a_row = 0;
        detail.reason = Some(reason);
        detail.last_error = Some(error.to_string());
        self.until_ms
            .store(clock.now_ms() + duration.as_millis() as u64, Relaxed);
        (now_wall / 1000, until_wall / 1000)
    }

    /// Ends the quarantine, if any, for `why`; with `if_up_at`, only when its time is up at
    /// that instant (balancer clock ms). True when one ended.
    fn leave(&self, why: &str, if_up_at: Option<u64>) -> bool {
        let mut detail = self.lock();
        let until = self.until_ms.load(Relaxed);
        if until == 0 || if_up_at.is_some_and(|now| until > now) {
            return false;
        }
        self.until_ms.store(0, Relaxed);
        close_episode(&mut detail, why);
        true
    }

    fn record_check(&self, check: Check) {
        self.lock().last_check = Some(check);
    }

    /// Counts a failed check; returns the failures in a row.
    fn failed(&self) -> u32 {
        let mut detail = self.lock();
        detail.passes_in_a_row = 0;
        detail.fails_in_a_row = detail.fails_in_a_row.saturating_add(1);
        detail.fails_in_a_row
    }

    /// Counts a passed check; returns the passes in a row.
    fn passed(&self) -> u32 {
        let mut detail = self.lock();
        detail.fails_in_a_row = 0;
        detail.passes_in_a_row = detail.passes_in_a_row.saturating_add(1);
        detail.passes_in_a_row
    }
}

/// Why a quarantine ended when its time was up.
const EXPIRED: &str = "quarantine time is up";

fn close_episode(detail: &mut Detail, why: &str) {
    detail.since_wall_ms = 0;
    detail.until_wall_ms = 0;
    if let Some(last) = detail
        .history
        .back_mut()
        .filter(|e| e.end_wall_ms.is_none())
    {
        last.end_wall_ms = Some(wall_ms());
        last.released = Some(why.to_string());
    }
}

/// Puts `server` in quarantine (or moves its end out) and logs it. A quarantine whose time is
/// up but whose release the monitor has not logged yet is over: it is closed first, and this
/// failure starts a new one.
pub fn quarantine(
    balancer: &Balancer,
    server: &Server,
    duration: Duration,
    reason: Reason,
    error: &str,
) {
    release_if_expired(balancer, server);
    let (start, stop) = server
        .health
        .enter(&balancer.clock, duration, reason, error);
    // The TOTVS line byte for byte, then the end in local time for people.
    warn!(
        "putting server {} in quarantine start={start} stop={stop} ({}) until={}",
        server.address,
        reason.as_str(),
        time_of_day(stop * 1000)
    );
    // The monitor sleeps until the earliest deadline; a new one may be earlier.
    balancer.health_changed.notify_one();
}

/// Releases `server` from quarantine, if it is in one, and logs why.
pub fn release(server: &Server, why: &str) {
    if server.health.leave(why, None) {
        log_release(server, why);
    }
}

/// Releases `server` if its quarantine's time is up, and logs it.
fn release_if_expired(balancer: &Balancer, server: &Server) {
    if server.health.leave(EXPIRED, Some(balancer.clock.now_ms())) {
        log_release(server, EXPIRED);
    }
}

fn log_release(server: &Server, why: &str) {
    info!(
        "releasing server {} from quarantine ({why})",
        server.address
    );
}

/// Runs monitor rounds (unless monitoring is disabled) and releases quarantines whose time is
/// up, until `stop` is cancelled.
pub async fn run_monitor(balancer: Arc<Balancer>, stop: CancellationToken) {
    let mut last_round: Option<Instant> = None;
    loop {
        let pool = balancer.pool();
        let monitoring = pool.config.monitoring != Monitoring::Disabled;
        // Computed from the pool each time, so a reloaded MONITOR_INTERVAL applies at once.
        let mut next_round =
            last_round.map_or_else(Instant::now, |t| t + pool.config.monitor_interval);
        if monitoring && Instant::now() >= next_round {
            round(&balancer, &pool).await;
            last_round = Some(Instant::now());
            next_round = Instant::now() + pool.config.monitor_interval;
        }
        let mut wake = monitoring.then_some(next_round);
        for server in &pool.servers {
            release_if_expired(&balancer, server);
            let until = server.health.until_ms();
            if until != 0 {
                let at = balancer.clock.instant(until);
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
        }
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep => {}
            _ = balancer.health_changed.notified() => {}
        }
    }
}

/// Why a check failed.
#[derive(Debug)]
pub enum CheckError {
    /// The TCP connect (or the lookup of the server's name) failed.
    Connect(ConnectError),
    /// SEND_EXPECT: no (complete) reply within the time allowed.
    NoReply {
        /// What had arrived when time ran out.
        got: Vec<u8>,
    },
    /// SEND_EXPECT: the reply does not start with what was expected.
    Mismatch {
        /// The start of the reply.
        got: Vec<u8>,
    },
    /// SEND_EXPECT: the server closed (or reset) the connection before a full reply.
    Closed {
        /// What had arrived.
        got: Vec<u8>,
    },
}

impl CheckError {
    /// The failure in words, for logs and pages.
    pub fn words(&self) -> String {
        match self {
            CheckError::Connect(e) => e.explain().words,
            CheckError::NoReply { got } if got.is_empty() => {
                "no reply: the port accepts but the application does not answer".into()
            }
            CheckError::NoReply { got } => format!("incomplete reply `{}`", show_escaped(got)),
            CheckError::Mismatch { got } => format!("unexpected reply `{}`", show_escaped(got)),
            CheckError::Closed { got } if got.is_empty() => "closed without replying".into(),
            CheckError::Closed { got } => format!("closed after `{}`", show_escaped(got)),
        }
    }

    /// The full log text: the words with what they point at.
    fn explain(&self, timeout: Duration, expect: &[u8]) -> String {
        match self {
            CheckError::Connect(e) => e.explain().to_string(),
            CheckError::NoReply { .. } => format!(
                "{} within {} (SEND_EXPECT, expecting `{}`); points at the server's application",
                self.words(),
                show_duration(timeout),
                show_escaped(expect)
            ),
            CheckError::Mismatch { .. } | CheckError::Closed { .. } => format!(
                "{} (SEND_EXPECT, expecting `{}`); points at the server's application or a wrong \
                 MONITOR_EXPECT",
                self.words(),
                show_escaped(expect)
            ),
        }
    }
}

/// Checks one server: a TCP connect, and for SEND_EXPECT the probe and its reply, all within
/// `config`'s `CONNECT_TIMEOUT`.
pub async fn check(
    resolver: &Arc<Resolver>,
    host: &Host,
    port: u16,
    config: &BalancerConfig,
) -> Result<(), CheckError> {
    let deadline = Instant::now() + config.connect_timeout;
    let mut stream = connect(resolver, host, port, config)
        .await
        .map_err(CheckError::Connect)?;
    let Monitoring::SendExpect { send, expect } = &config.monitoring else {
        return Ok(());
    };
    let mut got = Vec::with_capacity(expect.len());
    let exchange = async {
        if stream.write_all(send).await.is_err() {
            return Err(CheckError::Closed { got: Vec::new() });
        }
        let mut chunk = [0u8; 512];
        while got.len() < expect.len() {
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    return Err(CheckError::Closed {
                        got: std::mem::take(&mut got),
                    });
                }
                Ok(n) => n,
            };
            got.extend_from_slice(&chunk[..n]);
            let compared = got.len().min(expect.len());
            if got[..compared] != expect[..compared] {
                got.truncate(64);
                return Err(CheckError::Mismatch {
                    got: std::mem::take(&mut got),
                });
            }
        }
        Ok(())
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Ok(result) => result,
        Err(_) => Err(CheckError::NoReply { got }),
    }
}

/// One monitor round: every server checked in parallel, then the results logged in
/// configuration order. `MONITOR_FALL` failed checks in a row quarantine a server;
/// `MONITOR_RISE` passed checks in a row release it. A check that fails for the broker's own
/// reasons (out of file descriptors) blames no server.
async fn round(balancer: &Balancer, pool: &Arc<Pool>) {
    let config = &pool.config;
    let timeout = config.connect_timeout;
    let mut checks = JoinSet::new();
    for (index, server) in pool.servers.iter().enumerate() {
        let server = Arc::clone(server);
        let (resolver, pool) = (Arc::clone(&balancer.resolver), Arc::clone(pool));
        checks.spawn(
            async move {
                let started = Instant::now();
                let result = check(&resolver, &server.host, server.port, &pool.config).await;
                (index, started.elapsed(), result)
            }
            .in_current_span(),
        );
    }
    let mut results: Vec<Option<(Duration, Result<(), CheckError>)>> =
        (0..pool.servers.len()).map(|_| None).collect();
    while let Some(joined) = checks.join_next().await {
        if let Ok((index, took, result)) = joined {
            results[index] = Some((took, result));
        }
    }
    let expect = match &config.monitoring {
        Monitoring::SendExpect { expect, .. } => expect.as_slice(),
        _ => &[],
    };

    let mut unavailable = Vec::new();
    let mut unchecked = Vec::new();
    for (server, result) in pool.servers.iter().zip(results) {
        let (took, result) = result.unwrap_or_else(|| {
            (
                Duration::ZERO,
                Err(CheckError::Connect(ConnectError::Io(io::Error::other(
                    "the check task failed",
                )))),
            )
        });
        let error = match result {
            Err(CheckError::Connect(e)) if e.explain().points_at == PointsAt::Broker => {
                unchecked.push((&server.address, e.explain()));
                continue;
            }
            Err(error) => error,
            Ok(()) => {
                server.health.record_check(Check {
                    at_wall_ms: wall_ms(),
                    duration: took,
                    error: None,
                });
                let passes = server.health.passed();
                if !server.health.is_quarantined() {
                    continue;
                }
                if passes >= config.monitor_rise {
                    release(server, "monitor check passed");
                } else {
                    info!(
                        "server {} passed the monitor check ({passes} of MONITOR_RISE={} to leave quarantine)",
                        server.address, config.monitor_rise
                    );
                }
                continue;
            }
        };
        let words = error.words();
        // In a quarantine whose last check failed the same way, this round changes nothing
        // an operator needs told again: the cause is logged once per episode (and when it
        // changes), while the TOTVS lines below still come every round.
        let steady = !server.health.is_available(balancer.clock.now_ms())
            && server
                .health
                .detail()
                .last_check
                .is_some_and(|c| c.error.as_ref() == Some(&words));
        server.health.record_check(Check {
            at_wall_ms: wall_ms(),
            duration: took,
            error: Some(words),
        });
        let fails = server.health.failed();
        let explained = error.explain(timeout, expect);
        if fails >= config.monitor_fall || server.health.is_quarantined() {
            if !steady {
                error!(
                    "server {} failed the monitor check: {explained}",
                    server.address
                );
            }
            quarantine(
                balancer,
                server,
                config.quarantine_time,
                Reason::Monitor,
                &error.words(),
            );
        } else {
            // Below MONITOR_FALL it still takes clients: not counted unavailable yet.
            warn!(
                "server {} failed the monitor check ({fails} of MONITOR_FALL={} before quarantine): {explained}",
                server.address, config.monitor_fall
            );
        }
    }
    // After the round, unavailable are the servers in quarantine, for whatever reason.
    let now = balancer.clock.now_ms();
    for server in &pool.servers {
        let unchecked_here = unchecked.iter().any(|(a, _)| *a == &server.address);
        if !server.health.is_available(now) && !unchecked_here {
            unavailable.push(&server.address);
        }
    }
    if let Some((_, explained)) = unchecked.first() {
        error!(
            "monitor: {} not checked: {explained}; no server is blamed",
            plural(unchecked.len(), "server")
        );
    }
    let available = pool.servers.len() - unavailable.len() - unchecked.len();
    let not_checked = if unchecked.is_empty() {
        String::new()
    } else {
        format!(", {} not checked", unchecked.len())
    };
    info!(
        "monitor: OK - {} available, {} unavailable{not_checked}",
        plural(available, "server"),
        plural(unavailable.len(), "server")
    );
    for address in &unavailable {
        warn!("monitor: server {address} unavailable");
    }
    if available == 0 && unchecked.is_empty() {
        error!("monitor: attention, there are no remote servers available");
    }
}

/// The span monitor lines are logged in, naming the balancer.
pub fn span(balancer: &str) -> tracing::Span {
    info_span!("monitor", balancer = %balancer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn quarantine_ends_when_its_time_is_up_or_on_release() {
        let clock = Clock::new();
        let health = Health::default();
        assert!(health.is_available(clock.now_ms()));
        health.enter(&clock, Duration::from_secs(120), Reason::Monitor, "refused");
        assert!(!health.is_available(clock.now_ms()));
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(!health.is_available(clock.now_ms()));
        assert!(!health.leave(EXPIRED, Some(clock.now_ms())));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(health.is_available(clock.now_ms()));
        assert!(
            health.is_quarantined(),
            "recorded until its release is logged"
        );
        assert!(health.leave(EXPIRED, Some(clock.now_ms())));
        assert!(!health.is_quarantined());
        assert!(!health.leave("test", None), "nothing left to release");
        let episode = &health.detail().history[0];
        assert_eq!(episode.released.as_deref(), Some(EXPIRED));
        assert!(episode.end_wall_ms.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_failure_moves_the_end_out_and_keeps_the_start() {
        let clock = Clock::new();
        let health = Health::default();
        health.enter(&clock, Duration::from_secs(120), Reason::Monitor, "refused");
        let since = health.detail().since_wall_ms;
        tokio::time::advance(Duration::from_secs(60)).await;
        health.enter(
            &clock,
            Duration::from_secs(120),
            Reason::Connect,
            "timed out",
        );
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(!health.is_available(clock.now_ms()), "end moved to 180 s");
        let detail = health.detail();
        assert_eq!(detail.quarantines, 1);
        assert_eq!(detail.since_wall_ms, since);
        assert_eq!(detail.reason, Some(Reason::Connect));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(health.is_available(clock.now_ms()));
    }

    #[tokio::test(start_paused = true)]
    async fn release_makes_it_available_at_once() {
        let clock = Clock::new();
        let health = Health::default();
        health.enter(&clock, Duration::from_secs(120), Reason::Connect, "refused");
        assert!(health.leave("monitor check passed", None));
        assert!(health.is_available(clock.now_ms()));
        assert_eq!(health.detail().since_wall_ms, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_after_the_time_is_up_starts_a_new_quarantine() {
        let text = "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n\
                    REMOTE_SERVER_01=127.0.0.1 6001\n";
        let loaded = crate::config::Config::from_text(text, std::path::Path::new("t.ini"));
        let config = loaded.expect("valid").config.balancers.remove(0);
        let balancer = Balancer::new(config, Arc::new(Resolver::new(32)));
        let server = Arc::clone(&balancer.pool().servers[0]);
        let quarantine_time = Duration::from_secs(120);
        quarantine(
            &balancer,
            &server,
            quarantine_time,
            Reason::Monitor,
            "refused",
        );
        tokio::time::advance(Duration::from_secs(121)).await;
        // The monitor has not woken to log the release yet; a client's connect fails.
        quarantine(
            &balancer,
            &server,
            quarantine_time,
            Reason::Connect,
            "timed out",
        );
        let detail = server.health.detail();
        assert_eq!(detail.quarantines, 2);
        assert_eq!(detail.history.len(), 2);
        assert_eq!(detail.history[0].released.as_deref(), Some(EXPIRED));
        assert_eq!(detail.history[1].reason, Reason::Connect);
        assert!(detail.history[1].end_wall_ms.is_none());
        assert!(!server.health.is_available(balancer.clock.now_ms()));
    }
}
