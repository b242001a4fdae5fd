//! The HTTP engine as clients and servers meet it, on real loopback sockets: keep-alive
//! pooling, headers each way, chunked and `Expect: 100-continue` uploads, HTTP/1.0 clients,
//! oversized and slow heads, request smuggling, WebSocket, 502/503/504 and the retries, the
//! access log's exchanges, and the HTTP monitor check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use appbroker::broker::monitor::http_check;
use appbroker::config::Language;
use appbroker::config::StatusRange;
use appbroker::http::{ExchangeOutcome, Settings};
use futures_util::{SinkExt, StreamExt};
use harness::*;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn settings() -> Settings {
    Settings::default()
}

async fn broker_for(origin: &Origin) -> LoopbackEngine {
    LoopbackEngine::start(TestUpstreams::new(&[origin.addr]), settings()).await
}

// ---- keep-alive and the pool --------------------------------------------------------------

#[tokio::test]
async fn requests_of_many_clients_reuse_one_server_connection() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    // Five clients one after the other, four requests each on its own kept-alive connection.
    for _ in 0..5 {
        let mut sender = client(broker.addr).await;
        for i in 0..4 {
            let path = format!("/r{i}");
            let (status, _, body) =
                send(&mut sender, request("GET", broker.addr, &path, body(""))).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(body, format!("seen {path} 0"));
        }
    }
    assert_eq!(
        origin.accepted.load(SeqCst),
        1,
        "one server connection for 20 requests"
    );
    let figures = broker.proxy.pool_figures();
    assert_eq!(figures.len(), 1);
    let (server, pool) = figures[0];
    assert_eq!(server, origin.addr);
    assert_eq!((pool.opened, pool.reused, pool.open), (1, 19, 1));
    eventually("20 exchanges reported", || {
        broker.upstreams.exchanges().len() == 20
    })
    .await;
}

#[tokio::test]
async fn the_pool_keeps_at_most_max_idle_connections_per_server() {
    let origin = Origin::start().await;
    let settings = Settings {
        max_idle: 2,
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[origin.addr]), settings).await;
    // Five requests at once: five server connections.
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let addr = broker.addr;
        waiting.push(tokio::spawn(async move { get(addr, "/hold").await }));
    }
    eventually("five requests held at the server", || {
        origin.held.load(SeqCst) == 5
    })
    .await;
    origin.release(5);
    for answer in waiting {
        assert_eq!(answer.await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(origin.accepted.load(SeqCst), 5);
    eventually("the surplus closed at the server", || {
        origin.open.load(SeqCst) == 2
    })
    .await;
    let (_, pool) = broker.proxy.pool_figures()[0];
    assert_eq!((pool.idle, pool.open, pool.opened), (2, 2, 5));
    eventually("three closes reported", || {
        broker.upstreams.opened_closed() == (5, 3)
    })
    .await;
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout() {
    let origin = Origin::start().await;
    let settings = Settings {
        idle_timeout: Duration::from_millis(300),
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[origin.addr]), settings).await;
    assert_eq!(get(broker.addr, "/").await.0, StatusCode::OK);
    assert_eq!(origin.open.load(SeqCst), 1);
    eventually("the idle connection closed", || {
        origin.open.load(SeqCst) == 0
    })
    .await;
    assert_eq!(broker.proxy.pool_figures()[0].1.idle, 0);
    // The next request opens a new one.
    assert_eq!(get(broker.addr, "/").await.0, StatusCode::OK);
    assert_eq!(origin.accepted.load(SeqCst), 2);
}

/// A server that answers one request per connection and then closes it just as the next
/// request comes (the race of a server's keep-alive timeout with the broker's reuse).
async fn closing_on_reuse_origin() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    raw_origin(|mut stream, _| async move {
        let head = read_head(&mut stream).await;
        let length = content_length(&head);
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
            .await
            .unwrap();
        // The next request's first bytes arrive: close without answering.
        let mut byte = [0u8; 1];
        let _ = stream.read(&mut byte).await;
    })
    .await
}

fn content_length(head: &[u8]) -> usize {
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn a_pooled_connection_closed_as_it_is_reused_is_retried_once_on_a_new_one() {
    let (addr, accepted) = closing_on_reuse_origin().await;
    let broker = LoopbackEngine::start(TestUpstreams::new(&[addr]), settings()).await;
    let mut sender = client(broker.addr).await;
    let (status, _, first) = send(&mut sender, request("GET", broker.addr, "/", body(""))).await;
    assert_eq!((status, &first[..]), (StatusCode::OK, &b"first"[..]));
    // The second request goes on the pooled connection, which the server closes unanswered:
    // it is sent again on a new connection, and the client never knows.
    let (status, _, second) = send(&mut sender, request("GET", broker.addr, "/", body(""))).await;
    assert_eq!((status, &second[..]), (StatusCode::OK, &b"first"[..]));
    assert_eq!(accepted.load(SeqCst), 2);
    assert_eq!(broker.proxy.stats().figures().retried_stale, 1);
    assert!(broker.upstreams.connect_failures().is_empty());
}

#[tokio::test]
async fn a_post_on_a_connection_closed_as_it_is_reused_is_not_sent_twice() {
    let (addr, accepted) = closing_on_reuse_origin().await;
    let broker = LoopbackEngine::start(TestUpstreams::new(&[addr]), settings()).await;
    let mut sender = client(broker.addr).await;
    let (status, _, _) = send(&mut sender, request("POST", broker.addr, "/", body("a"))).await;
    assert_eq!(status, StatusCode::OK);
    // The server may have acted on it: a 502, not a second try.
    let (status, _, page) = send(&mut sender, request("POST", broker.addr, "/", body("b"))).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(String::from_utf8_lossy(&page).contains("502 Server failed"));
    assert_eq!(accepted.load(SeqCst), 1);
    assert_eq!(broker.proxy.stats().figures().retried_stale, 0);
    eventually("the 502 reported", || {
        broker
            .upstreams
            .exchanges()
            .iter()
            .any(|x| matches!(x.outcome, ExchangeOutcome::ServerFailed(_)))
    })
    .await;
}

// ---- headers ------------------------------------------------------------------------------

#[tokio::test]
async fn hop_by_hop_headers_are_removed_and_forwarded_headers_added() {
    let origin = Origin::start().await;
    let upstreams = TestUpstreams::new(&[origin.addr]);
    *upstreams.set_cookie.lock().unwrap() = Some("TOTVS_BROKER_SH_001=01.test; Path=/".into());
    let broker = LoopbackEngine::start(upstreams, settings()).await;
    let mut sender = client(broker.addr).await;
    let mut req = request("GET", broker.addr, "/head?x=1", body(""));
    let headers = req.headers_mut();
    headers.insert("host", "portal.example:8080".parse().unwrap());
    headers.insert("connection", "keep-alive, x-hop".parse().unwrap());
    headers.insert("x-hop", "private".parse().unwrap());
    headers.insert("keep-alive", "timeout=9".parse().unwrap());
    headers.insert("proxy-connection", "keep-alive".parse().unwrap());
    headers.insert("te", "trailers".parse().unwrap());
    headers.insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
    headers.insert("x-forwarded-proto", "https".parse().unwrap());
    headers.insert("cookie", "a=b".parse().unwrap());
    let (status, _, _) = send(&mut sender, req).await;
    assert_eq!(status, StatusCode::OK);
    let seen = origin.seen();
    let seen = &seen[0];
    assert_eq!(seen.target, "/head?x=1");
    assert_eq!(seen.version, hyper::Version::HTTP_11);
    let h = &seen.headers;
    assert_eq!(h["host"], "portal.example:8080");
    assert_eq!(h["cookie"], "a=b");
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], "portal.example:8080");
    for gone in [
        "connection",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "te",
    ] {
        assert!(!h.contains_key(gone), "{gone} reached the server: {h:?}");
    }
    // The answer's hop-by-hop headers stay at the broker too; the balancer's are added.
    let (status, headers, body) =
        send(&mut sender, request("GET", broker.addr, "/hop", body(""))).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hop"[..]));
    assert_eq!(headers["x-kept"], "yes");
    assert_eq!(headers["set-cookie"], "TOTVS_BROKER_SH_001=01.test; Path=/");
    for gone in ["x-private", "keep-alive", "proxy-connection"] {
        assert!(
            !headers.contains_key(gone),
            "{gone} reached the client: {headers:?}"
        );
    }
}

#[tokio::test]
async fn forwarded_headers_can_be_turned_off() {
    let origin = Origin::start().await;
    let settings = Settings {
        forwarded_headers: false,
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[origin.addr]), settings).await;
    assert_eq!(get(broker.addr, "/").await.0, StatusCode::OK);
    let seen = origin.seen();
    assert!(!seen[0].headers.contains_key("x-forwarded-for"));
    assert!(!seen[0].headers.contains_key("x-forwarded-proto"));
}

#[tokio::test]
async fn an_http_1_0_client_is_served_and_its_connection_closed() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let answer = raw_exchange(broker.addr, b"GET /old HTTP/1.0\r\n\r\n").await;
    // Every status line the broker writes says HTTP/1.1 (RFC 9110 §2.5), which an HTTP/1.0
    // client reads as its own.
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("seen /old 0"), "{answer}");
    let seen = origin.seen();
    assert_eq!(
        seen[0].version,
        hyper::Version::HTTP_11,
        "sent on as HTTP/1.1"
    );
    // A chunked answer reaches an HTTP/1.0 client whole, without chunks.
    let answer = raw_exchange(broker.addr, b"GET /bytes/chunked/3000 HTTP/1.0\r\n\r\n").await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    let _ = body;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(b"GET /bytes/chunked/3000 HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut check = PatternCheck::default();
    check.feed(&raw[at..]);
    assert_eq!((check.seen, check.bad_at), (3000, None));
}

// ---- bodies -------------------------------------------------------------------------------

#[tokio::test]
async fn a_chunked_upload_arrives_whole() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(b"POST /chunks HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for piece in [
        "5\r\nhello\r\n",
        "1;ext=1\r\n \r\n",
        "5\r\nworld\r\n",
        "0\r\n\r\n",
    ] {
        stream.write_all(piece.as_bytes()).await.unwrap();
        stream.flush().await.unwrap();
    }
    let mut answer = vec![0; 4096];
    let n = stream.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.ends_with("seen /chunks 11"), "{answer}");
    assert_eq!(&origin.seen()[0].body[..], b"hello world");
    // A streamed body of unknown length, 5 MiB, through hyper's client.
    let mut sender = client(broker.addr).await;
    let big = http_body_util::BodyExt::boxed(PatternBody::new(5 << 20, false));
    let (status, _, body) = send(&mut sender, request("POST", broker.addr, "/upload", big)).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"5242880 None"[..]));
}

#[tokio::test]
async fn expect_100_continue_is_held_until_the_server_asks_for_the_body() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(
            b"POST /expect HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let mut interim = vec![0; 256];
    let n = stream.read(&mut interim).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&interim[..n]),
        "HTTP/1.1 100 Continue\r\n\r\n"
    );
    stream.write_all(b"data").await.unwrap();
    let mut answer = vec![0; 4096];
    let n = stream.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.ends_with("seen /expect 4"), "{answer}");
    let seen = origin.seen();
    assert_eq!(
        seen[0].headers["expect"], "100-continue",
        "Expect reached the server"
    );
    assert_eq!(&seen[0].body[..], b"data");
}

#[tokio::test]
async fn a_server_refusing_an_expect_upload_answers_before_any_body_is_sent() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(
            b"PUT /deny HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = vec![0; 4096];
    let n = stream.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(
        answer.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
        "{answer}"
    );
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(answer.ends_with("denied"));
}

// ---- heads the broker refuses ------------------------------------------------------------

#[tokio::test]
async fn oversized_request_lines_and_heads_are_refused_with_414_and_431() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let long = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(20 * 1024));
    let answer = raw_exchange(broker.addr, long.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 414 URI Too Long\r\n"),
        "{answer}"
    );
    let big = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nCookie: {}\r\n\r\n",
        "c".repeat(70 * 1024)
    );
    let answer = raw_exchange(broker.addr, big.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{answer}"
    );
    let answer = raw_exchange(broker.addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "no Host: {answer}"
    );
    let answer = raw_exchange(
        broker.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 501 Not Implemented\r\n"),
        "{answer}"
    );
    assert!(origin.seen().is_empty());
    assert_eq!(origin.accepted.load(SeqCst), 0);
}

#[tokio::test]
async fn a_client_too_slow_with_its_head_is_closed() {
    let origin = Origin::start().await;
    let settings = Settings {
        request_timeout: Duration::from_millis(300),
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[origin.addr]), settings).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: h\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the broker kept a slow head's connection open"
    );
    assert_eq!(origin.accepted.load(SeqCst), 0);
    eventually("the connection let go", || broker.serving.load(SeqCst) == 0).await;
}

// ---- request smuggling --------------------------------------------------------------------

/// Each case: raw bytes a client sends, the status it must get first, and what the server
/// must have received: `None` for nothing at all, or the one request's body.
struct Smuggle {
    name: &'static str,
    send: &'static str,
    status: &'static str,
    server_body: Option<&'static str>,
}

const SMUGGLING: &[Smuggle] = &[
    Smuggle {
        // CL.TE: a front end reading Content-Length would pass "0\r\n\r\nSMUGGLED..." as
        // the body, and a server reading chunks would see a second request.
        name: "CL.TE",
        send: "POST /cl-te HTTP/1.1\r\nHost: h\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n",
        status: "HTTP/1.1 200 OK",
        server_body: Some(""),
    },
    Smuggle {
        // TE.CL: a front end reading chunks passes the chunk, and a server reading
        // Content-Length: 4 would take the chunk's tail as a second request.
        name: "TE.CL",
        send: "POST /te-cl HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n\r\n0\r\n\r\n",
        status: "HTTP/1.1 200 OK",
        server_body: Some("GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"),
    },
    Smuggle {
        name: "TE.CL with the CL first and a mixed-case chunked",
        send: "POST /te-cl2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ChUnKeD\r\nContent-Length: 4\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n\r\n0\r\n\r\n",
        status: "HTTP/1.1 200 OK",
        server_body: Some("GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"),
    },
    Smuggle {
        name: "two different Content-Lengths",
        send: "POST /cl-cl HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhelloGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "a Content-Length list",
        send: "POST /cl-list HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 40\r\n\r\nhello",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "a signed Content-Length",
        send: "POST /cl-plus HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\nhello",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "a transfer coding that does not end in chunked",
        send: "POST /te-gzip HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "a coding before chunked (the body would stay coded)",
        send: "POST /te-gzip-chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        status: "HTTP/1.1 501 Not Implemented",
        server_body: None,
    },
    Smuggle {
        name: "chunked twice on two lines",
        send: "POST /te-te HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        status: "HTTP/1.1 501 Not Implemented",
        server_body: None,
    },
    Smuggle {
        name: "a Transfer-Encoding with a space before the colon",
        send: "POST /te-space HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhello",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "an obs-folded Transfer-Encoding",
        send: "POST /te-fold HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n\r\nhello",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "Transfer-Encoding in HTTP/1.0",
        send: "POST /te-10 HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "a chunk size that is not hexadecimal",
        send: "POST /chunk-bad HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5g\r\nhello\r\n0\r\n\r\n",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "a chunk size that overflows 64 bits",
        send: "POST /chunk-big HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
    Smuggle {
        name: "two Host lines",
        send: "GET /hosts HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        status: "HTTP/1.1 400 Bad Request",
        server_body: None,
    },
];

#[tokio::test]
async fn smuggling_attempts_reach_the_server_as_one_request_or_not_at_all() {
    for case in SMUGGLING {
        let origin = Origin::start().await;
        let broker = broker_for(&origin).await;
        let answer = raw_exchange(broker.addr, case.send.as_bytes()).await;
        let statuses = status_lines(&answer);
        let name = case.name;
        assert_eq!(statuses, [case.status], "{name}: {answer}");
        // Nothing of the smuggled request reached the server as a request.
        let seen = origin.seen();
        assert!(
            seen.iter().all(|s| s.target != "/smuggled"),
            "{name}: the server saw a smuggled request: {seen:?}"
        );
        let raw = String::from_utf8_lossy(&origin.raw_all()).into_owned();
        match case.server_body {
            Some(body) => {
                assert_eq!(seen.len(), 1, "{name}: {seen:?}");
                assert_eq!(seen[0].body, body.as_bytes(), "{name}");
                assert_eq!(
                    raw.matches(" HTTP/1.1\r\n").count(),
                    if body.is_empty() { 1 } else { 2 },
                    "{name}: one request line (and the body's text): {raw:?}"
                );
                assert!(
                    !raw.to_ascii_lowercase().contains("content-length: 4"),
                    "{name}: {raw:?}"
                );
            }
            None => assert!(seen.is_empty(), "{name}: {seen:?}"),
        }
    }
}

// ---- WebSocket ----------------------------------------------------------------------------

#[tokio::test]
async fn a_websocket_passes_through_and_is_one_of_the_servers_connections_until_it_ends() {
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        while let Some(Ok(message)) = ws.next().await {
            if message.is_close() {
                break;
            }
            ws.send(message).await.unwrap();
        }
    });
    let broker = LoopbackEngine::start(TestUpstreams::new(&[ws_addr]), settings()).await;
    let stream = TcpStream::connect(broker.addr).await.unwrap();
    let url = format!("ws://{}/webapp/ws", broker.addr);
    let (mut ws, response) = tokio_tungstenite::client_async(url, stream).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(Message::text("olá")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("olá"));
    let big = vec![7u8; 300_000];
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(big));
    assert_eq!(
        broker.upstreams.opened_closed(),
        (1, 0),
        "open while the socket is"
    );
    assert_eq!(
        broker.upstreams.leased.load(SeqCst),
        1,
        "the lease lives with the socket"
    );
    assert_eq!(broker.proxy.stats().figures().upgrades, 1);
    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    drop(ws);
    eventually("the tunnel reported", || {
        broker.upstreams.tunnels().len() == 1
    })
    .await;
    let tunnel = &broker.upstreams.tunnels()[0];
    assert_eq!(tunnel.server, ws_addr);
    assert!(
        tunnel.to_server > 300_000 && tunnel.to_client > 300_000,
        "{tunnel:?}"
    );
    eventually("the server connection closed", || {
        broker.upstreams.opened_closed() == (1, 1)
    })
    .await;
    assert_eq!(broker.upstreams.leased.load(SeqCst), 0);
    let exchanges = broker.upstreams.exchanges();
    assert_eq!(exchanges[0].status, Some(StatusCode::SWITCHING_PROTOCOLS));
}

/// A raw server of the test's own: a request for `/ws` is switched to `websocket` (`101`),
/// then every byte echoed until the broker half-closes, then closed in turn; any other path
/// is a `404`.
async fn echoing_upgrade_server() -> std::net::SocketAddr {
    let (addr, _) = raw_origin(|mut stream, _| async move {
        let head = read_head(&mut stream).await;
        if !head.starts_with(b"GET /ws ") {
            let _ = stream
                .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                .await;
            return;
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                       Connection: Upgrade\r\n\r\n";
        if stream.write_all(switch).await.is_ok() {
            let (mut from, mut to) = stream.split();
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        }
    })
    .await;
    addr
}

#[tokio::test]
async fn a_websockets_request_is_reported_when_its_tunnel_ends_with_its_bytes() {
    let server = echoing_upgrade_server().await;
    let broker = LoopbackEngine::start(TestUpstreams::new(&[server]), settings()).await;
    let mut client = TcpStream::connect(broker.addr).await.unwrap();
    let upgrade = "GET /ws HTTP/1.1\r\nHost: app.example\r\nConnection: Upgrade\r\n\
                   Upgrade: websocket\r\n\r\n";
    client.write_all(upgrade.as_bytes()).await.unwrap();
    let head = within("the 101", read_head(&mut client)).await;
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        head.escape_ascii()
    );
    client.write_all(b"hello, tunnel").await.unwrap();
    let mut echoed = [0u8; 13];
    client.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"hello, tunnel");
    // While the tunnel is open its request is counted in the figures (the duration
    // histogram has the time to the 101), but not reported as finished.
    assert_eq!(broker.proxy.stats().figures().requests, 1);
    assert!(
        broker.upstreams.exchanges().is_empty(),
        "reported before its tunnel ended: {:?}",
        broker.upstreams.exchanges()
    );
    // Both sides close cleanly: the request is reported then, with the tunnel's bytes, its
    // whole duration, and no error.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    within("the server's close", client.read_to_end(&mut rest))
        .await
        .unwrap();
    eventually("the request reported", || {
        !broker.upstreams.exchanges().is_empty()
    })
    .await;
    let exchange = broker.upstreams.exchanges().remove(0);
    assert_eq!(exchange.status, Some(StatusCode::SWITCHING_PROTOCOLS));
    assert_eq!(exchange.outcome, ExchangeOutcome::Served, "{exchange:?}");
    assert_eq!(
        (exchange.to_server, exchange.to_client),
        (13, 13),
        "{exchange:?}"
    );
    let tunnel = broker.upstreams.tunnels().remove(0);
    assert!(
        exchange.duration >= tunnel.duration,
        "{exchange:?} {tunnel:?}"
    );
    assert_eq!(broker.upstreams.exchanges().len(), 1, "reported once");
}

#[tokio::test]
async fn a_websockets_request_that_ends_idle_is_reported_with_how_it_ended() {
    let server = echoing_upgrade_server().await;
    let settings = Settings {
        tunnel_idle_timeout: Some(Duration::from_millis(200)),
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[server]), settings).await;
    let mut client = TcpStream::connect(broker.addr).await.unwrap();
    let upgrade = "GET /ws HTTP/1.1\r\nHost: app.example\r\nConnection: Upgrade\r\n\
                   Upgrade: websocket\r\n\r\n";
    client.write_all(upgrade.as_bytes()).await.unwrap();
    let head = within("the 101", read_head(&mut client)).await;
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        head.escape_ascii()
    );
    // Nothing either way for IDLE_TIMEOUT: the broker closes it, and says so.
    let mut rest = Vec::new();
    within("the idle close", client.read_to_end(&mut rest))
        .await
        .unwrap();
    eventually("the request reported", || {
        !broker.upstreams.exchanges().is_empty()
    })
    .await;
    let exchange = broker.upstreams.exchanges().remove(0);
    assert_eq!(
        exchange.outcome,
        ExchangeOutcome::TunnelBroken(End::Idle),
        "{exchange:?}"
    );
}

// ---- failures -----------------------------------------------------------------------------

#[tokio::test]
async fn no_server_available_is_a_503_with_retry_after_in_the_pages_language() {
    let settings = Settings {
        language: Language::Portuguese,
        retry_after: Duration::from_secs(7),
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[]), settings).await;
    let (status, headers, page) = get(broker.addr, "/portal").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("Nenhum servidor disponível"), "{page}");
    eventually("the 503 reported", || {
        broker.upstreams.exchanges().len() == 1
    })
    .await;
    let x = &broker.upstreams.exchanges()[0];
    assert_eq!(
        (x.status, &x.outcome, x.server),
        (Some(status), &ExchangeOutcome::NoServer, None)
    );
    assert_eq!(broker.proxy.stats().figures().classes, [0, 0, 0, 0, 1]);
}

#[tokio::test]
async fn a_refused_connect_is_reported_and_the_next_server_takes_the_request() {
    let dead = dead_addr().await;
    let origin = Origin::start().await;
    let broker = LoopbackEngine::start(TestUpstreams::new(&[dead, origin.addr]), settings()).await;
    // A POST with a body too: nothing reached the dead server, so any method goes on.
    let mut sender = client(broker.addr).await;
    let (status, _, body) =
        send(&mut sender, request("POST", broker.addr, "/p", body("xyz"))).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"seen /p 3"[..]));
    assert_eq!(broker.upstreams.connect_failures(), [dead]);
    eventually("no lease left", || {
        broker.upstreams.leased.load(SeqCst) == 0
    })
    .await;
    // Every server refusing: 503.
    let broker = LoopbackEngine::start(TestUpstreams::new(&[dead]), settings()).await;
    assert_eq!(
        get(broker.addr, "/").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn a_connect_failure_of_the_brokers_own_is_a_503_at_once_with_no_other_server_tried() {
    let (one, two) = (Origin::start().await, Origin::start().await);
    let upstreams = TestUpstreams::new(&[one.addr, two.addr]);
    upstreams.broker_fault.store(true, SeqCst);
    let broker = LoopbackEngine::start(upstreams, settings()).await;
    let (status, headers, _) = get(broker.addr, "/").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    // The second server could not be connected either: it is not tried, so the broker's
    // fault is met (and counted) once for the request.
    assert_eq!(broker.upstreams.connect_failures(), [one.addr]);
    eventually("the 503 reported", || {
        broker.upstreams.exchanges().len() == 1
    })
    .await;
    assert_eq!(
        broker.upstreams.exchanges()[0].outcome,
        ExchangeOutcome::BrokerFault
    );
    assert_eq!(broker.proxy.stats().figures().no_server, 1);
}

/// A server that reads a request's head and closes without an answer.
async fn hanging_up_origin() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    raw_origin(|mut stream, _| async move {
        read_head(&mut stream).await;
    })
    .await
}

#[tokio::test]
async fn a_server_failing_after_the_request_was_sent_is_a_502_for_that_request_only() {
    let (bad, bad_accepted) = hanging_up_origin().await;
    let origin = Origin::start().await;
    let broker = LoopbackEngine::start(TestUpstreams::new(&[bad, origin.addr]), settings()).await;
    let mut sender = client(broker.addr).await;
    let (status, _, _) = send(&mut sender, request("GET", broker.addr, "/", body(""))).await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "not retried: HTTP_RETRY_IDEMPOTENT is off"
    );
    // The client's connection goes on.
    let (status, _, _) = send(&mut sender, request("GET", broker.addr, "/", body(""))).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(bad_accepted.load(SeqCst), 2);
    assert_eq!(origin.accepted.load(SeqCst), 0);
    assert!(
        broker.upstreams.connect_failures().is_empty(),
        "a 502 is no connect failure"
    );
    assert_eq!(broker.proxy.stats().figures().server_failed, 2);
}

#[tokio::test]
async fn with_retry_idempotent_a_get_goes_to_the_next_server_and_a_post_does_not() {
    let (bad, _) = hanging_up_origin().await;
    let origin = Origin::start().await;
    let settings = Settings {
        retry_idempotent: true,
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[bad, origin.addr]), settings).await;
    let (status, _, page) = get(broker.addr, "/again").await;
    assert_eq!((status, &page[..]), (StatusCode::OK, &b"seen /again 0"[..]));
    assert_eq!(broker.proxy.stats().figures().retried_next, 1);
    let mut sender = client(broker.addr).await;
    let (status, _, _) = send(
        &mut sender,
        request("POST", broker.addr, "/once", body("x")),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(origin.seen().iter().all(|s| s.target != "/once"));
}

#[tokio::test]
async fn a_silent_server_is_a_504_after_the_response_timeout() {
    let (silent, _) = raw_origin(|mut stream, _| async move {
        read_head(&mut stream).await;
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
    })
    .await;
    let settings = Settings {
        response_timeout: Duration::from_millis(300),
        ..settings()
    };
    let broker = LoopbackEngine::start(TestUpstreams::new(&[silent]), settings).await;
    let (status, _, page) = get(broker.addr, "/slow").await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(String::from_utf8_lossy(&page).contains("504 Server timed out"));
    assert_eq!(broker.proxy.stats().figures().server_timeout, 1);
}

// ---- accounting ---------------------------------------------------------------------------

#[tokio::test]
async fn every_request_is_reported_once_with_its_figures() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut sender = client(broker.addr).await;
    send(
        &mut sender,
        request("POST", broker.addr, "/log?q=1", body("12345")),
    )
    .await;
    send(
        &mut sender,
        request("GET", broker.addr, "/bytes/1000", body("")),
    )
    .await;
    send(
        &mut sender,
        request("GET", broker.addr, "/status/404", body("")),
    )
    .await;
    eventually("three exchanges", || {
        broker.upstreams.exchanges().len() == 3
    })
    .await;
    let x = broker.upstreams.exchanges();
    assert_eq!(x[0].method, hyper::Method::POST);
    assert_eq!(x[0].uri, "/log?q=1");
    assert_eq!(
        (x[0].to_server, x[0].to_client),
        (5, "seen /log?q=1 5".len() as u64)
    );
    assert_eq!(x[0].server, Some(origin.addr));
    assert_eq!(x[0].client.ip(), Some(std::net::Ipv4Addr::LOCALHOST.into()));
    assert_eq!((x[1].to_server, x[1].to_client), (0, 1000));
    assert_eq!(x[2].status, Some(StatusCode::NOT_FOUND));
    assert!(x.iter().all(|x| x.outcome == ExchangeOutcome::Served));
    let figures = broker.proxy.stats().figures();
    assert_eq!(figures.classes, [0, 2, 0, 1, 0]);
    assert_eq!(figures.requests, 3);
    assert_eq!(*figures.buckets.last().unwrap(), 3);
}

#[tokio::test]
async fn a_client_gone_before_its_answer_is_reported_and_frees_the_server_connection() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(b"GET /hold HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    eventually("the request held at the server", || {
        origin.held.load(SeqCst) == 1
    })
    .await;
    drop(stream);
    eventually("the exchange reported", || {
        broker.upstreams.exchanges().len() == 1
    })
    .await;
    let x = &broker.upstreams.exchanges()[0];
    assert_eq!((x.status, &x.outcome), (None, &ExchangeOutcome::Incomplete));
    eventually("the server connection closed", || {
        origin.open.load(SeqCst) == 0
    })
    .await;
}

#[tokio::test]
async fn closing_answers_the_request_in_hand_then_closes() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut sender = client(broker.addr).await;
    let addr = broker.addr;
    let held =
        tokio::spawn(
            async move { send(&mut sender, request("GET", addr, "/hold", body(""))).await },
        );
    eventually("the request held at the server", || {
        origin.held.load(SeqCst) == 1
    })
    .await;
    assert_eq!(
        broker.upstreams.leased.load(SeqCst),
        1,
        "leased while in hand"
    );
    broker.closing.cancel();
    origin.release(1);
    let (status, _, body) = held.await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"released"[..]));
    eventually("the client connection closed", || {
        broker.serving.load(SeqCst) == 0
    })
    .await;
    assert_eq!(
        broker.upstreams.leased.load(SeqCst),
        0,
        "the lease ended with the request"
    );
}

// ---- the HTTP monitor check ---------------------------------------------------------------

fn check_of(path: &str, expect: &str) -> http_check::HttpCheck {
    http_check::HttpCheck {
        path: path.into(),
        host: "app:8080".into(),
        expect: expect.parse::<StatusRange>().unwrap(),
        timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn the_http_check_passes_on_an_expected_status_and_says_why_otherwise() {
    let origin = Origin::start().await;
    let stream = TcpStream::connect(origin.addr).await.unwrap();
    let status = http_check::check(stream, &check_of("/health", "200-399"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let seen = origin.seen();
    assert_eq!(seen[0].target, "/health");
    assert_eq!(seen[0].headers["host"], "app:8080");

    let stream = TcpStream::connect(origin.addr).await.unwrap();
    let e = http_check::check(stream, &check_of("/status/503", "200-399"))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "GET /status/503 answered 503 Service Unavailable, expected 200-399 (MONITOR_EXPECT_STATUS)"
    );

    let (garbage, _) = raw_origin(|mut stream, _| async move {
        read_head(&mut stream).await;
        let _ = stream.write_all(b"SSH-2.0-OpenSSH\r\n").await;
    })
    .await;
    let stream = TcpStream::connect(garbage).await.unwrap();
    let e = http_check::check(stream, &check_of("/", "200"))
        .await
        .unwrap_err();
    assert!(matches!(e, http_check::HttpCheckError::Http { .. }), "{e}");

    let (silent, _) = raw_origin(|mut stream, _| async move {
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
    })
    .await;
    let stream = TcpStream::connect(silent).await.unwrap();
    let mut check = check_of("/", "200");
    check.timeout = Duration::from_millis(200);
    let e = http_check::check(stream, &check).await.unwrap_err();
    assert_eq!(e.to_string(), "no HTTP answer to GET / within 200ms");
}

// ---- curl, a client no one here wrote -----------------------------------------------------

/// Runs curl with `args`; its standard output.
async fn curl(args: Vec<String>) -> String {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["--silent", "--show-error", "--max-time", "20"])
            .args(&args)
            .output()
            .expect("run curl (Debian: curl)")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "curl {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl"]
async fn curl_keeps_its_connection_alive_through_the_broker() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let out = curl(vec![
        "--write-out".into(),
        " connects=%{num_connects}\n".into(),
        broker.url("/one"),
        broker.url("/two"),
    ])
    .await;
    assert_eq!(out, "seen /one 0 connects=1\nseen /two 0 connects=0\n");
    assert_eq!(origin.accepted.load(SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl"]
async fn curl_uploads_with_expect_100_continue_and_chunked() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upload.bin");
    let mut data = Vec::new();
    let mut check = PatternCheck::default();
    let mut pattern = PatternBody::new(3 << 20, true);
    while let Some(frame) = http_body_util::BodyExt::frame(&mut pattern).await {
        data.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    check.feed(&data);
    assert_eq!(check.bad_at, None);
    std::fs::write(&file, &data).unwrap();
    // curl says `Expect: 100-continue` for a body this size and waits for the 100.
    let out = curl(vec![
        "--data-binary".into(),
        format!("@{}", file.display()),
        "--header".into(),
        "Content-Type: application/octet-stream".into(),
        broker.url("/upload"),
    ])
    .await;
    assert_eq!(out, "3145728 None");
    // And chunked, read from standard input.
    let out = curl(vec![
        "--upload-file".into(),
        file.display().to_string(),
        "--header".into(),
        "Transfer-Encoding: chunked".into(),
        broker.url("/upload"),
    ])
    .await;
    assert_eq!(out, "3145728 None");
    let raw = String::from_utf8_lossy(&origin.raw_all()).to_ascii_lowercase();
    assert!(
        raw.contains("expect: 100-continue"),
        "curl's Expect reached the server"
    );
    eventually("both uploads reported", || {
        broker.upstreams.exchanges().len() == 2
    })
    .await;
    for x in broker.upstreams.exchanges() {
        assert_eq!(x.to_server, 3 << 20);
    }
}

// ---- mid-stream -------------------------------------------------------------------------

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let answer = raw_exchange(
        broker.addr,
        b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nHEAD /bytes/1000 HTTP/1.1\r\nHost: h\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{answer}");
    let a = answer.find("seen /a 0").unwrap();
    let head = answer.find("content-length: 1000").unwrap();
    let c = answer.find("seen /c 0").unwrap();
    assert!(a < head && head < c, "{answer}");
    // The HEAD answer carried its length and no body: the next answer follows at once.
    let after_head = &answer[head..c];
    assert!(
        after_head.contains("\r\n\r\nHTTP/1.1 200 OK"),
        "{after_head:?}"
    );
}

/// A server that starts an answer of `head` and breaks off after a few bytes of its body.
async fn breaking_origin(head: &'static str, part: &'static str) -> std::net::SocketAddr {
    raw_origin(move |mut stream, _| async move {
        read_head(&mut stream).await;
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(part.as_bytes()).await.unwrap();
    })
    .await
    .0
}

#[tokio::test]
async fn a_server_breaking_off_mid_answer_is_never_passed_on_as_a_whole_answer() {
    let cases = [
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
            "only a part",
            11,
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5\r\nhello\r\n",
            5,
        ),
    ];
    for (head, part, passed_on) in cases {
        let server = breaking_origin(head, part).await;
        let broker = LoopbackEngine::start(TestUpstreams::new(&[server]), settings()).await;
        let mut sender = client(broker.addr).await;
        let response = sender
            .send_request(request("GET", broker.addr, "/", body("")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(response.into_body()).await;
        assert!(
            body.is_err(),
            "{head:?}: the client took a broken answer for a whole one"
        );
        eventually("the exchange reported", || {
            broker.upstreams.exchanges().len() == 1
        })
        .await;
        let x = &broker.upstreams.exchanges()[0];
        assert_eq!(x.outcome, ExchangeOutcome::Incomplete, "{head:?}");
        assert_eq!(x.to_client, passed_on, "{head:?}");
        eventually("the broken connection closed", || {
            broker.upstreams.opened_closed() == (1, 1)
        })
        .await;
        assert_eq!(broker.proxy.pool_figures()[0].1.idle, 0);
    }
}

// ---- reload ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_server_forgotten_by_a_reload_loses_its_idle_connections_and_new_settings_hold() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    assert_eq!(get(broker.addr, "/").await.0, StatusCode::OK);
    assert_eq!(origin.open.load(SeqCst), 1, "pooled");
    broker.proxy.forget(&origin.addr);
    eventually("the idle connection closed", || {
        origin.open.load(SeqCst) == 0
    })
    .await;
    assert!(broker.proxy.pool_figures().is_empty());
    // A reload that turns pooling off: the next answer's connection is not kept.
    broker.proxy.set_settings(Settings {
        max_idle: 0,
        ..settings()
    });
    assert_eq!(get(broker.addr, "/").await.0, StatusCode::OK);
    eventually("the connection closed after its answer", || {
        origin.open.load(SeqCst) == 0
    })
    .await;
    assert_eq!(origin.accepted.load(SeqCst), 2);
}

// ---- what the engine of its own keeps, and how it reuses ---------------------------------

/// One answer on `stream` to `GET /bytes/<n>`: its head, then its `n` bytes.
async fn read_bytes_answer(stream: &mut TcpStream, n: usize) {
    let head = read_head(stream).await;
    assert!(head.starts_with(b"HTTP/1.1 200 OK\r\n"), "{head:?}");
    let mut body = vec![0; n];
    stream.read_exact(&mut body).await.unwrap();
}

#[tokio::test]
async fn an_idle_kept_alive_client_holds_no_buffer() {
    use appbroker::http::engine::buffers::{BufferFigures, lent_here};
    // The engine runs on this test's runtime, on this thread: the figures are its own.
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut stream = TcpStream::connect(broker.addr).await.unwrap();
        stream
            .write_all(b"GET /bytes/3000 HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        read_bytes_answer(&mut stream, 3000).await;
        idle.push(stream);
    }
    eventually("every answer's buffers given back", || {
        lent_here() == BufferFigures::default()
    })
    .await;
    assert_eq!(broker.serving.load(SeqCst), 20, "20 clients kept alive");
    // A client halfway through its head holds one buffer, until it goes.
    let mut partial = TcpStream::connect(broker.addr).await.unwrap();
    partial.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    eventually("the partial head's buffer", || {
        lent_here() == BufferFigures { small: 1, large: 0 }
    })
    .await;
    drop(partial);
    eventually("its buffer given back", || {
        lent_here() == BufferFigures::default()
    })
    .await;
    // The idle clients are served again as they were.
    for stream in &mut idle[..3] {
        stream
            .write_all(b"GET /bytes/10 HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        read_bytes_answer(stream, 10).await;
    }
}

#[tokio::test]
async fn pipelined_requests_with_bodies_are_answered_in_order() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let answer = raw_exchange(
        broker.addr,
        b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc\
          GET /b HTTP/1.1\r\nHost: h\r\n\r\n\
          POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
          GET /d HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    )
    .await;
    let order: Vec<usize> = ["seen /a 3", "seen /b 0", "seen /c 5", "seen /d 0"]
        .iter()
        .map(|seen| {
            answer
                .find(seen)
                .unwrap_or_else(|| panic!("{seen}: {answer}"))
        })
        .collect();
    assert!(order.is_sorted(), "{answer}");
    let bodies: Vec<Vec<u8>> = origin.seen().iter().map(|s| s.body.to_vec()).collect();
    assert_eq!(bodies, [&b"abc"[..], b"", b"hello", b""]);
    assert_eq!(origin.accepted.load(SeqCst), 1, "one server connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_goes_by_splice_and_arrives_byte_for_byte() {
    const SIZE: u64 = 32 << 20;
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    let mut sender = client(broker.addr).await;
    let up = http_body_util::BodyExt::boxed(PatternBody::new(SIZE, true));
    let (status, _, answer) = send(&mut sender, request("POST", broker.addr, "/upload", up)).await;
    assert_eq!(
        (status, &answer[..]),
        (StatusCode::OK, format!("{SIZE} None").as_bytes())
    );
    sender.ready().await.unwrap();
    let path = format!("/bytes/{SIZE}");
    let response = sender
        .send_request(request("GET", broker.addr, &path, body("")))
        .await
        .unwrap();
    assert_eq!(check_body(response.into_body()).await, (SIZE, None));
    // Both bodies but what came with their heads (a buffer's worth at most) went socket to
    // pipe to socket.
    if cfg!(target_os = "linux") {
        let spliced = broker.proxy.stats().figures().spliced;
        assert!(
            spliced >= 2 * (SIZE - (64 << 10)),
            "{spliced} bytes spliced"
        );
    }
    eventually("two exchanges", || broker.upstreams.exchanges().len() == 2).await;
    let x = broker.upstreams.exchanges();
    assert_eq!((x[0].to_server, x[1].to_client), (SIZE, SIZE));
}

#[tokio::test]
async fn a_server_connection_is_not_reused_after_an_exchange_cut_short() {
    let origin = Origin::start().await;
    let broker = broker_for(&origin).await;
    // The client reads the head and a little, and goes.
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    stream
        .write_all(b"GET /bytes/50000000 HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with(b"HTTP/1.1 200 OK\r\n"));
    let mut some = [0u8; 1000];
    stream.read_exact(&mut some).await.unwrap();
    drop(stream);
    eventually("the exchange reported", || {
        broker.upstreams.exchanges().len() == 1
    })
    .await;
    assert_eq!(
        broker.upstreams.exchanges()[0].outcome,
        ExchangeOutcome::Incomplete
    );
    // Its server connection, with the rest of the answer on its way, is closed, not pooled.
    eventually("the server connection closed", || {
        broker.upstreams.opened_closed() == (1, 1)
    })
    .await;
    assert_eq!(broker.proxy.pool_figures()[0].1.idle, 0);
    // A server that sends more than its answer's framing says: its connection is closed too.
    let (extra, accepted) = raw_origin(|mut stream, _| async move {
        loop {
            let head = read_head(&mut stream).await;
            if head.is_empty() {
                return;
            }
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA";
            if stream.write_all(answer).await.is_err() {
                return;
            }
        }
    })
    .await;
    let broker = LoopbackEngine::start(TestUpstreams::new(&[extra]), settings()).await;
    for _ in 0..2 {
        let (status, _, body) = get(broker.addr, "/").await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    }
    assert_eq!(accepted.load(SeqCst), 2, "a connection per answer");
    assert_eq!(broker.proxy.pool_figures()[0].1.idle, 0);
}
