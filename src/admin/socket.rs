//! The control socket (Unix only): a stream socket made with mode 0600 (0660 with
//! `CONTROL_GROUP`), so only its owner (and that group) may connect; one JSON request per
//! line, one answer per line. A stale socket left by a dead broker is replaced; a live
//! broker's is not. Each connection's peer is known by its uid (`SO_PEERCRED`), which every
//! change's log line names.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tracing::{debug, error, info, warn};

use super::Admin;
use super::protocol::{Answer, MAX_REQUEST, Request};

/// Control connections served at once; more wait for a place. Administration is a person or
/// a script or two: this only bounds what a runaway loop can hold.
const MAX_CONNECTIONS: usize = 16;

/// How long a control connection may sit without a request before it is closed.
const IDLE: Duration = Duration::from_secs(300);

/// Why the control socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another broker answers on it.
    #[error(
        "another appbroker is running with the control socket {0}; stop it first, or give \
         this one its own CONTROL_SOCKET in [General]"
    )]
    Live(PathBuf),
    /// Something that is not a socket is in its place.
    #[error(
        "cannot make the control socket {0}: a file that is not a socket is there; remove it or set CONTROL_SOCKET in [General]"
    )]
    NotSocket(PathBuf),
    /// The group named by `CONTROL_GROUP` does not exist.
    #[error("CONTROL_GROUP {0} is no group of this machine")]
    NoGroup(String),
    /// A system call failed.
    #[error("cannot make the control socket {path}: {words}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// What failed, in words.
        words: String,
    },
}

/// The control socket, bound; its file is removed when this is dropped (if it is still the
/// one made here).
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
    listener: Option<StdUnixListener>,
    /// The socket file's inode, so a drop never removes another broker's.
    inode: u64,
}

/// Why `CONTROL_GROUP` names no group id.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// No group of that name.
    #[error("CONTROL_GROUP {0} is no group of this machine")]
    NoGroup(String),
    /// The group database could not be read.
    #[error("cannot look CONTROL_GROUP up: {0}")]
    Lookup(std::io::Error),
}

/// The id of the group `CONTROL_GROUP` names (`None`: none named): the owners of the control
/// socket and of the supervisor's beside it.
pub fn group_id(group: Option<&str>) -> Result<Option<u32>, GroupError> {
    let Some(name) = group else {
        return Ok(None);
    };
    match nix::unistd::Group::from_name(name) {
        Ok(Some(group)) => Ok(Some(group.gid.as_raw())),
        Ok(None) => Err(GroupError::NoGroup(name.to_string())),
        Err(e) => Err(GroupError::Lookup(e.into())),
    }
}

impl ControlSocket {
    /// Binds the control socket at `path` (its directory made if need be), replacing a
    /// stale one, with mode 0600, or 0660 and owned by `group`.
    pub fn bind(path: &Path, group: Option<&str>) -> Result<ControlSocket, SocketError> {
        let io = |e: std::io::Error| SocketError::Io {
            path: path.to_path_buf(),
            words: crate::os_error::words(&e),
        };
        let gid = group_id(group).map_err(|e| match e {
            GroupError::NoGroup(name) => SocketError::NoGroup(name),
            GroupError::Lookup(e) => io(e),
        })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(SocketError::NotSocket(path.to_path_buf()));
            }
            Ok(_) => match StdUnixStream::connect(path) {
                Ok(_) => return Err(SocketError::Live(path.to_path_buf())),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    info!("replacing the stale control socket {}", path.display());
                    std::fs::remove_file(path).map_err(io)?;
                }
                Err(e) => return Err(io(e)),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        // Made with the umask's mode (no write for others with the usual 022, so nobody else
        // can connect meanwhile), then narrowed.
        let listener = StdUnixListener::bind(path).map_err(io)?;
        let mode = if gid.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io)?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(io)?;
        }
        listener.set_nonblocking(true).map_err(io)?;
        let inode = std::fs::metadata(path).map_err(io)?.ino();
        Ok(ControlSocket {
            path: path.to_path_buf(),
            listener: Some(listener),
            inode,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves requests with `admin` until the returned task is aborted or the process ends.
    /// Must be called within a tokio runtime.
    pub fn serve(&mut self, admin: Arc<Admin>) -> Result<tokio::task::JoinHandle<()>, SocketError> {
        let Some(listener) = self.listener.take() else {
            return Err(SocketError::Io {
                path: self.path.clone(),
                words: "already serving".into(),
            });
        };
        let listener = UnixListener::from_std(listener).map_err(|e| SocketError::Io {
            path: self.path.clone(),
            words: crate::os_error::words(&e),
        })?;
        Ok(tokio::spawn(accept_loop(listener, admin)))
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Accepts control connections forever; a failed accept is logged once and retried.
async fn accept_loop(listener: UnixListener, admin: Arc<Admin>) {
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut failing = false;
    loop {
        let Ok(place) = Arc::clone(&places).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                failing = false;
                let admin = Arc::clone(&admin);
                tokio::spawn(async move {
                    serve(stream, &admin).await;
                    drop(place);
                });
            }
            Err(e) => {
                if !failing {
                    error!(
                        "cannot accept on the control socket: {}; retrying",
                        crate::os_error::words(&e)
                    );
                    failing = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one control connection: a request per line, an answer per line.
async fn serve(stream: UnixStream, admin: &Admin) {
    let by = match stream.peer_cred() {
        Ok(cred) => format!("uid {}", cred.uid()),
        Err(_) => "an unknown user".to_string(),
    };
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut line = Vec::new();
        let mut limited = (&mut read).take(MAX_REQUEST as u64 + 1);
        // Closed, failed, or idle too long: the connection ends.
        match tokio::time::timeout(IDLE, limited.read_until(b'\n', &mut line)).await {
            Ok(Ok(read)) if read > 0 => {}
            _ => return,
        }
        if line.len() > MAX_REQUEST && line.last() != Some(&b'\n') {
            warn!(by = %by, "control socket: a request of over {MAX_REQUEST} bytes from {by}; connection closed");
            let answer = Answer::refused(format!(
                "request longer than {MAX_REQUEST} bytes; send one JSON request per line"
            ));
            let _ = send(&mut write, &answer).await;
            return;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Request>(text) {
            Ok(request) => {
                debug!(by = %by, "control request: {text}");
                admin.answer(request, &by).await
            }
            Err(e) => {
                warn!(by = %by, "control socket: not a request from {by}: {e}");
                Answer::refused(format!(
                    "not a request ({e}); send one JSON object per line, such as \
                     {{\"command\":\"show\"}} (docs/operations.md lists them)"
                ))
            }
        };
        if send(&mut write, &answer).await.is_err() {
            return;
        }
    }
}

/// Writes `answer` as one line.
async fn send(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    answer: &Answer,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await
}
