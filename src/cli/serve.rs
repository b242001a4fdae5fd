//! The broker run in this process: the worker threads and the main thread's runtime, the
//! ports bound (or taken from a supervisor), the control socket, the signals, until it stops;
//! with the demo's stand-in servers and console beside it when it is the demo.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use appbroker::broker::Bound;
use appbroker::config::{self, Config};
use appbroker::net::sys;
use appbroker::net::workers::{WorkerThreads, Workers};
use appbroker::support::logging;
use appbroker::support::shutdown::handle_signals;
use appbroker::{Broker, admin, demo};
use tracing::{info, warn};

use super::demo::{DemoRun, DemoStart};
use super::platform;

/// Runs the broker; with `demo`, the demo's stand-in servers and console too.
pub fn run(config: Config, demo: Option<DemoStart>, log: &logging::Log) -> anyhow::Result<()> {
    match sys::raise_open_file_limit() {
        Ok(limit) => info!(
            "open-file limit {limit}: room for about {} clients",
            limit / 2
        ),
        Err(e) => warn!("cannot raise the open-file limit: {e}"),
    }
    let threads = WorkerThreads::start(config.general.workers as usize)
        .context("cannot start the worker threads")?;
    info!(
        "{} serving connections",
        config::plural(threads.workers().handles().len(), "worker thread")
    );
    // The main thread's runtime runs the control work: signals, reloads, monitors, the demo.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let result = runtime.block_on(serve(config, demo, log, &threads));
    // The demo's console may be waiting on standard input, which nothing can cancel: do not
    // wait for it.
    runtime.shutdown_background();
    threads.stop();
    result
}

/// The broker bound, started and served until it stops.
async fn serve(
    config: Config,
    demo: Option<DemoStart>,
    log: &logging::Log,
    threads: &WorkerThreads,
) -> anyhow::Result<()> {
    let mut demo = match demo {
        Some(start) => Some(DemoRun::start(start, &config).await?),
        None => None,
    };
    let (socket_path, state_path) = admin_paths(&config, demo.as_ref());
    // Before the ports: a second broker on the same file says so, rather than that its
    // ports are taken.
    let mut socket = platform::bind_control_socket(socket_path.as_deref(), &config)?;
    let bound = bind(
        config,
        threads.workers(),
        demo.as_ref(),
        state_path.as_deref(),
        log,
    )?;
    // After the `listening on` lines, so the way in is the last thing on the screen.
    if let Some(demo) = &demo {
        demo.introduce();
    }
    let mut broker = bound.start();
    let admin = admin::Admin::new(broker.control(), state_path);
    let supervision = platform::Supervision::take();
    // Before READY: from now on its supervisor's watchdog knows this broker lives.
    supervision.send_heartbeats(threads).await;
    let admin = supervision.admin(admin);
    let serving = platform::serve_control_socket(socket.as_mut(), Arc::new(admin))?;
    supervision.ready(&broker.control().shutdown_state()).await;
    let control = broker.control();
    let shutdown = control.shutdown_state();
    if demo.is_some() {
        tokio::spawn(demo::tell_stopping(shutdown.clone()));
    }
    handle_signals(shutdown, supervision.on_sighup(control))
        .context("cannot install the signal handlers")?;
    if let Some(servers) = demo.as_mut().and_then(|d| d.servers.take()) {
        tokio::spawn(demo::console(servers));
    }
    broker.stopped().await;
    if let Some(task) = serving {
        task.abort();
    }
    // Its file goes with it, then the demo's directory.
    drop(socket);
    drop(demo);
    Ok(())
}

/// The broker bound on the file's ports (or on the listeners a supervisor handed down), its
/// kept state restored, and the log file open.
fn bind(
    config: Config,
    workers: Workers,
    demo: Option<&DemoRun>,
    state_path: Option<&Path>,
    log: &logging::Log,
) -> anyhow::Result<Bound> {
    let mut bound = match platform::inherited(&config)? {
        Some(listeners) => Broker::on_listeners(config, workers, listeners),
        None => Broker::bind(config, workers)?,
    };
    if let Some(demo) = demo {
        bound = bound.refuse_file_reloads(demo::no_reload(demo.start.built_in));
    }
    if let Some(pid) = platform::takes_over() {
        bound = bound.taking_over(pid);
    }
    if let Some(path) = state_path {
        appbroker::balancer::state_file::restore(path, &bound.balancers());
    }
    // The status page's actions keep their changes where `ctl`'s are kept.
    bound = bound.keeping_state_in(state_path.map(Path::to_path_buf));
    // Only now, with the ports bound: an instance that cannot start (another holds the
    // ports) leaves the running one's log file alone.
    log.open_file()?;
    // Beside the state file, so that a restart keeps every HTTP session.
    Ok(bound.with_own_secret(admin::session_secret::keep(state_path)))
}

/// The control socket's and the state file's paths: the demo's own, or as the configuration
/// says.
fn admin_paths(config: &Config, demo: Option<&DemoRun>) -> (Option<PathBuf>, Option<PathBuf>) {
    if let Some(demo) = demo {
        return (
            Some(demo.scratch.control_socket()),
            Some(demo.scratch.state_file()),
        );
    }
    let env = admin::paths::Env::current();
    (
        admin::paths::control_socket(&config.general, &config.source, &env),
        admin::paths::state_file(&config.general, &config.source, &env),
    )
}
