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
use std::time::Duration;

use anyhow::Context;
use appbroker::admin::protocol::Request;
use appbroker::config::{Config, LoadError, Loaded};
use appbroker::net::sys;
use appbroker::net::workers::WorkerThreads;
use appbroker::process::logging;
use appbroker::process::shutdown::handle_signals;
use appbroker::{Broker, admin, config, demo};
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

    /// Run as a supervisor (Unix): bind every listener, run the broker as a child process on
    /// them and start another at once when it dies (clients meanwhile wait in the listen
    /// queue, none is refused); SIGHUP, SIGTERM and SIGINT are passed on to it, and the
    /// supervisor stops with it. See docs/high-availability.md.
    #[arg(long, conflicts_with = "check")]
    supervise: bool,

    /// Log level (error, warn, info, debug, trace); wins over RUST_LOG. Default: info.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,

    /// Print `appbroker-handover N`, the version of what a supervisor hands its next image on
    /// an upgrade, and exit: asked by a running supervisor of the binary it would re-execute.
    #[arg(long, hide = true, exclusive = true)]
    handover_version: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the built-in appserver.ini.example (or --config PATH) with echo servers standing in
    /// for its REMOTE_SERVERs (127.0.0.1:6001-6003 and 6011-6012) and web servers behind its
    /// HTTP balancer (8081-8082), listening on 127.0.0.1 only. Talk to it from another
    /// terminal with `appbroker demo --client`: typed lines come back prefixed with the name
    /// of the server that answered; open http://127.0.0.1:8080/ in a browser to see session
    /// affinity (the page says which server answered). Type a server's id (e.g. 02)
    /// and Enter on the demo's console to stop that server or start it again; Enter alone
    /// lists them. Ctrl-C stops the demo.
    Demo(DemoArgs),

    /// Administer the running broker of --config (default appserver.ini) over its control
    /// socket: show its servers, disable, drain, enable, weigh, quarantine, release or cut one,
    /// reload the file.
    ///
    /// SECTION is a balancer's section as in the file (BALANCE_SMART_CLIENT_DESKTOP) or
    /// without BALANCE_; ID is a server's REMOTE_SERVER id (01) or its host:port.
    ///
    /// Exit codes: 0 done; 1 the broker refused (its reason is printed) or a wait timed out;
    /// 2 bad usage; 3 no broker answered.
    #[command(verbatim_doc_comment)]
    Ctl(CtlArgs),

    /// Exit 0 when the broker of --config (default appserver.ini) is alive and accepting, 1
    /// otherwise with the reason on standard error (`no answer within 1s` when it does not
    /// answer in time). Asked over the control socket, so it works whatever the query
    /// interface allows, and is answered whatever other control clients do; it checks
    /// liveness, not whether any AppServer is up. For keepalived's track_script
    /// (contrib/keepalived).
    Ping {
        /// How long to wait for the answer: seconds, or a number with ms, s or m. Keep it
        /// under the check's own timeout (keepalived's `timeout 2`).
        #[arg(long, value_parser = duration, default_value = "1s")]
        timeout: Duration,
    },

    /// Upgrade in place: the supervisor of --config (appbroker --supervise) re-executes
    /// itself from the binary now on disk (same pid), starts a new broker on the listeners it
    /// holds, with the state file's overrides and quarantines, and once that one serves, the
    /// old one stops accepting and drains for SHUTDOWN_TIMEOUT. The new binary must pass
    /// --check on the file and take this build's hand-over (--handover-version) first, within
    /// UPGRADE_TIMEOUT; this command waits that plus 30 s for the answer.
    ///
    /// Exit codes: 0 upgraded; 1 refused (the reason is printed; the running broker carries
    /// on), or the broker runs without a supervisor; 3 no supervisor answered.
    #[command(verbatim_doc_comment)]
    Upgrade,
}

#[derive(Debug, clap::Args)]
struct CtlArgs {
    /// The control socket [default: derived from --config, as the broker derives it].
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    socket: Option<PathBuf>,

    /// Print the broker's answer as JSON (the objects of the control protocol).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Every balancer (or SECTION's) and server: state, connections, weight, overrides with
    /// their reason, quarantines.
    Show { section: Option<String> },
    /// No new clients for the server; its open connections stay.
    Disable {
        section: String,
        id: String,
        /// Why, for the log, the status page and `show`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// As disable; with --wait, returns when the server has no connection left.
    Drain {
        section: String,
        id: String,
        /// Why, for the log, the status page and `show`.
        #[arg(long)]
        reason: Option<String>,
        /// Wait until the server has no connection left (exit 1 on timeout, with the count).
        #[arg(long)]
        wait: bool,
        /// How long --wait waits: seconds, or a number with ms, s or m.
        #[arg(long, requires = "wait", value_parser = duration, default_value = "10m")]
        timeout: Duration,
    },
    /// Ends disable or drain.
    Enable { section: String, id: String },
    /// A weight for now, 0 to 1000, shown as an override of the file's; `file` ends it.
    Weight {
        section: String,
        id: String,
        #[arg(value_parser = weight)]
        weight: Weight,
    },
    /// Quarantine the server now for DURATION (default QUARANTINE_TIME); passing checks do
    /// not end it, only its time or `release`.
    Quarantine {
        section: String,
        id: String,
        #[arg(value_parser = duration)]
        duration: Option<Duration>,
        /// Why, for the log, the status page and `show` (shown instead of the server's last
        /// error).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Take the server out of quarantine now, whoever put it there.
    Release { section: String, id: String },
    /// Close the server's open connections now.
    Cut { section: String, id: String },
    /// Read the configuration file again and apply it (as SIGHUP); prints what changed or
    /// every error.
    Reload,
}

/// `ctl weight`'s value: a number, or the file's.
#[derive(Debug, Clone, Copy)]
struct Weight(Option<u32>);

/// Parses `ctl weight`'s value.
fn weight(text: &str) -> Result<Weight, String> {
    if text.eq_ignore_ascii_case("file") {
        return Ok(Weight(None));
    }
    match text.parse::<u32>() {
        Ok(n) if n <= appbroker::balancer::overrides::MAX_WEIGHT => Ok(Weight(Some(n))),
        _ => Err("expected a weight from 0 to 1000, or `file` for the file's".into()),
    }
}

/// Parses a duration as the configuration does (seconds, or with ms, s or m).
fn duration(text: &str) -> Result<Duration, String> {
    config::duration_within(text, Duration::ZERO, appbroker::config::keys::DAY)
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
    #[cfg(unix)]
    if cli.handover_version {
        let line = appbroker::supervisor::upgrade::handover_line();
        let _ = writeln!(std::io::stdout(), "{line}");
        return ExitCode::SUCCESS;
    }
    match &cli.command {
        Some(Command::Ctl(args)) => return ctl(&cli, args),
        Some(Command::Ping { timeout }) => return ping(&cli, *timeout),
        Some(Command::Upgrade) => return upgrade(&cli),
        _ => {}
    }
    let demo = match &cli.command {
        Some(Command::Demo(args)) => Some(args),
        _ => None,
    };
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
        warnings,
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
        return check_report(&config, &notices, &warnings, &file);
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
    for warning in &warnings {
        warn!("{}", warning.located(&file));
    }
    #[cfg(unix)]
    if cli.supervise && demo.is_none() {
        return supervise(config, &log);
    }
    if std::env::var_os("LISTEN_FDS").is_some() {
        warn!(
            "systemd passed listening sockets (LISTEN_FDS), which only the supervised mode takes: \
             add --supervise to ExecStart; binding the ports as usual"
        );
    }
    let demo = demo.map(|args| DemoStart {
        client_command: client_command(&cli, args),
        built_in: cli.config.is_none(),
    });
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

/// `--check`: the notices and warnings on standard error, the effective configuration on
/// standard output, and the verdict.
fn check_report(
    config: &Config,
    notices: &[config::ConfigError],
    warnings: &[config::ConfigError],
    file: &str,
) -> ExitCode {
    for notice in notices {
        logging::to_stderr(&format!("notice: {}", notice.located(file)));
    }
    for warning in warnings {
        logging::to_stderr(&format!("warning: {}", warning.located(file)));
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
    ExitCode::SUCCESS
}

/// `--supervise`: binds every listener (or, re-executed by an upgrade, takes them over) and
/// runs the broker as a child on them until it stops.
#[cfg(unix)]
fn supervise(config: Config, log: &logging::Log) -> ExitCode {
    use appbroker::net::inherit;
    use appbroker::supervisor::{self, upgrade};
    let fail = |e: &dyn std::fmt::Display| {
        tracing::error!("supervisor: {e}");
        if !log.to_console() {
            logging::to_stderr(&format!("appbroker: {e}"));
        }
        ExitCode::from(1)
    };
    let handover = std::env::var(upgrade::HANDOVER_ENV)
        .ok()
        .and_then(|text| upgrade::Handover::decode(&text));
    // After an upgrade, the previous image's listeners; else systemd's (appbroker.socket).
    let held = match handover {
        Some(_) => supervisor::inherited_held(),
        None => supervisor::systemd::activated(&config),
    };
    let mut held = match held {
        Ok(held) => held,
        Err(e) => return fail(&e),
    };
    if let Err(e) = supervisor::hold(&config, &mut held) {
        return fail(&e);
    }
    if let Err(e) = log.open_file() {
        return fail(&e);
    }
    let taken = handover.map(|handover| -> Result<_, inherit::InheritError> {
        let socket = inherit::take_socket(handover.socket)?;
        let client = inherit::take_socket(handover.client)?.into();
        let lifeline = match std::env::var(upgrade::LIFELINE_ENV).map(|t| t.parse()) {
            Ok(Ok(fd)) => Some(inherit::take_socket(fd)?.into()),
            _ => None,
        };
        let upgrading = supervisor::Upgrading {
            handover,
            client,
            lifeline,
        };
        Ok((socket.into(), upgrading))
    });
    let (socket, upgrading) = match taken {
        Some(Ok((socket, upgrading))) => (Some(socket), Some(upgrading)),
        Some(Err(e)) => return fail(&format!("cannot take over after the upgrade: {e}")),
        None => match supervisor_socket(&config) {
            Ok(socket) => (socket, None),
            Err(e) => return fail(&e),
        },
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(&format!("cannot find this program's file: {e}")),
    };
    // The same command line, less --supervise: the child is the broker itself.
    let args = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--supervise")
        .collect();
    let start = supervisor::Start {
        config,
        held,
        options: supervisor::Options { exe, args },
        socket,
        upgrading,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(supervisor::run(start)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&appbroker::process::os_error::words(&e)),
    }
}

/// The supervisor's socket for `appbroker upgrade`, beside the broker's control socket;
/// `None` with `CONTROL_SOCKET=0`.
#[cfg(unix)]
fn supervisor_socket(config: &Config) -> Result<Option<std::os::unix::net::UnixListener>, String> {
    let env = admin::paths::Env::current();
    let Some(control) = admin::paths::control_socket(&config.general, &config.source, &env) else {
        info!("supervisor: no control socket (CONTROL_SOCKET=0), so no `appbroker upgrade`");
        return Ok(None);
    };
    let path = appbroker::supervisor::upgrade::socket_path(&control);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    let gid = admin::socket::group_id(config.general.control_group.as_deref())
        .map_err(|e| e.to_string())?;
    match appbroker::supervisor::upgrade::bind(&path, gid) {
        Ok(socket) => {
            info!("supervisor: `appbroker upgrade` asks on {}", path.display());
            Ok(Some(socket))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(e.to_string()),
        Err(e) => {
            warn!(
                "supervisor: cannot make {}: {}; `appbroker upgrade` cannot reach this \
                 supervisor",
                path.display(),
                appbroker::process::os_error::words(&e)
            );
            Ok(None)
        }
    }
}

/// `appbroker upgrade`: asks the supervisor of --config to re-execute itself from the binary
/// on disk and replace the broker; 0 upgraded, 1 refused, 3 no supervisor answered.
#[cfg(unix)]
fn upgrade(cli: &Cli) -> ExitCode {
    use appbroker::supervisor::upgrade;
    let control = match control_socket(cli, None) {
        Ok(control) => control,
        Err(code) => return code,
    };
    let path = upgrade::socket_path(&control);
    let file = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("appserver.ini"));
    let within = upgrade::answer_time(upgrade::timeout_of_file(&file));
    match upgrade::ask(&path, within) {
        Ok(answer) if answer.starts_with("upgraded") => {
            let _ = writeln!(std::io::stdout(), "{answer}");
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            logging::to_stderr(&format!("appbroker upgrade: {answer}"));
            ExitCode::from(admin::ctl::REFUSED)
        }
        Err(e @ upgrade::AskError::NoSupervisor { .. }) => {
            // A broker that runs without a supervisor answers on the control socket.
            if admin::ctl::ask(&control, &Request::Ping, Duration::ZERO).is_ok() {
                logging::to_stderr(
                    "appbroker upgrade: the broker runs without a supervisor; an upgrade needs \
                     the supervised mode (appbroker --supervise): restart it that way",
                );
                return ExitCode::from(admin::ctl::REFUSED);
            }
            logging::to_stderr(&format!("appbroker upgrade: {e}"));
            ExitCode::from(admin::ctl::NO_BROKER)
        }
        Err(e) => {
            logging::to_stderr(&format!("appbroker upgrade: {e}"));
            ExitCode::from(admin::ctl::NO_BROKER)
        }
    }
}

/// No supervisor without Unix.
#[cfg(not(unix))]
fn upgrade(_cli: &Cli) -> ExitCode {
    logging::to_stderr("appbroker upgrade: the supervised mode needs a Unix system");
    ExitCode::from(1)
}

/// The control socket of the broker of `--config` (default `appserver.ini`), or the exit code
/// and its message when it cannot be known.
fn control_socket(cli: &Cli, given: Option<&PathBuf>) -> Result<PathBuf, ExitCode> {
    if let Some(path) = given {
        return Ok(path.clone());
    }
    let path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("appserver.ini"));
    match admin::paths::control_socket_of_file(&path, &admin::paths::Env::current()) {
        Ok(Some(socket)) => Ok(socket),
        Ok(None) => {
            logging::to_stderr(&format!(
                "appbroker: {} turns the control socket off (CONTROL_SOCKET=0)",
                path.display()
            ));
            Err(ExitCode::from(2))
        }
        Err(e) => {
            logging::to_stderr(&format!("appbroker: {}", e.report()));
            logging::to_stderr(
                "appbroker: the control socket is found from the broker's configuration: \
                 name it with --config PATH (or the socket with --socket PATH)",
            );
            Err(ExitCode::from(2))
        }
    }
}

/// The `--reason` a command gives, refused with control characters before it is sent.
fn reason_of(command: &CtlCommand) -> Option<&str> {
    match command {
        CtlCommand::Disable { reason, .. }
        | CtlCommand::Drain { reason, .. }
        | CtlCommand::Quarantine { reason, .. } => reason.as_deref(),
        _ => None,
    }
}

/// `appbroker ctl`: one request to a running broker, its answer printed.
fn ctl(cli: &Cli, args: &CtlArgs) -> ExitCode {
    let socket = match control_socket(cli, args.socket.as_ref()) {
        Ok(socket) => socket,
        Err(code) => return code,
    };
    let target = |section: &String, id: &String| (section.clone(), id.clone());
    if let Some(problem) =
        reason_of(&args.command).and_then(appbroker::balancer::overrides::reason_problem)
    {
        logging::to_stderr(&format!("appbroker ctl: --reason: {problem}"));
        return ExitCode::from(2);
    }
    let request = match &args.command {
        CtlCommand::Show { section } => Request::Show {
            section: section.clone(),
        },
        CtlCommand::Disable {
            section,
            id,
            reason,
        } => Request::Disable {
            section: section.clone(),
            server: id.clone(),
            reason: reason.clone(),
        },
        CtlCommand::Drain {
            section,
            id,
            reason,
            ..
        } => Request::Drain {
            section: section.clone(),
            server: id.clone(),
            reason: reason.clone(),
        },
        CtlCommand::Enable { section, id } => {
            let (section, server) = target(section, id);
            Request::Enable { section, server }
        }
        CtlCommand::Weight {
            section,
            id,
            weight,
        } => {
            let (section, server) = target(section, id);
            Request::Weight {
                section,
                server,
                weight: weight.0,
            }
        }
        CtlCommand::Quarantine {
            section,
            id,
            duration,
            reason,
        } => {
            let (section, server) = target(section, id);
            Request::Quarantine {
                section,
                server,
                duration: duration.map(config::show_duration),
                reason: reason.clone(),
            }
        }
        CtlCommand::Release { section, id } => {
            let (section, server) = target(section, id);
            Request::Release { section, server }
        }
        CtlCommand::Cut { section, id } => {
            let (section, server) = target(section, id);
            Request::Cut { section, server }
        }
        CtlCommand::Reload => Request::Reload,
    };
    let code = admin::ctl::run(&socket, &request, args.json, Duration::ZERO);
    if code != admin::ctl::DONE {
        return ExitCode::from(code);
    }
    // drain --wait: then wait for the server's last connection.
    if let CtlCommand::Drain {
        section,
        id,
        wait: true,
        timeout,
        ..
    } = &args.command
    {
        let (section, server) = target(section, id);
        let wait = Request::Wait {
            section,
            server,
            timeout: Some(config::show_duration(*timeout)),
        };
        return ExitCode::from(admin::ctl::run(&socket, &wait, args.json, *timeout));
    }
    ExitCode::SUCCESS
}

/// `appbroker ping`: 0 when the broker answers over its control socket within `timeout` and
/// is not stopping.
fn ping(cli: &Cli, timeout: Duration) -> ExitCode {
    let socket = match control_socket(cli, None) {
        Ok(socket) => socket,
        Err(_) => return ExitCode::from(1),
    };
    match admin::ctl::ask_within(&socket, &Request::Ping, timeout) {
        Ok(answer) if answer.ok => ExitCode::SUCCESS,
        Ok(answer) => {
            let why = answer.error.unwrap_or_default();
            logging::to_stderr(&format!("appbroker ping: not alive: {why}"));
            ExitCode::from(1)
        }
        Err(e) => {
            logging::to_stderr(&format!("appbroker ping: {e}"));
            ExitCode::from(1)
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
        Ok(demo::Ended::ByUser) => ExitCode::SUCCESS,
        Ok(demo::Ended::ByServer) => {
            logging::to_stderr(&format!(
                "appbroker: connection closed by {address}: the server that answered was \
                 stopped, or the demo ended; connect again to be sent to a server that runs"
            ));
            ExitCode::from(1)
        }
        Err(e) => {
            logging::to_stderr(&format!(
                "appbroker: cannot talk to {address}: {}; is the demo running? Start it with \
                 `appbroker demo` in another terminal",
                appbroker::process::os_error::words(&e)
            ));
            ExitCode::from(1)
        }
    }
}

/// This very program, as a command to print: the path it runs from.
fn this_program() -> String {
    std::env::current_exe().map_or_else(
        |_| "appbroker".to_string(),
        |path| path.display().to_string(),
    )
}

/// The command that runs the client of the demo just started: this very binary, with the
/// demo's own options, so it works wherever and however the demo was started.
fn client_command(cli: &Cli, args: &DemoArgs) -> String {
    let mut command = format!("{} demo --client", this_program());
    if let Some(path) = &cli.config {
        command.push_str(&format!(" --config {}", path.display()));
    }
    if args.listen != IpAddr::from([127, 0, 0, 1]) && !args.listen.is_unspecified() {
        command.push_str(&format!(" --listen {}", args.listen));
    }
    command
}

/// The control socket, bound (`None` when `CONTROL_SOCKET=0`).
#[cfg(unix)]
fn bind_control_socket(
    path: Option<&Path>,
    config: &Config,
) -> anyhow::Result<Option<admin::socket::ControlSocket>> {
    let Some(path) = path else {
        info!("no control socket (CONTROL_SOCKET=0): `appbroker ctl` cannot reach this broker");
        return Ok(None);
    };
    let group = config.general.control_group.as_deref();
    let mut bound = admin::socket::ControlSocket::bind(path, group);
    if let Err(admin::socket::SocketError::Live(_)) = &bound
        && std::env::var_os(appbroker::supervisor::LISTENERS_ENV).is_some()
    {
        // A supervised broker replacing another (the ports changed): the one draining keeps
        // its connection to the socket, the new one takes the path.
        info!(
            "taking the control socket {} over from the broker this one replaces",
            path.display()
        );
        let _ = std::fs::remove_file(path);
        bound = admin::socket::ControlSocket::bind(path, group);
    }
    match bound {
        Ok(socket) => Ok(Some(socket)),
        // Another broker runs this file, or the operator named a socket or group that cannot
        // be: a start that says so beats a broker nobody can administer.
        Err(e @ admin::socket::SocketError::Live(_))
        | Err(e @ admin::socket::SocketError::NoGroup(_)) => Err(e.into()),
        Err(e) if config.general.control_socket.is_some() => Err(e.into()),
        // The derived default is not writable (an unprivileged start with the file in /etc,
        // say): serve anyway, and say how to get the socket.
        Err(e) => {
            warn!(
                "{e}; serving without a control socket: `appbroker ctl` cannot reach this \
                 broker (set CONTROL_SOCKET in [General] to a path this user may create, or 0)"
            );
            Ok(None)
        }
    }
}

/// Serves `socket` with `admin`, once the broker runs.
#[cfg(unix)]
fn serve_control_socket(
    socket: Option<&mut admin::socket::ControlSocket>,
    admin: std::sync::Arc<admin::Admin>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(socket) = socket else {
        return Ok(None);
    };
    let task = socket.serve(admin)?;
    info!(
        "control socket {} (appbroker ctl --socket {0} show)",
        socket.path().display()
    );
    Ok(Some(task))
}

/// No control socket without Unix sockets.
#[cfg(not(unix))]
fn bind_control_socket(_path: Option<&Path>, _config: &Config) -> anyhow::Result<Option<()>> {
    info!("no control socket on this system: `appbroker ctl` needs a Unix system");
    Ok(None)
}

/// Nothing to serve without Unix sockets.
#[cfg(not(unix))]
fn serve_control_socket(
    _socket: Option<&mut ()>,
    _admin: std::sync::Arc<admin::Admin>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    Ok(None)
}

/// The listeners a supervisor handed down, one set per balancer; `None` when there is none.
#[cfg(unix)]
fn inherited(config: &Config) -> anyhow::Result<Option<Vec<Vec<std::net::TcpListener>>>> {
    Ok(appbroker::supervisor::inherited_listeners(config)?)
}

/// No supervisor without Unix.
#[cfg(not(unix))]
fn inherited(_config: &Config) -> anyhow::Result<Option<Vec<Vec<std::net::TcpListener>>>> {
    Ok(None)
}

/// What [`run`] needs to run the demo.
struct DemoStart {
    /// The command that runs its client.
    client_command: String,
    /// Its configuration is the built-in example (no `--config`).
    built_in: bool,
}

/// The demo while it runs.
struct DemoRun {
    start: DemoStart,
    /// The stand-in servers, until the console takes them.
    servers: Option<std::collections::BTreeMap<String, demo::StandIn>>,
    /// The configuration as it started, for the introduction.
    shown: Config,
    /// Its control socket and state file; removed with it.
    scratch: demo::Scratch,
}

impl DemoRun {
    /// Starts the stand-in servers of `config` and makes the demo's directory.
    async fn start(start: DemoStart, config: &Config) -> anyhow::Result<DemoRun> {
        Ok(DemoRun {
            servers: Some(demo::start_servers(config).await?),
            scratch: demo::Scratch::create().context("cannot make the demo's directory")?,
            shown: config.clone(),
            start,
        })
    }

    /// Says how to use the demo.
    fn introduce(&self) {
        let ctl = format!(
            "{} ctl --socket {} show",
            this_program(),
            self.scratch.control_socket().display()
        );
        let servers = self.servers.as_ref().map_or(0, |s| s.len());
        demo::introduce(&self.shown, servers, &self.start.client_command, &ctl);
    }
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

/// Runs the broker; with `demo`, the demo's stand-in servers and console too.
fn run(config: Config, demo: Option<DemoStart>, log: &logging::Log) -> anyhow::Result<()> {
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
        let mut demo = match demo {
            Some(start) => Some(DemoRun::start(start, &config).await?),
            None => None,
        };
        let (socket_path, state_path) = admin_paths(&config, demo.as_ref());
        // Before the ports: a second broker on the same file says so, rather than that its
        // ports are taken.
        let mut socket = bind_control_socket(socket_path.as_deref(), &config)?;
        let mut bound = match inherited(&config)? {
            Some(listeners) => Broker::on_listeners(config, workers, listeners),
            None => Broker::bind(config, workers)?,
        };
        if let Some(demo) = &demo {
            bound = bound.refuse_file_reloads(demo::no_reload(demo.start.built_in));
        }
        if let Some(path) = &state_path {
            admin::state_file::restore(path, &bound.balancers());
        }
        // Only now, with the ports bound: an instance that cannot start (another holds the
        // ports) leaves the running one's log file alone.
        log.open_file()?;
        // Beside the state file, so that a restart keeps every HTTP session.
        let bound = bound.with_own_secret(admin::session_secret::keep(state_path.as_deref()));
        // After the `listening on` lines, so the way in is the last thing on the screen.
        if let Some(demo) = &demo {
            demo.introduce();
        }
        let mut broker = bound.start();
        let admin = admin::Admin::new(broker.control(), state_path);
        #[cfg(unix)]
        let supervisor = appbroker::supervisor::Link::take();
        // Before READY: from now on its supervisor's watchdog knows this broker lives.
        #[cfg(unix)]
        if let Some(supervisor) = &supervisor {
            let workers = threads.workers();
            let ticks = workers.ticks(appbroker::supervisor::HEARTBEAT);
            supervisor
                .send_heartbeats(workers.handles().len(), ticks)
                .await;
        }
        #[cfg(unix)]
        let admin = admin.supervised_by(supervisor.clone());
        let serving = serve_control_socket(socket.as_mut(), std::sync::Arc::new(admin))?;
        #[cfg(unix)]
        if let Some(supervisor) = &supervisor {
            supervisor.ready(&broker.control().shutdown_state()).await;
        }
        let control = broker.control();
        let shutdown = control.shutdown_state();
        #[cfg(unix)]
        let reload = move || match supervisor.clone() {
            // Under a supervisor, which holds every port the file names, a SIGHUP sent to the
            // broker itself goes through it as `ctl reload` does.
            Some(supervisor) => {
                let control = control.clone();
                tokio::spawn(async move {
                    use appbroker::supervisor::Supervised;
                    match supervisor.reload().await {
                        Some(Supervised::Replaced(line)) => info!("received SIGHUP: {line}"),
                        Some(Supervised::Refused(why)) => {
                            tracing::error!("received SIGHUP: reload refused: {why}")
                        }
                        Some(Supervised::InPlace) | None => control.reload_file_later(),
                    }
                });
            }
            None => control.reload_file_later(),
        };
        #[cfg(not(unix))]
        let reload = move || control.reload_file_later();
        handle_signals(shutdown, reload).context("cannot install the signal handlers")?;
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
    });
    // The demo's console may be waiting on standard input, which nothing can cancel: do not
    // wait for it.
    runtime.shutdown_background();
    threads.stop();
    result
}
