//! `appbroker ctl`: one request to a running broker over its control socket, its answer
//! printed; and where that socket is, which `ping` and `upgrade` ask too.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use appbroker::admin::protocol::Request;
use appbroker::support::logging;
use appbroker::{admin, config};

use super::args::{Cli, CtlArgs, CtlCommand};

/// `appbroker ctl`: one request to a running broker, its answer printed.
pub fn run(cli: &Cli, args: &CtlArgs) -> ExitCode {
    let socket = match control_socket(cli, args.socket.as_ref()) {
        Ok(socket) => socket,
        Err(code) => return code,
    };
    if let Some(problem) =
        reason_of(&args.command).and_then(appbroker::balancer::rules::overrides::reason_problem)
    {
        logging::to_stderr(&format!("appbroker ctl: --reason: {problem}"));
        return ExitCode::from(2);
    }
    let request = request_of(&args.command);
    // A restart is answered when its command ends: RESTART_TIMEOUT at most.
    let wait = match request {
        Request::Restart { .. } => admin::RESTART_WAIT,
        _ => Duration::ZERO,
    };
    let code = admin::control_client::run(&socket, &request, args.json, wait);
    if code != admin::control_client::DONE {
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
        let wait = Request::Wait {
            section: section.clone(),
            server: id.clone(),
            timeout: Some(config::show_duration(*timeout)),
        };
        return ExitCode::from(admin::control_client::run(
            &socket, &wait, args.json, *timeout,
        ));
    }
    ExitCode::SUCCESS
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

/// The request a command sends.
fn request_of(command: &CtlCommand) -> Request {
    let target = |section: &String, id: &String| (section.clone(), id.clone());
    match command {
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
        CtlCommand::Restart { section, id, force } => Request::Restart {
            section: section.clone(),
            server: id.clone(),
            force: *force,
        },
        CtlCommand::Reload => Request::Reload,
    }
}

/// The control socket of the broker of `--config` (default `appserver.ini`), or the exit code
/// and its message when it cannot be known.
pub fn control_socket(cli: &Cli, given: Option<&PathBuf>) -> Result<PathBuf, ExitCode> {
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
