//! The HTTP engine against hostile servers and clients, on the wire with raw sockets (the
//! harness's scripted server and raw client) through the real broker: one user's answer never
//! reaches another whatever a server does, and every buffer and wait between a server and a
//! client is bounded.
//!
//! - A pooled server connection is never handed on with a byte waiting on it: an answer a
//!   server sends unasked (after its asked one, or to a body it took for a request: the CL.0
//!   gadget) closes the connection, on plain and TLS connections alike.
//! - An answer whose head comes before the request was sent whole closes its server
//!   connection, however long the answer streams and however the rest of the body went.
//! - Endless interim answers (`103`) from a server to a client that does not read hold a
//!   bounded memory, and past 32 heads the client gets a 502.
//! - `HTTP_BODY_TIMEOUT` and `HTTP_RESPONSE_TIMEOUT` bound silences, not transfers: a
//!   trickle both ways goes through whole, and streaming answers put no server in quarantine.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use harness::{
    ATTACKER_ANSWER, EARLY_SLOW_LENGTH, InProcess, RawClient, Scripted, eventually, get_of,
    http_ini, raw_request,
};
use tokio_rustls::TlsAcceptor;

/// The ini for one `[BALANCE_HTTP]` over `server` with `extra` keys, on one worker thread, so
/// every request meets the same pool.
fn ini(server: SocketAddr, extra: &str) -> String {
    http_ini(&[server], extra).replacen("[General]\n", "[General]\nWORKERS=1\n", 1)
}

/// A TLS acceptor with a self-signed certificate for `localhost`.
fn acceptor() -> TlsAcceptor {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(appbroker::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

/// A scripted server, plain or TLS, and a broker in front of it (over TLS with
/// `SSL_ENCRYPT_UPSTREAM=1`, unverified: the certificate is the test's own) with `extra`.
async fn start(tls: bool, extra: &str) -> (Scripted, InProcess) {
    let server = if tls {
        Scripted::start_tls(acceptor()).await
    } else {
        Scripted::start().await
    };
    let upstream = if tls {
        "SSL_ENCRYPT_UPSTREAM=1\nSSL_UPSTREAM_VERIFY=0\n"
    } else {
        ""
    };
    let broker = InProcess::start(&ini(server.addr, &format!("{upstream}{extra}"))).await;
    (server, broker)
}

/// Requests of `victims` on connections of their own, one after the other: each must get its
/// own answer, never the attacker's.
async fn victims_get_their_own(broker: &InProcess, victims: usize) {
    for n in 1..=victims {
        let answer = raw_request(broker.addr(), &get_of(&format!("/victim/{n}"))).await;
        assert!(
            !answer.text().contains(ATTACKER_ANSWER),
            "victim {n} got the attacker's answer: {answer:?}"
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.text(), format!("ok /victim/{n}"));
    }
}

/// An answer the server sends after the one asked for: the connection it waits on is never
/// pooled or handed to a victim.
async fn an_unasked_answer_never_reaches_the_next_user(tls: bool) {
    let (server, broker) = start(tls, "HTTP_POOL_MAX_IDLE=4").await;
    let mut attacker = RawClient::connect(broker.addr()).await;
    assert!(attacker.send(&get_of("/double")).await);
    let answer = attacker.answer().await.expect("the asked answer");
    assert_eq!(answer.text(), "ok /double");
    eventually("the server's unasked answer written", || {
        server.unasked() == 1
    })
    .await;
    // The attacker goes on on its connection too: it must not get a victim's answer either.
    assert!(attacker.send(&get_of("/attacker/2")).await);
    let answer = attacker
        .answer()
        .await
        .expect("the attacker's second answer");
    assert_eq!(answer.text(), "ok /attacker/2", "{answer:?}");
    victims_get_their_own(&broker, 4).await;
    let double = server.heads_for("/double");
    server.wait_closed(double[0].conn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_answer_closes_its_plain_server_connection() {
    an_unasked_answer_never_reaches_the_next_user(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_answer_closes_its_tls_server_connection() {
    an_unasked_answer_never_reaches_the_next_user(true).await;
}

/// A server that ignores a GET's `Content-Length` (the CL.0 gadget) answers the body as a
/// request of its own: that answer never reaches a victim.
async fn a_body_taken_for_a_request_never_answers_a_victim(tls: bool) {
    let (server, broker) = start(tls, "HTTP_POOL_MAX_IDLE=4").await;
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: app.example\r\n\r\n";
    let request = format!(
        "GET /ignore-length HTTP/1.1\r\nHost: app.example\r\nContent-Length: {}\r\n\r\n{smuggled}",
        smuggled.len()
    );
    let answer = raw_request(broker.addr(), request.as_bytes()).await;
    assert_eq!(answer.text(), "ok /ignore-length");
    eventually("the smuggled request answered by the server", || {
        server.unasked() == 1
    })
    .await;
    victims_get_their_own(&broker, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smuggled_answer_closes_its_plain_server_connection() {
    a_body_taken_for_a_request_never_answers_a_victim(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smuggled_answer_closes_its_tls_server_connection() {
    a_body_taken_for_a_request_never_answers_a_victim(true).await;
}

/// The start of a request that waits, in the server's parser, for the next bytes on its
/// connection: whoever sends them gets this request's answer.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: app.example\r\nX-Ignore: ";

/// A long answer from the head alone, while the body (a request of the attacker's) is sent
/// whole before it ends: the server connection is closed at the end, never pooled.
async fn a_long_early_answer_closes_its_server_connection(tls: bool) {
    let (server, broker) = start(tls, "HTTP_POOL_MAX_IDLE=4").await;
    let mut attacker = RawClient::connect(broker.addr()).await;
    let head = format!(
        "POST /early-slow HTTP/1.1\r\nHost: app.example\r\nContent-Length: {}\r\n\r\n",
        SMUGGLED.len()
    );
    assert!(attacker.send(head.as_bytes()).await);
    let answer = attacker.head().await.expect("the early answer's head");
    assert_eq!(answer.status, 401);
    assert!(answer.closes(), "Connection: close: {answer:?}");
    // The body goes while the answer streams.
    assert!(attacker.send(SMUGGLED.as_bytes()).await);
    let body = attacker.bytes(EARLY_SLOW_LENGTH).await;
    assert_eq!(body.len(), EARLY_SLOW_LENGTH);
    assert!(attacker.closed().await, "the attacker's connection closes");
    let early = server.heads_for("/early-slow");
    server.wait_closed(early[0].conn).await;
    victims_get_their_own(&broker, 3).await;
    assert!(
        server
            .heads()
            .iter()
            .filter(|h| h.path.starts_with("/victim/"))
            .all(|h| h.conn != early[0].conn),
        "no victim on the attacker's server connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_early_answer_closes_its_plain_server_connection() {
    a_long_early_answer_closes_its_server_connection(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_early_answer_closes_its_tls_server_connection() {
    a_long_early_answer_closes_its_server_connection(true).await;
}

/// Waits `ms` milliseconds: the pace of a trickling peer, not a synchronisation.
async fn pace(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The resident memory of this process (the broker runs in it), in bytes. Fails the test
/// when `/proc` cannot tell: a bound that reads 0 would hold anything.
fn rss() -> u64 {
    harness::status_bytes("self", "VmRSS")
}

/// A server's endless `103`s to a client that does not read: the broker's memory stays
/// bounded, the server connection is closed after 32 of them, and the client, reading at
/// last, finds at most 32 interim answers (those that came before the 33rd was read) and then
/// a 502 on a closing connection.
async fn endless_interim_answers_are_bounded(request: &[u8], forwarded: bool) {
    let (server, broker) = start(false, "").await;
    let before = rss();
    let mut client = RawClient::connect(broker.addr()).await;
    assert!(client.send(request).await);
    harness::until("the flood to end", async || {
        let grown = rss().saturating_sub(before);
        assert!(
            grown < 64 << 20,
            "the broker's memory grew by {grown} bytes"
        );
        let ended = server.conns().first().is_some_and(|c| c.ended);
        ended.then_some(()).ok_or("")
    })
    .await;
    let mut interim = 0;
    let last = loop {
        let answer = client.answer().await.expect("an answer");
        if answer.status != 103 {
            break answer;
        }
        interim += 1;
    };
    assert_eq!(last.status, 502, "{last:?}");
    assert!(last.closes(), "{last:?}");
    assert!(client.closed().await);
    if forwarded {
        assert!(interim <= 32, "{interim} interim answers");
    } else {
        assert_eq!(interim, 0, "an HTTP/1.0 client is sent none");
    }
    assert!(server.interim() >= 32, "{} sent", server.interim());
    let failures = broker.events.count(|e| {
        matches!(
            e,
            appbroker::Event::Request {
                status: Some(502),
                ..
            }
        )
    });
    assert_eq!(failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_interim_answers_to_a_client_that_does_not_read_are_bounded() {
    endless_interim_answers_are_bounded(&get_of("/interim-flood"), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_client_is_held_to_the_same_bound_of_interim_answers() {
    let request = b"GET /interim-flood HTTP/1.0\r\nHost: app.example\r\n\r\n";
    endless_interim_answers_are_bounded(request, false).await;
}

/// An upload of `length` bytes trickled a byte every `every_ms`, under `HTTP_BODY_TIMEOUT`
/// of `limit`: the server must get it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_for_three_times_the_body_timeout_goes_through_whole() {
    let (server, broker) = start(false, "HTTP_BODY_TIMEOUT=1s").await;
    let mut client = RawClient::connect(broker.addr()).await;
    let body = b"abcdefghijkl";
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: app.example\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    assert!(client.send(head.as_bytes()).await);
    // 12 bytes, one each 250 ms: 3 s, three times the limit.
    for byte in body {
        pace(250).await;
        assert!(client.send(&[*byte]).await, "the broker cut the upload");
    }
    let answer = client.answer().await.expect("the server's answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.text(), "ok /upload");
    let received = &server.conns()[0].bytes;
    assert!(received.ends_with(body), "the server got it whole");
}

/// Two answers trickled a byte every 100 ms (3 s each, three times `HTTP_RESPONSE_TIMEOUT`)
/// arrive whole, and under `HTTP_TIMEOUTS_TO_QUARANTINE=2` they put no server in quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_trickled_for_three_times_the_response_timeout_arrive_whole() {
    let extra = "HTTP_RESPONSE_TIMEOUT=1s\nHTTP_TIMEOUTS_TO_QUARANTINE=2";
    let (server, broker) = start(false, extra).await;
    let download = || async {
        let answer = raw_request(broker.addr(), &get_of("/trickle/100")).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.text(), "abcdefghijklmnopqrstuvwxyz0123", "whole");
    };
    tokio::join!(download(), download());
    let address = server.addr.to_string();
    assert!(broker.events.quarantines(&address).is_empty());
    assert_eq!(broker.state().servers[0].quarantine, None, "no quarantine");
}

/// The access line of an upload cut by `HTTP_BODY_TIMEOUT` says what of its body was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_upload_is_logged_with_the_bytes_read() {
    let server = Scripted::start().await;
    let text = ini(server.addr, "LOG_REQUESTS=1\nHTTP_BODY_TIMEOUT=300ms");
    let broker = harness::Broker::start(&text).await;
    let mut client = RawClient::connect(broker.addr()).await;
    let head = "POST /upload HTTP/1.1\r\nHost: app.example\r\nContent-Length: 10\r\n\r\n";
    assert!(client.send(head.as_bytes()).await);
    assert!(client.send(b"abc").await);
    let answer = client.answer().await.expect("a 408");
    assert_eq!(answer.status, 408, "{answer:?}");
    let line = broker.wait_for_log("path=/upload").await;
    assert!(line.contains("status=408 bytes_from_client=3 "), "{line}");
}

/// A connection that sends nothing, opened with the standard library's blocking sockets so
/// that whether the broker closed it can be read without waiting.
fn silent(broker: SocketAddr) -> std::net::TcpStream {
    let stream = std::net::TcpStream::connect(broker).unwrap();
    stream.set_nonblocking(true).unwrap();
    stream
}

/// Whether the broker closed `stream` (an end of stream or a reset), without waiting.
fn closed_by_broker(mut stream: &std::net::TcpStream) -> bool {
    use std::io::Read;
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// One address holding 60 silent connections under `MAX_CONNECTIONS_PER_CLIENT=3` and
/// `MAX_CONNECTIONS=20`: its connections over the limit take no place; 8 of them wait to be
/// told 503, the rest are closed at once; another client is served all the while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_over_its_limit_never_fills_the_balancer() {
    let extra = "MAX_CONNECTIONS=20\nMAX_CONNECTIONS_PER_CLIENT=3";
    let (_server, broker) = start(false, extra).await;
    let flood: Vec<_> = (0..60).map(|_| silent(broker.addr())).collect();
    harness::until("the refusals past 8 closed", async || {
        let closed = flood.iter().filter(|s| closed_by_broker(s)).count();
        if closed == 60 - 3 - 8 {
            return Ok(());
        }
        assert!(
            closed < 49,
            "{closed} closed: more than the refusals past 8"
        );
        Err(format!("{closed} closed"))
    })
    .await;
    // Another client, from another address, is served.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = other.connect(broker.addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut other, &get_of("/other"))
        .await
        .unwrap();
    let mut answer = vec![0u8; 256];
    let n = tokio::io::AsyncReadExt::read(&mut other, &mut answer)
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.ends_with("ok /other"), "{answer}");
    // The silent connections within the limit hold no place either: none was counted.
    assert_eq!(
        broker.state().active,
        1,
        "the other client's connection only"
    );
    // A refused connection still open is told why once it asks.
    let mut waiting = flood
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| (i >= 3 && !closed_by_broker(&s)).then_some(s));
    let mut refused = tokio::net::TcpStream::from_std(waiting.next().unwrap()).unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut refused, &get_of("/refused"))
        .await
        .unwrap();
    let mut page = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut refused, &mut page)
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(page.starts_with("HTTP/1.1 503 "), "{page}");
    assert!(page.contains("Retry-After: "), "{page}");
}

/// The value of `field` in an HTTP balancer's TOTVS JSON.
async fn json_field(broker: &InProcess, field: &str) -> serde_json::Value {
    let answer = raw_request(broker.addr(), &get_of("/TOTVS_BROKER_QUERY/JSON")).await;
    let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    json[field].clone()
}

/// Queries on an HTTP port are no clients: they move neither the accepted count nor the last
/// connection's time, and take no `MAX_CONNECTIONS` place; the first forwarded request does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_on_an_http_port_are_not_counted_as_clients() {
    let (_server, broker) = start(false, "").await;
    let before = json_field(&broker, "totalConnectionsHistory").await;
    for _ in 0..3 {
        assert_eq!(json_field(&broker, "totalConnectionsHistory").await, before);
    }
    assert_eq!(before, 0);
    let state = broker.state();
    assert_eq!((state.accepted, state.active), (0, 0));
    assert_eq!(state.last_connection_wall_ms, 0);
    // A client that asks a query on its connection first is counted at its first forwarded
    // request, once.
    let mut client = RawClient::connect(broker.addr()).await;
    assert!(client.send(&get_of("/TOTVS_BROKER_QUERY/PING")).await);
    assert_eq!(client.answer().await.unwrap().status, 200);
    assert_eq!(broker.state().accepted, 0);
    for n in 0..2 {
        assert!(client.send(&get_of(&format!("/app/{n}"))).await);
        assert_eq!(
            client.answer().await.unwrap().text(),
            format!("ok /app/{n}")
        );
    }
    let state = broker.state();
    assert_eq!((state.accepted, state.active), (1, 1));
    assert_ne!(state.last_connection_wall_ms, 0);
}

/// Query connections on an HTTP port are held to `QUERY_MAX_CONNECTIONS`, as on a TCP port:
/// an idle one gives its place to a new query, and closes unanswered when it asks again (as any
/// kept-alive connection its server closed: its client asks again on a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_connections_on_an_http_port_are_held_to_query_max_connections() {
    let (_server, broker) = start(false, "QUERY_MAX_CONNECTIONS=1").await;
    let mut first = RawClient::connect(broker.addr()).await;
    assert!(first.send(&get_of("/TOTVS_BROKER_QUERY/PING")).await);
    assert_eq!(first.answer().await.unwrap().status, 200);
    // Idle now: its place goes to the next query, whose connection stays open.
    let mut second = RawClient::connect(broker.addr()).await;
    assert!(second.send(&get_of("/TOTVS_BROKER_QUERY/PING")).await);
    assert_eq!(second.answer().await.unwrap().status, 200);
    assert!(first.send(&get_of("/TOTVS_BROKER_QUERY/PING")).await);
    assert!(first.closed().await, "closed with nothing sent");
    // The one holding the place asks on.
    assert!(second.send(&get_of("/TOTVS_BROKER_QUERY/PING")).await);
    assert_eq!(second.answer().await.unwrap().status, 200);
}

/// A query on an HTTP port is held to the query interface's limits, as on a TCP port: a
/// request line over 8 KiB is a 414 and a head over 16 KiB a 431 (both close), where a request
/// forwarded to a server may have 16 and 64 KiB; a query connection waits 10 s at most for
/// its next head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_on_an_http_port_is_held_to_the_query_limits() {
    let (server, broker) = start(false, "").await;
    let long = format!("/TOTVS_BROKER_QUERY/PING?x={}", "y".repeat(9 * 1024));
    let mut client = RawClient::connect(broker.addr()).await;
    assert!(client.send(&get_of(&long)).await);
    let answer = client.answer().await.unwrap();
    assert_eq!(answer.status, 414, "{answer:?}");
    assert!(answer.closes() && client.closed().await, "{answer:?}");
    let mut head = get_of("/TOTVS_BROKER_QUERY/PING");
    head.truncate(head.len() - 2);
    for i in 0..20 {
        head.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "z".repeat(1000)).as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    assert_eq!(raw_request(broker.addr(), &head).await.status, 431);
    // Under the limits it is answered; a request for a server may be longer.
    let under = format!("/TOTVS_BROKER_QUERY/PING?x={}", "y".repeat(7 * 1024));
    assert_eq!(
        raw_request(broker.addr(), &get_of(&under)).await.status,
        200
    );
    let app = format!("/app?x={}", "y".repeat(9 * 1024));
    assert_eq!(raw_request(broker.addr(), &get_of(&app)).await.status, 200);
    assert!(
        server
            .heads()
            .iter()
            .all(|r| !r.path.contains("TOTVS_BROKER_QUERY"))
    );
    // An idle query connection is closed once its 10 s are over (HTTP_REQUEST_TIMEOUT is 30 s).
    let mut idle = RawClient::connect(broker.addr()).await;
    assert!(idle.send(&get_of("/TOTVS_BROKER_QUERY/PING")).await);
    assert_eq!(idle.answer().await.unwrap().status, 200);
    let since = std::time::Instant::now();
    assert!(idle.closed().await);
    let waited = since.elapsed();
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(20)).contains(&waited),
        "{waited:?}"
    );
}

/// The access line of a query says the bytes of the page it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_is_logged_with_the_bytes_it_sent() {
    let server = Scripted::start().await;
    let broker = harness::Broker::start(&ini(server.addr, "LOG_REQUESTS=1")).await;
    let answer = raw_request(broker.addr(), &get_of("/TOTVS_BROKER_QUERY/JSON")).await;
    let line = broker.wait_for_log("path=/TOTVS_BROKER_QUERY/JSON").await;
    let sent = format!("bytes_to_client={} ", answer.body.len());
    assert!(line.contains(&sent), "{sent}: {line}");
}

/// A connection that sends `head` (an unfinished head) and then reads what the broker says;
/// whether it was answered 408.
async fn unfinished_head(broker: SocketAddr, head: Arc<Vec<u8>>) -> (tokio::net::TcpStream, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(broker).await.unwrap();
    if stream.write_all(&head).await.is_err() {
        return (stream, false);
    }
    let mut answer = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut answer)).await;
    let evicted = matches!(read, Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 408 "));
    (stream, evicted)
}

/// 2,000 connections each holding an unfinished 60 KB head, under `HTTP_HEAD_MEMORY=16`:
/// the broker's memory stays near the budget (beside what each connection costs anyway: its
/// request's state and socket, some 15 KiB in a debug build), the oldest heads are answered
/// 408 (logged once), and a head kept within the budget is still served when it ends. Without
/// the budget the broker grew by some 150 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_heads_are_held_to_the_head_memory_budget() {
    let server = Scripted::start().await;
    let text = ini(server.addr, "").replacen("[General]\n", "[General]\nHTTP_HEAD_MEMORY=16\n", 1);
    let broker = harness::Broker::start(&text).await;
    let rss = || {
        broker
            .resident_bytes()
            .expect("the broker's resident memory")
    };
    let before = rss();
    let mut head = b"GET /kept HTTP/1.1\r\nHost: app.example\r\nX-Pad: ".to_vec();
    head.resize(60 * 1024, b'a');
    let head = Arc::new(head);
    let clients: Vec<_> = (0..2000)
        .map(|_| tokio::spawn(unfinished_head(broker.addr(), Arc::clone(&head))))
        .collect();
    let mut peak = 0;
    while !clients.iter().all(|c| c.is_finished()) {
        peak = peak.max(rss().saturating_sub(before));
        pace(10).await;
    }
    assert!(peak < 64 << 20, "the broker grew by {peak} bytes");
    let mut kept = Vec::new();
    let mut evicted = 0;
    for client in clients {
        match client.await.unwrap() {
            (_, true) => evicted += 1,
            (stream, false) => kept.push(stream),
        }
    }
    assert!(evicted >= 1500, "{evicted} answered 408");
    broker.wait_for_log("HTTP_HEAD_MEMORY is full").await;
    assert_eq!(broker.count_logs("HTTP_HEAD_MEMORY is full"), 1);
    // The newest heads were kept: one ends now and is served.
    let mut last = kept.pop().expect("a head kept within the budget");
    tokio::io::AsyncWriteExt::write_all(&mut last, b"\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 256];
    let n = tokio::io::AsyncReadExt::read(&mut last, &mut answer)
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
}
