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
mod tests;
