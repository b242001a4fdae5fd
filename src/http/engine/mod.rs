//! The HTTP/1.1 engine that owns its connections: one task per client connection drives
//! each request, its server connection and the answer, over the pure core ([`h1`]). No
//! second task or channel per server connection, no `HeaderMap` or `Request` built per
//! request: heads are parsed in place from a pooled buffer and written on in one vectored
//! write, only the lines that change made anew.
//!
//! A client connection, step by step (its struct's methods, in this folder's files):
//! 1. **Idle**: a kept-alive client waits on its socket's readiness holding no buffer; woken,
//!    it takes one from the worker's pool ([`buffers`]) and reads, and gives it back at once
//!    when nothing came. The task's future is small: the request's work is a boxed future
//!    made when bytes arrive.
//! 2. **Head** (`client`): parsed as it arrives within `HTTP_REQUEST_TIMEOUT` (from the
//!    connection's start, or the end of the last answer); one the core refuses is answered
//!    with the broker's page saying why (414, 431, 400, 501, 505), and the connection closes.
//! 3. **Route** (`exchange`): the balancer's own answer (a query), a method the broker does
//!    not pass on (CONNECT, TRACE), an `OPTIONS` the broker is the last recipient of, or on
//!    to a server.
//! 4. **Tries** (`forward`): the balancer chooses, a pooled connection of this worker or a
//!    new one; the head rewritten and sent with the body's first bytes; the body passed on
//!    while the server is watched for an early answer; interim answers passed to the client
//!    (`awaiting`); a pooled connection the server closed as it was reused is tried once
//!    more on a new one, an idempotent request without a body on the next server with
//!    `HTTP_RETRY_IDEMPOTENT`; else a 502, 503 or 504 page.
//! 5. **Answer** (`answer`): the head rewritten for the client (`HTTP/1.1`, `Connection` as
//!    decided, the balancer's `Set-Cookie`), the body passed as its framing says (`pump`:
//!    bounded buffers, splice for a long rest between plain sockets), each side's silence
//!    bounded; an upgrade becomes a tunnel (the relay). Then [`h1::reuse`] decides, once,
//!    whether the server connection goes back to the pool ([`pool`]) and whether the client
//!    sends another request (bytes left in its buffer are that request, pipelined).
//!
//! A drain (the `closing` token) makes each connection's next answer say `Connection:
//! close`: no connection is closed while its client may be sending a request, since a client
//! reusing its connection just then would get no answer at all. Waiting for that request
//! costs the drain at most `HTTP_REQUEST_TIMEOUT`, within `SHUTDOWN_TIMEOUT`; the only close a
//! client can meet is the one it meets any day when its kept-alive connection times out.
//!
//! - [`buffers`]: the per-worker pool of buffers, in two tiers.
//! - `pool`: the idle server connections, per server and worker.
//! - `client`: a client connection's loop, its idle wait and its head.
//! - `exchange`: one request's state, its routing and its accounting.
//! - `forward`: the tries: choose, connect, retry.
//! - `send`: one request sent to a server: its head rewritten, its body passed on, the
//!   answer's head awaited.
//! - `awaiting`: the server's side until the final head, interim answers passed on.
//! - `answer`: the answer on its way, the reuse decided, the tunnel.
//! - `pump`: a body passing through, bounded, spliced when long; each side's silence.
//! - `own`: the broker's own answers as bytes.
//!
//! [`h1`]: crate::http::h1
//! [`h1::reuse`]: crate::http::h1::reuse

mod answer;
mod awaiting;
pub mod buffers;
mod client;
mod exchange;
mod forward;
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
