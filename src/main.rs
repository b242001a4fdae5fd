//! The `appbroker` command: parse the command line, load the configuration, set up logging,
//! bind, and run until a signal says stop.
// Nothing here may panic because an output is closed: no print macros.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use appbroker::config::{Config, Loaded};
use appbroker::shutdown::{Shutdown, handle_signals};
use appbroker::workers::WorkerThreads;
use appbroker::{Broker, config, demo, logging, sys};
use clap::{Parser, Subcommand};
use tokio::sync::Notify;
use tracing::{info, warn};

/// A load-balancing TCP broker for application-server fleets (TOTVS Protheus AppServer and
/// the like).
///
/// appbroker reads an appserver.ini whose [BALANCE_SMART_CLIENT_DESKTOP] and
/// [BALANCE_WEB_SERVICES] sections each name a LOCAL_SERVER_PORT and REMOTE_SERVER_xx servers,
/// forwards every client to a chosen server, checks the servers every MONITOR_INTERVAL and
/// keeps failed ones in quarantine.
///
/// Exit codes: 0 after a clean shutdown or a valid --check; 1 when a port cannot be bound or
/// on a second SIGTERM/SIGINT; 2 when the configuration is invalid.
///
/// Signals: SIGTERM or SIGINT shut down gracefully (SHUTDOWN_GRACE, then SHUTDOWN_TIMEOUT);
/// sending one again exits at once. SIGHUP reloads the configuration file: servers added,
/// removed or re-weighted and settings changed apply to new connections; an invalid file is
/// rejected and the running configuration kept.
#[derive(Debug, Parser)]
#[command(name = "appbroker", version, verbatim_doc_comment)]
struct Cli {
    /// The configuration file.
    #[arg(long, short, value_name = "PATH", default_value = "appserver.ini")]
    config: PathBuf,

    /// Validate the configuration without binding or resolving anything, print the effective
    /// configuration as INI (defaults included) and exit: 0 when valid, 2 with every error.
    #[arg(long)]
    check: bool,

    /// Log level (error, warn, info, debug, trace); wins over RUST_LOG. Default: info.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the built-in appserver.ini.example with echo servers standing in for its
    /// REMOTE_SERVERs (127.0.0.1:6001-6003 and 6011-6012). Connect with `telnet 127.0.0.1 5000`:
    /// typed lines come back prefixed with the name of the server that answered. Type a
    /// server's id (e.g. 02) and Enter on the demo's console to stop that server or start it
    /// again; Enter alone lists them. Ctrl-C stops the demo.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let demo = matches!(cli.command, Some(Command::Demo));
    let loaded = if demo {
        Config::from_text(demo::EXAMPLE, Path::new("appserver.ini.example (built in)"))
    } else {
        Config::from_path(&cli.config)
    };
    let Loaded { config, notices } = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            logging::to_stderr(&format!("appbroker: {}", e.report()));
            return ExitCode::from(2);
        }
    };
    let file = config.source.display().to_string();
    if cli.check {
        for notice in &notices {
            logging::to_stderr(&format!("notice: {}", notice.located(&file)));
        }
        // A closed standard output loses the printout, not the verdict (the exit code).
        let _ = std::io::stdout().write_all(config.to_ini().as_bytes());
        return ExitCode::SUCCESS;
    }
    let log = match logging::init(&config.general, cli.log_level.as_deref()) {
        Ok(log) => log,
        Err(e) => {
            logging::to_stderr(&format!("appbroker: {e}"));
            return ExitCode::from(2);
        }
    };
    info!(
        "appbroker {} starting with {file}",
        env!("CARGO_PKG_VERSION")
    );
    for notice in &notices {
        warn!("{}", notice.located(&file));
    }
    match run(config, demo, &log) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            if !log.to_console() {
                // The log file may not be open (or not the place anyone looks at a start).
                logging::to_stderr(&format!("appbroker: {e:#}"));
            }
            match e.downcast_ref::<logging::LogError>() {
                Some(_) => ExitCode::from(2),
                None => ExitCode::from(1),
            }
        }
    }
}

fn run(config: Config, demo: bool, log: &logging::Log) -> anyhow::Result<()> {
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
    let workers = threads.workers();
    let result = runtime.block_on(async {
        let servers = if demo {
            let servers = demo::start_servers(&config).await?;
            info!(
                "demo: {} echo servers stand in for the REMOTE_SERVERs. Try `telnet 127.0.0.1 5000` and \
                 type a line; type a server id (01, 02, 03) and Enter here to stop or start the servers with that id",
                servers.len()
            );
            Some(servers)
        } else {
            None
        };
        let broker = Broker::bind(config, workers)?;
        // Only now, with the ports bound: an instance that cannot start (another holds the
        // ports) leaves the running one's log file alone.
        log.open_file()?;
        let shutdown = Shutdown::new();
        let reload = Arc::new(Notify::new());
        handle_signals(shutdown.clone(), Arc::clone(&reload))
            .context("cannot install the signal handlers")?;
        if let Some(servers) = servers {
            tokio::spawn(demo::console(servers));
        }
        broker.run(shutdown, reload).await;
        Ok(())
    });
    // The demo's console waits on a blocking read of standard input, which nothing can
    // cancel: do not wait for it.
    runtime.shutdown_background();
    threads.stop();
    result
}
