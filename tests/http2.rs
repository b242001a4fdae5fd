//! HTTP/2 towards clients, on real loopback sockets: an HTTP balancer with a certificate
//! offers ALPN `h2` and serves each stream as the engine serves an HTTP/1.1 request (the
//! origins see HTTP/1.1, the rewrite, one `Cookie` line, the affinity kept), bodies both ways
//! under flow control, interim answers, `HEAD`, 204 and 304 without bodies, WebSocket over
//! HTTP/2 (RFC 8441) relayed as an HTTP/1.1 upgrade, the connection counted once, the drain's
//! `GOAWAY`, and the bounds: rapid reset, a shut window, idle connections, streams past the
//! limit, a client past `MAX_CONNECTIONS_PER_CLIENT`. The clients are the `h2` crate's here;
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
        "SSL_CERTIFICATE={}\nSSL_KEY={}\nQUERY_ALLOW=127.0.0.1\n",
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
    let mut ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\n{}{extra}",
        tls.lines
    );
    for (i, server) in servers.iter().enumerate() {
        ini.push_str(&format!(
            "REMOTE_SERVER_{:02}=127.0.0.1 {}\n",
            i + 1,
            server.port()
        ));
    }
    ini
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
