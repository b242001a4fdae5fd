//! An upgrade, on the supervisor's side: asked on its socket, the new binary vetted beside
//! the loop ([`super::vet`], one upgrade at a time), then this process re-executed from it
//! (same pid) with the listeners, the running broker and the waiting `appbroker upgrade`
//! handed over; the next image answers once its new broker serves (or fails).

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use tracing::{error, info, warn};

use super::run::Supervisor;
use super::socket::answer;
use super::upgrade::{HANDOVER_ENV, Handover, LIFELINE_ENV, UPGRADE_FROM_ENV, timeout_of_file};
use super::vet::Vetting;
use super::{Held, LISTENERS_ENV, encode};
use crate::config::show_duration;
use crate::net::inherit;

impl Supervisor {
    /// `appbroker upgrade` asked on `client`: the new binary's vetting starts, unless another
    /// upgrade (or a new broker) is under way.
    pub(super) fn upgrade_asked(&mut self, client: UnixStream) {
        if self.vetting.is_some() {
            answer(
                client,
                "refused: an upgrade is in progress (its new binary is being checked); try \
                 again once it is answered",
            );
            return;
        }
        if self.next.is_some() || self.waiting.is_some() {
            answer(
                client,
                "refused: a new broker is starting already; try again once it serves",
            );
            return;
        }
        if self.stopping {
            answer(client, "refused: the supervisor is stopping");
            return;
        }
        let timeout = timeout_of_file(&self.config.source);
        info!(
            "supervisor: upgrade asked: checking {} (--check on the file, then \
             --handover-version) within {} (UPGRADE_TIMEOUT)",
            self.options.exe.display(),
            show_duration(timeout)
        );
        let vetting = Vetting::start(
            self.options.exe.clone(),
            self.config.source.clone(),
            timeout,
        );
        self.vetting = Some((vetting, client));
    }

    /// The vetting's `verdict`: the re-execution, or the refusal.
    pub(super) fn vetted(&mut self, verdict: Result<(), String>) {
        let Some((_, client)) = self.vetting.take() else {
            return;
        };
        let why = match verdict {
            Err(why) => {
                warn!("supervisor: upgrade refused: {why}; the running broker carries on");
                why
            }
            Ok(()) if self.next.is_some() => {
                let why = "a new broker started meanwhile (a reload changed the ports); try \
                           again once it serves";
                warn!("supervisor: upgrade refused: {why}");
                why.to_string()
            }
            Ok(()) => {
                let why = self.exec(&client);
                error!("supervisor: upgrade refused: {why}; the running broker carries on");
                why
            }
        };
        answer(
            client,
            &format!("refused: {why}; the running broker carries on"),
        );
    }

    /// The upgrade being vetted, if any, is refused because of `why` and its check killed.
    pub(super) fn abandon_upgrade(&mut self, why: &str) {
        if let Some((vetting, client)) = self.vetting.take() {
            // Dropped: its process group is killed.
            drop(vetting);
            warn!("supervisor: upgrade refused: {why}; its check was stopped");
            answer(client, &format!("refused: {why}; its check was stopped"));
        }
    }

    /// Re-executes this process from the binary on disk with the handover; returns only on
    /// failure, with why.
    fn exec(&self, client: &UnixStream) -> String {
        use std::os::unix::process::CommandExt;
        let Some(socket) = self.socket.listener() else {
            return "the supervisor has no socket".into();
        };
        let handover = Handover {
            child: self.current.pid,
            client: client.as_raw_fd(),
            socket: socket.as_raw_fd(),
            retired: self
                .retired
                .iter()
                .filter(|(_, waiter)| !waiter.is_finished())
                .map(|(pid, _)| *pid)
                .collect(),
            heartbeats: self.current.heartbeats(),
        };
        let lifeline = self.current.lifeline.as_ref();
        let handed = Held::hand_down(&self.held)
            .and_then(|()| inherit::hand_down(client))
            .and_then(|()| inherit::hand_down(socket))
            .and_then(|()| lifeline.map_or(Ok(()), inherit::hand_down));
        let why = match handed {
            Err(e) => format!(
                "cannot hand the sockets down: {}",
                crate::process::os_error::words(&e)
            ),
            Ok(()) => {
                info!(
                    "supervisor: re-executing {} (same pid)",
                    self.options.exe.display()
                );
                let mut command = std::process::Command::new(&self.options.exe);
                command
                    .arg("--supervise")
                    .args(&self.options.args)
                    .env(LISTENERS_ENV, encode(&Held::entries(&self.held)))
                    .env(HANDOVER_ENV, handover.encode())
                    .env(UPGRADE_FROM_ENV, env!("CARGO_PKG_VERSION"))
                    .env_remove(LIFELINE_ENV)
                    // What systemd passed is in LISTENERS_ENV now; the same pid must not take
                    // it twice.
                    .env_remove("LISTEN_FDS")
                    .env_remove("LISTEN_PID")
                    .env_remove("LISTEN_FDNAMES");
                if let Some(lifeline) = lifeline {
                    command.env(LIFELINE_ENV, lifeline.as_raw_fd().to_string());
                }
                let e = command.exec();
                format!(
                    "cannot re-execute {}: {}",
                    self.options.exe.display(),
                    crate::process::os_error::words(&e)
                )
            }
        };
        // Still this image: the listeners, the socket and the broker's end must not leak into
        // the processes it starts from now on (a child holding the end would keep another
        // alive as an orphan). The client is answered and closed by the caller.
        let _ = Held::keep(&self.held);
        let _ = inherit::keep(socket);
        if let Some(lifeline) = lifeline {
            let _ = inherit::keep(lifeline);
        }
        why
    }
}
