//! The sessions' sweep: every second, the sessions idle past `SESSION_TIMEOUT` end and each
//! server's count of sessions is set again (what `SORT_METHOD=SESSION` spreads and the pages
//! show), and the log's episodes of moved sessions and of clients over their cap end.

use std::sync::{Arc, Weak};

use tokio::time::{Duration, Instant};

use crate::balancer::Server;
use crate::http_balancer::HttpBalancer;
use crate::http_balancer::sessions::Sessions;

/// How often the sessions idle past `SESSION_TIMEOUT` are ended and each server's count set
/// again, when no request or query does it first: so `appbroker ctl show` and the balancing
/// of new sessions see a count at most this old. Episodes of moved sessions end here too.
const SESSION_SWEEP: Duration = Duration::from_secs(1);

/// Ends expired sessions every [`SESSION_SWEEP`] until the engine is gone.
pub(super) async fn expire_sessions(upstreams: Weak<HttpBalancer>) {
    loop {
        tokio::time::sleep(SESSION_SWEEP).await;
        let Some(upstreams) = upstreams.upgrade() else {
            return;
        };
        let generation = upstreams.balancer.generation();
        let mut table = upstreams.sessions.lock().unwrap_or_else(|p| p.into_inner());
        table.expire(Instant::now(), generation.config.http.session_timeout);
        upstreams.count_sessions(&table, &generation.servers);
        drop(table);
        upstreams.moves_ended();
        upstreams.over_cap_ended(generation.config.http.max_sessions_per_client);
    }
}

impl HttpBalancer {
    /// Each server's live sessions as the table counts them (what SORT_METHOD=SESSION
    /// spreads and the pages show).
    pub(super) fn count_sessions(&self, table: &Sessions, servers: &[Arc<Server>]) {
        for server in servers {
            server.set_sessions(table.count(server.id));
        }
    }
}
