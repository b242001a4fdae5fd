//! `appbroker --supervise`: the supervisor's start: the listeners held (bound, systemd's, or
//! the previous image's after an upgrade), its socket for `appbroker upgrade`, and the broker
//! run as its child on them until it stops.

use std::os::unix::net::UnixListener;
use std::process::ExitCode;

use appbroker::admin;
use appbroker::config::Config;
use appbroker::net::inherit;
use appbroker::supervisor::{self, upgrade};
use appbroker::support::logging;
use tracing::{info, warn};

/// `--supervise`: binds every listener (or, re-executed by an upgrade, takes them over) and
/// runs the broker as a child on them until it stops.
pub fn supervise(config: Config, log: &logging::Log) -> ExitCode {
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
    let (socket, upgrading) = match handover.map(take_over) {
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
        Err(e) => fail(&appbroker::support::os_error::words(&e)),
    }
}

/// Re-executed by an upgrade: what the previous image handed down (its socket for
/// `appbroker upgrade`, the connection of the one waiting for the answer, the running
/// broker's lifeline).
fn take_over(
    handover: upgrade::Handover,
) -> Result<(UnixListener, supervisor::Upgrading), inherit::InheritError> {
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
        // Its version, as the previous image said (it is not read as a number: any text).
        from_version: std::env::var(upgrade::UPGRADE_FROM_ENV).ok(),
    };
    Ok((socket.into(), upgrading))
}

/// The supervisor's socket for `appbroker upgrade`, beside the broker's control socket;
/// `None` with `CONTROL_SOCKET=0`.
fn supervisor_socket(config: &Config) -> Result<Option<UnixListener>, String> {
    let env = admin::paths::Env::current();
    let Some(control) = admin::paths::control_socket(&config.general, &config.source, &env) else {
        info!("supervisor: no control socket (CONTROL_SOCKET=0), so no `appbroker upgrade`");
        return Ok(None);
    };
    let path = upgrade::socket_path(&control);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    let gid = admin::socket::group_id(config.general.control_group.as_deref())
        .map_err(|e| e.to_string())?;
    match upgrade::bind(&path, gid) {
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
                appbroker::support::os_error::words(&e)
            );
            Ok(None)
        }
    }
}
