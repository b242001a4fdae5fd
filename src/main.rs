//! The `appbroker` command: parse the command line, load the configuration, set up logging,
//! bind, and run until a signal says stop.
// Nothing here may panic because an output is closed: no print macros.
#![deny(clippy::print_stdout, clippy::print_stderr)]
// Functions short enough to read at once (clippy's default bound, 100 lines).
#![warn(clippy::too_many_lines)]

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use appbroker::config::{Config, LoadError, Loaded};
use appbroker::shutdown::handle_signals;
use appbroker::workers::WorkerThreads;
use appbroker::{Broker, config, demo, logging, sys};
use clap::{Parser, Subcommand};
use tracing::{info, warn};

/// A load-balancing broker for application-server fleets (TOTVS Protheus AppServer and the
/// like).
///
/// appbroker reads an appserver.ini whose [BALANCE_SMART_CLIENT_DESKTOP],
/// [BALANCE_WEB_SERVICES] and [BALANCE_HTTP...] sections each name a LOCAL_SERVER_PORT and
/// REMOTE_SERVER_xx servers, forwards every TCP client (every HTTP request, on an HTTP
/// balancer) to a chosen server, checks the servers every MONITOR_INTERVAL and keeps failed
/// ones in quarantine.
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
    /// The configuration file [default: appserver.ini; for the demo, the built-in
    /// appserver.ini.example].
    #[arg(long, short, value_name = "PATH", global = true)]
    config: Option<PathBuf>,

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
    /// Run the built-in appserver.ini.example (or --config PATH) with echo servers standing in
    /// for its REMOTE_SERVERs (127.0.0.1:6001-6003 and 6011-6012), listening on 127.0.0.1
    /// only. Talk to it from another terminal with `appbroker demo --client`: typed lines come
    /// back prefixed with the name of the server that answered. Type a server's id (e.g. 02)
    /// and Enter on the demo's console to stop that server or start it again; Enter alone
    /// lists them. Ctrl-C stops the demo.
    Demo(DemoArgs),
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// The address the demo's balancers listen on, whatever the file says. The default keeps
    /// the demo (and its status pages, open to every address) on this machine; 0.0.0.0 opens
    /// it to the network.
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1")]
    listen: IpAddr,

    /// Be the demo's client instead: connect to its first balancer (or ADDRESS:PORT), send
    /// each line typed, print what comes back; end of input (Ctrl-D) ends it.
    #[arg(long, value_name = "ADDRESS:PORT", num_args = 0..=1)]
    client: Option<Option<SocketAddr>>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let demo = cli.command.as_ref().map(|Command::Demo(args)| args);
    let loaded = match (&cli.config, demo) {
        (Some(path), _) => Config::from_path(path),
        (None, Some(_)) => {
            Config::from_text(demo::EXAMPLE, Path::new("appserver.ini.example (built in)"))
        }
        (None, None) => Config::from_path(Path::new("appserver.ini")),
    };
    let Loaded {
        mut config,
        notices,
    } = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            logging::to_stderr(&format!("appbroker: {}", e.report()));
            if let LoadError::Read { source, .. } = &e
                && source.kind() == std::io::ErrorKind::NotFound
            {
                logging::to_stderr(
                    "appbroker: name the configuration file with --config PATH (start from \
                     appserver.ini.example), or run `appbroker demo` to see the broker at work \
                     with stand-in servers",
                );
            }
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
        // On standard error, so standard output stays the INI above.
        let servers: usize = config.balancers.iter().map(|b| b.servers.len()).sum();
        logging::to_stderr(&format!(
            "configuration OK: {file} ({}, {})",
            config::plural(config.balancers.len(), "balancer"),
            config::plural(servers, "server")
        ));
        return ExitCode::SUCCESS;
    }
    if let Some(args) = demo {
        if let Some(address) = args.client {
            return demo_client(&config, args, address);
        }
        // Every balancer on the asked address, the file's own notwithstanding.
        for balancer in &mut config.balancers {
            balancer.listen.set_ip(args.listen);
        }
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
    let client_command = demo.map(|args| client_command(&cli, args));
    match run(config, client_command, &log) {
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

/// `appbroker demo --client`: talks to the demo's first balancer, or `address`.
fn demo_client(config: &Config, args: &DemoArgs, address: Option<SocketAddr>) -> ExitCode {
    let Some(address) = address.or_else(|| demo::client_address(config, args.listen)) else {
        logging::to_stderr("appbroker: the configuration has no balancer to connect to");
        return ExitCode::from(2);
    };
    match demo::client(address) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::to_stderr(&format!(
                "appbroker: cannot talk to {address}: {}; is the demo running? Start it with \
                 `appbroker demo` in another terminal",
                appbroker::os_error::words(&e)
            ));
            ExitCode::from(1)
        }
    }
}

/// The command that runs the client of the demo just started: this very binary, with the
/// demo's own options, so it works wherever and however the demo was started.
fn client_command(cli: &Cli, args: &DemoArgs) -> String {
    let exe = std::env::current_exe().map_or_else(
        |_| "appbroker".to_string(),
        |path| path.display().to_string(),
    );
    let mut command = format!("{exe} demo --client");
    if let Some(path) = &cli.config {
        command.push_str(&format!(" --config {}", path.display()));
    }
    if args.listen != IpAddr::from([127, 0, 0, 1]) && !args.listen.is_unspecified() {
        command.push_str(&format!(" --listen {}", args.listen));
    }
    command
}

/// Runs the broker; with `demo` (the command that runs its client), the demo's stand-in
/// servers and console too.
fn run(config: Config, demo: Option<String>, log: &logging::Log) -> anyhow::Result<()> {
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
        let servers = match &demo {
            Some(_) => Some(demo::start_servers(&config).await?),
            None => None,
        };
        let shown = demo.as_ref().map(|_| config.clone());
        let bound = Broker::bind(config, workers)?;
        // Only now, with the ports bound: an instance that cannot start (another holds the
        // ports) leaves the running one's log file alone.
        log.open_file()?;
        // After the `listening on` lines, so the way in is the last thing on the screen.
        if let (Some(servers), Some(client), Some(config)) = (&servers, &demo, &shown) {
            demo::introduce(config, servers.len(), client);
        }
        let mut broker = bound.start();
        let control = broker.control();
        handle_signals(control.shutdown_state(), move || {
            control.reload_file_later()
        })
        .context("cannot install the signal handlers")?;
        if let Some(servers) = servers {
            tokio::spawn(demo::console(servers));
        }
        broker.stopped().await;
        Ok(())
    });
    // The demo's console waits on a blocking read of standard input, which nothing can
    // cancel: do not wait for it.
    runtime.shutdown_background();
    threads.stop();
    result
}
