//! One command run with `/bin/sh -c` (`ALERT_COMMAND`, `RESTART_COMMAND`), bounded: given its
//! standard input and variables, killed with everything it started when its time is up, and
//! its last lines of output kept for the log and the page. The broker's own variables (its
//! inherited listeners, its supervisor's descriptors, systemd's) are not passed on: a command
//! must not take them for its own.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::config::show_duration;
use crate::support::escape;

/// Lines of output kept: enough to see why an ssh or a systemctl failed.
const LAST_LINES: usize = 10;

/// Bytes of output kept at most (the end of it), and the longest line shown.
const KEPT_BYTES: usize = 4096;

/// How long the output is read once the command was killed: what it started outside its
/// process group (a daemon) may hold the pipes open for ever.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// Its exit code; `None` when it was killed (its time was up, or a signal) or never ran.
    pub exit: Option<i32>,
    /// What happened, in words: `exit 0`, `killed after 5s (its timeout)`.
    pub outcome: String,
    /// Its last lines of output, standard output and error together, control characters
    /// escaped.
    pub output: String,
    /// It was killed at its timeout.
    pub timed_out: bool,
}

impl Ran {
    /// True when it exited with 0.
    pub fn succeeded(&self) -> bool {
        self.exit == Some(0)
    }
}

/// True for a variable of the broker's own that a command must not inherit: appbroker's
/// (`APPBROKER_LISTENERS`, `APPBROKER_READY_FD`, `APPBROKER_UPGRADE`,
/// `APPBROKER_LIFELINE_FD`...), and systemd's notify, watchdog and socket-activation ones.
pub fn is_internal(name: &str) -> bool {
    name.starts_with("APPBROKER_")
        || name.starts_with("LISTEN_")
        || name.starts_with("WATCHDOG_")
        || name == "NOTIFY_SOCKET"
}

/// Runs `command` with `/bin/sh -c`, `stdin` on its standard input (none: `/dev/null`) and
/// `env` added to the broker's environment less its own variables (each value's control
/// characters written out, and bounded: [`escape::bounded`]); kills it (and its process group)
/// after `timeout`.
pub async fn run(
    command: &str,
    stdin: Option<Vec<u8>>,
    env: &[(String, String)],
    timeout: Duration,
) -> Ran {
    let mut shell = Command::new("/bin/sh");
    shell
        .arg("-c")
        .arg(command)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, _) in std::env::vars_os() {
        if is_internal(&name.to_string_lossy()) {
            shell.env_remove(&name);
        }
    }
    // Escaped and bounded here, for every command: a value from outside (a certificate's
    // subject in a quarantine's reason, a server's reply) can carry a line break or an
    // escape sequence into the command's variables, and a script that logs or echoes one
    // would forge a line or reach a terminal.
    shell.envs(
        env.iter()
            .map(|(n, v)| (n, escape::bounded(v, escape::FIELD_MAX).into_owned())),
    );
    #[cfg(unix)]
    shell.process_group(0);
    let mut child = match shell.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Ran {
                exit: None,
                outcome: format!(
                    "cannot run /bin/sh: {}",
                    crate::support::os_error::words(&e)
                ),
                output: String::new(),
                timed_out: false,
            };
        }
    };
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A command that does not read its input must not hold anything up.
        tokio::spawn(async move {
            let _ = pipe.write_all(&bytes).await;
        });
    }
    let output = tokio::spawn(read_both(child.stdout.take(), child.stderr.take()));
    let (exit, outcome, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => (status.code(), ended(status), false),
        Ok(Err(e)) => (None, crate::support::os_error::words(&e), false),
        Err(_) => {
            kill_group(&mut child).await;
            let words = format!("killed after {} (its timeout)", show_duration(timeout));
            (None, words, true)
        }
    };
    let output = match tokio::time::timeout(AFTER_KILL, output).await {
        Ok(Ok(bytes)) => last_lines(&bytes),
        _ => String::new(),
    };
    Ran {
        exit,
        outcome,
        output,
        timed_out,
    }
}

/// `exit 3`, or `killed by SIGKILL`.
fn ended(status: std::process::ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string());
            return format!("killed by {name}");
        }
    }
    format!("ended ({status})")
}

/// Kills the command and everything in its process group, and reaps it.
async fn kill_group(child: &mut tokio::process::Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill().await;
}

/// Both outputs read to their ends together, keeping the last [`KEPT_BYTES`] of them.
async fn read_both(
    stdout: Option<tokio::process::ChildStdout>,
    stderr: Option<tokio::process::ChildStderr>,
) -> Vec<u8> {
    let (out, err) = tokio::join!(tail(stdout), tail(stderr));
    let mut both = out;
    both.extend_from_slice(&err);
    both
}

/// The last [`KEPT_BYTES`] of what `pipe` gives until its end.
async fn tail(pipe: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&chunk[..n]);
        if kept.len() > 2 * KEPT_BYTES {
            kept.drain(..kept.len() - KEPT_BYTES);
        }
    }
    if kept.len() > KEPT_BYTES {
        kept.drain(..kept.len() - KEPT_BYTES);
    }
    kept
}

/// The last [`LAST_LINES`] non-empty lines of `bytes`, control characters escaped, joined by
/// ` | ` (one log line).
fn last_lines(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(escape::escape_controls)
        .collect();
    let start = lines.len().saturating_sub(LAST_LINES);
    lines[start..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_gets_its_input_and_variables_and_its_output_is_kept() {
        let env = vec![("APPBROKER_EVENT".to_string(), "restart_ran".to_string())];
        let ran = run(
            "read line; echo \"got $line $APPBROKER_EVENT\"; echo oops >&2; exit 3",
            Some(b"hello\n".to_vec()),
            &env,
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(ran.exit, Some(3));
        assert_eq!(ran.outcome, "exit 3");
        assert!(ran.output.contains("got hello restart_ran"), "{ran:?}");
        assert!(ran.output.contains("oops"), "{ran:?}");
        assert!(!ran.succeeded());
    }

    #[tokio::test]
    async fn a_variable_from_outside_reaches_the_command_escaped_and_bounded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("reason");
        let reason = format!(
            "certificate CN=evil\nFAKE LOG LINE level=ERROR\x1b[31m {}",
            "z".repeat(1000)
        );
        let env = vec![("APPBROKER_REASON".to_string(), reason)];
        let command = format!("printf '%s' \"$APPBROKER_REASON\" > '{}'", file.display());
        let ran = run(&command, None, &env, Duration::from_secs(20)).await;
        assert!(ran.succeeded(), "{ran:?}");
        let got = std::fs::read_to_string(&file).expect("written");
        assert!(
            got.starts_with("certificate CN=evil\\nFAKE LOG LINE level=ERROR\\x1b[31m zzz"),
            "{got}"
        );
        assert!(!got.contains('\n') && !got.contains('\x1b'), "{got}");
        assert_eq!(got.len(), 512 + "...[+543 bytes]".len(), "{got}");
        assert!(got.ends_with("...[+543 bytes]"), "{got}");
    }

    #[tokio::test]
    async fn a_command_past_its_time_is_killed_with_what_it_started() {
        let started = std::time::Instant::now();
        let ran = run(
            "sleep 30 & sleep 30; echo never",
            None,
            &[],
            Duration::from_millis(300),
        )
        .await;
        assert!(ran.timed_out, "{ran:?}");
        assert_eq!(ran.exit, None);
        // The background sleep held the pipes: killed with the group, the read ends.
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(!ran.output.contains("never"));
    }

    #[test]
    fn only_the_last_lines_are_kept_on_one_line() {
        let text: String = (0..30).map(|n| format!("line {n}\n")).collect();
        let kept = last_lines(text.as_bytes());
        assert!(kept.starts_with("line 20 | "), "{kept}");
        assert!(kept.ends_with("line 29"), "{kept}");
        assert!(is_internal("APPBROKER_LISTENERS") && is_internal("NOTIFY_SOCKET"));
        assert!(!is_internal("PATH"));
    }
}
