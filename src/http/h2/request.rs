//! An HTTP/2 request as the HTTP/1.1 head the engine reads (RFC 9113 §8.3, RFC 9110), so that
//! every rule of the engine applies to a stream as to an HTTP/1.1 request: the pseudo-headers
//! make the request line and `Host`, the fields follow as they came, and the framing says
//! how the DATA frames follow.
//!
//! - `:method` and `:path` are the request line; `:authority` is `Host`. A `host` field that
//!   agrees with it is dropped; one that disagrees is written beside it, and the engine
//!   answers two `Host` lines with a 400, as it does any such request.
//! - `cookie` crumbs (a browser splits its cookies into several fields, RFC 9113 §8.2.3) are
//!   joined with `; ` into one `Cookie` line, so the affinity cookie is found among them and
//!   the server sees one line as from an HTTP/1.1 browser.
//! - A body: its `content-length` when the client gave one (the `h2` crate holds the DATA
//!   frames to it: a stream error when they disagree), else `Transfer-Encoding: chunked`,
//!   each DATA frame a chunk. `Connection: close`: the engine ends after this one exchange.
//! - An extended CONNECT with `:protocol websocket` (RFC 8441) is a `GET` asking an
//!   HTTP/1.1 upgrade, with a `Sec-WebSocket-Key` of the broker's own; any other CONNECT
//!   stays one, which the engine refuses (501) as it refuses CONNECT over HTTP/1.1.
//!
//! Field names come lowercase (the `h2` crate refuses others as malformed, and the
//! connection-specific ones, `connection`, `upgrade`, `transfer-encoding`...); values carry
//! no CR, LF or NUL (`HeaderValue` refuses them), so no field can end a line early.

use hyper::http::request::Parts;
use hyper::http::{Method, header};

use crate::http::h1::{Asked, Method as H1Method};

/// How the request's body follows its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestFraming {
    /// None: the HEADERS frame ended the stream.
    Empty,
    /// As many bytes as its `content-length` says, as they come.
    Length,
    /// Each DATA frame as a chunk, then the last chunk.
    Chunked,
    /// A WebSocket's bytes, once the server switched protocols.
    Tunnel,
}

/// The request, written for the engine.
#[derive(Debug)]
pub(super) struct Written {
    /// The HTTP/1.1 head, blank line included.
    pub(super) head: Vec<u8>,
    /// How the body follows.
    pub(super) body: RequestFraming,
    /// What the answer's framing depends on: a `HEAD` has no body, an upgrade is a tunnel.
    pub(super) asked: Asked,
}

/// The WebSocket version the broker asks the server for: the one RFC 6455 defines, the one
/// RFC 8441 carries.
const WEBSOCKET_VERSION: &[u8] = b"13";

/// The HTTP/1.1 head of `request` (`ends`: its HEADERS frame ended the stream). `websocket`
/// is the `Sec-WebSocket-Key` to send when the request is a WebSocket's extended CONNECT and
/// WebSocket over HTTP/2 is on; else such a request is written as the CONNECT it is.
pub(super) fn written(request: &Parts, ends: bool, websocket: Option<&str>) -> Written {
    let websocket = websocket.filter(|_| is_websocket(request));
    let mut head = Vec::with_capacity(256);
    let method = match websocket {
        Some(_) => &Method::GET,
        None => &request.method,
    };
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    let authority = request.uri.authority().map(|a| a.as_str().as_bytes());
    match request.uri.path_and_query() {
        Some(path) if *method != Method::CONNECT => {
            head.extend_from_slice(path.as_str().as_bytes())
        }
        // CONNECT's target is its authority (the engine refuses it all the same).
        _ => head.extend_from_slice(authority.unwrap_or(b"/")),
    }
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(authority) = authority {
        line(&mut head, b"Host", authority);
    }
    let mut cookies: Option<Vec<u8>> = None;
    let mut length = false;
    for (name, value) in &request.headers {
        match *name {
            header::HOST if authority.is_some_and(|a| a.eq_ignore_ascii_case(value.as_bytes())) => {
            }
            header::COOKIE => {
                let joined = cookies.get_or_insert_with(Vec::new);
                if !joined.is_empty() {
                    joined.extend_from_slice(b"; ");
                }
                joined.extend_from_slice(value.as_bytes());
            }
            // RFC 8441 carries the version; the broker says its own, once.
            header::SEC_WEBSOCKET_VERSION | header::SEC_WEBSOCKET_KEY if websocket.is_some() => {}
            _ => {
                length |= *name == header::CONTENT_LENGTH;
                line(&mut head, name.as_str().as_bytes(), value.as_bytes());
            }
        }
    }
    if let Some(cookies) = cookies {
        line(&mut head, b"Cookie", &cookies);
    }
    let body = match websocket {
        Some(key) => {
            head.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: websocket\r\n");
            line(&mut head, b"Sec-WebSocket-Version", WEBSOCKET_VERSION);
            line(&mut head, b"Sec-WebSocket-Key", key.as_bytes());
            RequestFraming::Tunnel
        }
        None => {
            head.extend_from_slice(b"Connection: close\r\n");
            if ends {
                RequestFraming::Empty
            } else if length {
                RequestFraming::Length
            } else {
                head.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                RequestFraming::Chunked
            }
        }
    };
    head.extend_from_slice(b"\r\n");
    let asked = Asked {
        method: H1Method::of(method.as_str().as_bytes()),
        upgrade: websocket.is_some(),
    };
    Written { head, body, asked }
}

/// Whether `request` is RFC 8441's extended CONNECT for a WebSocket.
pub(super) fn is_websocket(request: &Parts) -> bool {
    request.method == Method::CONNECT
        && request
            .extensions
            .get::<h2::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// `name: value` and its line end.
fn line(head: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    head.extend_from_slice(name);
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::http::{HeaderValue, Request};

    fn value(text: &'static str) -> HeaderValue {
        HeaderValue::from_static(text)
    }

    fn parts(method: Method, uri: &str, fields: &[(&'static str, &'static str)]) -> Parts {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, v) in fields {
            request = request.header(*name, value(v));
        }
        request.body(()).unwrap().into_parts().0
    }

    fn text(written: &Written) -> String {
        String::from_utf8(written.head.clone()).unwrap()
    }

    #[test]
    fn the_pseudo_headers_make_the_request_line_and_host() {
        let request = parts(
            Method::GET,
            "https://broker.test:8443/app/page?x=1",
            &[("accept", "text/html")],
        );
        let written = written(&request, true, None);
        assert_eq!(
            text(&written),
            "GET /app/page?x=1 HTTP/1.1\r\nHost: broker.test:8443\r\naccept: text/html\r\n\
             Connection: close\r\n\r\n"
        );
        assert_eq!(written.body, RequestFraming::Empty);
        assert_eq!(written.asked.method, H1Method::Get);
    }

    #[test]
    fn a_host_field_that_agrees_is_dropped_and_one_that_does_not_is_kept_for_the_400() {
        let agrees = parts(
            Method::GET,
            "https://broker.test/",
            &[("host", "BROKER.test")],
        );
        assert_eq!(
            text(&written(&agrees, true, None)).matches("ost: ").count(),
            1
        );
        let disagrees = parts(
            Method::GET,
            "https://broker.test/",
            &[("host", "evil.test")],
        );
        let head = text(&written(&disagrees, true, None));
        assert!(
            head.contains("Host: broker.test\r\nhost: evil.test\r\n"),
            "{head}"
        );
        // Without :authority, the host field is the Host.
        let mut only_host = parts(Method::GET, "/", &[("host", "broker.test")]);
        only_host.uri = "/".parse().unwrap();
        assert!(text(&written(&only_host, true, None)).contains("host: broker.test\r\n"));
    }

    #[test]
    fn cookie_crumbs_are_joined_into_one_line() {
        let request = parts(
            Method::GET,
            "https://broker.test/",
            &[
                ("cookie", "a=1"),
                ("accept", "*/*"),
                ("cookie", "TOTVS_BROKER_SH_001=01.x"),
                ("cookie", "b=2"),
            ],
        );
        let head = text(&written(&request, true, None));
        assert!(
            head.contains("Cookie: a=1; TOTVS_BROKER_SH_001=01.x; b=2\r\n"),
            "{head}"
        );
        assert_eq!(head.matches("ookie").count(), 1, "{head}");
    }

    #[test]
    fn a_body_is_framed_by_its_length_or_in_chunks() {
        let sized = parts(
            Method::POST,
            "https://broker.test/up",
            &[("content-length", "5")],
        );
        let written_sized = written(&sized, false, None);
        assert_eq!(written_sized.body, RequestFraming::Length);
        assert!(!text(&written_sized).contains("Transfer-Encoding"));
        let streamed = parts(Method::POST, "https://broker.test/up", &[]);
        let written_streamed = written(&streamed, false, None);
        assert_eq!(written_streamed.body, RequestFraming::Chunked);
        assert!(text(&written_streamed).ends_with("Transfer-Encoding: chunked\r\n\r\n"));
    }

    #[test]
    fn a_websockets_extended_connect_is_an_upgrade_with_the_brokers_key() {
        let mut request = parts(
            Method::CONNECT,
            "https://broker.test/chat",
            &[
                ("sec-websocket-version", "13"),
                ("sec-websocket-protocol", "chat"),
                ("origin", "https://broker.test"),
            ],
        );
        request
            .extensions
            .insert(h2::ext::Protocol::from_static("websocket"));
        let written = written(&request, false, Some("dGhlIHNhbXBsZSBub25jZQ=="));
        let head = text(&written);
        assert!(
            head.starts_with("GET /chat HTTP/1.1\r\nHost: broker.test\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Connection: Upgrade\r\nUpgrade: websocket\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"),
            "{head}"
        );
        assert_eq!(head.matches("ebsocket-version").count(), 0, "{head}");
        assert_eq!(head.matches("WebSocket-Version: 13").count(), 1, "{head}");
        assert!(!head.contains("Connection: close"), "{head}");
        assert_eq!(written.body, RequestFraming::Tunnel);
        assert!(written.asked.upgrade);
        // Off (HTTP2_WEBSOCKET=0, never offered): the CONNECT it is, which the engine refuses.
        let head = text(&super::written(&request, false, None));
        assert!(
            head.starts_with("CONNECT broker.test HTTP/1.1\r\n"),
            "{head}"
        );
    }
}
