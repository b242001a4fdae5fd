//! Servers given by name with a resolver that hangs, through the real broker: the broker runs
//! in a mount namespace whose `/etc/resolv.conf` names a DNS server on loopback that never
//! answers (a UDP socket this test holds and never reads), so every lookup waits for the
//! resolver's own 30 s timeout, as with a DNS server gone silent. The broker's threads and
//! descriptors must stay bounded however many clients arrive, clients must go to the servers
//! it can reach, and no server is blamed for lookups that were never made.
//!
//! Needs root (a mount namespace and port 53): `cargo test --test resolver -- --ignored`,
//! which `.ci/run` does. The logic is also covered without root by `resolve::tests` and
//! `forward::tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::net::UdpSocket;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use harness::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A DNS server that receives queries and never answers, on a loopback address of its own
/// (`127.0.0.<n>`), port 53: resolv.conf cannot name another port.
fn silent_dns(n: u8) -> UdpSocket {
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata("/proc/self").map(|m| m.uid()).ok(),
        Some(0),
        "this test needs root (a mount namespace and port 53); run it as root, as .ci/run does"
    );
    UdpSocket::bind(("127.0.0.".to_string() + &n.to_string(), 53))
        .expect("bind the silent DNS server on port 53")
}

/// Starts the broker on `ini` in a mount namespace where `/etc/resolv.conf` names the silent
/// DNS server `127.0.0.<dns>`, and waits for `broker ready`.
async fn start_with_silent_dns(ini: &str, dns: u8) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver 127.0.0.{dns}\noptions timeout:30 attempts:1\n"),
    )
    .unwrap();
    let port = free_port();
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(&config_path, ini.replace("@PORT@", &port.to_string())).unwrap();
    let mut command = Command::new("unshare");
    command.arg("-m").arg("sh").arg("-c").arg(format!(
        "mount --bind '{}' /etc/resolv.conf && exec '{}' --config '{}'",
        resolv.display(),
        binary(),
        config_path.display()
    ));
    let broker = Broker::spawn_command(dir, config_path, vec![port, 0], command);
    broker.wait_for_log("broker ready").await;
    broker
}

/// A value of `/proc/<pid>/status` (`Threads`, ...).
fn status_value(pid: u32, key: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{key}:")))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Descriptors the process `pid` holds now.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Samples the broker's threads and descriptors every few milliseconds until dropped; keeps
/// the most of each.
struct Sampler {
    stop: Arc<AtomicBool>,
    threads: Arc<AtomicUsize>,
    descriptors: Arc<AtomicUsize>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let sampler = Sampler {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Arc::new(AtomicUsize::new(0)),
            descriptors: Arc::new(AtomicUsize::new(0)),
        };
        let (stop, threads, fds) = (
            Arc::clone(&sampler.stop),
            Arc::clone(&sampler.threads),
            Arc::clone(&sampler.descriptors),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                threads.fetch_max(status_value(pid, "Threads"), Ordering::Relaxed);
                fds.fetch_max(descriptors(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        sampler
    }

    fn most(&self) -> (usize, usize) {
        (
            self.threads.load(Ordering::Relaxed),
            self.descriptors.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a mount namespace and port 53"]
async fn a_hung_resolver_costs_one_lookup_per_name_however_many_clients_come() {
    let _dns = silent_dns(77);
    // The one server is given by a name nobody answers for: every client tries it (a
    // quarantine may be stale when every server is in one), each for CONNECT_TIMEOUT.
    let broker = start_with_silent_dns(
        "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nCONNECT_TIMEOUT=100ms\nQUERY_ALLOW=127.0.0.1\n\
         REMOTE_SERVER_01=app.hung.test 6001\n",
        77,
    )
    .await;
    let pid = broker.pid();
    let (threads_before, fds_before) = (status_value(pid, "Threads"), descriptors(pid));
    let sampler = Sampler::start(pid);
    // 300 clients, 50 at a time: each is closed once its one server could not be reached.
    for _ in 0..6 {
        let clients: Vec<_> = (0..50)
            .map(|_| {
                let addr = broker.addr();
                tokio::spawn(async move {
                    let mut client = TcpStream::connect(addr).await.unwrap();
                    client.write_all(b"hello\n").await.unwrap();
                    closed_at_once(client).await
                })
            })
            .collect();
        for client in clients {
            assert!(client.await.unwrap(), "a client was not closed in time");
        }
    }
    let (threads, fds) = sampler.most();
    assert!(
        threads <= threads_before + 4,
        "threads went from {threads_before} to {threads}"
    );
    assert!(
        fds <= fds_before + 120,
        "descriptors went from {fds_before} to {fds}"
    );
    // The resolver says it once (each client's failed connect has its own line until the
    // server is quarantined).
    let slow = "servers given as app.hung.test are not reached until it resolves";
    let line = broker.wait_for_log(slow).await;
    assert!(
        line.contains("resolving app.hung.test took longer than 100ms"),
        "{line}"
    );
    assert_eq!(broker.count_logs(slow), 1, "{}", broker.log_text());
    assert_eq!(
        http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[])
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a mount namespace and port 53"]
async fn past_dns_max_lookups_clients_go_to_other_servers_and_none_is_blamed() {
    let _dns = silent_dns(78);
    let b = TestServer::start("b").await;
    // Twelve servers given by names nobody answers for, then one by address; at most four
    // lookups in flight.
    let mut ini = String::from(
        "[General]\nDNS_MAX_LOOKUPS=4\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\nCONNECT_TIMEOUT=100ms\n\
         QUARANTINE_TIME=60s\nSORT_METHOD=ROUND_ROBIN\nMAX_ATTEMPTS=13\nQUERY_ALLOW=127.0.0.1\n",
    );
    for i in 1..=12 {
        ini.push_str(&format!("REMOTE_SERVER_{i:02}=app{i}.hung.test 6001\n"));
    }
    ini.push_str(&format!("REMOTE_SERVER_13={}\n", b.ini()));
    let broker = start_with_silent_dns(&ini, 78).await;
    let pid = broker.pid();
    let threads_before = status_value(pid, "Threads");
    let sampler = Sampler::start(pid);
    for _ in 0..40 {
        assert_eq!(ask(broker.addr()).await.unwrap(), "b");
    }
    let (threads, _) = sampler.most();
    assert!(
        threads <= threads_before + 4 + 2,
        "threads went from {threads_before} to {threads} with DNS_MAX_LOOKUPS=4"
    );
    let busy = "DNS_MAX_LOOKUPS (4) name lookups in flight";
    broker.wait_for_log(busy).await;
    assert_eq!(broker.count_logs(busy), 1, "{}", broker.log_text());
    // Only the servers whose lookup was made and timed out are in quarantine.
    let status = query_json(broker.addr()).await;
    let quarantined = status["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["inquarantine"] == true)
        .count();
    assert_eq!(quarantined, 4, "{status:#}");
}
