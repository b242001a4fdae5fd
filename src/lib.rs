//! appbroker: a load-balancing broker for application-server fleets (TOTVS Protheus
//! AppServer is the model). It reads an `appserver.ini`, listens on each `[BALANCE_*]` port,
//! relays every client (proxies every request, on a `[BALANCE_HTTP*]` balancer) to a chosen
//! server, and keeps failed servers in quarantine.
//!
//! # Layout
//!
//! Data flows one way: accept -> sniff -> select -> dial (quarantine the failures, try the
//! next) -> relay -> account; the monitor and the query interface read the balancer's state.
//! The imports follow (`tests/module_graph.rs` fails on a cycle).
//!
//! - [`broker`]: the broker as a library: bind (or take listeners bound elsewhere), start,
//!   subscribe to its events, read a balancer's state, reload (with its result), drain, stop.
//! - [`listener`]: binding and the accept loop (never dies); each connection a [`client`].
//! - [`client`]: one accepted connection as a struct whose methods are its way: sniff, take
//!   a `MAX_CONNECTIONS` place, choose and dial (quarantine, retry), relay, account.
//! - [`query`]: `/TOTVS_BROKER_QUERY` on the balancers' ports: telling queries from clients
//!   (sniff), answering them, and pure renderers of a snapshot (STATUS, CFG, JSON, METRICS).
//! - [`dial`]: connecting to a server: resolve, refuse the broker itself, connect with
//!   timeout, socket options; for clients and the monitor alike.
//! - [`monitor`]: the rounds: check every server, count fall and rise, hand the results to
//!   the balancer.
//! - [`balancer`]: a balancer's live state: servers, counters, the lease that counts a
//!   connection against its server; one method per event; its state read at one instant.
//! - [`health`]: a server's quarantine state as pure transitions returning what changed.
//! - [`overrides`]: an operator's overrides of a server (disabled, drain, weight) as pure
//!   transitions; the balancer applies them and logs.
//! - [`admin`]: runtime administration: the control socket (JSON lines), `appbroker ctl` and
//!   `ping`, the state file that keeps overrides over a restart. It calls the balancer's
//!   methods; nothing below it imports it.
//! - [`select`]: the balancing policies, pure logic.
//! - [`relay`]: bytes both ways with half-close over any stream; splice between plain
//!   sockets.
//! - [`stream`]: the streams served and relayed (any `AsyncRead + AsyncWrite`), with what a
//!   plain TCP socket can do besides.
//! - [`events`]: what happens in a broker, as events to subscribe to.
//! - [`context`]: the broker's shared state handed to every connection's task (configuration,
//!   balancers, shutdown state) and how a balancer tells its connections to end.
//! - [`config`]: `appserver.ini` to a validated [`config::Config`] through one table of keys
//!   ([`config::keys`]); every error names file, line, section and key; `--check` prints it
//!   back.
//! - [`http_balancer`]: an HTTP balancer at run time: the balancer as the HTTP engine's
//!   upstreams (choose, dial, quarantine, account, the access log), each accepted connection
//!   handed to the engine, the query interface routed by path.
//! - [`sessions`]: HTTP session affinity: the `TOTVS_BROKER_SH_001` cookie (signed, so only
//!   the broker's own count; read from the `Cookie` header as bytes), its secrets, and the
//!   table of live sessions (expiry, cap, counts per server), pure logic.
//! - [`http`]: the HTTP broker's engine (a reverse proxy over hyper, generic over the
//!   balancer it serves), and the HTTP monitor check.
//! - [`tls`]: rustls acceptors and connectors, certificate loading and its diagnosis (the
//!   configuration doctor), handshake failures in words; the balancers load it, clients
//!   accept with it, the dialer connects with it.
//! - [`resolve`]: server names to addresses: cached, one lookup per name, a bound on lookups
//!   in flight; a destination that is the broker itself refused.
//! - [`self_loop`]: whether a server's address is the broker's own (a loop), for the
//!   configuration's checks and every connect.
//! - [`places`]: query places (`QUERY_MAX_CONNECTIONS`), given up by idle connections.
//! - [`workers`]: the data path's threads, one per core, each with its own runtime and
//!   listening sockets.
//! - [`shutdown`]: the shutdown state, and the binary's signal handlers.
//! - [`logging`]: the log line format, console and rotated file.
//! - [`os_error`]: what an OS error means to an operator.
//! - [`demo`]: stand-in servers for `appbroker demo` (echo servers, and web servers whose
//!   page shows session affinity), its console and directory, and its line client.
//! - [`clock`], [`throttle`], [`sys`]: time, log-rate limiting, the few system calls the
//!   standard library lacks.
//! - `supervisor`: `--supervise`: a parent that holds every listener and restarts the broker
//!   it runs as a child on them; the child's side (take the listeners, say READY).
//! - `inherit`: descriptors handed over by a supervisor or systemd, taken by number: the one
//!   module allowed `unsafe` (Unix only).

// A closed standard output or error must not panic the broker: no print macros.
#![deny(clippy::print_stdout, clippy::print_stderr)]
// Functions short enough to read at once (clippy's default bound, 100 lines).
#![warn(clippy::too_many_lines)]

pub mod admin;
pub mod balancer;
pub mod broker;
pub mod config;
pub mod demo;
pub mod http;
pub mod http_balancer;
pub mod net;
pub mod process;
pub mod query;
#[cfg(unix)]
pub mod supervisor;
pub mod tcp;
pub mod tls;

pub use balancer::events::{Event, Subscription};
pub use broker::{Bound, Broker, Control, ReloadError, StartError};
pub use net::listener::BindError;
