//! The control socket (Unix only): a stream socket made with mode 0600 (0660 with
//! `CONTROL_GROUP`), so only its owner (and that group) may connect; one JSON request per
//! line, one answer per line. A stale socket left by a dead broker is replaced; a live
//! broker's is not. Each connection's peer is known by its uid (`SO_PEERCRED`), which every
//! change's log line names.
//!
//! No client can keep another out for long, and none can keep `ping` out at all (keepalived
//! asks it once a second, and gives the virtual address away when it goes unanswered): the
//! accept loop never waits; a connection must send a request line within
//! [`REQUEST_TIME`] while it holds no place, and when [`MAX_ARRIVING`] such connections are
//! open the oldest of them is closed for each new one, so a newcomer (a `ping`) always finds
//! room at once, however many half-written lines are held; `ping` is answered without a
//! place; every other request takes one of [`MAX_CONNECTIONS`] places, kept while its
//! connection stays open, but for a `wait`, which gives it up while it waits.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tracing::{debug, error, info, warn};

use super::Admin;
use super::protocol::{Answer, MAX_REQUEST, Request};
use crate::config::show_duration;
use crate::support::throttle::Episode;

/// Places: control connections served at once, each from its first request (but `ping`)
/// until it closes. Administration is a person or a script or two: this only bounds what a
/// runaway loop can hold.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a request waits for a place when all are taken (a burst of scripts, each done in
/// a moment) before it is refused as busy.
const PLACE_WAIT: Duration = Duration::from_secs(2);

/// Connections without a place (not sent their first request yet, or asking only `ping`) at
/// once; a new one past them closes the oldest. Each lasts [`REQUEST_TIME`] at most.
const MAX_ARRIVING: usize = 64;

/// How long a connection without a place may take to send its request line.
pub const REQUEST_TIME: Duration = Duration::from_secs(5);

/// `wait`s (`ctl drain --wait`) waiting at once, each on no place; more are refused.
const MAX_WAITS: usize = 256;

/// How long a connection with a place may sit without a request before it is closed.
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
            words: crate::support::os_error::words(&e),
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
            words: crate::support::os_error::words(&e),
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

/// What the control socket's connections share: their places and the episodes of running
/// short of them.
#[derive(Debug)]
struct Rooms {
    places: Arc<Semaphore>,
    arriving: Arc<Arrivals>,
    waits: Arc<Semaphore>,
    /// Requests that found every place taken.
    no_place: Episode,
    /// Connections that closed an older one to arrive, [`MAX_ARRIVING`] others having sent
    /// no request yet.
    crowded: Episode,
}

/// The connections without a place, oldest first, each with the way to close it: at most
/// [`MAX_ARRIVING`], and a newcomer past them closes the oldest. Closing the oldest rather
/// than refusing the newest is what keeps `ping` answered: the connections an attacker holds
/// half-written are the old ones, and a `ping` sends its line as it connects.
#[derive(Debug, Default)]
struct Arrivals {
    queue: std::sync::Mutex<std::collections::VecDeque<(u64, oneshot::Sender<()>)>>,
    next: std::sync::atomic::AtomicU64,
}

/// A connection's room to arrive in: its place in [`Arrivals`], given back when dropped
/// (it took a place, a wait's room, or ended).
#[derive(Debug)]
struct ArrivalTicket {
    id: u64,
    arrivals: Arc<Arrivals>,
}

impl Drop for ArrivalTicket {
    fn drop(&mut self) {
        let mut queue = self
            .arrivals
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        queue.retain(|(id, _)| *id != self.id);
    }
}

impl Arrivals {
    /// Room for a new connection, and what fires when it is closed to make room for a newer
    /// one; true besides when an older one was closed for it.
    fn arrive(self: &Arc<Self>) -> (ArrivalTicket, oneshot::Receiver<()>, bool) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (close, closed) = oneshot::channel();
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let crowded = queue.len() >= MAX_ARRIVING;
        if crowded && let Some((_, oldest)) = queue.pop_front() {
            let _ = oldest.send(());
        }
        queue.push_back((id, close));
        let arrival = ArrivalTicket {
            id,
            arrivals: Arc::clone(self),
        };
        (arrival, closed, crowded)
    }
}

impl Rooms {
    fn new() -> Rooms {
        Rooms {
            places: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            arriving: Arc::default(),
            waits: Arc::new(Semaphore::new(MAX_WAITS)),
            no_place: Episode::default(),
            crowded: Episode::default(),
        }
    }

    /// Room for a connection just accepted to send its first request, and what fires when
    /// it must give it up; when too many have sent none yet, the oldest of them is closed for
    /// it (logged once per episode).
    fn arrival(&self) -> (ArrivalTicket, oneshot::Receiver<()>) {
        let (arrival, closed, crowded) = self.arriving.arrive();
        if crowded {
            if self.crowded.strike() {
                warn!(
                    "control socket: {MAX_ARRIVING} connections have sent no request yet: the \
                     oldest of them is closed for each new one, so `ping` is still answered"
                );
            }
        } else if let Some(closed) = self.crowded.end() {
            info!(
                "control socket: fewer than {MAX_ARRIVING} connections without a request \
                 again; {closed} were closed meanwhile to make room"
            );
        }
        (arrival, closed)
    }

    /// A place for a request; waits [`PLACE_WAIT`] for one when all are taken (logged once
    /// per episode), `None` after that.
    async fn place(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(place) = Arc::clone(&self.places).try_acquire_owned() {
            if let Some(short) = self.no_place.end() {
                info!(
                    "control socket: places free again; {short} requests found all taken \
                     meanwhile"
                );
            }
            return Some(place);
        }
        if self.no_place.strike() {
            warn!(
                "control socket: all {MAX_CONNECTIONS} places are taken (connections served \
                 at once): requests wait up to {} for one, then are refused as busy; `ping` is \
                 answered regardless",
                show_duration(PLACE_WAIT)
            );
        }
        tokio::time::timeout(PLACE_WAIT, Arc::clone(&self.places).acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

/// Accepts control connections forever, never waiting for room (each connection finds its
/// own); a failed accept is logged once and retried.
async fn accept_loop(listener: UnixListener, admin: Arc<Admin>) {
    let rooms = Arc::new(Rooms::new());
    let mut failing = false;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                failing = false;
                let (arrival, evicted) = rooms.arrival();
                let (admin, rooms) = (Arc::clone(&admin), Arc::clone(&rooms));
                tokio::spawn(async move {
                    let connection =
                        ControlConnection::new(stream, Room::Arrival { _held: arrival });
                    tokio::select! {
                        () = connection.serve(&admin, &rooms) => {}
                        // Closed without a word for a newer connection: the client sees its
                        // end.
                        () = evicted_while_arriving(evicted) => {}
                    }
                });
            }
            Err(e) => {
                if !failing {
                    error!(
                        "cannot accept on the control socket: {}; retrying",
                        crate::support::os_error::words(&e)
                    );
                    failing = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Fires when a connection still without a place is closed for a newer one; never once it
/// has given its room to arrive in up (its sender dropped with it).
async fn evicted_while_arriving(evicted: oneshot::Receiver<()>) {
    if evicted.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The room a control connection holds: to arrive in, until its first request other than
/// `ping` takes it a place.
#[derive(Debug)]
enum Room {
    /// Room to send a request in, within [`REQUEST_TIME`].
    Arrival {
        /// Held for its drop, which gives it back.
        _held: ArrivalTicket,
    },
    /// A place, kept until the connection closes.
    Place {
        /// Held for its drop, which gives it back.
        _held: OwnedSemaphorePermit,
    },
    /// A wait's room, until its answer ends the connection.
    Waiting {
        /// Held for its drop, which gives it back.
        _held: OwnedSemaphorePermit,
    },
}

/// One control connection: a request per line, an answer per line.
struct ControlConnection {
    by: String,
    read: BufReader<tokio::net::unix::OwnedReadHalf>,
    write: tokio::net::unix::OwnedWriteHalf,
    /// The room it holds, given back when dropped.
    room: Room,
}

/// What to do after an answer.
enum Then {
    /// Read the next request.
    Next,
    /// Close the connection.
    Close,
}

impl ControlConnection {
    fn new(stream: UnixStream, room: Room) -> ControlConnection {
        let by = match stream.peer_cred() {
            Ok(cred) => format!("uid {}", cred.uid()),
            Err(_) => "an unknown user".to_string(),
        };
        let (read, write) = stream.into_split();
        ControlConnection {
            by,
            read: BufReader::new(read),
            write,
            room,
        }
    }

    /// Serves requests until the client closes, fails, idles too long or must go.
    async fn serve(mut self, admin: &Admin, rooms: &Rooms) {
        loop {
            let Some(line) = self.read_line().await else {
                return;
            };
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let (answer, then) = match serde_json::from_str::<Request>(text) {
                Ok(request) => {
                    debug!(by = %self.by, "control request: {text}");
                    self.carry_out(request, admin, rooms).await
                }
                Err(e) => {
                    warn!(by = %self.by, "control socket: not a request from {}: {e}", self.by);
                    let answer = Answer::refused(format!(
                        "not a request ({e}); send one JSON object per line, such as \
                         {{\"command\":\"show\"}} (docs/operations.md lists them)"
                    ));
                    (answer, Then::Next)
                }
            };
            if send(&mut self.write, &answer).await.is_err() {
                return;
            }
            if let Then::Close = then {
                return;
            }
        }
    }

    /// The next request line, within [`REQUEST_TIME`] without a place or [`IDLE`] with one;
    /// `None` when the connection is to end (closed, failed, too slow, or a line too long,
    /// answered so).
    async fn read_line(&mut self) -> Option<Vec<u8>> {
        let within = match self.room {
            Room::Place { .. } => IDLE,
            Room::Arrival { .. } | Room::Waiting { .. } => REQUEST_TIME,
        };
        let mut line = Vec::new();
        let mut limited = (&mut self.read).take(MAX_REQUEST as u64 + 1);
        match tokio::time::timeout(within, limited.read_until(b'\n', &mut line)).await {
            Ok(Ok(read)) if read > 0 => {}
            _ => return None,
        }
        if line.len() > MAX_REQUEST && line.last() != Some(&b'\n') {
            let by = &self.by;
            warn!(by = %by, "control socket: a request of over {MAX_REQUEST} bytes from {by}; connection closed");
            let answer = Answer::refused(format!(
                "request longer than {MAX_REQUEST} bytes; send one JSON request per line"
            ));
            let _ = send(&mut self.write, &answer).await;
            return None;
        }
        Some(line)
    }

    /// Carries `request` out with the room it needs: none for `ping`, a place for the
    /// others, and for a `wait`, a wait's room instead of its place (its answer ends the
    /// connection).
    async fn carry_out(
        &mut self,
        request: Request,
        admin: &Admin,
        rooms: &Rooms,
    ) -> (Answer, Then) {
        match request {
            Request::Ping => (admin.answer(request, &self.by).await, Then::Next),
            Request::Wait { .. } => {
                let Ok(waiting) = Arc::clone(&rooms.waits).try_acquire_owned() else {
                    let busy =
                        format!("{MAX_WAITS} waits are running already; try again once some end");
                    return (Answer::refused(busy), Then::Close);
                };
                // Its place (or its room to arrive in) goes back while it waits: a wait can
                // last minutes.
                self.room = Room::Waiting { _held: waiting };
                (admin.answer(request, &self.by).await, Then::Close)
            }
            request => {
                if !matches!(self.room, Room::Place { .. }) {
                    let Some(place) = rooms.place().await else {
                        let busy = format!(
                            "the control socket is busy: all {MAX_CONNECTIONS} places are \
                             taken by other connections; try again shortly"
                        );
                        return (Answer::refused(busy), Then::Close);
                    };
                    // The place replaces the room to arrive in.
                    self.room = Room::Place { _held: place };
                }
                (admin.answer(request, &self.by).await, Then::Next)
            }
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
