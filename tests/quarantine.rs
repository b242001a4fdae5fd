//! Quarantine through a broker in process: passive failover, the monitor's rounds, release by
//! time, by the monitor and by a client, all servers down, MAX_ATTEMPTS, and a server that is
//! the broker itself. Asserted on the broker's events and state; the two tests that count the
//! broker's descriptors run the real binary, a process of its own. (Connects that time out:
//! tests/monitor_checks.rs; how the lines read: tests/log_format.rs.)

// The helpers below are not #[test] functions, so clippy's allowance for tests misses them;
// a panic in them is a failed assertion, as in tests/harness.
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use appbroker::Event;
use appbroker::balancer::Standing;
use appbroker::balancer::events::Unserved;
use appbroker::config::BalancerKind;
use harness::*;
use tokio::net::TcpStream;

/// Asks through the broker `count` times in a row; every client must be answered.
async fn ask_many(broker: &InProcess, count: usize) -> Vec<String> {
    let mut answers = Vec::with_capacity(count);
    for i in 0..count {
        match ask(broker.addr()).await {
            Ok(name) => answers.push(name),
            Err(e) => panic!(
                "client {i} got an error: {e}; answers so far {answers:?}; events:\n{}",
                broker.events.text()
            ),
        }
    }
    answers
}

/// Servers a and b behind a broker whose monitor checks them every `interval` (quarantine
/// 120 s), once its first round has found both available.
async fn monitored_pair(interval: &str) -> (TestServer, TestServer, InProcess) {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        &format!("MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL={interval}\nQUARANTINE_TIME=120"),
    );
    let broker = InProcess::start(&ini).await;
    broker.events.wait_for_round(2, 0).await;
    (a, b, broker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dying_between_monitor_rounds_costs_clients_nothing() {
    // A round at start, then none for a minute: only clients can find b dead.
    let (a, mut b, broker) = monitored_pair("60").await;
    b.stop().await;

    let answers = ask_many(&broker, 20).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    broker.events.wait_for_ended(20).await;

    let events = &broker.events;
    let q = events.quarantines(&b.address());
    assert_eq!(
        q.len(),
        1,
        "one quarantine for b; events:\n{}",
        events.text()
    );
    assert_eq!(q[0].reason, Reason::Connect);
    assert_eq!(
        q[0].stop - q[0].start,
        120,
        "stop - start is QUARANTINE_TIME"
    );

    let errors = events.connect_failures(&b.address());
    assert_eq!(errors.len(), 1, "one failed connect: {errors:?}");
    for needed in [
        "connection refused",
        "ECONNREFUSED",
        "Windows 10061/1225",
        "the cause is on the server's side or in the configuration, not the broker's",
    ] {
        assert!(errors[0].contains(needed), "{needed:?} in {errors:?}");
    }
    assert!(
        events.quarantines(&a.address()).is_empty(),
        "a was never blamed; events:\n{}",
        events.text()
    );
    let state = broker.state();
    let b_state = state.server(&b.address()).expect("b listed");
    assert_eq!(b_state.state, Standing::Quarantined);
    assert_eq!(b_state.failed_connects, 1);

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
    let events = &broker.events;
    b.stop().await;

    let q = events
        .wait_for_quarantine(&b.address(), Reason::Monitor)
        .await;
    assert_eq!(q.stop - q.start, 120, "stop - start is QUARANTINE_TIME");
    events
        .wait_for("a round with b unavailable", |e| {
            matches!(e, Event::MonitorRound { available: 1, unavailable, .. }
                if *unavailable == [b.address()])
        })
        .await;

    // Quarantined, b is not tried by clients at all: no failed connect, no client error.
    let answers = ask_many(&broker, 6).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    events.wait_for_ended(6).await;
    assert!(
        events.connect_failures(&b.address()).is_empty(),
        "a client was sent to the quarantined server; events:\n{}",
        events.text()
    );

    b.resume().await;
    events
        .wait_for_release(&b.address(), Release::CheckPassed)
        .await;
    let answers = ask_many(&broker, 6).await;
    assert!(answers.iter().any(|n| n == "b"), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_raises_the_alarm_when_no_server_answers() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms",
    );
    let broker = InProcess::start(&ini).await;
    let events = &broker.events;
    events.wait_for_round(2, 0).await;
    let alarm = |e: &Event| is_round(e, 0, 2);
    assert_eq!(events.count(alarm), 0);
    a.stop().await;
    b.stop().await;

    // No server available, none left unchecked: the round that raises the alarm.
    events
        .wait_for("a round with no server available", alarm)
        .await;
    for server in [&a, &b] {
        events
            .wait_for_quarantine(&server.address(), Reason::Monitor)
            .await;
    }
    let state = broker.state();
    assert!(
        state
            .servers
            .iter()
            .all(|s| s.state == Standing::Quarantined),
        "{state:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_ends_when_its_time_is_up_without_a_monitor() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=300ms")).await;
    let events = &broker.events;
    b.stop().await;

    // Clients until one meets b dead (CONNECTION alternates, so the first or second does).
    for _ in 0..10 {
        assert_eq!(ask(broker.addr()).await.expect("client served"), "a");
        if !events.quarantines(&b.address()).is_empty() {
            break;
        }
    }
    events
        .wait_for_quarantine(&b.address(), Reason::Connect)
        .await;
    b.resume().await;

    // Once b is back no client can quarantine it again, so waiting for as many time-up
    // releases as quarantines leaves it free (a slow machine may have let a client meet it
    // dead twice before the resume).
    events.wait_for_release(&b.address(), Release::TimeUp).await;
    eventually("a time-up release for every quarantine of b", || {
        events.count(|e| is_release_of(e, &b.address(), Release::TimeUp))
            >= events
                .quarantines(&b.address())
                .iter()
                .filter(|q| q.started)
                .count()
    })
    .await;
    assert_eq!(
        events.count(|e| matches!(e, Event::MonitorRound { .. } | Event::CheckPassed { .. })),
        0,
        "monitoring is disabled, no round may run; events:\n{}",
        events.text()
    );
    let answers = ask_many(&broker, 6).await;
    assert!(answers.iter().any(|n| n == "b"), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_closed_at_once_when_every_server_is_down() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "")).await;
    a.stop().await;
    b.stop().await;

    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    let peer = client.local_addr().expect("address");
    assert!(closed_at_once(client).await, "the client was not closed");
    let events = &broker.events;
    events
        .wait_for("the client unserved", |e| {
            *e == Event::Unserved {
                balancer: BalancerKind::SmartClientDesktop,
                client: peer,
                why: Unserved::NoServer,
            }
        })
        .await;
    for server in [&a, &b] {
        events
            .wait_for_quarantine(&server.address(), Reason::Connect)
            .await;
    }
    assert_eq!(broker.state().unserved, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_quarantine_is_released_by_the_client_that_reaches_the_server() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    // Monitoring disabled and a long quarantine: only a client's attempt can end it.
    let broker = InProcess::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=120")).await;
    let events = &broker.events;
    a.stop().await;
    b.stop().await;
    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(client).await, "the client was not closed");
    events
        .wait_for_quarantine(&a.address(), Reason::Connect)
        .await;
    events
        .wait_for_quarantine(&b.address(), Reason::Connect)
        .await;

    a.resume().await;
    assert_eq!(ask(broker.addr()).await.expect("client served"), "a");
    events
        .wait_for_release(&a.address(), Release::ClientConnected)
        .await;
    // Released, a is an ordinary candidate again; b stays quarantined.
    let answers = ask_many(&broker, 4).await;
    assert!(answers.iter().all(|n| n == "a"), "{answers:?}");
    events.wait_for_ended(5).await;
    assert_eq!(
        events.count(|e| is_any_release_of(e, &b.address())),
        0,
        "b never answered; events:\n{}",
        events.text()
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
    let broker = InProcess::start(&ini_for(&refs, "MAX_ATTEMPTS=2")).await;

    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(client).await, "the client was not closed");
    // Published after the client's last attempt, so every attempt's event is in by then.
    let events = &broker.events;
    events
        .wait_for("the client unserved", |e| {
            matches!(e, Event::Unserved { .. })
        })
        .await;
    let tried: Vec<&TestServer> = servers
        .iter()
        .filter(|s| !events.connect_failures(&s.address()).is_empty())
        .collect();
    assert_eq!(
        tried.len(),
        2,
        "MAX_ATTEMPTS=2 but {} servers tried; events:\n{}",
        tried.len(),
        events.text()
    );
    let quarantined = servers
        .iter()
        .filter(|s| !events.quarantines(&s.address()).is_empty())
        .count();
    assert_eq!(quarantined, 2, "events:\n{}", events.text());
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
    let broker = InProcess::start(&ini).await;
    for _ in 0..10 {
        assert_eq!(ask(broker.addr()).await.expect("answered"), "b");
    }
    let own = format!("localhost:{}", broker.ports[0]);
    let errors = broker.events.connect_failures(&own);
    assert!(!errors.is_empty(), "events:\n{}", broker.events.text());
    assert!(errors[0].contains("own listening address"), "{}", errors[0]);
    assert!(
        errors[0].contains("the cause is on the server's side or in the configuration"),
        "{}",
        errors[0]
    );
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
