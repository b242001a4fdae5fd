//! The broker at run time: every balancer with the tasks that serve it (accept loop, monitor,
//! sampler, connections), started together, reconfigured on SIGHUP, and drained on shutdown.
//!
//! A reload reads the file again and applies it without touching established connections:
//! servers are matched by identity (id and `host:port`) so their quarantine state and counters
//! survive, a changed listen address is bound before the old listener closes, a new balancer
//! section starts, and a removed one drains like a shutdown. An invalid file changes nothing.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, warn};

use crate::balancer::Balancer;
use crate::clock::wall_ms;
use crate::config::{self, BalancerConfig, Config, plural, show_duration};
use crate::context::{Context, Ending};
use crate::listener::{self, BindError};
use crate::resolve::Resolver;
use crate::shutdown::Shutdown;
use crate::workers::Workers;
use crate::{logging, monitor};

/// A broker with every listener bound, ready to run.
pub struct Broker {
    config: Config,
    workers: Workers,
    bound: Vec<(Arc<Balancer>, Vec<StdListener>)>,
    /// Shared by every balancer: the cache and the bound on lookups are the process's.
    resolver: Arc<Resolver>,
}

/// One balancer at run time.
struct Running {
    balancer: Arc<Balancer>,
    /// The address its listener is bound to (as configured).
    listen: SocketAddr,
    /// Its connections, waited for on shutdown or removal.
    tasks: TaskTracker,
    /// Ends its relays when draining is over.
    cut: CancellationToken,
    /// Stops its monitor and sampler.
    stop_background: CancellationToken,
    /// Its accept loops; `None` once stopped.
    accepting: Option<Accepting>,
}

/// A balancer's accept loops, one per listening socket (one per worker where the kernel
/// spreads connections), and the token that stops them.
struct Accepting {
    stop: CancellationToken,
    loops: Vec<JoinHandle<()>>,
}

impl Accepting {
    /// Stops every loop and waits until each has served what its listener had queued and
    /// closed it.
    async fn stop(self) {
        self.stop.cancel();
        for accept_loop in self.loops {
            let _ = accept_loop.await;
        }
    }
}

impl Broker {
    /// Binds every balancer's port, or none: a port that cannot be bound stops the start.
    /// Connections will be served on `workers`.
    pub fn bind(config: Config, workers: Workers) -> Result<Broker, BindError> {
        let resolver = Arc::new(Resolver::new(config.general.dns_max_lookups as usize));
        let mut bound = Vec::new();
        for b in &config.balancers {
            let listeners = listener::bind(b, workers.listeners_per_balancer())?;
            let balancer = Balancer::new(b.clone(), Arc::clone(&resolver));
            bound.push((Arc::new(balancer), listeners));
        }
        resolver.set_listening(config.balancers.iter().map(|b| b.listen).collect());
        Ok(Broker {
            config,
            workers,
            bound,
            resolver,
        })
    }

    /// The addresses the balancers listen on, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.bound
            .iter()
            .filter_map(|(_, l)| l.first()?.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` is requested, reloading the configuration file each time
    /// `reload` is notified; then drains: keeps serving for `SHUTDOWN_GRACE`, closes the
    /// listeners, lets connections finish for up to `SHUTDOWN_TIMEOUT`, cuts the rest.
    pub async fn run(self, shutdown: Shutdown, reload: Arc<Notify>) {
        let ctx = Arc::new(Context {
            config: ArcSwap::from_pointee(self.config),
            balancers: ArcSwap::from_pointee(
                self.bound.iter().map(|(b, _)| Arc::clone(b)).collect(),
            ),
            started_wall_ms: wall_ms(),
            shutdown: shutdown.clone(),
        });
        let workers = self.workers;
        let resolver = self.resolver;
        let mut running: Vec<Running> = self
            .bound
            .into_iter()
            .map(|(balancer, listeners)| start(balancer, listeners, &ctx, &workers))
            .collect();
        let mut retired: Vec<Running> = Vec::new();
        info!("broker ready");

        loop {
            tokio::select! {
                _ = shutdown.requested() => break,
                _ = reload.notified() => {
                    reload_config(&ctx, &workers, &resolver, &mut running, &mut retired).await;
                }
            }
        }

        let general = ctx.config.load().general.clone();
        shutdown.set_draining();
        if !general.shutdown_grace.is_zero() {
            info!(
                "draining: still serving for SHUTDOWN_GRACE ({}) while PING answers 503",
                show_duration(general.shutdown_grace)
            );
            tokio::time::sleep(general.shutdown_grace).await;
        }
        running.append(&mut retired);
        for unit in &mut running {
            stop_accepting(unit).await;
        }
        let open: usize = running.iter().map(|u| u.tasks.len()).sum();
        if open > 0 {
            info!(
                "listeners closed; waiting up to {} for {} to finish",
                show_duration(general.shutdown_timeout),
                plural(open, "connection")
            );
        } else {
            info!("listeners closed");
        }
        let all_done = async {
            for unit in &running {
                unit.tasks.wait().await;
            }
        };
        if tokio::time::timeout(general.shutdown_timeout, all_done)
            .await
            .is_err()
        {
            let open: usize = running.iter().map(|u| u.tasks.len()).sum();
            warn!(
                "SHUTDOWN_TIMEOUT ({}) is over: cutting {} still open",
                show_duration(general.shutdown_timeout),
                plural(open, "connection")
            );
            for unit in &running {
                unit.cut.cancel();
            }
            // Cut relays end at their next poll; this only waits for their closing log lines.
            let all_cut = async {
                for unit in &running {
                    unit.tasks.wait().await;
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), all_cut).await;
        }
        for unit in &running {
            unit.stop_background.cancel();
        }
        info!("broker stopped");
    }
}

/// Starts a balancer's accept loops (on the workers), monitor and sampler.
fn start(
    balancer: Arc<Balancer>,
    listeners: Vec<StdListener>,
    ctx: &Arc<Context>,
    workers: &Workers,
) -> Running {
    let pool = balancer.pool();
    let c = &pool.config;
    info!(
        "{} listening on {} for {}, policy {}, monitor {} every {}, quarantine {}",
        c.kind,
        c.listen,
        plural(c.servers.len(), "server"),
        c.sort_method.as_str(),
        c.monitoring.as_str(),
        show_duration(c.monitor_interval),
        show_duration(c.quarantine_time),
    );
    let stop_background = CancellationToken::new();
    tokio::spawn(
        monitor::run(Arc::clone(&balancer), stop_background.clone()).instrument(balancer.span()),
    );
    tokio::spawn(sample_every_minute(
        Arc::clone(&balancer),
        stop_background.clone(),
    ));
    let tasks = TaskTracker::new();
    let cut = CancellationToken::new();
    let accepting = Some(spawn_accept_loops(
        &balancer, listeners, ctx, workers, &tasks, &cut,
    ));
    Running {
        listen: c.listen,
        balancer,
        tasks,
        cut,
        stop_background,
        accepting,
    }
}

/// Samples each server's active connections once a minute (for the STATUS chart) until
/// `stop` is cancelled.
async fn sample_every_minute(balancer: Arc<Balancer>, stop: CancellationToken) {
    loop {
        balancer.sample();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
}

/// Starts one accept loop per listening socket, each on its own worker.
fn spawn_accept_loops(
    balancer: &Arc<Balancer>,
    listeners: Vec<StdListener>,
    ctx: &Arc<Context>,
    workers: &Workers,
    tasks: &TaskTracker,
    cut: &CancellationToken,
) -> Accepting {
    let stop = CancellationToken::new();
    let span = balancer.span();
    let handles = workers.handles();
    let loops = listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| {
            let (balancer, ctx, tasks, stop, cut) = (
                Arc::clone(balancer),
                Arc::clone(ctx),
                tasks.clone(),
                stop.clone(),
                cut.clone(),
            );
            let accept = async move {
                // Registered with the worker's own reactor, so it must be made there.
                match TcpListener::from_std(listener) {
                    Ok(listener) => {
                        let ending = Ending { closing: stop, cut };
                        listener::accept_loop(listener, balancer, ctx, tasks, ending).await
                    }
                    Err(e) => error!("cannot start accepting: {}", crate::os_error::words(&e)),
                }
            };
            handles[index % handles.len()].spawn(accept.instrument(span.clone()))
        })
        .collect();
    Accepting { stop, loops }
}

/// Stops a balancer's accept loops and waits until its listeners are closed.
async fn stop_accepting(unit: &mut Running) {
    if let Some(accepting) = unit.accepting.take() {
        accepting.stop().await;
    }
    unit.tasks.close();
}

/// Reads the configuration file again and applies it; an invalid file changes nothing.
async fn reload_config(
    ctx: &Arc<Context>,
    workers: &Workers,
    resolver: &Arc<Resolver>,
    running: &mut Vec<Running>,
    retired: &mut Vec<Running>,
) {
    // Removed balancers whose last connection has ended need no more waiting for.
    retired.retain(|unit| !unit.tasks.is_empty());
    let old = ctx.config.load_full();
    let path = old.source.clone();
    info!("reloading {}", path.display());
    // Read on a blocking thread: this thread also handles signals and runs the monitors,
    // and a file on a hung network share would stop them all.
    let reading = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || Config::from_path(&path))
    };
    let read = match reading.await {
        Ok(read) => read,
        Err(e) => {
            error!(
                "reload rejected: reading the file failed ({e}); the running configuration stays"
            );
            return;
        }
    };
    let loaded = match read {
        Ok(loaded) => loaded,
        Err(e) => {
            for line in e.report().lines() {
                error!("{}", line.trim());
            }
            error!("reload rejected: the running configuration stays");
            return;
        }
    };
    let file = path.display().to_string();
    for notice in &loaded.notices {
        warn!("{}", notice.located(&file));
    }
    let mut config = loaded.config;
    if logging::settings_differ(&old.general, &config.general) {
        warn!("the [General] logging keys changed; they take effect when appbroker is restarted");
    }
    if old.general.workers != config.general.workers {
        warn!("WORKERS changed; it takes effect when appbroker is restarted");
    }

    let mut changes: Vec<String> = config::setting_changes(
        "[General]",
        &old.general_settings(),
        &config.general_settings(),
    );
    // Balancers gone from the file go first: their ports may be taken by others in this
    // same reload (a section renamed, a balancer moved onto a freed port).
    let (mut stay, gone): (Vec<Running>, Vec<Running>) = std::mem::take(running)
        .into_iter()
        .partition(|u| config.balancers.iter().any(|b| b.kind == u.balancer.kind()));
    for mut unit in gone {
        let kind = unit.balancer.kind();
        stop_accepting(&mut unit).await;
        unit.stop_background.cancel();
        let timeout = config.general.shutdown_timeout;
        info!(
            "{kind} removed: listener closed; its {} may take up to {} to finish",
            plural(unit.tasks.len(), "connection"),
            show_duration(timeout)
        );
        let (tasks, cut) = (unit.tasks.clone(), unit.cut.clone());
        tokio::spawn(async move {
            if tokio::time::timeout(timeout, tasks.wait()).await.is_err() {
                warn!(
                    "{kind} removed: cutting {} still open",
                    plural(tasks.len(), "connection")
                );
                cut.cancel();
            }
        });
        changes.push(format!("{kind} removed"));
        retired.push(unit);
    }
    // Then the balancers that stay: moved listeners (before new ones may need their old
    // ports), new settings and servers.
    for b in &mut config.balancers {
        if let Some(unit) = stay.iter_mut().find(|u| u.balancer.kind() == b.kind) {
            if unit.listen != b.listen {
                changes.push(move_listener(ctx, workers, unit, b).await);
            }
            changes.extend(unit.balancer.reconfigure(b.clone()));
        }
    }
    // Last, the new ones.
    for b in &config.balancers {
        if stay.iter().any(|u| u.balancer.kind() == b.kind) {
            continue;
        }
        match listener::bind(b, workers.listeners_per_balancer()) {
            Ok(listeners) => {
                let balancer = Arc::new(Balancer::new(b.clone(), Arc::clone(resolver)));
                stay.push(start(balancer, listeners, ctx, workers));
                changes.push(format!("{} added", b.kind));
            }
            Err(e) => {
                error!("{e}; {} is not started", b.kind);
                changes.push(format!(
                    "{} not started (cannot listen on {})",
                    b.kind, b.listen
                ));
            }
        }
    }
    // Running in configuration order, as the pages list them.
    stay.sort_by_key(|u| {
        config
            .balancers
            .iter()
            .position(|b| b.kind == u.balancer.kind())
    });
    let kept = stay;
    // Only balancers that run are in the configuration the pages show.
    config
        .balancers
        .retain(|b| kept.iter().any(|u| u.balancer.kind() == b.kind));
    *running = kept;
    resolver.set_listening(running.iter().map(|u| u.listen).collect());
    resolver.set_max_lookups(config.general.dns_max_lookups as usize);
    ctx.balancers.store(Arc::new(
        running.iter().map(|u| Arc::clone(&u.balancer)).collect(),
    ));
    ctx.config.store(Arc::new(config));
    if changes.is_empty() {
        info!("configuration reloaded: nothing changed");
    } else {
        info!("configuration reloaded: {}", changes.join("; "));
    }
}

/// Binds the balancer's new listen address, starts accepting there, then closes the old
/// listener. When the new address cannot be bound, the old one stays (and `config` says so).
/// Returns what happened, for the reload's summary line.
async fn move_listener(
    ctx: &Arc<Context>,
    workers: &Workers,
    unit: &mut Running,
    config: &mut BalancerConfig,
) -> String {
    match listener::bind(config, workers.listeners_per_balancer()) {
        Ok(listeners) => {
            let new = spawn_accept_loops(
                &unit.balancer,
                listeners,
                ctx,
                workers,
                &unit.tasks,
                &unit.cut,
            );
            if let Some(old) = unit.accepting.replace(new) {
                old.stop().await;
            }
            let moved = format!(
                "{} now listens on {} (was {})",
                config.kind, config.listen, unit.listen
            );
            info!("{moved}");
            unit.listen = config.listen;
            moved
        }
        Err(e) => {
            error!("{e}; {} keeps listening on {}", config.kind, unit.listen);
            let kept = format!(
                "{} still listens on {} (cannot listen on {})",
                config.kind, unit.listen, config.listen
            );
            config.listen = unit.listen;
            kept
        }
    }
}
