//! Sockets, below both connection paths: binding and accepting, an accepted connection's TLS
//! step, resolving and connecting to a server, moving bytes between two streams, the threads
//! that serve them, and the few system calls the standard library lacks. Nothing here knows
//! what a balancer is: the accept loop is handed what serves a connection
//! ([`listener::Serve`]), and the TLS step returns what became of it for the caller to count.
//!
//! - [`listener`]: binding a balancer's port, and the accept loop that never dies.
//! - [`handshake`]: an accepted connection made ready once, before either path serves it: its
//!   PROXY protocol header read (who the client is), then made secure as its port's TLS says
//!   (the first byte told apart, the handshake within a timeout).
//! - [`proxy_protocol`]: the PROXY protocol's headers (versions 1 and 2) read from bytes and
//!   written, pure functions.
//! - [`connector`]: a connection to a server for a client: the dial, the socket's options,
//!   and its outcome told to whoever counts connects (the balancer).
//! - [`dial`]: connecting to a server: resolve, refuse the broker itself, connect within a
//!   timeout, socket options, TLS towards servers; for clients and the monitor alike.
//! - [`resolve`]: server names to addresses: cached, one lookup per name, a bound on lookups
//!   in flight.
//! - [`stream`]: the streams served and relayed (any `AsyncRead + AsyncWrite`), with what a
//!   plain TCP socket can do besides.
//! - [`relay`]: bytes both ways with half-close over any stream; splice(2) between plain
//!   sockets.
//! - [`splice`] (Linux): bytes from one plain socket to another through a pipe of a bounded
//!   pool, never through user space: the relay's bulk transfers and the HTTP engine's long
//!   bodies.
//! - [`http_exchange`]: one HTTP/1.1 request over a connection made, by hyper's client: the
//!   monitor's HTTP check and the webhook's, never a client's path.
//! - [`workers`]: the data path's threads, one per core, each with its own runtime and
//!   listening sockets.
//! - [`sys`]: the system calls the standard library lacks (keepalive knobs, splice pipes, the
//!   open-file limit).
//! - `inherit` (Unix): descriptors handed over by a supervisor or systemd, taken by number
//!   (the `unsafe` step is [`crate::support::unsafe_calls`]'s).

pub mod connector;
pub mod dial;
pub mod handshake;
pub mod http_exchange;
#[cfg(unix)]
pub mod inherit;
pub mod listener;
pub mod proxy_protocol;
pub mod relay;
pub mod resolve;
#[cfg(target_os = "linux")]
pub mod splice;
pub mod stream;
pub mod sys;
pub mod workers;
