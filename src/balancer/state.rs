//! The read model: a server and a balancer read at one instant ([`ServerState`],
//! [`BalancerState`]), what the query interface renders, `appbroker ctl` shows and tests assert
//! on, and the chart's minute samples they carry. Reading takes no lock but a server's
//! briefly held own; nothing here changes what it reads.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::balancer::Balancer;
use crate::balancer::rules::health::{CheckResult, OperatorAsk, QuarantineEpisode, Reason};
use crate::balancer::rules::overrides::Overrides;
use crate::balancer::server::{Restarted, Server};
use crate::config::{BalancerKind, Monitoring, SortMethod};
use crate::tls::{CertificateSummary, UpstreamTls};

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
    pub asked: Option<OperatorAsk>,
    /// Quarantines since start.
    pub quarantines: u64,
    /// The last monitor check.
    pub last_check: Option<CheckResult>,
    /// Recent quarantines, oldest first.
    pub history: Vec<QuarantineEpisode>,
    /// Active connections each minute over the last hour, (wall ms, count).
    pub samples: Vec<(u64, u64)>,
    /// The last run of `RESTART_COMMAND` for it.
    pub restarted: Option<Restarted>,
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
    /// `PROXY_PROTOCOL=1`: connections from front balancers begin with a header.
    pub proxy_protocol: bool,
    /// Connections refused at the PROXY protocol step, by cause (METRICS' label).
    pub proxy_refusals: Vec<(&'static str, u64)>,
    /// `MAX_CONNECTIONS_PER_CLIENT` (0: no limit).
    pub max_connections_per_client: u32,
    /// Connections refused because their client had `MAX_CONNECTIONS_PER_CLIENT` open.
    pub client_limited: u64,
    /// Client addresses with connections counted against `MAX_CONNECTIONS_PER_CLIENT` now
    /// (0 with the limit off).
    pub clients_counted: usize,
}

impl BalancerState {
    /// The server whose `host:port` is `address` (case-insensitive).
    pub fn server(&self, address: &str) -> Option<&ServerState> {
        self.servers
            .iter()
            .find(|s| s.address.eq_ignore_ascii_case(address))
    }
}

impl Server {
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
            restarted: self.restarted(),
        }
    }
}

impl Balancer {
    /// The balancer's counters, settings and servers, read now.
    pub fn state(&self) -> BalancerState {
        let generation = self.generation();
        let config = &generation.config;
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
            servers: generation.servers.iter().map(|s| s.snapshot(now)).collect(),
            certificate: generation
                .tls
                .server
                .as_ref()
                .map(|t| t.certificate.clone()),
            upstream_warning: generation
                .tls
                .upstream
                .as_ref()
                .and_then(UpstreamTls::warning),
            handshake_failures: self.handshake_failures().into_iter().collect(),
            proxy_protocol: config.proxy.accept,
            proxy_refusals: self.proxy_refusals().into_iter().collect(),
            max_connections_per_client: config.max_connections_per_client,
            client_limited: stats.client_limited.load(Relaxed),
            clients_counted: self.clients_counted(),
        }
    }

    /// Records every server's active connections as this minute's sample (the chart).
    pub fn sample(&self) {
        for server in &self.generation().servers {
            server.sample();
        }
    }
}
