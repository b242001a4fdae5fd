//! The broker's own answers as bytes on the wire: its pages (503, 502, 504, 408, refusals),
//! the `OPTIONS` it answers as the last recipient, and the balancer's own answers (a query's
//! page, made with hyper's types by the query interface). Always `HTTP/1.1`, framed by
//! `Content-Length`, with `Connection` as decided; no body to a `HEAD`.

use std::fmt::Write as _;

use bytes::Bytes;
use hyper::header::{self, HeaderMap};
use hyper::{Response, StatusCode};

use crate::config::Language;
use crate::http::h1::Version;
use crate::http::pages;
use crate::http::refusal::{ALLOW, Refusal};

/// How an answer of the broker's own ends its connection, as its `Connection` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ending {
    /// The connection closes after the answer.
    pub(super) close: bool,
    /// The client's version (HTTP/1.0 is told `keep-alive` when it stays).
    pub(super) version: Version,
    /// The request was a `HEAD`: the head alone.
    pub(super) head_only: bool,
}

impl Ending {
    fn connection_line(self) -> Option<&'static str> {
        if self.close {
            Some("Connection: close\r\n")
        } else if self.version == Version::Http10 {
            Some("Connection: keep-alive\r\n")
        } else {
            None
        }
    }
}

/// An answer of `status` with `fields` (whole lines, CRLF included) and `body`.
fn answer(status: StatusCode, fields: &str, body: &[u8], ending: Ending) -> Vec<u8> {
    let mut head = String::with_capacity(160 + fields.len());
    let reason = status.canonical_reason().unwrap_or("");
    let _ = write!(head, "HTTP/1.1 {} {reason}\r\n", status.as_u16());
    head.push_str(fields);
    let _ = write!(head, "Content-Length: {}\r\n", body.len());
    if let Some(line) = ending.connection_line() {
        head.push_str(line);
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    if !ending.head_only {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// The lines every page carries.
const PAGE_FIELDS: &str = "Content-Type: text/html; charset=utf-8\r\nCache-Control: no-store\r\n";

/// The page for `status` (503, 502, 504, 408), in `language`; a 503 says when to try again.
pub(super) fn page(
    status: StatusCode,
    language: Language,
    retry_after: u64,
    ending: Ending,
) -> Vec<u8> {
    let body = pages::page(status, language);
    let mut fields = String::from(PAGE_FIELDS);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let _ = write!(fields, "Retry-After: {}\r\n", retry_after.max(1));
    }
    answer(status, &fields, &body, ending)
}

/// The page of a request the broker refused, saying what was wrong; a 405 says the methods
/// allowed.
pub(super) fn refused(refusal: Refusal, language: Language, ending: Ending) -> Vec<u8> {
    let body = pages::refused(refusal, language);
    let mut fields = String::from(PAGE_FIELDS);
    if refusal == Refusal::Trace {
        let _ = write!(fields, "Allow: {ALLOW}\r\n");
    }
    answer(refusal.status(), &fields, &body, ending)
}

/// The answer to an `OPTIONS` the broker is the last recipient of: 200, the methods it passes
/// on, no content (RFC 9110 §9.3.7).
pub(super) fn options(ending: Ending) -> Vec<u8> {
    answer(StatusCode::OK, &format!("Allow: {ALLOW}\r\n"), b"", ending)
}

/// An answer the balancer made itself (a query's page), as hyper's types hold it: its fields
/// but the framing and `Connection`, which are the engine's to say.
pub(super) fn local(response: &Response<Bytes>, ending: Ending) -> Vec<u8> {
    let mut fields = String::new();
    lines(response.headers(), &mut fields);
    answer(response.status(), &fields, response.body(), ending)
}

/// Whether the balancer's own answer asks for its connection to close (`Connection: close`).
pub(super) fn closes(response: &Response<Bytes>) -> bool {
    response
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

/// `headers` as lines, but those that frame or end a connection.
fn lines(headers: &HeaderMap, into: &mut String) {
    for (name, value) in headers {
        if [
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::CONNECTION,
        ]
        .contains(name)
        {
            continue;
        }
        if let Ok(value) = value.to_str() {
            let _ = write!(into, "{name}: {value}\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEPT: Ending = Ending {
        close: false,
        version: Version::Http11,
        head_only: false,
    };

    #[test]
    fn a_page_is_framed_by_its_length_and_says_how_the_connection_goes() {
        let bytes = page(StatusCode::SERVICE_UNAVAILABLE, Language::English, 5, KEPT);
        let text = String::from_utf8_lossy(&bytes);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nRetry-After: 5"), "{head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {}", body.len())),
            "{head}"
        );
        assert!(!head.contains("Connection"), "{head}");
        let closing = Ending {
            close: true,
            head_only: true,
            ..KEPT
        };
        let bytes = refused(Refusal::Trace, Language::English, closing);
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{text}"
        );
        assert!(text.contains(&format!("Allow: {ALLOW}\r\n")), "{text}");
        assert!(
            text.ends_with("Connection: close\r\n\r\n"),
            "no body to a HEAD: {text}"
        );
        let old = Ending {
            version: Version::Http10,
            ..KEPT
        };
        let text = String::from_utf8_lossy(&options(old)).into_owned();
        assert!(
            text.ends_with("Content-Length: 0\r\nConnection: keep-alive\r\n\r\n"),
            "{text}"
        );
    }
}
