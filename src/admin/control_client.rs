//! `appbroker ctl`'s side of the control socket: send a request, read the answer, print it
//! for people (a table for `show`) or as JSON, and say by the exit code how it went, as
//! scripts rely on: 0 done, 1 refused by the broker (its reason printed), 3 no broker
//! answered. (2, bad usage, is the command line's own.)

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::protocol::{Answer, BalancerView, Request};
use crate::support::clock::time_of_day;
use crate::support::escape::escape_controls;
use crate::support::logging::to_stderr;

/// Exit code: the broker did it.
pub const DONE: u8 = 0;
/// Exit code: the broker refused, or a wait timed out.
pub const REFUSED: u8 = 1;
/// Exit code: no broker answered on the socket.
pub const NO_BROKER: u8 = 3;

/// How long an answer may take, but a `wait`'s: a reload reads a file and may bind ports.
const ANSWER_TIME: Duration = Duration::from_secs(60);

/// Why no answer came.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Nothing listens on the socket, or it could not be reached.
    #[error(
        "no broker answers on {path}: {words}; is appbroker running with this configuration? \
         (name its socket with --socket PATH or its file with --config PATH)"
    )]
    NoBroker {
        /// The socket.
        path: String,
        /// What failed, in words.
        words: String,
    },
    /// The broker closed the connection or answered something unreadable.
    #[error("the broker on {path} gave no answer: {words}")]
    NoAnswer {
        /// The socket.
        path: String,
        /// What happened.
        words: String,
    },
    /// The broker did not answer in time (hung, stopped, or its socket's queue full).
    #[error(
        "no answer within {} from the broker on {path} (hung or stopped?)",
        crate::config::show_duration(*.within)
    )]
    Late {
        /// The socket.
        path: String,
        /// How long it was given.
        within: Duration,
    },
}

/// Sends `request` on the control socket at `socket`, waiting up to `wait` past the usual
/// time for its answer (a `wait` request's own timeout).
pub fn ask(socket: &Path, request: &Request, wait: Duration) -> Result<Answer, CtlError> {
    ask_within(socket, request, ANSWER_TIME + wait)
}

/// Sends `request` on the control socket at `socket` and reads its answer, all within
/// `within` (the connect too: a broker that accepts nothing fills its queue, and a connect to
/// a full one would wait).
#[cfg(unix)]
pub fn ask_within(socket: &Path, request: &Request, within: Duration) -> Result<Answer, CtlError> {
    use std::io::{ErrorKind, Read};
    let path = socket.display().to_string();
    let deadline = std::time::Instant::now() + within;
    let late = || CtlError::Late {
        path: path.clone(),
        within,
    };
    let no_answer = |words: String| CtlError::NoAnswer {
        path: path.clone(),
        words,
    };
    let mut stream = connect(socket, deadline).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => late(),
        _ => CtlError::NoBroker {
            path: path.clone(),
            words: crate::support::os_error::words(&e),
        },
    })?;
    let mut line = serde_json::to_vec(request).map_err(|e| no_answer(e.to_string()))?;
    line.push(b'\n');
    let left = |deadline: std::time::Instant| {
        deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
    };
    let failed = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => late(),
        _ => no_answer(crate::support::os_error::words(&e)),
    };
    let _ = stream.set_write_timeout(left(deadline).or(Some(Duration::from_millis(1))));
    stream.write_all(&line).map_err(failed)?;
    // Up to the newline, each read bounded by the time left.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while answer.last() != Some(&b'\n') {
        let Some(rest) = left(deadline) else {
            return Err(late());
        };
        let _ = stream.set_read_timeout(Some(rest));
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(failed(e)),
        }
    }
    if answer.is_empty() {
        return Err(no_answer("it closed the connection".into()));
    }
    let answer = String::from_utf8_lossy(&answer);
    serde_json::from_str(&answer).map_err(|e| no_answer(format!("{e} in {}", answer.trim())))
}

/// Connects to the Unix socket `path` by `deadline`: a connect that finds the listen queue
/// full is tried again until then, rather than left to wait.
#[cfg(unix)]
fn connect(
    path: &Path,
    deadline: std::time::Instant,
) -> std::io::Result<std::os::unix::net::UnixStream> {
    let address = socket2::SockAddr::unix(path)?;
    loop {
        let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        match socket.connect(&address) {
            Ok(()) => {
                socket.set_nonblocking(false)?;
                return Ok(socket.into());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return Err(e);
                }
                // The queue is full: the broker accepts nothing now. Look again shortly.
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Without Unix sockets there is no control socket to ask.
#[cfg(not(unix))]
pub fn ask_within(
    socket: &Path,
    _request: &Request,
    _within: Duration,
) -> Result<Answer, CtlError> {
    Err(CtlError::NoBroker {
        path: socket.display().to_string(),
        words: "the control socket needs a Unix system".into(),
    })
}

/// Asks `request` and prints the answer (as JSON with `json`); the exit code.
pub fn run(socket: &Path, request: &Request, json: bool, wait: Duration) -> u8 {
    match ask(socket, request, wait) {
        Ok(answer) => {
            print(&answer, json);
            if answer.ok { DONE } else { REFUSED }
        }
        Err(e) => {
            to_stderr(&format!("appbroker ctl: {e}"));
            NO_BROKER
        }
    }
}

/// Prints an answer: the JSON line, or words and tables on standard output (the refusal's
/// reason on standard error).
pub fn print(answer: &Answer, json: bool) {
    let mut out = String::new();
    if json {
        out = serde_json::to_string_pretty(answer).unwrap_or_default();
        out.push('\n');
    } else {
        for balancer in &answer.balancers {
            out.push_str(&table(balancer));
        }
        if let Some(message) = &answer.message {
            out.push_str(message);
            out.push('\n');
        }
        for change in &answer.changes {
            out.push_str(&format!("changed: {change}\n"));
        }
    }
    // A closed standard output loses the printout, not the exit code.
    let _ = std::io::stdout().write_all(out.as_bytes());
    if !answer.ok && !json {
        for error in &answer.errors {
            to_stderr(&format!("appbroker ctl: {error}"));
        }
        if let Some(error) = &answer.error {
            to_stderr(&format!("appbroker ctl: {error}"));
        }
    }
}

/// A balancer and its servers as a table for people.
pub fn table(b: &BalancerView) -> String {
    let mut out = format!("{} on {}: {} open\n", b.section, b.listen, b.connections);
    out.push_str(&format!(
        "  {:<4} {:<24} {:<12} {:>6} {:>8} {:>7}  {}\n",
        "ID", "SERVER", "STATE", "CONNS", "SESSIONS", "WEIGHT", "OVERRIDES AND QUARANTINE"
    ));
    for s in &b.servers {
        let mut notes = Vec::new();
        if let Some(h) = &s.overrides.hold {
            // Escaped: a broker of an earlier build may hold a reason with control
            // characters, which would reach the terminal.
            let reason = if h.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", escape_controls(&h.reason))
            };
            notes.push(format!(
                "{} by {} since {}{reason}",
                h.mode.as_str(),
                escape_controls(&h.by),
                time_of_day(h.since_wall_ms)
            ));
        }
        if s.overrides.weight.is_some() {
            notes.push(format!("weight set (file: {})", s.file_weight));
        }
        if let Some(r) = &s.restarted {
            notes.push(format!(
                "restarted {}, {}",
                time_of_day(r.at_epoch_ms),
                escape_controls(&r.outcome)
            ));
        }
        if let Some(q) = &s.quarantine {
            let kind = if q.forced {
                "operator's quarantine"
            } else {
                "quarantine"
            };
            let asked = q
                .asked
                .as_ref()
                .map(|a| format!(", {}", a.words()))
                .unwrap_or_default();
            notes.push(format!(
                "{kind} ({}) until {}{asked}",
                q.reason,
                time_of_day(q.until_epoch_ms)
            ));
        }
        out.push_str(&format!(
            "  {:<4} {:<24} {:<12} {:>6} {:>8} {:>7}  {}\n",
            s.id,
            s.address,
            s.state,
            s.connections,
            s.sessions,
            s.weight,
            notes.join("; ")
        ));
    }
    out
}
