//! `<state>.secret`, beside the state file: the broker's own secret for the HTTP session
//! cookies, generated at the first start and read at every one after, so that a
//! restart keeps every session while `SESSION_SECRET` is not set. It also records the starts
//! that bound the two upgrade windows (whatever secret signs): when it was made, the first
//! start that signed cookies, which opened a window for the unsigned cookies of the version
//! before only where an earlier state file was found (never on a first install); and the
//! first start of a build that binds cookies to their balancer, which opens a window for the
//! cookies of the earlier form when the file was an earlier build's. Mode 0600: who reads it
//! can forge cookies. Written whole (a temporary file renamed over the old one); a file that
//! is unreadable is reported and left alone, one that is not ours is replaced.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::balancer::state_file::write_whole;
use crate::config::keys::SESSION_SECRET_MIN;
use crate::http_balancer::sessions::{CookieKeys, Kept, OwnSecret};
use crate::support::clock::wall_ms;
use crate::tls::files::Passphrase;

/// The format's version; a file of another one is replaced.
const VERSION: u32 = 1;

/// Largest file read: a real one is about 120 bytes.
const MAX_SIZE: u64 = 64 * 1024;

/// The file as written.
#[derive(Serialize, Deserialize)]
struct SecretFile {
    /// The format's name and version: a file without it is someone else's.
    appbroker_session_secret: u32,
    /// When it was made, ms since the Unix epoch: the first start that signed cookies.
    created_epoch_ms: u64,
    /// Whether that start opened the window for unsigned cookies: only when an earlier state
    /// file was found, an upgrade from a build that did not sign them. Absent from the file
    /// of an earlier build, which opened it whatever it found.
    #[serde(default = "opened")]
    unsigned_window: bool,
    /// The first start of a build that binds cookies to their balancer, ms since the Unix
    /// epoch; absent from the file of an earlier build, whose next start is that first one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bound_epoch_ms: Option<u64>,
    /// Whether that start opened the window for cookies of the earlier form: when it found
    /// the file an earlier build wrote, not when it made the file (no cookie of that form was
    /// ever signed with its secret).
    #[serde(default)]
    unbound_window: bool,
    /// The secret.
    secret: String,
}

/// What a file of an earlier build says of its window for unsigned cookies: it opened one.
fn opened() -> bool {
    true
}

impl SecretFile {
    /// The broker's own secret as this file gives it, kept at `path`.
    fn own(&self, kept: Kept) -> OwnSecret {
        OwnSecret {
            secret: Passphrase::new(self.secret.clone()),
            kept,
            since_wall_ms: self.unsigned_window.then_some(self.created_epoch_ms),
            bound_since_wall_ms: self.bound_epoch_ms.filter(|_| self.unbound_window),
        }
    }
}

/// The secret file that goes with the state file `state`: its name with `.secret` added.
pub fn path_for(state: &Path) -> PathBuf {
    let mut name = state.file_name().unwrap_or_default().to_os_string();
    name.push(".secret");
    state.with_file_name(name)
}

/// The broker's own secret: read from the file beside `state`, else generated and written
/// there; generated for this run only when there is no state file (`STATE_FILE=0`) or the
/// file can be neither read nor written (logged, with what to do). The file of an earlier
/// build is written again with this start as the first that binds cookies.
pub fn keep(state: Option<&Path>) -> OwnSecret {
    let Some(state) = state else {
        return OwnSecret::for_this_run("STATE_FILE=0 and no SESSION_SECRET");
    };
    // Before anything is written: whether a broker ran on this state file before.
    let earlier = state.exists();
    let path = path_for(state);
    match read(&path) {
        Ok(Some(file)) => return first_bound_start(&path, file),
        Ok(None) => {}
        Err(Unusable::Unreadable(e)) => {
            warn!(
                path = %path.display(),
                "cannot read the session secret: {e}; a secret for this run only signs cookies, and the file is left alone (make it readable by appbroker, or set SESSION_SECRET)"
            );
            return OwnSecret::for_this_run(format!("{} could not be read", path.display()));
        }
        Err(Unusable::Foreign(why)) => warn!(
            path = %path.display(),
            "the session secret file is not one appbroker wrote ({why}); a new secret replaces it, and sessions signed with the old one move"
        ),
    }
    let created = wall_ms();
    let file = SecretFile {
        appbroker_session_secret: VERSION,
        created_epoch_ms: created,
        unsigned_window: earlier,
        bound_epoch_ms: Some(created),
        unbound_window: false,
        secret: String::from_utf8_lossy(CookieKeys::generate_secret().expose()).into_owned(),
    };
    match write(&path, &file) {
        Ok(()) => file.own(Kept::Created(path)),
        Err(e) => {
            warn!(
                path = %path.display(),
                "cannot keep the session secret: {e}; a secret for this run only signs cookies (let appbroker write the state file's directory, or set SESSION_SECRET)"
            );
            let why = format!("{} could not be written", path.display());
            let mut own = file.own(Kept::Nowhere(why));
            own.since_wall_ms = None;
            own
        }
    }
}

/// The secret `file` read at `path`; when an earlier build wrote it, this start is the first
/// that binds cookies, written into it (or, when it cannot be, a window for this run only).
fn first_bound_start(path: &Path, mut file: SecretFile) -> OwnSecret {
    if file.bound_epoch_ms.is_none() {
        file.bound_epoch_ms = Some(wall_ms());
        file.unbound_window = true;
        if let Err(e) = write(path, &file) {
            warn!(
                path = %path.display(),
                "cannot write the session secret file: {e}; cookies of the earlier form (not bound to their balancer) are honoured for one SESSION_TIMEOUT from now, and again after each start until it can be written"
            );
        }
    }
    file.own(Kept::Read(path.to_path_buf()))
}

/// Why the file was not used.
enum Unusable {
    /// It exists but could not be read: left alone.
    Unreadable(std::io::Error),
    /// It is not a secret file of this version: replaced.
    Foreign(String),
}

/// The secret file at `path`; `None` when there is no file (a first start). A file others
/// may read is made private again, with a warning.
fn read(path: &Path) -> Result<Option<SecretFile>, Unusable> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Unusable::Unreadable(e)),
    };
    if !metadata.is_file() || metadata.len() > MAX_SIZE {
        return Err(Unusable::Foreign(format!(
            "not a regular file of at most {MAX_SIZE} bytes"
        )));
    }
    let text = std::fs::read(path).map_err(Unusable::Unreadable)?;
    let file: SecretFile = serde_json::from_slice(&text)
        .map_err(|e| Unusable::Foreign(format!("not its JSON: {e}")))?;
    if file.appbroker_session_secret != VERSION {
        return Err(Unusable::Foreign(format!(
            "format version {}, this one reads {VERSION}",
            file.appbroker_session_secret
        )));
    }
    if file.secret.chars().count() < SESSION_SECRET_MIN {
        return Err(Unusable::Foreign("its secret is too short".into()));
    }
    make_private(path, &metadata);
    Ok(Some(file))
}

/// Takes away others' access to `path` if they have any (a copy made with the wrong umask).
#[cfg(unix)]
fn make_private(path: &Path, metadata: &std::fs::Metadata) {
    use std::os::unix::fs::PermissionsExt;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return;
    }
    let fixed = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    warn!(
        path = %path.display(),
        "the session secret file had mode {mode:04o}: whoever can read it can forge session cookies; {}",
        match fixed {
            Ok(()) => "it is 0600 now".to_string(),
            Err(e) => format!("it could not be made 0600 ({e}): chmod 600 it"),
        }
    );
}

/// Nothing to check without Unix permissions.
#[cfg(not(unix))]
fn make_private(_path: &Path, _metadata: &std::fs::Metadata) {}

/// Writes `file` to `path`, mode 0600 from its first byte, replacing the file whole.
fn write(path: &Path, file: &SecretFile) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(file).map_err(std::io::Error::other)?;
    write_whole(path, &text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_start_writes_a_private_file_and_the_next_reads_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("sub/appserver.state");
        assert_eq!(
            path_for(&state),
            dir.path().join("sub/appserver.state.secret")
        );
        let first = keep(Some(&state));
        assert_eq!(first.kept, Kept::Created(path_for(&state)));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path_for(&state))
                .expect("written")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = keep(Some(&state));
        assert_eq!(again.kept, Kept::Read(path_for(&state)));
        assert_eq!(again.secret, first.secret);
        assert_eq!(again.since_wall_ms, first.since_wall_ms);
    }

    #[test]
    fn a_first_install_opens_no_window_and_an_upgrade_opens_each_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A first install: no state file before it. No window, now or at the next start.
        let fresh = dir.path().join("fresh.state");
        let first = keep(Some(&fresh));
        assert_eq!(
            (first.since_wall_ms, first.bound_since_wall_ms),
            (None, None)
        );
        std::fs::write(&fresh, "{}").expect("a state file, written since");
        let again = keep(Some(&fresh));
        assert_eq!(
            (again.since_wall_ms, again.bound_since_wall_ms),
            (None, None)
        );
        // An upgrade from a build that did not sign cookies: a state file, no secret file.
        let unsigned = dir.path().join("unsigned.state");
        std::fs::write(&unsigned, "{}").expect("the earlier build's state file");
        let first = keep(Some(&unsigned));
        assert!(first.since_wall_ms.is_some() && first.bound_since_wall_ms.is_none());
        assert_eq!(keep(Some(&unsigned)).since_wall_ms, first.since_wall_ms);
        // An upgrade from a build that signed unbound cookies: its file, without the start
        // that bound them. This start is that one, kept for the next.
        let unbound = dir.path().join("unbound.state");
        let earlier = "{\"appbroker_session_secret\":1,\"created_epoch_ms\":5,\
                       \"secret\":\"0123456789012345678901234567890123456789012\"}";
        std::fs::write(path_for(&unbound), earlier).expect("the earlier build's file");
        let before = wall_ms();
        let first = keep(Some(&unbound));
        assert_eq!(first.since_wall_ms, Some(5), "its window, as it was");
        let bound = first
            .bound_since_wall_ms
            .expect("a window for the earlier form");
        assert!(bound >= before);
        let again = keep(Some(&unbound));
        assert_eq!(again.bound_since_wall_ms, Some(bound));
        assert_eq!(again.secret, first.secret);
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_read_is_made_private_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("a.state");
        let first = keep(Some(&state));
        let file = path_for(&state);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let again = keep(Some(&state));
        assert_eq!(
            (again.kept, again.secret),
            (Kept::Read(file.clone()), first.secret)
        );
        let mode = std::fs::metadata(&file).expect("kept").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_foreign_file_is_replaced_and_no_state_file_means_this_run_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("a.state");
        for text in [
            "not json",
            "{\"secret\":\"x\"}",
            "{\"appbroker_session_secret\":2,\"created_epoch_ms\":1,\"secret\":\"0123456789012345678901234567890123\"}",
            "{\"appbroker_session_secret\":1,\"created_epoch_ms\":1,\"secret\":\"short\"}",
        ] {
            std::fs::write(path_for(&state), text).expect("write");
            let own = keep(Some(&state));
            assert_eq!(own.kept, Kept::Created(path_for(&state)), "{text}");
            assert!(matches!(read(&path_for(&state)), Ok(Some(_))), "{text}");
        }
        assert!(matches!(keep(None).kept, Kept::Nowhere(_)));
        assert_eq!(keep(None).since_wall_ms, None);
    }
}
