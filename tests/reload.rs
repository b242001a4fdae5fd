#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic
//! Live reload through a broker in process (the file read again, as a SIGHUP does; the
//! signal itself: tests/lifecycle.rs): servers added, removed and re-weighted, intervals
//! changed, quarantine state kept, a listen port moved (or not, when it is taken; with clients
//! arriving; onto the port of a section removed in the same reload), balancer sections added,
//! removed and renamed, an invalid or missing file rejected, and twenty reloads under load
//! without a failed or corrupted exchange. Asserted on each reload's result, the events and
//! the state; one test that shuts down after a reload runs the real binary.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use appbroker::Event;
use appbroker::config::BalancerKind;
use harness::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::TcpStream;

/// Rewrites the file with `text` and reloads it; what changed, as the `configuration
/// reloaded:` line lists it.
async fn reload(broker: &InProcess, text: &str) -> String {
    let reloaded = broker.reload(text).await;
    if reloaded.changes.is_empty() {
        "nothing changed".to_string()
    } else {
        reloaded.changes.join("; ")
    }
}

fn assert_mentions(line: &str, needles: &[&str]) {
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} missing from: {line}");
    }
}

/// True when nothing listens on `addr` any more: the connect is refused.
async fn refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// An ini over `servers` given as (server, weight), each as `REMOTE_SERVER_<id>`, with
/// `extra` lines in the section.
fn weighted(servers: &[(&str, &TestServer, u32)], extra: &str) -> String {
    let mut ini = ini_for(&[], extra);
    for (id, server, weight) in servers {
        ini.push_str(&format!("REMOTE_SERVER_{id}={} {weight}\n", server.ini()));
    }
    ini
}

/// A `[BALANCE_WEB_SERVICES]` section on `@PORT2@` over `server`.
fn web_services(server: &TestServer) -> String {
    format!(
        "[BALANCE_WEB_SERVICES]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT2@\n\
         MONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n",
        server.ini()
    )
}

/// Asks through `addr` (the first balancer's) `count` times, each on a new connection, the
/// next only once the broker has counted the last one's end (so a fewest-connections pick
/// sees the loads the expected orders assume); returns who answered.
async fn ask_many(broker: &InProcess, addr: SocketAddr, count: usize) -> Vec<String> {
    let active = || -> u64 { broker.state().servers.iter().map(|s| s.active).sum() };
    let held = active();
    let mut answers = Vec::with_capacity(count);
    for i in 0..count {
        match ask(addr).await {
            Ok(name) => answers.push(name),
            Err(e) => panic!(
                "client {i} got an error: {e}; answers so far {answers:?}; events:\n{}",
                broker.events.text()
            ),
        }
        eventually("the last client's end counted", || active() <= held).await;
    }
    answers
}

/// A line of every byte value but `\n` (which ends a line for the echo servers), so an
/// exchange proves the relay byte-exact, not only for text.
fn binary_line(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| match (i as u8).wrapping_mul(31).wrapping_add(seed) {
            b'\n' => b'N',
            b => b,
        })
        .collect()
}

/// Sends `line` on `stream` and checks the reply is exactly `<server>: <line>`.
async fn echo_exact(stream: &mut TcpStream, server: &str, line: &[u8]) {
    let mut sent = line.to_vec();
    sent.push(b'\n');
    stream
        .write_all(&sent)
        .await
        .expect("send through a held connection");
    let mut expected = format!("{server}: ").into_bytes();
    expected.extend_from_slice(&sent);
    let mut reply = vec![0u8; expected.len()];
    tokio::time::timeout(
        DEADLINE,
        tokio::io::AsyncReadExt::read_exact(stream, &mut reply),
    )
    .await
    .expect("reply in time")
    .expect("reply through a held connection");
    assert!(reply == expected, "the reply is not byte-exact");
}

/// Closes `stream` from the client side and waits for the broker to see it end, which must
/// be the client's doing.
async fn close_and_check(broker: &InProcess, stream: TcpStream) {
    let client = stream.local_addr().unwrap();
    drop(stream);
    let ended = broker.events.wait_for_end(client).await;
    assert_eq!(ended.ended_by, End::Closed(Side::Client));
}

/// True when some connection was cut by the broker (shutdown or removal).
fn any_cut(broker: &InProcess) -> bool {
    broker.events.count(|e| {
        matches!(
            e,
            Event::ConnectionEnded {
                ended_by: End::Stopped,
                ..
            }
        )
    }) > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_added_removed_and_reweighted_apply_to_new_clients_only() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let broker = InProcess::start(&weighted(
        &[("01", &a, 1), ("02", &b, 1)],
        "SORT_METHOD=ROUND_ROBIN",
    ))
    .await;
    // Equal weights alternate, a first: one held connection on each server.
    let (mut held_a, on_a) = hold(broker.addr()).await;
    let (mut held_b, on_b) = hold(broker.addr()).await;
    assert_eq!((on_a.as_str(), on_b.as_str()), ("a", "b"));

    // a re-weighted, b removed (with its connection open), c added.
    let line = reload(
        &broker,
        &weighted(&[("01", &a, 3), ("03", &c, 1)], "SORT_METHOD=ROUND_ROBIN"),
    )
    .await;
    assert_mentions(
        &line,
        &[
            &format!("server {} weight 1 -> 3", a.address()),
            &format!(
                "server {} (REMOTE_SERVER_02) removed; its 1 connection finish on their own",
                b.address()
            ),
            &format!("server {} added as REMOTE_SERVER_03", c.address()),
        ],
    );

    // New clients follow the new weights from a fresh sequence: a 3, c 1; b gets none.
    let b_before = b.accepted();
    let order = ask_many(&broker, broker.addr(), 8).await;
    assert_eq!(order, ["a", "a", "c", "a", "a", "a", "c", "a"]);
    assert_eq!(b.accepted(), b_before, "a removed server got a client");
    let json = query_json(broker.addr()).await;
    assert_eq!(server_json(&json, &a.address()).unwrap()["weight"], 3);
    assert_eq!(server_json(&json, &c.address()).unwrap()["weight"], 1);
    assert!(server_json(&json, &b.address()).is_none(), "{json}");

    // The connections held across the reload, the removed server's too, still carry every
    // byte, and end when their clients close them.
    for (seed, len) in [(1, 1), (7, 3000), (200, 70_000)] {
        echo_exact(&mut held_a, "a", &binary_line(seed, len)).await;
        echo_exact(&mut held_b, "b", &binary_line(seed, len)).await;
    }
    close_and_check(&broker, held_a).await;
    close_and_check(&broker, held_b).await;
    assert!(!any_cut(&broker), "{}", broker.events.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_monitor_interval_and_quarantine_time_apply_at_once() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let settings = |interval: &str, quarantine: &str| {
        format!(
            "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL={interval}\nQUARANTINE_TIME={quarantine}"
        )
    };
    // One round at start, then none for a minute.
    let broker = InProcess::start(&ini_for(&[&a, &b], &settings("60", "120"))).await;
    broker.events.wait_for_round(2, 0).await;
    let round = |e: &Event| matches!(e, Event::MonitorRound { .. });
    let rounds = broker.events.count(round);

    let line = reload(&broker, &ini_for(&[&a, &b], &settings("200ms", "300"))).await;
    assert_mentions(
        &line,
        &[
            "[BALANCE_SMART_CLIENT_DESKTOP] MONITOR_INTERVAL 60s -> 200ms",
            "[BALANCE_SMART_CLIENT_DESKTOP] QUARANTINE_TIME 120s -> 300s",
        ],
    );
    let json = query_json(broker.addr()).await;
    assert_eq!(json["monitor_interval_ms"], 200, "{json}");
    assert_eq!(json["quarantine_time_ms"], 300_000, "{json}");

    // Rounds come every 200 ms now: three more long before the old minute is up.
    broker
        .events
        .wait_for_count("three more rounds", rounds + 3, round)
        .await;

    // The next quarantine lasts the new QUARANTINE_TIME.
    b.stop().await;
    let q = broker
        .events
        .wait_for_quarantine(&b.address(), Reason::Monitor)
        .await;
    assert_eq!(
        q.stop - q.start,
        300,
        "stop - start is the new QUARANTINE_TIME"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_changed_general_key_is_listed() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let english = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[]).await;
    assert!(english.text().contains("<html lang='en'>"));

    // Only LANGUAGE: the page switches, and the line says why.
    let portuguese = ini_for(&[&a], "").replace("[General]\n", "[General]\nLANGUAGE=pt-BR\n");
    let line = reload(&broker, &portuguese).await;
    assert_mentions(&line, &["[General] LANGUAGE en -> pt-BR"]);
    assert!(!line.contains("nothing changed"), "{line}");
    let page = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[]).await;
    assert!(page.text().contains("<html lang='pt-BR'>"));

    // Any other [General] key, each named with its old and new value.
    let more = portuguese.replace(
        "SHUTDOWN_TIMEOUT=5\n",
        "SHUTDOWN_TIMEOUT=7\nSHUTDOWN_GRACE=1\nConsoleLogDate=0\n",
    );
    let line = reload(&broker, &more).await;
    assert_mentions(
        &line,
        &[
            "[General] SHUTDOWN_TIMEOUT 5s -> 7s",
            "[General] SHUTDOWN_GRACE 0s -> 1s",
            "[General] CONSOLELOGDATE 1 -> 0",
        ],
    );
    assert!(
        !line.contains("LANGUAGE"),
        "unchanged keys stay out: {line}"
    );

    // The same file again: nothing changed, and it says so.
    let reloaded = broker.reload(&more).await;
    assert!(reloaded.changes.is_empty(), "{reloaded:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_added_by_a_reload_is_charted_from_when_it_joined() {
    let a = TestServer::start("a").await;
    let c = TestServer::start("c").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let line = reload(&broker, &ini_for(&[&a, &c], "")).await;
    assert_mentions(&line, &[&format!("server {} added", c.address())]);
    // Long before the next minute's sample: its line runs from the reload to now, in both
    // the wide chart and the narrow one, not a lone dot at the right edge.
    let page = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    let marker = format!("data-server='{}' d='", c.address());
    let paths: Vec<&str> = page
        .match_indices(&marker)
        .map(|(at, _)| {
            let d = &page[at + marker.len()..];
            &d[..d.find('\'').unwrap()]
        })
        .collect();
    assert_eq!(paths.len(), 2, "{page}");
    for d in paths {
        assert!(
            d.starts_with('M') && d.contains(" H"),
            "a dot, not a line: {d}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_query_max_connections_holds_once_the_queries_open_have_left() {
    const UNFINISHED: &[u8] = b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n";
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_MAX_CONNECTIONS=3")).await;
    let (held, _) = hold_query_places(broker.addr(), &[UNFINISHED; 3]).await;
    let line = reload(&broker, &ini_for(&[&a], "QUERY_MAX_CONNECTIONS=1")).await;
    assert_mentions(&line, &["QUERY_MAX_CONNECTIONS 3 -> 1"]);
    // The three open when the limit was lowered stay; once they have left, one is the limit.
    drop(held);
    eventually_async("the query places back", async || {
        http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[])
            .await
            .status
            == 200
    })
    .await;
    let (_held, refused) = hold_query_places(broker.addr(), &[UNFINISHED]).await;
    assert!(
        refused.text().contains("QUERY_MAX_CONNECTIONS"),
        "{}",
        refused.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_state_and_counters_of_remaining_servers_survive() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    // No monitor and a long quarantine: nothing but a lost state could free b.
    let broker = InProcess::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=120")).await;
    let answers = ask_many(&broker, broker.addr(), 4).await;
    assert_eq!(answers, ["a", "b", "a", "b"]);
    b.stop().await;
    for _ in 0..10 {
        assert_eq!(ask(broker.addr()).await.unwrap(), "a");
        if !broker.events.quarantines(&b.address()).is_empty() {
            break;
        }
    }
    broker
        .events
        .wait_for_quarantine(&b.address(), Reason::Connect)
        .await;
    // b answers again: only its quarantine keeps clients away from it.
    b.resume().await;
    let before = query_json(broker.addr()).await;
    let b_before = server_json(&before, &b.address()).unwrap().clone();
    assert_eq!(b_before["inquarantine"], true, "{before}");
    assert_eq!(b_before["quarantines"], 1, "{before}");
    assert_eq!(b_before["total_connections"], 2, "{before}");
    let a_total = server_json(&before, &a.address()).unwrap()["total_connections"].clone();

    // Both stay (b re-weighted), c is added.
    let line = reload(
        &broker,
        &weighted(
            &[("01", &a, 1), ("02", &b, 2), ("03", &c, 1)],
            "QUARANTINE_TIME=120",
        ),
    )
    .await;

    let after = query_json(broker.addr()).await;
    let b_after = server_json(&after, &b.address()).unwrap();
    for key in [
        "inquarantine",
        "quarantines",
        "total_connections",
        "failed_connects",
        "quarantine_start_epoch_ms",
        "quarantine_end_epoch_ms",
    ] {
        assert_eq!(b_after[key], b_before[key], "{key} of b: {after}");
    }
    assert_eq!(b_after["weight"], 2, "{after}");
    assert_mentions(&line, &[&format!("server {} weight 1 -> 2", b.address())]);
    assert_eq!(
        server_json(&after, &a.address()).unwrap()["total_connections"],
        a_total,
        "{after}"
    );
    assert_eq!(
        server_json(&after, &c.address()).unwrap()["total_connections"],
        0
    );

    let b_accepted = b.accepted();
    let answers = ask_many(&broker, broker.addr(), 6).await;
    assert!(answers.iter().all(|n| n == "a" || n == "c"), "{answers:?}");
    assert!(answers.iter().any(|n| n == "c"), "{answers:?}");
    assert_eq!(
        b.accepted(),
        b_accepted,
        "the quarantined server got a client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_listen_port_accepts_before_the_old_one_closes() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let old = broker.addr();
    let new = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (mut held, _) = hold(old).await;

    // Connects to the old port until one is refused; right after that, the new port must
    // already accept (the broker binds it before it closes the old one). A connect that meets
    // the old listener as it closes is reset, not refused: those are counted, not judged here
    // (see `clients_arriving_while_the_port_moves_are_all_served`).
    let prober = tokio::spawn(async move {
        // A loop of its own, not `poll`: a spawned task cannot hold an async closure (the
        // compiler cannot prove its future `Send` for every borrow).
        let end = Instant::now() + DEADLINE;
        let mut resets = 0;
        loop {
            assert!(Instant::now() < end, "the old port never closed");
            match TcpStream::connect(old).await {
                Ok(_) => tokio::task::yield_now().await,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => resets += 1,
                Err(e) => return (e, TcpStream::connect(new).await, resets),
            }
        }
    });
    let moved = ini_for(&[&a], "").replace("@PORT@", &new.port().to_string());
    let line = reload(&broker, &moved).await;
    assert_mentions(
        &line,
        &[
            "[BALANCE_SMART_CLIENT_DESKTOP] now listens on",
            "[BALANCE_SMART_CLIENT_DESKTOP] LOCAL_SERVER_PORT",
        ],
    );
    let (old_error, new_connect, resets) = prober.await.unwrap();
    if resets > 0 {
        eprintln!("port move: {resets} connect(s) to the old port reset as it closed");
    }
    assert_eq!(
        old_error.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{old_error}"
    );
    assert!(
        new_connect.is_ok(),
        "the old port closed before the new one accepted: {new_connect:?}"
    );
    assert_mentions(
        &line,
        &[&format!(
            "[BALANCE_SMART_CLIENT_DESKTOP] now listens on {new} (was {old})"
        )],
    );
    assert_eq!(
        broker.broker.addr(BalancerKind::SmartClientDesktop),
        Some(new)
    );

    assert!(refused(old).await, "the old port still accepts");
    assert_eq!(ask(new).await.unwrap(), "a");
    assert_eq!(query_json(new).await["listen"], new.to_string());
    echo_exact(&mut held, "a", &binary_line(3, 5000)).await;
    close_and_check(&broker, held).await;
}

/// Also the sure proof of the order: had the old listener been closed before the new bind was
/// tried, nothing would be listening after the failed bind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_port_that_cannot_be_bound_leaves_the_old_one_serving() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let old = broker.addr();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (mut held, _) = hold(old).await;

    let moved = ini_for(&[&a], "").replace("@PORT@", &port.to_string());
    let reloaded = broker.reload(&moved).await;
    assert_eq!(reloaded.errors.len(), 1, "{reloaded:?}");
    assert_mentions(
        &reloaded.errors[0],
        &[
            &format!("cannot listen on 127.0.0.1:{port} for [BALANCE_SMART_CLIENT_DESKTOP]"),
            "address already in use",
            &format!("[BALANCE_SMART_CLIENT_DESKTOP] keeps listening on {old}"),
        ],
    );
    let changes = reloaded.changes.join("; ");
    assert!(!changes.contains("now listens on"), "{changes}");
    assert_mentions(
        &changes,
        &[&format!(
            "still listens on {old} (cannot listen on 127.0.0.1:{port})"
        )],
    );
    assert_eq!(ask(old).await.unwrap(), "a");
    assert_eq!(query_json(old).await["listen"], old.to_string());
    echo_exact(&mut held, "a", &binary_line(9, 100)).await;

    // Once the port is free, the same file moves the listener.
    drop(taken);
    let reloaded = broker
        .broker
        .reload_file()
        .await
        .expect("the same file again");
    assert_mentions(&reloaded.changes.join("; "), &["now listens on"]);
    let new = SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(ask(new).await.unwrap(), "a");
    assert!(refused(old).await, "the old port still accepts");
    echo_exact(&mut held, "a", &binary_line(10, 100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_balancer_section_starts_serving() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let single = ini_for(&[&a], "");
    let broker = InProcess::start(&single).await;
    assert!(
        refused(broker.addr2()).await,
        "nothing listens on @PORT2@ yet"
    );

    let line = reload(&broker, &format!("{single}{}", web_services(&b))).await;
    assert_mentions(&line, &["[BALANCE_WEB_SERVICES] added"]);
    broker
        .events
        .wait_for("[BALANCE_WEB_SERVICES] listening", |e| {
            *e == Event::Listening {
                balancer: BalancerKind::WebServices,
                address: broker.addr2(),
            }
        })
        .await;
    assert_eq!(ask(broker.addr2()).await.unwrap(), "b");
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    let json = query_json(broker.addr2()).await;
    assert_eq!(json["balancer"], "BALANCE_WEB_SERVICES", "{json}");
    assert!(server_json(&json, &b.address()).is_some(), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_balancer_closes_its_port_and_its_connections_finish_on_their_own() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    // A drain far longer than the test: nothing but the clients may end the connections.
    let single = ini_for(&[&a], "").replace("SHUTDOWN_TIMEOUT=5", "SHUTDOWN_TIMEOUT=10m");
    let broker = InProcess::start(&format!("{single}{}", web_services(&b))).await;
    let (mut first, _) = hold(broker.addr2()).await;
    let (mut second, _) = hold(broker.addr2()).await;

    let line = reload(&broker, &single).await;
    assert_mentions(&line, &["[BALANCE_WEB_SERVICES] removed"]);
    assert!(broker.broker.state(BalancerKind::WebServices).is_none());
    assert!(
        refused(broker.addr2()).await,
        "the removed balancer's port accepts"
    );
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");

    echo_exact(&mut first, "b", &binary_line(4, 10_000)).await;
    echo_exact(&mut second, "b", &binary_line(5, 10_000)).await;
    close_and_check(&broker, first).await;
    echo_exact(&mut second, "b", &binary_line(6, 10)).await;
    close_and_check(&broker, second).await;
    assert!(!any_cut(&broker), "{}", broker.events.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_balancer_cuts_its_connections_after_shutdown_timeout() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let single = ini_for(&[&a], "").replace("SHUTDOWN_TIMEOUT=5", "SHUTDOWN_TIMEOUT=1s");
    let broker = InProcess::start(&format!("{single}{}", web_services(&b))).await;
    let (held, _) = hold(broker.addr2()).await;
    let client = held.local_addr().unwrap();

    let line = reload(&broker, &single).await;
    assert_mentions(&line, &["[BALANCE_WEB_SERVICES] removed"]);
    assert!(closed_at_once(held).await, "the held client must be cut");
    let ended = broker.events.wait_for_end(client).await;
    assert_eq!(ended.ended_by, End::Stopped);
    // The balancer that stays is untouched.
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_is_rejected_with_every_error_and_changes_nothing() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "")).await;

    // Line numbers matter: each error must name its own. The file would also swap the servers
    // for c, which must not happen.
    let invalid = format!(
        "[General]\n\
         SHUTDOWN_TIMEOUT=forever\n\
         [BALANCE_SMART_CLIENT_DESKTOP]\n\
         LOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\n\
         SORT_METOD=ROUND_ROBIN\n\
         REMOTE_SERVER_01={}\n\
         REMOTE_SERVER_02=127.0.0.1 6002 1001\n\
         MAX_ATTEMPTS=0\n",
        c.ini()
    );
    let rejected = broker.reload_rejected(&invalid).await.lines();
    let file = broker.config_path.display().to_string();
    for (line, what) in [
        (2, "[General] SHUTDOWN_TIMEOUT: `forever`"),
        (7, "[BALANCE_SMART_CLIENT_DESKTOP] SORT_METOD: unknown key"),
        (9, "[BALANCE_SMART_CLIENT_DESKTOP] REMOTE_SERVER_02:"),
        (10, "[BALANCE_SMART_CLIENT_DESKTOP] MAX_ATTEMPTS: `0`"),
    ] {
        let needle = format!("{file}:{line}: {what}");
        assert!(
            rejected.iter().any(|l| l.starts_with(&needle)),
            "{needle} in {rejected:#?}"
        );
    }
    assert_eq!(
        broker.events.count(|e| matches!(e, Event::Reloaded(_))),
        0,
        "{}",
        broker.events.text()
    );

    // The old servers still serve, alternately; c gets nobody.
    let answers = ask_many(&broker, broker.addr(), 4).await;
    assert_eq!(answers, ["a", "b", "a", "b"]);
    assert_eq!(
        c.accepted(),
        0,
        "a server of the rejected file got a client"
    );
    let json = query_json(broker.addr()).await;
    assert!(server_json(&json, &a.address()).is_some(), "{json}");
    assert!(server_json(&json, &c.address()).is_none(), "{json}");

    // A corrected file is taken at the next SIGHUP.
    reload(&broker, &ini_for(&[&c], "")).await;
    assert_eq!(ask_many(&broker, broker.addr(), 2).await, ["c", "c"]);
}

/// What the clients of the load test did.
#[derive(Default)]
struct Load {
    connections: AtomicUsize,
    exchanges: AtomicUsize,
    bytes: AtomicUsize,
    /// Exchanges answered by c, the server that comes and goes.
    by_c: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

/// xorshift64*: a fixed, seedable source of line lengths and bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Upper bounds of the load test, so it ends even if the broker stalls or runs very fast.
const MAX_EXCHANGES_PER_CLIENT: usize = 20_000;
const MAX_LOAD_TIME: Duration = Duration::from_secs(40);

/// One client of the load test: connection after connection, each carrying a few lines of
/// random bytes (or, for a `long_lived` client, lines until `stop`, as a SmartClient session
/// lives across reloads) and checking every echo byte for byte, until `stop`.
async fn client_loop(
    addr: SocketAddr,
    seed: u64,
    long_lived: bool,
    stop: Arc<AtomicBool>,
    load: Arc<Load>,
) {
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    let mut done = 0;
    'connections: while !stop.load(Ordering::SeqCst)
        && done < MAX_EXCHANGES_PER_CLIENT
        && started.elapsed() < MAX_LOAD_TIME
    {
        let fail = |what: String| load.failures.lock().unwrap().push(what);
        let stream = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => {
                fail(format!("connect: {e}"));
                continue;
            }
        };
        load.connections.fetch_add(1, Ordering::SeqCst);
        let (read, mut write) = stream.into_split();
        let mut read = AsyncBufReader::new(read);
        let lines = if long_lived {
            u64::MAX
        } else {
            1 + rng.below(8)
        };
        for _ in 0..lines {
            if stop.load(Ordering::SeqCst) || started.elapsed() >= MAX_LOAD_TIME {
                break;
            }
            let len = 1 + rng.below(3000) as usize;
            let mut line: Vec<u8> = (0..len)
                .map(|_| match rng.next() as u8 {
                    b'\n' => b'N',
                    b => b,
                })
                .collect();
            line.push(b'\n');
            if let Err(e) = write.write_all(&line).await {
                fail(format!("send: {e}"));
                continue 'connections;
            }
            let mut reply = Vec::new();
            match tokio::time::timeout(DEADLINE, read.read_until(b'\n', &mut reply)).await {
                Err(_) => {
                    fail("no reply in time".into());
                    continue 'connections;
                }
                Ok(Err(e)) => {
                    fail(format!("receive: {e}"));
                    continue 'connections;
                }
                Ok(Ok(_)) => {}
            }
            let server = ["a", "b", "c"].into_iter().find(|name| {
                reply.strip_prefix(format!("{name}: ").as_bytes()) == Some(line.as_slice())
            });
            let Some(server) = server else {
                fail(format!(
                    "corrupted: sent {} bytes, got {} bytes starting {:?}",
                    line.len(),
                    reply.len(),
                    String::from_utf8_lossy(&reply[..reply.len().min(20)])
                ));
                continue 'connections;
            };
            if server == "c" {
                load.by_c.fetch_add(1, Ordering::SeqCst);
            }
            load.bytes.fetch_add(line.len(), Ordering::SeqCst);
            load.exchanges.fetch_add(1, Ordering::SeqCst);
            done += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_lose_no_exchange() {
    const CLIENTS: usize = 6;
    const LONG_LIVED: usize = 2;
    const RELOADS: usize = 20;
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    // Generation n: weights swap between a and b, c comes and goes (with its connections
    // left open), and the monitor's interval changes each time.
    let generation = |n: usize| {
        let monitor = if n.is_multiple_of(2) { "200ms" } else { "1s" };
        let extra = format!(
            "SORT_METHOD=ROUND_ROBIN\nMONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL={monitor}"
        );
        if n.is_multiple_of(2) {
            weighted(&[("01", &a, 1), ("02", &b, 3)], &extra)
        } else {
            weighted(&[("01", &a, 3), ("02", &b, 1), ("03", &c, 2)], &extra)
        }
    };
    let broker = InProcess::start(&generation(0)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let clients: Vec<_> = (0..(CLIENTS + LONG_LIVED) as u64)
        .map(|i| {
            tokio::spawn(client_loop(
                broker.addr(),
                seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                i >= CLIENTS as u64,
                Arc::clone(&stop),
                Arc::clone(&load),
            ))
        })
        .collect();
    let progress = |load: &Load| load.connections.load(Ordering::SeqCst);
    eventually("the clients under way", || progress(&load) >= CLIENTS).await;

    let started = Instant::now();
    for n in 1..=RELOADS {
        let line = reload(&broker, &generation(n)).await;
        assert!(!line.contains("nothing changed"), "reload {n}: {line}");
        assert_mentions(&line, &[&format!("server {}", c.address())]);
        // Every reload meets clients: new connections are made under each configuration.
        let seen = progress(&load);
        eventually(&format!("new connections after reload {n}"), || {
            progress(&load) >= seen + 2 * CLIENTS
        })
        .await;
        assert!(
            started.elapsed() < MAX_LOAD_TIME,
            "the reloads outlasted the load"
        );
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client task");
    }

    let failures = load.failures.lock().unwrap().clone();
    let (connections, exchanges) = (
        load.connections.load(Ordering::SeqCst),
        load.exchanges.load(Ordering::SeqCst),
    );
    eprintln!(
        "reload under load: {RELOADS} reloads, {CLIENTS} clients and {LONG_LIVED} long-lived \
         ones, {connections} connections, \
         {exchanges} exchanges ({} by the server added and removed), {} bytes echoed, \
         {} failed or corrupted, {:.1}s",
        load.by_c.load(Ordering::SeqCst),
        load.bytes.load(Ordering::SeqCst),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} failed exchanges, first ones: {:?}; events:\n{}",
        failures.len(),
        &failures[..failures.len().min(10)],
        broker.events.text()
    );
    let events = &broker.events;
    assert_eq!(
        events.count(|e| matches!(e, Event::Reloaded(r) if r.errors.is_empty())),
        RELOADS
    );
    assert!(load.by_c.load(Ordering::SeqCst) > 0, "c never got a client");
    assert_eq!(
        events.count(|e| matches!(
            e,
            Event::ConnectFailed { .. } | Event::Unserved { .. } | Event::ReloadRejected { .. }
        )),
        0,
        "{}",
        events.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_replaced_by_another_on_the_same_port_keeps_the_port_serving() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let section = |name: &str, server: &TestServer| {
        format!(
            "[General]\nSHUTDOWN_TIMEOUT=5\n[{name}]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
             LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n",
            server.ini()
        )
    };
    let broker = InProcess::start(&section("BALANCE_WEB_SERVICES", &a)).await;
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");

    // The operator renames the section: the port is the same, the balancer another.
    let line = reload(&broker, &section("BALANCE_SMART_CLIENT_DESKTOP", &b)).await;
    assert_eq!(
        ask(broker.addr()).await.unwrap_or_else(|e| panic!(
            "the port no longer serves: {e}; events:\n{}",
            broker.events.text()
        )),
        "b"
    );
    assert_mentions(
        &line,
        &[
            "[BALANCE_SMART_CLIENT_DESKTOP] added",
            "[BALANCE_WEB_SERVICES] removed",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balancer_may_move_to_the_port_of_a_balancer_removed_in_the_same_reload() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let both = format!("{}{}", ini_for(&[&a], ""), web_services(&b));
    let broker = InProcess::start(&both).await;

    // [BALANCE_WEB_SERVICES] goes; [BALANCE_SMART_CLIENT_DESKTOP] takes over its port.
    let moved = ini_for(&[&a], "").replace("@PORT@", "@PORT2@");
    let line = reload(&broker, &moved).await;
    assert_mentions(&line, &["[BALANCE_WEB_SERVICES] removed"]);
    assert_mentions(
        &line,
        &[&format!(
            "now listens on {} (was {})",
            broker.addr2(),
            broker.addr()
        )],
    );
    assert_eq!(ask(broker.addr2()).await.unwrap(), "a");
    assert!(refused(broker.addr()).await, "the old port still accepts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_file_is_rejected_and_the_broker_keeps_serving() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    std::fs::remove_file(&broker.config_path).unwrap();
    let rejected = broker
        .broker
        .reload_file()
        .await
        .expect_err("no file")
        .lines();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_mentions(
        &rejected[0],
        &["cannot read", &broker.config_path.display().to_string()],
    );
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_shutdown_timeout_applies_to_the_next_shutdown() {
    let a = TestServer::start("a").await;
    // A drain that would outlast the test: only the reloaded value can end it in time.
    let long = ini_for(&[&a], "").replace("SHUTDOWN_TIMEOUT=5", "SHUTDOWN_TIMEOUT=10m");
    let broker = InProcess::start(&long).await;
    let (held, _) = hold(broker.addr()).await;
    let client = held.local_addr().unwrap();
    let line = reload(
        &broker,
        &long.replace("SHUTDOWN_TIMEOUT=10m", "SHUTDOWN_TIMEOUT=300ms"),
    )
    .await;
    assert_mentions(&line, &["[General] SHUTDOWN_TIMEOUT 600s -> 300ms"]);

    // Stopped as a SIGTERM stops it: the drain cuts the held client after 300 ms.
    let InProcess {
        broker: running,
        events,
        ..
    } = broker;
    let stopping = tokio::spawn(running.stop());
    assert!(closed_at_once(held).await, "the held client must be cut");
    assert_eq!(events.wait_for_end(client).await.ended_by, End::Stopped);
    within("the drain", stopping).await.unwrap();
    events
        .wait_for("the broker stopped", |e| *e == Event::Stopped)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_arriving_while_the_port_moves_are_all_served() {
    const CLIENTS: usize = 4;
    const MOVES: usize = 10;
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    // The port clients are told to use; moved after each `now listens on`.
    let target = Arc::new(std::sync::atomic::AtomicU16::new(broker.ports[0]));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (target, stop) = (Arc::clone(&target), Arc::clone(&stop));
            let (served, failures) = (Arc::clone(&served), Arc::clone(&failures));
            tokio::spawn(async move {
                let started = Instant::now();
                while !stop.load(Ordering::SeqCst) && started.elapsed() < MAX_LOAD_TIME {
                    let port = target.load(Ordering::SeqCst);
                    let addr = SocketAddr::from(([127, 0, 0, 1], port));
                    match TcpStream::connect(addr).await {
                        Ok(mut stream) => match exchange(&mut stream, "moving").await {
                            Ok(_) => {
                                served.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => failures
                                .lock()
                                .unwrap()
                                .push(format!("accepted on port {port}, then: {e}")),
                        },
                        // The old port closed and the clients are not told the new one yet:
                        // a clean refusal, as any client of a moved service meets.
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                            tokio::task::yield_now().await
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("connect to port {port}: {e}")),
                    }
                }
            })
        })
        .collect();
    eventually("clients under way", || {
        served.load(Ordering::SeqCst) >= CLIENTS
    })
    .await;

    for n in 1..=MOVES {
        let port = free_port();
        let line = reload(
            &broker,
            &ini_for(&[&a], "").replace("@PORT@", &port.to_string()),
        )
        .await;
        assert_mentions(&line, &["now listens on"]);
        target.store(port, Ordering::SeqCst);
        let seen = served.load(Ordering::SeqCst);
        eventually(&format!("clients served after move {n}"), || {
            served.load(Ordering::SeqCst) >= seen + CLIENTS
        })
        .await;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client task");
    }
    let failures = failures.lock().unwrap().clone();
    eprintln!(
        "port moves under load: {MOVES} moves, {} clients served, {} failed",
        served.load(Ordering::SeqCst),
        failures.len()
    );
    // The old listener lets no new handshake begin, then serves what it had queued or under
    // way, then closes: a client meets either service or a clean refusal, never a reset.
    // (Before the queue was served, 3 to 12 clients were lost per run; with the queue served
    // but new handshakes still let in, about one in ten moves lost one.)
    assert!(
        failures.is_empty(),
        "clients the old port had accepted were not served: {failures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_path_that_became_a_fifo_is_rejected_and_the_broker_goes_on() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    std::fs::remove_file(&broker.config_path).unwrap();
    nix::unistd::mkfifo(
        &broker.config_path,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let rejected = within("the reload", broker.broker.reload_file())
        .await
        .expect_err("a FIFO")
        .lines();
    assert!(
        rejected
            .iter()
            .any(|l| l.contains("FIFO (named pipe), not a regular file")
                && l.contains(&broker.config_path.display().to_string())),
        "{rejected:?}"
    );
    // Reloads, monitors and clients are served as before, and the broker stops as asked.
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    within("the stop", broker.broker.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_makes_a_server_the_broker_itself_is_rejected() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let rejected = broker
        .reload_rejected(&ini_for(&[&a], "REMOTE_SERVER_02=127.0.0.1 @PORT@"))
        .await
        .lines();
    let line = rejected
        .iter()
        .find(|l| l.contains("is this broker's own address"))
        .unwrap_or_else(|| panic!("{rejected:?}"));
    assert!(line.contains("REMOTE_SERVER_02"), "{line}");
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_given_by_the_program_is_applied_as_the_file_would_be() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&weighted(
        &[("01", &a, 1), ("02", &b, 1)],
        "SORT_METHOD=ROUND_ROBIN",
    ))
    .await;
    // Not the file: a Config the program made (an administration interface, say).
    let text = fill_placeholders(
        &weighted(&[("01", &a, 1), ("02", &b, 0)], "SORT_METHOD=ROUND_ROBIN"),
        &broker.ports,
        broker.dir.path(),
    );
    let config = appbroker::config::Config::from_text(&text, &broker.config_path)
        .unwrap()
        .config;
    let reloaded = broker.broker.reload(config).await.unwrap();
    assert_mentions(
        &reloaded.changes.join("; "),
        &[&format!("server {} weight 1 -> 0", b.address())],
    );
    assert!(reloaded.errors.is_empty(), "{reloaded:?}");
    assert_eq!(ask_many(&broker, broker.addr(), 4).await, ["a"; 4]);
    broker
        .events
        .wait_for("the reload's event", |e| {
            *e == Event::Reloaded(reloaded.clone())
        })
        .await;
}
