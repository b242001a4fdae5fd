//! Quarantine through the real broker: passive failover, the monitor's rounds and log lines,
//! release by time, by the monitor and by a client, all servers down. (Connects that time out:
//! tests/faults.rs.)

// The helpers below are not #[test] functions, so clippy's allowance for tests misses them;
// a panic in them is a failed assertion, as in tests/common.
#![allow(clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tokio::net::TcpStream;

/// One log line split as operators read it: `YYYY-MM-DD HH:MM:SS.mmm LEVEL message fields...`.
#[derive(Debug, Clone)]
struct Line {
    level: String,
    /// The message and the fields after it.
    text: String,
}

impl Line {
    /// Splits `raw`, or `None` when it does not start with the timestamp and a level.
    fn parse(raw: &str) -> Option<Line> {
        let (stamp, rest) = (raw.get(..23)?, raw.get(23..)?);
        let shape_ok = stamp
            .bytes()
            .zip("dddd-dd-dd dd:dd:dd.ddd".bytes())
            .all(|(c, p)| {
                if p == b'd' {
                    c.is_ascii_digit()
                } else {
                    c == p
                }
            });
        let rest = rest.strip_prefix(' ')?;
        let (level, text) = rest.split_once(' ')?;
        let levels = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];
        if !shape_ok || !levels.contains(&level) {
            return None;
        }
        // The level is padded to five characters ("INFO  message").
        let text = text.trim_start_matches(' ');
        Some(Line {
            level: level.to_string(),
            text: text.to_string(),
        })
    }

    /// True when the message is exactly `message`, followed only by the event's fields.
    fn message_is(&self, message: &str) -> bool {
        self.text
            .strip_prefix(message)
            .is_some_and(|tail| tail.is_empty() || tail.starts_with(' '))
    }
}

/// Every line logged so far, each of which must have the operator's format.
fn lines(broker: &Broker) -> Vec<Line> {
    broker
        .logs()
        .iter()
        .map(|raw| {
            Line::parse(raw).unwrap_or_else(|| {
                panic!(
                    "line without `date time LEVEL message`: {raw:?}\n{}",
                    broker.log_text()
                )
            })
        })
        .collect()
}

/// Waits until a line satisfies `wanted`; returns it.
async fn wait_for_line(broker: &Broker, what: &str, wanted: impl Fn(&Line) -> bool) -> Line {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(line) = lines(broker).into_iter().find(&wanted) {
            return line;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}; log:\n{}",
            broker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for a line whose message is exactly `message`.
async fn wait_for_message(broker: &Broker, message: &str) -> Line {
    wait_for_line(broker, &format!("the message {message:?}"), |l| {
        l.message_is(message)
    })
    .await
}

/// A `putting server ... in quarantine` line: its start and stop epochs and its reason.
#[derive(Debug, PartialEq, Eq)]
struct Quarantined {
    start: u64,
    stop: u64,
    reason: String,
}

/// Parses `putting server <address> in quarantine start=<s> stop=<t> (<reason>)`.
fn quarantined(line: &Line, address: &str) -> Option<Quarantined> {
    let rest = line
        .text
        .strip_prefix(&format!("putting server {address} in quarantine start="))?;
    let (start, rest) = rest.split_once(" stop=")?;
    let (stop, rest) = rest.split_once(" (")?;
    let (reason, tail) = rest.split_once(')')?;
    if !(tail.is_empty() || tail.starts_with(' ')) {
        return None;
    }
    Some(Quarantined {
        start: start.parse().ok()?,
        stop: stop.parse().ok()?,
        reason: reason.to_string(),
    })
}

/// Every quarantine logged for `address`, in order.
fn quarantines(broker: &Broker, address: &str) -> Vec<Quarantined> {
    lines(broker)
        .iter()
        .filter_map(|l| quarantined(l, address))
        .collect()
}

/// Waits for a quarantine of `address` for `reason`.
async fn wait_for_quarantine(broker: &Broker, address: &str, reason: &str) -> Quarantined {
    let line = wait_for_line(
        broker,
        &format!("a quarantine of {address} ({reason})"),
        |l| quarantined(l, address).is_some_and(|q| q.reason == reason),
    )
    .await;
    quarantined(&line, address).expect("matched above")
}

/// The ERROR lines naming `address`, as a client's failed connect logs them (monitor checks
/// excluded: they have their own line).
fn connect_errors(broker: &Broker, address: &str) -> Vec<Line> {
    let named = format!("server {address}");
    lines(broker)
        .into_iter()
        .filter(|l| {
            l.level == "ERROR"
                && l.text.contains(&named)
                && !l.text.contains("failed the monitor check")
        })
        .collect()
}

/// Waits until the broker has logged the end of `clients` connections in all. A client's
/// lines (failed connects, quarantines) are written before its end line on the same output,
/// so afterwards every line those clients caused is in: counting lines, or asserting one is
/// absent, is then safe from the lag of the log pipe.
async fn wait_for_clients_logged(broker: &Broker, clients: usize) {
    let what = format!("{clients} `connection closed` lines");
    eventually(&what, || {
        lines(broker)
            .iter()
            .filter(|l| l.text.starts_with("connection closed"))
            .count()
            >= clients
    })
    .await;
}

/// Asks through the broker `count` times in a row; every client must be answered.
async fn ask_many(broker: &Broker, count: usize) -> Vec<String> {
    let mut answers = Vec::with_capacity(count);
    for i in 0..count {
        match ask(broker.addr()).await {
            Ok(name) => answers.push(name),
            Err(e) => panic!(
                "client {i} got an error: {e}; answers so far {answers:?}; log:\n{}",
                broker.log_text()
            ),
        }
    }
    answers
}

/// Servers a and b behind a broker whose monitor checks them every `interval` (quarantine
/// 120 s), once its first round has found both available.
async fn monitored_pair(interval: &str) -> (TestServer, TestServer, Broker) {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        &format!("MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL={interval}\nQUARANTINE_TIME=120"),
    );
    let broker = Broker::start(&ini).await;
    wait_for_message(
        &broker,
        "monitor: OK - 2 servers available, 0 servers unavailable",
    )
    .await;
    (a, b, broker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dying_between_monitor_rounds_costs_clients_nothing() {
    // A round at start, then none for a minute: only clients can find b dead.
    let (a, mut b, broker) = monitored_pair("60").await;
    b.stop().await;

    let answers = ask_many(&broker, 20).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    wait_for_clients_logged(&broker, 20).await;

    let q = quarantines(&broker, &b.address());
    assert_eq!(
        q.len(),
        1,
        "one quarantine for b; log:\n{}",
        broker.log_text()
    );
    assert_eq!(q[0].reason, "connect");
    assert_eq!(
        q[0].stop - q[0].start,
        120,
        "stop - start is QUARANTINE_TIME"
    );

    let errors = connect_errors(&broker, &b.address());
    assert_eq!(errors.len(), 1, "one failed connect: {errors:?}");
    for needed in [
        "connection refused",
        "ECONNREFUSED",
        "Windows 10061/1225",
        "configuration/operation",
    ] {
        assert!(errors[0].text.contains(needed), "{needed:?} in {errors:?}");
    }
    assert!(
        quarantines(&broker, &a.address()).is_empty(),
        "a was never blamed; log:\n{}",
        broker.log_text()
    );

    // b is back, but its quarantine runs for two minutes and no monitor round comes to end
    // it: it must get no new client.
    b.resume().await;
    let before = b.accepted();
    let answers = ask_many(&broker, 10).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    assert_eq!(b.accepted(), before, "a quarantined server got clients");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_quarantines_a_stopped_server_and_releases_it_when_it_returns() {
    let (_a, mut b, broker) = monitored_pair("200ms").await;
    b.stop().await;

    let q = wait_for_quarantine(&broker, &b.address(), "monitor").await;
    assert_eq!(q.stop - q.start, 120, "stop - start is QUARANTINE_TIME");
    let summary = wait_for_message(
        &broker,
        "monitor: OK - 1 server available, 1 server unavailable",
    )
    .await;
    assert_eq!(summary.level, "INFO");
    wait_for_message(
        &broker,
        &format!("monitor: server {} unavailable", b.address()),
    )
    .await;

    // Quarantined, b is not tried by clients at all: no failed connect, no client error.
    let answers = ask_many(&broker, 6).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    wait_for_clients_logged(&broker, 6).await;
    assert!(
        connect_errors(&broker, &b.address()).is_empty(),
        "a client was sent to the quarantined server; log:\n{}",
        broker.log_text()
    );

    b.resume().await;
    wait_for_message(
        &broker,
        &format!(
            "releasing server {} from quarantine (monitor check passed)",
            b.address()
        ),
    )
    .await;
    let answers = ask_many(&broker, 6).await;
    assert!(answers.iter().any(|n| n == "b"), "{answers:?}");
}

/// The lines of `address`'s quarantines, as logged.
fn quarantine_lines(broker: &Broker, address: &str) -> Vec<Line> {
    lines(broker)
        .into_iter()
        .filter(|l| quarantined(l, address).is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_s_cause_is_logged_once_per_quarantine_and_each_round_keeps_the_totvs_lines()
{
    let (_a, mut b, broker) = monitored_pair("200ms").await;
    let failed = format!("server {} failed the monitor check: ", b.address());
    let unavailable = format!("monitor: server {} unavailable", b.address());

    for episode in 1..=2 {
        b.stop().await;
        // Four rounds of the same quarantine: each one's TOTVS lines, the cause only once.
        eventually("four rounds with b in quarantine", || {
            quarantine_lines(&broker, &b.address()).len() >= 4 * episode
        })
        .await;
        let all = lines(&broker);
        let causes: Vec<&Line> = all.iter().filter(|l| l.text.starts_with(&failed)).collect();
        assert_eq!(
            causes.len(),
            episode,
            "the cause once per quarantine; log:\n{}",
            broker.log_text()
        );
        assert_eq!(causes[episode - 1].level, "ERROR");
        assert!(causes[episode - 1].text.contains("connection refused"));
        assert!(
            all.iter().filter(|l| l.message_is(&unavailable)).count() >= 4 * episode - 1,
            "`monitor: server ... unavailable` every round; log:\n{}",
            broker.log_text()
        );

        // Each quarantine line: the TOTVS part as it always was, then the end in local time.
        for line in quarantine_lines(&broker, &b.address()) {
            let q = quarantined(&line, &b.address()).expect("a quarantine line");
            let stop = chrono::DateTime::from_timestamp(q.stop as i64, 0)
                .expect("stop= is a time")
                .with_timezone(&chrono::Local);
            let expected = format!(
                "putting server {} in quarantine start={} stop={} (monitor) until={}",
                b.address(),
                q.start,
                q.stop,
                stop.format("%H:%M:%S")
            );
            assert!(line.message_is(&expected), "{line:?}, expected {expected}");
            assert_eq!(line.level, "WARN");
        }

        // Back, released; the next time it dies is a new quarantine, whose cause is logged.
        b.resume().await;
        let released = format!(
            "releasing server {} from quarantine (monitor check passed)",
            b.address()
        );
        eventually("b released", || broker.count_logs(&released) == episode).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_raises_the_alarm_when_no_server_answers() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms",
    );
    let broker = Broker::start(&ini).await;
    wait_for_message(
        &broker,
        "monitor: OK - 2 servers available, 0 servers unavailable",
    )
    .await;
    assert!(!broker.has_log("there are no remote servers available"));
    a.stop().await;
    b.stop().await;

    let summary = wait_for_message(
        &broker,
        "monitor: OK - 0 servers available, 2 servers unavailable",
    )
    .await;
    assert_eq!(summary.level, "INFO");
    let alarm = wait_for_message(
        &broker,
        "monitor: attention, there are no remote servers available",
    )
    .await;
    assert_eq!(alarm.level, "ERROR");
    for server in [&a, &b] {
        wait_for_message(
            &broker,
            &format!("monitor: server {} unavailable", server.address()),
        )
        .await;
        wait_for_quarantine(&broker, &server.address(), "monitor").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_ends_when_its_time_is_up_without_a_monitor() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=300ms")).await;
    b.stop().await;

    // Clients until one meets b dead (CONNECTION alternates, so the first or second does).
    for _ in 0..10 {
        assert_eq!(ask(broker.addr()).await.expect("client served"), "a");
        if !quarantines(&broker, &b.address()).is_empty() {
            break;
        }
    }
    wait_for_quarantine(&broker, &b.address(), "connect").await;
    b.resume().await;

    // Once b is back no client can quarantine it again, so waiting for as many time-up
    // releases as quarantines leaves it free (a slow machine may have let a client meet it
    // dead twice before the resume).
    let released = format!(
        "releasing server {} from quarantine (quarantine time is up)",
        b.address()
    );
    wait_for_message(&broker, &released).await;
    eventually("a time-up release for every quarantine of b", || {
        lines(&broker)
            .iter()
            .filter(|l| l.message_is(&released))
            .count()
            >= quarantines(&broker, &b.address()).len()
    })
    .await;
    assert!(
        !broker.has_log("monitor:"),
        "monitoring is disabled, no round may run; log:\n{}",
        broker.log_text()
    );
    let answers = ask_many(&broker, 6).await;
    assert!(answers.iter().any(|n| n == "b"), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_closed_at_once_when_every_server_is_down() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "")).await;
    a.stop().await;
    b.stop().await;

    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(client).await, "the client was not closed");
    let line = wait_for_line(&broker, "no remote servers available", |l| {
        l.text.starts_with("no remote servers available")
    })
    .await;
    assert_eq!(line.level, "ERROR");
    for server in [&a, &b] {
        wait_for_quarantine(&broker, &server.address(), "connect").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_quarantine_is_released_by_the_client_that_reaches_the_server() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    // Monitoring disabled and a long quarantine: only a client's attempt can end it.
    let broker = Broker::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=120")).await;
    a.stop().await;
    b.stop().await;
    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(client).await, "the client was not closed");
    wait_for_quarantine(&broker, &a.address(), "connect").await;
    wait_for_quarantine(&broker, &b.address(), "connect").await;

    a.resume().await;
    assert_eq!(ask(broker.addr()).await.expect("client served"), "a");
    wait_for_message(
        &broker,
        &format!(
            "releasing server {} from quarantine (a client connected to it)",
            a.address()
        ),
    )
    .await;
    // Released, a is an ordinary candidate again; b stays quarantined.
    let answers = ask_many(&broker, 4).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    wait_for_clients_logged(&broker, 5).await;
    assert!(
        !broker.has_log(&format!("releasing server {}", b.address())),
        "b never answered; log:\n{}",
        broker.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_limits_the_servers_tried_for_one_client() {
    let mut servers = Vec::new();
    for name in ["a", "b", "c"] {
        let mut server = TestServer::start(name).await;
        server.stop().await;
        servers.push(server);
    }
    let refs: Vec<&TestServer> = servers.iter().collect();
    let broker = Broker::start(&ini_for(&refs, "MAX_ATTEMPTS=2")).await;

    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(client).await, "the client was not closed");
    // Logged after the client's last attempt, so every attempt's line is in by then.
    wait_for_line(&broker, "no remote servers available", |l| {
        l.text.starts_with("no remote servers available")
    })
    .await;
    let tried: Vec<&TestServer> = servers
        .iter()
        .filter(|s| !connect_errors(&broker, &s.address()).is_empty())
        .collect();
    assert_eq!(
        tried.len(),
        2,
        "MAX_ATTEMPTS=2 but {} servers tried; log:\n{}",
        tried.len(),
        broker.log_text()
    );
    let quarantined = servers
        .iter()
        .filter(|s| !quarantines(&broker, &s.address()).is_empty())
        .count();
    assert_eq!(quarantined, 2, "log:\n{}", broker.log_text());
}

/// Descriptors the process `pid` holds now.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .expect("list /proc/PID/fd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_the_broker_itself_is_refused_never_looped() {
    // `localhost` on the broker's own port, the only server: no address in the file, so
    // --check cannot see it; it resolves to a loopback address, which the wildcard listener
    // (`::`, IPv4 too) answers. Each client would be sent back into the broker, again and
    // again, until every descriptor is used.
    let ini = "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=::\n\
               LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\nQUERY_ALLOW=127.0.0.1\n\
               REMOTE_SERVER_01=localhost @PORT@\n";
    let broker = Broker::start(ini).await;
    let own = format!("localhost:{}", broker.ports[0]);
    let before = descriptors(broker.pid());
    // The most descriptors the broker holds while the clients come and go, sampled apart.
    let (stop, most) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let sampler = {
        let (stop, most, pid) = (Arc::clone(&stop), Arc::clone(&most), broker.pid());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(descriptors(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    for _ in 0..5 {
        let mut client = TcpStream::connect(broker.addr()).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(&mut client, b"hello\n")
            .await
            .expect("send");
        let closed = closed_at_once(client).await;
        assert!(
            most.load(Ordering::Relaxed) <= before + 20,
            "the broker went from {before} to {} descriptors",
            most.load(Ordering::Relaxed)
        );
        assert!(closed, "no server for the client");
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    // Nothing runs away: the clients have left, and so have their descriptors.
    eventually("the descriptors given back", || {
        descriptors(broker.pid()) <= before + 4
    })
    .await;
    let line = broker
        .wait_for_log("is this broker's own listening address")
        .await;
    assert!(line.contains(&own), "{line}");
    broker
        .wait_for_log(&format!("putting server {own} in quarantine"))
        .await;
    let ping = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[]).await;
    assert_eq!(ping.status, 200);
    let status = query_json(broker.addr()).await;
    let server = server_json(&status, &own).expect("listed");
    assert_eq!(server["inquarantine"], true, "{server}");
    assert!(
        server["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("own listening address")),
        "{server}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_server_that_is_the_broker_itself_go_to_the_others() {
    let b = TestServer::start("b").await;
    // The first client is sent to the broker itself (ROUND_ROBIN, configuration order).
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nSORT_METHOD=ROUND_ROBIN\nMONITORING_TYPE=DISABLED\n\
         REMOTE_SERVER_01=localhost @PORT@\nREMOTE_SERVER_02={}\n",
        b.ini()
    );
    let broker = Broker::start(&ini).await;
    for _ in 0..10 {
        assert_eq!(ask(broker.addr()).await.expect("answered"), "b");
    }
    let line = broker
        .wait_for_log("cannot connect to server localhost")
        .await;
    assert!(line.contains("own listening address"), "{line}");
    assert!(line.contains("points at configuration"), "{line}");
    assert_eq!(b.accepted(), 10, "each client reached b once, directly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_finds_a_server_that_is_the_broker_itself() {
    let b = TestServer::start("b").await;
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms\n\
         REMOTE_SERVER_01=localhost @PORT@\nREMOTE_SERVER_02={}\n",
        b.ini()
    );
    let broker = Broker::start(&ini).await;
    let before = descriptors(broker.pid());
    broker.wait_for_logs("monitor: OK", 5).await;
    let line = broker.wait_for_log("failed the monitor check").await;
    assert!(line.contains("own listening address"), "{line}");
    assert!(descriptors(broker.pid()) <= before + 4);
    assert_eq!(ask(broker.addr()).await.expect("answered"), "b");
}
