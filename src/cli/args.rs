//! The command line as clap reads it: the options, the commands and their arguments. The
//! doc comments of these types are the `--help` text, word for word; what they need beyond
//! their help is said in `//` comments, which clap does not read.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use appbroker::config;
use clap::{Parser, Subcommand};

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
pub struct Cli {
    /// The configuration file [default: appserver.ini; for the demo, the built-in
    /// appserver.ini.example].
    #[arg(long, short, value_name = "PATH", global = true)]
    pub config: Option<PathBuf>,

    /// Validate the configuration without binding or resolving anything, print the effective
    /// configuration as INI (defaults included) and exit: 0 when valid, 2 with every error.
    #[arg(long)]
    pub check: bool,

    /// Run as a supervisor (Unix): bind every listener, run the broker as a child process on
    /// them and start another at once when it dies (clients meanwhile wait in the listen
    /// queue, none is refused); SIGHUP, SIGTERM and SIGINT are passed on to it, and the
    /// supervisor stops with it. See docs/high-availability.md.
    #[arg(long, conflicts_with = "check")]
    pub supervise: bool,

    /// Log level (error, warn, info, debug, trace); wins over RUST_LOG. Default: info.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Print `appbroker-handover N`, the version of what a supervisor hands its next image on
    /// an upgrade, and exit: asked by a running supervisor of the binary it would re-execute.
    #[arg(long, hide = true, exclusive = true)]
    pub handover_version: bool,

    #[command(subcommand)]
    pub command: Option<Command>,
}

// The commands; without one, appbroker runs the broker.
#[derive(Debug, Subcommand)]
pub enum Command {
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
    /// socket: show its servers, disable, drain, enable, weigh, quarantine, release, cut or
    /// restart one, reload the file.
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

// `appbroker ctl`: where the broker is, and what to ask it.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The control socket [default: derived from --config, as the broker derives it].
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pub socket: Option<PathBuf>,

    /// Print the broker's answer as JSON (the objects of the control protocol).
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

// One request each to a running broker (`admin::protocol::Request`).
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
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
    /// Run RESTART_COMMAND for the server now and print how it ended (exit 1 when it failed
    /// or was refused). The restarts' bounds hold: RESTART_MAX_PARALLEL, RESTART_TIMEOUT,
    /// RESTART_ONLY_WITH_ADDRESS, and RESTART_COOLDOWN unless --force.
    Restart {
        section: String,
        id: String,
        /// Run it even within RESTART_COOLDOWN of the server's last restart.
        #[arg(long)]
        force: bool,
    },
    /// Read the configuration file again and apply it (as SIGHUP); prints what changed or
    /// every error.
    Reload,
}

/// `ctl weight`'s value: a number, or the file's.
#[derive(Debug, Clone, Copy)]
pub struct Weight(pub Option<u32>);

/// Parses `ctl weight`'s value.
fn weight(text: &str) -> Result<Weight, String> {
    if text.eq_ignore_ascii_case("file") {
        return Ok(Weight(None));
    }
    match text.parse::<u32>() {
        Ok(n) if n <= appbroker::balancer::rules::overrides::MAX_WEIGHT => Ok(Weight(Some(n))),
        _ => Err("expected a weight from 0 to 1000, or `file` for the file's".into()),
    }
}

/// Parses a duration as the configuration does (seconds, or with ms, s or m).
fn duration(text: &str) -> Result<Duration, String> {
    config::duration_within(text, Duration::ZERO, appbroker::config::keys::DAY)
}

// `appbroker demo`: where it listens, or be its client.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// The address the demo's balancers listen on, whatever the file says. The default keeps
    /// the demo (and its status pages, open to every address) on this machine; 0.0.0.0 opens
    /// it to the network.
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1")]
    pub listen: IpAddr,

    /// Be the demo's client instead: connect to its first balancer (or ADDRESS:PORT), send
    /// each line typed, print what comes back; end of input (Ctrl-D) ends it.
    #[arg(long, value_name = "ADDRESS:PORT", num_args = 0..=1)]
    pub client: Option<Option<SocketAddr>>,
}
