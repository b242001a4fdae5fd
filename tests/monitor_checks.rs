//! The monitor's checks through a broker in process, against servers that misbehave: an
//! application that accepts and hangs (SEND_EXPECT sees it, CONNECTION cannot), wrong, cut or
//! stalled replies, escapes on the wire, MONITOR_FALL and MONITOR_RISE, and connects that
//! hang. Asserted on the broker's events and state. (How the lines read: tests/log_format.rs.)
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use appbroker::Event;
use harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The SEND_EXPECT settings most tests here use: the probe `PING\r\n`, the reply `PONG`.
const PING_PONG: &str = "MONITORING_TYPE=SEND_EXPECT\nMONITOR_SEND=PING\\r\\n\nMONITOR_EXPECT=PONG\n\
                         CONNECT_TIMEOUT=1s\nMONITOR_INTERVAL=200ms\n";

/// Asks through `broker` once per line of `lines`, each answered exactly by one of `names`;
/// returns who answered.
async fn ask_exactly(broker: &InProcess, lines: &[String], names: &[&str]) -> Vec<String> {
    let mut answers = Vec::new();
    for line in lines {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        let name = exact_exchange(&mut client, line, names)
            .await
            .unwrap_or_else(|e| panic!("{line}: {e}; events:\n{}", broker.events.text()));
        answers.push(name);
    }
    answers
}

fn numbered(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix} {i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_application_is_quarantined_by_send_expect_but_not_by_connection() {
    let hung = FaultServer::start("hung", Behaviour::Hang).await;
    let ok = FaultServer::start("ok", Behaviour::Healthy).await;
    let servers = [hung.ini(), ok.ini()];
    let probing = InProcess::start(&ini_over(&servers, PING_PONG)).await;
    let connecting = InProcess::start(&ini_over(
        &servers,
        "MONITORING_TYPE=CONNECTION\nCONNECT_TIMEOUT=300ms\nMONITOR_INTERVAL=200ms",
    ))
    .await;

    // SEND_EXPECT: the hung server's port accepts, its application never answers the probe.
    let events = &probing.events;
    let failed = events.wait_for_check_failure(&hung.address()).await;
    for needed in [
        "no reply: the port accepts but the application does not answer within 1s",
        "(SEND_EXPECT, expecting `PONG`)",
        "points at the server's application",
    ] {
        assert!(failed.contains(needed), "{needed:?} in {failed}");
    }
    let q = events
        .wait_for_quarantine(&hung.address(), Reason::Monitor)
        .await;
    assert!(q.started);
    let failed_at = events.position(|e| is_check_failure_of(e, &hung.address()));
    let quarantined_at = events.position(|e| quarantine_of(e, &hung.address()).is_some());
    assert!(failed_at < quarantined_at);
    events.wait_for_round(1, 1).await;
    // Quarantined, the hung server gets no client: every one is answered, by `ok`.
    let answers = ask_exactly(&probing, &numbered("probing client", 6), &["ok"]).await;
    assert!(answers.iter().all(|n| n == "ok"));
    assert!(
        !hung.received_somewhere(b"probing client"),
        "a client was sent to the quarantined hung server"
    );
    assert!(
        events.quarantines(&ok.address()).is_empty(),
        "the healthy server was blamed; events:\n{}",
        events.text()
    );

    // CONNECTION: the same hung server passes round after round...
    connecting.events.wait_for_rounds(2, 0, 3).await;
    assert_eq!(
        connecting
            .events
            .count(|e| matches!(e, Event::Quarantined { .. })),
        0,
        "CONNECTION cannot see a hung application; events:\n{}",
        connecting.events.text()
    );
    // ...and gets clients, who are left waiting. Two held at once: one goes to each server
    // (fewest connections first).
    let mut first = TcpStream::connect(connecting.addr()).await.unwrap();
    let mut second = TcpStream::connect(connecting.addr()).await.unwrap();
    first.write_all(b"connecting client 1\n").await.unwrap();
    second.write_all(b"connecting client 2\n").await.unwrap();
    eventually(
        "a client of the CONNECTION broker to reach the hung server",
        || hung.received_somewhere(b"connecting client"),
    )
    .await;
    let (mut answered, waiting) = if hung.received_somewhere(b"connecting client 1") {
        (second, first)
    } else {
        (first, second)
    };
    let mut reply = vec![0u8; "ok: connecting client 1\n".len()];
    within("the other client's answer", answered.read_exact(&mut reply))
        .await
        .unwrap();
    assert!(reply.starts_with(b"ok: connecting client "), "{reply:?}");
    assert!(
        !ended_stream(&waiting),
        "the hung server's client should be left open and unanswered"
    );
    let mut none = [0u8; 1];
    assert!(
        matches!(waiting.try_read(&mut none), Err(e) if e.kind() == ErrorKind::WouldBlock),
        "the hung server never writes, yet its client got bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_cut_or_stalled_replies_are_quarantined_and_named_a_slow_right_one_passes() {
    let reply = |bytes: &[u8], then_close| Behaviour::Reply {
        bytes: bytes.to_vec(),
        then_close,
    };
    let wrong = FaultServer::start("wrong", reply(b"PANG\r\n", false)).await;
    let cut = FaultServer::start("cut", reply(b"PO", true)).await;
    let stalled = FaultServer::start("stalled", reply(b"PO", false)).await;
    // `PONG\r\n` a byte every 20 ms: complete well within CONNECT_TIMEOUT=1s.
    let paced = FaultServer::start("paced", Behaviour::Paced(Duration::from_millis(20))).await;
    let ok = FaultServer::start("ok", Behaviour::Healthy).await;
    let servers = [&wrong, &cut, &stalled, &paced, &ok].map(FaultServer::ini);
    let broker = InProcess::start(&ini_over(&servers, PING_PONG)).await;
    let events = &broker.events;

    for (server, expected) in [
        (
            &wrong,
            concat!(
                r"unexpected reply `PANG\r\n` (SEND_EXPECT, expecting `PONG`); ",
                "points at the server's application or a wrong MONITOR_EXPECT"
            ),
        ),
        (&cut, "closed after `PO` (SEND_EXPECT, expecting `PONG`)"),
        (
            &stalled,
            "incomplete reply `PO` within 1s (SEND_EXPECT, expecting `PONG`)",
        ),
    ] {
        let failed = events.wait_for_check_failure(&server.address()).await;
        assert!(failed.contains(expected), "{failed}");
        events
            .wait_for_quarantine(&server.address(), Reason::Monitor)
            .await;
    }
    events.wait_for_round(2, 3).await;
    // The probe reached the servers byte for byte.
    assert_eq!(wrong.connections()[0].received(), b"PING\r\n");
    // Clients go to the two that passed, and get every byte, however slowly it comes.
    let names = ask_exactly(&broker, &numbered("after", 4), &["ok", "paced"]).await;
    assert!(names.iter().any(|n| n == "paced"), "{names:?}");
    for server in [&paced, &ok] {
        assert!(
            events.check_failures(&server.address()).is_empty(),
            "events:\n{}",
            events.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_in_monitor_send_and_expect_are_bytes_on_the_wire() {
    // Any byte can be sent and expected: NUL, 0xFF, a tab, a backslash, CR LF.
    const PROBE: &[u8] = b"\x00\x01HELLO\t\\\r\n";
    let good = FaultServer::start(
        "good",
        Behaviour::Reply {
            bytes: b"\x00OK\xff and more".to_vec(),
            then_close: false,
        },
    )
    .await;
    let bad = FaultServer::start(
        "bad",
        Behaviour::Reply {
            bytes: b"\x00OK\xfe".to_vec(),
            then_close: false,
        },
    )
    .await;
    let settings = r"MONITORING_TYPE=SEND_EXPECT
MONITOR_SEND=\x00\x01HELLO\t\\\r\n
MONITOR_EXPECT=\x00OK\xFf
CONNECT_TIMEOUT=300ms
MONITOR_INTERVAL=200ms
";
    let broker = InProcess::start(&ini_over(&[good.ini(), bad.ini()], settings)).await;
    let events = &broker.events;

    let failed = events.wait_for_check_failure(&bad.address()).await;
    assert!(
        failed.contains(r"unexpected reply `\x00OK\xFE` (SEND_EXPECT, expecting `\x00OK\xFF`)"),
        "{failed}"
    );
    events.wait_for_rounds(1, 1, 2).await;
    for server in [&good, &bad] {
        // Every probe read so far (a round may be under way: its probe not read yet).
        let probes: Vec<Vec<u8>> = server
            .connections()
            .iter()
            .map(|c| c.received())
            .filter(|r| !r.is_empty())
            .collect();
        assert!(probes.len() >= 2, "{} probed twice", server.address());
        for probe in probes {
            assert_eq!(probe, PROBE, "the probe {} received", server.address());
        }
    }
    assert!(
        events.check_failures(&good.address()).is_empty(),
        "the server answering `\\x00OK\\xFF...` passes; events:\n{}",
        events.text()
    );
    assert!(events.quarantines(&good.address()).is_empty());
    assert!(!events.quarantines(&bad.address()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_fall_quarantines_only_at_the_third_failed_round() {
    let a = FaultServer::start("a", Behaviour::Healthy).await;
    let mut b = FaultServer::start("b", Behaviour::Healthy).await;
    let broker = InProcess::start(&ini_over(
        &[a.ini(), b.ini()],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms\nMONITOR_FALL=3",
    ))
    .await;
    let events = &broker.events;
    events.wait_for_round(2, 0).await;
    // No client is sent while b fails: a client's failed connect would quarantine it at once.
    b.down().await;

    let q = events
        .wait_for_quarantine(&b.address(), Reason::Monitor)
        .await;
    assert!(q.started);
    let all = events.all();
    let failures: Vec<(usize, &Event)> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| is_check_failure_of(e, &b.address()))
        .take(3)
        .collect();
    assert_eq!(failures.len(), 3, "events:\n{}", events.text());
    for (n, (_, failure)) in failures.iter().enumerate() {
        let Event::CheckFailed {
            in_a_row,
            explained,
            ..
        } = failure
        else {
            unreachable!("picked above");
        };
        assert_eq!(*in_a_row, n as u32 + 1, "{failure:?}");
        assert!(explained.starts_with("connection refused"), "{explained}");
    }
    let quarantined_at = all
        .iter()
        .position(|e| quarantine_of(e, &b.address()).is_some())
        .unwrap();
    assert!(
        failures[2].0 < quarantined_at,
        "the quarantine follows the third failure"
    );
    assert!(
        !all[..failures[2].0]
            .iter()
            .any(|e| matches!(e, Event::Quarantined { .. })),
        "quarantined before the third failed round; events:\n{}",
        events.text()
    );
    assert!(events.quarantines(&a.address()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_rise_releases_only_after_the_second_passed_round() {
    let a = FaultServer::start("a", Behaviour::Healthy).await;
    let b = FaultServer::start("b", Behaviour::Healthy).await;
    let broker = InProcess::start(&ini_over(
        &[a.ini(), b.ini()],
        &format!("{PING_PONG}MONITOR_RISE=2"),
    ))
    .await;
    let events = &broker.events;
    events.wait_for_round(2, 0).await;
    // b's application hangs (its port still accepts) until it is healthy again.
    b.set_mode(Behaviour::Hang);
    events
        .wait_for_quarantine(&b.address(), Reason::Monitor)
        .await;
    b.set_mode(Behaviour::Healthy);
    events
        .wait_for_release(&b.address(), Release::CheckPassed)
        .await;

    // b's check results up to the release: since its last failure, exactly two passes, the
    // second releasing it. (A loaded machine may make b fail a round while it recovers; the
    // count then starts again.)
    let all = events.all();
    let address = b.address();
    let released_at = all
        .iter()
        .position(|e| is_any_release_of(e, &address))
        .unwrap();
    let quarantined_at = all
        .iter()
        .position(|e| quarantine_of(e, &address).is_some())
        .unwrap();
    let mut since_failure: Vec<(usize, &Event)> = all[..released_at]
        .iter()
        .enumerate()
        .rev()
        .take_while(|(_, e)| !is_check_failure_of(e, &address))
        .filter(|(_, e)| is_check_pass_of(e, &address))
        .collect();
    since_failure.reverse();
    let in_a_row: Vec<u32> = since_failure
        .iter()
        .map(|(_, e)| match e {
            Event::CheckPassed { in_a_row, .. } => *in_a_row,
            _ => unreachable!("picked above"),
        })
        .collect();
    assert_eq!(
        in_a_row,
        [1, 2],
        "two passed rounds before the release; events:\n{}",
        events.text()
    );
    assert!(quarantined_at < since_failure[0].0 && since_failure[1].0 < released_at);
    // The quarantine held until then: one release only.
    assert_eq!(events.count(|e| is_any_release_of(e, &address)), 1);
    // Released, b takes clients again.
    let names = ask_exactly(&broker, &numbered("back", 4), &["a", "b"]).await;
    assert!(names.iter().any(|n| n == "b"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_failed_connect_quarantines_at_once_whatever_monitor_fall() {
    let a = FaultServer::start("a", Behaviour::Healthy).await;
    let mut b = FaultServer::start("b", Behaviour::Healthy).await;
    // One round at start, then none for a minute: only clients can find b down.
    let broker = InProcess::start(&ini_over(
        &[a.ini(), b.ini()],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=60\nMONITOR_FALL=3",
    ))
    .await;
    let events = &broker.events;
    events.wait_for_round(2, 0).await;
    b.down().await;

    for i in 0..4 {
        let answers = ask_exactly(&broker, &[format!("client {i}")], &["a"]).await;
        assert_eq!(answers, ["a"]);
        if !events.quarantines(&b.address()).is_empty() {
            break;
        }
    }
    events
        .wait_for_quarantine(&b.address(), Reason::Connect)
        .await;
    let errors = events.connect_failures(&b.address());
    assert_eq!(
        errors.len(),
        1,
        "one failed connect is enough; events:\n{}",
        events.text()
    );
    assert!(errors[0].contains("connection refused"), "{}", errors[0]);
    assert!(
        events.check_failures(&b.address()).is_empty(),
        "MONITOR_FALL counts monitor rounds only; events:\n{}",
        events.text()
    );
}

/// A listener that never accepts, with its accept queue full, so a new connect to it gets no
/// answer at all and hangs as it would to a host that is down: Linux drops a SYN that finds
/// the accept queue full (`tcp_conn_request`), whatever the other settings. Returns the
/// listener and the connections filling its queue (both must be kept).
async fn unresponsive_listener() -> (std::net::TcpListener, Vec<TcpStream>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let address: SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&address.into()).unwrap();
    socket.listen(0).unwrap();
    let listener: std::net::TcpListener = socket.into();
    let address = listener.local_addr().unwrap();
    let mut held = Vec::new();
    // A loopback connect completes in microseconds; one still pending after this long is
    // hanging on a full queue. Linux queues one connection for listen(0).
    const PROBE: Duration = Duration::from_millis(200);
    for _ in 0..8 {
        match tokio::time::timeout(PROBE, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => held.push(stream),
            Ok(Err(e)) => panic!("connect to the full listener failed: {e}"),
            Err(_) => return (listener, held),
        }
    }
    panic!(
        "this kernel completed every connect to a listener whose accept queue is full; Linux \
         drops them, and these tests need a connect that hangs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_arriving_together_all_pass_a_server_whose_connect_hangs() {
    let (listener, _queue) = unresponsive_listener().await;
    let hanging = listener.local_addr().unwrap();
    let ok = FaultServer::start("ok", Behaviour::Healthy).await;
    let broker = InProcess::start(&ini_over(
        &[format!("127.0.0.1 {}", hanging.port()), ok.ini()],
        "CONNECT_TIMEOUT=300ms",
    ))
    .await;

    // Eight clients at once, so several meet the hanging server before any quarantine.
    let mut clients = Vec::new();
    for i in 0..8 {
        let addr = broker.addr();
        clients.push(tokio::spawn(async move {
            let mut client = TcpStream::connect(addr).await?;
            let line = format!("together {i} {}", "x".repeat(i * 500));
            exact_exchange(&mut client, &line, &["ok"]).await
        }));
    }
    for (i, client) in clients.into_iter().enumerate() {
        let answer = within("a client", client).await.unwrap();
        assert_eq!(
            answer.unwrap_or_else(|e| panic!("client {i}: {e}; events:\n{}", broker.events.text())),
            "ok"
        );
    }
    let events = &broker.events;
    events
        .wait_for_quarantine(&hanging.to_string(), Reason::Connect)
        .await;
    let errors = events.connect_failures(&hanging.to_string());
    assert!(!errors.is_empty());
    for error in &errors {
        for needed in [
            "timed out after 300ms",
            "ETIMEDOUT",
            "Windows 121/10060",
            "the cause is on the way to the server",
        ] {
            assert!(error.contains(needed), "{needed:?} in {error}");
        }
    }
    assert!(events.quarantines(&ok.address()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_quarantines_a_server_whose_connect_hangs() {
    let (listener, _queue) = unresponsive_listener().await;
    let hanging = listener.local_addr().unwrap().to_string();
    let ok = FaultServer::start("ok", Behaviour::Healthy).await;
    let broker = InProcess::start(&ini_over(
        &[
            format!("127.0.0.1 {}", listener.local_addr().unwrap().port()),
            ok.ini(),
        ],
        PING_PONG,
    ))
    .await;
    let events = &broker.events;

    let failed = events.wait_for_check_failure(&hanging).await;
    assert!(failed.contains("timed out after 1s"), "{failed}");
    events.wait_for_quarantine(&hanging, Reason::Monitor).await;
    // Found by the monitor first, the hanging server costs clients nothing.
    let answers = ask_exactly(&broker, &numbered("client", 4), &["ok"]).await;
    assert!(answers.iter().all(|n| n == "ok"));
    assert!(events.connect_failures(&hanging).is_empty());
}
