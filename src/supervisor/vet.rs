//! The new binary of an upgrade, vetted before the supervisor re-executes itself from it:
//! `NEW --check --config FILE` must pass, then `NEW --handover-version` must print this
//! build's [`HANDOVER_VERSION`]. Both run in a task beside the supervisor's loop, which goes
//! on restarting brokers, taking signals and answering its socket meanwhile; each in a process
//! group of its own, with no listener of the supervisor's, and within one `UPGRADE_TIMEOUT`,
//! past which the group is killed and the upgrade refused. A [`Vetting`] dropped (the
//! supervisor stopping) kills it too.
//!
//! The file is opened once, when the upgrade is asked, and both commands run that open
//! descriptor (`/proc/self/fd/N`, handed to each alone), as the re-execution does (`fexecve`):
//! what is checked is what runs, whatever is renamed over the path meanwhile.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::describe;
use super::upgrade::{HANDOVER_VERSION, handover_version};
use crate::config::show_duration;

/// What is kept of a check's output for the refusal: its errors fit, a flood does not.
const KEPT: usize = 16 * 1024;

/// The vetting of an upgrade's new binary, under way.
pub struct Vetting {
    /// Fires with the verdict: `Ok` to re-execute, or why not.
    pub verdict: oneshot::Receiver<Result<(), String>>,
    /// The file vetted, open: what the re-execution runs once the verdict is `Ok`.
    pub image: Arc<File>,
    /// The process group running now (0: none), killed when this is dropped.
    group: Arc<AtomicI32>,
    task: tokio::task::JoinHandle<()>,
}

/// The file of an upgrade, as it is vetted and re-executed: open, and where it was found.
struct Image {
    file: Arc<File>,
    /// The path it was opened at, for the words of the log.
    path: PathBuf,
}

impl Vetting {
    /// Opens `exe` and starts vetting that open file on the configuration file `config`,
    /// within `timeout`; why not when it cannot be opened.
    pub fn start(exe: PathBuf, config: PathBuf, timeout: Duration) -> Result<Vetting, String> {
        let file = File::open(&exe).map_err(|e| {
            format!(
                "cannot open {}: {}",
                exe.display(),
                crate::support::os_error::words(&e)
            )
        })?;
        let image = Image {
            file: Arc::new(file),
            path: exe,
        };
        let opened = Arc::clone(&image.file);
        let group = Arc::new(AtomicI32::new(0));
        let (tell, verdict) = oneshot::channel();
        let running = Arc::clone(&group);
        let task = tokio::spawn(async move {
            let deadline = Instant::now() + timeout;
            let verdict = vet(&image, &config, deadline, timeout, &running).await;
            let _ = tell.send(verdict);
        });
        Ok(Vetting {
            verdict,
            image: opened,
            group,
            task,
        })
    }
}

impl Image {
    /// A command running this very file (through its descriptor, which it alone inherits),
    /// named as the path it was found at.
    fn command(&self) -> Command {
        let mut command = Command::new(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        command.arg0(&self.path);
        command
    }
}

impl Drop for Vetting {
    fn drop(&mut self) {
        kill_group(&self.group);
        self.task.abort();
    }
}

/// SIGKILL to the process group `group` names, if any: the check and whatever it started.
fn kill_group(group: &AtomicI32) {
    let pgid = group.swap(0, Relaxed);
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// The check, then the probe; `Ok` when both pass.
async fn vet(
    image: &Image,
    config: &Path,
    deadline: Instant,
    timeout: Duration,
    group: &AtomicI32,
) -> Result<(), String> {
    let shown = image.path.display();
    let mut check = image.command();
    check
        .arg("--check")
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (status, errors) = run(check, &image.file, deadline, group)
        .await
        .map_err(|e| e.words(&format!("{shown} --check"), timeout))?;
    if !status.success() {
        let errors = String::from_utf8_lossy(&errors);
        let errors: Vec<&str> = errors
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        return Err(format!(
            "{shown} --check {}: {}",
            describe(status),
            errors.join(" | ")
        ));
    }
    let mut probe = image.command();
    probe
        .arg("--handover-version")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let (status, printed) = run(probe, &image.file, deadline, group)
        .await
        .map_err(|e| e.words(&format!("{shown} --handover-version"), timeout))?;
    match handover_version(&printed).filter(|_| status.success()) {
        Some(HANDOVER_VERSION) => Ok(()),
        Some(theirs) => Err(format!(
            "{shown} takes hand-over version {theirs} and this supervisor hands over version \
             {HANDOVER_VERSION}: it cannot take the running broker over in place; stop the \
             service, install, and start it (docs/high-availability.md, \"Upgrades\")"
        )),
        None => Err(format!(
            "{shown} is not an appbroker that can take over from this one: \
             `--handover-version` {} and printed {} where `appbroker-handover \
             {HANDOVER_VERSION}` was expected (a build older than this one, or not appbroker \
             at all: to change to it, stop the service, install, and start it)",
            describe(status),
            shown_output(&printed)
        )),
    }
}

/// Why a vetting command gave no verdict.
enum Failed {
    /// It could not be started.
    Start(std::io::Error),
    /// It ran past the deadline, and was killed.
    Late,
}

impl Failed {
    fn words(&self, what: &str, timeout: Duration) -> String {
        match self {
            Failed::Start(e) => {
                format!("cannot run {what}: {}", crate::support::os_error::words(e))
            }
            Failed::Late => format!(
                "{what} gave no answer within {} (UPGRADE_TIMEOUT): it was killed",
                show_duration(timeout)
            ),
        }
    }
}

/// Runs `command` in a process group of its own (named in `group` meanwhile), its piped
/// output read (the first [`KEPT`] bytes kept), until it ends or `deadline` passes: its
/// status and output, or why not (past the deadline the group is killed). `image`, the file
/// it runs, is inherited by it alone: a script (`#!`) reads itself through it, and nothing
/// else started (a broker) may hold it.
async fn run(
    mut command: Command,
    image: &File,
    deadline: Instant,
    group: &AtomicI32,
) -> Result<(std::process::ExitStatus, Vec<u8>), Failed> {
    command
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    // On the supervisor's one thread, which starts every process: closed on exec again
    // before another can be started.
    let spawned = crate::net::inherit::hand_down(image).and_then(|()| command.spawn());
    let _ = crate::net::inherit::keep(image);
    let mut child = spawned.map_err(Failed::Start)?;
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .unwrap_or(0);
    group.store(pgid, Relaxed);
    let output: Option<Box<dyn AsyncRead + Send + Unpin>> =
        match (child.stdout.take(), child.stderr.take()) {
            (Some(out), _) => Some(Box::new(out)),
            (None, Some(errors)) => Some(Box::new(errors)),
            (None, None) => None,
        };
    let finished = tokio::time::timeout_at(deadline, async {
        let kept = read_kept(output).await;
        (child.wait().await, kept)
    })
    .await;
    // Whatever it started in its group goes with it, done or not.
    kill_group(group);
    match finished {
        Ok((Ok(status), kept)) => Ok((status, kept)),
        Ok((Err(e), _)) => Err(Failed::Start(e)),
        Err(_) => {
            let _ = child.wait().await;
            Err(Failed::Late)
        }
    }
}

/// Reads `output` to its end, keeping the first [`KEPT`] bytes (the rest is read and
/// dropped, so a chatty command does not block on a full pipe).
async fn read_kept(output: Option<Box<dyn AsyncRead + Send + Unpin>>) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut output) = output else {
        return kept;
    };
    let mut buffer = [0u8; 4096];
    while let Ok(n @ 1..) = output.read(&mut buffer).await {
        let room = KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
    }
    kept
}

/// A command's output for a log line: its first line, escaped, or `nothing`.
fn shown_output(printed: &[u8]) -> String {
    let text = String::from_utf8_lossy(printed);
    let first = text.lines().next().unwrap_or("").trim();
    if first.is_empty() {
        return "nothing".into();
    }
    let escaped: String = first
        .chars()
        .take(200)
        .flat_map(char::escape_debug)
        .collect();
    format!("`{escaped}`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_binary_printed_is_shown_on_one_escaped_line() {
        assert_eq!(shown_output(b""), "nothing");
        assert_eq!(shown_output(b"  \n"), "nothing");
        assert_eq!(shown_output(b"appbroker 1.0\nmore"), "`appbroker 1.0`");
        assert_eq!(shown_output(b"a\x1b[31mb"), "`a\\u{1b}[31mb`");
    }
}
