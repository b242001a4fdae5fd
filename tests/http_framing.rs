//! What crosses the HTTP engine, and when a server connection is used again: the contract any
//! engine of the HTTP broker keeps, checked on the wire with raw sockets and exact bytes (the
//! harness's scripted server and raw client, [`Scripted`] and [`RawClient`]), through the real
//! broker started on an `appserver.ini`.
//!
//! - An answer that ends before its request was sent whole (the server answered before
//!   reading the body) closes its server connection, forwards nothing more of the body, and
//!   goes to the client with `Connection: close`: an attacker's body that is itself a request
//!   never reaches the next user of that connection. With `Expect: 100-continue`, no body
//!   follows a final status.
//! - `HTTP_RESPONSE_TIMEOUT` (504 before the head, the connection cut after),
//!   `HTTP_BODY_TIMEOUT` (408, the server connection closed; 300 stalled uploads hold no
//!   server connection past it) and `HTTP_TIMEOUTS_TO_QUARANTINE` (off by default; a
//!   `CONNECTION` check does not end its quarantine). An upgraded connection outlives both.
//! - A length beside `Transfer-Encoding: chunked` is dropped (RFC 9112 6.3).
//! - Informational answers passed on, and the protocol versions the engine of its own
//!   handles.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use appbroker::Event;
use harness::{
    ATTACKER_ANSWER, Answer, InProcess, RawClient, Reason, Scripted, get_of, http_ini, raw_request,
};

/// The ini for one `[BALANCE_HTTP]` over `server` with `extra` keys, on one worker thread, so
/// every request meets the same pool.
fn ini(server: SocketAddr, extra: &str) -> String {
    http_ini(&[server], extra).replacen("[General]\n", "[General]\nWORKERS=1\n", 1)
}

/// A scripted server, and a broker in front of it with `extra` keys (pages in Portuguese
/// when `portuguese`).
async fn start(extra: &str, portuguese: bool) -> (Scripted, InProcess) {
    let server = Scripted::start().await;
    let mut text = ini(server.addr, extra);
    if portuguese {
        text = text.replacen("[General]\n", "[General]\nLANGUAGE=pt-BR\n", 1);
    }
    let broker = InProcess::start(&text).await;
    (server, broker)
}

/// The value of the METRICS line that starts with `series`.
async fn metric(broker: SocketAddr, series: &str) -> String {
    let answer = raw_request(broker, &get_of("/TOTVS_BROKER_QUERY/METRICS")).await;
    let text = answer.text();
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .trim()
        .to_string()
}

/// `http_failures_total` of `kind` on the test's balancer.
async fn failures(broker: SocketAddr, kind: &str) -> String {
    let series =
        format!("appbroker_http_failures_total{{balancer=\"BALANCE_HTTP\",kind=\"{kind}\"}}");
    metric(broker, &series).await
}

/// The requests the broker finished, as its events say.
fn finished(broker: &InProcess) -> usize {
    broker.events.count(|e| matches!(e, Event::Request { .. }))
}

// ---- an answer before the body: the early-response desync -------------------------------

/// The start of a request that waits, in the server's parser, for the next bytes on its
/// connection: whoever sends them gets this request's answer.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: app.example\r\nX-Ignore: ";

/// Waits until the first server connection is closed, or idle in the broker's pool with
/// everything the attacker sent received.
async fn settled(broker: &InProcess, server: &Scripted) {
    let idle = format!(
        "appbroker_http_pool_idle_connections{{balancer=\"BALANCE_HTTP\",server=\"{}\"}}",
        server.addr
    );
    harness::eventually_async("the attacker's exchange settled", async || {
        let conn = server.conns()[0].clone();
        conn.ended
            || (conn.bytes.ends_with(SMUGGLED.as_bytes())
                && metric(broker.addr(), &idle).await == "1")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_never_reaches_the_next_user_of_its_server_connection() {
    let (server, broker) = start("HTTP_POOL_MAX_IDLE=1", false).await;
    // The attacker's head, then its body once the server has answered without reading it.
    let mut attacker = RawClient::connect(broker.addr()).await;
    let head = format!(
        "POST /early HTTP/1.1\r\nHost: app.example\r\nContent-Length: {}\r\n\r\n",
        SMUGGLED.len()
    );
    assert!(attacker.send(head.as_bytes()).await);
    let answer = attacker.answer().await.expect("the server's early answer");
    assert_eq!(answer.status, 401);
    assert_eq!(answer.text(), "denied");
    assert!(
        answer.closes(),
        "the answer says Connection: close: {answer:?}"
    );
    // The broker may have closed already; what it does with the body is what counts.
    let _ = attacker.send(SMUGGLED.as_bytes()).await;
    assert!(
        attacker.closed().await,
        "the attacker's connection is closed"
    );
    // The attacker's exchange settled: its server connection closed, or back in the pool.
    settled(&broker, &server).await;
    // Three victims, one after the other, each on a connection of its own.
    for n in 1..=3 {
        let answer = raw_request(broker.addr(), &get_of(&format!("/victim/{n}"))).await;
        assert!(
            !answer.text().contains(ATTACKER_ANSWER),
            "victim {n} got the attacker's answer: {answer:?}"
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.text(), format!("ok /victim/{n}"));
    }
    // The attacker's server connection was closed with nothing of the body sent on it.
    let early = server.heads_for("/early");
    assert_eq!(early.len(), 1);
    let conn = server.wait_closed(early[0].conn).await;
    assert_eq!(
        conn.bytes, early[0].head,
        "only the head reached the server"
    );
    assert!(server.heads_for("/smuggled").is_empty());
    // The victims shared one server connection (the pool works), not the attacker's.
    let victims: Vec<usize> = server
        .heads()
        .iter()
        .filter(|h| h.path.starts_with("/victim/"))
        .map(|h| h.conn)
        .collect();
    assert_eq!(victims.len(), 3);
    assert!(
        victims
            .iter()
            .all(|c| *c == victims[0] && *c != early[0].conn)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_expect_100_continue_no_body_follows_a_final_status() {
    let (server, broker) = start("HTTP_POOL_MAX_IDLE=1", false).await;
    let mut client = RawClient::connect(broker.addr()).await;
    let head = format!(
        "PUT /early-expect HTTP/1.1\r\nHost: app.example\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\n\r\n",
        SMUGGLED.len()
    );
    assert!(client.send(head.as_bytes()).await);
    let answer = client.answer().await.expect("the server's final answer");
    assert_eq!(answer.status, 401, "no 100 Continue first: {answer:?}");
    assert!(answer.closes(), "{answer:?}");
    // A client may send its body anyway after a final status: it goes nowhere.
    let _ = client.send(SMUGGLED.as_bytes()).await;
    assert!(client.closed().await);
    let early = server.heads_for("/early-expect");
    let conn = server.wait_closed(early[0].conn).await;
    assert_eq!(conn.bytes, early[0].head, "no body byte reached the server");
    let answer = raw_request(broker.addr(), &get_of("/after")).await;
    assert_eq!(answer.text(), "ok /after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_expect_100_continue_no_body_follows_a_final_status_while_its_answer_streams() {
    // The answer stalls after its first bytes, and is cut when HTTP_RESPONSE_TIMEOUT has
    // passed: the broker's wait for a server that ignores `Expect` (1 s) is long over by then.
    let extra = "HTTP_RESPONSE_TIMEOUT=3s";
    let (server, broker) = start(extra, false).await;
    let mut client = RawClient::connect(broker.addr()).await;
    let head = "PUT /stall-body HTTP/1.1\r\nHost: app.example\r\nContent-Length: 4\r\n\
                Expect: 100-continue\r\n\r\n";
    assert!(client.send(head.as_bytes()).await);
    let answer = client.head().await.expect("the head");
    assert_eq!(answer.status, 200, "no 100 Continue first: {answer:?}");
    assert!(answer.closes(), "{answer:?}");
    assert_eq!(client.bytes(10).await, b"0123456789");
    // The answer is streaming when the client sends its body anyway.
    assert!(client.send(b"body").await);
    assert!(client.closed().await);
    let conn = server.wait_closed(0).await;
    assert_eq!(
        conn.bytes,
        server.heads_for("/stall-body")[0].head,
        "no body byte reached the server"
    );
}

// ---- framing of the answer ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_beside_chunked_is_dropped_and_the_log_counts_what_the_client_got() {
    let server = Scripted::start().await;
    let broker = harness::Broker::start(&ini(server.addr, "LOG_REQUESTS=1")).await;
    let answer = raw_request(broker.addr(), &get_of("/cl-and-chunked")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-length"), None, "{answer:?}");
    assert_eq!(answer.text(), "hello");
    let line = broker.wait_for_log("path=/cl-and-chunked").await;
    assert!(
        line.contains("status=200 bytes_from_client=0 bytes_to_client=5 "),
        "{line}"
    );
    assert!(!line.contains("error="), "{line}");
}

/// A raw server of these tests' own that answers each request (heads only, kept alive) by
/// its path: `/no-content` a `204` with a `Content-Length: 6`; `/not-modified` a `304` with
/// `Content-Length: 6` and `Transfer-Encoding: chunked`; `/hints` a `103` with both, then
/// `200 ok`; `/lines-N` a `200 ok` of `N` header lines, the 201st a `Keep-Alive` (hop-by-hop:
/// the broker takes it out) when there are that many; anything else `200 ok`.
async fn framing_server() -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    let (addr, _) = harness::raw_origin(|mut stream, _| async move {
        loop {
            let head = harness::read_head(&mut stream).await;
            if !head.ends_with(b"\r\n\r\n") {
                return;
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let path = head.split(' ').nth(1).unwrap_or_default().to_string();
            let answer = match path.as_str() {
                "/no-content" => "HTTP/1.1 204 No Content\r\nContent-Length: 6\r\n\r\n".to_string(),
                "/not-modified" => "HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\n\
                                    Transfer-Encoding: chunked\r\nETag: \"v1\"\r\n\r\n"
                    .to_string(),
                "/hints" => "HTTP/1.1 103 Early Hints\r\nContent-Length: 0\r\n\
                             Transfer-Encoding: chunked\r\nLink: </a.css>; rel=preload\r\n\r\n\
                             HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    .to_string(),
                p if p.starts_with("/lines-") => {
                    lines_answer(p["/lines-".len()..].parse().unwrap())
                }
                _ => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string(),
            };
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    addr
}

/// A `200 ok` of `lines` header lines: its length, a `Keep-Alive` as the 201st when there are
/// that many, the rest `X-Line-<i>`.
fn lines_answer(lines: usize) -> String {
    let mut answer = String::from("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n");
    for i in 1..lines {
        if i == 200 {
            answer.push_str("Keep-Alive: timeout=5\r\n");
        } else {
            answer.push_str(&format!("X-Line-{i}: {i}\r\n"));
        }
    }
    answer.push_str("\r\nok");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_content_and_interim_answers_carry_no_framing_lines() {
    let broker = InProcess::start(&ini(framing_server().await, "")).await;
    let mut client = RawClient::connect(broker.addr()).await;
    // A 204's length is no body's: not passed on (RFC 9110 8.6, 15.3.5).
    assert!(client.send(&get_of("/no-content")).await);
    let answer = client.answer().await.expect("204");
    assert_eq!(answer.status, 204, "{answer:?}");
    assert_eq!(answer.header("content-length"), None, "{answer:?}");
    assert_eq!(answer.header("transfer-encoding"), None, "{answer:?}");
    // A 304's length tells the length of the representation: kept, as nginx keeps it; its
    // coding is not.
    assert!(client.send(&get_of("/not-modified")).await);
    let answer = client.answer().await.expect("304");
    assert_eq!(answer.status, 304, "{answer:?}");
    assert_eq!(answer.header("content-length").as_deref(), Some("6"));
    assert_eq!(answer.header("transfer-encoding"), None, "{answer:?}");
    assert_eq!(answer.header("etag").as_deref(), Some("\"v1\""));
    // An interim answer has neither.
    assert!(client.send(&get_of("/hints")).await);
    let hints = client.answer().await.expect("103");
    assert_eq!(hints.status, 103, "{hints:?}");
    assert_eq!(hints.header("content-length"), None, "{hints:?}");
    assert_eq!(hints.header("transfer-encoding"), None, "{hints:?}");
    assert!(hints.header("link").is_some(), "{hints:?}");
    let last = client.answer().await.expect("200");
    assert_eq!((last.status, last.text().as_str()), (200, "ok"));
    // The connection is still in step: the next answer is the next request's.
    assert!(client.send(&get_of("/after")).await);
    let after = client.answer().await.expect("200");
    assert_eq!((after.status, after.text().as_str()), (200, "ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_up_to_255_header_lines_passes_whole() {
    let broker = InProcess::start(&ini(framing_server().await, "")).await;
    let mut client = RawClient::connect(broker.addr()).await;
    for lines in [150, 255] {
        assert!(client.send(&get_of(&format!("/lines-{lines}"))).await);
        let answer = client.answer().await.expect("an answer");
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (200, "ok"),
            "{lines} lines"
        );
        let head = String::from_utf8_lossy(&answer.head).into_owned();
        let passed = head.lines().filter(|l| l.starts_with("X-Line-")).count();
        let sent = if lines > 200 { lines - 2 } else { lines - 1 };
        assert_eq!(passed, sent, "{lines} lines: {head}");
        // Lines past the 128th are edited too: the hop-by-hop one is taken out.
        assert_eq!(answer.header("keep-alive"), None, "{lines} lines");
        assert!(
            head.contains("X-Line-254: 254\r\n") || lines < 255,
            "{head}"
        );
    }
    // Past 255 lines, the answer is refused (502), as one past 64 KiB is.
    let answer = raw_request(broker.addr(), &get_of("/lines-256")).await;
    assert_eq!(answer.status, 502, "{answer:?}");
}

// ---- HTTP_RESPONSE_TIMEOUT ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_a_504_in_the_page_language() {
    let extra = "HTTP_RESPONSE_TIMEOUT=300ms";
    let (server, broker) = start(extra, true).await;
    let mut client = RawClient::connect(broker.addr()).await;
    assert!(client.send(&get_of("/hang")).await);
    let answer = client.answer().await.expect("a 504");
    assert_eq!(answer.status, 504, "{answer:?}");
    assert!(
        answer.text().contains("Tempo esgotado"),
        "{}",
        answer.text()
    );
    // The silent server's connection is not kept: its next answer could be anyone's.
    server.wait_closed(0).await;
    // The client's connection stays usable.
    assert!(client.send(&get_of("/next")).await);
    let next = client.answer().await.expect("the next answer");
    assert_eq!(next.text(), "ok /next");
    assert_eq!(failures(broker.addr(), "server_timeout").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_silent_midway_through_its_answer_has_the_client_connection_cut() {
    let (server, broker) = start("HTTP_RESPONSE_TIMEOUT=300ms", false).await;
    let mut client = RawClient::connect(broker.addr()).await;
    assert!(client.send(&get_of("/stall-body")).await);
    let answer = client.answer().await.expect("the head and what came");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-length").as_deref(), Some("100"));
    // Cut after the ten bytes that came: never passed on as a whole answer.
    assert_eq!(answer.text(), "0123456789");
    assert!(client.closed().await);
    server.wait_closed(0).await;
    assert_eq!(failures(broker.addr(), "server_timeout").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_outlives_the_http_timeouts() {
    let (_server, broker) = start(TUNNEL_KEYS, false).await;
    let mut client = RawClient::connect(broker.addr()).await;
    let upgrade = "GET /upgrade HTTP/1.1\r\nHost: app.example\r\nConnection: upgrade\r\n\
                   Upgrade: echo\r\n\r\n";
    assert!(client.send(upgrade.as_bytes()).await);
    assert_eq!(client.head().await.expect("the 101").status, 101);
    assert!(client.send(b"ping").await);
    assert_eq!(client.bytes(4).await, b"ping");
    // Silent both ways for several times both timeouts: IDLE_TIMEOUT (off) governs a
    // tunnel, not the HTTP timeouts. This wait is what is tested, not a synchronisation.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(client.send(b"pong").await);
    assert_eq!(client.bytes(4).await, b"pong");
}

/// The HTTP timeouts at their shortest, for the tunnel's test; the scripted server switches
/// to `echo`, which `HTTP_UPGRADE_PROTOCOLS` must allow.
const TUNNEL_KEYS: &str =
    "HTTP_RESPONSE_TIMEOUT=100ms\nHTTP_BODY_TIMEOUT=100ms\nHTTP_UPGRADE_PROTOCOLS=echo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_is_quarantined_after_n_timeouts_in_a_row_and_not_before() {
    let extra = "HTTP_RESPONSE_TIMEOUT=200ms\nHTTP_TIMEOUTS_TO_QUARANTINE=3\nQUARANTINE_TIME=600";
    let (server, broker) = start(extra, true).await;
    let address = server.addr.to_string();
    // Two timeouts, an answer, two timeouts: never three in a row.
    for (n, path) in ["/hang", "/hang", "/ok", "/hang", "/hang"]
        .iter()
        .enumerate()
    {
        let answer = raw_request(broker.addr(), &get_of(path)).await;
        let wanted = if *path == "/hang" { 504 } else { 200 };
        assert_eq!(answer.status, wanted, "{path}: {answer:?}");
        broker
            .events
            .wait_for_count("the request finished", n + 1, |e| {
                matches!(e, Event::Request { .. })
            })
            .await;
        assert!(
            broker.events.quarantines(&address).is_empty(),
            "after {path}"
        );
    }
    // The third in a row.
    assert_eq!(
        raw_request(broker.addr(), &get_of("/hang")).await.status,
        504
    );
    let quarantine = broker
        .events
        .wait_for_quarantine(&address, Reason::Timeout)
        .await;
    assert_eq!(quarantine.error, "did not answer 3 requests within 200ms");
    assert_eq!(broker.events.quarantines(&address).len(), 1);
    // Shown as any health quarantine: the page's Motivos cell and the JSON.
    let page = raw_request(broker.addr(), &get_of("/TOTVS_BROKER_QUERY/STATUS")).await;
    let page = page.text();
    assert!(page.contains("<th>Motivos</th>"), "{page}");
    assert!(page.contains("<td>tempo de resposta</td>"), "{page}");
    assert!(
        page.contains("não respondeu a 3 requisições em 200ms"),
        "{page}"
    );
    let json = raw_request(broker.addr(), &get_of("/TOTVS_BROKER_QUERY/JSON")).await;
    let json: serde_json::Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(json["servers"][0]["reason"], "timeout", "{json:#}");
    assert_eq!(
        json["servers"][0]["last_error"],
        "did not answer 3 requests within 200ms"
    );
    assert_eq!(json["servers"][0]["inquarantine"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_connect_check_does_not_end_a_timeout_quarantine() {
    let extra = "HTTP_RESPONSE_TIMEOUT=100ms\nHTTP_TIMEOUTS_TO_QUARANTINE=1\n\
                 QUARANTINE_TIME=600\nMONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms";
    let (server, broker) = start(extra, false).await;
    let address = server.addr.to_string();
    assert_eq!(
        raw_request(broker.addr(), &get_of("/hang")).await.status,
        504
    );
    broker
        .events
        .wait_for_quarantine(&address, Reason::Timeout)
        .await;
    // The port accepts, so CONNECTION checks pass: they prove nothing of the answers.
    let passed = |e: &Event| matches!(e, Event::CheckPassed { server, .. } if *server == address);
    let before = broker.events.count(passed);
    broker
        .events
        .wait_for_count("three more passing checks", before + 3, passed)
        .await;
    assert_eq!(
        broker
            .events
            .count(|e| harness::is_any_release_of(e, &address)),
        0,
        "{}",
        broker.events.text()
    );
    assert!(broker.state().servers[0].quarantine.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_quarantine_no_server_by_default() {
    let (server, broker) = start("HTTP_RESPONSE_TIMEOUT=100ms", false).await;
    for n in 1..=5 {
        assert_eq!(
            raw_request(broker.addr(), &get_of("/hang")).await.status,
            504
        );
        broker
            .events
            .wait_for_count("the request finished", n, |e| {
                matches!(e, Event::Request { .. })
            })
            .await;
    }
    assert_eq!(finished(&broker), 5);
    assert!(
        broker
            .events
            .quarantines(&server.addr.to_string())
            .is_empty()
    );
    assert_eq!(failures(broker.addr(), "server_timeout").await, "5");
}

// ---- HTTP_BODY_TIMEOUT ----------------------------------------------------------------------

/// Sends a head announcing ten bytes of body and the first of them, and waits until the
/// server has that byte: the body then stalls.
async fn stalled_upload(broker: SocketAddr, server: &Scripted, path: &str) -> RawClient {
    let mut client = RawClient::connect(broker).await;
    let head = format!("POST {path} HTTP/1.1\r\nHost: app.example\r\nContent-Length: 10\r\n\r\n");
    assert!(client.send(head.as_bytes()).await);
    assert!(client.send(b"x").await);
    let accepted = server.accepted();
    harness::eventually("the first byte of the body at the server", || {
        server
            .conns()
            .get(accepted.saturating_sub(1))
            .is_some_and(|c| c.bytes.ends_with(b"\r\n\r\nx"))
    })
    .await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_body_timeout_is_a_408_and_its_server_connection_closed() {
    let (server, broker) = start("HTTP_BODY_TIMEOUT=300ms", false).await;
    let mut client = stalled_upload(broker.addr(), &server, "/upload").await;
    let answer = client.answer().await.expect("a 408");
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(answer.text().contains("408"), "a page: {}", answer.text());
    assert!(answer.closes());
    assert!(client.closed().await);
    server.wait_closed(0).await;
    assert_eq!(failures(broker.addr(), "client_body_timeout").await, "1");
    assert_eq!(failures(broker.addr(), "server_timeout").await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_stalled_after_the_answer_began_closes_the_connection() {
    let (server, broker) = start("HTTP_BODY_TIMEOUT=300ms", false).await;
    let mut client = stalled_upload(broker.addr(), &server, "/stall-body").await;
    let answer = client.answer().await.expect("the head and what came");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), "0123456789", "cut short");
    assert!(client.closed().await);
    server.wait_closed(0).await;
    assert_eq!(failures(broker.addr(), "client_body_timeout").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_server_connection_past_the_body_timeout() {
    const CLIENTS: usize = 300;
    let (server, broker) = start("HTTP_BODY_TIMEOUT=500ms", false).await;
    let addr = broker.addr();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            tokio::spawn(async move {
                let mut client = RawClient::connect(addr).await;
                let head =
                    "POST /upload HTTP/1.1\r\nHost: app.example\r\nContent-Length: 1000\r\n\r\nx";
                assert!(client.send(head.as_bytes()).await);
                let answer = client.answer().await.expect("an answer");
                (answer.status, client.closed().await)
            })
        })
        .collect();
    for client in clients {
        assert_eq!(client.await.unwrap(), (408, true));
    }
    // Every server connection those bodies held is closed, none pooled.
    harness::eventually("every server connection closed", || server.open() == 0).await;
    assert!(
        server.accepted() <= CLIENTS,
        "{} accepted",
        server.accepted()
    );
    assert_eq!(
        failures(addr, "client_body_timeout").await,
        CLIENTS.to_string()
    );
}

// ---- what the engine of its own does (hyper could not) ----------------------------------

/// What the engine of its own does and hyper could not: the client gets the server's 1xx
/// answers, an HTTP/1.0 request is answered with an `HTTP/1.1` status line (RFC 9110 §2.5),
/// `HTTP/1.2` is served as 1.1, and another major version is a 505.
mod the_engine_of_its_own {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn informational_answers_reach_the_client_before_the_final_one() {
        let (_server, broker) = start("", false).await;
        let mut client = RawClient::connect(broker.addr()).await;
        assert!(client.send(&get_of("/informational")).await);
        let processing = client.answer().await.expect("102");
        assert_eq!(processing.status_line, "HTTP/1.1 102 Processing");
        let hints = client.answer().await.expect("103");
        assert_eq!(hints.status, 103);
        assert_eq!(
            hints.header("link").as_deref(),
            Some("</app.css>; rel=preload")
        );
        let last = client.answer().await.expect("the final answer");
        assert_eq!((last.status, last.text().as_str()), (200, "final"));
    }

    /// The answer to `request`, alone on a connection to a broker of its own, and the server.
    async fn answer_to(request: &[u8]) -> (Scripted, Answer) {
        let (server, broker) = start("", false).await;
        let answer = raw_request(broker.addr(), request).await;
        (server, answer)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http_1_0_request_is_answered_with_an_http_1_1_status_line() {
        let (_server, answer) = answer_to(b"GET /old HTTP/1.0\r\nHost: app.example\r\n\r\n").await;
        assert_eq!(answer.status_line, "HTTP/1.1 200 OK");
        assert_eq!(answer.text(), "ok /old");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http_1_2_is_served_as_http_1_1() {
        let (server, answer) = answer_to(b"GET /newer HTTP/1.2\r\nHost: app.example\r\n\r\n").await;
        assert_eq!(answer.status_line, "HTTP/1.1 200 OK");
        assert_eq!(answer.text(), "ok /newer");
        let head = server.heads_for("/newer")[0].text();
        assert!(head.starts_with("GET /newer HTTP/1.1\r\n"), "{head}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http_2_0_on_an_http_1_connection_is_a_505() {
        let (server, answer) = answer_to(b"GET /two HTTP/2.0\r\nHost: app.example\r\n\r\n").await;
        assert_eq!(answer.status, 505, "{answer:?}");
        assert!(server.heads().is_empty());
    }
}
