//! The integration-test harness, one crate every `tests/*.rs` uses. Brokers run in this
//! process ([`InProcess`]: the library's entry point, asserted on through its events and
//! state) or as the real binary ([`Broker`]: for the command line, signals and the log
//! format); loopback servers can be stopped and started again on the same port
//! ([`TestServer`]) or told to misbehave ([`FaultServer`]); HTTP origins record what reached
//! them ([`Origin`], and [`Scripted`] byte for byte), and the HTTP engine runs alone over a
//! balancer of the tests' own ([`LoopbackEngine`]). Everything binds port 0 (a broker's port is
//! found the same way) and waits by polling for a condition with a deadline, never by sleeping.
//!
//! A crate rather than a module each test includes: every test is a crate of its own, and a
//! module included by many would be partly unused in each, where the compiler warns; here
//! every item is public, the compiler builds it once, and each test names what it uses.
//!
//! - `lib.rs`: the deadline, waiting for a condition (plain or awaited: [`eventually`],
//!   [`until`]), free ports.
//! - `ini.rs`: the `appserver.ini` files tests write, and the session cookies they sign.
//! - `inproc.rs`: a broker in this process and the events it publishes.
//! - `process.rs`: the binary as a child process, installed copies of it, process trees.
//! - `servers.rs`: echo servers that stop and resume, and the clients that ask them.
//! - `faults.rs`: servers that misbehave on command, byte patterns, client-side checks.
//! - `raw_client.rs`: the one hand-written HTTP/1.1 client, raw bytes out, answers by their
//!   framing (`HttpConnection` is it too).
//! - `query_client.rs`: the query interface's answers, JSON and places, over that client.
//! - `origin.rs`: hyper origin servers that record requests, and raw ones.
//! - `pattern.rs`: bodies of a known pattern, checked as they stream.
//! - `http_client.rs`: hyper clients and raw exchanges towards an HTTP balancer.
//! - `engine.rs`: the HTTP engine alone on a loopback port, over a recording balancer.
//! - `scripted.rs`: a raw HTTP/1.1 server, byte for byte.
//! - `chromium.rs`: headless Chromium, once or driven over DevTools.
//! - `addresses.rs`: an address of this host off loopback, for a peer that is not local.
//! - `webhook.rs`: a webhook receiver for the broker's alerts, plain or TLS, that records
//!   each POST and answers as told (or hangs).

// Functions short enough to read at once, as in the broker (70 lines: clippy.toml).
#![warn(clippy::too_many_lines)]

mod addresses;
mod chromium;
mod engine;
mod faults;
mod http_client;
mod ini;
mod inproc;
mod origin;
mod pattern;
mod process;
mod query_client;
mod raw_client;
mod scripted;
mod servers;
mod webhook;

use std::time::{Duration, Instant};

pub use addresses::*;
pub use chromium::*;
pub use engine::*;
pub use faults::*;
pub use http_client::*;
pub use ini::*;
pub use inproc::*;
pub use origin::*;
pub use pattern::*;
pub use process::*;
pub use query_client::*;
pub use raw_client::*;
pub use scripted::*;
pub use servers::*;
pub use webhook::*;

/// How long any wait in a test may take before the test fails. Generous: it only bounds a
/// failing test, a passing one returns as soon as its condition holds.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `condition` until it holds or [`DEADLINE`] passes.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut condition: F) {
    // Not over `until`: a spawned task may wait with this, and a task cannot hold an async
    // closure (the compiler cannot prove its future `Send` for every borrow).
    let end = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// How often [`eventually`], [`until`] and [`eventually_async`] look again: often enough
/// that a test waits little past its condition, seldom enough to leave the broker the CPU.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// Awaits `condition` every [`POLL_EVERY`] until it holds or [`DEADLINE`] passes: the
/// [`eventually`] of a condition that must await (a query, a connection).
pub async fn eventually_async(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    until(
        what,
        async || if condition().await { Ok(()) } else { Err("") },
    )
    .await
}

/// Awaits `probe` every [`POLL_EVERY`] until it gives `Ok` (returned), failing the test after
/// [`DEADLINE`] with `what` and the last `Err`: what was seen instead (a log, a JSON answer),
/// so the failure says where the wait stood. Not in a spawned task: the compiler cannot prove
/// an async closure's future `Send` for every borrow, so a task waits with a loop of its own.
pub async fn until<T, E: std::fmt::Display>(
    what: &str,
    probe: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    poll(what, POLL_EVERY, DEADLINE, probe).await
}

/// [`until`] with its own pace and deadline: `every` between two tries (a probe that sends a
/// client paces the load with it; zero only yields to the runtime) and `deadline` in all.
pub async fn poll<T, E: std::fmt::Display>(
    what: &str,
    every: Duration,
    deadline: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        let seen = match probe().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for: {what}\n{seen}"
        );
        if every.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(every).await;
        }
    }
}

/// Awaits `future`, failing the test if it takes longer than [`DEADLINE`].
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// `name` on the PATH or in the sbin folders (Debian puts haproxy in /usr/sbin, off a user's
/// PATH), or `None` (the test then fails under `CI` and is skipped elsewhere).
pub fn find_program(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = ["/usr/local/sbin", "/usr/sbin"].map(std::path::PathBuf::from);
    let found = std::env::split_paths(&path)
        .chain(sbin)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed (.ci/run installs it)"
        );
        eprintln!("{name} is not installed: skipped");
    }
    found
}

/// A port that was free a moment ago (bound to port 0, then released). A broker's port must
/// be written in its file, so it cannot take port 0 itself; the harnesses retry with other
/// ports in the rare case something took this one in between.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// Two free ports, for `@PORT@` and `@PORT2@`.
pub fn free_ports() -> Vec<u16> {
    vec![free_port(), free_port()]
}
