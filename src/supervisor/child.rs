//! One broker the supervisor runs: started on the listeners it holds (or adopted from the
//! previous image after an upgrade), waited for and signalled; and its lifeline, the socket
//! it says `READY` on, read for its questions (`RELOAD`) and its heartbeats, which the
//! watchdog judges there: a broker that announced heartbeats and then sends none for
//! `WATCHDOG_TIMEOUT` is reported to the loop, which kills it; and a broker this supervisor
//! started that has not announced them within [`start_limit`] of its spawn (stopped or stuck
//! as it starts) is reported too.
//!
//! A broker is always started from the supervisor's own image ([`OWN_IMAGE`]), never from
//! the path on disk: the image the supervisor was started from, or after an upgrade the one
//! it vetted and re-executed from. A file copied into place before `appbroker upgrade`, or a
//! broken build being tried, is started by nobody until an upgrade vets it, so a crash never
//! starts an unvetted file, and a broker this supervisor starts is always of its own build
//! (which announces heartbeats).

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use super::link::{RETIRE, Supervised};
use super::upgrade::{HANDOVER_ENV, LIFELINE_ENV, UPGRADE_FROM_ENV};
use super::watchdog::{Beats, Silence};
use super::{HeldListeners, LISTENERS_ENV, READY_ENV, TAKES_OVER_ENV, encode};
use crate::net::inherit;

/// The supervisor's own image, which every broker it starts runs: the file it was started
/// from (or re-executed from by an upgrade) as the kernel keeps it, whatever is at that path
/// on disk now.
pub const OWN_IMAGE: &str = "/proc/self/exe";

/// What a child's lifeline brings the loop.
#[derive(Debug)]
pub enum Heard {
    /// Broker `pid` asks for a reload (`RELOAD`).
    Reload(u32),
    /// A broker's heartbeats stopped.
    Silent(Silence),
    /// Broker `pid`, started by this supervisor, has not announced its heartbeats within
    /// this long of its spawn.
    Unannounced(u32, Duration),
}

/// How long a broker this supervisor started may take to announce its heartbeats
/// (`HEARTBEATS`, sent once it has bound and started): three times `WATCHDOG_TIMEOUT`, at
/// least 10 s, so that a start that decrypts an scrypt-protected key is not cut short.
pub fn start_limit(watchdog: Duration) -> Duration {
    (watchdog * 3).max(Duration::from_secs(10))
}

/// Where the lifelines' readers report, and the watchdog's limit they judge by (zero: off;
/// changed on reload).
#[derive(Debug, Clone)]
pub struct Ears {
    /// The loop's end.
    pub heard: mpsc::Sender<Heard>,
    /// `WATCHDOG_TIMEOUT`, as last read.
    pub watchdog: watch::Receiver<Duration>,
}

/// One child broker.
pub struct Child {
    /// Fires with its exit status once it has ended (an error when it could not be waited
    /// for).
    pub ended: oneshot::Receiver<std::io::Result<std::process::ExitStatus>>,
    /// Its process id.
    pub pid: u32,
    /// Fires when the child says READY (an error when it closed its end without); `None`
    /// once it has fired.
    pub ready: Option<oneshot::Receiver<()>>,
    /// True once it said READY.
    pub served: bool,
    /// The configured addresses of the listeners it was started on; `None` when adopted
    /// (those the supervisor held then).
    pub listens: Option<Vec<std::net::SocketAddr>>,
    /// The supervisor's end of the socket the child said READY on: while it is open the
    /// child knows its supervisor lives, and it stops once every copy is closed (this
    /// process gone). `None` for a child adopted from an image that kept no such end.
    pub lifeline: Option<UnixStream>,
    /// How many runtimes it sends heartbeats from, once it said so (0: not said, as a broker
    /// of an earlier build never does); handed to the next image on an upgrade.
    pub heartbeats: Arc<AtomicUsize>,
}

impl Child {
    /// Starts the broker on `held`, from the supervisor's own image ([`OWN_IMAGE`], shown as
    /// `options.exe`), with a socket to say READY on (and ask on); one that `replaces` a
    /// broker serving there is told so ([`TAKES_OVER_ENV`]).
    pub fn spawn(
        options: &super::Options,
        held: &[HeldListeners],
        ears: &Ears,
        replaces: Option<u32>,
    ) -> std::io::Result<Child> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut command = Command::new(OWN_IMAGE);
        command
            .arg0(&options.exe)
            .args(&options.args)
            .env(LISTENERS_ENV, encode(&HeldListeners::entries(held)))
            .env(READY_ENV, theirs.as_raw_fd().to_string())
            // Its own process group: a terminal's Ctrl-C reaches the supervisor only, which
            // forwards it once (twice would make the broker exit at once).
            .process_group(0);
        // Not for the broker: what one supervisor image tells the next.
        command
            .env_remove(HANDOVER_ENV)
            .env_remove(LIFELINE_ENV)
            .env_remove(UPGRADE_FROM_ENV)
            .env_remove(TAKES_OVER_ENV);
        if let Some(pid) = replaces {
            command.env(TAKES_OVER_ENV, pid.to_string());
        }
        for variable in super::systemd::VARIABLES {
            command.env_remove(variable);
        }
        // The listeners and the child's end are inherited by this one process alone: they
        // are closed on exec again before anything else can be started (this runs on the
        // supervisor's one thread, which starts every process). A check of an upgrade's new
        // binary, started in between, must not hold the ports open.
        let spawned = HeldListeners::hand_down(held)
            .and_then(|()| inherit::hand_down(&theirs))
            .and_then(|()| command.spawn());
        if let Err(e) = HeldListeners::keep(held) {
            warn!(
                "supervisor: cannot close the listeners on exec again: {}; an upgrade's check \
                 could inherit them",
                crate::support::os_error::words(&e)
            );
        }
        let mut process = spawned?;
        // Only the child's copy may stay open: the end is seen when the child is gone.
        drop(theirs);
        // Closed on exec (as `ours` is): no other child inherits it, so the child sees its
        // end when this process is gone, and only then.
        let lifeline = ours.try_clone()?;
        let pid = process.id().unwrap_or_default();
        let (said, ready) = oneshot::channel();
        let heartbeats = Arc::new(AtomicUsize::new(0));
        Lifeline::new(pid, Some(said), ears, &heartbeats)
            .started_now()
            .listen(ours)?;
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
            heartbeats,
        })
    }

    /// The child a previous image of this supervisor started before it re-executed itself
    /// (an upgrade): still this process's child, waited for by its pid, with the end of its
    /// socket that image handed over and the heartbeats it had announced (`None`: none, as
    /// from a broker of an earlier build: the watchdog leaves it alone).
    pub fn adopt(
        pid: u32,
        lifeline: Option<UnixStream>,
        heartbeats: Option<usize>,
        ears: &Ears,
    ) -> Child {
        let announced = Arc::new(AtomicUsize::new(heartbeats.unwrap_or(0)));
        if let Some(lifeline) = &lifeline {
            // What it asks and beats from now on is heard by this image.
            let listening = lifeline
                .try_clone()
                .and_then(|stream| Lifeline::new(pid, None, ears, &announced).listen(stream));
            if let Err(e) = listening {
                warn!(
                    "supervisor: cannot read the running broker's socket: {}; its `ctl \
                     reload` will not reach the supervisor, nor its heartbeats the watchdog",
                    crate::support::os_error::words(&e)
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
            heartbeats: announced,
        }
    }

    /// Its exit status, once it has ended.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        ended(&mut self.ended).await
    }

    /// Answers what the child asked on its socket; one that is gone needs no answer.
    pub fn tell(&self, answer: &Supervised) {
        if let Some(mut stream) = self.lifeline.as_ref() {
            // A line, into a socket buffer the child keeps reading: it never waits.
            let _ = std::io::Write::write_all(&mut stream, answer.line().as_bytes());
        }
    }

    /// Tells a broker that another serves its ports now to drain and stop: [`RETIRE`] on its
    /// lifeline, then the supervisor's end shut for writing. A broker of any build with a
    /// lifeline drains at that end, as on SIGTERM; one of this build knows from the line, read
    /// first on the one socket, that it was replaced, and tells of no stop (a SIGTERM sent
    /// besides would race the line). SIGTERM for one without a lifeline (adopted from an image
    /// that kept none), or whose socket takes nothing.
    pub fn hand_over(&self) {
        let told = self.lifeline.as_ref().is_some_and(|stream| {
            let mut writer = stream;
            std::io::Write::write_all(&mut writer, RETIRE)
                .and_then(|()| stream.shutdown(std::net::Shutdown::Write))
                .is_ok()
        });
        if !told {
            self.signal(Signal::SIGTERM);
        }
    }

    /// Sends `signal`; a child that is gone already needs none.
    pub fn signal(&self, signal: Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// The runtimes it sends heartbeats from; `None` when it never said it would.
    pub fn heartbeats(&self) -> Option<usize> {
        Some(self.heartbeats.load(Relaxed)).filter(|&n| n > 0)
    }
}

/// The longest line read from a child: its lines are a few bytes. The child is trusted, but
/// a supervisor with little in it that can crash reads nothing unbounded.
const LINE: usize = 64;

/// The reader of one child's lifeline.
struct Lifeline {
    pid: u32,
    /// Where `READY` goes, once.
    said: Option<oneshot::Sender<()>>,
    ears: Ears,
    /// The runtimes it announced, shared with its [`Child`].
    announced: Arc<AtomicUsize>,
    /// Its heartbeats, once announced.
    beats: Option<Beats>,
    /// When this supervisor started it, by which it must announce its heartbeats; `None`
    /// for a broker adopted from the previous image (one of an earlier build announces none).
    started: Option<Instant>,
    /// The silence was reported (the child is being killed): not again.
    reported: bool,
}

impl Lifeline {
    fn new(
        pid: u32,
        said: Option<oneshot::Sender<()>>,
        ears: &Ears,
        announced: &Arc<AtomicUsize>,
    ) -> Lifeline {
        let runtimes = announced.load(Relaxed);
        Lifeline {
            pid,
            said,
            ears: ears.clone(),
            announced: Arc::clone(announced),
            beats: (runtimes > 0)
                .then(|| Beats::announced(runtimes, Instant::now()))
                .flatten(),
            started: None,
            reported: false,
        }
    }

    /// A broker this supervisor has just started: it must announce its heartbeats within
    /// [`start_limit`].
    fn started_now(mut self) -> Lifeline {
        self.started = Some(Instant::now());
        self
    }

    /// When the watchdog looks next under `limit`: when the runtime heard from longest ago
    /// reaches it, or, before any heartbeat was announced, the start's deadline; `None` when
    /// nothing is watched (the watchdog off, a silence reported, a broker adopted without
    /// heartbeats).
    fn next_look(&self, limit: Duration) -> Option<Instant> {
        if limit.is_zero() || self.reported {
            return None;
        }
        match &self.beats {
            Some(beats) => Some(beats.deadline(limit)),
            None => self.started.map(|started| started + start_limit(limit)),
        }
    }

    /// Reads `stream` in a task of its own until the child closes it (it ended).
    fn listen(self, stream: UnixStream) -> std::io::Result<()> {
        stream.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(stream)?;
        tokio::spawn(self.read(stream));
        Ok(())
    }

    async fn read(mut self, stream: tokio::net::UnixStream) {
        let mut reader = tokio::io::BufReader::new(stream);
        let mut line = Vec::new();
        let mut watching = true;
        loop {
            let limit = *self.ears.watchdog.borrow_and_update();
            let deadline = self.next_look(limit).map(tokio::time::Instant::from_std);
            let mut limited = (&mut reader).take(LINE as u64);
            tokio::select! {
                // What the child wrote first: a supervisor that was itself held up (stopped,
                // busy) reads the heartbeats waiting before it judges.
                biased;
                read = tokio::io::AsyncBufReadExt::read_until(&mut limited, b'\n', &mut line) => {
                    if !matches!(read, Ok(1..)) {
                        return;
                    }
                    if line.last() == Some(&b'\n') {
                        if !self.hear(line.trim_ascii()).await {
                            return;
                        }
                        line.clear();
                    } else if line.len() >= LINE {
                        // No line of a broker's: skipped to its end.
                        line.clear();
                    }
                }
                changed = self.ears.watchdog.changed(), if watching => {
                    // Without a sender (the loop ending), the limit stays as it was.
                    watching = changed.is_ok();
                }
                () = tokio::time::sleep_until(
                    deadline.unwrap_or_else(tokio::time::Instant::now)
                ), if deadline.is_some() => {
                    if !self.judge(limit).await {
                        return;
                    }
                }
            }
        }
    }

    /// One line from the child; false when nobody is left to hear it.
    async fn hear(&mut self, line: &[u8]) -> bool {
        match line {
            b"READY" => {
                if let Some(said) = self.said.take() {
                    let _ = said.send(());
                }
            }
            b"RELOAD" => return self.ears.heard.send(Heard::Reload(self.pid)).await.is_ok(),
            _ => {
                if let Some(runtimes) = number_after(line, b"HEARTBEATS ") {
                    self.beats = Beats::announced(runtimes, Instant::now());
                    if let Some(beats) = &self.beats {
                        self.announced.store(beats.runtimes(), Relaxed);
                        debug!(
                            "supervisor: broker (pid {}) sends heartbeats from {runtimes} \
                             runtime(s)",
                            self.pid
                        );
                    }
                } else if let (Some(index), Some(beats)) =
                    (number_after(line, b"BEAT "), self.beats.as_mut())
                {
                    beats.beat(index, Instant::now());
                }
            }
        }
        true
    }

    /// The watchdog's look, at its deadline; false when nobody is left to hear it.
    async fn judge(&mut self, limit: Duration) -> bool {
        let Some(beats) = &self.beats else {
            // Not announced since its start, past the start's limit: stopped or stuck before
            // it bound and started.
            self.reported = true;
            let unannounced = Heard::Unannounced(self.pid, start_limit(limit));
            return self.ears.heard.send(unannounced).await.is_ok();
        };
        let mut runtimes = beats.silent(Instant::now(), limit);
        if runtimes.is_empty() {
            return true;
        }
        // Each runtime's beats keep their own phase (a delayed tick shifts the next), so in a
        // stopped process one reaches the limit up to a beat before the others: the process's
        // state, not the beats, says it is stopped as a whole.
        if is_stopped(self.pid) {
            runtimes = (0..beats.runtimes()).collect();
        }
        self.reported = true;
        let silence = Silence {
            pid: self.pid,
            runtimes,
            of: beats.runtimes(),
            limit,
        };
        self.ears.heard.send(Heard::Silent(silence)).await.is_ok()
    }
}

/// Whether process `pid` is stopped (SIGSTOP, SIGTSTP, or a debugger holding it): the
/// third field of `/proc/PID/stat`, after the parenthesised name, is `T` or `t`. False where
/// there is no procfs, or the process is gone.
fn is_stopped(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let after_name = stat
            .iter()
            .rposition(|&b| b == b')')
            .map_or(&[][..], |end| &stat[end + 1..]);
        matches!(after_name.trim_ascii_start().first(), Some(b'T' | b't'))
    })
}

/// The number after `prefix` in `line` (`BEAT 3`); `None` when it is not that.
fn number_after(line: &[u8], prefix: &[u8]) -> Option<usize> {
    std::str::from_utf8(line.strip_prefix(prefix)?)
        .ok()?
        .parse()
        .ok()
}

/// A child's exit status from its `ended` channel.
pub async fn ended(
    ended: &mut oneshot::Receiver<std::io::Result<std::process::ExitStatus>>,
) -> std::io::Result<std::process::ExitStatus> {
    ended
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("its waiter ended")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_their_numbers() {
        assert_eq!(number_after(b"BEAT 3", b"BEAT "), Some(3));
        assert_eq!(number_after(b"HEARTBEATS 16", b"HEARTBEATS "), Some(16));
        for junk in [&b"BEAT"[..], b"BEAT x", b"BEAT -1", b"BEATS 2", b"READY"] {
            assert_eq!(number_after(junk, b"BEAT "), None, "{junk:?}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_stopped_process_reads_as_stopped_and_a_running_or_gone_one_does_not() {
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let pid = sleeper.id();
        let until = |stopped: bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while is_stopped(pid) != stopped {
                assert!(Instant::now() < deadline, "stopped never became {stopped}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        until(false);
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
        until(true);
        kill(Pid::from_raw(pid as i32), Signal::SIGCONT).unwrap();
        until(false);
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert!(!is_stopped(pid));
    }
}
