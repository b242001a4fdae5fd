//! `appbroker upgrade`: the supervisor's own socket (next to the control socket,
//! `<name>.supervisor.sock`), one request on it, and what one image of the supervisor hands
//! the next when it re-executes itself from the binary now on disk.
//!
//! The supervisor answers on a socket of its own rather than through the broker's control
//! socket because the broker is what an upgrade replaces: the one who answers must outlive it.
//! The protocol is one line each way: `upgrade`, then `upgraded: ...` or `refused: ...`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable by which a supervisor that re-executes itself tells its next
/// image what to take over: `CHILD_PID:CLIENT_FD:SOCKET_FD:RETIRED` (the running broker, the
/// connection waiting for the upgrade's answer, the supervisor's socket, and the pids of
/// brokers still draining, separated by commas).
pub const HANDOVER_ENV: &str = "APPBROKER_UPGRADE";

/// The environment variable by which a supervisor that re-executes itself hands its next
/// image its end of the running broker's socket (the descriptor number): the broker stops
/// when that end closes, so it must stay open across the exec. Apart from [`HANDOVER_ENV`]
/// so that images from before it (which reject a handover they do not know) can still be
/// upgraded to, and back.
pub const LIFELINE_ENV: &str = "APPBROKER_LIFELINE_FD";

/// The request.
pub const REQUEST: &str = "upgrade";

/// How long `appbroker upgrade` waits for the answer: a new broker reads its file, binds
/// nothing (it inherits), restores the state file and starts its workers: seconds at most.
/// Long enough for a loaded machine, bounded so a hung supervisor does not hang a script.
pub const ANSWER_TIME: Duration = Duration::from_secs(60);

/// What an image of the supervisor hands the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// The broker running when the upgrade was asked for.
    pub child: u32,
    /// The connection of `appbroker upgrade`, waiting for its answer.
    pub client: i32,
    /// The supervisor's socket.
    pub socket: i32,
    /// Brokers replaced earlier and still draining: waited for by the next image.
    pub retired: Vec<u32>,
}

impl Handover {
    /// As [`HANDOVER_ENV`] holds it.
    pub fn encode(&self) -> String {
        let retired: Vec<String> = self.retired.iter().map(u32::to_string).collect();
        format!(
            "{}:{}:{}:{}",
            self.child,
            self.client,
            self.socket,
            retired.join(",")
        )
    }

    /// [`HANDOVER_ENV`]'s text; `None` when malformed.
    pub fn decode(text: &str) -> Option<Handover> {
        let mut parts = text.split(':');
        let handover = Handover {
            child: parts.next()?.parse().ok()?,
            client: parts.next()?.parse().ok()?,
            socket: parts.next()?.parse().ok()?,
            retired: match parts.next()? {
                "" => Vec::new(),
                pids => pids
                    .split(',')
                    .map(|p| p.parse().ok())
                    .collect::<Option<_>>()?,
            },
        };
        parts.next().is_none().then_some(handover)
    }
}

/// The supervisor's socket beside the broker's control socket `control`:
/// `/run/appbroker/appserver.sock` -> `/run/appbroker/appserver.supervisor.sock`.
pub fn socket_path(control: &Path) -> PathBuf {
    control.with_extension("supervisor.sock")
}

/// Binds the supervisor's socket at `path`, replacing a stale one; a live one means another
/// supervisor runs this file. Its mode is the control socket's: 0600 (an upgrade is the
/// service owner's business), or 0660 owned by group `gid` (`CONTROL_GROUP`: operators who
/// may reload and drain through `ctl` may upgrade too).
pub fn bind(path: &Path, gid: Option<u32>) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("another supervisor answers on {}", path.display()),
        ));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // Made with the umask's mode (no write for others with the usual 022, so nobody else can
    // connect meanwhile), then narrowed.
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    Ok(listener)
}

/// Why `appbroker upgrade` got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Nothing answers on the socket.
    #[error("no supervisor answers on {path}: {words}")]
    NoSupervisor {
        /// The socket.
        path: String,
        /// The OS error in words.
        words: String,
    },
    /// It answered nothing in time, or hung up.
    #[error("the supervisor on {path} gave no answer: {words}")]
    NoAnswer {
        /// The socket.
        path: String,
        /// What happened.
        words: String,
    },
}

/// Asks the supervisor on `socket` to upgrade; its answer line (`upgraded: ...` or
/// `refused: ...`).
pub fn ask(socket: &Path) -> Result<String, AskError> {
    let path = socket.display().to_string();
    let mut stream = UnixStream::connect(socket).map_err(|e| AskError::NoSupervisor {
        path: path.clone(),
        words: crate::os_error::words(&e),
    })?;
    let no_answer = |e: std::io::Error| AskError::NoAnswer {
        path: path.clone(),
        words: crate::os_error::words(&e),
    };
    stream
        .set_read_timeout(Some(ANSWER_TIME))
        .map_err(no_answer)?;
    stream
        .write_all(format!("{REQUEST}\n").as_bytes())
        .map_err(no_answer)?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(no_answer)?;
    if line.is_empty() {
        return Err(AskError::NoAnswer {
            path,
            words: "it closed the connection".into(),
        });
    }
    Ok(line.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handover_round_trips_and_rejects_junk() {
        let mut h = Handover {
            child: 4242,
            client: 9,
            socket: 7,
            retired: vec![],
        };
        assert_eq!(Handover::decode(&h.encode()), Some(h.clone()));
        h.retired = vec![4000, 4100];
        assert_eq!(h.encode(), "4242:9:7:4000,4100");
        assert_eq!(Handover::decode(&h.encode()), Some(h));
        for bad in [
            "",
            "1:2",
            "1:2:3",
            "1:2:3:4:5",
            "a:2:3:",
            "-1:2:3:",
            "1:2:3:x",
        ] {
            assert_eq!(Handover::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_socket_sits_beside_the_control_socket() {
        assert_eq!(
            socket_path(Path::new("/run/appbroker/appserver.sock")),
            Path::new("/run/appbroker/appserver.supervisor.sock")
        );
    }
}
