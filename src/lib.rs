//! appbroker: a load-balancing TCP broker for application-server fleets (TOTVS Protheus
//! AppServer is the model). It reads an `appserver.ini`, listens on each `[BALANCE_*]` port,
//! relays every client to a chosen server, and keeps failed servers in quarantine.
//!
//! # Layout
//!
//! Data flows one way: accept -> select -> connect (quarantine the failures, try the next)
//! -> relay -> account.
//!
//! - [`config`]: `appserver.ini` to a validated [`config::Config`]; every error names file,
//!   line, section and key; `--check` prints it back.
//! - [`listener`]: binding and the accept loop (never dies; `MAX_CONNECTIONS`).
//! - [`forward`]: one client's way: candidates, connect with timeout, retry, relay, account.
//! - [`select`]: the balancing policies, pure logic.
//! - [`balancer`]: a balancer's live state: servers, counters, the lease that counts a
//!   connection against its server.
//! - [`health`]: quarantine state, the monitor, and their log lines.
//! - [`relay`]: bytes both ways with half-close.
//! - [`query`]: `/TOTVS_BROKER_QUERY` on the balancers' ports: telling queries from clients
//!   (sniff), and the STATUS, CFG, PING, JSON, METRICS and ServerStatus answers.
//! - [`shutdown`]: signals, grace period, drain with a deadline.
//! - [`logging`]: the log line format, console and rotated file.
//! - [`os_error`]: what an OS error means to an operator.
//! - [`demo`]: stand-in echo servers for `appbroker demo`.
//! - [`clock`], [`throttle`], [`sys`]: time, log-rate limiting, the few system calls the
//!   standard library lacks.

pub mod balancer;
pub mod clock;
pub mod config;
pub mod demo;
pub mod forward;
pub mod health;
pub mod listener;
pub mod logging;
pub mod os_error;
pub mod query;
pub mod relay;
pub mod select;
pub mod shutdown;
pub mod sys;
pub mod throttle;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, warn};

use balancer::Balancer;
use config::{Config, show_duration};
pub use listener::BindError;
use shutdown::Shutdown;

/// A broker with every listener bound, ready to run.
pub struct Broker {
    config: Config,
    balancers: Vec<(Arc<Balancer>, TcpListener)>,
}

impl Broker {
    /// Binds every balancer's port, or none: a port that cannot be bound stops the start.
    pub fn bind(config: Config) -> Result<Broker, BindError> {
        let mut balancers = Vec::new();
        for b in &config.balancers {
            let listener = listener::bind(b)?;
            balancers.push((Arc::new(Balancer::new(b.clone())), listener));
        }
        Ok(Broker { config, balancers })
    }

    /// The addresses the balancers listen on, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.balancers
            .iter()
            .filter_map(|(_, l)| l.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` is requested, then drains: keeps serving for `SHUTDOWN_GRACE`,
    /// closes the listeners, lets connections finish for up to `SHUTDOWN_TIMEOUT`, cuts the rest.
    pub async fn run(self, shutdown: Shutdown) {
        let general = &self.config.general;
        let tasks = TaskTracker::new();
        let stop_accepting = CancellationToken::new();
        let cut = CancellationToken::new();
        let stop_monitors = CancellationToken::new();
        let ctx = Arc::new(query::Context {
            config: Arc::new(self.config.clone()),
            balancers: self.balancers.iter().map(|(b, _)| Arc::clone(b)).collect(),
            started_wall_ms: clock::wall_ms(),
            shutdown: shutdown.clone(),
        });
        let mut accept_loops = Vec::new();
        for (balancer, listener) in self.balancers {
            let pool = balancer.pool();
            let c = &pool.config;
            info!(
                "{} listening on {} for {}, policy {}, monitor {} every {}, quarantine {}",
                c.kind,
                c.listen,
                config::plural(c.servers.len(), "server"),
                c.sort_method.as_str(),
                c.monitoring.as_str(),
                show_duration(c.monitor_interval),
                show_duration(c.quarantine_time),
            );
            let span = health::span(c.kind.section());
            tokio::spawn(
                health::run_monitor(Arc::clone(&balancer), stop_monitors.clone())
                    .instrument(span.clone()),
            );
            tokio::spawn(query::sample_every_minute(
                Arc::clone(&balancer),
                stop_monitors.clone(),
            ));
            accept_loops.push(tokio::spawn(
                listener::accept_loop(
                    listener,
                    balancer,
                    Arc::clone(&ctx),
                    tasks.clone(),
                    stop_accepting.clone(),
                    cut.clone(),
                )
                .instrument(span),
            ));
        }
        info!("broker ready");

        shutdown.requested().await;
        shutdown.set_draining();
        if !general.shutdown_grace.is_zero() {
            info!(
                "draining: still serving for SHUTDOWN_GRACE ({}) while PING answers 503",
                show_duration(general.shutdown_grace)
            );
            tokio::time::sleep(general.shutdown_grace).await;
        }
        stop_accepting.cancel();
        for accept_loop in accept_loops {
            let _ = accept_loop.await;
        }
        tasks.close();
        let open = tasks.len();
        if open > 0 {
            info!(
                "listeners closed; waiting up to {} for {} to finish",
                show_duration(general.shutdown_timeout),
                config::plural(open, "connection")
            );
        } else {
            info!("listeners closed");
        }
        if tokio::time::timeout(general.shutdown_timeout, tasks.wait())
            .await
            .is_err()
        {
            warn!(
                "SHUTDOWN_TIMEOUT ({}) is over: cutting {} still open",
                show_duration(general.shutdown_timeout),
                config::plural(tasks.len(), "connection")
            );
            cut.cancel();
            // Cut relays end at their next poll; this only waits for their closing log lines.
            let _ = tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await;
        }
        stop_monitors.cancel();
        info!("broker stopped");
    }
}
