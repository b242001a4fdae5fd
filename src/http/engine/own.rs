//! The broker's own answers as bytes on the wire, the one place they are formatted: its
//! pages (503, 502, 504, 408, refusals), the `OPTIONS` it answers as the last recipient, the
//! balancer's own answers (the query interface's [`LocalAnswer`]), and the page that tells a
//! plain HTTP client of a TLS port to use https. Always `HTTP/1.1`, framed by
//! `Content-Length`, with `Connection` as decided; no body to a `HEAD`.

use std::fmt::Write as _;

use hyper::StatusCode;

use crate::config::Language;
use crate::http::LocalAnswer;
use crate::http::h1::Version;
use crate::http::pages;
use crate::http::refusal::{ALLOW, Refusal};

/// The broker's own `100 Continue`: to a client whose server says nothing of its `Expect`, or
/// whose request the balancer answers itself.
pub(super) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How an answer of the broker's own ends its connection, as its `Connection` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AnswerEnding {
    /// The connection closes after the answer.
    pub(super) close: bool,
    /// The client's version (HTTP/1.0 is told `keep-alive` when it stays).
    pub(super) version: Version,
    /// The request was a `HEAD`: the head alone.
    pub(super) head_only: bool,
}

/// The ending of a page sent before any request was read whole (a refused or evicted head,
/// a plain request on a TLS port): HTTP/1.1, the whole page, and the connection closed.
pub(super) const CLOSING: AnswerEnding = AnswerEnding {
    close: true,
    version: Version::Http11,
    head_only: false,
};

impl AnswerEnding {
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
pub(super) fn answer(
    status: StatusCode,
    fields: &str,
    body: &[u8],
    ending: AnswerEnding,
) -> Vec<u8> {
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
    ending: AnswerEnding,
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
pub(super) fn refused(refusal: Refusal, language: Language, ending: AnswerEnding) -> Vec<u8> {
    let body = pages::refused(refusal, language);
    let mut fields = String::from(PAGE_FIELDS);
    if refusal == Refusal::Trace {
        let _ = write!(fields, "Allow: {ALLOW}\r\n");
    }
    answer(refusal.status(), &fields, &body, ending)
}

/// The answer to an `OPTIONS` the broker is the last recipient of: 200, the methods it passes
/// on, no content (RFC 9110 §9.3.7).
pub(super) fn options(ending: AnswerEnding) -> Vec<u8> {
    answer(StatusCode::OK, &format!("Allow: {ALLOW}\r\n"), b"", ending)
}

/// An answer the balancer made itself (a query's page): its lines but those that frame it or
/// end its connection, which are the engine's to say (a line that is no valid field is left
/// out, so nothing the balancer puts in a value can split the head).
pub(super) fn local(local: &LocalAnswer, ending: AnswerEnding) -> Vec<u8> {
    let mut fields = String::new();
    for (name, value) in &local.fields {
        let framing = ["content-length", "transfer-encoding", "connection"]
            .iter()
            .any(|framing| name.eq_ignore_ascii_case(framing));
        let valid = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
            && value
                .bytes()
                .all(|b| b == b'\t' || (b >= b' ' && b != 0x7f));
        if valid && !framing {
            let _ = write!(fields, "{name}: {value}\r\n");
        }
    }
    let status = StatusCode::from_u16(local.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer(status, &fields, &local.body, ending)
}

/// The whole answer to a plain HTTP request that reached a port speaking only TLS: 400, its
/// page saying to use https (nginx answers the same case with its "plain HTTP request was
/// sent to HTTPS port"), and the connection closed.
pub fn plain_http_to_tls_port(language: Language) -> Vec<u8> {
    let body = pages::plain_http_to_tls_port(language);
    answer(StatusCode::BAD_REQUEST, PAGE_FIELDS, &body, CLOSING)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEPT: AnswerEnding = AnswerEnding {
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
        let closing = AnswerEnding {
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
        let old = AnswerEnding {
            version: Version::Http10,
            ..KEPT
        };
        let text = String::from_utf8_lossy(&options(old)).into_owned();
        assert!(
            text.ends_with("Content-Length: 0\r\nConnection: keep-alive\r\n\r\n"),
            "{text}"
        );
    }

    #[test]
    fn the_balancers_answer_keeps_its_lines_but_the_engines_own() {
        let answer = LocalAnswer::new(200, "ok\n")
            .with("Content-Type", "text/plain; charset=utf-8")
            .with("Content-Length", "99")
            .with("connection", "keep-alive")
            .with("X-Bad", "a\r\nSet-Cookie: x=1");
        let text = String::from_utf8(local(&answer, KEPT)).unwrap_or_default();
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 3\r\n\r\nok\n"
        );
    }

    #[test]
    fn a_plain_request_on_a_tls_port_is_told_to_use_https_and_closed() {
        let bytes = plain_http_to_tls_port(Language::English);
        let text = String::from_utf8_lossy(&bytes);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("Cache-Control: no-store"), "{head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {}", body.len())),
            "{head}"
        );
        assert!(head.ends_with("Connection: close"), "{head}");
        assert!(body.contains("https://"), "{body}");
    }
}
