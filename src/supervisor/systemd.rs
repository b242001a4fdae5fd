//! systemd's side of supervised mode: `Type=notify` (READY=1 on `$NOTIFY_SOCKET` once the
//! first broker serves: one datagram, no crate needed) and socket activation (the listeners
//! of an `appbroker.socket` unit, `$LISTEN_FDS` from descriptor 3, matched to the
//! configuration's balancers by address and port).

use std::os::unix::net::UnixDatagram;

use tracing::{info, warn};

use super::{Held, InheritedError};
use crate::config::Config;
use crate::inherit;

/// The variables systemd sets for the process it starts, which are not the children's.
pub const VARIABLES: [&str; 4] = [
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

/// Sends `state` (`READY=1`) to systemd's notify socket; false when there is none (not run
/// by systemd as `Type=notify`).
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket (Linux): `@` stands for the leading NUL.
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &address)?;
            return Ok(true);
        }
        #[cfg(not(target_os = "linux"))]
        return Err(std::io::Error::other(format!(
            "abstract NOTIFY_SOCKET {} on a system without them",
            String::from_utf8_lossy(name)
        )));
    }
    socket.send_to(state.as_bytes(), &path)?;
    Ok(true)
}

/// The listeners systemd passed this process (`LISTEN_PID` is its pid), each kept for the
/// balancer of `config` with the same address and port; the others are closed with a warning.
/// Balancers without one are bound as usual (by [`super::hold`]), with a notice. Empty when
/// systemd passed none.
pub fn activated(config: &Config) -> Result<Vec<Held>, InheritedError> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok());
    let (Some(pid), Some(count)) = (ours, count) else {
        return Ok(Vec::new());
    };
    if pid != std::process::id() {
        return Ok(Vec::new());
    }
    // systemd makes one socket per `ListenStream=`, where a balancer bound here gets one
    // SO_REUSEPORT socket per worker thread: every worker accepts on systemd's socket instead,
    // each on a descriptor of its own (the kernel gives each connection to one of them; not
    // spread as evenly as by SO_REUSEPORT, but no worker is left out).
    let workers = crate::workers::listeners_for(config.general.workers as usize);
    let mut held: Vec<Held> = Vec::new();
    for fd in FIRST_FD..FIRST_FD + count {
        let listener = inherit::take_listener(fd)?;
        let address = listener
            .local_addr()
            .map_err(|source| inherit::InheritError::NotSocket { fd, source })?;
        match config.balancers.iter().find(|b| b.listen == address) {
            Some(b) if !held.iter().any(|h| h.configured == b.listen) => {
                let shared = if workers > 1 {
                    format!(" (one socket, shared by {workers} worker threads)")
                } else {
                    String::new()
                };
                info!(
                    "supervisor: {} listens on {address}, passed by systemd{shared}",
                    b.kind
                );
                let mut listeners = Vec::with_capacity(workers);
                for _ in 1..workers {
                    let copy = listener
                        .try_clone()
                        .map_err(|source| inherit::InheritError::NotSocket { fd, source })?;
                    listeners.push(copy);
                }
                listeners.push(listener);
                held.push(Held {
                    configured: b.listen,
                    listeners,
                });
            }
            _ => warn!(
                "supervisor: systemd passed a socket on {address} that no balancer of the \
                 configuration listens on: closed (make the .socket unit's ListenStream= match \
                 LOCAL_SERVER_ADDRESS and LOCAL_SERVER_PORT)"
            ),
        }
    }
    for b in &config.balancers {
        if !held.iter().any(|h| h.configured == b.listen) {
            info!(
                "supervisor: systemd passed no socket for {} on {}: binding it as usual",
                b.kind, b.listen
            );
        }
    }
    Ok(held)
}
