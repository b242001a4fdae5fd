//! Property tests of the core (4,096 cases each: about 10 s in all in a debug build, within
//! the 60 s such tests may take in CI): whatever the bytes and however they arrive, no panic and no endless loop;
//! one framed request is one request, never two, wherever the reads cut it, whatever its
//! body holds; a chunked body decodes the same over any split and ends where it says; a
//! rewritten head parses back to the same request without its hop-by-hop lines.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use super::driver::{Message, requests};
use crate::http::h1::{ChunkedDecoder, FieldName, HeadScan, Part, RequestHead, ToServer, Version};

/// Bodies that look like the next request, a last chunk, or framing: what a smuggler sends.
const SMUGGLED: &[&[u8]] = &[
    b"GET /admin HTTP/1.1\r\nHost: h\r\n\r\n",
    b"0\r\n\r\nGET /admin HTTP/1.1\r\nHost: h\r\n\r\n",
    b"\r\n\r\n",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"Transfer-Encoding: chunked\r\n",
];

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..200),
        (select(SMUGGLED), vec(any::<u8>(), 0..20)).prop_map(|(s, tail)| [s, &tail[..]].concat()),
    ]
}

/// Extra header lines, named so that none frames, routes or connects.
fn lines() -> impl Strategy<Value = Vec<(String, String)>> {
    vec(("X-[A-Za-z0-9-]{1,12}", "[!-~]([ -~]{0,30}[!-~])?"), 0..10)
}

/// A request with `body`, framed by a length or by chunks of the given sizes.
#[derive(Debug, Clone)]
struct Request {
    method: &'static str,
    target: String,
    lines: Vec<(String, String)>,
    body: Vec<u8>,
    /// `None`: Content-Length; else the chunk sizes to cut the body into.
    chunks: Option<Vec<usize>>,
}

impl Request {
    fn bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "{} {} HTTP/1.1\r\nHost: app:8080\r\n",
            self.method, self.target
        );
        for (name, value) in &self.lines {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        let mut out = match &self.chunks {
            None => format!("{out}Content-Length: {}\r\n\r\n", self.body.len()).into_bytes(),
            Some(_) => format!("{out}Transfer-Encoding: chunked\r\n\r\n").into_bytes(),
        };
        match &self.chunks {
            None => out.extend_from_slice(&self.body),
            Some(sizes) => out.extend(chunked(&self.body, sizes)),
        }
        out
    }

    fn message(&self) -> Message {
        Message {
            method: self.method.as_bytes().to_vec(),
            target: self.target.as_bytes().to_vec(),
            version: Version::Http11,
            body: Some(self.body.clone()),
        }
    }
}

/// `body` in chunks of `sizes` (cycled; a zero size taken as one), a last chunk with an
/// extension and a trailer.
fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut size = sizes.iter().cycle();
    while !rest.is_empty() {
        let n = size.next().copied().unwrap_or(1).clamp(1, rest.len());
        out.extend_from_slice(format!("{n:x};ext=1\r\n").as_bytes());
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\nX-Trailer: t\r\n\r\n");
    out
}

fn request() -> impl Strategy<Value = Request> {
    let method = select(&["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"][..]);
    let chunks = prop_oneof![Just(None), vec(0usize..40, 1..5).prop_map(Some)];
    (method, "/[a-z0-9/?=&%.-]{0,30}", lines(), body(), chunks).prop_map(
        |(method, target, lines, body, chunks)| Request {
            method,
            target,
            lines,
            body,
            chunks,
        },
    )
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    vec(0usize..600, 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// One framed request is one request with its body, wherever the reads cut it.
    #[test]
    fn one_request_is_one_request(request in request(), cuts in cuts()) {
        let seen = requests(&request.bytes(), &cuts);
        prop_assert_eq!(seen.refused, None);
        prop_assert_eq!(seen.heads_at_eof, 0, "the scan found the head's end");
        prop_assert_eq!(seen.messages, vec![request.message()]);
    }

    /// Two pipelined requests are two, in order, each with its own body.
    #[test]
    fn two_pipelined_requests_are_two(first in request(), second in request(), cuts in cuts()) {
        let input = [first.bytes(), second.bytes()].concat();
        let seen = requests(&input, &cuts);
        prop_assert_eq!(seen.messages, vec![first.message(), second.message()]);
    }

    /// Any bytes: no panic, no endless loop, and the same requests however they arrive.
    #[test]
    fn any_bytes_frame_the_same_in_any_pieces(input in vec(any::<u8>(), 0..300), cuts in cuts()) {
        let (cut, whole) = (requests(&input, &cuts), requests(&input, &[]));
        prop_assert_eq!((cut.messages, cut.refused), (whole.messages, whole.refused));
    }

    /// A valid request with a few bytes changed, inserted or removed: the same, in pieces or
    /// whole, and never more requests than the bytes hold request lines.
    #[test]
    fn damaged_requests_frame_the_same_in_any_pieces(
        request in request(),
        damage in vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..4),
        cuts in cuts(),
    ) {
        let mut input = request.bytes();
        for (at, byte, how) in damage {
            let at = at.index(input.len() + 1);
            match how {
                0 if at < input.len() => input[at] = byte,
                1 => input.insert(at, byte),
                _ if at < input.len() => { input.remove(at); }
                _ => {}
            }
        }
        let whole = requests(&input, &[]);
        let cut = requests(&input, &cuts);
        prop_assert_eq!((cut.messages, cut.refused), (whole.messages.clone(), whole.refused));
        let request_lines = input.windows(7).filter(|w| w == b"HTTP/1.").count();
        prop_assert!(whole.messages.len() <= request_lines);
    }

    /// A chunked body decodes to its data over any split, and ends where it says: the bytes
    /// after it are not touched.
    #[test]
    fn chunked_bodies_decode_the_same_over_any_split(
        body in body(),
        sizes in vec(0usize..50, 1..6),
        cuts in cuts(),
    ) {
        let encoded = chunked(&body, &sizes);
        let input = [&encoded[..], b"GET / HTTP/1.1\r\n\r\n"].concat();
        prop_assert_eq!(decode_in_pieces(&input, &cuts), Ok((body, Some(encoded.len()))));
    }

    /// Any bytes through the chunked decoder: every step advances until the end, nothing is
    /// consumed after it, and the end, if any, is the same over any split.
    #[test]
    fn any_bytes_through_the_chunked_decoder(input in vec(any::<u8>(), 0..300), cuts in cuts()) {
        let whole = decode_in_pieces(&input, &[]);
        prop_assert_eq!(decode_in_pieces(&input, &cuts), whole);
    }

    /// A head rewritten for its server parses back to the same request, its extra lines
    /// kept in order and byte for byte, no hop-by-hop line left.
    #[test]
    fn a_rewritten_head_parses_back(request in request(), hop in select(&["Connection: close", "Keep-Alive: 5", "TE: trailers", "Proxy-Connection: x"][..])) {
        let mut raw = request.bytes();
        let at = raw.windows(2).position(|w| w == b"\r\n").unwrap_or(0) + 2;
        raw.splice(at..at, format!("{hop}\r\n").into_bytes());
        let head = RequestHead::parse(&mut raw, &mut HeadScan::default()).unwrap().unwrap();
        let how = ToServer { forwarded: None, upgrade: false, host: b"", http2_settings: false };
        let mut out = head.write(&raw, head.to_server(&raw, &how));
        out.append_input(crate::http::h1::Span::between(head.len(), raw.len()));
        let mut sent = out.to_vec(&raw);
        let again = RequestHead::parse(&mut sent, &mut HeadScan::default()).unwrap().unwrap();
        prop_assert_eq!(again.body(), head.body());
        prop_assert_eq!(again.target(&sent), head.target(&raw));
        let extra = |h: &RequestHead, buf: &[u8]| -> Vec<(Vec<u8>, Vec<u8>)> {
            h.fields().iter(buf).filter(|(_, f)| f.name.starts_with(b"X-")).map(|(_, f)| (f.name.to_vec(), f.value.to_vec())).collect()
        };
        prop_assert_eq!(extra(&again, &sent), extra(&head, &raw));
        for kind in [FieldName::Connection, FieldName::KeepAlive, FieldName::Te, FieldName::ProxyConnection] {
            prop_assert!(again.fields().named(kind).next().is_none());
        }
        prop_assert_eq!(super::driver::requests(&sent, &[]).messages, vec![request.message()]);
    }
}

/// The data of a chunked body in `input` read in pieces, and where it ended if it did.
fn decode_in_pieces(
    input: &[u8],
    cuts: &[usize],
) -> Result<(Vec<u8>, Option<usize>), crate::http::h1::ChunkedError> {
    let mut ends: Vec<usize> = cuts.iter().copied().filter(|&c| c < input.len()).collect();
    ends.push(input.len());
    ends.sort_unstable();
    let (mut decoder, mut data, mut at) = (ChunkedDecoder::new(), Vec::new(), 0);
    for end in ends {
        while at < end && !decoder.is_done() {
            let (part, n) = decoder.step(&input[at..end])?;
            assert!(n > 0, "a step over bytes before the end advances");
            if part == Part::Data {
                data.extend_from_slice(&input[at..at + n]);
            }
            at += n;
        }
    }
    if decoder.is_done() {
        assert_eq!(
            decoder.step(b"more"),
            Ok((Part::Framing, 0)),
            "nothing after the end"
        );
    }
    Ok((data, decoder.is_done().then_some(at)))
}
