//! The broker's shared state, handed to every task that serves a connection: the running
//! configuration, every balancer, when the broker started, its shutdown state, and how a
//! balancer tells its connections to end. Data only: the logic lives with its owners.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use crate::balancer::Balancer;
use crate::config::Config;
use crate::support::budget::Budget;
use crate::support::shutdown::Shutdown;

/// What every connection's task shares and may read: the configuration, every balancer (a
/// query links to the others), the start time, and the shutdown state (PING answers 503 while
/// draining).
#[derive(Debug)]
pub struct Shared {
    /// The running configuration (swapped by a reload).
    pub config: ArcSwap<Config>,
    /// Every balancer of the process, in configuration order (swapped by a reload).
    pub balancers: ArcSwap<Vec<Arc<Balancer>>>,
    /// When the broker started, wall ms.
    pub started_wall_ms: u64,
    /// Draining state for PING.
    pub shutdown: Shutdown,
    /// `HTTP_HEAD_MEMORY`: the one budget of every HTTP balancer's request heads still
    /// arriving (its limit set again by a reload).
    pub head_memory: Arc<Budget>,
}

/// How a balancer tells its connections to end.
#[derive(Debug, Clone, Default)]
pub struct EndSignals {
    /// Cancelled when the listener closes: a query connection answers the request in hand
    /// and closes; clients carry on.
    pub closing: CancellationToken,
    /// Cancelled when `SHUTDOWN_TIMEOUT` is over or the balancer is removed: everything ends
    /// at once.
    pub cut: CancellationToken,
}
