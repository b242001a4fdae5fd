//! The state file: operators' overrides and quarantines, kept over a restart, a crash or an
//! upgrade. Written whole after every change (a temporary file renamed over the old, so a
//! crash leaves the old or the new, never half of one); read once at start, before the first
//! client. A file that is unreadable, corrupt or not ours is reported and ignored: the broker
//! starts without overrides rather than not at all.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::Balancer;
use crate::balancer::rules::health::OperatorAsk;
use crate::balancer::rules::overrides::Overrides;
use crate::support::clock::wall_ms;

/// The format's version; a file of another one is not read.
const VERSION: u32 = 1;

/// Added to who asked for an operator's quarantine restored at start: `uid 0 before the
/// restart`, as the log and the page say it.
const BEFORE_THE_RESTART: &str = " before the restart";

/// The file as written.
#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    /// The format's name and version: a file without it is someone else's.
    appbroker_state: u32,
    /// When it was written, ms since the Unix epoch.
    written_epoch_ms: u64,
    /// Every server with an override or an operator's quarantine.
    servers: Vec<KeptServer>,
}

/// One server's kept state, matched at start by section, id and address.
#[derive(Debug, Serialize, Deserialize)]
struct KeptServer {
    section: String,
    id: String,
    address: String,
    #[serde(default)]
    overrides: Overrides,
    /// The end of an operator's quarantine, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quarantine_until_epoch_ms: Option<u64>,
    /// Who asked for it and why (a file written before this field restores as asked by "an
    /// operator").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quarantine_asked: Option<OperatorAsk>,
}

/// Why the file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It could not be read.
    #[error("cannot read the state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// It is not a state file of this version.
    #[error(
        "the state file {path} is not one appbroker wrote ({why}); it is ignored, and overrides start empty (the next change rewrites it)"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// Reads `path`; `None` when there is no file (a first start).
fn read(path: &Path) -> Result<Option<StateFile>, ReadError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ReadError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let foreign = |why: String| ReadError::Foreign {
        path: path.to_path_buf(),
        why,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| foreign(format!("not JSON: {e}")))?;
    match value.get("appbroker_state").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) => {
            return Err(foreign(format!(
                "format version {v}, this one reads {VERSION}"
            )));
        }
        None => return Err(foreign("no appbroker_state field".into())),
    }
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| foreign(e.to_string()))
}

/// Applies the state kept in `path` to `balancers`, logging what was restored and what no
/// longer matches a server; a bad file is logged and ignored.
pub fn restore(path: &Path, balancers: &[Arc<Balancer>]) {
    let file = match read(path) {
        Ok(Some(file)) => file,
        Ok(None) => return,
        Err(e) => {
            warn!("{e}");
            return;
        }
    };
    let now = wall_ms();
    for entry in file.servers {
        let server = balancers
            .iter()
            .find(|b| b.kind().section() == entry.section)
            .and_then(|b| Some((b, b.find_server(&entry.id)?)))
            .filter(|(_, s)| s.address.eq_ignore_ascii_case(&entry.address));
        let Some((balancer, server)) = server else {
            info!(
                "state file: [{}] REMOTE_SERVER_{} {} is no longer configured; its overrides are dropped",
                entry.section, entry.id, entry.address
            );
            continue;
        };
        if !entry.overrides.is_empty() {
            // A file from before control characters were refused (or edited by hand) may
            // hold them: escaped before they reach a log line, a page or `ctl show`.
            let mut overrides = entry.overrides;
            overrides.hold = overrides
                .hold
                .map(crate::balancer::rules::overrides::Hold::escaped);
            balancer.restore(&server, overrides);
        }
        if let Some(until) = entry.quarantine_until_epoch_ms.filter(|&u| u > now) {
            let left = Duration::from_millis(until - now);
            let mut asked = entry
                .quarantine_asked
                .unwrap_or_else(|| "an operator".into());
            // Escaped as a hold's reason is, above.
            asked.by = crate::support::escape::escape_controls(&asked.by);
            asked.reason = crate::support::escape::escape_controls(&asked.reason);
            // Said once, however many restarts it outlives.
            if !asked.by.ends_with(BEFORE_THE_RESTART) {
                asked.by.push_str(BEFORE_THE_RESTART);
            }
            balancer.force_quarantine(&server, left, asked);
        }
    }
}

/// Writes the overrides and operators' quarantines of `balancers` to `path`, replacing it
/// whole.
pub fn save(path: &Path, balancers: &[Arc<Balancer>]) -> std::io::Result<()> {
    let mut servers = Vec::new();
    for balancer in balancers {
        let state = balancer.state();
        for s in state.servers {
            let until = s.quarantine.filter(|_| s.forced).map(|(_, until)| until);
            let asked = s.asked.filter(|_| until.is_some());
            if s.overrides.is_empty() && until.is_none() {
                continue;
            }
            servers.push(KeptServer {
                section: state.kind.section().to_string(),
                id: s.id,
                address: s.address,
                overrides: s.overrides,
                quarantine_until_epoch_ms: until,
                quarantine_asked: asked,
            });
        }
    }
    let file = StateFile {
        appbroker_state: VERSION,
        written_epoch_ms: wall_ms(),
        servers,
    };
    let text = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
    write_whole(path, &text, false)
}

/// Writes `text` and a newline as the file at `path`, its directory made if need be, through
/// a temporary file renamed over the old one: a crash leaves the old file or the new, never
/// half of one. `private`: mode 0600 from the first byte (on Unix), for a secret.
pub fn write_whole(path: &Path, text: &[u8], private: bool) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let temporary = path.with_file_name(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    let mut out = options.open(&temporary)?;
    // A temporary file left by a crash keeps its mode when opened again: set it.
    #[cfg(unix)]
    if private {
        out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = private;
    out.write_all(text)?;
    out.write_all(b"\n")?;
    // On disk before the rename makes it the file: a crash then leaves the old one whole.
    out.sync_all()?;
    drop(out);
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_a_first_start_and_a_foreign_one_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("a.state");
        assert!(matches!(read(&path), Ok(None)));
        for (text, says) in [
            ("not json", "not JSON"),
            ("{\"servers\":[]}", "no appbroker_state"),
            ("{\"appbroker_state\":9,\"servers\":[]}", "format version 9"),
            ("{\"appbroker_state\":1,\"servers\":7}", "invalid type"),
        ] {
            std::fs::write(&path, text).expect("write");
            let error = read(&path).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
