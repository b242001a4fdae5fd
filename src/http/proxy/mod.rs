//! The HTTP engine over hyper: one balancer's client connections served with hyper's server
//! side, each request sent to the server its balancer chooses with hyper's low-level client,
//! over a kept-alive connection of the engine's own pool or a fresh one.
//!
//! This file holds what all of one balancer's connections share: its upstreams, its settings
//! (swapped by a reload), its idle server connections and its figures; a connection given back
//! to the pool once its exchange went whole, and the idle sweep.
//!
//! - `serve`: one client connection and each request's way: refused, answered here, or
//!   forwarded, and the answer (the server's, or the broker's own page) on its way back.
//! - `attempt`: a request's tries: choose, take a pooled connection or dial one, send, retry
//!   what may be retried; how a try failed.
//! - `finish`: a request's end-of-answer accounting: its outcome, the connection given back
//!   when both ways went whole, the exchange reported.
//! - `idle`: the kept-alive connections to each server, per worker thread (the pool), bounded
//!   and idle-timed.
//! - `body`: bodies streamed both ways, counted, each side's silence bounded, with `Expect:
//!   100-continue` held end to end.
//! - `upgrade`: an upgraded connection (WebSocket) relayed both ways.
//! - `io`: the stream wrappers (bytes read ahead, traffic counted).
//! - `head_errors`: hyper's own answer to a head it cannot parse (400, 431) replaced by the
//!   broker's page.

mod attempt;
mod body;
mod finish;
mod head_errors;
mod idle;
mod io;
mod serve;
mod upgrade;

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::Settings;
use super::Upstreams;
use super::stats::Stats;
pub use idle::PoolFigures;
use idle::{Conn, IdleConnections};

/// An HTTP balancer's engine, shared by all its client connections.
pub struct Proxy<U: Upstreams> {
    pub(super) upstreams: Arc<U>,
    pub(super) settings: ArcSwap<Settings>,
    pub(super) idle: IdleConnections<U::Server>,
    pub(super) stats: Stats,
}

impl<U: Upstreams> std::fmt::Debug for Proxy<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("settings", &self.settings.load())
            .finish_non_exhaustive()
    }
}

impl<U: Upstreams> Proxy<U> {
    /// The engine for `upstreams`. Within a tokio runtime, a task closes idle connections
    /// past their timeout until the engine is dropped.
    pub fn new(upstreams: Arc<U>, settings: Settings) -> Arc<Proxy<U>> {
        let proxy = Arc::new(Proxy {
            upstreams,
            settings: ArcSwap::from_pointee(settings),
            idle: IdleConnections::new(),
            stats: Stats::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep_idle(Arc::downgrade(&proxy)));
        }
        proxy
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
        self.idle.figures_all()
    }

    /// Closes `server`'s idle connections and forgets it (it left the balancer); its busy
    /// ones finish their request and close.
    pub fn forget(&self, server: &U::Server) {
        self.idle.forget(server);
    }

    /// Closes every idle connection (a drain).
    pub fn close_idle(&self) {
        self.idle.sweep(Duration::ZERO);
    }

    /// still be flushing the request's last bytes).
    pub(super) fn give_back(self: Arc<Self>, server: U::Server, mut conn: Conn) {
        conn.reused = true;
        if conn.sender.is_ready() {
            let max_idle = self.settings.load().max_idle;
            self.pool_again(&server, conn, max_idle);
            return;
        }
        if conn.sender.is_closed() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let settings = self.settings.load_full();
            let ready = tokio::time::timeout(settings.idle_timeout, conn.sender.ready()).await;
            if matches!(ready, Ok(Ok(()))) {
                self.pool_again(&server, conn, settings.max_idle);
            }
        });
    }

    /// Puts `conn` in `server`'s pool, or closes it when the server has left the balancer
    /// (its slot, made again by this connection's figures, goes with it).
    fn pool_again(&self, server: &U::Server, conn: Conn, max_idle: usize) {
        if self.upstreams.keeps(server) {
            self.idle.put(server, conn, max_idle);
        } else {
            self.idle.forget(server);
        }
    }
}

/// Closes idle connections past their timeout, every half timeout (10 s at most), until the
/// engine is gone.
async fn sweep_idle<U: Upstreams>(proxy: Weak<Proxy<U>>) {
    loop {
        let every = match proxy.upgrade() {
            Some(proxy) => {
                let idle_timeout = proxy.settings.load().idle_timeout;
                proxy.idle.sweep(idle_timeout);
                (idle_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(10))
            }
            None => return,
        };
        tokio::time::sleep(every).await;
    }
}
