//! `<state>.secret`, beside the state file: the broker's own secret for the HTTP session
//! cookies, generated at the first start and read at every one after, so that a
//! restart keeps every session while `SESSION_SECRET` is not set. It also records when it was
//! made, the first start that signed cookies, which bounds the upgrade window. Mode 0600: who
//! reads it can forge cookies. Written whole (a temporary file renamed over the old one); a
//! file that is unreadable is reported and left alone, one that is not ours is replaced.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::state_file::write_whole;
use crate::config::keys::SESSION_SECRET_MIN;
use crate::http_balancer::sessions::{CookieKeys, Kept, OwnSecret};
use crate::process::clock::wall_ms;
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
    /// The secret.
    secret: String,
}

/// The secret file that goes with the state file `state`: its name with `.secret` added.
pub fn path_for(state: &Path) -> PathBuf {
    let mut name = state.file_name().unwrap_or_default().to_os_string();
    name.push(".secret");
    state.with_file_name(name)
}

/// The broker's own secret: read from the file beside `state`, else generated and written
/// there; generated for this run only when there is no state file (`STATE_FILE=0`) or the
/// file can be neither read nor written (logged, with what to do).
pub fn keep(state: Option<&Path>) -> OwnSecret {
    let Some(state) = state else {
        return OwnSecret::for_this_run("STATE_FILE=0 and no SESSION_SECRET");
    };
    let path = path_for(state);
    match read(&path) {
        Ok(Some(own)) => return own,
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
    let secret = CookieKeys::generate_secret();
    let created = wall_ms();
    match write(&path, &secret, created) {
        Ok(()) => OwnSecret {
            secret,
            kept: Kept::Created(path),
            since_wall_ms: Some(created),
        },
        Err(e) => {
            warn!(
                path = %path.display(),
                "cannot keep the session secret: {e}; a secret for this run only signs cookies (let appbroker write the state file's directory, or set SESSION_SECRET)"
            );
            OwnSecret {
                secret,
                kept: Kept::Nowhere(format!("{} could not be written", path.display())),
                since_wall_ms: None,
            }
        }
    }
}

/// Why the file was not used.
enum Unusable {
    /// It exists but could not be read: left alone.
    Unreadable(std::io::Error),
    /// It is not a secret file of this version: replaced.
    Foreign(String),
}

/// The secret kept at `path`; `None` when there is no file (a first start). A file others may
/// read is made private again, with a warning.
fn read(path: &Path) -> Result<Option<OwnSecret>, Unusable> {
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
    Ok(Some(OwnSecret {
        secret: Passphrase::new(file.secret),
        kept: Kept::Read(path.to_path_buf()),
        since_wall_ms: Some(file.created_epoch_ms),
    }))
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

/// Writes `secret` made at `created` to `path`, mode 0600 from its first byte, replacing
/// the file whole.
fn write(path: &Path, secret: &Passphrase, created: u64) -> std::io::Result<()> {
    let file = SecretFile {
        appbroker_session_secret: VERSION,
        created_epoch_ms: created,
        secret: String::from_utf8_lossy(secret.expose()).into_owned(),
    };
    let text = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
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
