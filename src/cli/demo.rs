//! `appbroker demo`: its line client (`--client`), and what the broker's run needs to run the
//! demo beside it: the stand-in servers, the demo's own directory, and the introduction.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use anyhow::Context;
use appbroker::config::Config;
use appbroker::demo;
use appbroker::support::logging;

use super::args::{Cli, DemoArgs};

/// `appbroker demo --client`: talks to the demo's first balancer, or `address`.
pub fn client(config: &Config, args: &DemoArgs, address: Option<SocketAddr>) -> ExitCode {
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
        Ok(demo::Ended::Unanswered) => {
            let why = match demo::unavailable(address) {
                Some(counts) => format!(
                    "no server was available ({counts}); start one on the demo's console (type \
                     its id) or enable it (the demo's `ctl` command, with `enable SECTION ID`), \
                     then connect again"
                ),
                None => "the server it was sent to closed it at once, or the demo ended; \
                         connect again"
                    .to_string(),
            };
            logging::to_stderr(&format!(
                "appbroker: connection closed by {address} before any server answered: {why}"
            ));
            ExitCode::from(1)
        }
        Err(e) => {
            logging::to_stderr(&format!(
                "appbroker: cannot talk to {address}: {}; is the demo running? Start it with \
                 `appbroker demo` in another terminal",
                appbroker::support::os_error::words(&e)
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

/// What the broker's run needs to run the demo.
pub struct DemoStart {
    /// The command that runs its client.
    client_command: String,
    /// Its configuration is the built-in example (no `--config`).
    pub built_in: bool,
}

impl DemoStart {
    /// The demo `cli` and `args` ask for.
    pub fn new(cli: &Cli, args: &DemoArgs) -> DemoStart {
        DemoStart {
            client_command: client_command(cli, args),
            built_in: cli.config.is_none(),
        }
    }
}

/// The demo while it runs.
pub struct DemoRun {
    pub start: DemoStart,
    /// The stand-in servers, until the console takes them.
    pub servers: Option<BTreeMap<String, demo::StandIn>>,
    /// The configuration as it started, for the introduction.
    shown: Config,
    /// Its control socket and state file; removed with it.
    pub scratch: demo::Scratch,
}

impl DemoRun {
    /// Starts the stand-in servers of `config` and makes the demo's directory.
    pub async fn start(start: DemoStart, config: &Config) -> anyhow::Result<DemoRun> {
        Ok(DemoRun {
            servers: Some(demo::start_servers(config).await?),
            scratch: demo::Scratch::create().context("cannot make the demo's directory")?,
            shown: config.clone(),
            start,
        })
    }

    /// Says how to use the demo.
    pub fn introduce(&self) {
        let ctl = format!(
            "{} ctl --socket {} show",
            this_program(),
            self.scratch.control_socket().display()
        );
        let servers = self.servers.as_ref().map_or(0, |s| s.len());
        demo::introduce(&self.shown, servers, &self.start.client_command, &ctl);
    }
}
