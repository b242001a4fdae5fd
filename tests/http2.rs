//! HTTP/2 towards clients, on real loopback sockets: an HTTP balancer with a certificate
//! offers ALPN `h2` and serves each stream as the engine serves an HTTP/1.1 request (the
//! origins see HTTP/1.1, the rewrite, one `Cookie` line, the affinity kept), bodies both ways
//! under flow control, interim answers, `HEAD`, 204 and 304 without bodies, WebSocket over
//! HTTP/2 (RFC 8441) relayed as an HTTP/1.1 upgrade, the connection counted once, the drain's
//! `GOAWAY`, and the bounds: rapid reset, a shut window, idle connections, streams past the
//! limit, a client past `MAX_CONNECTIONS_PER_CLIENT`; and a differential: the same requests
//! through nginx 1.22 (`listen ... ssl http2`) answered and forwarded alike. The clients are
//! the `h2` crate's here;
//! tests/http2_tools.rs drives curl, nghttp, h2load, Chromium and hostile Python clients.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use harness::*;
use hyper::http::{HeaderMap, Method, Request, StatusCode};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A certificate for `localhost` and 127.0.0.1 in a directory of its own, the roots that
/// trust it, and the section lines that serve it.
struct Tls {
    _dir: tempfile::TempDir,
    roots: RootCertStore,
    lines: String,
}

fn tls() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (pem, key_pem) = (dir.path().join("broker.pem"), dir.path().join("broker.key"));
    std::fs::write(&pem, cert.pem()).unwrap();
    std::fs::write(&key_pem, key.serialize_pem()).unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let lines = format!(
        "SSL_CERTIFICATE={}\nSSL_KEY={}\n",
        pem.display(),
        key_pem.display()
    );
    Tls {
        _dir: dir,
        roots,
        lines,
    }
}

/// An HTTP balancer on `@PORT@` with `tls`, `extra` lines, and `servers` in order.
fn ini(tls: &Tls, extra: &str, servers: &[SocketAddr]) -> String {
    http_ini(servers, &format!("{}{extra}", tls.lines))
}

/// A TLS connection to `addr` offering `alpn`.
async fn tls_connect(addr: SocketAddr, tls: &Tls, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let mut config = ClientConfig::builder_with_provider(appbroker::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(tls.roots.clone())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = TlsConnector::from(Arc::new(config));
    let stream = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    connector.connect(name, stream).await.unwrap()
}

/// An HTTP/2 client connection to `addr`, its connection driven in a task of its own (which
/// ends with the connection's error, if any).
async fn h2_client(
    addr: SocketAddr,
    tls: &Tls,
) -> (
    SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    h2_client_with(addr, tls, h2::client::Builder::new()).await
}

async fn h2_client_with(
    addr: SocketAddr,
    tls: &Tls,
    builder: h2::client::Builder,
) -> (
    SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let stream = tls_connect(addr, tls, &[b"h2", b"http/1.1"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "ALPN");
    let (send, connection) = builder.handshake(stream).await.unwrap();
    let driver = tokio::spawn(connection);
    // The broker's SETTINGS read (its stream limit, extended CONNECT): a request sent before
    // them would be held to none of them.
    eventually("the broker's SETTINGS", || {
        send.current_max_send_streams() != usize::MAX
    })
    .await;
    (send.ready().await.unwrap(), driver)
}

/// An answer as the client read it.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// `request` (with `body`, when given, sent in 1000-byte DATA frames) and its answer read whole.
async fn fetch(send: &mut SendRequest<Bytes>, request: Request<()>, body: Option<&[u8]>) -> Answer {
    let mut send = send.clone().ready().await.unwrap();
    let (response, mut stream) = send.send_request(request, body.is_none()).unwrap();
    if let Some(body) = body {
        for (i, chunk) in body.chunks(1000).enumerate() {
            let last = (i + 1) * 1000 >= body.len();
            stream.reserve_capacity(chunk.len());
            while stream.capacity() < chunk.len() {
                std::future::poll_fn(|cx| stream.poll_capacity(cx)).await;
            }
            stream
                .send_data(Bytes::copy_from_slice(chunk), last)
                .unwrap();
        }
        if body.is_empty() {
            stream.send_data(Bytes::new(), true).unwrap();
        }
    }
    let response = within("the answer's head", response).await.unwrap();
    let (parts, mut recv) = response.into_parts();
    let mut body = Vec::new();
    while let Some(data) = within("the answer's body", recv.data()).await {
        let data = data.unwrap();
        let _ = recv.flow_control().release_capacity(data.len());
        body.extend_from_slice(&data);
    }
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.into(),
    }
}

/// A `GET` of `path` on the broker, with `fields`.
fn get(path: &str, fields: &[(&str, &str)]) -> Request<()> {
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(format!("https://localhost{path}"));
    for (name, value) in fields {
        request = request.header(*name, *value);
    }
    request.body(()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reaches_the_server_as_an_http11_request_with_the_engines_rewrite() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "", &[origin.addr])).await;
    let (mut send, _driver) = h2_client(broker.addr(), &tls).await;
    let request = get(
        "/app/page?x=1",
        &[
            ("cookie", "a=1"),
            ("cookie", "b=2"),
            ("accept", "text/html"),
            ("x-real-ip", "6.6.6.6"),
        ],
    );
    let answer = fetch(&mut send, request, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert!(answer.headers.contains_key("set-cookie"), "{answer:?}");
    for hop in ["connection", "keep-alive", "transfer-encoding"] {
        assert!(!answer.headers.contains_key(hop), "{hop}: {answer:?}");
    }
    let seen = origin.seen();
    let seen = &seen[0];
    assert_eq!(seen.version, hyper::Version::HTTP_11);
    assert_eq!(seen.target, "/app/page?x=1");
    assert_eq!(seen.headers["host"], "localhost");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(seen.headers["x-real-ip"], "127.0.0.1");
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2"], "one Cookie line, the crumbs joined");
    // HTTP/1.1 clients and HTTP/2 ones are told apart in the figures.
    let metrics = fetch(&mut send, get("/TOTVS_BROKER_QUERY/METRICS", &[]), None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        metrics.contains(
            "appbroker_http_protocol_requests_total{balancer=\"BALANCE_HTTP\",protocol=\"h2\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "appbroker_http_protocol_connections_open{balancer=\"BALANCE_HTTP\",protocol=\"h2\"} 1"
        ),
        "{metrics}"
    );
}

/// `n` bytes of the harness's pattern.
async fn pattern(n: u64) -> Bytes {
    use http_body_util::BodyExt;
    PatternBody::new(n, true)
        .collect()
        .await
        .unwrap()
        .to_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_affinity_cookie_keeps_every_stream_on_one_server() {
    let tls = tls();
    let (one, two) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&tls, "", &[one.addr, two.addr])).await;
    let (mut send, _driver) = h2_client(broker.addr(), &tls).await;
    let first = fetch(&mut send, get("/first", &[]), None).await;
    let set_cookie = first.headers["set-cookie"].to_str().unwrap();
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let chosen = if one.seen().len() == 1 { &one } else { &two };
    for i in 0..20 {
        // A browser splits its cookies into crumbs: the broker's among others.
        let request = get(
            &format!("/again/{i}"),
            &[
                ("cookie", "theme=dark"),
                ("cookie", &cookie),
                ("cookie", "x=1"),
            ],
        );
        let answer = fetch(&mut send, request, None).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(!answer.headers.contains_key("set-cookie"), "{answer:?}");
    }
    assert_eq!(
        chosen.seen().len(),
        21,
        "every request on the cookie's server"
    );
    let last = chosen.seen().pop().unwrap();
    let cookies: Vec<_> = last.headers.get_all("cookie").iter().collect();
    assert_eq!(
        cookies,
        ["theme=dark; x=1"],
        "the broker's cookie is the broker's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_at_once_share_one_connection_counted_once() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "MAX_CONNECTIONS=2\n", &[origin.addr])).await;
    let (send, _driver) = h2_client(broker.addr(), &tls).await;
    let mut held = Vec::new();
    for _ in 0..50 {
        let mut send = send.clone();
        held.push(tokio::spawn(async move {
            fetch(&mut send, get("/hold", &[]), None).await
        }));
    }
    eventually("50 streams held at the origin", || {
        origin.held.load(std::sync::atomic::Ordering::SeqCst) == 50
    })
    .await;
    // One client, under a MAX_CONNECTIONS of 2, with 50 requests in hand.
    assert_eq!(broker.state().accepted, 1);
    let (mut other, _other_driver) = h2_client(broker.addr(), &tls).await;
    let metrics = fetch(&mut other, get("/TOTVS_BROKER_QUERY/METRICS", &[]), None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        metrics.contains("appbroker_http2_streams_open{balancer=\"BALANCE_HTTP\"} 51"),
        "{metrics}"
    );
    origin.release(50);
    for answer in held {
        assert_eq!(answer.await.unwrap().body, "released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_pass_whole_both_ways_under_flow_control() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "", &[origin.addr])).await;
    let (mut send, _driver) = h2_client(broker.addr(), &tls).await;
    // Downloads of 3 MiB, with a length and chunked: far past every window.
    for path in ["/bytes/3145728", "/bytes/chunked/3145728"] {
        let answer = fetch(&mut send, get(path, &[]), None).await;
        let mut check = PatternCheck::default();
        check.feed(&answer.body);
        assert_eq!((check.seen, check.bad_at), (3_145_728, None), "{path}");
    }
    // An upload of 1 MiB without a length (chunked towards the server), and one with.
    let body = pattern(1 << 20).await;
    let upload = |length: bool| {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri("https://localhost/upload");
        if length {
            request = request.header("content-length", body.len().to_string());
        }
        request.body(()).unwrap()
    };
    for length in [false, true] {
        let answer = fetch(&mut send, upload(length), Some(&body)).await;
        assert_eq!(answer.body, "1048576 None", "length={length}");
    }
    // An empty POST: a body of none, ended by an empty DATA frame.
    let answer = fetch(&mut send, upload(false), Some(b"")).await;
    assert_eq!(answer.body, "0 None");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_204_and_304_end_with_their_headers() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "", &[origin.addr])).await;
    let (send, _driver) = h2_client(broker.addr(), &tls).await;
    let cases = [
        (Method::HEAD, "/bytes/100", StatusCode::OK),
        (Method::GET, "/status/204", StatusCode::NO_CONTENT),
        (Method::GET, "/status/304", StatusCode::NOT_MODIFIED),
    ];
    for (method, path, status) in cases {
        let mut send = send.clone().ready().await.unwrap();
        let request = Request::builder()
            .method(method.clone())
            .uri(format!("https://localhost{path}"))
            .body(())
            .unwrap();
        let (response, _) = send.send_request(request, true).unwrap();
        let response = within("the head", response).await.unwrap();
        assert_eq!(response.status(), status, "{method} {path}");
        assert!(response.body().is_end_stream(), "{method} {path}: no DATA");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_and_a_host_that_disagree_are_a_400_and_reach_no_server() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "", &[origin.addr])).await;
    let (mut send, _driver) = h2_client(broker.addr(), &tls).await;
    let answer = fetch(&mut send, get("/x", &[("host", "evil.test")]), None).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    // The connection goes on: the refusal ended one stream.
    let answer = fetch(&mut send, get("/y", &[("host", "localhost")]), None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let targets: Vec<_> = origin.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["/y"]);
}

/// A WebSocket origin (tungstenite) that echoes every message; `accept` is what it answers
/// the upgrade with: right, or a `Sec-WebSocket-Accept` of no key's (a server that does not
/// speak WebSocket but switches all the same).
async fn websocket_echo(right_accept: bool) -> SocketAddr {
    use futures_util::{SinkExt, StreamExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if !right_accept {
                    let _ = read_head(&mut stream).await;
                    let wrong = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                                 Connection: Upgrade\r\nSec-WebSocket-Accept: bm90IGEga2V5\r\n\r\n";
                    let _ = stream.write_all(wrong.as_bytes()).await;
                    let _ = stream.read(&mut [0; 64]).await;
                    return;
                }
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    if message.is_close() || ws.send(message).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// RFC 8441's extended CONNECT for a WebSocket at `path`.
fn websocket_connect(path: &str) -> Request<()> {
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(format!("https://localhost{path}"))
        .header("sec-websocket-version", "13")
        .body(())
        .unwrap();
    request
        .extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    request
}

/// A client's masked WebSocket text frame of `text` (under 126 bytes).
fn text_frame(text: &str) -> Bytes {
    let mask = [0x11, 0x22, 0x33, 0x44];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_http2_is_relayed_as_an_http11_upgrade() {
    let tls = tls();
    let origin = websocket_echo(true).await;
    let broker = InProcess::start(&ini(&tls, "", &[origin])).await;
    let (send, _driver) = h2_client(broker.addr(), &tls).await;
    assert!(
        send.is_extended_connect_protocol_enabled(),
        "SETTINGS_ENABLE_CONNECT_PROTOCOL"
    );
    let mut send = send.ready().await.unwrap();
    let (response, mut stream) = send
        .send_request(websocket_connect("/chat"), false)
        .unwrap();
    let response = within("the 200", response).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{response:?}");
    assert!(!response.headers().contains_key("sec-websocket-accept"));
    assert!(!response.headers().contains_key("upgrade"));
    let mut recv = response.into_body();
    for text in ["hello", "over one connection"] {
        stream.send_data(text_frame(text), false).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 + text.len() {
            let data = within("the echo", recv.data()).await.unwrap().unwrap();
            let _ = recv.flow_control().release_capacity(data.len());
            got.extend_from_slice(&data);
        }
        assert_eq!(&got[2..], text.as_bytes(), "an unmasked text frame back");
    }
    // The tunnel ends with the client's side: the server's close follows.
    stream.send_data(Bytes::new(), true).unwrap();
    assert!(
        within("the end", recv.data())
            .await
            .is_none_or(|d| d.is_ok())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_accept_answers_no_key_is_a_502_and_websocket_off_is_not_offered() {
    let tls = tls();
    let origin = websocket_echo(false).await;
    let broker = InProcess::start(&ini(&tls, "", &[origin])).await;
    let (send, _driver) = h2_client(broker.addr(), &tls).await;
    let mut send = send.ready().await.unwrap();
    let (response, _stream) = send
        .send_request(websocket_connect("/chat"), false)
        .unwrap();
    let response = within("the answer", response).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    drop(broker);
    let broker = InProcess::start(&ini(&tls, "HTTP2_WEBSOCKET=0\n", &[origin])).await;
    let (send, _driver) = h2_client(broker.addr(), &tls).await;
    assert!(!send.is_extended_connect_protocol_enabled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_says_goaway_and_finishes_the_streams_in_hand() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "", &[origin.addr])).await;
    let (send, driver) = h2_client(broker.addr(), &tls).await;
    let held = {
        let mut send = send.clone();
        tokio::spawn(async move { fetch(&mut send, get("/hold", &[]), None).await })
    };
    eventually("the stream held at the origin", || {
        origin.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    broker.broker.shutdown();
    // Once the GOAWAY with the last stream id came, a new stream is refused, never lost.
    let mut refused = false;
    for _ in 0..200 {
        let attempt = async {
            let mut send = send.clone().ready().await?;
            let (response, _) = send.send_request(get("/late", &[]), true)?;
            response.await.map(|_| ())
        };
        if let Err(e) = within("a late stream", attempt).await {
            assert!(
                e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM),
                "{e:?}"
            );
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the drain's GOAWAY");
    origin.release(1);
    assert_eq!(held.await.unwrap().body, "released");
    within("the connection's end", driver)
        .await
        .unwrap()
        .unwrap();
}

/// A client writing HTTP/2 frames by hand, for what no client library sends: streams opened
/// and reset at once, as the rapid reset attack does.
struct Raw {
    reader: tokio::io::ReadHalf<TlsStream<TcpStream>>,
    writer: tokio::io::WriteHalf<TlsStream<TcpStream>>,
}

/// A frame: its type, flags, stream and payload.
type Frame = (u8, u8, u32, Vec<u8>);

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[kind, flags]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// `GET path` on `stream`, its HEADERS ending the stream (HPACK: static entries, literals).
fn headers_get(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(b"\x01\x09localhost");
    frame(0x1, 0x5, stream, &block)
}

/// RST_STREAM `CANCEL` on `stream`.
fn reset(stream: u32) -> Vec<u8> {
    frame(0x3, 0, stream, &8u32.to_be_bytes())
}

impl Raw {
    /// The preface and SETTINGS exchanged.
    async fn connect(addr: SocketAddr, tls: &Tls) -> Raw {
        let stream = tls_connect(addr, tls, &[b"h2"]).await;
        let (reader, mut writer) = tokio::io::split(stream);
        writer
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        writer.write_all(&frame(0x4, 0, 0, &[])).await.unwrap();
        let mut raw = Raw { reader, writer };
        loop {
            let (kind, flags, _, _) = raw.next().await.expect("the server's SETTINGS");
            if kind == 0x4 && flags & 1 == 0 {
                raw.writer.write_all(&frame(0x4, 1, 0, &[])).await.unwrap();
                return raw;
            }
        }
    }

    /// The next frame from the server; `None` once the connection ends.
    async fn next(&mut self) -> Option<Frame> {
        let mut head = [0u8; 9];
        self.reader.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.reader.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], stream, payload))
    }

    /// Frames until the HEADERS of `stream`, or a GOAWAY: that frame.
    async fn until(&mut self, stream: u32) -> Option<Frame> {
        loop {
            let frame = self.next().await?;
            if (frame.0 == 0x1 && frame.2 == stream) || frame.0 == 0x7 {
                return Some(frame);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_ends_the_connection_and_everyone_else_is_served() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "", &[origin.addr])).await;
    let (mut other, _other_driver) = h2_client(broker.addr(), &tls).await;
    // A browser cancelling a page's 60 requests at once: served on as before.
    let mut browser = Raw::connect(broker.addr(), &tls).await;
    let mut burst: Vec<u8> = (0..60)
        .flat_map(|i| headers_get(2 * i + 1, "/hold"))
        .collect();
    burst.extend((0..60).flat_map(|i| reset(2 * i + 1)));
    burst.extend(headers_get(121, "/after"));
    browser.writer.write_all(&burst).await.unwrap();
    let answer = within("the answer after the burst", browser.until(121))
        .await
        .unwrap();
    assert_eq!((answer.0, answer.3[0]), (0x1, 0x88), "HEADERS, :status 200");
    // The attack, at full speed: the h2 crate's own bound on streams reset before they are
    // accepted cuts it (ENHANCE_YOUR_CALM too).
    let mut fast = Raw::connect(broker.addr(), &tls).await;
    let flood: Vec<u8> = (0..2000)
        .flat_map(|i| [headers_get(2 * i + 1, "/hold"), reset(2 * i + 1)].concat())
        .collect();
    let _ = fast.writer.write_all(&flood).await;
    let goaway = within("the fast attacker's GOAWAY", fast.until(0))
        .await
        .unwrap();
    assert_eq!(goaway.3[4..8], 0xbu32.to_be_bytes(), "ENHANCE_YOUR_CALM");
    // Paced, 20 at a time, each batch taken in before the next (a PING's answer), so every
    // stream is accepted first: the broker's count of resets cuts it.
    let mut attacker = Raw::connect(broker.addr(), &tls).await;
    let mut id = 1;
    let goaway = within("the paced attacker's GOAWAY", async {
        loop {
            let mut batch: Vec<u8> = (0..20)
                .flat_map(|i| [headers_get(id + 2 * i, "/hold"), reset(id + 2 * i)].concat())
                .collect();
            batch.extend(frame(0x6, 0, 0, &[0; 8]));
            id += 40;
            if attacker.writer.write_all(&batch).await.is_err() || id > 2 * 5000 {
                break attacker.until(0).await;
            }
            loop {
                match attacker.next().await {
                    Some((0x6, 1, _, _)) => break,
                    Some(frame) if frame.0 == 0x7 => return Some(frame),
                    Some(_) => {}
                    None => return None,
                }
            }
        }
    })
    .await
    .expect("a GOAWAY");
    let code = u32::from_be_bytes(goaway.3[4..8].try_into().unwrap());
    assert_eq!(code, 0xb, "ENHANCE_YOUR_CALM");
    assert!(
        id < 2 * 1500,
        "cut after about a thousand resets, not {}",
        id / 2
    );
    assert_eq!(
        fetch(&mut other, get("/meanwhile", &[]), None).await.status,
        200
    );
    let metrics = fetch(&mut other, get("/TOTVS_BROKER_QUERY/METRICS", &[]), None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        metrics.contains("appbroker_http2_calmed_connections_total{balancer=\"BALANCE_HTTP\"} 1"),
        "the broker's own count cut it: {metrics}"
    );
    // Few of the reset streams cost the origin a request.
    let asked = origin.held.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked < 200, "{asked} reset requests reached the origin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_kept_shut_fails_its_stream_and_an_idle_connection_is_closed() {
    let tls = tls();
    let origin = Origin::start().await;
    let extra = "HTTP_BODY_TIMEOUT=1s\nHTTP_REQUEST_TIMEOUT=2s\n";
    let broker = InProcess::start(&ini(&tls, extra, &[origin.addr])).await;
    let mut shut = h2::client::Builder::new();
    shut.initial_window_size(0);
    let (send, _driver) = h2_client_with(broker.addr(), &tls, shut).await;
    let mut send = send.ready().await.unwrap();
    let (response, _) = send.send_request(get("/bytes/100000", &[]), true).unwrap();
    let response = within("the head", response).await.unwrap();
    let mut body = response.into_body();
    let started = std::time::Instant::now();
    let data = within("the stream's end", body.data()).await;
    assert!(matches!(data, Some(Err(_))), "{data:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Everyone else is served meanwhile.
    let (mut other, driver) = h2_client(broker.addr(), &tls).await;
    assert_eq!(fetch(&mut other, get("/x", &[]), None).await.status, 200);
    // Left idle past HTTP_REQUEST_TIMEOUT, a connection is closed with a GOAWAY.
    let started = std::time::Instant::now();
    let ended = within("the idle connection's end", driver).await.unwrap();
    // The close may meet the client's last frames (its GOAWAY's answer): an I/O error then.
    assert!(
        ended.as_ref().map_or_else(h2::Error::is_io, |()| true),
        "{ended:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_limit_wait_and_a_client_past_its_connections_is_answered_503() {
    let tls = tls();
    let origin = Origin::start().await;
    let extra = "HTTP2_MAX_STREAMS=4\nMAX_CONNECTIONS_PER_CLIENT=1\n";
    let broker = InProcess::start(&ini(&tls, extra, &[origin.addr])).await;
    let (send, _driver) = h2_client(broker.addr(), &tls).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut send = send.clone();
        held.push(tokio::spawn(async move {
            fetch(&mut send, get("/hold", &[]), None).await
        }));
    }
    eventually("4 streams held", || {
        origin.held.load(std::sync::atomic::Ordering::SeqCst) == 4
    })
    .await;
    // A second connection of the same client: its request gets the 503 page.
    let (mut second, _second_driver) = h2_client(broker.addr(), &tls).await;
    let refused = fetch(&mut second, get("/y", &[]), None).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(origin.held.load(std::sync::atomic::Ordering::SeqCst), 4);
    origin.release(8);
    for answer in held {
        assert_eq!(answer.await.unwrap().body, "released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_query_connection_gives_its_place_up_and_waits_its_10s_as_over_http11() {
    let tls = tls();
    let origin = Origin::start().await;
    let extra = "QUERY_MAX_CONNECTIONS=1\nHTTP_REQUEST_TIMEOUT=60s\n";
    let broker = InProcess::start(&ini(&tls, extra, &[origin.addr])).await;
    let ping = || get("/TOTVS_BROKER_QUERY/PING", &[]);
    let (mut first, first_driver) = h2_client(broker.addr(), &tls).await;
    assert_eq!(fetch(&mut first, ping(), None).await.status, 200);
    // The first connection idles: its place goes to another client's query (a 503 went
    // back to every such query while the first connection lived, before).
    let mut second = None;
    eventually_async("a second connection's query answered", async || {
        let (mut send, driver) = h2_client(broker.addr(), &tls).await;
        let answer = fetch(&mut send, ping(), None).await;
        second = Some((send, driver));
        answer.status == StatusCode::OK
    })
    .await;
    // The first's next request is refused unprocessed (its client sends it again on a new
    // connection), and the connection ends with a GOAWAY.
    let mut first = first.ready().await.unwrap();
    let (response, _) = first.send_request(ping(), true).unwrap();
    let refused = within("the refusal", response).await.unwrap_err();
    assert_eq!(
        refused.reason(),
        Some(h2::Reason::REFUSED_STREAM),
        "{refused:?}"
    );
    within("the first connection's end", first_driver)
        .await
        .unwrap()
        .ok();
    // The second, idle, is closed after a query connection's 10 s wait for its next
    // request, not HTTP_REQUEST_TIMEOUT's minute.
    let (_send, driver) = second.unwrap();
    let started = std::time::Instant::now();
    within("the idle query connection's end", driver)
        .await
        .unwrap()
        .ok();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_0_offers_http11_only_and_a_reload_turns_it_on_for_new_connections() {
    let tls = tls();
    let origin = Origin::start().await;
    let broker = InProcess::start(&ini(&tls, "HTTP2=0\n", &[origin.addr])).await;
    let old = tls_connect(broker.addr(), &tls, &[b"h2", b"http/1.1"]).await;
    assert_eq!(old.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    broker.reload(&ini(&tls, "HTTP2=1\n", &[origin.addr])).await;
    let (mut send, _driver) = h2_client(broker.addr(), &tls).await;
    assert_eq!(fetch(&mut send, get("/new", &[]), None).await.status, 200);
    // The connection made before keeps its HTTP/1.1.
    let mut old = old;
    old.write_all(b"GET /old HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    old.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// nginx 1.22 (Debian's) terminating TLS and HTTP/2 (`listen ... ssl http2`) in front of
/// `origin`, streaming request bodies as they come (as the broker does): one process
/// (`master_process off`), killed when dropped.
struct Nginx {
    _dir: tempfile::TempDir,
    _process: tokio::process::Child,
    port: u16,
}

impl Nginx {
    async fn start(program: &std::path::Path, tls: &Tls, origin: SocketAddr) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path().display();
        let (cert, key) = tls_files(tls);
        let conf = format!(
            "master_process off;\ndaemon off;\nuser root;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
             http {{\n access_log off;\n client_body_temp_path {d}/cb;\n \
             proxy_temp_path {d}/pt;\n fastcgi_temp_path {d}/ft;\n uwsgi_temp_path {d}/ut;\n \
             scgi_temp_path {d}/st;\n server {{\n  listen 127.0.0.1:{port} ssl http2;\n  \
             ssl_certificate {cert};\n  ssl_certificate_key {key};\n  location / {{\n   \
             proxy_pass http://{origin};\n   proxy_http_version 1.1;\n   \
             proxy_set_header Connection \"\";\n   proxy_set_header Host $http_host;\n   \
             proxy_request_buffering off;\n   proxy_buffering off;\n  }}\n }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let process = tokio::process::Command::new(program)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(format!("{d}/"))
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        eventually_async("nginx listening", async || {
            TcpStream::connect(addr).await.is_ok()
        })
        .await;
        Nginx {
            _dir: dir,
            _process: process,
            port,
        }
    }
}

/// The certificate and key files the broker's `tls` lines name.
fn tls_files(tls: &Tls) -> (String, String) {
    let value = |key: &str| {
        let line = tls.lines.lines().find(|l| l.starts_with(key)).unwrap();
        line[key.len()..].to_string()
    };
    (value("SSL_CERTIFICATE="), value("SSL_KEY="))
}

/// One request of the differential: its head, and its body in DATA frames (none: the HEADERS
/// end the stream).
fn differential_requests() -> Vec<(Request<()>, Option<Vec<u8>>)> {
    let with = |method: Method, path: &str, fields: &[(&str, &str)]| {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"));
        for (name, value) in fields {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap()
    };
    let sized = vec![b's'; 5000];
    vec![
        (
            with(
                Method::GET,
                "/get?a=1&b=two",
                &[("cookie", "a=1"), ("cookie", "b=2")],
            ),
            None,
        ),
        (with(Method::HEAD, "/head", &[]), None),
        (
            with(Method::POST, "/post", &[("content-length", "5000")]),
            Some(sized),
        ),
        (with(Method::POST, "/stream", &[]), Some(vec![b'c'; 3000])),
        (with(Method::PUT, "/put", &[]), Some(Vec::new())),
        (with(Method::DELETE, "/delete", &[("accept", "*/*")]), None),
        (with(Method::GET, "/status/204", &[]), None),
        (with(Method::GET, "/status/304", &[]), None),
        (with(Method::GET, "/status/404", &[]), None),
        (with(Method::GET, "/status/503", &[]), None),
        (with(Method::GET, "/bytes/100000", &[]), None),
        (with(Method::GET, "/bytes/chunked/100000", &[]), None),
        (with(Method::HEAD, "/bytes/chunked/1000", &[]), None),
    ]
}

/// What a request of the differential became at the origin: method, target, body, its
/// framing (`length` or `chunked` or none) and its one `Cookie` line.
fn at_origin(seen: &harness::Seen) -> (String, String, Bytes, &'static str, Option<String>) {
    let framing = if seen.headers.contains_key("transfer-encoding") {
        "chunked"
    } else if seen.headers.contains_key("content-length") {
        "length"
    } else {
        "none"
    };
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    let cookie = (!cookies.is_empty()).then(|| {
        let text: Vec<_> = cookies.iter().map(|v| v.to_str().unwrap()).collect();
        text.join(" | ")
    });
    (
        seen.method.clone(),
        seen.target.clone(),
        seen.body.clone(),
        framing,
        cookie,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nginx"]
async fn the_same_requests_through_nginx_and_the_broker_answer_and_reach_the_origin_alike() {
    let Some(program) = find_program("nginx") else {
        return;
    };
    let tls = tls();
    let (ours, theirs) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&tls, "", &[ours.addr])).await;
    let nginx = Nginx::start(&program, &tls, theirs.addr).await;
    let nginx_addr = SocketAddr::from(([127, 0, 0, 1], nginx.port));
    let (mut to_broker, _a) = h2_client(broker.addr(), &tls).await;
    let (mut to_nginx, _b) = h2_client(nginx_addr, &tls).await;
    for (request, body) in differential_requests() {
        let what = format!("{} {}", request.method(), request.uri());
        let again = || {
            let mut copy = Request::new(());
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.headers_mut() = request.headers().clone();
            copy
        };
        let a = fetch(&mut to_broker, again(), body.as_deref()).await;
        let b = fetch(&mut to_nginx, again(), body.as_deref()).await;
        assert_eq!(a.status, b.status, "{what}: {a:?} / {b:?}");
        assert_eq!(a.body, b.body, "{what}");
        for field in ["content-length", "content-type"] {
            assert_eq!(
                a.headers.get(field),
                b.headers.get(field),
                "{what}: {field}"
            );
        }
    }
    let (ours, theirs) = (ours.seen.lock().unwrap(), theirs.seen.lock().unwrap());
    let targets: Vec<_> = ours.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/get?a=1&b=two",
            "/head",
            "/post",
            "/stream",
            "/put",
            "/delete"
        ]
    );
    assert_eq!(ours.len(), theirs.len());
    for (a, b) in ours.iter().zip(theirs.iter()) {
        assert_eq!(at_origin(a), at_origin(b), "{a:?} / {b:?}");
    }
    // The framing each chose: the client's length, chunks for a body of unknown length.
    let framing: Vec<_> = ours.iter().map(|s| at_origin(s).3).collect();
    assert_eq!(
        framing,
        ["none", "none", "length", "chunked", "chunked", "none"]
    );
    assert_eq!(at_origin(&ours[0]).4.as_deref(), Some("a=1; b=2"));
}
