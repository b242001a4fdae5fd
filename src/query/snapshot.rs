//! One consistent read of a balancer's live state, which every answer (HTML, JSON, metrics)
//! is rendered from, so the renderers are pure functions that tests can call directly.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::balancer::{Balancer, Server};
use crate::clock::wall_ms;
use crate::config::{BalancerKind, Language, Monitoring, SortMethod};
use crate::health::{Check, Episode, Reason};

/// A balancer as a query sees it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Which section.
    pub kind: BalancerKind,
    /// Configured listen address.
    pub listen: SocketAddr,
    /// Labels' language.
    pub language: Language,
    /// When the broker started (wall ms).
    pub started_wall_ms: u64,
    /// When this snapshot was taken (wall ms).
    pub now_wall_ms: u64,
    /// The broker's process id.
    pub pid: u32,
    /// This run's id, `[XXXXXXXX-XXXXXXXX]` (start time and pid in hex).
    pub instance: String,
    /// Who asked.
    pub peer: SocketAddr,
    /// True during the shutdown grace: PING answers 503.
    pub draining: bool,
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
    pub servers: Vec<ServerSnapshot>,
    /// The other balancers of this process: (section, listen address).
    pub others: Vec<(BalancerKind, SocketAddr)>,
}

/// Where a server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Takes new clients.
    Available,
    /// In quarantine: no new clients.
    Quarantined,
    /// Weight 0: no new clients, existing ones stay.
    Draining,
}

/// A server as a query sees it.
#[derive(Debug, Clone)]
pub struct ServerSnapshot {
    /// `REMOTE_SERVER_<id>`.
    pub id: String,
    /// `host:port` as configured.
    pub address: String,
    /// Configured weight.
    pub weight: u32,
    /// Where it stands.
    pub state: State,
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

impl Snapshot {
    /// Reads `balancer` now. `others` are the process's other balancers.
    pub fn take(
        balancer: &Balancer,
        language: Language,
        started_wall_ms: u64,
        peer: SocketAddr,
        draining: bool,
        others: Vec<(BalancerKind, SocketAddr)>,
    ) -> Snapshot {
        let pool = balancer.pool();
        let config = &pool.config;
        let now = balancer.clock.now_ms();
        let stats = &balancer.stats;
        let pid = std::process::id();
        Snapshot {
            kind: config.kind,
            listen: config.listen,
            language,
            started_wall_ms,
            now_wall_ms: wall_ms(),
            pid,
            instance: format!("[{:08X}-{pid:08X}]", started_wall_ms / 1000),
            peer,
            draining,
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
            servers: pool.servers.iter().map(|s| server(s, now)).collect(),
            others,
        }
    }

    /// The server whose `host:port` is `address` (case-insensitive).
    pub fn server(&self, address: &str) -> Option<&ServerSnapshot> {
        self.servers
            .iter()
            .find(|s| s.address.eq_ignore_ascii_case(address))
    }
}

fn server(s: &Server, now_ms: u64) -> ServerSnapshot {
    let detail = s.health.detail();
    let quarantined = !s.health.is_available(now_ms);
    let weight = s.weight.load(Relaxed);
    let state = if quarantined {
        State::Quarantined
    } else if weight == 0 {
        State::Draining
    } else {
        State::Available
    };
    let samples = s
        .samples
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .copied()
        .collect();
    ServerSnapshot {
        id: s.id.to_string(),
        address: s.address.clone(),
        weight,
        state,
        active: s.active.load(Relaxed),
        peak: s.peak.load(Relaxed),
        total: s.total.load(Relaxed),
        failed_connects: s.failed_connects.load(Relaxed),
        bytes_to_server: s.bytes_to_server.load(Relaxed),
        bytes_to_client: s.bytes_to_client.load(Relaxed),
        quarantine: quarantined.then_some((detail.since_wall_ms, detail.until_wall_ms)),
        reason: detail.reason,
        last_error: detail.last_error,
        quarantines: detail.quarantines,
        last_check: detail.last_check,
        history: detail.history.into_iter().collect(),
        samples,
    }
}
