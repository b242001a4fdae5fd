//! The supervisor's loop: start a child on the listeners held, wait for it to serve or die,
//! restart it (with back-off while it dies at start, at once after it served, or once the
//! watchdog killed it for its silence), forward signals, replace it with a new child when a
//! reload changes the ports, and tell systemd it lives. An upgrade asked on its socket is
//! vetted beside the loop and carried out by `reexec`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use super::child::{Child, Ears, Heard, ended};
use super::socket::{self, UpgradeSocket};
use super::upgrade::Handover;
use super::vet::Vetting;
use super::watchdog::Silence;
use super::{Backoff, HeldListeners, describe};
use crate::balancer::alert_queue::Alert;
use crate::config::{AlertEvent, Config, show_duration};

/// What the supervisor runs: its own image (never the file now at `exe`: see
/// `child::OWN_IMAGE`) with the command line it was given, less `--supervise`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the binary is installed: what `appbroker upgrade` vets and re-executes from,
    /// and how the brokers' command line names their program.
    pub exe: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// READY=1 to systemd (`Type=notify`), when it runs the supervisor; again after an upgrade,
/// which systemd takes as the same news.
pub(super) fn tell_systemd_ready() {
    match super::systemd::notify("READY=1") {
        Ok(true) => info!("supervisor: told systemd it is ready"),
        Ok(false) => {}
        Err(e) => warn!(
            "supervisor: cannot tell systemd it is ready (NOTIFY_SOCKET): {}",
            crate::support::os_error::words(&e)
        ),
    }
}

/// The supervisor's exit code after its child's `status`: the child's own code; 0 when a stop
/// was forwarded and the child ended by that signal (it had no handler yet: it was starting);
/// else 1.
fn stop_code(status: std::process::ExitStatus, stopping: bool) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let forwarded = [Signal::SIGTERM as i32, Signal::SIGINT as i32];
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) if stopping && forwarded.contains(&signal) => 0,
        _ => 1,
    }
}

/// What happened to the replacing child.
enum NextEvent {
    /// It closed its READY socket: with the word (true) or without.
    Said(bool),
    /// It ended.
    Ended(std::io::Result<std::process::ExitStatus>),
}

/// The signals the supervisor takes.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// What the supervisor's loop is doing.
pub(super) struct Supervisor {
    pub(super) options: Options,
    pub(super) config: Config,
    pub(super) held: Vec<HeldListeners>,
    pub(super) backoff: Backoff,
    /// The child serving (or starting, when none served yet).
    pub(super) current: Child,
    /// A child replacing `current` after a reload changed the ports or an upgrade, until it
    /// serves.
    pub(super) next: Option<Child>,
    /// A stop was forwarded: the supervisor ends with the child.
    pub(super) stopping: bool,
    /// When the last child died, to say how long the ports went unserved.
    pub(super) died_at: Option<Instant>,
    /// The socket `appbroker upgrade` asks on.
    pub(super) socket: UpgradeSocket,
    /// Where children's lifelines report, and the watchdog's limit they read.
    pub(super) ears: Ears,
    /// `WATCHDOG_TIMEOUT`, as the lifelines' readers see it.
    pub(super) watchdog: watch::Sender<Duration>,
    /// The upgrade whose new binary is being vetted, with the `appbroker upgrade` asking.
    pub(super) vetting: Option<(Vetting, std::os::unix::net::UnixStream)>,
    /// The `appbroker upgrade` waiting for the new broker to serve (or fail).
    pub(super) waiting: Option<std::os::unix::net::UnixStream>,
    /// Brokers replaced and draining, with what waits for them: handed to the next image
    /// on an upgrade, which waits for them in turn.
    pub(super) retired: Vec<(u32, tokio::task::JoinHandle<()>)>,
    /// The watchdog killed the running broker (pid, its silence in words): its end is told
    /// so in `broker_restarted`.
    pub(super) watchdog_killed: Option<(u32, String)>,
    /// A replacing broker killed for not announcing its heartbeats in time (pid, why in
    /// words): the refusal of its upgrade says so.
    pub(super) start_killed: Option<(u32, String)>,
    /// The upgrade this image was re-executed for, until its new broker serves (then it is
    /// told, as `broker_upgraded`) or fails.
    pub(super) upgrade: Option<UnderWay>,
}

/// An upgrade under way in this image: what `broker_upgraded` tells once its broker serves.
pub(super) struct UnderWay {
    /// The previous image's version, when it said ([`super::upgrade::UPGRADE_FROM_ENV`]).
    pub(super) from_version: Option<String>,
    /// The broker it replaces.
    pub(super) from_pid: u32,
    /// When this image took over: the handover is timed from here.
    pub(super) since: Instant,
}

/// Where the supervisor starts from.
pub struct Start {
    /// The configuration it read.
    pub config: Config,
    /// The listeners `config` names, bound already (or inherited).
    pub held: Vec<HeldListeners>,
    /// What to run.
    pub options: Options,
    /// Its socket for `appbroker upgrade` (`None` with `CONTROL_SOCKET=0`).
    pub socket: Option<std::os::unix::net::UnixListener>,
    /// After an upgrade's re-execution: what the previous image handed over.
    pub upgrading: Option<Upgrading>,
}

/// What a supervisor re-executed by an upgrade takes over from its previous image.
pub struct Upgrading {
    /// The pids and descriptor numbers it was told.
    pub handover: Handover,
    /// The connection of `appbroker upgrade`, waiting for the answer.
    pub client: std::os::unix::net::UnixStream,
    /// The supervisor's end of the running broker's socket
    /// ([`super::upgrade::LIFELINE_ENV`]), kept open so that broker does not take the
    /// re-execution for the supervisor's death.
    pub lifeline: Option<std::os::unix::net::UnixStream>,
    /// The previous image's version ([`super::upgrade::UPGRADE_FROM_ENV`]), for
    /// `broker_upgraded`; `None` from an image that did not say.
    pub from_version: Option<String>,
}

/// What the loop hears from its sources besides the children's ends.
struct Sources {
    signals: Signals,
    /// What the children's lifelines bring.
    heard: mpsc::Receiver<Heard>,
    /// systemd's watchdog (`WATCHDOG_USEC`), when it watches.
    systemd: Option<super::systemd::Watchdog>,
}

/// Runs the supervisor until its child stops on purpose (after a forwarded SIGTERM or SIGINT,
/// or an exit with code 0); the exit code to end with.
pub async fn run(start: Start) -> std::io::Result<u8> {
    let signals = Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
        hup: signal(SignalKind::hangup())?,
    };
    let Start {
        config,
        held,
        options,
        socket,
        upgrading,
    } = start;
    let (heard_tx, heard) = mpsc::channel(4);
    let (watchdog, limit) = watch::channel(config.general.watchdog_timeout);
    let ears = Ears {
        heard: heard_tx,
        watchdog: limit,
    };
    let socket = UpgradeSocket::new(socket)?;
    let retiring = upgrading
        .as_ref()
        .map(|u| u.handover.retired.clone())
        .unwrap_or_default();
    let upgrade = upgrading.as_ref().map(|u| UnderWay {
        from_version: u.from_version.clone(),
        from_pid: u.handover.child,
        since: Instant::now(),
    });
    let (current, next, waiting) = first_children(&options, &held, &ears, upgrading)?;
    let systemd = super::systemd::Watchdog::from_env();
    let mut supervisor = Supervisor {
        options,
        config,
        held,
        backoff: Backoff::default(),
        current,
        next,
        stopping: false,
        died_at: None,
        socket,
        ears,
        watchdog,
        vetting: None,
        waiting,
        retired: Vec::new(),
        watchdog_killed: None,
        start_killed: None,
        upgrade,
    };
    for pid in retiring {
        // Draining already: their ends were not handed over, and they need none (a broker
        // that drains ignores its supervisor's end).
        let ears = supervisor.ears.clone();
        supervisor.retire(Child::adopt(pid, None, None, &ears));
    }
    let mut sources = Sources {
        signals,
        heard,
        systemd,
    };
    let code = supervisor.watch(&mut sources).await;
    supervisor.abandon_upgrade("the supervisor is stopping");
    supervisor.socket.remove();
    code
}

/// The children the supervisor starts with: a broker on the listeners held; after an
/// upgrade's re-execution, the running broker adopted, a new one starting to replace it, and
/// the `appbroker upgrade` waiting for that.
fn first_children(
    options: &Options,
    held: &[HeldListeners],
    ears: &Ears,
    upgrading: Option<Upgrading>,
) -> std::io::Result<(Child, Option<Child>, Option<std::os::unix::net::UnixStream>)> {
    Ok(match upgrading {
        Some(Upgrading {
            handover,
            client,
            lifeline,
            ..
        }) => {
            let next = Child::spawn(options, held, ears, Some(handover.child))?;
            let pid = handover.child;
            info!(
                "supervisor: re-executed {} for an upgrade; new broker started (pid {}), the \
                 running one (pid {pid}) serves until it does",
                options.exe.display(),
                next.pid
            );
            if handover.heartbeats.is_none() {
                info!(
                    "supervisor: the running broker (pid {pid}) sends no heartbeats (an \
                     earlier build): the watchdog leaves it alone until it is replaced"
                );
            }
            let adopted = Child::adopt(pid, lifeline, handover.heartbeats, ears);
            (adopted, Some(next), Some(client))
        }
        None => {
            let current = Child::spawn(options, held, ears, None)?;
            info!(
                "supervisor: holding {} listening socket(s); broker started (pid {})",
                HeldListeners::entries(held).len(),
                current.pid
            );
            (current, None, None)
        }
    })
}

/// What the replacing child does next, when there is one (else never): closes its READY
/// socket, or ends.
async fn next_event(next: &mut Option<Child>) -> NextEvent {
    let Some(next) = next.as_mut() else {
        return std::future::pending().await;
    };
    match next.ready.as_mut() {
        Some(ready) => tokio::select! {
            said = ready => NextEvent::Said(said.is_ok()),
            status = ended(&mut next.ended) => NextEvent::Ended(status),
        },
        None => NextEvent::Ended(next.wait().await),
    }
}

/// The verdict on the new binary of the upgrade being vetted, when one is (else never).
async fn verdict(
    vetting: &mut Option<(Vetting, std::os::unix::net::UnixStream)>,
) -> Result<(), String> {
    match vetting.as_mut() {
        Some((vetting, _)) => (&mut vetting.verdict)
            .await
            .unwrap_or_else(|_| Err("the check's task ended".into())),
        None => std::future::pending().await,
    }
}

impl Supervisor {
    /// The loop: whatever comes first (a child's end or READY, a verdict, an `upgrade` asked,
    /// a lifeline's news, a signal, systemd's watchdog) acted on, until the child stops on
    /// purpose; the exit code then.
    async fn watch(&mut self, sources: &mut Sources) -> std::io::Result<u8> {
        loop {
            let asked = self.socket.asked();
            let next_event = next_event(&mut self.next);
            let vetted = verdict(&mut self.vetting);
            let systemd = async {
                match sources.systemd.as_mut() {
                    Some(watchdog) => watchdog.due().await,
                    None => std::future::pending().await,
                }
            };
            let current = &mut self.current;
            let current_said = async {
                match current.ready.as_mut() {
                    Some(ready) => ready.await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let signals = &mut sources.signals;
            tokio::select! {
                status = ended(&mut current.ended) => {
                    if let Some(code) = self.current_ended(status?, signals).await? {
                        return Ok(code);
                    }
                }
                said = current_said => {
                    self.current.ready = None;
                    if said {
                        self.current_serves();
                    }
                }
                event = next_event => match event {
                    NextEvent::Said(said) => self.next_said(said),
                    NextEvent::Ended(status) => self.next_ended(status?),
                },
                verdict = vetted => self.vetted(verdict),
                client = asked => self.upgrade_asked(client),
                Some(heard) = sources.heard.recv() => match heard {
                    Heard::Reload(pid) => self.reload_asked(pid),
                    Heard::Silent(silence) => self.silent(&silence),
                    Heard::Unannounced(pid, within) => self.unannounced(pid, within),
                },
                _ = signals.hup.recv() => self.reload(),
                _ = signals.term.recv() => self.stop(Signal::SIGTERM),
                _ = signals.int.recv() => self.stop(Signal::SIGINT),
                () = systemd => if let Some(watchdog) = sources.systemd.as_mut() {
                    watchdog.tell();
                },
            }
        }
    }

    /// Answers the `appbroker upgrade` waiting, if one is.
    pub(super) fn answer(&mut self, line: &str) {
        if let Some(client) = self.waiting.take() {
            socket::answer(client, line);
        }
    }

    /// A broker's heartbeats stopped for `WATCHDOG_TIMEOUT`: killed, and (the running one)
    /// replaced at once on the listeners held, as after any death while serving.
    fn silent(&mut self, silence: &Silence) {
        if self.stopping {
            return;
        }
        let (which, then) = if self.current.pid == silence.pid {
            (&self.current, "starting another on the listeners held")
        } else if let Some(next) = self.next.as_ref().filter(|n| n.pid == silence.pid) {
            (next, "the running one carries on")
        } else {
            return;
        };
        warn!(
            "supervisor: broker (pid {}) {} (WATCHDOG_TIMEOUT): killing it (SIGKILL); {then}",
            silence.pid,
            silence.words()
        );
        which.signal(Signal::SIGKILL);
        if which.pid == self.current.pid {
            self.watchdog_killed = Some((silence.pid, silence.words()));
        }
    }

    /// A broker this supervisor started has not announced its heartbeats `within` its start
    /// (stopped, or stuck before it bound and started): killed; the running one is replaced on
    /// the listeners held, as after any death at start, and a replacing one is given up (its
    /// upgrade or port change refused), the running one carrying on.
    fn unannounced(&mut self, pid: u32, within: Duration) {
        if self.stopping {
            return;
        }
        let words = format!(
            "did not say it sends heartbeats within {} of its start (3 x WATCHDOG_TIMEOUT, at \
             least 10s): stopped or stuck as it starts",
            show_duration(within)
        );
        let (which, then) = if self.current.pid == pid {
            (
                &self.current,
                "starting another on the listeners held".to_string(),
            )
        } else if let Some(next) = self.next.as_ref().filter(|n| n.pid == pid) {
            let then = format!("the running one (pid {}) carries on", self.current.pid);
            (next, then)
        } else {
            return;
        };
        warn!("supervisor: broker (pid {pid}) {words}; killing it (SIGKILL); {then}");
        which.signal(Signal::SIGKILL);
        if which.pid != self.current.pid {
            self.start_killed = Some((pid, format!("{words}, and was killed")));
        }
    }

    /// The current child said READY.
    fn current_serves(&mut self) {
        self.current.served = true;
        self.backoff = Backoff::default();
        tell_systemd_ready();
        match self.died_at.take() {
            Some(died) => info!(
                "supervisor: broker (pid {}) serves, {} after the last one died",
                self.current.pid,
                show_duration(died.elapsed())
            ),
            None => info!("supervisor: broker (pid {}) serves", self.current.pid),
        }
        without_heartbeats(&self.current);
        // An upgrade's new broker that took over when the old one died meanwhile.
        self.tell_upgraded();
    }

    /// The current child ended: the supervisor's exit code when it should stop with it; else
    /// the next child is started (after the back-off when it died at start).
    async fn current_ended(
        &mut self,
        status: std::process::ExitStatus,
        signals: &mut Signals,
    ) -> std::io::Result<Option<u8>> {
        let pid = self.current.pid;
        if self.stopping || status.success() {
            info!(
                "supervisor: broker (pid {pid}) {}; stopping",
                describe(status)
            );
            // The replacing child, if any, goes too.
            if let Some(next) = &self.next {
                next.signal(Signal::SIGTERM);
            }
            return Ok(Some(stop_code(status, self.stopping)));
        }
        self.died_at = Some(Instant::now());
        let restarted = self.restarted_alert(pid, status);
        if let Some(next) = self.next.take() {
            warn!(
                "supervisor: broker (pid {pid}) {}; its replacement (pid {}) takes over",
                describe(status),
                next.pid
            );
            self.current = next;
            self.tell(restarted);
            return Ok(None);
        }
        let delay = self.backoff.after_exit(self.current.served);
        if self.current.served {
            warn!(
                "supervisor: broker (pid {pid}) {} while serving; starting another now \
                 (clients wait in the listen queue meanwhile)",
                describe(status)
            );
        } else {
            warn!(
                "supervisor: broker (pid {pid}) {} before it served; starting another in {}",
                describe(status),
                show_duration(delay)
            );
            // A stop asked for meanwhile ends the wait, and the supervisor.
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = signals.term.recv() => return Ok(Some(0)),
                _ = signals.int.recv() => return Ok(Some(0)),
            }
        }
        self.current = self.respawn().await;
        self.tell(restarted);
        Ok(None)
    }

    /// The `broker_restarted` alert for the running broker `pid` that ended with `status`:
    /// for one that served (a crash in service) or that the watchdog killed; `None` for one
    /// that died as it started (its log says why, at each try).
    fn restarted_alert(&mut self, pid: u32, status: std::process::ExitStatus) -> Option<Alert> {
        let watchdog = self
            .watchdog_killed
            .take()
            .filter(|(killed, _)| *killed == pid);
        let reason = match &watchdog {
            Some((_, silence)) => format!(
                "the broker (pid {pid}) {silence} and was killed by the watchdog (WATCHDOG_TIMEOUT)"
            ),
            None if self.current.served => format!("the broker (pid {pid}) {}", describe(status)),
            None => return None,
        };
        Some(Alert::new(AlertEvent::BrokerRestarted).because(reason))
    }

    /// Sends `alert`, if any, to the receivers the file names, in the background.
    pub(super) fn tell(&self, alert: Option<Alert>) {
        if let Some(alert) = alert {
            crate::alerts::send_now(&self.config, alert);
        }
    }

    /// A new child on the listeners held, retried with the back-off while it cannot be
    /// started at all (the binary gone, no process left).
    async fn respawn(&mut self) -> Child {
        loop {
            match Child::spawn(&self.options, &self.held, &self.ears, None) {
                Ok(child) => {
                    info!("supervisor: broker started (pid {})", child.pid);
                    return child;
                }
                Err(e) => {
                    let delay = self.backoff.after_exit(false);
                    error!(
                        "supervisor: cannot start the broker from this supervisor's own image \
                         ({}, installed as {}): {}; trying again in {}",
                        super::child::OWN_IMAGE,
                        self.options.exe.display(),
                        crate::support::os_error::words(&e),
                        show_duration(delay)
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// SIGTERM or SIGINT: passed on; the supervisor stops with the child. An upgrade being
    /// vetted is refused and its check killed.
    fn stop(&mut self, signal: Signal) {
        info!(
            "supervisor: received {}; passing it on to the broker (pid {}) and stopping with it",
            signal.as_str(),
            self.current.pid
        );
        self.abandon_upgrade(&format!("the supervisor received {}", signal.as_str()));
        self.stopping = true;
        self.current.signal(signal);
        if let Some(next) = &self.next {
            next.signal(signal);
        }
    }
}

/// Says so when `child` serves without having announced heartbeats (a broker of an earlier
/// build, or a stand-in): the watchdog leaves it alone.
pub(super) fn without_heartbeats(child: &Child) {
    if child.heartbeats().is_none() {
        info!(
            "supervisor: broker (pid {}) sends no heartbeats (an earlier build): the watchdog \
             leaves it alone",
            child.pid
        );
    }
}
