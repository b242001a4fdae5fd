//! `appbroker ctl`'s side of the control socket: send a request, read the answer, print it
//! for people (a table for `show`) or as JSON, and say by the exit code how it went, as
//! scripts rely on: 0 done, 1 refused by the broker (its reason printed), 3 no broker
//! answered. (2, bad usage, is the command line's own.)

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Duration;

use super::protocol::{Answer, BalancerView, Request};
use crate::clock::time_of_day;
use crate::logging::to_stderr;
use crate::overrides::escape_controls;

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
}

/// Sends `request` on the control socket at `socket`, waiting up to `wait` past the usual
/// time for its answer (a `wait` request's own timeout).
#[cfg(unix)]
pub fn ask(socket: &Path, request: &Request, wait: Duration) -> Result<Answer, CtlError> {
    let path = socket.display().to_string();
    let no_broker = |e: std::io::Error| CtlError::NoBroker {
        path: path.clone(),
        words: crate::os_error::words(&e),
    };
    let no_answer = |words: String| CtlError::NoAnswer {
        path: path.clone(),
        words,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(no_broker)?;
    let _ = stream.set_read_timeout(Some(ANSWER_TIME + wait));
    let mut line = serde_json::to_vec(request).map_err(|e| no_answer(e.to_string()))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| no_answer(crate::os_error::words(&e)))?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| no_answer(crate::os_error::words(&e)))?;
    if answer.is_empty() {
        return Err(no_answer("it closed the connection".into()));
    }
    serde_json::from_str(&answer).map_err(|e| no_answer(format!("{e} in {}", answer.trim())))
}

/// Without Unix sockets there is no control socket to ask.
#[cfg(not(unix))]
pub fn ask(socket: &Path, _request: &Request, _wait: Duration) -> Result<Answer, CtlError> {
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
        if let Some(q) = &s.quarantine {
            let kind = if q.forced {
                "operator's quarantine"
            } else {
                "quarantine"
            };
            notes.push(format!(
                "{kind} ({}) until {}",
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
