//! An upgrade, on the supervisor's side: asked on its socket, the new binary opened and
//! vetted beside the loop ([`super::vet`], one upgrade at a time), then this process
//! re-executed from that very open file (`fexecve`, same pid) with the listeners, the running
//! broker and the waiting `appbroker upgrade` handed over; the next image answers once its new
//! broker serves (or fails). The path is read once, when the file is opened: a file renamed
//! over it between the check and the re-execution is never run. A `#!` script cannot be
//! executed through a close-on-exec descriptor (the interpreter could not open it), so an
//! upgrade to one is refused, saying so: an upgrade installs the broker's binary.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;

use tracing::{error, info, warn};

use super::main_loop::Supervisor;
use super::socket::answer;
use super::upgrade::{HANDOVER_ENV, Handover, LIFELINE_ENV, UPGRADE_FROM_ENV, timeout_of_file};
use super::vet::Vetting;
use super::{HeldListeners, LISTENERS_ENV, encode};
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
        match Vetting::start(
            self.options.exe.clone(),
            self.config.source.clone(),
            timeout,
        ) {
            Ok(vetting) => self.vetting = Some((vetting, client)),
            Err(why) => {
                warn!("supervisor: upgrade refused: {why}; the running broker carries on");
                answer(
                    client,
                    &format!("refused: {why}; the running broker carries on"),
                );
            }
        }
    }

    /// The vetting's `verdict`: the re-execution, or the refusal.
    pub(super) fn vetted(&mut self, verdict: Result<(), String>) {
        let Some((vetting, client)) = self.vetting.take() else {
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
                let why = self.exec(&client, &vetting.image);
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

    /// Re-executes this process from `image`, the file vetted, with the handover; returns
    /// only on failure, with why.
    fn exec(&self, client: &UnixStream, image: &File) -> String {
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
        let handed = HeldListeners::hand_down(&self.held)
            .and_then(|()| inherit::hand_down(client))
            .and_then(|()| inherit::hand_down(socket))
            .and_then(|()| lifeline.map_or(Ok(()), inherit::hand_down));
        let why = match handed {
            Err(e) => format!(
                "cannot hand the sockets down: {}",
                crate::support::os_error::words(&e)
            ),
            Ok(()) => {
                info!(
                    "supervisor: re-executing {}, the file checked (same pid)",
                    self.options.exe.display()
                );
                let mut env: Vec<(String, String)> = vec![
                    (
                        LISTENERS_ENV.into(),
                        encode(&HeldListeners::entries(&self.held)),
                    ),
                    (HANDOVER_ENV.into(), handover.encode()),
                    (UPGRADE_FROM_ENV.into(), env!("CARGO_PKG_VERSION").into()),
                ];
                if let Some(lifeline) = lifeline {
                    env.push((LIFELINE_ENV.into(), lifeline.as_raw_fd().to_string()));
                }
                self.fexecve(image, &env)
            }
        };
        // Still this image: the listeners, the socket and the broker's end must not leak into
        // the processes it starts from now on (a child holding the end would keep another
        // alive as an orphan). The client is answered and closed by the caller.
        let _ = HeldListeners::keep(&self.held);
        let _ = inherit::keep(socket);
        if let Some(lifeline) = lifeline {
            let _ = inherit::keep(lifeline);
        }
        why
    }

    /// `fexecve` of `image` as `<exe> --supervise <args>`, with this process's environment
    /// less what one image must not take twice, and `set` added; returns only on failure,
    /// with why.
    fn fexecve(&self, image: &File, set: &[(String, String)]) -> String {
        // What systemd passed is in LISTENERS_ENV now; the same pid must not take it twice.
        let dropped = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", LIFELINE_ENV];
        let mut env: Vec<Vec<u8>> = std::env::vars_os()
            .filter(|(name, _)| {
                let name = name.to_string_lossy();
                !dropped.contains(&name.as_ref()) && !set.iter().any(|(n, _)| *n == name)
            })
            .map(|(name, value)| [name.as_bytes(), b"=", value.as_bytes()].concat())
            .collect();
        env.extend(set.iter().map(|(n, v)| format!("{n}={v}").into_bytes()));
        let mut args = vec![self.options.exe.as_os_str().as_bytes().to_vec()];
        args.push(b"--supervise".to_vec());
        args.extend(self.options.args.iter().map(|a| a.as_bytes().to_vec()));
        let (Ok(args), Ok(env)) = (c_strings(args), c_strings(env)) else {
            return "an argument or variable holds a NUL byte".into();
        };
        let Err(errno) = nix::unistd::fexecve(image, &args, &env);
        let shown = self.options.exe.display();
        if errno == nix::errno::Errno::ENOENT && is_script(image) {
            return format!(
                "{shown} is a script (#!): an upgrade runs the very file it checked, through \
                 its open descriptor, and a script cannot be run that way; install the \
                 appbroker binary itself"
            );
        }
        format!(
            "cannot re-execute {shown}: {}",
            crate::support::os_error::words(&std::io::Error::from(errno))
        )
    }
}

/// `items` as C strings; an error when one holds a NUL byte.
fn c_strings(items: Vec<Vec<u8>>) -> Result<Vec<CString>, std::ffi::NulError> {
    items.into_iter().map(CString::new).collect()
}

/// True when `file` begins with `#!`: a script, which `fexecve` refuses through a
/// close-on-exec descriptor.
fn is_script(file: &File) -> bool {
    let mut start = [0u8; 2];
    std::os::unix::fs::FileExt::read_at(file, &mut start, 0).is_ok_and(|n| n == 2)
        && start == *b"#!"
}
