//! The broker's control socket, which `appbroker ctl` and `ping` ask on: bound before the
//! ports (a second broker on the same file says so), served once the broker runs.

use std::path::Path;
use std::sync::Arc;

use appbroker::admin::Admin;
use appbroker::admin::socket::{ControlSocket, SocketError};
use appbroker::config::Config;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The control socket, bound (`None` when `CONTROL_SOCKET=0`).
pub fn bind_control_socket(
    path: Option<&Path>,
    config: &Config,
) -> anyhow::Result<Option<ControlSocket>> {
    let Some(path) = path else {
        info!("no control socket (CONTROL_SOCKET=0): `appbroker ctl` cannot reach this broker");
        return Ok(None);
    };
    let group = config.general.control_group.as_deref();
    let mut bound = ControlSocket::bind(path, group);
    if let Err(SocketError::Live(_)) = &bound
        && std::env::var_os(appbroker::supervisor::LISTENERS_ENV).is_some()
    {
        // A supervised broker replacing another (the ports changed): the one draining keeps
        // its connection to the socket, the new one takes the path.
        info!(
            "taking the control socket {} over from the broker this one replaces",
            path.display()
        );
        let _ = std::fs::remove_file(path);
        bound = ControlSocket::bind(path, group);
    }
    match bound {
        Ok(socket) => Ok(Some(socket)),
        // Another broker runs this file, or the operator named a socket or group that cannot
        // be: a start that says so beats a broker nobody can administer.
        Err(e @ SocketError::Live(_)) | Err(e @ SocketError::NoGroup(_)) => Err(e.into()),
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
pub fn serve_control_socket(
    socket: Option<&mut ControlSocket>,
    admin: Arc<Admin>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
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
