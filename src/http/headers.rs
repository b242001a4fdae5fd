//! The head of a request and of its answer as they cross the broker: what is refused before
//! any server sees it, and what is rewritten each way. Pure functions over hyper's types.
//!
//! Framing is hyper's: its parser refuses what cannot be framed one way only (see
//! docs/architecture.md, "Request smuggling"), and the server is sent a head hyper writes
//! anew, with a length or chunks of its own. What hyper lets through and a proxy must not:
//! a transfer coding other than one `chunked` (the body, once de-chunked, would still be
//! coded), several `Host` lines or none in HTTP/1.1, `CONNECT`, and request lines past
//! [`MAX_REQUEST_LINE`].

use std::net::IpAddr;

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::{PathAndQuery, Uri};
use hyper::{Method, StatusCode, Version};

use super::Downstream;

/// The longest request target accepted (beyond it: 414), as nginx's default 8 KiB line and
/// then some: TOTVS WebApp targets are short, but portals put state in query strings.
pub(crate) const MAX_REQUEST_LINE: usize = 16 * 1024;

/// Why the broker answers a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `CONNECT`: this is a reverse proxy, not a tunnel to anywhere.
    Connect,
    /// A transfer coding other than one `chunked`.
    TransferCoding,
    /// HTTP/1.1 with no `Host`, or with several.
    Host,
    /// The request target is longer than [`MAX_REQUEST_LINE`].
    TargetTooLong,
}

impl Refusal {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Refusal::Connect | Refusal::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            Refusal::Host => StatusCode::BAD_REQUEST,
            Refusal::TargetTooLong => StatusCode::URI_TOO_LONG,
        }
    }
}

/// Why `head` is answered by the broker, or `None` when it may go to a server.
pub(crate) fn refusal(head: &Parts) -> Option<Refusal> {
    if head.method == Method::CONNECT {
        return Some(Refusal::Connect);
    }
    if !head.headers.contains_key(header::TRANSFER_ENCODING) {
        // Most requests: nothing more to look at.
    } else if !chunked_once(&head.headers) {
        return Some(Refusal::TransferCoding);
    }
    let hosts = head.headers.get_all(header::HOST).iter().count();
    if hosts > 1 || (hosts == 0 && head.version == Version::HTTP_11) {
        return Some(Refusal::Host);
    }
    let target = head.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > MAX_REQUEST_LINE {
        return Some(Refusal::TargetTooLong);
    }
    None
}

/// Whether the transfer codings, across every `Transfer-Encoding` line, are exactly one
/// `chunked` (hyper has already refused a list that does not end with it).
fn chunked_once(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    codings
        .next()
        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
        && codings.next().is_none()
}

/// Whether the client asks to switch protocols (WebSocket): HTTP/1.1, an `Upgrade` header
/// and `upgrade` among the `Connection` tokens, as hyper's server requires too.
pub(crate) fn wants_upgrade(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11
        && headers.contains_key(header::UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

/// The tokens of every `Connection` line.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Headers for one connection only (RFC 9110 7.6.1, and the older `Keep-Alive`,
/// `Proxy-Connection`, `Trailer`), never forwarded. hyper writes the framing anew.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Headers a `Connection` line cannot make the broker drop: the routing and the framing.
const KEPT: [HeaderName; 2] = [header::HOST, header::CONTENT_LENGTH];

/// Takes the hop-by-hop headers out of `headers`, and the ones `Connection` names; for an
/// upgrade, `Upgrade` stays and `Connection: upgrade` is said again.
fn remove_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .filter(|n| !KEPT.contains(n))
        .collect();
    let upgrade_to = if upgrade {
        headers.remove(header::UPGRADE)
    } else {
        None
    };
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
    if let Some(protocols) = upgrade_to {
        headers.insert(header::UPGRADE, protocols);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The target as a server expects it from a proxy: origin-form (`/path?query`). An
/// absolute-form target (`http://host/path`) gives its authority as the `Host`.
pub(crate) fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(pq) if uri.scheme().is_some() || uri.authority().is_some() => Uri::from(pq.clone()),
        Some(_) => uri.clone(),
        None if uri.authority().is_some() => Uri::from(PathAndQuery::from_static("/")),
        None => uri.clone(),
    }
}

/// The head a server is sent: hop-by-hop headers out (but an upgrade's), the `Host` of an
/// absolute-form target, and the `X-Forwarded-*` headers when `forwarded`.
pub(crate) fn request_headers(
    head: &Parts,
    client: &Downstream,
    forwarded: bool,
    upgrade: bool,
) -> HeaderMap {
    let mut headers = head.headers.clone();
    remove_hop_by_hop(&mut headers, upgrade);
    if let Some(authority) = head.uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        headers.insert(header::HOST, host);
    }
    if forwarded {
        add_forwarded(&mut headers, client);
    }
    headers
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// `X-Forwarded-For` gets the client's address appended (the chain of proxies before the
/// broker is kept, as nginx's `$proxy_add_x_forwarded_for`); `X-Forwarded-Proto` and
/// `X-Forwarded-Host` are set, never passed on, since the broker is where they are known.
fn add_forwarded(headers: &mut HeaderMap, client: &Downstream) {
    let ip = client_ip(client.peer.ip());
    let chain: Vec<&[u8]> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|v| !v.is_empty())
        .collect();
    let mut value = chain.join(&b", "[..]);
    if !value.is_empty() {
        value.extend_from_slice(b", ");
    }
    value.extend_from_slice(ip.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&value) {
        headers.insert(X_FORWARDED_FOR, value);
    }
    let proto = if client.tls { "https" } else { "http" };
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    match headers.get(header::HOST).cloned() {
        Some(host) => headers.insert(X_FORWARDED_HOST, host),
        None => headers.remove(X_FORWARDED_HOST),
    };
}

/// The client's address as written in `X-Forwarded-For`: an IPv4 client on a dual-stack
/// socket as plain IPv4.
fn client_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or_else(|| v6.to_string(), |v4| v4.to_string()),
        IpAddr::V4(v4) => v4.to_string(),
    }
}

/// The answer's head for the client: hop-by-hop headers out, but an upgrade's (101). A
/// `Content-Length` beside `Transfer-Encoding` goes too: the body was read by its chunks (RFC
/// 9112 6.3), and a stale length would cut it short for the client.
pub(crate) fn response_headers(headers: &mut HeaderMap, upgrade: bool) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    remove_hop_by_hop(headers, upgrade);
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::Request;

    fn head(raw: &[(&str, &str)], version: Version, method: Method, uri: &str) -> Parts {
        let mut builder = Request::builder().method(method).uri(uri).version(version);
        for (name, value) in raw {
            builder = builder.header(*name, *value);
        }
        let Ok(request) = builder.body(()) else {
            panic!("test request")
        };
        request.into_parts().0
    }

    fn get(raw: &[(&str, &str)]) -> Parts {
        head(raw, Version::HTTP_11, Method::GET, "/a?b=c")
    }

    const CLIENT: Downstream = Downstream {
        peer: std::net::SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7)), 40000),
        tls: false,
    };

    #[test]
    fn refusals() {
        let long = format!("/{}", "a".repeat(MAX_REQUEST_LINE));
        let cases: Vec<(Parts, Option<Refusal>)> = vec![
            (get(&[("host", "h")]), None),
            (get(&[]), Some(Refusal::Host)),
            (head(&[], Version::HTTP_10, Method::GET, "/"), None),
            (get(&[("host", "h"), ("host", "i")]), Some(Refusal::Host)),
            (
                head(&[("host", "h")], Version::HTTP_11, Method::CONNECT, "h:443"),
                Some(Refusal::Connect),
            ),
            (
                get(&[("host", "h"), ("transfer-encoding", "chunked")]),
                None,
            ),
            (
                get(&[("host", "h"), ("transfer-encoding", " Chunked ")]),
                None,
            ),
            (
                get(&[("host", "h"), ("transfer-encoding", "gzip, chunked")]),
                Some(Refusal::TransferCoding),
            ),
            (
                get(&[("host", "h"), ("transfer-encoding", "chunked, chunked")]),
                Some(Refusal::TransferCoding),
            ),
            (
                get(&[
                    ("host", "h"),
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "chunked"),
                ]),
                Some(Refusal::TransferCoding),
            ),
            (
                head(&[("host", "h")], Version::HTTP_11, Method::GET, &long),
                Some(Refusal::TargetTooLong),
            ),
        ];
        for (head, expected) in cases {
            assert_eq!(refusal(&head), expected, "{head:?}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go_and_the_ones_connection_names() {
        let head = get(&[
            ("host", "app:80"),
            ("connection", "keep-alive, X-Secret, host, content-length"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-secret", "1"),
            ("content-length", "3"),
            ("cookie", "a=b"),
        ]);
        let out = request_headers(&head, &CLIENT, false, false);
        let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["host", "content-length", "cookie"]);
    }

    #[test]
    fn an_answer_framed_by_chunks_loses_its_stale_length() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        response_headers(&mut headers, false);
        let names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["etag"]);
        let mut length_only = HeaderMap::new();
        length_only.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        response_headers(&mut length_only, false);
        assert_eq!(length_only[header::CONTENT_LENGTH], "3");
    }

    #[test]
    fn an_upgrade_keeps_upgrade_and_says_connection_upgrade() {
        let head = get(&[
            ("host", "h"),
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(wants_upgrade(head.version, &head.headers));
        let out = request_headers(&head, &CLIENT, false, true);
        assert_eq!(out["upgrade"], "websocket");
        assert_eq!(out["connection"], "upgrade");
        assert_eq!(out["sec-websocket-key"], "k");
        let no_token = get(&[("host", "h"), ("upgrade", "websocket")]);
        assert!(!wants_upgrade(no_token.version, &no_token.headers));
        let old = head_with_version(Version::HTTP_10);
        assert!(!wants_upgrade(old.version, &old.headers));
    }

    fn head_with_version(version: Version) -> Parts {
        head(
            &[("connection", "upgrade"), ("upgrade", "websocket")],
            version,
            Method::GET,
            "/",
        )
    }

    #[test]
    fn forwarded_headers_append_the_client_and_set_proto_and_host() {
        let head = get(&[
            ("host", "portal.example:8080"),
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-for", "198.51.100.2"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "spoofed"),
        ]);
        let out = request_headers(&head, &CLIENT, true, false);
        assert_eq!(
            out["x-forwarded-for"],
            "203.0.113.1, 198.51.100.2, 192.0.2.7"
        );
        assert_eq!(out.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(out["x-forwarded-proto"], "http");
        assert_eq!(out["x-forwarded-host"], "portal.example:8080");
        let tls = Downstream {
            tls: true,
            ..CLIENT
        };
        assert_eq!(
            request_headers(&get(&[("host", "h")]), &tls, true, false)["x-forwarded-proto"],
            "https"
        );
        let off = request_headers(&head, &CLIENT, false, false);
        assert_eq!(off["x-forwarded-proto"], "https");
    }

    #[test]
    fn a_mapped_ipv4_client_is_written_as_ipv4() {
        let Ok(mapped) = "::ffff:192.0.2.9".parse::<IpAddr>() else {
            panic!("address")
        };
        assert_eq!(client_ip(mapped), "192.0.2.9");
        let Ok(v6) = "2001:db8::1".parse::<IpAddr>() else {
            panic!("address")
        };
        assert_eq!(client_ip(v6), "2001:db8::1");
    }

    #[test]
    fn absolute_form_becomes_origin_form_and_gives_the_host() {
        let head = head(
            &[("host", "other")],
            Version::HTTP_11,
            Method::GET,
            "http://app.example:81/p?q=1",
        );
        assert_eq!(origin_form(&head.uri), "/p?q=1");
        let out = request_headers(&head, &CLIENT, false, false);
        assert_eq!(out["host"], "app.example:81");
        let Ok(star) = "*".parse::<Uri>() else {
            panic!("uri")
        };
        assert_eq!(origin_form(&star), "*");
        let Ok(plain) = "/x".parse::<Uri>() else {
            panic!("uri")
        };
        assert_eq!(origin_form(&plain), "/x");
    }
}
