//! `appbroker upgrade`: the supervisor's own socket (next to the control socket,
//! `<name>.supervisor.sock`), one request on it, and what one image of the supervisor hands
//! the next when it re-executes itself from the binary now on disk.
//!
//! The supervisor answers on a socket of its own rather than through the broker's control
//! socket because the broker is what an upgrade replaces: the one who answers must outlive it.
//! The protocol is one line each way: `upgrade`, then `upgraded: ...` or `refused: ...`; the
//! loop's side of the socket (accepting, reading the line, answering) is `super::socket`.
//!
//! After the exec nothing of the old image is left to refuse anything: so before it, the new
//! binary must say it takes this handover ([`HANDOVER_VERSION`], asked with
//! `--handover-version`). A binary that is no appbroker, or one older than this (which knows
//! no such option), is refused, and the running broker carries on.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The version of what one image of the supervisor hands the next on an upgrade: the
/// variables [`HANDOVER_ENV`], [`LIFELINE_ENV`] and the listeners', the descriptors they
/// name, and the lines a running broker speaks on its lifeline. An image re-executes only
/// into a binary that prints the same (`--handover-version`); any change to those is a new
/// version, and an upgrade across it is a stop, an install and a start.
pub const HANDOVER_VERSION: u32 = 1;

/// What `appbroker --handover-version` prints, one line.
pub fn handover_line() -> String {
    format!("appbroker-handover {HANDOVER_VERSION}")
}

/// The version in what a binary's `--handover-version` printed: exactly one line
/// `appbroker-handover N`; `None` for anything else.
pub fn handover_version(printed: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(printed).ok()?;
    let line = text.strip_suffix('\n').unwrap_or(text);
    if line.contains('\n') {
        return None;
    }
    let number = line.strip_prefix("appbroker-handover ")?;
    if !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse().ok()
}

/// The environment variable by which a supervisor that re-executes itself tells its next
/// image what to take over: `CHILD_PID:CLIENT_FD:SOCKET_FD:RETIRED:HEARTBEATS` (the running
/// broker, the connection waiting for the upgrade's answer, the supervisor's socket, the pids
/// of brokers still draining, separated by commas, and how many runtimes the running broker
/// sends heartbeats from, empty for none). An image from before heartbeats writes the first
/// four alone.
pub const HANDOVER_ENV: &str = "APPBROKER_UPGRADE";

/// The environment variable by which a supervisor that re-executes itself hands its next
/// image its end of the running broker's socket (the descriptor number): the broker stops
/// when that end closes, so it must stay open across the exec. Apart from [`HANDOVER_ENV`]
/// because images from before it wrote none.
pub const LIFELINE_ENV: &str = "APPBROKER_LIFELINE_FD";

/// The environment variable by which a supervisor that re-executes itself tells its next
/// image its own version, for `broker_upgraded`'s `from_version`. Apart from
/// [`HANDOVER_ENV`], whose format an earlier image must still read after a downgrade; an image
/// from before it writes none.
pub const UPGRADE_FROM_ENV: &str = "APPBROKER_UPGRADE_FROM";

/// The request.
pub const REQUEST: &str = "upgrade";

/// How long a new broker may take to serve, on top of `UPGRADE_TIMEOUT`, in the time
/// `appbroker upgrade` waits for its answer: it reads its file, binds nothing (it inherits),
/// restores the state file and starts its workers: seconds at most. Long enough for a loaded
/// machine, bounded so a hung supervisor does not hang a script.
pub const BROKER_START: Duration = Duration::from_secs(30);

/// `UPGRADE_TIMEOUT` as the file at `path` says now (its default when it says nothing
/// readable: the file's errors are the check's to report): read at each upgrade, by the
/// supervisor and by `appbroker upgrade` alike.
pub fn timeout_of_file(path: &Path) -> Duration {
    let default = crate::config::General::defaults().upgrade_timeout;
    let Some(key) = crate::config::keys::find("UPGRADE_TIMEOUT") else {
        return default;
    };
    match crate::config::general_value(path, key.name) {
        Ok(Some(text)) => match key.domain.parse(&text) {
            Ok(crate::config::keys::Value::Duration(d)) => d,
            _ => default,
        },
        _ => default,
    }
}

/// How long `appbroker upgrade` waits for its answer: the checks' bound, then the new
/// broker's start.
pub fn answer_time(upgrade_timeout: Duration) -> Duration {
    upgrade_timeout + BROKER_START
}

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
    /// How many runtimes the running broker sends heartbeats from (`None`: it never said:
    /// a broker of an earlier build, which the watchdog leaves alone).
    pub heartbeats: Option<usize>,
}

impl Handover {
    /// As [`HANDOVER_ENV`] holds it.
    pub fn encode(&self) -> String {
        let retired: Vec<String> = self.retired.iter().map(u32::to_string).collect();
        format!(
            "{}:{}:{}:{}:{}",
            self.child,
            self.client,
            self.socket,
            retired.join(","),
            self.heartbeats.map(|n| n.to_string()).unwrap_or_default()
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
            // Absent from the handover of an image from before heartbeats.
            heartbeats: match parts.next() {
                None | Some("") => None,
                Some(n) => Some(n.parse().ok().filter(|&n| n > 0)?),
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
    /// It hung up, or the connection failed.
    #[error("the supervisor on {path} gave no answer: {words}")]
    NoAnswer {
        /// The socket.
        path: String,
        /// What happened.
        words: String,
    },
    /// It answered nothing in time.
    #[error(
        "no answer within {} from the supervisor on {path}; the upgrade may still be under \
         way: its log says how it ends",
        crate::config::show_duration(*.within)
    )]
    Late {
        /// The socket.
        path: String,
        /// How long it was given.
        within: Duration,
    },
}

/// Asks the supervisor on `socket` to upgrade, waiting up to `within` for its answer line
/// (`upgraded: ...` or `refused: ...`).
pub fn ask(socket: &Path, within: Duration) -> Result<String, AskError> {
    let path = socket.display().to_string();
    let mut stream = UnixStream::connect(socket).map_err(|e| AskError::NoSupervisor {
        path: path.clone(),
        words: crate::support::os_error::words(&e),
    })?;
    let no_answer = |e: std::io::Error| AskError::NoAnswer {
        path: path.clone(),
        words: crate::support::os_error::words(&e),
    };
    stream.set_read_timeout(Some(within)).map_err(no_answer)?;
    stream
        .write_all(format!("{REQUEST}\n").as_bytes())
        .map_err(no_answer)?;
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(AskError::Late { path, within });
        }
        read => {
            read.map_err(no_answer)?;
        }
    }
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
            heartbeats: None,
        };
        assert_eq!(Handover::decode(&h.encode()), Some(h.clone()));
        h.retired = vec![4000, 4100];
        assert_eq!(h.encode(), "4242:9:7:4000,4100:");
        assert_eq!(Handover::decode(&h.encode()), Some(h.clone()));
        // As an image from before heartbeats writes it.
        assert_eq!(Handover::decode("4242:9:7:4000,4100"), Some(h.clone()));
        h.heartbeats = Some(4);
        assert_eq!(h.encode(), "4242:9:7:4000,4100:4");
        assert_eq!(Handover::decode(&h.encode()), Some(h));
        for bad in [
            "",
            "1:2",
            "1:2:3",
            "1:2:3:4:5:6",
            "1:2:3:4:x",
            "1:2:3:4:0",
            "a:2:3:",
            "-1:2:3:",
            "1:2:3:x",
        ] {
            assert_eq!(Handover::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_one_line_naming_a_version_is_a_handover_version() {
        assert_eq!(
            handover_version(handover_line().as_bytes()),
            Some(HANDOVER_VERSION)
        );
        assert_eq!(handover_version(b"appbroker-handover 7\n"), Some(7));
        for junk in [
            &b""[..],
            b"\n",
            b"appbroker-handover\n",
            b"appbroker-handover 1\nappbroker-handover 1\n",
            b"appbroker-handover +1\n",
            b"appbroker-handover 1 \n",
            b"appbroker 1.2.0\n",
            b"appbroker-handover 99999999999999999999\n",
        ] {
            assert_eq!(handover_version(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn an_upgrade_that_gets_no_answer_in_time_says_how_long_it_waited() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.sock");
        // A supervisor that takes the request and never answers.
        let _silent = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let error = ask(&path, Duration::from_millis(50)).expect_err("no answer");
        assert!(
            error
                .to_string()
                .starts_with("no answer within 50ms from the supervisor on"),
            "{error}"
        );
    }

    #[test]
    fn the_socket_sits_beside_the_control_socket() {
        assert_eq!(
            socket_path(Path::new("/run/appbroker/appserver.sock")),
            Path::new("/run/appbroker/appserver.supervisor.sock")
        );
    }
}
