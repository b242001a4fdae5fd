//! What the core costs: the size of what it keeps per connection and per request (a test
//! holds the per-connection ones small: they stay in an idle connection's struct), and a
//! micro-benchmark of a browser's request head parsed and rewritten, printed, never judged:
//!
//! ```text
//! cargo test --release --lib http::h1::tests::measure -- --ignored --nocapture
//! ```
//!
//! `H1_BENCH_ITERATIONS=N` runs each figure N times exactly (for callgrind: two runs with
//! different N, the difference of their instruction counts over the difference of N).

use std::hint::black_box;
use std::io::IoSlice;
use std::mem::size_of;
use std::time::{Duration, Instant};

use crate::http::h1::{
    Asked, BodyReader, ChunkedDecoder, Editor, FieldName, Fields, Forwarded, HeadScan, Method,
    OutHead, RequestHead, ResponseHead, Span, ToClient, ToServer, Version,
};

/// A browser's navigation to a Protheus WebApp page (Chrome's headers, 15 lines, 856 bytes),
/// the broker's affinity cookie among others.
const BROWSER: &[u8] = b"GET /webapp/rest/api/framework/v1/menus?lang=pt-br HTTP/1.1\r\n\
Host: protheus.example.com.br:8080\r\n\
Connection: keep-alive\r\n\
sec-ch-ua: \"Chromium\";v=\"124\", \"Google Chrome\";v=\"124\", \"Not-A.Brand\";v=\"99\"\r\n\
sec-ch-ua-mobile: ?0\r\n\
sec-ch-ua-platform: \"Windows\"\r\n\
Upgrade-Insecure-Requests: 1\r\n\
User-Agent: Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36\r\n\
Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8\r\n\
Sec-Fetch-Site: same-origin\r\n\
Sec-Fetch-Mode: navigate\r\n\
Sec-Fetch-Dest: document\r\n\
Referer: https://protheus.example.com.br:8080/webapp/\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Accept-Language: pt-BR,pt;q=0.9,en-US;q=0.8,en;q=0.7\r\n\
Cookie: _ga=GA1.1.123456789.1700000000; TOTVS_BROKER_SH_001=01.AAAAAAAAAAAAAAAAAAAAAA; sid=abcdef0123456789\r\n\
\r\n";

/// A server's answer to it (9 lines).
const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\n\
Date: Tue, 21 May 2024 12:00:00 GMT\r\n\
Server: Protheus AppServer\r\n\
Content-Type: application/json; charset=utf-8\r\n\
Content-Length: 1234\r\n\
Cache-Control: no-cache, no-store\r\n\
Connection: keep-alive\r\n\
Keep-Alive: timeout=60\r\n\
X-Content-Type-Options: nosniff\r\n\
Vary: Accept-Encoding\r\n\
\r\n";

#[test]
fn what_an_idle_or_reading_connection_keeps_stays_small() {
    assert!(size_of::<HeadScan>() <= 12, "{}", size_of::<HeadScan>());
    assert!(
        size_of::<ChunkedDecoder>() <= 16,
        "{}",
        size_of::<ChunkedDecoder>()
    );
    assert!(size_of::<BodyReader>() <= 16, "{}", size_of::<BodyReader>());
    assert!(size_of::<Span>() == 8);
}

/// The request's way through the core: parsed, rewritten for its server with the forwarded
/// lines, the broker's cookie taken out, and its slices gathered for one write.
fn request_way(buf: &mut [u8]) -> usize {
    let head = RequestHead::parse(buf, &mut HeadScan::default())
        .ok()
        .flatten();
    let Some(head) = head else { return 0 };
    let forwarded = Forwarded {
        client: Some(b"192.0.2.7"),
        peer: b"192.0.2.7",
        https: false,
    };
    let how = ToServer {
        forwarded: Some(forwarded),
        upgrade: false,
        host: b"",
        http2_settings: false,
    };
    let mut editor = head.to_server(buf, &how);
    take_cookie_out(&head, buf, &mut editor);
    let out = head.write(buf, editor);
    gather(&out, buf)
}

/// What the balancer's rewrite will do: the cookie's crumbs but its own, set anew.
fn take_cookie_out(head: &RequestHead, buf: &[u8], editor: &mut Editor) {
    let Some(id) = head.fields().named(FieldName::Cookie).next() else {
        return;
    };
    let value = head.fields().get(buf, id).map_or(&b""[..], |f| f.value);
    let mut parts: [&[u8]; 8] = [b""; 8];
    let mut n = 0;
    for crumb in value.split(|&b| b == b';').map(<[u8]>::trim_ascii) {
        if !crumb.starts_with(b"TOTVS_BROKER_SH_001=") && n + 1 < parts.len() {
            if n > 0 {
                parts[n] = b"; ";
                n += 1;
            }
            parts[n] = crumb;
            n += 1;
        }
    }
    let _ = editor.set(id, &parts[..n]);
}

fn gather(out: &OutHead, buf: &[u8]) -> usize {
    let mut slices = [IoSlice::new(&[]); 32];
    let n = out.io_slices(buf, &mut slices);
    black_box(&slices);
    n
}

/// The answer's way: parsed, rewritten for an HTTP/1.1 client with the broker's cookie.
fn answer_way(buf: &mut [u8]) -> usize {
    let asked = Asked {
        method: Method::Get,
        upgrade: false,
    };
    let head = ResponseHead::parse(buf, &mut HeadScan::default(), asked)
        .ok()
        .flatten();
    let Some(head) = head else { return 0 };
    let how = ToClient {
        version: Version::Http11,
        keep_alive: true,
    };
    let mut editor = head.to_client(buf, &how);
    let cookie: &[u8] = b"TOTVS_BROKER_SH_001=01.AAAAAAAAAAAAAAAAAAAAAA; Path=/; HttpOnly";
    let _ = editor.add(b"Set-Cookie", &[cookie]);
    gather(&head.write(buf, editor), buf)
}

/// httparse alone over the same bytes: the floor any parser on it pays.
fn httparse_only(buf: &mut [u8]) -> usize {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut headers);
    request
        .parse(buf)
        .ok()
        .map_or(0, |s| usize::from(s.is_complete()))
}

/// An approximation of the hyper path's per-request structures: httparse, a `HeaderMap`
/// built from the lines, and a copy of it for the server (what the hyper-based engine did).
fn httparse_and_header_map(buf: &mut [u8]) -> usize {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut headers);
    if request.parse(buf).is_err() {
        return 0;
    }
    let mut map = hyper::HeaderMap::with_capacity(request.headers.len());
    for h in request.headers.iter() {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(h.name.as_bytes()),
            hyper::header::HeaderValue::from_bytes(h.value),
        ) {
            map.append(name, value);
        }
    }
    black_box(map.clone()).len()
}

/// One way through the core (or a comparison's), over a buffer it may change.
type Way = fn(&mut [u8]) -> usize;

/// Nanoseconds per call of `way` over `input` (a copy of it, parsed in place each time).
fn nanoseconds(input: &[u8], way: Way) -> f64 {
    let mut buf = input.to_vec();
    let fixed: Option<u64> = std::env::var("H1_BENCH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok());
    let budget = Duration::from_millis(500);
    let started = Instant::now();
    let mut calls = 0u64;
    while fixed.map_or(started.elapsed() < budget, |n| calls < n) {
        for _ in 0..1000 {
            black_box(way(black_box(&mut buf)));
        }
        calls += 1000;
    }
    started.elapsed().as_nanos() as f64 / calls as f64
}

#[test]
#[ignore = "a micro-benchmark, printed: cargo test --release --lib http::h1::tests::measure -- --ignored --nocapture"]
#[allow(clippy::print_stderr)]
fn figures() {
    assert!(request_way(&mut BROWSER.to_vec()) > 0 && answer_way(&mut ANSWER.to_vec()) > 0);
    let mut fields = Fields::default();
    if let Ok(Some(head)) = RequestHead::parse(&mut BROWSER.to_vec(), &mut HeadScan::default()) {
        fields = head.fields().clone();
    }
    eprintln!(
        "browser request: {} bytes, {} lines",
        BROWSER.len(),
        fields.len()
    );
    eprintln!(
        "size_of: RequestHead {} ResponseHead {} Editor {} OutHead {} HeadScan {} BodyReader {} ChunkedDecoder {} (+ {} bytes a line on the heap)",
        size_of::<RequestHead>(),
        size_of::<ResponseHead>(),
        size_of::<Editor>(),
        size_of::<OutHead>(),
        size_of::<HeadScan>(),
        size_of::<BodyReader>(),
        size_of::<ChunkedDecoder>(),
        size_of::<super::super::field::Field>()
    );
    let figures: [(&str, &[u8], Way); 4] = [
        ("request: parse + rewrite + slices", BROWSER, request_way),
        ("answer: parse + rewrite + slices", ANSWER, answer_way),
        ("request: httparse alone", BROWSER, httparse_only),
        (
            "request: httparse + HeaderMap + its copy (hyper-like)",
            BROWSER,
            httparse_and_header_map,
        ),
    ];
    for (name, input, way) in figures {
        eprintln!("{name:55} {:8.1} ns", nanoseconds(input, way));
    }
}
