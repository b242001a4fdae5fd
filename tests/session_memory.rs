//! Memory per HTTP session: 100,000 sessions in one balancer's table, the
//! process's resident memory read before and after. Run by hand, alone (it reads the whole
//! process's RSS): `cargo test --release --test session_memory -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use appbroker::config::ServerId;
use appbroker::http_balancer::sessions::{CookieKeys, Limits, Sessions, Ticket};
use tokio::time::Instant;

/// The process's resident set in bytes (`VmRSS` of /proc/self/status).
fn rss() -> u64 {
    harness::status_bytes("self", "VmRSS")
}

#[test]
#[ignore = "a measurement, run by hand"]
fn memory_per_session() {
    const N: usize = 100_000;
    let ids = [
        ServerId::parse("01").unwrap(),
        ServerId::parse("02").unwrap(),
    ];
    // Tickets made before the first reading: what is measured is the table alone.
    let keys = CookieKeys::new(b"the memory measurement's secret", None, None);
    let tickets: Vec<Ticket> = (0..N)
        .map(|i| keys.issue("BALANCE_HTTP", ids[i % 2]))
        .collect();
    // A client each, the most the count per client can cost.
    let clients: Vec<IpAddr> = (0..N as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect();
    let limits = Limits {
        timeout: Duration::from_secs(600),
        max: N,
        per_client: 64,
    };
    let before = rss();
    let mut table = Sessions::new();
    let now = Instant::now();
    for (t, client) in tickets.iter().zip(&clients) {
        table.touch(*t, *client, now, &limits);
    }
    let after = rss();
    assert_eq!(table.len(), N);
    let per = (after - before) as f64 / N as f64;
    println!(
        "{N} sessions: {} KiB more resident, {per:.0} bytes per session",
        (after - before) / 1024
    );
    assert!(
        after - before < 64 << 20,
        "100,000 sessions fit in a few tens of MiB"
    );
}
