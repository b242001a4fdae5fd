//! The differential test: a fixed corpus of requests and hostile responses, each
//! through the core (the pure driver) and through hyper (its server, and its client, driven
//! over a tokio duplex), asserting the same framing decision: which requests the bytes frame
//! and their bodies, or the refusal; which response and its body, or none. Where the engine
//! differs on purpose, the case says why, and the test asserts that the two do differ, so the
//! list of differences stays true. hyper's client is given the same leniency toward servers
//! as the core (whitespace before a colon, folded lines), which its options allow.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::driver::{Message, Requests, requests, responses};
use crate::http::h1::{Asked, HeadScan, Method, ResponseHead, ToClient, Version};

/// A client's bytes, and why the engine decides otherwise than hyper, if it does.
type RequestCase = (&'static str, &'static [u8], Option<&'static str>);

const SMUGGLING: &[RequestCase] = &[
    ("a GET", b"GET /a?b HTTP/1.1\r\nHost: h\r\n\r\n", None),
    ("a length", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc", None),
    ("chunks", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", None),
    ("chunks with trailers", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1;e=1\r\nz\r\n0\r\nT: 1\r\n\r\n", None),
    ("pipelined", b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nPOST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nokGET /3 HTTP/1.1\r\nHost: h\r\n\r\n", None),
    ("CL.TE: the coding wins, the connection ends", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n", None),
    ("TE.CL: the coding wins", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", None),
    ("xchunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", None),
    ("a space before the colon", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", None),
    ("a tab before the value", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n", None),
    ("chunked then another coding", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n", None),
    ("a folded coding", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: x\r\n chunked\r\n\r\n0\r\n\r\n", None),
    ("a first line folded", b"POST / HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: h\r\n\r\n0\r\n\r\n", None),
    ("gzip, chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", Some("a coding besides chunked is a 501, as the hyper engine refused after hyper's parse")),
    ("chunked, chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", Some("chunked twice is a 501, as a coding besides one chunked (RFC 9112 §6.1), as the hyper engine refused after hyper's parse")),
    ("an empty element after chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked,\r\n\r\n0\r\n\r\n", Some("empty list elements are ignored (RFC 9110 §5.6.1); hyper reads the last raw element")),
    ("TE on HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", None),
    ("a plus sign", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc", None),
    ("two lengths", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", None),
    ("one length twice", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", None),
    ("a list of lengths", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc", None),
    ("a truncated length", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc", None),
    ("truncated chunks", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", None),
    ("a chunk size that overflows", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n", None),
    ("a chunk with no CRLF after its data", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n", None),
];

const LINES: &[RequestCase] = &[
    ("bare LFs", b"GET / HTTP/1.1\nHost: h\n\n", None),
    ("empty lines before the request", b"\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", None),
    ("obs-fold", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", None),
    ("NUL in a value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n", None),
    ("CR in a value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n", None),
    ("a control byte in a value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x0bb\r\n\r\n", None),
    ("a space in the target", b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", None),
    ("HTTP/1.0", b"GET / HTTP/1.0\r\n\r\n", None),
    ("HTTP/1.0 kept alive", b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n", None),
    ("Connection: close ends the connection", b"GET /1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n", None),
    ("Expect: 100-continue", b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok", None),
    ("a head cut short", b"GET / HTTP/1.1\r\nHost: h\r\n", None),
    ("HTTP/1.2", b"GET / HTTP/1.2\r\nHost: h\r\n\r\n", Some("HTTP/1.2 is read as 1.1 (RFC 9110 §2.5); httparse refuses it")),
    ("HTTP/2.0", b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", Some("another major version is a 505 (RFC 9110 §15.6.6); hyper says 400")),
    ("no Host", b"GET / HTTP/1.1\r\n\r\n", Some("HTTP/1.1 without Host is a 400 (RFC 9112 §3.2), as the hyper engine refused after hyper's parse")),
    ("a bad Host", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", Some("a Host that is no host is a 400 (RFC 9112 3.2)")),
];

/// A server's bytes, the method asked, and why the engine decides otherwise than hyper.
type ResponseCase = (&'static str, &'static [u8], Method, Option<&'static str>);

const RESPONSES: &[ResponseCase] = &[
    ("a length", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Method::Get, None),
    ("chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", Method::Get, None),
    ("until close", b"HTTP/1.1 200 OK\r\n\r\nall of it", Method::Get, None),
    ("another coding: until close", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzzz", Method::Get, None),
    ("CL and TE: the chunks win", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Method::Get, None),
    ("two lengths", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", Method::Get, None),
    ("a list of one length", b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", Method::Get, None),
    ("a bad length", b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", Method::Get, None),
    ("TE from HTTP/1.0", b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", Method::Get, None),
    ("HEAD with a body", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", Method::Head, None),
    ("204 with a body", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", Method::Get, None),
    ("304 with chunks", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", Method::Get, None),
    ("100 then 200", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Method::Post, Some("1xx is forwarded (RFC 9110 §15.2); hyper's client drops it")),
    ("103 then 200", b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Method::Get, Some("1xx is forwarded; hyper's client drops it")),
    ("a truncated length", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", Method::Get, None),
    ("truncated chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", Method::Get, None),
    ("a bare LF in chunk framing", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n", Method::Get, None),
    ("two responses to one request", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil", Method::Get, None),
    ("NUL in a value", b"HTTP/1.1 200 OK\r\nX: a\0b\r\nContent-Length: 0\r\n\r\n", Method::Get, None),
    ("obs-fold, mended", b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\nok", Method::Get, None),
    ("a space before the colon, mended", b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok", Method::Get, None),
    ("bare LFs", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", Method::Get, None),
    ("no reason", b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", Method::Get, None),
    ("HTTP/1.0", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", Method::Get, None),
    ("HTTP/1.2", b"HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok", Method::Get, Some("HTTP/1.2 is read as 1.1; httparse refuses it")),
    ("101 unasked", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nraw", Method::Get, Some("101 to a request that asked no upgrade is refused (RFC 9110 §15.2.2); hyper hands it over")),
];

/// What hyper's server made of `raw`: the requests its service saw, and its refusal.
async fn hyper_server(raw: &[u8]) -> Requests {
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let service = {
        let seen = Arc::clone(&seen);
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let seen = Arc::clone(&seen);
            async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await.ok().map(|b| b.to_bytes().to_vec());
                let version = if parts.version == hyper::Version::HTTP_10 {
                    Version::Http10
                } else {
                    Version::Http11
                };
                let message = Message {
                    method: parts.method.as_str().as_bytes().to_vec(),
                    target: parts.uri.to_string().into_bytes(),
                    version,
                    body,
                };
                seen.lock().unwrap().push(message);
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .half_close(true)
        .serve_connection(TokioIo::new(server), service);
    let task = tokio::spawn(connection);
    client.write_all(raw).await.unwrap();
    client.shutdown().await.unwrap();
    let mut answers = Vec::new();
    client.read_to_end(&mut answers).await.unwrap();
    let _ = task.await;
    let messages = seen.lock().unwrap().clone();
    Requests {
        messages,
        refused: refusal(&answers),
        heads_at_eof: 0,
    }
}

/// The status of the last answer in `answers` when it is an error: hyper's refusal (its
/// service answers 200).
fn refusal(answers: &[u8]) -> Option<u16> {
    let last = answers
        .windows(9)
        .enumerate()
        .filter(|(at, w)| {
            w.starts_with(b"HTTP/1.") && (*at == 0 || answers[..*at].ends_with(b"\r\n\r\n"))
        })
        .map(|(at, _)| at)
        .next_back()?;
    let status = std::str::from_utf8(answers.get(last + 9..last + 12)?)
        .ok()?
        .parse()
        .ok()?;
    (status >= 400).then_some(status)
}

/// What hyper's client made of `raw` as the answer to a `method` request: the status and
/// the body, `None` for either when it refused.
async fn hyper_client(raw: &[u8], method: Method) -> (Option<u16>, Option<Vec<u8>>, bool) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (mut send, connection) = hyper::client::conn::http1::Builder::new()
        .allow_spaces_after_header_name_in_responses(true)
        .allow_obsolete_multiline_headers_in_responses(true)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(client))
        .await
        .unwrap();
    tokio::spawn(connection.with_upgrades());
    let name = match method {
        Method::Head => "HEAD",
        Method::Post => "POST",
        _ => "GET",
    };
    let request = Request::builder()
        .method(name)
        .uri("/")
        .header("host", "h")
        .body(Empty::new())
        .unwrap();
    let (response, _server) = tokio::join!(send.send_request(request), answer(server, raw));
    let Ok(response) = response else {
        return (None, None, false);
    };
    let status = response.status().as_u16();
    let length = response.headers().contains_key("content-length");
    let body = response
        .into_body()
        .collect()
        .await
        .ok()
        .map(|b| b.to_bytes().to_vec());
    (Some(status), body, length)
}

/// The server's side: read the request head, write `raw`, close the writing side.
async fn answer(mut server: DuplexStream, raw: &[u8]) -> DuplexStream {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && server.read(&mut byte).await.unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    server.write_all(raw).await.unwrap();
    server.shutdown().await.unwrap();
    server
}

/// Runs `future` on a runtime of its own, bounded: a case that hangs fails.
fn run<F: std::future::Future>(future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), future)
            .await
            .expect("the case ends")
    })
}

#[test]
fn requests_are_framed_as_hyper_frames_them_but_where_said() {
    for (name, raw, differs) in SMUGGLING.iter().chain(LINES) {
        let ours = requests(raw, &[]);
        let hyper = run(hyper_server(raw));
        match differs {
            None => assert_eq!(ours, hyper, "{name}: {}", raw.escape_ascii()),
            Some(why) => assert_ne!(ours, hyper, "{name} ({why}) no longer differs"),
        }
    }
}

#[test]
fn responses_are_framed_as_hyper_frames_them_but_where_said() {
    for (name, raw, method, differs) in RESPONSES {
        let asked = Asked {
            method: *method,
            upgrade: false,
        };
        let ours = responses(raw, &[], asked);
        let (status, body, _) = run(hyper_client(raw, *method));
        let same =
            (ours.status, ours.body.clone()) == (status, body.clone()) && ours.interim.is_empty();
        match differs {
            None => assert!(same, "{name}: ours {ours:?}, hyper's {status:?} {body:?}"),
            Some(why) => assert!(!same, "{name} ({why}) no longer differs"),
        }
    }
}

#[test]
fn chunks_win_over_a_length_where_hyper_keeps_the_length() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let asked = Asked {
        method: Method::Get,
        upgrade: false,
    };
    let ours = responses(raw, &[], asked);
    let (_, body, hyper_kept_length) = run(hyper_client(raw, Method::Get));
    assert_eq!(body.as_deref(), Some(&b"hello"[..]));
    assert!(
        hyper_kept_length,
        "hyper's response still says Content-Length: 3"
    );
    let head = String::from_utf8_lossy(&ours.head_out).to_lowercase();
    assert!(!head.contains("content-length"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
}

#[test]
fn an_http_1_0_client_is_answered_http_1_1_where_hyper_says_1_0() {
    let raw = b"GET / HTTP/1.0\r\n\r\n";
    let mut client = Vec::new();
    let (mut near, far) = tokio::io::duplex(1 << 16);
    run(async {
        let service = hyper::service::service_fn(|_| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let task = tokio::spawn(
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(far), service),
        );
        near.write_all(raw).await.unwrap();
        near.read_to_end(&mut client).await.unwrap();
        let _ = task.await;
    });
    assert!(
        client.starts_with(b"HTTP/1.0 200"),
        "{}",
        client.escape_ascii()
    );
    let mut served = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec();
    let asked = Asked {
        method: Method::Get,
        upgrade: false,
    };
    let head = ResponseHead::parse(&mut served, &mut HeadScan::default(), asked)
        .unwrap()
        .unwrap();
    let how = ToClient {
        version: Version::Http10,
        keep_alive: false,
    };
    let out = head
        .write(&served, head.to_client(&served, &how))
        .to_vec(&served);
    assert!(
        out.starts_with(b"HTTP/1.1 200 OK\r\nConnection: close\r\n"),
        "{}",
        out.escape_ascii()
    );
}
