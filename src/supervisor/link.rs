//! A supervised broker's side of the socket it shares with its supervisor ([`READY_ENV`]):
//! one line each way at a time. The broker says `HEARTBEATS N` (it will send heartbeats from
//! its N worker runtimes), then `BEAT I` once a second from each runtime I; `READY` once it
//! serves; and `RELOAD` when `appbroker ctl reload` asks it to read its file again. The
//! supervisor answers `RELOAD` with `in place`, `replaced: ...` or `refused: ...`, kills a
//! broker whose heartbeats stop (`WATCHDOG_TIMEOUT`), and writes `retire` to one another broker
//! replaced, then shuts its end ([`RETIRE`]). Only the supervisor holds the other end, so its
//! end-of-file means the supervisor is gone, or done with this broker: the broker then shuts
//! down gracefully rather than serve on as an orphan nothing restarts, upgrades or stops.

use std::os::fd::RawFd;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, mpsc};
use tracing::{info, warn};

use super::READY_ENV;
use crate::net::inherit;
use crate::support::shutdown::Shutdown;

/// What the supervisor writes to a broker that another broker replaced on its ports (an
/// upgrade, or a reload that moved them), before it shuts its end: drain and stop, as on
/// SIGTERM, and tell of no stop, since the ports go on being served. A broker of an earlier
/// build takes it for a stray answer, and drains at the end that follows.
pub const RETIRE: &[u8] = b"retire\n";

/// How long a broker waits for its supervisor's answer to `RELOAD`: it reads a file and
/// binds a few sockets, well under a second; bounded so that a supervisor that does not
/// answer (an image from before the question) cannot hang a reload.
const ANSWER_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// What the supervisor said to a `RELOAD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Supervised {
    /// The listen addresses are the ones it holds: the broker reloads in place.
    InPlace,
    /// They changed: the supervisor holds the new set and starts a new broker on it, which
    /// replaces this one once it serves. The line says so, for the operator.
    Replaced(String),
    /// The supervisor could not (a new port cannot be bound): the running broker keeps its
    /// ports. The line says why.
    Refused(String),
}

impl Supervised {
    /// The supervisor's answer line, as [`Supervised::line`] writes it; `None` when unknown.
    pub fn parse(line: &str) -> Option<Supervised> {
        let line = line.trim_end();
        if line == "in place" {
            return Some(Supervised::InPlace);
        }
        if let Some(text) = line.strip_prefix("replaced: ") {
            return Some(Supervised::Replaced(text.to_string()));
        }
        line.strip_prefix("refused: ")
            .map(|text| Supervised::Refused(text.to_string()))
    }

    /// As written on the socket, newline included.
    pub fn line(&self) -> String {
        match self {
            Supervised::InPlace => "in place\n".to_string(),
            Supervised::Replaced(text) => format!("replaced: {text}\n"),
            Supervised::Refused(text) => format!("refused: {text}\n"),
        }
    }
}

/// A supervised broker's link to its supervisor; cheap to clone.
#[derive(Debug, Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The way to the supervisor: held for one line at a time, so heartbeats go on while a
    /// question waits for its answer.
    writer: Mutex<OwnedWriteHalf>,
    /// The supervisor's answers: held for a whole question and its answer, so one at a time.
    answered: Mutex<mpsc::Receiver<String>>,
    /// The way back, until [`Link::ready`] hands it to the task that reads it.
    reader: std::sync::Mutex<Option<tokio::net::unix::OwnedReadHalf>>,
    /// Where that task puts each line the supervisor writes.
    answers: mpsc::Sender<String>,
}

impl Link {
    /// The link [`READY_ENV`] names; `None` when this broker runs without a supervisor (or
    /// the variable names no socket). Call it inside the runtime.
    pub fn take() -> Option<Link> {
        let fd: RawFd = std::env::var(READY_ENV).ok()?.parse().ok()?;
        let socket = inherit::take_socket(fd).ok()?;
        let stream = std::os::unix::net::UnixStream::from(socket);
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(stream));
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                warn!(
                    "cannot use the supervisor's socket: {}; this broker will not notice if \
                     the supervisor dies",
                    crate::support::os_error::words(&e)
                );
                return None;
            }
        };
        let (reader, writer) = stream.into_split();
        let (answers, answered) = mpsc::channel(1);
        Some(Link {
            inner: Arc::new(Inner {
                writer: Mutex::new(writer),
                answered: Mutex::new(answered),
                reader: std::sync::Mutex::new(Some(reader)),
                answers,
            }),
        })
    }

    /// Tells the supervisor this broker serves, and from then on watches for its end: at
    /// end-of-file (the supervisor gone) `shutdown` is asked for, as SIGTERM does.
    pub async fn ready(&self, shutdown: &Shutdown) {
        // A write that fails means the supervisor is gone already: the watch sees it too.
        let _ = self.say(b"READY\n").await;
        let Some(reader) = self
            .inner
            .reader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let supervisor = nix::unistd::getppid();
        let (shutdown, answers) = (shutdown.clone(), self.inner.answers.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(reader).lines();
            // An error is a vanished peer too (a reset).
            while let Ok(Some(line)) = lines.next_line().await {
                if line.as_bytes() == RETIRE.trim_ascii_end() {
                    info!(
                        "replaced: another broker serves the ports now (the supervisor says \
                         so); draining and stopping, as on SIGTERM"
                    );
                    shutdown.hand_over();
                    continue;
                }
                let _ = answers.try_send(line);
            }
            if shutdown.is_requested() {
                // Stopping already (a drain after an upgrade, say): nothing to add.
                return;
            }
            warn!(
                "the supervisor (pid {supervisor}) is gone: shutting down gracefully, as on \
                 SIGTERM (nothing would restart, upgrade or stop this broker now)"
            );
            shutdown.request();
        });
    }

    /// Asks the supervisor to read the configuration file again (`appbroker ctl reload`):
    /// it holds every port the file names, and replaces this broker when they changed.
    /// `None` when it gave no answer (gone, or an image from before the question): reload
    /// in place then, as without a supervisor.
    pub async fn reload(&self) -> Option<Supervised> {
        let mut answered = self.inner.answered.lock().await;
        // An answer left from a question that gave up waiting is not this one's.
        while answered.try_recv().is_ok() {}
        self.say(b"RELOAD\n").await.ok()?;
        let line = tokio::time::timeout(ANSWER_TIME, answered.recv())
            .await
            .ok()??;
        Supervised::parse(&line)
    }

    /// Sends the supervisor heartbeats from `runtimes` worker runtimes: says so (before it
    /// returns, so before a `READY` said next), then writes `BEAT I` for each tick of runtime
    /// I on `ticks` ([`crate::net::workers::Workers::ticks`]). Written from a task of the calling
    /// (control) runtime, so that one stuck stops them too; ends when the supervisor is gone.
    pub async fn send_heartbeats(&self, runtimes: usize, mut ticks: mpsc::Receiver<usize>) {
        let announce = format!("HEARTBEATS {runtimes}\n");
        if self.say(announce.as_bytes()).await.is_err() {
            return;
        }
        let link = self.clone();
        tokio::spawn(async move {
            while let Some(index) = ticks.recv().await {
                if link
                    .say(format!("BEAT {index}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }

    /// Writes `line` to the supervisor.
    async fn say(&self, line: &[u8]) -> std::io::Result<()> {
        self.inner.writer.lock().await.write_all(line).await
    }
}

/// How often each worker runtime of a supervised broker sends a heartbeat.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip_and_junk_is_none() {
        for answer in [
            Supervised::InPlace,
            Supervised::Replaced("a new broker (pid 7) takes over".into()),
            Supervised::Refused("cannot listen on 127.0.0.1:1".into()),
        ] {
            assert_eq!(Supervised::parse(&answer.line()), Some(answer));
        }
        assert_eq!(Supervised::parse("READY"), None);
        assert_eq!(Supervised::parse(""), None);
    }
}
