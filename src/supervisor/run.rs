//! The supervisor's loop: start a child on the listeners held, wait for it to serve or die,
//! restart it (with back-off while it dies at start), forward signals, and replace it with a
//! new child when a reload changes the ports.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use super::link::Supervised;
use super::upgrade::{HANDOVER_ENV, Handover, LIFELINE_ENV, REQUEST};
use super::{Backoff, Held, LISTENERS_ENV, READY_ENV, describe, encode, hold};
use crate::config::{Config, show_duration};
use crate::inherit;

/// What the supervisor runs: the broker's binary with the command line it was given, less
/// `--supervise`.
#[derive(Debug, Clone)]
pub struct Options {
    /// The binary.
    pub exe: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// One child broker.
struct Child {
    /// Fires with its exit status once it has ended (an error when it could not be waited
    /// for).
    ended: oneshot::Receiver<std::io::Result<std::process::ExitStatus>>,
    pid: u32,
    /// Fires when the child says READY (an error when it closed its end without); `None`
    /// once it has fired.
    ready: Option<oneshot::Receiver<()>>,
    /// True once it said READY.
    served: bool,
    /// The configured addresses of the listeners it was started on; `None` when adopted
    /// (those the supervisor held then).
    listens: Option<Vec<std::net::SocketAddr>>,
    /// The supervisor's end of the socket the child said READY on: while it is open the
    /// child knows its supervisor lives, and it stops once every copy is closed (this
    /// process gone). `None` for a child adopted from an image that kept no such end.
    lifeline: Option<std::os::unix::net::UnixStream>,
}

impl Child {
    /// Starts the broker on `held`, with a socket to say READY on (and ask on: `asks`).
    fn spawn(options: &Options, held: &[Held], asks: &Asks) -> std::io::Result<Child> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        inherit::hand_down(&theirs)?;
        let mut command = Command::new(&options.exe);
        command
            .args(&options.args)
            .env(LISTENERS_ENV, encode(&Held::entries(held)))
            .env(READY_ENV, theirs.as_raw_fd().to_string())
            // Its own process group: a terminal's Ctrl-C reaches the supervisor only, which
            // forwards it once (twice would make the broker exit at once).
            .process_group(0);
        // Not for the broker: what one supervisor image tells the next.
        command.env_remove(HANDOVER_ENV).env_remove(LIFELINE_ENV);
        for variable in super::systemd::VARIABLES {
            command.env_remove(variable);
        }
        let mut process = command.spawn()?;
        // Only the child's copy may stay open: the end is seen when the child is gone.
        drop(theirs);
        // Closed on exec (as `ours` is): no other child inherits it, so the child sees its
        // end when this process is gone, and only then.
        let lifeline = ours.try_clone()?;
        let pid = process.id().unwrap_or_default();
        let (said, ready) = oneshot::channel();
        listen(ours, pid, Some(said), asks.clone())?;
        let (tell, ended) = oneshot::channel();
        tokio::spawn(async move {
            let _ = tell.send(process.wait().await);
        });
        Ok(Child {
            ended,
            pid,
            ready: Some(ready),
            served: false,
            listens: Some(held.iter().map(|h| h.configured).collect()),
            lifeline: Some(lifeline),
        })
    }

    /// The child a previous image of this supervisor started before it re-executed itself
    /// (an upgrade): still this process's child, waited for by its pid, with the end of its
    /// socket that image handed over.
    fn adopt(pid: u32, lifeline: Option<std::os::unix::net::UnixStream>, asks: &Asks) -> Child {
        if let Some(lifeline) = &lifeline {
            // What it asks from now on is answered by this image.
            let listening = lifeline
                .try_clone()
                .and_then(|stream| listen(stream, pid, None, asks.clone()));
            if let Err(e) = listening {
                warn!(
                    "supervisor: cannot read the running broker's socket: {}; its `ctl \
                     reload` will not reach the supervisor",
                    crate::os_error::words(&e)
                );
            }
        }
        let (tell, ended) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let status = i32::try_from(pid)
                .map_err(std::io::Error::other)
                .and_then(|pid| wait_for(Pid::from_raw(pid)));
            let _ = tell.send(status);
        });
        // It served already: that is why it was running.
        Child {
            ended,
            pid,
            ready: None,
            served: true,
            listens: None,
            lifeline,
        }
    }

    /// Its exit status, once it has ended.
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        ended(&mut self.ended).await
    }

    /// Answers what the child asked on its socket; one that is gone needs no answer.
    fn tell(&self, answer: &Supervised) {
        if let Some(mut stream) = self.lifeline.as_ref() {
            // A line, into a socket buffer the child keeps reading: it never waits.
            let _ = std::io::Write::write_all(&mut stream, answer.line().as_bytes());
        }
    }

    /// Sends `signal`; a child that is gone already needs none.
    fn signal(&self, signal: Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Where children's questions go: the pid of the child that asks (`RELOAD`).
type Asks = mpsc::Sender<u32>;

/// Reads what child `pid` writes on its socket until it closes it (it ended): `READY` once
/// (to `said`), then `RELOAD` questions (to `asks`). Lines are bounded: the child is trusted,
/// but a supervisor with little in it that can crash reads nothing unbounded.
fn listen(
    stream: std::os::unix::net::UnixStream,
    pid: u32,
    mut said: Option<oneshot::Sender<()>>,
    asks: Asks,
) -> std::io::Result<()> {
    stream.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(stream)?;
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stream);
        loop {
            let mut line = Vec::new();
            let read = tokio::io::AsyncBufReadExt::read_until(
                &mut (&mut reader).take(64),
                b'\n',
                &mut line,
            )
            .await;
            if !matches!(read, Ok(1..)) {
                return;
            }
            match line.trim_ascii() {
                b"READY" => {
                    if let Some(said) = said.take() {
                        let _ = said.send(());
                    }
                }
                b"RELOAD" => {
                    // Unsent: the supervisor is stopping, nobody is left to answer.
                    let Ok(()) = asks.send(pid).await else { return };
                }
                _ => {}
            }
        }
    });
    Ok(())
}

/// READY=1 to systemd (`Type=notify`), when it runs the supervisor; again after an upgrade,
/// which systemd takes as the same news.
fn tell_systemd_ready() {
    match super::systemd::notify("READY=1") {
        Ok(true) => info!("supervisor: told systemd it is ready"),
        Ok(false) => {}
        Err(e) => warn!(
            "supervisor: cannot tell systemd it is ready (NOTIFY_SOCKET): {}",
            crate::os_error::words(&e)
        ),
    }
}

/// A child's exit status from its `ended` channel.
async fn ended(
    ended: &mut oneshot::Receiver<std::io::Result<std::process::ExitStatus>>,
) -> std::io::Result<std::process::ExitStatus> {
    ended
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("its waiter ended")))
}

/// Reads the one request line of a connection on the supervisor's socket (bounded in time
/// and size, in a task of its own so a silent client holds nothing up) and hands the
/// connection on when it asks for an upgrade.
fn read_request(
    stream: tokio::net::UnixStream,
    requests: mpsc::Sender<std::os::unix::net::UnixStream>,
) {
    tokio::spawn(async move {
        let mut line = Vec::new();
        let mut reader = tokio::io::BufReader::new(stream).take(64);
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::io::AsyncBufReadExt::read_until(&mut reader, b'\n', &mut line),
        )
        .await;
        let Ok(stream) = reader.into_inner().into_inner().into_std() else {
            return;
        };
        if read.is_ok() && line.trim_ascii() == REQUEST.as_bytes() {
            let _ = stream.set_nonblocking(false);
            let _ = requests.send(stream).await;
        } else {
            answer(
                stream,
                "refused: unknown request (this socket takes `upgrade`)",
            );
        }
    });
}

/// Writes `line` to an `appbroker upgrade` and hangs up.
fn answer(mut client: std::os::unix::net::UnixStream, line: &str) {
    use std::io::Write;
    let _ = client.set_nonblocking(false);
    let _ = client.set_write_timeout(Some(std::time::Duration::from_secs(5)));
    let _ = client.write_all(format!("{line}\n").as_bytes());
}

/// Waits for child `pid` to end; its status.
fn wait_for(pid: Pid) -> std::io::Result<std::process::ExitStatus> {
    use nix::sys::wait::{WaitStatus, waitpid};
    use std::os::unix::process::ExitStatusExt;
    loop {
        match waitpid(pid, None)? {
            WaitStatus::Exited(_, code) => return Ok(ExitStatusExt::from_raw((code & 0xff) << 8)),
            WaitStatus::Signaled(_, signal, core) => {
                let core = if core { 0x80 } else { 0 };
                return Ok(ExitStatusExt::from_raw(signal as i32 | core));
            }
            _ => continue,
        }
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

/// What reading the file again came to.
enum Reread {
    /// The same listen addresses (or a file the broker will refuse): it reloads in place.
    Same,
    /// New ones, held now; a new broker starts on them. The line says so.
    Replacing(String),
    /// New ones that cannot be held or served: why. The running broker keeps its ports.
    Failed(String),
}

/// The signals the supervisor takes.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// What the supervisor's loop is doing.
struct Supervisor {
    options: Options,
    config: Config,
    held: Vec<Held>,
    backoff: Backoff,
    /// The child serving (or starting, when none served yet).
    current: Child,
    /// A child replacing `current` after a reload changed the ports, until it serves.
    next: Option<Child>,
    /// A stop was forwarded: the supervisor ends with the child.
    stopping: bool,
    /// When the last child died, to say how long the ports went unserved.
    died_at: Option<Instant>,
    /// The socket `appbroker upgrade` asks on.
    socket: Option<tokio::net::UnixListener>,
    /// Where connections on it send their request, once read.
    requests: mpsc::Sender<std::os::unix::net::UnixStream>,
    /// Where children send their questions.
    asks: Asks,
    /// The `appbroker upgrade` waiting for the new broker to serve (or fail).
    waiting: Option<std::os::unix::net::UnixStream>,
    /// Brokers replaced and draining, with what waits for them: handed to the next image
    /// on an upgrade, which waits for them in turn.
    retired: Vec<(u32, tokio::task::JoinHandle<()>)>,
}

/// Where the supervisor starts from.
pub struct Start {
    /// The configuration it read.
    pub config: Config,
    /// The listeners `config` names, bound already (or inherited).
    pub held: Vec<Held>,
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
    /// The supervisor's end of the running broker's socket ([`LIFELINE_ENV`]), kept open so
    /// that broker does not take the re-execution for the supervisor's death.
    pub lifeline: Option<std::os::unix::net::UnixStream>,
}

/// Runs the supervisor until its child stops on purpose (after a forwarded SIGTERM or SIGINT,
/// or an exit with code 0); the exit code to end with.
pub async fn run(start: Start) -> std::io::Result<u8> {
    let mut signals = Signals {
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
    Held::hand_down(&held)?;
    let (requests, incoming) = mpsc::channel(1);
    let (asks, asked) = mpsc::channel(4);
    let socket = match socket {
        Some(listener) => {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::UnixListener::from_std(listener)?;
            Some(listener)
        }
        None => None,
    };
    let retiring = upgrading
        .as_ref()
        .map(|u| u.handover.retired.clone())
        .unwrap_or_default();
    let (current, next, waiting) = match upgrading {
        Some(Upgrading {
            handover: Handover { child: pid, .. },
            client,
            lifeline,
        }) => {
            let next = Child::spawn(&options, &held, &asks)?;
            info!(
                "supervisor: re-executed {} for an upgrade; new broker started (pid {}), the \
                 running one (pid {pid}) serves until it does",
                options.exe.display(),
                next.pid
            );
            (Child::adopt(pid, lifeline, &asks), Some(next), Some(client))
        }
        None => {
            let current = Child::spawn(&options, &held, &asks)?;
            info!(
                "supervisor: holding {} listening socket(s); broker started (pid {})",
                Held::entries(&held).len(),
                current.pid
            );
            (current, None, None)
        }
    };
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
        requests,
        asks,
        waiting,
        retired: Vec::new(),
    };
    for pid in retiring {
        // Draining already: their ends were not handed over, and they need none (a broker
        // that drains ignores its supervisor's end).
        supervisor.retire(Child::adopt(pid, None, &supervisor.asks.clone()));
    }
    let code = supervisor.watch(&mut signals, incoming, asked).await;
    // Stopping for good (an upgrade's exec never comes back here): its socket goes with it.
    if let Some(socket) = &supervisor.socket
        && let Ok(address) = socket.local_addr()
        && let Some(path) = address.as_pathname()
    {
        let _ = std::fs::remove_file(path);
    }
    code
}

impl Supervisor {
    async fn watch(
        &mut self,
        signals: &mut Signals,
        mut incoming: mpsc::Receiver<std::os::unix::net::UnixStream>,
        mut asked: mpsc::Receiver<u32>,
    ) -> std::io::Result<u8> {
        loop {
            let accepted = async {
                match &self.socket {
                    Some(socket) => socket.accept().await.map(|(stream, _)| stream),
                    None => std::future::pending().await,
                }
            };
            let next_event = async {
                let Some(next) = self.next.as_mut() else {
                    return std::future::pending().await;
                };
                match next.ready.as_mut() {
                    Some(ready) => tokio::select! {
                        said = ready => NextEvent::Said(said.is_ok()),
                        status = ended(&mut next.ended) => NextEvent::Ended(status),
                    },
                    None => NextEvent::Ended(next.wait().await),
                }
            };
            let current = &mut self.current;
            let current_said = async {
                match current.ready.as_mut() {
                    Some(ready) => ready.await.is_ok(),
                    None => std::future::pending().await,
                }
            };
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
                    NextEvent::Said(said) => {
                        if let Some(next) = self.next.as_mut() {
                            next.ready = None;
                        }
                        if said {
                            self.next_serves();
                        }
                    }
                    NextEvent::Ended(status) => self.next_ended(status?),
                },
                Ok(stream) = accepted => read_request(stream, self.requests.clone()),
                Some(client) = incoming.recv() => self.upgrade(client).await,
                Some(pid) = asked.recv() => self.reload_asked(pid),
                _ = signals.hup.recv() => self.reload(),
                _ = signals.term.recv() => self.stop(Signal::SIGTERM),
                _ = signals.int.recv() => self.stop(Signal::SIGINT),
            }
        }
    }

    /// The replacing child ended before it served: the running one carries on.
    fn next_ended(&mut self, status: std::process::ExitStatus) {
        if let Some(next) = self.next.take() {
            let what = format!(
                "the new broker (pid {}) {} before it served; the running one (pid {}) \
                 carries on",
                next.pid,
                describe(status),
                self.current.pid
            );
            error!("supervisor: {what}");
            self.answer(&format!("refused: {what} (its log says why)"));
        }
    }

    /// Answers the `appbroker upgrade` waiting, if one is.
    fn answer(&mut self, line: &str) {
        if let Some(client) = self.waiting.take() {
            answer(client, line);
        }
    }

    /// `appbroker upgrade`: the new binary checks the file; then this process re-executes
    /// itself from it, handing over the listeners, the running broker and `client`, which the
    /// next image answers once the new broker serves (or fails). Returns only when refused.
    async fn upgrade(&mut self, client: std::os::unix::net::UnixStream) {
        if self.next.is_some() || self.waiting.is_some() {
            answer(
                client,
                "refused: a new broker is starting already; try again once it serves",
            );
            return;
        }
        let exe = &self.options.exe;
        info!(
            "supervisor: upgrade asked: checking the configuration with {}",
            exe.display()
        );
        let check = Command::new(exe)
            .arg("--check")
            .arg("--config")
            .arg(&self.config.source)
            .stdin(std::process::Stdio::null())
            .output()
            .await;
        let refused = match check {
            Err(e) => Some(format!(
                "cannot run {}: {}",
                exe.display(),
                crate::os_error::words(&e)
            )),
            Ok(out) if !out.status.success() => {
                let errors = String::from_utf8_lossy(&out.stderr);
                let errors: Vec<&str> = errors
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect();
                Some(format!(
                    "{} --check {}: {}",
                    exe.display(),
                    describe(out.status),
                    errors.join(" | ")
                ))
            }
            Ok(_) => None,
        };
        if let Some(why) = refused {
            warn!("supervisor: upgrade refused: {why}; the running broker carries on");
            answer(
                client,
                &format!("refused: {why}; the running broker carries on"),
            );
            return;
        }
        let why = self.exec(&client);
        error!("supervisor: upgrade refused: {why}; the running broker carries on");
        answer(
            client,
            &format!("refused: {why}; the running broker carries on"),
        );
    }

    /// Re-executes this process from the binary on disk with the handover; returns only on
    /// failure, with why.
    fn exec(&self, client: &std::os::unix::net::UnixStream) -> String {
        use std::os::unix::process::CommandExt;
        let Some(socket) = &self.socket else {
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
        };
        let lifeline = self.current.lifeline.as_ref();
        let handed = Held::hand_down(&self.held)
            .and_then(|()| inherit::hand_down(client))
            .and_then(|()| inherit::hand_down(socket))
            .and_then(|()| lifeline.map_or(Ok(()), inherit::hand_down));
        let why = match handed {
            Err(e) => format!(
                "cannot hand the sockets down: {}",
                crate::os_error::words(&e)
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
                    crate::os_error::words(&e)
                )
            }
        };
        // Still this image: the socket and the broker's end must not leak into the children
        // it starts from now on (a child holding the end would keep another alive as an
        // orphan). The client is answered and closed by the caller.
        let _ = inherit::keep(socket);
        if let Some(lifeline) = lifeline {
            let _ = inherit::keep(lifeline);
        }
        why
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
    }

    /// The replacing child said READY: it becomes the current one, and the old one drains.
    fn next_serves(&mut self) {
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
        old.signal(Signal::SIGTERM);
        self.retire(old);
    }

    /// Waits for a broker that drains, in the background, and logs its end.
    fn retire(&mut self, mut old: Child) {
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
        if let Some(next) = self.next.take() {
            warn!(
                "supervisor: broker (pid {pid}) {}; its replacement (pid {}) takes over",
                describe(status),
                next.pid
            );
            self.current = next;
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
        Ok(None)
    }

    /// A new child on the listeners held, retried with the back-off while it cannot be
    /// started at all (the binary gone, no process left).
    async fn respawn(&mut self) -> Child {
        loop {
            match Child::spawn(&self.options, &self.held, &self.asks) {
                Ok(child) => {
                    info!("supervisor: broker started (pid {})", child.pid);
                    return child;
                }
                Err(e) => {
                    let delay = self.backoff.after_exit(false);
                    error!(
                        "supervisor: cannot start the broker {}: {}; trying again in {}",
                        self.options.exe.display(),
                        crate::os_error::words(&e),
                        show_duration(delay)
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// SIGHUP: the file read again; the child reloads in place when the ports are the same,
    /// else a new child on the new set replaces it.
    fn reload(&mut self) {
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
    fn reload_asked(&mut self, pid: u32) {
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
            self.config = config;
            return Reread::Same;
        }
        if let Err(e) = hold(&config, &mut self.held) {
            return Reread::Failed(format!("{e}; the broker keeps the ports it has"));
        }
        self.config = config;
        if let Err(e) = Held::hand_down(&self.held) {
            return Reread::Failed(format!(
                "cannot hand the listeners down: {}",
                crate::os_error::words(&e)
            ));
        }
        match Child::spawn(&self.options, &self.held, &self.asks) {
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
                "cannot start the broker {}: {}",
                self.options.exe.display(),
                crate::os_error::words(&e)
            )),
        }
    }

    /// SIGTERM or SIGINT: passed on; the supervisor stops with the child.
    fn stop(&mut self, signal: Signal) {
        info!(
            "supervisor: received {}; passing it on to the broker (pid {}) and stopping with it",
            signal.as_str(),
            self.current.pid
        );
        self.stopping = true;
        self.current.signal(signal);
        if let Some(next) = &self.next {
            next.signal(signal);
        }
    }
}
