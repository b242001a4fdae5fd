//! The HTTP engine's wiring, which owns its connections: one task per client connection
//! drives each request, its server connection and the answer over the pure core ([`h1`]),
//! with no second task or channel per server connection. A file per step of a connection
//! (its struct's methods) and per resource; the steps, in order, and why, are told once, in
//! docs/architecture.md ("The HTTP engine", and "Shutdown" for a drain).
//!
//! - [`buffers`]: the per-worker pool of buffers, in two tiers.
//! - `pool`: the idle server connections, per server and worker.
//! - `client`: a client connection's loop, its idle wait and its head.
//! - `ip_text`: the client's address as `X-Forwarded-For` says it, written once per
//!   connection.
//! - `exchange`: one request's state, its routing and its accounting.
//! - `local`: a request the balancer answers itself (a query): its body read within bounds,
//!   the balancer's answer awaited and written.
//! - `forward`: the tries: choose, connect, retry.
//! - `send`: one request sent to a server: its head rewritten, its body passed on, the
//!   answer's head awaited.
//! - `awaiting`: the server's side until the final head, interim answers passed on.
//! - `answer`: the answer on its way, the reuse decided, the tunnel.
//! - `pump`: a body passing through, bounded, spliced when long; each side's silence.
//! - `own`: the broker's own answers as bytes: the one formatter of them.
//!
//! [`h1`]: crate::http::h1

mod answer;
mod awaiting;
pub mod buffers;
mod client;
mod exchange;
mod forward;
mod ip_text;
mod local;
mod own;
mod pool;
mod pump;
mod send;

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::Settings;
use super::Upstreams;
use super::stats::Stats;
pub use client::{answer_and_close, linger};
pub use own::plain_http_to_tls_port;
pub use pool::PoolFigures;
use pool::ServerPool;

/// An HTTP balancer's engine, shared by all its client connections.
pub struct Engine<U: Upstreams> {
    upstreams: Arc<U>,
    settings: ArcSwap<Settings>,
    pool: ServerPool<U>,
    stats: Stats,
}

impl<U: Upstreams> std::fmt::Debug for Engine<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("settings", &self.settings.load())
            .finish_non_exhaustive()
    }
}

impl<U: Upstreams> Engine<U> {
    /// The engine for `upstreams`. Within a tokio runtime, a task closes idle connections
    /// past their timeout until the engine is dropped.
    pub fn new(upstreams: Arc<U>, settings: Settings) -> Arc<Engine<U>> {
        let engine = Arc::new(Engine {
            upstreams,
            settings: ArcSwap::from_pointee(settings),
            pool: ServerPool::new(),
            stats: Stats::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep_idle(Arc::downgrade(&engine)));
        }
        engine
    }

    /// The balancer behind the engine.
    pub fn upstreams(&self) -> &Arc<U> {
        &self.upstreams
    }

    /// The settings in force.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// New settings (a reload): requests from now on use them.
    pub fn set_settings(&self, settings: Settings) {
        self.settings.store(Arc::new(settings));
    }

    /// The engine's figures, for METRICS.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Each server's pool figures, for METRICS.
    pub fn pool_figures(&self) -> Vec<(U::Server, PoolFigures)> {
        self.pool.figures_all()
    }

    /// Closes `server`'s idle connections and forgets it (it left the balancer); its busy
    /// ones finish their request and close.
    pub fn forget(&self, server: &U::Server) {
        self.pool.forget(server);
    }

    /// Closes every idle connection (a drain).
    pub fn close_idle(&self) {
        self.pool.sweep(Duration::ZERO);
    }
}

/// Closes idle connections past their timeout or closed by their server, every half timeout
/// (10 s at most), until the engine is gone.
async fn sweep_idle<U: Upstreams>(engine: Weak<Engine<U>>) {
    loop {
        let every = match engine.upgrade() {
            Some(engine) => {
                let idle_timeout = engine.settings.load().idle_timeout;
                engine.pool.sweep(idle_timeout);
                (idle_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(10))
            }
            None => return,
        };
        tokio::time::sleep(every).await;
    }
}
