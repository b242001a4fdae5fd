//! A broker replaced by another on the listeners the supervisor holds: after a reload that
//! changed the ports (the file read again on SIGHUP or when a broker asks, the new ports
//! held, a new broker started on them) or an upgrade; the replacing broker's word or end, and
//! the old one retired to drain in the background.

use nix::sys::signal::Signal;
use tracing::{error, info};

use super::child::{Child, OWN_IMAGE};
use super::link::Supervised;
use super::main_loop::{Supervisor, tell_systemd_ready, without_heartbeats};
use super::{describe, hold};
use crate::balancer::alert_queue::{Alert, Upgraded};
use crate::config::{AlertEvent, Config, show_duration};

/// What reading the file again came to.
enum Reread {
    /// The same listen addresses (or a file the broker will refuse): it reloads in place.
    Same,
    /// New ones, held now; a new broker starts on them. The line says so.
    Replacing(String),
    /// New ones that cannot be held or served: why. The running broker keeps its ports.
    Failed(String),
}

impl Supervisor {
    /// The replacing child closed its READY socket, with the word (`said`) or without.
    pub(super) fn next_said(&mut self, said: bool) {
        if let Some(next) = self.next.as_mut() {
            next.ready = None;
        }
        if said {
            self.next_serves();
        }
    }

    /// The replacing child ended before it served: the running one carries on.
    pub(super) fn next_ended(&mut self, status: std::process::ExitStatus) {
        if let Some(next) = self.next.take() {
            // An upgrade's new broker: nothing was upgraded.
            self.upgrade = None;
            let ended = match self.start_killed.take() {
                Some((pid, why)) if pid == next.pid => why,
                _ => describe(status),
            };
            let what = format!(
                "the new broker (pid {}) {ended} before it served; the running one (pid {}) \
                 carries on",
                next.pid, self.current.pid
            );
            error!("supervisor: {what}");
            self.answer(&format!("refused: {what} (its log says why)"));
        }
    }

    /// The replacing child said READY: it becomes the current one, and the old one drains.
    pub(super) fn next_serves(&mut self) {
        let Some(mut next) = self.next.take() else {
            return;
        };
        next.served = true;
        tell_systemd_ready();
        let old = std::mem::replace(&mut self.current, next);
        let line = format!(
            "upgraded: broker (pid {}) serves; the previous one (pid {}) drains",
            self.current.pid, old.pid
        );
        self.answer(&line);
        info!(
            "supervisor: broker (pid {}) serves; the previous one (pid {}) stops accepting and \
             drains its connections",
            self.current.pid, old.pid
        );
        without_heartbeats(&self.current);
        self.tell_upgraded();
        old.hand_over();
        self.retire(old);
    }

    /// `broker_upgraded`, once the broker an upgrade started serves: the one event of an
    /// upgrade (neither broker tells of its start or its stop).
    pub(super) fn tell_upgraded(&mut self) {
        let Some(upgrade) = self.upgrade.take() else {
            return;
        };
        let upgraded = Upgraded {
            from_version: upgrade.from_version,
            to_version: env!("CARGO_PKG_VERSION").to_string(),
            from_pid: upgrade.from_pid,
            to_pid: self.current.pid,
            handover_ms: upgrade.since.elapsed().as_millis() as u64,
        };
        self.tell(Some(Alert {
            upgrade: Some(upgraded),
            ..Alert::new(AlertEvent::BrokerUpgraded)
        }));
    }
    /// Waits for a broker that drains, in the background, and logs its end.
    pub(super) fn retire(&mut self, mut old: Child) {
        self.retired.retain(|(_, waiter)| !waiter.is_finished());
        let pid = old.pid;
        let waiter = tokio::spawn(async move {
            if let Ok(status) = old.wait().await {
                info!(
                    "supervisor: the previous broker (pid {}) {}",
                    old.pid,
                    describe(status)
                );
            }
        });
        self.retired.push((pid, waiter));
    }

    /// SIGHUP: the file read again; the child reloads in place when the ports are the same,
    /// else a new child on the new set replaces it.
    pub(super) fn reload(&mut self) {
        match self.reread() {
            Reread::Same => {
                info!("supervisor: received SIGHUP; passing it on to the broker");
                self.current.signal(Signal::SIGHUP);
            }
            Reread::Replacing(line) => info!("supervisor: received SIGHUP: {line}"),
            Reread::Failed(why) => error!("supervisor: {why}"),
        }
    }

    /// A reload asked of broker `pid` (`appbroker ctl reload`, or a SIGHUP sent to it rather
    /// than to the supervisor), which asks this supervisor first. The file is read as on
    /// SIGHUP: new ports are held and a new broker starts on them (`replaced`); with the
    /// ports the asking broker runs on, it reloads itself (`in place`). One that runs on
    /// other ports is being replaced already (by a reload that came first): it is told so,
    /// and does not bind ports the supervisor holds.
    pub(super) fn reload_asked(&mut self, pid: u32) {
        let answer = match self.reread() {
            Reread::Failed(why) => {
                error!("supervisor: reload asked by the broker (pid {pid}): {why}");
                Supervised::Refused(why)
            }
            Reread::Replacing(line) => {
                info!("supervisor: reload asked by the broker (pid {pid}): {line}");
                Supervised::Replaced(line)
            }
            Reread::Same => {
                let now: Vec<_> = self.config.balancers.iter().map(|b| b.listen).collect();
                let behind = self
                    .child(pid)
                    .and_then(|c| c.listens.as_ref())
                    .is_some_and(|l| *l != now);
                match &self.next {
                    Some(next) if behind && next.pid != pid => Supervised::Replaced(format!(
                        "the ports changed; a new broker (pid {}) starts on them (held by the \
                         supervisor) and replaces this one (pid {pid}) once it serves",
                        next.pid
                    )),
                    _ => Supervised::InPlace,
                }
            }
        };
        // A broker already replaced and draining gets no answer: it reloads in place once
        // its wait is over, which changes nothing that matters for a broker that stops.
        if let Some(child) = self.child(pid) {
            child.tell(&answer);
        }
    }

    /// The running or the replacing broker, by pid.
    fn child(&self, pid: u32) -> Option<&Child> {
        [Some(&self.current), self.next.as_ref()]
            .into_iter()
            .flatten()
            .find(|c| c.pid == pid)
    }

    /// Reads the file again and makes the listeners held the ones it names; a new child on
    /// them when they changed, which replaces the running one once it serves.
    fn reread(&mut self) -> Reread {
        let Ok(loaded) = Config::from_path(&self.config.source) else {
            // The broker reads it too and says what is wrong; the running one carries on.
            return Reread::Same;
        };
        let config = loaded.config;
        let addresses = |c: &Config| c.balancers.iter().map(|b| b.listen).collect::<Vec<_>>();
        if addresses(&config) == addresses(&self.config) {
            self.take_config(config);
            return Reread::Same;
        }
        if let Err(e) = hold(&config, &mut self.held) {
            return Reread::Failed(format!("{e}; the broker keeps the ports it has"));
        }
        self.take_config(config);
        let replaces = Some(self.current.pid);
        match Child::spawn(&self.options, &self.held, &self.ears, replaces) {
            Ok(child) => {
                let line = format!(
                    "the ports changed; a new broker (pid {}) starts on them (held by the \
                     supervisor) and replaces the running one (pid {}) once it serves",
                    child.pid, self.current.pid
                );
                if let Some(previous) = self.next.replace(child) {
                    previous.signal(Signal::SIGTERM);
                }
                Reread::Replacing(line)
            }
            Err(e) => Reread::Failed(format!(
                "cannot start the broker from this supervisor's own image ({}, installed as \
                 {}): {}",
                OWN_IMAGE,
                self.options.exe.display(),
                crate::support::os_error::words(&e)
            )),
        }
    }

    /// `config`, read again, becomes the supervisor's: the watchdog's new limit applies to
    /// every broker from now on.
    fn take_config(&mut self, config: Config) {
        let limit = config.general.watchdog_timeout;
        if limit != self.config.general.watchdog_timeout {
            info!(
                "supervisor: WATCHDOG_TIMEOUT is now {}",
                if limit.is_zero() {
                    "0 (off)".to_string()
                } else {
                    show_duration(limit)
                }
            );
        }
        self.watchdog.send_replace(limit);
        self.config = config;
    }
}
