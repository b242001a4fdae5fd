//! Listening: bind a balancer's port, and the accept loop that never dies. The loop yields
//! each connection as it was accepted ([`Accepted`], its TLS step still to come:
//! `net::handshake`) to what serves it ([`Serve`], given to the loop): each client gets its
//! own task; past `MAX_CONNECTIONS` a client is accepted and closed at once.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::config::{BalancerConfig, Keepalive};
use crate::net::handshake::Accepted;
use crate::net::sys;
use crate::support::os_error::{explain_bind, words};

/// Pending connections the kernel may queue before `accept`; the kernel caps it at
/// `net.core.somaxconn`. Large, because clients arrive in bursts (a shift starting).
const BACKLOG: i32 = 4096;

/// How long the accept loop waits after an error that is not one connection's (out of file
/// descriptors, out of memory) before accepting again: long enough not to spin, short enough
/// that service resumes as soon as descriptors are free.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a listener closing for good keeps serving handshakes that were under way when it
/// stopped letting new ones begin: a client's last ACK comes a round trip after the SYN-ACK.
const HANDSHAKES_SETTLE: Duration = Duration::from_millis(250);

/// Tells the accept loops of one listening address to stop, and whether that address closes
/// for good (a reload moved or removed it: no new handshake may begin, the queue is served,
/// then the socket closes) or lives on elsewhere (a successor took the socket over, or the
/// broker stops).
#[derive(Clone, Debug)]
pub struct StopAccepting {
    token: CancellationToken,
    port_closes: Arc<AtomicBool>,
}

impl StopAccepting {
    /// Stops when `token` is cancelled, as well as when asked.
    pub fn new(token: CancellationToken) -> Self {
        StopAccepting {
            token,
            port_closes: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The loops stop; the listening sockets are left as they are.
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// The loops stop and the port closes for good (see [`sys::refuse_new_handshakes`]).
    pub fn close_port(&self) {
        self.port_closes.store(true, Ordering::SeqCst);
        self.token.cancel();
    }

    /// The token cancelled when the loops stop.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    fn port_closes(&self) -> bool {
        self.port_closes.load(Ordering::SeqCst)
    }
}

/// A port that could not be bound; the broker does not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address} for {balancer}: {reason}")]
pub struct BindError {
    /// `[SECTION]` of the balancer.
    pub balancer: String,
    /// The address it should listen on.
    pub address: SocketAddr,
    /// The cause in words, with what to do.
    pub reason: String,
}

/// Binds the balancer's `count` listening sockets on its one address (several only where the
/// kernel spreads connections across them: SO_REUSEPORT, one per worker thread).
///
/// `SO_REUSEADDR` lets a restarted broker bind while old connections linger in TIME_WAIT.
/// `SO_REUSEPORT` would also let a second broker share the port silently, so the port is first
/// probed by a socket without it: that bind fails, with "address already in use", when any
/// other socket holds the port, reuse-port or not.
pub fn bind(
    config: &BalancerConfig,
    count: usize,
) -> Result<Vec<std::net::TcpListener>, BindError> {
    bind_sockets(config, count, Sharing::Probed(count > 1))
}

/// As [`bind`], on a port this process already listens on at another address of the same
/// family, the wildcard or one address (a supervisor moving a balancer between the two for an
/// upgrade): every socket with SO_REUSEPORT and no probe, which Linux allows when the sockets
/// already there have SO_REUSEPORT too (they do where there are several per port). For the
/// time both are open, the kernel gives a client to the more specific address.
pub fn bind_beside(
    config: &BalancerConfig,
    count: usize,
) -> Result<Vec<std::net::TcpListener>, BindError> {
    bind_sockets(config, count, Sharing::Beside)
}

/// How the sockets of one [`bind_sockets`] share their port.
#[derive(Clone, Copy)]
enum Sharing {
    /// SO_REUSEPORT when true (several sockets), after a probe without it that fails when any
    /// other socket holds the port.
    Probed(bool),
    /// SO_REUSEPORT on every socket and no probe: the port is this process's already.
    Beside,
}

/// `count` sockets on the balancer's address, sharing the port as `sharing` says.
fn bind_sockets(
    config: &BalancerConfig,
    count: usize,
    sharing: Sharing,
) -> Result<Vec<std::net::TcpListener>, BindError> {
    let address = config.listen;
    let fail = |e: io::Error| BindError {
        balancer: config.kind.to_string(),
        address,
        reason: explain_bind(&e, address.port()),
    };
    let socket = || -> io::Result<Socket> {
        let socket = Socket::new(
            Domain::for_address(address),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        #[cfg(unix)]
        socket.set_reuse_address(true)?;
        if address.is_ipv6() && address.ip().is_unspecified() {
            // `::` serves IPv4 clients too, as operators expect from "all addresses".
            socket.set_only_v6(false)?;
        }
        Ok(socket)
    };
    let reuse_port = matches!(sharing, Sharing::Probed(true) | Sharing::Beside);
    if let Sharing::Probed(true) = sharing {
        let probe = socket().map_err(fail)?;
        probe.bind(&address.into()).map_err(fail)?;
    }
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = socket().map_err(fail)?;
        if reuse_port {
            sys::set_reuse_port(&socket).map_err(fail)?;
        }
        socket.set_nonblocking(true).map_err(fail)?;
        socket.bind(&address.into()).map_err(fail)?;
        socket.listen(BACKLOG).map_err(fail)?;
        listeners.push(socket.into());
    }
    Ok(listeners)
}

/// Errors that belong to one connection (it went away before it was accepted): accept the next
/// at once. Anything else is the broker's (descriptors, memory) and gets a back-off.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// What an accept loop hands its connections to, and tells how accepting goes. The broker
/// gives it (a balancer's hand-off: the TLS step, then the TCP client, or the HTTP engine of
/// an HTTP balancer), so the listener knows nothing of what serves a connection.
pub trait Serve {
    /// The keepalive settings of the balancer's accepted sockets, read at every accept (a
    /// reload may change them).
    fn keepalive(&self) -> Keepalive;
    /// Starts serving a connection just accepted (its own task, or a refusal).
    fn start(&self, accepted: Accepted);
    /// An accept succeeded (an episode of failed accepts, if any, is over).
    fn accepted(&self);
    /// An accept failed for the broker's own reasons (descriptors, memory); the loop waits
    /// `backoff` before accepting again.
    fn accept_failed(&self, error: &io::Error, backoff: Duration);
}

/// Accepts clients until `stop_accepting` says to stop (then serves what the kernel had
/// queued), handing each to `serve`. Log lines carry the current span (the balancer's).
pub async fn accept_loop(listener: TcpListener, stop_accepting: StopAccepting, serve: impl Serve) {
    let start = |stream: TcpStream, peer: SocketAddr| {
        if !sys::ACCEPTED_INHERIT_OPTIONS {
            set_accepted_options(&stream, &serve.keepalive(), peer);
        }
        serve.start(Accepted::new(stream, peer));
    };
    // The keepalive settings the listener carries for its accepted sockets to inherit; set
    // again when a reload changes them.
    let mut listener_keepalive = None;
    loop {
        let keepalive = serve.keepalive();
        if sys::ACCEPTED_INHERIT_OPTIONS && listener_keepalive != Some(keepalive) {
            if let Err(e) = sys::set_listener_options(&listener, &keepalive) {
                warn!(
                    "cannot set keepalive on the listening socket: {}",
                    words(&e)
                );
            }
            listener_keepalive = Some(keepalive);
        }
        let accepted = tokio::select! {
            _ = stop_accepting.token().cancelled() => {
                // Connections the kernel already accepted would be reset when the listener
                // closes: serve them first.
                if stop_accepting.port_closes() {
                    close_for_good(&listener, start).await;
                } else {
                    drain_queue(&listener, start);
                }
                return;
            }
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                serve.accept_failed(&e, ACCEPT_BACKOFF);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        serve.accepted();
        start(stream, peer);
    }
}

/// Serves a listener's last clients before its port closes for good: no new handshake may
/// begin, and what was queued or under way is served until the queue has stayed empty for
/// [`HANDSHAKES_SETTLE`]. Without the kernel's help (not Linux), only the queue is served.
async fn close_for_good(listener: &TcpListener, mut start: impl FnMut(TcpStream, SocketAddr)) {
    if let Err(e) = sys::refuse_new_handshakes(listener) {
        debug!("cannot refuse new handshakes before closing: {}", words(&e));
    }
    loop {
        drain_queue(listener, &mut start);
        match tokio::time::timeout(HANDSHAKES_SETTLE, listener.accept()).await {
            Ok(Ok((stream, peer))) => start(stream, peer),
            Ok(Err(e)) if is_connection_error(&e) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// Accepts every connection the kernel has queued on `listener`, handing each to `start`, and
/// returns when none is left (or accepting fails for the broker's own reasons). Straight from
/// the socket: the runtime's view of it may be a wake-up behind, and its fairness budget would
/// call the queue empty after a hundred or so.
fn drain_queue(listener: &TcpListener, mut start: impl FnMut(TcpStream, SocketAddr)) {
    let socket = socket2::SockRef::from(listener);
    loop {
        match socket.accept() {
            Ok((accepted, peer)) => {
                let Some(peer) = peer.as_socket() else {
                    continue;
                };
                let std: std::net::TcpStream = accepted.into();
                match std
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(std))
                {
                    Ok(stream) => start(stream, peer),
                    Err(e) => debug!(client = %peer, "cannot serve a queued client: {}", words(&e)),
                }
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(_) => return,
        }
    }
}

/// TCP_NODELAY and keepalive on an accepted socket, where it does not inherit them from its
/// listener ([`sys::ACCEPTED_INHERIT_OPTIONS`]).
fn set_accepted_options(stream: &TcpStream, keepalive: &Keepalive, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    if let Err(e) = sys::set_keepalive(stream, keepalive) {
        debug!(client = %peer, "cannot set keepalive: {}", words(&e));
    }
}
