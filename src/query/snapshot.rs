//! One consistent read of a balancer's live state, with what a page adds to it (language,
//! who asks, the other balancers), which every answer (HTML, JSON, metrics) is rendered from,
//! so the renderers are pure functions that tests can call directly.

use std::net::SocketAddr;

use crate::balancer::{Balancer, BalancerState};
pub use crate::balancer::{ServerState, Standing};
use crate::config::{BalancerKind, Language};
use crate::http::{PoolFigures, stats::Figures};
use crate::support::clock::wall_ms;

/// An HTTP balancer's figures beside its state: the engine's counters and each server's pool.
#[derive(Debug, Clone, Default)]
pub struct HttpFigures {
    /// Requests by status class, the duration histogram, failures and retries.
    pub requests: Figures,
    /// Each server's kept-alive connections, by `host:port`, in configuration order.
    pub pools: Vec<(String, PoolFigures)>,
    /// The HTTP balancer's sessions (affinity).
    pub sessions: SessionFigures,
}

/// An HTTP balancer's sessions: live, since start, moved, and per server.
#[derive(Debug, Clone, Default)]
pub struct SessionFigures {
    /// Live sessions now.
    pub live: u64,
    /// Sessions since start.
    pub total: u64,
    /// Most live sessions at once.
    pub peak: u64,
    /// Sessions moved to another server (their server in quarantine or removed).
    pub moved: u64,
    /// Each server's sessions, by `host:port`, in configuration order.
    pub servers: Vec<(String, ServerSessions)>,
}

/// One server's sessions.
#[derive(Debug, Clone, Default)]
pub struct ServerSessions {
    /// Live now.
    pub live: u64,
    /// Most at once.
    pub peak: u64,
    /// The longest idle times of its live sessions, longest first (at most
    /// [`SESSION_AGES_SHOWN`]).
    pub ages: Vec<std::time::Duration>,
}

/// Session ages a server's page lists: enough to see who is idle, a page that stays small
/// with 100,000 sessions.
pub const SESSION_AGES_SHOWN: usize = 200;

impl HttpFigures {
    /// `address`'s sessions, zero when the balancer has none for it.
    pub fn sessions_of(&self, address: &str) -> ServerSessions {
        self.sessions
            .servers
            .iter()
            .find(|(a, _)| a == address)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }
}

/// A balancer as a query sees it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The balancer's counters, settings and servers.
    pub state: BalancerState,
    /// Labels' language.
    pub language: Language,
    /// The reader asked for `language` (`?lang=`): the page's links carry it on.
    pub language_asked: bool,
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
    /// The other balancers of this process: (section, listen address).
    pub others: Vec<(BalancerKind, SocketAddr)>,
    /// An HTTP balancer's own figures; `None` for a TCP balancer.
    pub http: Option<HttpFigures>,
    /// The alerts of this balancer and of the broker as a whole, since start: (balancer
    /// label, event, outcome, count).
    pub alerts: Vec<(String, &'static str, &'static str, u64)>,
    /// The restarts of this balancer's servers, since start: (outcome, count).
    pub restarts: Vec<(&'static str, u64)>,
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
        let pid = std::process::id();
        Snapshot {
            state: balancer.state(),
            language,
            language_asked: false,
            started_wall_ms,
            now_wall_ms: wall_ms(),
            pid,
            instance: format!("[{:08X}-{pid:08X}]", started_wall_ms / 1000),
            peer,
            draining,
            others,
            http: None,
            alerts: balancer.events().figures().alerts_of(balancer.kind()),
            restarts: balancer.events().figures().restarts_of(balancer.kind()),
        }
    }

    /// The server whose `host:port` is `address` (case-insensitive).
    pub fn server(&self, address: &str) -> Option<&ServerState> {
        self.state.server(address)
    }
}
