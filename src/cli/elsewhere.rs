//! Off Unix, what stands in for each item of `cli/unix/`, under the same name: no control
//! socket, no supervisor, no upgrade. (`--supervise` and `--handover-version` are not
//! honoured there: the broker runs as without them.)

use std::net::TcpListener;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use appbroker::admin::Admin;
use appbroker::broker::Control;
use appbroker::config::Config;
use appbroker::net::workers::WorkerThreads;
use appbroker::support::logging;
use appbroker::support::shutdown::Shutdown;
use tokio::task::JoinHandle;
use tracing::info;

use super::args::Cli;

/// No supervisor without Unix.
pub fn upgrade(_cli: &Cli) -> ExitCode {
    logging::to_stderr("appbroker upgrade: the supervised mode needs a Unix system");
    ExitCode::from(1)
}

/// No control socket without Unix sockets.
pub fn bind_control_socket(_path: Option<&Path>, _config: &Config) -> anyhow::Result<Option<()>> {
    info!("no control socket on this system: `appbroker ctl` needs a Unix system");
    Ok(None)
}

/// Nothing to serve without Unix sockets.
pub fn serve_control_socket(
    _socket: Option<&mut ()>,
    _admin: Arc<Admin>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    Ok(None)
}

/// No supervisor without Unix, so no listeners handed down.
pub fn inherited(_config: &Config) -> anyhow::Result<Option<Vec<Vec<TcpListener>>>> {
    Ok(None)
}

/// No supervisor without Unix, so no broker to replace.
pub fn takes_over() -> Option<u32> {
    None
}

/// No supervisor without Unix: each step that would tell it something does nothing.
pub struct Supervision;

impl Supervision {
    /// No link to take.
    pub fn take() -> Supervision {
        Supervision
    }

    /// No one to send heartbeats to.
    pub async fn send_heartbeats(&self, _threads: &WorkerThreads) {}

    /// `admin` as it is.
    pub fn admin(&self, admin: Admin) -> Admin {
        admin
    }

    /// No one to tell.
    pub async fn ready(&self, _shutdown: &Shutdown) {}

    /// A SIGHUP reloads the file in place.
    pub fn on_sighup(&self, control: Control) -> impl Fn() + Send + 'static {
        move || control.reload_file_later()
    }
}
