//! The head of a request and of its answer as they cross the broker: what is refused before
//! any server sees it, and what is rewritten each way. Pure functions over hyper's types, and
//! over a head's bytes where hyper refused it before it had types.
//!
//! Framing is hyper's: its parser refuses what cannot be framed one way only (see
//! docs/architecture.md, "Request smuggling"), and the server is sent a head hyper writes
//! anew, with a length or chunks of its own. What hyper lets through and a proxy must not:
//! a transfer coding other than one `chunked` (the body, once de-chunked, would still be
//! coded), several `Host` lines, none in HTTP/1.1, or one that names no host (RFC 9112 3.2),
//! a target with userinfo or in authority-form, `CONNECT` and `TRACE`, and request lines past
//! [`MAX_REQUEST_LINE`]. What the client may not tell the server: any address of its own
//! (`Forwarded`, `X-Real-IP`...), and an upgrade to a protocol the operator did not allow
//! (`h2c` would open a tunnel past the broker's per-request routing).
//!
//! - `host`: a `Host` value (or an absolute-form target's authority) checked as RFC 9112 asks.
//! - `refused`: what was wrong with a head hyper refused, told from its bytes.

mod host;
mod refused;

use std::fmt::Display;
use std::net::IpAddr;

use bytes::Bytes;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::{PathAndQuery, Uri};
use hyper::{Method, Response, StatusCode, Version};

use super::{Downstream, Settings};
use host::valid_host;
pub(crate) use refused::{HeadFault, hyper_refusal};

/// The longest request target accepted (beyond it: 414), as nginx's default 8 KiB line and
/// then some: TOTVS WebApp targets are short, but portals put state in query strings.
pub(crate) const MAX_REQUEST_LINE: usize = 16 * 1024;

/// Largest request head accepted (request line and headers): beyond it, 431. nginx allows
/// 4 x 8 KiB of headers by default, HAProxy 16 KiB in all; browsers with many cookies stay
/// well under 64 KiB.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

/// Most header lines in a request head: beyond it, 431. hyper's default, said here so the
/// broker's page and docs/configuration.md can name it; a browser sends about 20.
pub(crate) const MAX_HEADERS: usize = 100;

/// The methods a server may be sent, as the broker's `Allow` says them (to `TRACE`, and to an
/// `OPTIONS` it answers itself): the standard ones but `CONNECT` and `TRACE`. Any other
/// method a server knows is passed on too; these are the ones worth naming.
pub(crate) const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH";

/// Why the broker answers a request itself, and what its page says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `CONNECT`: this is a reverse proxy, not a tunnel to anywhere.
    Connect,
    /// `TRACE`: the server would echo the request as it received it, cookies and the
    /// broker's own headers included (405, as nginx answers it).
    Trace,
    /// A transfer coding other than one `chunked`.
    TransferCoding,
    /// HTTP/1.1 without `Host`.
    NoHost,
    /// Several `Host` lines.
    ManyHosts,
    /// A `Host`, or an absolute-form target's authority, that is not `host[:port]`: a blank,
    /// a `/`, a `,` before a blank, an `@`, or nothing at all.
    BadHost,
    /// An absolute-form target with userinfo (`http://user@host/`).
    UserInfo,
    /// An authority-form target (`host:port`), which only `CONNECT` may use.
    AuthorityForm,
    /// The request target is longer than [`MAX_REQUEST_LINE`].
    TargetTooLong,
    /// The request's body could not be read: a malformed chunk, or it broke off.
    Body,
    /// A head hyper could not parse, and answered itself (`head_errors` gives its page).
    Head(HeadFault),
}

impl Refusal {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Refusal::Connect | Refusal::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            Refusal::Trace => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::TargetTooLong => StatusCode::URI_TOO_LONG,
            Refusal::Head(HeadFault::TooManyHeaders | HeadFault::TooLarge) => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            Refusal::NoHost
            | Refusal::ManyHosts
            | Refusal::BadHost
            | Refusal::UserInfo
            | Refusal::AuthorityForm
            | Refusal::Body
            | Refusal::Head(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Why `head` is answered by the broker, or `None` when it may go to a server.
pub(crate) fn refusal(head: &Parts) -> Option<Refusal> {
    if head.method == Method::CONNECT {
        return Some(Refusal::Connect);
    }
    if head.method == Method::TRACE {
        return Some(Refusal::Trace);
    }
    if !head.headers.contains_key(header::TRANSFER_ENCODING) {
        // Most requests: nothing more to look at.
    } else if !chunked_once(&head.headers) {
        return Some(Refusal::TransferCoding);
    }
    let mut hosts = head.headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Some(Refusal::ManyHosts),
        (Some(host), None) if !valid_host(host.as_bytes()) => return Some(Refusal::BadHost),
        (None, _) if head.version == Version::HTTP_11 => return Some(Refusal::NoHost),
        _ => {}
    }
    if let Some(authority) = head.uri.authority() {
        let authority = authority.as_str().as_bytes();
        if head.uri.scheme().is_none() {
            return Some(Refusal::AuthorityForm);
        }
        if authority.contains(&b'@') {
            return Some(Refusal::UserInfo);
        }
        if !valid_host(authority) {
            return Some(Refusal::BadHost);
        }
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
        .flat_map(|v| list(v.as_bytes()));
    codings
        .next()
        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
        && codings.next().is_none()
}

/// The items of a comma-separated header value, trimmed, empty ones left out.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty())
}

/// The protocols the server is offered, when the request asks to switch (HTTP/1.1, an
/// `Upgrade` header and `upgrade` among the `Connection` tokens, as hyper's server requires
/// too): those of its `Upgrade` that `allowed` names (`HTTP_UPGRADE_PROTOCOLS`, any case; a
/// name without `/version` stands for every version of it). `None`: the request goes on as
/// plain HTTP, without `Upgrade`.
pub(crate) fn upgrade_to(
    version: Version,
    headers: &HeaderMap,
    allowed: &[String],
) -> Option<HeaderValue> {
    if version != Version::HTTP_11
        || !connection_tokens(headers).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
    {
        return None;
    }
    let offered: Vec<&[u8]> = headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| list(v.as_bytes()))
        .filter(|protocol| allowed.iter().any(|a| names(a.as_bytes(), protocol)))
        .collect();
    if offered.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&offered.join(&b", "[..])).ok()
}

/// Whether the allowed protocol `allowed` names the offered `protocol` (`websocket` names
/// `WebSocket/13`; `h2c/1` names only itself).
fn names(allowed: &[u8], protocol: &[u8]) -> bool {
    let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
    protocol.eq_ignore_ascii_case(allowed)
        || (!allowed.contains(&b'/') && name.eq_ignore_ascii_case(allowed))
}

/// The tokens of every `Connection` line.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| list(v.as_bytes()))
}

const HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// Headers for one connection only (RFC 9110 7.6.1, and the older `Keep-Alive`,
/// `Proxy-Connection`, `Trailer`; `HTTP2-Settings` goes with an `h2c` upgrade, RFC 7540
/// 3.2.1), never forwarded. hyper writes the framing anew.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HTTP2_SETTINGS,
];

/// Headers a `Connection` line cannot make the broker drop: the routing and the framing.
const KEPT: [HeaderName; 2] = [header::HOST, header::CONTENT_LENGTH];

/// Takes the hop-by-hop headers out of `headers`, and the ones `Connection` names; for an
/// upgrade, `Upgrade: <upgrade>` is said again with `Connection: upgrade` (and the
/// `HTTP2-Settings` of an allowed `h2c`, named in `Connection` as RFC 7540 wants).
fn remove_hop_by_hop(headers: &mut HeaderMap, upgrade: Option<HeaderValue>) {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .filter(|n| !KEPT.contains(n))
        .collect();
    let settings = upgrade
        .as_ref()
        .and_then(|_| headers.get(&HTTP2_SETTINGS).cloned());
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
    if let Some(protocols) = upgrade {
        headers.insert(header::UPGRADE, protocols);
        let connection = match settings {
            Some(settings) => {
                headers.insert(HTTP2_SETTINGS, settings);
                "upgrade, HTTP2-Settings"
            }
            None => "upgrade",
        };
        headers.insert(header::CONNECTION, HeaderValue::from_static(connection));
    }
}

/// The request's `Max-Forwards`, when it has one line and that is a number.
fn max_forwards(headers: &HeaderMap) -> Option<u64> {
    let mut lines = headers.get_all(header::MAX_FORWARDS).iter();
    let (Some(value), None) = (lines.next(), lines.next()) else {
        return None;
    };
    let digits = value.as_bytes();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Whether the broker is the request's last recipient: an `OPTIONS` with `Max-Forwards: 0`
/// (RFC 9110 7.6.2: such a request is not forwarded, its recipient answers it as the final
/// one, with [`options_answer`]).
pub(crate) fn answered_here(head: &Parts) -> bool {
    head.method == Method::OPTIONS && max_forwards(&head.headers) == Some(0)
}

/// The broker's answer to an `OPTIONS` it is the last recipient of: 200, the methods it
/// passes on, no content (RFC 9110 9.3.7).
pub(crate) fn options_answer() -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
    response
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

/// Headers that say who the client is, which only the broker knows: never passed on from the
/// client, whatever `HTTP_FORWARDED_HEADERS` says, or a client could name any address to the
/// server. (`X-Forwarded-For`, `-Proto` and `-Host` are set by the broker when it adds its
/// own, and pass as they came when it does not, for a proxy in front that sets them.)
const CLIENT_NAMED: [HeaderName; 5] = [
    header::FORWARDED,
    X_REAL_IP,
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("x-forwarded-port"),
];

/// The head a server is sent: hop-by-hop headers out (but an allowed upgrade's), the
/// addresses a client named out, the `Host` of an absolute-form target, `Max-Forwards`
/// counted down, and the `X-Forwarded-*` headers and `X-Real-IP` when
/// `settings.forwarded_headers`.
pub(crate) fn request_headers(head: &Parts, client: &Downstream, settings: &Settings) -> HeaderMap {
    let mut headers = head.headers.clone();
    let upgrade = upgrade_to(head.version, &head.headers, &settings.upgrade_protocols);
    remove_hop_by_hop(&mut headers, upgrade);
    for name in &CLIENT_NAMED {
        headers.remove(name);
    }
    if let Some(authority) = head.uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        headers.insert(header::HOST, host);
    }
    if head.method == Method::OPTIONS
        && let Some(hops) = max_forwards(&head.headers).filter(|&hops| hops > 0)
    {
        headers.insert(header::MAX_FORWARDS, HeaderValue::from(hops - 1));
    }
    if settings.forwarded_headers {
        add_forwarded(&mut headers, client);
    }
    headers
}

/// Gives a request that named no host (HTTP/1.0 may omit `Host`) the `host:port` of the
/// server it goes to, which the server needs to route it as HTTP/1.1 (nginx sends its
/// upstream's name likewise). Called for each server tried.
pub(crate) fn host_of_server(head: &Parts, headers: &mut HeaderMap, server: &impl Display) {
    if head.headers.contains_key(header::HOST) || head.uri.authority().is_some() {
        return;
    }
    if let Ok(host) = HeaderValue::from_str(&server.to_string()) {
        headers.insert(header::HOST, host);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// `X-Forwarded-For` gets the client's address appended (the chain of proxies before the
/// broker is kept, as nginx's `$proxy_add_x_forwarded_for`); `X-Forwarded-Proto`,
/// `X-Forwarded-Host` and `X-Real-IP` are set, never passed on, since the broker is where they
/// are known.
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
    if let Ok(ip) = HeaderValue::from_str(&ip) {
        headers.insert(X_REAL_IP, ip);
    }
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
    let protocols = upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten();
    remove_hop_by_hop(headers, protocols);
}

#[cfg(test)]
mod tests {
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

    /// The engine's defaults, with forwarded headers as `forwarded`.
    fn settings(forwarded: bool) -> Settings {
        Settings {
            forwarded_headers: forwarded,
            ..Settings::default()
        }
    }

    #[test]
    fn refusals() {
        let long = format!("/{}", "a".repeat(MAX_REQUEST_LINE));
        let with =
            |method: Method, uri: &str| head(&[("host", "h")], Version::HTTP_11, method, uri);
        let cases: Vec<(Parts, Option<Refusal>)> = vec![
            (get(&[("host", "h")]), None),
            (get(&[]), Some(Refusal::NoHost)),
            (head(&[], Version::HTTP_10, Method::GET, "/"), None),
            (
                get(&[("host", "h"), ("host", "i")]),
                Some(Refusal::ManyHosts),
            ),
            (
                get(&[("host", "h"), ("host", "h")]),
                Some(Refusal::ManyHosts),
            ),
            (get(&[("host", "h x")]), Some(Refusal::BadHost)),
            (get(&[("host", "")]), Some(Refusal::BadHost)),
            (
                head(&[("host", "a/b")], Version::HTTP_10, Method::GET, "/"),
                Some(Refusal::BadHost),
            ),
            (with(Method::CONNECT, "h:443"), Some(Refusal::Connect)),
            (with(Method::TRACE, "/"), Some(Refusal::Trace)),
            (with(Method::GET, "h:443"), Some(Refusal::AuthorityForm)),
            (with(Method::OPTIONS, "h:443"), Some(Refusal::AuthorityForm)),
            (with(Method::OPTIONS, "*"), None),
            (with(Method::GET, "http://app:81/p"), None),
            (
                with(Method::GET, "http://user@evil/p"),
                Some(Refusal::UserInfo),
            ),
            (
                with(Method::GET, "http://user:pw@evil/p"),
                Some(Refusal::UserInfo),
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
            (with(Method::GET, &long), Some(Refusal::TargetTooLong)),
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
            ("http2-settings", "AAMAAABkAAQAAP__"),
            ("x-secret", "1"),
            ("content-length", "3"),
            ("cookie", "a=b"),
        ]);
        let out = request_headers(&head, &CLIENT, &settings(false));
        let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["host", "content-length", "cookie"]);
    }

    /// A request asking to switch to `upgrade` with `connection`, and what the server is sent
    /// under `allowed`: its `Upgrade` and `Connection`, `None` for absent.
    struct Switch {
        upgrade: &'static str,
        connection: &'static str,
        allowed: &'static [&'static str],
        sent: Option<&'static str>,
    }

    const SWITCHES: &[Switch] = &[
        Switch {
            upgrade: "websocket",
            connection: "keep-alive, Upgrade",
            allowed: &["websocket"],
            sent: Some("websocket"),
        },
        Switch {
            upgrade: "WebSocket/13",
            connection: "UPGRADE",
            allowed: &["websocket"],
            sent: Some("WebSocket/13"),
        },
        Switch {
            upgrade: "h2c",
            connection: "Upgrade, HTTP2-Settings",
            allowed: &["websocket"],
            sent: None,
        },
        Switch {
            upgrade: "h2c, websocket",
            connection: "upgrade",
            allowed: &["WebSocket"],
            sent: Some("websocket"),
        },
        Switch {
            upgrade: "websocket",
            connection: "upgrade",
            allowed: &[],
            sent: None,
        },
        Switch {
            upgrade: "websocket",
            connection: "keep-alive",
            allowed: &["websocket"],
            sent: None,
        },
        Switch {
            upgrade: "foo/2",
            connection: "upgrade",
            allowed: &["foo/1"],
            sent: None,
        },
        Switch {
            upgrade: "foo/1",
            connection: "upgrade",
            allowed: &["foo/1", "h2c"],
            sent: Some("foo/1"),
        },
    ];

    #[test]
    fn only_the_allowed_upgrades_reach_the_server() {
        for case in SWITCHES {
            let head = get(&[
                ("host", "h"),
                ("connection", case.connection),
                ("upgrade", case.upgrade),
                ("sec-websocket-key", "k"),
            ]);
            let allowed: Vec<String> = case.allowed.iter().map(|a| a.to_string()).collect();
            let offered = upgrade_to(head.version, &head.headers, &allowed);
            assert_eq!(
                offered.as_ref().map(HeaderValue::as_bytes),
                case.sent.map(str::as_bytes),
                "{} under {:?}",
                case.upgrade,
                case.allowed
            );
            let settings = Settings {
                upgrade_protocols: allowed,
                ..settings(false)
            };
            let out = request_headers(&head, &CLIENT, &settings);
            assert_eq!(
                out.get("upgrade").map(HeaderValue::as_bytes),
                case.sent.map(str::as_bytes)
            );
            let connection = case.sent.map(|_| &b"upgrade"[..]);
            assert_eq!(out.get("connection").map(HeaderValue::as_bytes), connection);
            assert_eq!(out["sec-websocket-key"], "k");
        }
        let old = head(
            &[("connection", "upgrade"), ("upgrade", "websocket")],
            Version::HTTP_10,
            Method::GET,
            "/",
        );
        assert!(upgrade_to(old.version, &old.headers, &["websocket".into()]).is_none());
    }

    #[test]
    fn an_allowed_h2c_keeps_its_settings() {
        let head = get(&[
            ("host", "h"),
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAAQAAP__"),
        ]);
        let settings = Settings {
            upgrade_protocols: vec!["h2c".into()],
            ..settings(false)
        };
        let out = request_headers(&head, &CLIENT, &settings);
        assert_eq!(out["upgrade"], "h2c");
        assert_eq!(out["connection"], "upgrade, HTTP2-Settings");
        assert_eq!(out["http2-settings"], "AAMAAABkAAQAAP__");
    }

    #[test]
    fn forwarded_headers_append_the_client_and_set_proto_host_and_real_ip() {
        let head = get(&[
            ("host", "portal.example:8080"),
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-for", "198.51.100.2"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "spoofed"),
            ("x-real-ip", "10.9.9.9"),
        ]);
        let out = request_headers(&head, &CLIENT, &settings(true));
        assert_eq!(
            out["x-forwarded-for"],
            "203.0.113.1, 198.51.100.2, 192.0.2.7"
        );
        assert_eq!(out.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(out["x-forwarded-proto"], "http");
        assert_eq!(out["x-forwarded-host"], "portal.example:8080");
        assert_eq!(out["x-real-ip"], "192.0.2.7");
        assert_eq!(out.get_all("x-real-ip").iter().count(), 1);
        let tls = Downstream {
            tls: true,
            ..CLIENT
        };
        assert_eq!(
            request_headers(&get(&[("host", "h")]), &tls, &settings(true))["x-forwarded-proto"],
            "https"
        );
        let off = request_headers(&head, &CLIENT, &settings(false));
        assert_eq!(off["x-forwarded-proto"], "https");
        assert_eq!(off["x-forwarded-host"], "spoofed");
        assert!(!off.contains_key("x-real-ip"));
    }

    #[test]
    fn addresses_a_client_names_never_reach_the_server() {
        let head = get(&[
            ("host", "h"),
            ("forwarded", "for=10.0.0.1;proto=https"),
            ("x-real-ip", "10.0.0.2"),
            ("true-client-ip", "10.0.0.3"),
            ("x-client-ip", "10.0.0.4"),
            ("x-forwarded-port", "443"),
            ("x-other", "kept"),
        ]);
        for forwarded in [false, true] {
            let out = request_headers(&head, &CLIENT, &settings(forwarded));
            for gone in [
                "forwarded",
                "true-client-ip",
                "x-client-ip",
                "x-forwarded-port",
            ] {
                assert!(!out.contains_key(gone), "{gone} with {forwarded}");
            }
            assert_eq!(
                out.get("x-real-ip").map(HeaderValue::as_bytes),
                forwarded.then_some(&b"192.0.2.7"[..])
            );
            assert_eq!(out["x-other"], "kept");
        }
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
        let out = request_headers(&head, &CLIENT, &settings(false));
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

    #[test]
    fn a_request_without_host_is_given_the_servers() {
        let server = "app-01:8081";
        let cases: [(Parts, &str); 3] = [
            (head(&[], Version::HTTP_10, Method::GET, "/"), "app-01:8081"),
            (get(&[("host", "portal")]), "portal"),
            (
                head(&[], Version::HTTP_10, Method::GET, "http://named:82/"),
                "named:82",
            ),
        ];
        for (head, host) in cases {
            let mut out = request_headers(&head, &CLIENT, &settings(true));
            host_of_server(&head, &mut out, &server);
            assert_eq!(out["host"], host, "{head:?}");
        }
    }

    #[test]
    fn max_forwards_counts_down_on_options_and_stops_at_zero() {
        // (method, Max-Forwards lines, answered here, what the server is sent)
        let cases: &[(Method, &[&str], bool, Option<&str>)] = &[
            (Method::OPTIONS, &["3"], false, Some("2")),
            (Method::OPTIONS, &["1"], false, Some("0")),
            (Method::OPTIONS, &["0"], true, None),
            (Method::OPTIONS, &["00"], true, None),
            (Method::OPTIONS, &[], false, None),
            (Method::OPTIONS, &["-1"], false, Some("-1")),
            (Method::OPTIONS, &["x"], false, Some("x")),
            (Method::OPTIONS, &["0", "0"], false, Some("0")),
            (
                Method::OPTIONS,
                &["99999999999999999999999"],
                false,
                Some("99999999999999999999999"),
            ),
            (Method::GET, &["0"], false, Some("0")),
            (Method::GET, &["5"], false, Some("5")),
        ];
        for (method, lines, here, sent) in cases {
            let mut raw = vec![("host", "h")];
            raw.extend(lines.iter().map(|l| ("max-forwards", *l)));
            let head = head(&raw, Version::HTTP_11, method.clone(), "/");
            assert_eq!(answered_here(&head), *here, "{method} {lines:?}");
            if *here {
                continue;
            }
            let out = request_headers(&head, &CLIENT, &settings(false));
            assert_eq!(
                out.get("max-forwards").map(HeaderValue::as_bytes),
                sent.map(str::as_bytes),
                "{method} {lines:?}"
            );
        }
        let answer = options_answer();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()["allow"], ALLOW);
        assert!(answer.body().is_empty());
    }
}
