//! The integration-test harness. Brokers run in this process ([`InProcess`]: the library's
//! entry point, asserted on through its events and state) or as the real binary
//! ([`Broker`]: for the command line, signals and the log format); loopback servers can be
//! stopped and started again on the same port ([`TestServer`]) or told to misbehave
//! ([`FaultServer`]). Everything binds port 0 (a broker's port is found the same way) and
//! waits by polling for a condition with a deadline, never by sleeping.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

pub mod chromium;
pub mod faults;
pub mod http;
pub mod inproc;
pub mod process;
pub mod servers;

use std::path::Path;
use std::time::{Duration, Instant};

pub use chromium::*;
pub use faults::*;
pub use http::*;
pub use inproc::*;
pub use process::*;
pub use servers::*;

/// How long any wait in a test may take before the test fails. Generous: it only bounds a
/// failing test, a passing one returns as soon as its condition holds.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `condition` until it holds or [`DEADLINE`] passes.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut condition: F) {
    let end = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Awaits `future`, failing the test if it takes longer than [`DEADLINE`].
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
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

/// `ini` with `@PORT@`, `@PORT2@` and `@DIR@` replaced by `ports` and `dir`.
pub fn fill_placeholders(ini: &str, ports: &[u16], dir: &Path) -> String {
    ini.replace("@PORT@", &ports[0].to_string())
        .replace("@PORT2@", &ports[1].to_string())
        .replace("@DIR@", &dir.display().to_string())
}

/// An ini with one `[BALANCE_SMART_CLIENT_DESKTOP]` on `@PORT@` over `servers`, plus `extra`
/// lines in the section. Monitoring is disabled unless `extra` sets it, so tests decide when
/// checks happen.
pub fn ini_for(servers: &[&TestServer], extra: &str) -> String {
    let mut text = String::from(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n",
    );
    if !extra.to_ascii_uppercase().contains("MONITORING_TYPE") {
        text.push_str("MONITORING_TYPE=DISABLED\n");
    }
    text.push_str(extra);
    if !extra.is_empty() && !extra.ends_with('\n') {
        text.push('\n');
    }
    for (i, s) in servers.iter().enumerate() {
        text.push_str(&format!("REMOTE_SERVER_{:02}={}\n", i + 1, s.ini()));
    }
    text
}
