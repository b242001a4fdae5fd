//! The broker as a library: bind every balancer's port (or take listeners bound elsewhere),
//! start serving, follow the broker's [events](crate::balancer::events), read a balancer's
//! state, reload a configuration and get its result, and stop. The binary installs the log and
//! the signal handlers around it; a test starts as many brokers as it likes in one process.
//!
//! A running broker is a control loop on the runtime that started it (reloads, the drain, the
//! monitors) and, on the worker threads, every balancer's accept loops and connections:
//!
//! - `control_loop`: the control loop: reloads applied one at a time, the drain on shutdown.
//! - `running_balancer`: one balancer at run time: its accept loops (on the workers), its
//!   monitor and sampler, the tasks of its connections and the tokens that end them, and a
//!   TCP balancer's query engine.
//! - `handoff`: what the accept loops hand each connection to: refused at `MAX_CONNECTIONS`,
//!   made secure once as its port's TLS says, then given to the TCP client or the HTTP engine
//!   by the balancer's kind.
//! - `reload`: a reload applied without touching established connections.
//! - [`monitor`]: the monitor's rounds: check every server, count fall and rise, hand the
//!   results to the balancer.
//!
//! Beside the balancers it starts the alerts and restarts ([`crate::alerts`]), which read the
//! balancers' alerts and state.

mod control_loop;
mod handoff;
pub mod monitor;
mod reload;
mod running_balancer;

pub use running_balancer::check_certificate;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::alerts::Alerting;
use crate::balancer::events::{Events, Reloaded, Subscription};
use crate::balancer::shared::Shared;
use crate::balancer::{Balancer, BalancerState};
use crate::config::{BalancerKind, Config, LoadError};
use crate::http_balancer::sessions::{OwnSecret, SessionSecrets};
use crate::net::listener::{self, BindError};
use crate::net::resolve::Resolver;
use crate::net::workers::{WorkerThreads, Workers};
use crate::query::Operators;
use crate::support::budget::Budget;
use crate::support::clock::{time_of_day, wall_ms};
use crate::support::shutdown::Shutdown;
use control_loop::ControlLoop;
use running_balancer::RunningBalancer;

/// Why a broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The worker threads could not be started.
    #[error("cannot start the worker threads")]
    Threads(#[source] std::io::Error),
    /// A port could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
}

/// Why a reload was rejected; the running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file could not be read, or holds errors.
    #[error(transparent)]
    Invalid(LoadError),
    /// Reading the file failed on its thread.
    #[error("reading the file failed ({0})")]
    Read(String),
    /// A balancer's certificate, key or CA bundle does not load (it changed after the file
    /// was checked, or the configuration was given by a program): every finding, one a line.
    #[error("{0}")]
    Tls(String),
    /// This broker reloads no file (see [`Bound::refuse_file_reloads`]): why, in words.
    #[error("{0}")]
    Refused(String),
    /// The broker has stopped.
    #[error("the broker has stopped")]
    Stopped,
}

impl ReloadError {
    /// Every message, one per line, as logged.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ReloadError::Invalid(e) => e.report().lines().map(|l| l.trim().to_string()).collect(),
            other => other.to_string().lines().map(str::to_string).collect(),
        }
    }
}

/// What a reload applies.
enum Source {
    /// The configuration file, read again.
    File,
    /// A configuration given (validated already).
    Config(Box<Config>),
}

/// What the handle asks of the control loop.
enum ControlCommand {
    /// Apply a configuration; answer on `reply` when given.
    Reload {
        source: Source,
        reply: Option<oneshot::Sender<Result<Reloaded, ReloadError>>>,
    },
}

/// A broker with every listener bound, not serving yet: subscribe to its events now to miss
/// none of them, then [`Bound::start`] it.
pub struct Bound {
    config: Config,
    workers: Workers,
    /// The worker threads, when the broker started its own.
    threads: Option<WorkerThreads>,
    bound: Vec<(Arc<Balancer>, Vec<StdListener>)>,
    /// Shared by every balancer: the cache and the bound on lookups are the process's.
    resolver: Arc<Resolver>,
    events: Events,
    /// The secret of the session cookies when `SESSION_SECRET` is not set; `None`: one made
    /// for this run at the start.
    own_secret: Option<OwnSecret>,
    /// The state file the page of actions writes after each action, as `ctl` does.
    state_file: Option<std::path::PathBuf>,
    /// Why the file is not read again on a reload, when it is not.
    no_file_reload: Option<String>,
    /// The broker this one replaces, when its supervisor started it to.
    takes_over: Option<u32>,
}

/// A running broker. Dropping it stops everything at once (connections cut); [`Broker::stop`]
/// drains first, as a SIGTERM does.
pub struct Broker {
    /// What every connection reads, which the handle reads too: the balancers, the
    /// configuration.
    shared: Arc<Shared>,
    events: Events,
    control: Control,
    /// The addresses the balancers listen on, in configuration order.
    addrs: Arc<ArcSwap<Vec<(BalancerKind, SocketAddr)>>>,
    /// The control loop; `None` once it has ended.
    task: Option<JoinHandle<()>>,
    threads: Option<WorkerThreads>,
    /// Cancelled when the handle is dropped.
    stopping: CancellationToken,
}

/// What the signal handlers (or an administration interface) need of a running broker:
/// cheap to clone, usable from any task.
#[derive(Debug, Clone)]
pub struct Control {
    commands: mpsc::Sender<ControlCommand>,
    /// What the administration reads and acts on: the balancers, the configuration and the
    /// shutdown state.
    shared: Arc<Shared>,
    /// The alerts and restarts (`ctl restart`).
    alerting: Alerting,
}

impl std::fmt::Debug for ControlCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlCommand::Reload")
    }
}

impl Control {
    /// Every balancer running now, in configuration order.
    pub fn balancers(&self) -> Arc<Vec<Arc<Balancer>>> {
        self.shared.balancers.load_full()
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.shared.config.load_full()
    }

    /// `ctl restart`: `RESTART_COMMAND` for `server` of `balancer` now, asked by `by`, within
    /// its bounds (the cooldown left out when `force`); what it came to, or why not.
    pub async fn restart(
        &self,
        balancer: &Arc<Balancer>,
        server: &Arc<crate::balancer::Server>,
        force: bool,
        by: &str,
    ) -> Result<crate::balancer::Restarted, String> {
        self.alerting.restart(balancer, server, force, by).await
    }

    /// True once a shutdown has been asked for (the broker drains, then stops).
    pub fn is_stopping(&self) -> bool {
        self.shared.shutdown.is_requested()
    }

    /// Asks for a graceful shutdown (the drain of SIGTERM).
    pub fn shutdown(&self) {
        self.shared.shutdown.request();
    }

    /// The shutdown state the broker drains on, for a signal handler.
    pub fn shutdown_state(&self) -> Shutdown {
        self.shared.shutdown.clone()
    }

    /// Asks for the configuration file to be read again and applied (SIGHUP); the result is
    /// logged and published as an event.
    pub fn reload_file_later(&self) {
        let command = ControlCommand::Reload {
            source: Source::File,
            reply: None,
        };
        // A reload already waiting will read the file as it is then: this one adds nothing.
        let _ = self.commands.try_send(command);
    }

    /// Reads the configuration file again and applies it; its result.
    pub async fn reload_file(&self) -> Result<Reloaded, ReloadError> {
        self.ask(Source::File).await
    }

    /// Applies `config` (validated already); what changed, or `Stopped` when the broker has.
    pub async fn reload(&self, config: Config) -> Result<Reloaded, ReloadError> {
        self.ask(Source::Config(Box::new(config))).await
    }

    async fn ask(&self, source: Source) -> Result<Reloaded, ReloadError> {
        let (reply, answer) = oneshot::channel();
        let command = ControlCommand::Reload {
            source,
            reply: Some(reply),
        };
        if self.commands.send(command).await.is_err() {
            return Err(ReloadError::Stopped);
        }
        answer.await.unwrap_or(Err(ReloadError::Stopped))
    }
}

/// Reloads waiting to be applied at most; a SIGHUP storm adds nothing past them.
const PENDING_RELOADS: usize = 4;

impl Broker {
    /// Binds every balancer's port, or none: a port that cannot be bound stops the start.
    /// Connections will be served on `workers`.
    pub fn bind(config: Config, workers: Workers) -> Result<Bound, BindError> {
        let mut listeners = Vec::with_capacity(config.balancers.len());
        for b in &config.balancers {
            listeners.push(listener::bind(b, workers.listeners_per_balancer())?);
        }
        Ok(Broker::on_listeners(config, workers, listeners))
    }

    /// A broker on listeners bound elsewhere (inherited from a previous process, say), one
    /// set per balancer of `config`, in its order.
    pub fn on_listeners(
        config: Config,
        workers: Workers,
        listeners: Vec<Vec<StdListener>>,
    ) -> Bound {
        let resolver = Arc::new(Resolver::new(config.general.dns_max_lookups as usize));
        let events = Events::default();
        let bound: Vec<(Arc<Balancer>, Vec<StdListener>)> = config
            .balancers
            .iter()
            .zip(listeners)
            .map(|(b, listeners)| {
                let balancer = Balancer::new(b.clone(), Arc::clone(&resolver), events.clone());
                (Arc::new(balancer), listeners)
            })
            .collect();
        let listening = bound
            .iter()
            .filter_map(|(_, l)| l.first()?.local_addr().ok())
            .collect();
        resolver.set_listening(listening);
        Bound {
            config,
            workers,
            threads: None,
            bound,
            resolver,
            events,
            own_secret: None,
            state_file: None,
            no_file_reload: None,
            takes_over: None,
        }
    }

    /// Starts a broker on `config` with worker threads of its own (`WORKERS`), serving at
    /// once. No log subscriber and no signal handler is installed: several brokers may run in
    /// one process. Must be called within a tokio runtime, which runs the control work.
    pub fn start(config: Config) -> Result<Broker, StartError> {
        Ok(Broker::bind_own(config)?.start())
    }

    /// As [`Broker::bind`], with worker threads of its own (`WORKERS`), stopped with it.
    pub fn bind_own(config: Config) -> Result<Bound, StartError> {
        let threads =
            WorkerThreads::start(config.general.workers as usize).map_err(StartError::Threads)?;
        let mut bound = Broker::bind(config, threads.workers())?;
        bound.threads = Some(threads);
        Ok(bound)
    }

    /// The addresses the balancers listen on now, in configuration order.
    pub fn addrs(&self) -> Vec<(BalancerKind, SocketAddr)> {
        self.addrs.load().to_vec()
    }

    /// The address `kind` listens on now.
    pub fn addr(&self, kind: BalancerKind) -> Option<SocketAddr> {
        self.addrs
            .load()
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, a)| *a)
    }

    /// The broker's events from now on.
    pub fn subscribe(&self) -> Subscription {
        self.events.subscribe()
    }

    /// The live state of balancer `kind` (counters, servers, quarantines).
    pub fn state(&self, kind: BalancerKind) -> Option<BalancerState> {
        let balancers = self.shared.balancers.load();
        balancers
            .iter()
            .find(|b| b.kind() == kind)
            .map(|b| b.state())
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.shared.config.load_full()
    }

    /// A handle for signal handlers and administration.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Applies `config` (validated already); what changed (a listen address that cannot be
    /// bound is in its errors, and the old one stays), or `Stopped` when the broker has.
    pub async fn reload(&self, config: Config) -> Result<Reloaded, ReloadError> {
        self.control.reload(config).await
    }

    /// Reads the configuration file again and applies it; its result.
    pub async fn reload_file(&self) -> Result<Reloaded, ReloadError> {
        self.control.reload_file().await
    }

    /// Asks for a graceful shutdown: `SHUTDOWN_GRACE`, then the listeners close and
    /// connections have `SHUTDOWN_TIMEOUT` to finish.
    pub fn shutdown(&self) {
        self.control.shutdown();
    }

    /// Completes when the broker has stopped (after a shutdown and its drain).
    pub async fn stopped(&mut self) {
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Shuts down gracefully, waits for the drain, and stops the worker threads it started.
    pub async fn stop(mut self) {
        self.shutdown();
        self.stopped().await;
        if let Some(threads) = self.threads.take() {
            let _ = tokio::task::spawn_blocking(move || threads.stop()).await;
        }
    }
}

impl Bound {
    /// The addresses the balancers listen on, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.bound
            .iter()
            .filter_map(|(_, l)| l.first()?.local_addr().ok())
            .collect()
    }

    /// The balancers, before they serve: overrides kept over a restart are applied here.
    pub fn balancers(&self) -> Vec<Arc<Balancer>> {
        self.bound.iter().map(|(b, _)| Arc::clone(b)).collect()
    }

    /// The broker's events, from before it starts.
    pub fn subscribe(&self) -> Subscription {
        self.events.subscribe()
    }

    /// The secret that signs the session cookies while `SESSION_SECRET` is not set: the one
    /// kept beside the state file (`admin::session_secret::keep`). Without it, a secret made
    /// for this run signs them, and sessions move when the broker starts again.
    pub fn with_own_secret(mut self, own: OwnSecret) -> Bound {
        self.own_secret = Some(own);
        self
    }

    /// The state file (`STATE_FILE`) the status page's actions keep their changes in, as
    /// `appbroker ctl`'s are kept (`None`: not kept).
    pub fn keeping_state_in(mut self, path: Option<std::path::PathBuf>) -> Bound {
        self.state_file = path;
        self
    }

    /// Refuses every reload of the file (SIGHUP, `ctl reload`) with `why`: for a
    /// configuration no file holds as it runs (the demo's built-in example, or a file whose
    /// listening addresses the demo replaced). A configuration given to [`Broker::reload`] is
    /// still applied.
    pub fn refuse_file_reloads(mut self, why: String) -> Bound {
        self.no_file_reload = Some(why);
        self
    }

    /// Starts this broker as the one that replaces broker `pid` on the ports their supervisor
    /// holds (an upgrade, or a reload that moved the ports): it sends no `broker_started`,
    /// since the ports never stopped being served; the supervisor tells of an upgrade.
    pub fn taking_over(mut self, pid: u32) -> Bound {
        self.takes_over = Some(pid);
        self
    }

    /// Starts serving: every balancer's accept loops (on the workers), monitor and sampler,
    /// and the control loop (on the current runtime).
    pub fn start(self) -> Broker {
        let own = self
            .own_secret
            .unwrap_or_else(|| OwnSecret::for_this_run("no secret file was given"));
        let session_secrets = Arc::new(SessionSecrets::new(own, &self.config.general));
        log_session_secret(&session_secrets, &self.config);
        let general = &self.config.general;
        let operators = Arc::new(Operators::new(
            general,
            session_secrets.in_force(general),
            self.state_file,
        ));
        let head_memory = Budget::new(self.config.general.http_head_memory);
        let shared = Arc::new(Shared {
            config: ArcSwap::from_pointee(self.config),
            balancers: ArcSwap::from_pointee(
                self.bound.iter().map(|(b, _)| Arc::clone(b)).collect(),
            ),
            started_wall_ms: wall_ms(),
            shutdown: Shutdown::new(),
            head_memory,
        });
        let stopping = CancellationToken::new();
        // Before anything runs: the first alert is the start.
        let alerting = Alerting::start(Arc::clone(&shared), &self.events, stopping.clone());
        operators.restart_with(alerting.restarter());
        let serving: Vec<RunningBalancer> = self
            .bound
            .into_iter()
            .map(|(balancer, listeners)| {
                RunningBalancer::start(
                    balancer,
                    listeners,
                    &shared,
                    &session_secrets,
                    &operators,
                    &self.workers,
                    &stopping,
                )
            })
            .collect();
        let addrs = Arc::new(ArcSwap::from_pointee(addresses(&serving)));
        let (commands, receiver) = mpsc::channel(PENDING_RELOADS);
        let control_loop = ControlLoop {
            shared: Arc::clone(&shared),
            session_secrets,
            operators,
            workers: self.workers,
            resolver: self.resolver,
            events: self.events.clone(),
            serving,
            retired: Vec::new(),
            stopping: stopping.clone(),
            addrs: Arc::clone(&addrs),
            no_file_reload: self.no_file_reload,
            alerting: alerting.clone(),
            takes_over: self.takes_over,
        };
        Broker {
            events: self.events,
            control: Control {
                commands,
                shared: Arc::clone(&shared),
                alerting,
            },
            shared,
            addrs,
            task: Some(tokio::spawn(control_loop.run(receiver))),
            threads: self.threads,
            stopping,
        }
    }
}

/// Which secret signs the session cookies, and until when the cookies of the version before
/// are honoured: logged at start when the file has an HTTP balancer (a TCP one has no use for
/// either).
fn log_session_secret(secrets: &SessionSecrets, config: &Config) {
    if !config.balancers.iter().any(|b| b.kind.is_http()) {
        return;
    }
    let described = secrets.describe(&config.general);
    if described.warn {
        warn!("{}", described.line);
    } else {
        info!("{}", described.line);
    }
    let now = wall_ms();
    for b in config.balancers.iter().filter(|b| b.kind.is_http()) {
        let timeout = b.http.session_timeout.as_millis() as u64;
        let open_until = |since: Option<u64>| {
            since
                .map(|s| s.saturating_add(timeout))
                .filter(|&u| u > now)
        };
        if let Some(until) = open_until(secrets.since_wall_ms()) {
            info!(
                "{}: until {} (one SESSION_TIMEOUT after the first start that signed session cookies), an unsigned cookie naming a server that takes new clients is honoured and signed anew",
                b.kind,
                time_of_day(until)
            );
        }
        if let Some(until) = open_until(secrets.bound_since_wall_ms()) {
            info!(
                "{}: until {} (one SESSION_TIMEOUT after this build's first start), a session cookie of the earlier form, not bound to its balancer, is honoured and bound anew; after that only cookies bound to [{}] count here",
                b.kind,
                time_of_day(until),
                b.kind.section()
            );
        }
    }
}

/// Where the `serving` balancers listen, in their order.
fn addresses(serving: &[RunningBalancer]) -> Vec<(BalancerKind, SocketAddr)> {
    serving
        .iter()
        .map(|r| (r.balancer.kind(), r.listen))
        .collect()
}

impl Drop for Broker {
    fn drop(&mut self) {
        // Connections are cut, monitors and accept loops stop; the worker threads end on
        // their own (joining them here would block the runtime that drops the handle).
        self.stopping.cancel();
        if let Some(threads) = self.threads.take() {
            threads.detach();
        }
    }
}
