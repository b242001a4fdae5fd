//! appbroker: a load-balancing broker for application-server fleets (TOTVS Protheus
//! AppServer is the model). It reads an `appserver.ini`, listens on each `[BALANCE_*]` port,
//! relays every client (proxies every request, on a `[BALANCE_HTTP*]` balancer) to a chosen
//! server, and keeps failed servers in quarantine.
//!
//! # Layout
//!
//! This is the module map, the one place it is written: a line for each top-level module
//! here, a line for each file in its folder's `mod.rs` (`tests/module_graph.rs` fails when a
//! module is missing from its map, or listed and gone). Data flows one way: accept -> sniff
//! -> select -> dial (quarantine the failures, try the next) -> relay -> account; the monitor
//! and the query interface read the balancer's state. The imports follow, in layers: a module
//! imports only modules of lower layers (the table in `tests/module_graph.rs`; the reasons in
//! docs/architecture.md, "Layout"). From the top layer down:
//!
//! - [`admin`]: runtime administration: the control socket (JSON lines), `appbroker ctl` and
//!   `ping`, the state file that keeps overrides over a restart, the session secret's file.
//! - [`demo`]: `appbroker demo`: stand-in servers (echo servers, and web servers whose page
//!   shows session affinity), its console, and its line client.
//! - `supervisor` (Unix): `--supervise`: a parent that holds every listener and restarts the
//!   broker it runs as a child on them; its control socket, the upgrade; the child's side.
//! - [`broker`]: the broker as a library: bind (or take listeners bound elsewhere), start,
//!   subscribe to its events, read a balancer's state, reload (with its result), drain, stop;
//!   each running balancer's accept loops and monitor, and the hand-off of each accepted
//!   connection to its path by the balancer's kind.
//! - [`alerts`]: alerts by webhook and command, and restarts of AppServers stuck in
//!   quarantine: fed by the balancers' low-rate queue of alerts, bounded at every step, on no
//!   connection's path.
//! - [`tcp`]: a TCP balancer's connections: one accepted connection as a struct whose methods
//!   are its way (sniff, place, choose and dial, relay, account).
//! - [`http_balancer`]: an HTTP balancer at run time: the balancer as the HTTP engine's
//!   upstreams (choose, dial, quarantine, account, the access log), session affinity, the
//!   query interface routed by path.
//! - [`query`]: `/TOTVS_BROKER_QUERY` on the balancers' ports: answering queries (served by
//!   the HTTP engine on both kinds of port, with limits of their own), and pure renderers of
//!   a snapshot (STATUS, CFG, JSON, METRICS).
//! - [`http`]: the HTTP engine (a reverse proxy of its own, generic over the upstreams it
//!   serves, knowing nothing of balancers), its pure HTTP/1 core.
//! - [`balancer`]: a balancer's live state (servers, counters, leases; one method per event;
//!   its state read at one instant) and its pure rules: quarantine, overrides, policies, query
//!   places; the events it publishes; the shared state connections read it from.
//! - [`net`]: sockets: bind and accept, an accepted connection's TLS step, resolve and dial
//!   (the connector both paths connect through, its outcomes reported), relay and splice, the
//!   worker threads, the system calls the standard library lacks, inherited descriptors.
//! - [`support`]: what the whole process shares: its clocks, its log and the log's manners
//!   (once per episode, OS errors in words), its shutdown state and signals, and the one module
//!   allowed `unsafe`.
//! - [`config`]: `appserver.ini` to a validated [`config::Config`] through one table of keys
//!   ([`config::keys`]); every error names file, line, section and key; `--check` prints it
//!   back.
//! - [`tls`]: rustls acceptors and connectors, certificate loading and its diagnosis (the
//!   configuration doctor), handshake failures in words.

// A closed standard output or error must not panic the broker: no print macros.
#![deny(clippy::print_stdout, clippy::print_stderr)]
// Functions short enough to read at once (70 lines: clippy.toml).
#![warn(clippy::too_many_lines)]
// The crate's documentation is its maintainers' (`cargo doc --document-private-items`, as
// .ci/run builds it): a public item's docs may name the private constant or step behind it.
#![allow(rustdoc::private_intra_doc_links)]

pub mod admin;
pub mod alerts;
pub mod balancer;
pub mod broker;
pub mod config;
pub mod demo;
pub mod http;
pub mod http_balancer;
pub mod net;
pub mod query;
#[cfg(unix)]
pub mod supervisor;
pub mod support;
pub mod tcp;
pub mod tls;

pub use balancer::events::{Event, Subscription};
pub use broker::{Bound, Broker, Control, ReloadError, StartError};
pub use net::listener::BindError;
