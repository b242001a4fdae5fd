//! systemd's side of supervised mode: `Type=notify` (READY=1 on `$NOTIFY_SOCKET` once the
//! first broker serves: one datagram, no crate needed), its watchdog (`WatchdogSec=`:
//! WATCHDOG=1 from the supervisor's loop, so a supervisor that stops turning is restarted)
//! and socket activation (the listeners of an `appbroker.socket` unit, `$LISTEN_FDS` from
//! descriptor 3, matched to the configuration's balancers by address and port).

use std::os::unix::net::UnixDatagram;

use tracing::{info, warn};

use super::{HeldListeners, InheritedError};
use crate::config::Config;
use crate::net::inherit;

/// The variables systemd sets for the process it starts, which are not the children's.
pub const VARIABLES: [&str; 6] = [
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
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

/// systemd's watchdog on this process (`WatchdogSec=` sets `WATCHDOG_USEC`): WATCHDOG=1 at
/// half its period, as sd_watchdog_enabled(3) advises, from the supervisor's loop.
#[derive(Debug)]
pub struct Watchdog {
    every: tokio::time::Interval,
    /// The last WATCHDOG=1 failed: said once, until one goes through.
    failing: bool,
}

impl Watchdog {
    /// The watchdog systemd set for this process; `None` when it set none (or set it for
    /// another pid, `WATCHDOG_PID`).
    pub fn from_env() -> Option<Watchdog> {
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        if let Ok(pid) = std::env::var("WATCHDOG_PID")
            && pid.parse::<u32>().ok() != Some(std::process::id())
        {
            return None;
        }
        let every = std::time::Duration::from_micros(usec / 2);
        if every.is_zero() {
            return None;
        }
        info!(
            "supervisor: systemd's watchdog is on: WATCHDOG=1 every {}",
            crate::config::show_duration(every)
        );
        Some(Watchdog {
            every: tokio::time::interval(every),
            failing: false,
        })
    }

    /// Waits until the next WATCHDOG=1 is due.
    pub async fn due(&mut self) {
        self.every.tick().await;
    }

    /// Sends WATCHDOG=1; a failure is logged once per episode.
    pub fn tell(&mut self) {
        match notify("WATCHDOG=1") {
            Ok(_) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                warn!(
                    "supervisor: cannot tell systemd's watchdog it lives (NOTIFY_SOCKET): {}; \
                     systemd will restart the service if this goes on",
                    crate::support::os_error::words(&e)
                );
            }
            Err(_) => {}
        }
    }
}

/// The listeners systemd passed this process (`LISTEN_PID` is its pid), each kept for the
/// balancer of `config` with the same address and port; the others are closed with a warning.
/// Balancers without one are bound as usual (by [`super::hold`]), with a notice. Empty when
/// systemd passed none.
pub fn activated(config: &Config) -> Result<Vec<HeldListeners>, InheritedError> {
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
    let workers = crate::net::workers::listeners_for(config.general.workers as usize);
    let mut held: Vec<HeldListeners> = Vec::new();
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
                held.push(HeldListeners {
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
