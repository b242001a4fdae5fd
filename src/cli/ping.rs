//! `appbroker ping`: whether the broker of `--config` is alive and accepting, for keepalived's
//! track_script; asked over the control socket, so it works whatever the query interface
//! allows.

use std::process::ExitCode;
use std::time::Duration;

use appbroker::admin;
use appbroker::admin::protocol::Request;
use appbroker::support::logging;

use super::args::Cli;
use super::ctl::control_socket;

/// `appbroker ping`: 0 when the broker answers over its control socket within `timeout` and
/// is not stopping.
pub fn run(cli: &Cli, timeout: Duration) -> ExitCode {
    let socket = match control_socket(cli, None) {
        Ok(socket) => socket,
        Err(_) => return ExitCode::from(1),
    };
    match admin::control_client::ask_within(&socket, &Request::Ping, timeout) {
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
