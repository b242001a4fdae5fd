//! `appbroker upgrade`: asks the supervisor of `--config` to re-execute itself from the binary
//! on disk; and `--handover-version`, what the supervisor asks that binary first.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use appbroker::admin;
use appbroker::admin::protocol::Request;
use appbroker::supervisor::upgrade;
use appbroker::support::logging;

use crate::cli::args::Cli;
use crate::cli::ctl::control_socket;

/// `--handover-version`: the version of what a supervisor hands its next image, printed.
pub fn handover_version() -> ExitCode {
    let line = upgrade::handover_line();
    let _ = writeln!(std::io::stdout(), "{line}");
    ExitCode::SUCCESS
}

/// `appbroker upgrade`: asks the supervisor of --config to re-execute itself from the binary
/// on disk and replace the broker; 0 upgraded, 1 refused, 3 no supervisor answered.
pub fn upgrade(cli: &Cli) -> ExitCode {
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
            ExitCode::from(admin::control_client::REFUSED)
        }
        Err(e @ upgrade::AskError::NoSupervisor { .. }) => {
            // A broker that runs without a supervisor answers on the control socket.
            if admin::control_client::ask(&control, &Request::Ping, Duration::ZERO).is_ok() {
                logging::to_stderr(
                    "appbroker upgrade: the broker runs without a supervisor; an upgrade needs \
                     the supervised mode (appbroker --supervise): restart it that way",
                );
                return ExitCode::from(admin::control_client::REFUSED);
            }
            logging::to_stderr(&format!("appbroker upgrade: {e}"));
            ExitCode::from(admin::control_client::NO_BROKER)
        }
        Err(e) => {
            logging::to_stderr(&format!("appbroker upgrade: {e}"));
            ExitCode::from(admin::control_client::NO_BROKER)
        }
    }
}
