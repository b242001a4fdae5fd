//! The request head as the HTTP broker passes it on or refuses it, through the real broker
//! (`[BALANCE_HTTP]` on a generated `appserver.ini`) to a raw server that records the exact
//! bytes of each head it receives: upgrades only to the protocols `HTTP_UPGRADE_PROTOCOLS`
//! allows (no `h2c` tunnel), `Host` and the request target checked (RFC 9112 3.2), the
//! addresses a client names replaced by the broker's, `TRACE` refused and `Max-Forwards`
//! counted down, and every answer of the broker's own saying what was wrong, in its language,
//! hyper's refusals of a malformed head included.
//!
//! Clients are raw sockets writing exact bytes, and the server's side is read as bytes too,
//! so these tests hold whatever HTTP engine the broker runs.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use appbroker::http::Settings;
use harness::{
    DEADLINE, InProcess, Ini, LoopbackEngine, TestUpstreams, dead_addr, raw_exchange, raw_origin,
    read_head, server_value,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An ini with one `[BALANCE_HTTP]` on `@PORT@` over `server`; `general` and `section` are
/// lines added to `[General]` and to the balancer.
fn ini(server: SocketAddr, general: &str, section: &str) -> String {
    let lines = format!("QUERY_ALLOW=127.0.0.1\n{section}");
    Ini::new()
        .general(general)
        .balancer("BALANCE_HTTP", "@PORT@", &lines, [server_value(server)])
        .text()
}

/// A server that records the exact head of every request it receives, reads the body its
/// `Content-Length` gives, and answers `200` with `ok`, keeping the connection.
struct Recorder {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        Recorder::answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await
    }

    /// A recorder that answers every request with `answer`, then goes on reading.
    async fn answering(answer: &'static [u8]) -> Recorder {
        let heads: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let seen = Arc::clone(&heads);
        let (addr, _) = raw_origin(move |mut stream, _| {
            let seen = Arc::clone(&seen);
            async move {
                loop {
                    let head = read_head(&mut stream).await;
                    if !head.ends_with(b"\r\n\r\n") {
                        return;
                    }
                    let length = field(&head, "content-length").map_or(0, |v| v.parse().unwrap());
                    let mut body = vec![0; length];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    // No body to a HEAD, whatever the answer says of its length.
                    let answer = match head.starts_with(b"HEAD ") {
                        true => {
                            &answer[..answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4]
                        }
                        false => answer,
                    };
                    seen.lock().unwrap().push(head);
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            }
        })
        .await;
        Recorder { addr, heads }
    }

    /// The heads received so far.
    fn heads(&self) -> Vec<Vec<u8>> {
        self.heads.lock().unwrap().clone()
    }

    /// The one head received since the last call (fails if there is not exactly one).
    fn only_head(&self) -> Head {
        let heads = std::mem::take(&mut *self.heads.lock().unwrap());
        assert_eq!(
            heads.len(),
            1,
            "{:?}",
            heads
                .iter()
                .map(|h| String::from_utf8_lossy(h))
                .collect::<Vec<_>>()
        );
        Head::parse(&heads[0])
    }
}

/// A head as received: its request line and its fields in order, names in lower case (their
/// case is the engine's to choose), values as bytes.
struct Head {
    line: String,
    fields: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v)))
            .collect();
        write!(f, "{} {fields:?}", self.line)
    }
}

impl Head {
    fn parse(raw: &[u8]) -> Head {
        let text = raw.strip_suffix(b"\r\n\r\n").expect("a whole head");
        let mut lines = text
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let line = String::from_utf8(lines.next().unwrap().to_vec()).unwrap();
        let fields = lines
            .map(|l| {
                let colon = l.iter().position(|&b| b == b':').expect("name: value");
                let name = String::from_utf8(l[..colon].to_vec())
                    .unwrap()
                    .to_ascii_lowercase();
                (name, l[colon + 1..].trim_ascii().to_vec())
            })
            .collect();
        Head { line, fields }
    }

    /// Every value of `name`, in order.
    fn all(&self, name: &str) -> Vec<String> {
        self.fields
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// The one value of `name`, `None` when absent (fails when given twice).
    fn one(&self, name: &str) -> Option<String> {
        let all = self.all(name);
        assert!(all.len() <= 1, "{name} {all:?} in {self:?}");
        all.into_iter().next()
    }
}

/// The value of the field `name` (lower case) in a raw head, if any.
fn field(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head).lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

/// The head of the next answer on `stream` (its body, if any, left unread).
async fn answer_head(stream: &mut TcpStream) -> String {
    let head = tokio::time::timeout(DEADLINE, read_head(stream))
        .await
        .expect("an answer in time");
    String::from_utf8_lossy(&head).into_owned()
}

/// One answer read off `stream`: its head, and its body by its `Content-Length`.
async fn read_answer(stream: &mut TcpStream) -> (String, String) {
    let head = answer_head(stream).await;
    let length = field(head.as_bytes(), "content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

/// Sends `request` on a new connection; the first answer.
async fn ask(addr: SocketAddr, request: &[u8]) -> (String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_answer(&mut stream).await
}

fn status_line(head: &str) -> &str {
    head.lines().next().unwrap_or_default()
}

// ---- upgrades -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_allowed_upgrades_reach_the_server() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    // h2c (the smuggling pattern): Upgrade, its Connection token and HTTP2-Settings go; the
    // request goes on as plain HTTP.
    let h2c = b"GET /h2c HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n";
    let (answer, body) = ask(broker.addr(), h2c).await;
    assert_eq!((status_line(&answer), &body[..]), ("HTTP/1.1 200 OK", "ok"));
    let head = server.only_head();
    assert_eq!(head.line, "GET /h2c HTTP/1.1");
    for gone in ["upgrade", "connection", "http2-settings"] {
        assert_eq!(head.one(gone), None, "{gone}: {head:?}");
    }
    // WebSocket passes, in any case; of an offer of two, only the allowed one.
    for (offer, sent) in [("websocket", "websocket"), ("h2c, WebSocket", "WebSocket")] {
        let request = format!(
            "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, upgrade\r\nUpgrade: {offer}\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        ask(broker.addr(), request.as_bytes()).await;
        let head = server.only_head();
        assert_eq!(head.one("upgrade").as_deref(), Some(sent), "{head:?}");
        assert_eq!(
            head.one("connection").as_deref(),
            Some("upgrade"),
            "{head:?}"
        );
        assert_eq!(
            head.one("sec-websocket-key").as_deref(),
            Some("dGhlIHNhbXBsZSBub25jZQ==")
        );
    }
    // A reload that allows h2c too lets it pass with its settings; one that allows nothing
    // takes WebSocket's Upgrade out as well.
    broker
        .reload(&ini(
            server.addr,
            "HTTP_UPGRADE_PROTOCOLS=websocket, H2C",
            "",
        ))
        .await;
    ask(broker.addr(), h2c).await;
    let head = server.only_head();
    assert_eq!(head.one("upgrade").as_deref(), Some("h2c"));
    assert_eq!(
        head.one("http2-settings").as_deref(),
        Some("AAMAAABkAAQAAP__")
    );
    let connection = head.one("connection").unwrap().to_ascii_lowercase();
    assert_eq!(connection, "upgrade, http2-settings");
    broker
        .reload(&ini(server.addr, "", "HTTP_UPGRADE_PROTOCOLS="))
        .await;
    let ws = b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
    ask(broker.addr(), ws).await;
    let head = server.only_head();
    assert_eq!((head.one("upgrade"), head.one("connection")), (None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_switches_to_an_upgrade_taken_out_opens_no_tunnel() {
    // The attacker's own server accepts h2c whatever it is sent, and speaks it at once.
    let server = Recorder::answering(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nTUNNEL",
    )
    .await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut stream).await;
    assert_eq!(status_line(&head), "HTTP/1.1 502 Bad Gateway", "{head}");
    // The connection is still HTTP: the next request is answered as one.
    stream
        .write_all(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let (next, next_body) = read_answer(&mut stream).await;
    assert_eq!(status_line(&next), "HTTP/1.1 502 Bad Gateway", "{next}");
    for answer in [&head, &body, &next, &next_body] {
        assert!(!answer.contains("TUNNEL"), "{answer}");
    }
    let lines: Vec<String> = server.heads().iter().map(|h| Head::parse(h).line).collect();
    assert_eq!(lines, ["GET / HTTP/1.1", "GET /next HTTP/1.1"]);
}

// ---- Host and the request target ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_names_no_host_is_refused_and_a_valid_one_mirrored() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    for bad in ["h x", "a/b?c", "a, b", "user@evil", "", "[::1", "S\u{e3}o"] {
        let request = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
        let answer = raw_exchange(broker.addr(), request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{bad:?}: {answer}");
        assert!(answer.contains("is not a valid host"), "{bad:?}: {answer}");
    }
    for (request, says) in [
        ("GET / HTTP/1.1\r\n\r\n", "needs a Host header"),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
            "more than one Host",
        ),
        (
            "GET http://user@evil/x HTTP/1.1\r\nHost: h\r\n\r\n",
            "a user name",
        ),
        ("GET h:443 HTTP/1.1\r\nHost: h\r\n\r\n", "bare host:port"),
        (
            "OPTIONS h:443 HTTP/1.1\r\nHost: h\r\n\r\n",
            "bare host:port",
        ),
    ] {
        let answer = raw_exchange(broker.addr(), request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{request:?}: {answer}");
        assert!(answer.contains(says), "{request:?}: {answer}");
    }
    assert!(
        server.heads().is_empty(),
        "a refused request reached the server"
    );
    for good in [
        "a,b",
        "[::1]:8080",
        "portal.example:8080",
        "192.0.2.7",
        "h_x.example.",
    ] {
        let request = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
        let (answer, _) = ask(broker.addr(), request.as_bytes()).await;
        assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "{good}");
        let head = server.only_head();
        assert_eq!(head.one("host").as_deref(), Some(good));
        assert_eq!(head.one("x-forwarded-host").as_deref(), Some(good));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_targets_authority_is_the_host_and_a_hostless_request_gets_the_servers() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    let request = b"GET http://app.example:81/p?q=1 HTTP/1.1\r\nHost: other\r\n\r\n";
    ask(broker.addr(), request).await;
    let head = server.only_head();
    assert_eq!(head.line, "GET /p?q=1 HTTP/1.1");
    assert_eq!(head.one("host").as_deref(), Some("app.example:81"));
    assert_eq!(
        head.one("x-forwarded-host").as_deref(),
        Some("app.example:81")
    );
    // HTTP/1.0 may leave Host out; the server is sent HTTP/1.1, which needs one: its own.
    let answer = raw_exchange(broker.addr(), b"GET /old HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1."), "{answer}");
    let head = server.only_head();
    assert_eq!(head.line, "GET /old HTTP/1.1");
    assert_eq!(head.one("host"), Some(server.addr.to_string()));
    assert_eq!(head.one("x-forwarded-host"), None);
}

#[tokio::test]
async fn a_hostless_request_retried_on_the_next_server_names_that_one() {
    // The engine alone, over servers tried in order: the first refuses the connect.
    let server = Recorder::start().await;
    let dead = dead_addr().await;
    let broker = LoopbackEngine::start(
        TestUpstreams::new(&[dead, server.addr]),
        Settings::default(),
    )
    .await;
    let answer = raw_exchange(broker.addr, b"GET /old HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1."), "{answer}");
    let head = server.only_head();
    assert_eq!(head.one("host"), Some(server.addr.to_string()));
}

// ---- the client's addresses ---------------------------------------------------------------

/// A request naming addresses of its own choosing in every header that can carry one.
const SPOOFING: &[u8] = b"GET /who HTTP/1.1\r\nHost: portal.example\r\n\
    Forwarded: for=10.0.0.1;proto=https\r\nX-Real-IP: 10.0.0.2\r\nTrue-Client-IP: 10.0.0.3\r\n\
    X-Client-IP: 10.0.0.4\r\nX-Forwarded-Port: 443\r\nX-Forwarded-For: 203.0.113.9\r\n\
    X-Forwarded-Proto: https\r\nX-Forwarded-Host: spoofed.example\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_addresses_a_client_names_never_reach_the_server() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    // With HTTP_FORWARDED_HEADERS (the default) the broker's own, set once, the client's
    // X-Forwarded-For appended to as nginx does; without, the client's X-Forwarded-* pass as
    // written (a proxy in front may set them). The other addresses go either way.
    let cases = [
        (
            "1",
            [
                ("x-real-ip", Some("127.0.0.1")),
                ("x-forwarded-for", Some("203.0.113.9, 127.0.0.1")),
                ("x-forwarded-proto", Some("http")),
                ("x-forwarded-host", Some("portal.example")),
            ],
        ),
        (
            "0",
            [
                ("x-real-ip", None),
                ("x-forwarded-for", Some("203.0.113.9")),
                ("x-forwarded-proto", Some("https")),
                ("x-forwarded-host", Some("spoofed.example")),
            ],
        ),
    ];
    for (flag, seen) in cases {
        let section = format!("HTTP_FORWARDED_HEADERS={flag}");
        broker.reload(&ini(server.addr, "", &section)).await;
        ask(broker.addr(), SPOOFING).await;
        let head = server.only_head();
        for gone in [
            "forwarded",
            "true-client-ip",
            "x-client-ip",
            "x-forwarded-port",
        ] {
            assert_eq!(head.one(gone), None, "{section} {gone}: {head:?}");
        }
        for (name, value) in seen {
            assert_eq!(
                head.one(name).as_deref(),
                value,
                "{section} {name}: {head:?}"
            );
        }
    }
}

// ---- TRACE and Max-Forwards ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_is_refused_and_options_counts_max_forwards_down() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    let answer = raw_exchange(
        broker.addr(),
        b"TRACE / HTTP/1.1\r\nHost: h\r\nCookie: secret=1\r\nMax-Forwards: 0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert_eq!(
        field(head.as_bytes(), "allow").as_deref(),
        Some("GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH")
    );
    assert!(body.contains("does not pass TRACE on"), "{body}");
    assert!(!body.contains("secret"), "{body}");
    assert!(server.heads().is_empty());
    // OPTIONS with hops left goes on with one less.
    ask(
        broker.addr(),
        b"OPTIONS /x HTTP/1.1\r\nHost: h\r\nMax-Forwards: 3\r\n\r\n",
    )
    .await;
    assert_eq!(server.only_head().one("max-forwards").as_deref(), Some("2"));
    // With none left the broker is its last recipient (RFC 9110 7.6.2) and answers it; the
    // connection goes on.
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream
        .write_all(b"OPTIONS * HTTP/1.1\r\nHost: h\r\nMax-Forwards: 0\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut stream).await;
    assert_eq!(status_line(&head), "HTTP/1.1 200 OK", "{head}");
    assert_eq!(
        field(head.as_bytes(), "allow").as_deref(),
        Some("GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH")
    );
    assert_eq!(
        field(head.as_bytes(), "content-length").as_deref(),
        Some("0")
    );
    assert_eq!(body, "");
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    stream
        .write_all(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut stream).await;
    assert_eq!((status_line(&head), &body[..]), ("HTTP/1.1 200 OK", "ok"));
    assert_eq!(server.only_head().line, "GET /next HTTP/1.1");
}

// ---- the broker's own answers ---------------------------------------------------------------

/// A request the broker answers itself, the status it gets, and what its page says in each
/// language (English, Portuguese).
struct Refused {
    send: Vec<u8>,
    status: &'static str,
    says: [&'static str; 2],
}

fn refused_requests() -> Vec<Refused> {
    let case = |send: &[u8], status, says| Refused {
        send: send.to_vec(),
        status,
        says,
    };
    let headers = |n: usize| -> Vec<u8> {
        let fields: String = (1..n).map(|i| format!("X-H{i}: v\r\n")).collect();
        format!("GET / HTTP/1.1\r\nHost: h\r\n{fields}\r\n").into_bytes()
    };
    let cookie = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nCookie: {}\r\n\r\n",
        "c".repeat(70 * 1024)
    );
    let target = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(20 * 1024));
    vec![
        case(
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 40\r\n\r\nhello",
            "400 Bad Request",
            ["Content-Length is not one number", "Content-Length da requisi\u{e7}\u{e3}o n\u{e3}o \u{e9} um n\u{fa}mero s\u{f3}"],
        ),
        case(
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n",
            "400 Bad Request",
            ["obsolete line folding", "dobra de linha obsoleta"],
        ),
        case(
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n",
            "400 Bad Request",
            ["is not name: value", "n\u{e3}o \u{e9} nome: valor"],
        ),
        case(
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "400 Bad Request",
            ["Transfer-Encoding is not allowed", "Transfer-Encoding da requisi\u{e7}\u{e3}o n\u{e3}o \u{e9} aceito"],
        ),
        case(
            b"GET / HTTP/1.1 extra\r\nHost: h\r\n\r\n",
            "400 Bad Request",
            ["first line is not METHOD", "primeira linha da requisi\u{e7}\u{e3}o"],
        ),
        case(
            &headers(101),
            "431 Request Header Fields Too Large",
            ["more than 100 header lines", "mais de 100 linhas de cabe\u{e7}alho"],
        ),
        case(
            cookie.as_bytes(),
            "431 Request Header Fields Too Large",
            ["larger than 64 KiB", "passa de 64 KiB"],
        ),
        case(
            target.as_bytes(),
            "414 URI Too Long",
            ["longer than the broker accepts", "mais longo do que o broker aceita"],
        ),
        case(
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            "400 Bad Request",
            ["chunked encoding is malformed", "codifica\u{e7}\u{e3}o chunked est\u{e1} malformado"],
        ),
        case(
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "501 Not Implemented",
            ["a coding other than chunked", "uma codifica\u{e7}\u{e3}o al\u{e9}m de chunked"],
        ),
        case(
            b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n",
            "501 Not Implemented",
            ["does not pass CONNECT on", "n\u{e3}o repassa CONNECT"],
        ),
        case(
            b"GET / HTTP/1.1\r\n\r\n",
            "400 Bad Request",
            ["needs a Host header", "precisa do cabe\u{e7}alho Host"],
        ),
    ]
}

/// Checks an answer of the broker's own: `status`, a page framed by its length that says
/// `says`, the connection closed after it.
fn assert_refused(answer: &str, status: &str, says: &str) {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    assert_eq!(status_line(head), format!("HTTP/1.1 {status}"), "{answer}");
    assert!(body.contains(says), "`{says}` not in: {answer}");
    let length = field(head.as_bytes(), "content-length").unwrap();
    assert_eq!(length, body.len().to_string(), "{answer}");
    assert_eq!(
        field(head.as_bytes(), "connection")
            .map(|c| c.to_ascii_lowercase())
            .as_deref(),
        Some("close"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_the_brokers_own_says_what_was_wrong_in_its_language() {
    let server = Recorder::start().await;
    for (language, i) in [("en", 0), ("pt-BR", 1)] {
        let broker = InProcess::start(&ini(server.addr, &format!("LANGUAGE={language}"), "")).await;
        for case in refused_requests() {
            let answer = raw_exchange(broker.addr(), &case.send).await;
            assert_refused(&answer, case.status, case.says[i]);
            assert!(answer.contains(&format!("lang=\"{language}\"")), "{answer}");
        }
    }
    assert!(
        server.heads().is_empty(),
        "a refused request reached the server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_head_after_answers_on_a_kept_alive_connection_gets_its_page() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    // An answer with a body, one without (HEAD), one of the broker's own (OPTIONS): then the
    // malformed head is answered with the page, not an empty 400.
    for request in [
        &b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
        b"HEAD /b HTTP/1.1\r\nHost: h\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: h\r\nMax-Forwards: 0\r\n\r\n",
    ] {
        stream.write_all(request).await.unwrap();
        let head = answer_head(&mut stream).await;
        assert_eq!(status_line(&head), "HTTP/1.1 200 OK", "{head}");
        if request.starts_with(b"GET") {
            let mut ok = [0u8; 2];
            stream.read_exact(&mut ok).await.unwrap();
        }
    }
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\nx")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_refused(
        &String::from_utf8_lossy(&rest),
        "400 Bad Request",
        "Content-Length is not one number",
    );
    assert_eq!(server.heads().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_own_400_reaches_the_client_as_the_server_wrote_it() {
    // The server refuses everything with an empty 400, as hyper refuses a head: only hyper's
    // is replaced by the broker's page, whatever came before on the connection.
    let server =
        Recorder::answering(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    for request in [
        &b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"[..],
        b"HEAD /b HTTP/1.1\r\nHost: h\r\n\r\n",
        b"HEAD /c HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /d HTTP/1.1\r\nHost: h\r\n\r\n",
    ] {
        stream.write_all(request).await.unwrap();
        let head = answer_head(&mut stream).await;
        assert_eq!(status_line(&head), "HTTP/1.1 400 Bad Request", "{head}");
        assert_eq!(
            field(head.as_bytes(), "content-length").as_deref(),
            Some("0"),
            "{head}"
        );
        assert_eq!(field(head.as_bytes(), "content-type"), None, "{head}");
    }
    assert_eq!(server.heads().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_header_lines_pass_and_one_more_is_431() {
    let server = Recorder::start().await;
    let broker = InProcess::start(&ini(server.addr, "", "")).await;
    let head = |n: usize| {
        let fields: String = (1..n).map(|i| format!("X-H{i}: v\r\n")).collect();
        format!("GET / HTTP/1.1\r\nHost: h\r\n{fields}\r\n")
    };
    let (answer, _) = ask(broker.addr(), head(100).as_bytes()).await;
    assert_eq!(status_line(&answer), "HTTP/1.1 200 OK");
    assert_eq!(server.only_head().all("x-h99").len(), 1);
    let answer = raw_exchange(broker.addr(), head(101).as_bytes()).await;
    assert_refused(
        &answer,
        "431 Request Header Fields Too Large",
        "more than 100 header lines",
    );
}
