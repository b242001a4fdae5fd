//! Who may query, and how much, spoken to as an attacker, a load balancer's health check and a
//! shell script do: `QUERY_ALLOW` decided before any query place is taken (and again at every
//! request, so a reload that tightens it holds at once), query places that refused or idle
//! connections cannot keep, clients whose first bytes only look like a query, any method on
//! the query path, half-closing clients, what CFG and STATUS show to whom, and READY.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A request line without the blank line that ends its head: a query that never finishes.
const UNFINISHED: &[u8] = b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n";

/// Connects to `addr` from the loopback address `source` (Linux answers every 127/8 address
/// on `lo`), so one test can be two clients that `QUERY_ALLOW` tells apart.
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    let stream = socket.connect(addr).await.expect("connect to broker");
    stream.set_nodelay(true).unwrap();
    stream
}

const ALLOWED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const REFUSED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// `GET path` from `source` on a new connection.
async fn get_from(source: Ipv4Addr, addr: SocketAddr, path: &str) -> HttpResponse {
    let mut connection = HttpConnection::on(connect_from(source, addr).await);
    connection
        .request("GET", path, &[])
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// True when the broker closes `stream` (end of stream or reset) within the deadline.
async fn closed_by_broker(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Reads exactly `n` bytes, or fails the test with what came.
async fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut buf))
        .await
        .expect("bytes within the deadline")
        .expect("bytes before the connection closed");
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_query_gets_403_and_is_closed_holding_no_place() {
    let a = TestServer::start("a").await;
    let ini = ini_for(&[&a], "QUERY_ALLOW=127.0.0.2\nQUERY_MAX_CONNECTIONS=2");
    let broker = InProcess::start(&ini).await;
    // More refused clients than there are places, each asking for keep-alive and staying
    // connected, as a client trying to hold the places would.
    let mut refused = Vec::new();
    for _ in 0..4 {
        let mut connection = HttpConnection::on(connect_from(REFUSED, broker.addr()).await);
        let answer = connection
            .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
            .await
            .unwrap();
        assert_eq!(answer.status, 403, "{}", answer.text());
        assert!(answer.text().contains("QUERY_ALLOW"), "{}", answer.text());
        assert_eq!(answer.header("connection"), Some("close"));
        refused.push(connection);
    }
    // With all of them still connected, an allowed monitor gets its answer.
    let ping = get_from(ALLOWED, broker.addr(), "/TOTVS_BROKER_QUERY/PING").await;
    assert_eq!(ping.status, 200, "{}", ping.text());
    for connection in &mut refused {
        assert!(closed_by_broker(&mut connection.stream).await);
    }
    assert_eq!(a.accepted(), 0, "a refused query is not forwarded either");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_only_looks_like_a_query_is_forwarded_when_every_place_is_taken() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_MAX_CONNECTIONS=1")).await;
    let (_held, refused) = hold_query_places(broker.addr(), &[UNFINISHED]).await;
    assert_eq!(refused.status, 503, "a known query may be told to retry");
    // An HTTP request split after `GET /`, and protocols whose first byte is `G` or `H`.
    for (served, first) in [&b"GET /"[..], b"G", b"H"].into_iter().enumerate() {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        client.set_nodelay(true).unwrap();
        client.write_all(first).await.unwrap();
        eventually("the client reaches a server with its first bytes", || {
            a.accepted() == served + 1
        })
        .await;
        client.write_all(b"rest\n").await.unwrap();
        let expected = [b"a: ", first, b"rest\n"].concat();
        assert_eq!(
            String::from_utf8_lossy(&read_n(&mut client, expected.len()).await),
            String::from_utf8_lossy(&expected)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_segment_that_could_start_a_query_then_waits_is_forwarded_in_order() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_SNIFF_TIMEOUT=100ms")).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    client.set_nodelay(true).unwrap();
    // One byte that could begin `HEAD /TOTVS_BROKER_QUERY`, then the client waits for the
    // server, as a client of a protocol whose first message is `H` does.
    client.write_all(b"H").await.unwrap();
    eventually("the waiting client reaches a server", || a.accepted() == 1).await;
    client.write_all(b"ELLO\n").await.unwrap();
    assert_eq!(read_n(&mut client, 9).await, b"a: HELLO\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_first_segment_that_starts_no_method_is_forwarded_at_once() {
    // The longest QUERY_SNIFF_TIMEOUT: a client wrongly held for it would wait 5 s.
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_SNIFF_TIMEOUT=5s")).await;
    for first in [&b"x"[..], b"PING", b"a1"] {
        let accepted = a.accepted();
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        client.set_nodelay(true).unwrap();
        // A request/response client's one-byte request, waiting for its answer (the
        // benchmark's load generator and netperf do this on every connection).
        client.write_all(first).await.unwrap();
        let reached = async {
            while a.accepted() == accepted {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_secs(4), reached)
                .await
                .is_ok(),
            "{:?} was held for QUERY_SNIFF_TIMEOUT instead of forwarded at once",
            String::from_utf8_lossy(first)
        );
        client.write_all(b"\n").await.unwrap();
        let mut expected = b"a: ".to_vec();
        expected.extend_from_slice(first);
        expected.push(b'\n');
        assert_eq!(read_n(&mut client, expected.len()).await, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_gives_its_place_to_a_new_query() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_MAX_CONNECTIONS=1")).await;
    // A browser's connection between two refreshes holds the only place, idle.
    let mut browser = HttpConnection::connect(broker.addr()).await;
    let page = browser
        .request("GET", "/TOTVS_BROKER_QUERY/STATUS?refresh=5", &[])
        .await
        .unwrap();
    assert_eq!(page.status, 200);
    // A load balancer's PING takes its place.
    let ping = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[]).await;
    assert_eq!(ping.status, 200, "{}", ping.text());
    // The idle connection lost its place: at its refresh it is closed unanswered, as any
    // kept-alive connection its server closed, and the browser asks again on a new one.
    browser
        .stream
        .write_all(b"GET /TOTVS_BROKER_QUERY/STATUS HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut nothing = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        browser.stream.read_to_end(&mut nothing),
    );
    assert!(read.await.is_ok() && nothing.is_empty(), "{nothing:?}");
    let page = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[]).await;
    assert_eq!(page.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_whose_client_shuts_its_sending_side_gets_the_whole_answer() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    for request in [
        &b"GET /totvs_broker_query HTTP/1.0\r\n\r\n"[..],
        b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD /TOTVS_BROKER_QUERY/PING HTTP/1.0\r\n\r\n",
    ] {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        client.write_all(request).await.unwrap();
        // What `printf ... | nc -q 2 host port` and shell health checks do.
        client.shutdown().await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(DEADLINE, client.read_to_end(&mut answer))
            .await
            .expect("answered in time")
            .expect("read the answer");
        let answer = String::from_utf8_lossy(&answer).to_string();
        // HTTP/1.0 requests are answered (the engine's status line says HTTP/1.1: RFC 9110 2.5).
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
            "{answer:?}"
        );
        if request.starts_with(b"GET /totvs") {
            let body = answer.split_once("\r\n\r\n").unwrap().1;
            let json: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(json["servers"][0]["server"], a.address().as_str());
        }
    }
    assert_eq!(a.accepted(), 0);
}

/// The real `nc` of a shell health check. Needs netcat-openbsd (`.ci/run` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nc (netcat-openbsd)"]
async fn nc_with_a_half_close_gets_the_whole_answer() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let port = broker.addr().port().to_string();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "printf 'GET /totvs_broker_query/PING HTTP/1.0\\r\\n\\r\\n' | nc -q 2 127.0.0.1 {port}"
            ))
            .output()
            .expect("run nc (install netcat-openbsd)")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The engine's status line says HTTP/1.1 to an HTTP/1.0 request too (RFC 9110 2.5).
    let ok = stdout.starts_with("HTTP/1.1 200") || stdout.starts_with("HTTP/1.0 200");
    assert!(
        ok && stdout.contains("OK: appbroker"),
        "nc printed {stdout:?}, stderr {:?}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_on_the_query_path_is_answered_405_and_never_forwarded() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    for method in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"] {
        let mut connection = HttpConnection::connect(broker.addr()).await;
        let answer = connection
            .request(
                method,
                "/TOTVS_BROKER_QUERY/PING",
                &[("Content-Length", "0")],
            )
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        assert_eq!(answer.status, 405, "{method}: {}", answer.text());
        assert_eq!(answer.header("allow"), Some("GET, HEAD"), "{method}");
    }
    // A POST with a body, as a form would send it.
    let answer = send_raw_request(
        broker.addr(),
        b"POST /TOTVS_BROKER_QUERY/CFG HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nx=1&y",
    )
    .await;
    assert_eq!(answer.status, 405, "{}", answer.text());
    assert_eq!(a.accepted(), 0, "no query reached the server");
    // Other paths are forwarded as they are, whatever the method.
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    client
        .write_all(b"POST /rest/api HTTP/1.1\n")
        .await
        .unwrap();
    let expected = b"a: POST /rest/api HTTP/1.1\n";
    assert_eq!(read_n(&mut client, expected.len()).await, expected);
}

/// Sends raw bytes and reads the one answer.
async fn send_raw_request(addr: SocketAddr, bytes: &[u8]) -> HttpResponse {
    let mut connection = HttpConnection::connect(addr).await;
    connection.stream.write_all(bytes).await.unwrap();
    connection.read_response(false).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_status_takes_a_percent_encoded_address() {
    let a = TestServer::start("a").await;
    let ini = ini_for(&[&a], "REMOTE_SERVER_02=::1 6543");
    let broker = InProcess::start(&ini).await;
    for path in [
        "/TOTVS_BROKER_QUERY/SERVERSTATUS/%5B::1%5D:6543",
        "/TOTVS_BROKER_QUERY/ServerStatus/%5b%3A%3A1%5d%3A6543",
        "/TOTVS_BROKER_QUERY/SERVERSTATUS/[::1]:6543",
    ] {
        let answer = http_get(broker.addr(), path, &[]).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        assert!(answer.text().contains("[::1]:6543"), "{path}");
    }
    let encoded_ipv4 = format!(
        "/TOTVS_BROKER_QUERY/SERVERSTATUS/127.0.0.1%3A{}",
        a.addr.port()
    );
    assert_eq!(
        http_get(broker.addr(), &encoded_ipv4, &[]).await.status,
        200
    );
    // A broken escape is simply no such server.
    let answer = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/SERVERSTATUS/%5", &[]).await;
    assert_eq!(answer.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_tightens_query_allow_holds_for_the_next_request_on_open_connections() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut connection = HttpConnection::connect(broker.addr()).await;
    let ping = connection
        .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
        .await
        .unwrap();
    assert_eq!(ping.status, 200);

    let reloaded = broker
        .reload(&ini_for(&[&a], "QUERY_ALLOW=10.0.0.0/8"))
        .await;
    assert!(
        reloaded.changes.iter().any(|c| c.contains("QUERY_ALLOW")),
        "{reloaded:?}"
    );

    let answer = connection
        .request("GET", "/TOTVS_BROKER_QUERY/JSON", &[])
        .await
        .unwrap();
    assert_eq!(answer.status, 403, "{}", answer.text());
    assert!(!answer.text().contains(&a.address()));
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(closed_by_broker(&mut connection.stream).await);
}

/// Two balancers: the first answers everyone, the second only 127.0.0.2.
fn two_balancers(a: &TestServer, b: &TestServer, dir_note: &str) -> String {
    format!(
        "[General]\nConsoleFile=@DIR@/{dir_note}.log\n\
         [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n\
         [BALANCE_WEB_SERVICES]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT2@\n\
         MONITORING_TYPE=DISABLED\nQUERY_ALLOW=127.0.0.2\nREMOTE_SERVER_01={}\n",
        a.ini(),
        b.ini()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cfg_and_status_show_only_what_the_client_may_see() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&two_balancers(&a, &b, "secret-name")).await;
    let config_path = broker.config_path.display().to_string();

    // 127.0.0.1 may query the first balancer only.
    let cfg = get_from(REFUSED, broker.addr(), "/TOTVS_BROKER_QUERY/CFG").await;
    assert_eq!(cfg.status, 200);
    let text = cfg.text();
    assert!(text.contains(&a.address().replace("127.0.0.1:", "127.0.0.1 ")));
    for hidden in [
        "BALANCE_WEB_SERVICES",
        &b.address().replace("127.0.0.1:", "127.0.0.1 "),
        "127.0.0.2",
        "secret-name",
        &config_path,
    ] {
        assert!(
            !text.contains(hidden),
            "CFG shows {hidden:?} to 127.0.0.1:\n{text}"
        );
    }
    let status = get_from(REFUSED, broker.addr(), "/TOTVS_BROKER_QUERY/STATUS").await;
    assert!(!status.text().contains("BALANCE_WEB_SERVICES"));
    let link = format!(":{}/TOTVS_BROKER_QUERY", broker.addr2().port());
    assert!(!status.text().contains(&link), "{}", status.text());

    // 127.0.0.2 may query both, so it sees everything from either port.
    let cfg = get_from(ALLOWED, broker.addr(), "/TOTVS_BROKER_QUERY/CFG").await;
    let text = cfg.text();
    for shown in [
        "BALANCE_WEB_SERVICES",
        &b.address().replace("127.0.0.1:", "127.0.0.1 "),
        "secret-name",
        &config_path,
    ] {
        assert!(
            text.contains(shown),
            "CFG hides {shown:?} from 127.0.0.2:\n{text}"
        );
    }
    let status = get_from(ALLOWED, broker.addr(), "/TOTVS_BROKER_QUERY/STATUS").await;
    assert!(status.text().contains("BALANCE_WEB_SERVICES"));
}

/// Polls READY until it answers `status`; returns the answer.
async fn ready_until(addr: SocketAddr, status: u16) -> HttpResponse {
    until(&format!("READY to answer {status}"), async || {
        let answer = http_get(addr, "/TOTVS_BROKER_QUERY/READY", &[]).await;
        if answer.status == status {
            return Ok(answer);
        }
        Err(format!("last: {} {}", answer.status, answer.text()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_answers_200_only_while_clients_can_be_served() {
    let mut a = TestServer::start("a").await;
    let ini = ini_for(&[&a], "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms")
        .replace("[General]\n", "[General]\nSHUTDOWN_GRACE=60s\n");
    let broker = InProcess::start(&ini).await;
    let ready = ready_until(broker.addr(), 200).await;
    assert!(ready.text().starts_with("READY"), "{}", ready.text());
    assert!(ready.text().contains("1 of 1 server"), "{}", ready.text());

    // Nothing behind the broker: READY says so, PING keeps its meaning.
    a.stop().await;
    let not_ready = ready_until(broker.addr(), 503).await;
    assert!(
        not_ready.text().starts_with("NOT READY") && not_ready.text().contains("no server"),
        "{}",
        not_ready.text()
    );
    let ping = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[]).await;
    assert_eq!(ping.status, 200);

    a.resume().await;
    ready_until(broker.addr(), 200).await;

    // Draining: not ready either, whatever the servers.
    broker.broker.shutdown();
    broker
        .events
        .wait_for("the drain", |e| *e == appbroker::Event::Draining)
        .await;
    let draining = ready_until(broker.addr(), 503).await;
    assert!(
        draining.text().contains("shutting down"),
        "{}",
        draining.text()
    );

    let commands = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/NOPE", &[]).await;
    assert!(commands.text().contains("READY"), "{}", commands.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_speaks_the_language_of_the_pages() {
    let a = TestServer::start("a").await;
    let ini =
        ini_for(&[&a], "MAX_CONNECTIONS=1").replace("[General]\n", "[General]\nLANGUAGE=pt-BR\n");
    let broker = InProcess::start(&ini).await;
    let ready = ready_until(broker.addr(), 200).await;
    assert!(ready.text().contains("1 de 1 servidor"), "{}", ready.text());
    // At MAX_CONNECTIONS new clients are closed at once: not ready.
    let (_held, _) = hold(broker.addr()).await;
    let full = ready_until(broker.addr(), 503).await;
    assert!(full.text().contains("MAX_CONNECTIONS"), "{}", full.text());
    assert!(full.text().contains("conexões"), "{}", full.text());
}
