//! Supervised mode (`appbroker --supervise`): a small parent that binds every listener the
//! configuration names and runs the broker as a child that inherits them, restarting it when
//! it dies. Clients that connect while no child runs wait in the listen backlog the parent
//! keeps open, and the next child serves them: a crash refuses no one.
//!
//! The parent does nothing else, so little in it can crash: it binds, spawns, waits, forwards
//! SIGHUP, SIGTERM and SIGINT, and reads a few short lines from each child (`READY`, once it
//! serves; its heartbeats, without which it is killed and replaced). The child finds its
//! listeners in [`LISTENERS_ENV`] (descriptor numbers and the configured address each serves)
//! and its way to say ready in [`READY_ENV`].
//!
//! - `main_loop`: the loop.
//! - `replacing`: a broker replaced by another (new ports after a reload, an upgrade), the
//!   old one retired.
//! - `child`: one broker and its lifeline.
//! - [`watchdog`]: the heartbeats judged.
//! - `vet`: an upgrade's new binary checked beside the loop.
//! - `reexec`: an upgrade's re-execution.
//! - `socket`: the supervisor's socket on the loop's side: accept, read the request, answer.
//! - [`upgrade`]: the supervisor's socket (where, binding it, asking on it) and what one image
//!   hands the next.
//! - [`systemd`]: notify, watchdog and socket activation.
//! - `link`: the broker's side ([`Link`]).
//!
//! A reload that adds or moves a port: the parent reads the file again on SIGHUP. When the
//! set of listen addresses is unchanged it forwards the SIGHUP and the child reloads in place;
//! when it changed, the parent binds the new addresses (so it holds every port the file names
//! from then on), starts a new child on them, and once that child serves, tells the old one
//! to stop (`retire` on its lifeline, then the end of it: it drains as on any shutdown, and
//! tells of no stop, since another broker serves its ports). The child cannot bind a port the
//! parent should hold and hand it back without passing descriptors over a socket, so the
//! parent, which must hold the port anyway, binds it, and the handover is the one a new child
//! makes.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use crate::config::Config;
use crate::net::inherit;

mod child;
mod link;
mod main_loop;
mod reexec;
mod replacing;
mod socket;
pub mod systemd;
pub mod upgrade;
mod vet;
pub mod watchdog;

pub use link::{HEARTBEAT, Link, Supervised};
pub use main_loop::{Options, Start, Upgrading, run};

/// The environment variable naming a supervised child's listeners: `FD@ADDRESS` entries
/// separated by commas, ADDRESS being the configured `LOCAL_SERVER_ADDRESS:LOCAL_SERVER_PORT`
/// the socket serves (several entries per address where SO_REUSEPORT spreads clients).
pub const LISTENERS_ENV: &str = "APPBROKER_LISTENERS";

/// The environment variable naming the socket a supervised child writes `READY` to once it
/// serves, and keeps for the rest of its life: its [`Link`] to the supervisor.
pub const READY_ENV: &str = "APPBROKER_READY_FD";

/// The environment variable naming the broker (its pid) a supervised child is started to
/// replace, on the same ports: an upgrade's new broker, or one on ports a reload changed. It
/// tells of no start of its own (the ports were served all along; the supervisor tells of an
/// upgrade). A broker of an earlier build ignores it.
pub const TAKES_OVER_ENV: &str = "APPBROKER_TAKES_OVER";

/// The first delay before restarting a child that died before it served.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest delay between restarts of a child that keeps dying at start: long enough not
/// to spin on a broken binary or file, short enough that a fix is picked up soon.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How long to wait before starting the next child: none after a child that served (a crash
/// in service is restarted at once), doubling from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`] while
/// children die before they serve. Pure, so its arithmetic is tested without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// The delay before the next start, after a child that `served` (said READY) or not.
    pub fn after_exit(&mut self, served: bool) -> Duration {
        if served {
            *self = Backoff::default();
            return Duration::ZERO;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        delay
    }
}

/// An exit status in words for the log: `exited with code 1`, `killed by SIGKILL`.
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    let Some(signal) = status.signal() else {
        return format!("ended ({status})");
    };
    let name = nix::sys::signal::Signal::try_from(signal)
        .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string());
    let core = if status.core_dumped() {
        " (core dumped)"
    } else {
        ""
    };
    format!("killed by {name}{core}")
}

/// `entries` as [`LISTENERS_ENV`] holds them.
pub fn encode(entries: &[(RawFd, SocketAddr)]) -> String {
    let parts: Vec<String> = entries
        .iter()
        .map(|(fd, addr)| format!("{fd}@{addr}"))
        .collect();
    parts.join(",")
}

/// [`LISTENERS_ENV`]'s text as entries, or what is wrong with it.
pub fn decode(text: &str) -> Result<Vec<(RawFd, SocketAddr)>, String> {
    text.split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (fd, addr) = part
                .split_once('@')
                .ok_or_else(|| format!("`{part}` is not FD@ADDRESS"))?;
            let fd = fd
                .parse()
                .map_err(|_| format!("`{fd}` in `{part}` is not a descriptor number"))?;
            let addr = addr
                .parse()
                .map_err(|_| format!("`{addr}` in `{part}` is not an address and port"))?;
            Ok((fd, addr))
        })
        .collect()
}

/// Why a supervised child cannot take its listeners.
#[derive(Debug, thiserror::Error)]
pub enum InheritedError {
    /// The environment variable is malformed.
    #[error("{LISTENERS_ENV} is malformed: {0}")]
    Malformed(String),
    /// A descriptor cannot be taken.
    #[error("cannot take a listener from the supervisor: {0}")]
    Take(#[from] inherit::InheritError),
    /// The configuration names an address the supervisor did not bind.
    #[error(
        "the supervisor holds no listener for {0} (the file changed since it read it: send \
         SIGHUP to the supervisor, or restart it)"
    )]
    Missing(SocketAddr),
}

/// The listeners handed down by a supervisor, one set per balancer of `config` in its order;
/// `None` when this process is not a supervised child. Listeners for addresses the
/// configuration no longer names are closed.
pub fn inherited_listeners(
    config: &Config,
) -> Result<Option<Vec<Vec<StdListener>>>, InheritedError> {
    let Ok(text) = std::env::var(LISTENERS_ENV) else {
        return Ok(None);
    };
    let entries = decode(&text).map_err(InheritedError::Malformed)?;
    let mut by_address: BTreeMap<SocketAddr, Vec<StdListener>> = BTreeMap::new();
    for (fd, addr) in entries {
        by_address
            .entry(addr)
            .or_default()
            .push(inherit::take_listener(fd)?);
    }
    let mut sets = Vec::with_capacity(config.balancers.len());
    for balancer in &config.balancers {
        let set = by_address
            .remove(&balancer.listen)
            .ok_or(InheritedError::Missing(balancer.listen))?;
        sets.push(set);
    }
    Ok(Some(sets))
}

/// The listeners a previous image of this supervisor held, from [`LISTENERS_ENV`] (after an
/// upgrade's re-execution); empty when there is none.
pub fn inherited_held() -> Result<Vec<HeldListeners>, InheritedError> {
    let Ok(text) = std::env::var(LISTENERS_ENV) else {
        return Ok(Vec::new());
    };
    let mut held: Vec<HeldListeners> = Vec::new();
    for (fd, addr) in decode(&text).map_err(InheritedError::Malformed)? {
        let listener = inherit::take_listener(fd)?;
        match held.iter_mut().find(|h| h.configured == addr) {
            Some(h) => h.listeners.push(listener),
            None => held.push(HeldListeners {
                configured: addr,
                listeners: vec![listener],
            }),
        }
    }
    Ok(held)
}

/// The listening sockets a supervisor holds for one configured address.
#[derive(Debug)]
pub struct HeldListeners {
    /// The address as configured (what the child matches its balancers by).
    pub configured: SocketAddr,
    /// Its sockets (one per worker where SO_REUSEPORT spreads clients).
    pub listeners: Vec<StdListener>,
}

impl HeldListeners {
    /// The entries of [`LISTENERS_ENV`] for `held`.
    pub fn entries(held: &[HeldListeners]) -> Vec<(RawFd, SocketAddr)> {
        held.iter()
            .flat_map(|h| h.listeners.iter().map(|l| (l.as_raw_fd(), h.configured)))
            .collect()
    }

    /// Makes every socket of `held` inherited by the next process this one starts (a broker)
    /// or becomes (an upgrade's exec); [`HeldListeners::keep`] right after, so nothing else started
    /// later (an upgrade's check) inherits them.
    pub fn hand_down(held: &[HeldListeners]) -> std::io::Result<()> {
        for listener in held.iter().flat_map(|h| &h.listeners) {
            inherit::hand_down(&listener.as_fd())?;
        }
        Ok(())
    }

    /// Closes every socket of `held` on exec again, after a [`HeldListeners::hand_down`].
    pub fn keep(held: &[HeldListeners]) -> std::io::Result<()> {
        for listener in held.iter().flat_map(|h| &h.listeners) {
            inherit::keep(&listener.as_fd())?;
        }
        Ok(())
    }
}

/// Makes `held` the listeners `config` names, in its order: binds what it lacks, keeps
/// what it still names, closes the rest. Nothing changes when an address cannot be bound.
pub fn hold(config: &Config, held: &mut Vec<HeldListeners>) -> Result<(), crate::BindError> {
    let count = crate::net::workers::listeners_for(config.general.workers as usize);
    let mut fresh: Vec<HeldListeners> = Vec::new();
    for balancer in &config.balancers {
        let known = |h: &HeldListeners| h.configured == balancer.listen;
        if !held.iter().any(known) && !fresh.iter().any(known) {
            // The same port at the wildcard instead of one address, or the other way round:
            // beside the sockets held, which go once the new broker serves.
            let moved = held
                .iter()
                .any(|h| switches_wildcard(h.configured, balancer.listen));
            let listeners = if moved {
                crate::net::listener::bind_beside(balancer, count)?
            } else {
                crate::net::listener::bind(balancer, count)?
            };
            fresh.push(HeldListeners {
                configured: balancer.listen,
                listeners,
            });
        }
    }
    let mut all: BTreeMap<SocketAddr, HeldListeners> = held
        .drain(..)
        .chain(fresh)
        .map(|h| (h.configured, h))
        .collect();
    *held = config
        .balancers
        .iter()
        .filter_map(|b| all.remove(&b.listen))
        .collect();
    Ok(())
}

/// True when `to` is `from`'s port at the wildcard instead of one address, or the other way
/// round (the same family).
fn switches_wildcard(from: SocketAddr, to: SocketAddr) -> bool {
    from.port() == to.port()
        && from.is_ipv4() == to.is_ipv4()
        && from.ip().is_unspecified() != to.ip().is_unspecified()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_100ms_to_10s_while_children_die_at_start_and_resets_after_one_served() {
        let mut backoff = Backoff::default();
        let delays: Vec<u64> = (0..10)
            .map(|_| backoff.after_exit(false).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
        );
        assert_eq!(backoff.after_exit(true), Duration::ZERO);
        assert_eq!(backoff.after_exit(false), FIRST_BACKOFF);
    }

    #[test]
    fn listeners_round_trip_through_the_environment() {
        let entries = vec![
            (3, "0.0.0.0:5000".parse().unwrap()),
            (4, "0.0.0.0:5000".parse().unwrap()),
            (5, "[::1]:8080".parse().unwrap()),
        ];
        assert_eq!(decode(&encode(&entries)).unwrap(), entries);
        assert_eq!(decode("").unwrap(), vec![]);
        for bad in ["3", "x@0.0.0.0:1", "3@nowhere", "3@0.0.0.0"] {
            assert!(decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn statuses_in_words() {
        // Raw wait statuses: exit code in the high byte, signal number in the low bits.
        assert_eq!(describe(ExitStatus::from_raw(1 << 8)), "exited with code 1");
        assert_eq!(describe(ExitStatus::from_raw(9)), "killed by SIGKILL");
        assert_eq!(
            describe(ExitStatus::from_raw(11 | 0x80)),
            "killed by SIGSEGV (core dumped)"
        );
    }
}
