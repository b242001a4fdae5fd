//! A client's request head, parsed in place with httparse's strict request parser and checked
//! as a proxy must before any server sees it: its target's form, one valid `Host`, and a
//! body framed one way only (RFC 9112 §3, §6).

use std::mem::MaybeUninit;
use std::net::Ipv6Addr;

use super::field::{Connection, FieldName};
use super::framing::{self, Codings, Length};
use super::version;
use super::{
    Body, FieldId, Fields, HeadError, HeadScan, MAX_FIELDS, MAX_HEAD, MAX_TARGET, Method, Span,
    Version,
};

/// A request line longer than this while it is still arriving is refused as too long a
/// target: the target's limit, and room for a method and the version.
const MAX_REQUEST_LINE: usize = MAX_TARGET + 64;

/// The form of a request target (RFC 9112 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `/path?query`, as servers are sent.
    Origin,
    /// `http://authority/path?query`: the server is sent the path, and the authority as
    /// `Host`.
    Absolute {
        /// The authority (host and port), checked as a `Host` is.
        authority: Span,
        /// The path and query (empty: `/`).
        path: Span,
    },
    /// `host:port`, CONNECT's.
    Authority,
    /// `*`, OPTIONS'.
    Asterisk,
}

/// Whether an HTTP/1.1 request must name its `Host` (RFC 9112 §3.2: a server answers one
/// without it 400). A proxy must, since its servers need one; a connection that only the
/// broker answers (a TCP port's query connection, whose monitors and scripts have sent
/// requests without one for years) may take one that names none: nothing it sends goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRule {
    /// HTTP/1.1 without `Host` is refused.
    Required,
    /// HTTP/1.1 without `Host` is taken; one that is there is checked all the same.
    Optional,
}

/// A request head: offsets into the buffer it was parsed from, and what it means for
/// framing and reuse. It borrows nothing; every accessor that gives bytes takes the buffer.
#[derive(Debug, Clone)]
pub struct RequestHead {
    len: u32,
    method: Method,
    method_span: Span,
    target: Span,
    form: Target,
    version: Version,
    /// The request line is `method SP target SP HTTP/1.1 CRLF`: it can be forwarded as is.
    clean_line: bool,
    fields: Fields,
    body: Body,
    length: Option<Length>,
    connection: Connection,
    host: Option<FieldId>,
    /// Transfer-Encoding came with Content-Length: the client connection closes after.
    close_after: bool,
}

/// What httparse gave, as spans.
struct RequestSpans {
    len: usize,
    method: Span,
    target: Span,
    minor: u8,
    fields: Fields,
}

impl RequestHead {
    /// The request head at the start of `buf`, once it is whole: `Ok(None)` until then (read
    /// more, into the same buffer, and call again with the same `scan`). `buf` is mutable
    /// for one case only: `HTTP/1.2` to `HTTP/1.9` become `HTTP/1.1` in place.
    pub fn parse(buf: &mut [u8], scan: &mut HeadScan) -> Result<Option<RequestHead>, HeadError> {
        RequestHead::parse_with(buf, scan, HostRule::Required)
    }

    /// [`RequestHead::parse`], with `host` saying whether HTTP/1.1 must name its `Host`.
    pub fn parse_with(
        buf: &mut [u8],
        scan: &mut HeadScan,
        host: HostRule,
    ) -> Result<Option<RequestHead>, HeadError> {
        let parsed =
            scan.parse_when_ready(buf, MAX_REQUEST_LINE, HeadError::TargetTooLong, |buf| {
                version::parse_mending(buf, httparse_request, version::fix_request)
            })?;
        parsed
            .map(|parsed| RequestHead::of(buf, parsed, host))
            .transpose()
    }

    /// The head httparse parsed, checked and framed.
    fn of(buf: &[u8], parsed: RequestSpans, rule: HostRule) -> Result<RequestHead, HeadError> {
        if parsed.target.len as usize > MAX_TARGET {
            return Err(HeadError::TargetTooLong);
        }
        if parsed.len > MAX_HEAD {
            return Err(HeadError::HeadTooLarge);
        }
        let version = Version::of_minor(parsed.minor);
        let method = Method::of(parsed.method.of(buf));
        let form = target_form(method, parsed.target, buf)?;
        let host = host(&parsed.fields, buf, version, form, rule)?;
        let (body, length, close_after) = body(&parsed.fields, buf, version)?;
        let clean_line = parsed.minor == 1
            && buf.get(parsed.target.end()..parsed.target.end() + 11) == Some(b" HTTP/1.1\r\n");
        Ok(RequestHead {
            len: u32::try_from(parsed.len).unwrap_or(u32::MAX),
            method,
            method_span: parsed.method,
            target: parsed.target,
            form,
            version,
            clean_line,
            connection: Connection::of(&parsed.fields, buf),
            fields: parsed.fields,
            body,
            length,
            host,
            close_after,
        })
    }

    /// The head's length: its body (or the next request) begins here.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Never: a head has at least its request line (clippy's pair for [`RequestHead::len`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The method as received (for the access log, and `Other` methods).
    pub fn method_bytes<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        self.method_span.of(buf)
    }

    /// The target as received.
    pub fn target<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        self.target.of(buf)
    }

    /// The target's form.
    pub fn form(&self) -> Target {
        self.form
    }

    /// The path and query a server is sent (an absolute target's path; empty means `/`).
    pub fn path<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        match self.form {
            Target::Absolute { path, .. } => path.of(buf),
            _ => self.target.of(buf),
        }
    }

    /// The version received (1.2 and later minors read as 1.1).
    pub fn version(&self) -> Version {
        self.version
    }

    /// The header lines.
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// How the body is delimited: [`Body::Empty`], a length, or chunked.
    pub fn body(&self) -> Body {
        self.body
    }

    /// The host the request is for: an absolute target's authority, else the `Host` value.
    pub fn host<'a>(&self, buf: &'a [u8]) -> Option<&'a [u8]> {
        match self.form {
            Target::Absolute { authority, .. } => Some(authority.of(buf)),
            _ => self
                .host
                .and_then(|id| self.fields.get(buf, id))
                .map(|f| f.value),
        }
    }

    /// Whether the client asks to switch protocols: HTTP/1.1, an `Upgrade` line and the
    /// `upgrade` token in `Connection` (what hyper's server required too).
    pub fn wants_upgrade(&self) -> bool {
        self.version == Version::Http11
            && self.connection.upgrade
            && self.fields.named(FieldName::Upgrade).next().is_some()
    }

    /// What the server is asked, sent as `how` says: the method, and an upgrade if one goes
    /// on (the response's framing depends on both).
    pub fn asked(&self, how: &super::ToServer<'_>) -> super::Asked {
        super::Asked {
            method: self.method,
            upgrade: how.upgrade && self.wants_upgrade(),
        }
    }

    /// The protocols the client asks to switch to (`websocket`), for the allowed list.
    pub fn upgrade_protocols<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
        self.fields.tokens(buf, FieldName::Upgrade)
    }

    /// Whether it carries `Expect: 100-continue`: its body waits for a 100 or is not sent.
    pub fn expects_continue(&self, buf: &[u8]) -> bool {
        self.fields
            .named(FieldName::Expect)
            .filter_map(|id| self.fields.get(buf, id))
            .any(|f| f.value.eq_ignore_ascii_case(b"100-continue"))
    }

    /// Whether the client keeps its connection for another request: HTTP/1.1 unless it said
    /// `close`, HTTP/1.0 only if it said `keep-alive`; never after a request framed both
    /// ways (Transfer-Encoding and Content-Length).
    pub fn keep_alive(&self) -> bool {
        let asked = match self.version {
            Version::Http11 => !self.connection.close,
            Version::Http10 => self.connection.keep_alive && !self.connection.close,
        };
        asked && !self.close_after
    }

    /// Whether Transfer-Encoding came with Content-Length (RFC 9112 §6.1: maybe an attempt at
    /// smuggling): the length was not trusted, and the client connection closes after.
    pub fn framed_twice(&self) -> bool {
        self.close_after
    }

    pub(crate) fn clean_line(&self) -> bool {
        self.clean_line
    }

    pub(crate) fn method_span(&self) -> Span {
        self.method_span
    }

    pub(crate) fn target_span(&self) -> Span {
        self.target
    }

    pub(crate) fn length(&self) -> Option<Length> {
        self.length
    }

    pub(crate) fn connection(&self) -> Connection {
        self.connection
    }

    pub(crate) fn has_host_line(&self) -> bool {
        self.host.is_some()
    }
}

/// One run of httparse over `buf`, strict (its defaults), with [`MAX_FIELDS`] slots left
/// uninitialised on the stack.
fn httparse_request(buf: &[u8]) -> Result<Option<RequestSpans>, httparse::Error> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut request = httparse::Request::new(&mut []);
    let config = httparse::ParserConfig::default();
    let httparse::Status::Complete(len) =
        config.parse_request_with_uninit_headers(&mut request, buf, &mut slots)?
    else {
        return Ok(None);
    };
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version)
    else {
        return Err(httparse::Error::Token);
    };
    Ok(Some(RequestSpans {
        len,
        method: Span::within(buf, method.as_bytes()),
        target: Span::within(buf, target.as_bytes()),
        minor,
        fields: Fields::of_httparse(buf, request.headers, false),
    }))
}

/// The target's form; refused when it suits no form, or not the method (RFC 9112 §3.2).
fn target_form(method: Method, target: Span, buf: &[u8]) -> Result<Target, HeadError> {
    let bytes = target.of(buf);
    match bytes.first() {
        Some(b'/') => Ok(Target::Origin),
        Some(b'*') if bytes.len() == 1 && method == Method::Options => Ok(Target::Asterisk),
        _ if method == Method::Connect => valid_host(bytes)
            .then_some(Target::Authority)
            .ok_or(HeadError::BadTarget),
        _ => absolute(target, buf),
    }
}

/// An absolute-form target: `http://` or `https://` (any case), an authority without user
/// info, then a path, a query, or nothing.
fn absolute(target: Span, buf: &[u8]) -> Result<Target, HeadError> {
    let bytes = target.of(buf);
    let scheme = bytes.iter().position(|&b| b == b':').unwrap_or(0);
    let known = bytes[..scheme].eq_ignore_ascii_case(b"http")
        || bytes[..scheme].eq_ignore_ascii_case(b"https");
    if !known || bytes.get(scheme..scheme + 3) != Some(b"://") {
        return Err(HeadError::BadTarget);
    }
    let from = scheme + 3;
    let rest = &bytes[from..];
    let end = rest
        .iter()
        .position(|&b| b == b'/' || b == b'?')
        .unwrap_or(rest.len());
    if rest[..end].contains(&b'@') {
        return Err(HeadError::BadTarget);
    }
    if !valid_host(&rest[..end]) {
        return Err(HeadError::BadHost);
    }
    let start = target.start as usize + from;
    Ok(Target::Absolute {
        authority: Span::new(start, end),
        path: Span::between(start + end, target.end()),
    })
}

/// The one `Host` line: refused when there are several, when HTTP/1.1 has none, or when it
/// is no host (RFC 9112 §3.2: 400). An absolute target's authority was checked already.
fn host(
    fields: &Fields,
    buf: &[u8],
    version: Version,
    form: Target,
    rule: HostRule,
) -> Result<Option<FieldId>, HeadError> {
    let mut hosts = fields.named(FieldName::Host);
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(HeadError::SeveralHosts);
    }
    let Some(id) = host else {
        return match (version, rule) {
            (Version::Http11, HostRule::Required) => Err(HeadError::NoHost),
            _ => Ok(None),
        };
    };
    let absolute = matches!(form, Target::Absolute { .. });
    let value = fields.get(buf, id).map_or(&b""[..], |f| f.value);
    if !absolute && !valid_host(value) {
        return Err(HeadError::BadHost);
    }
    Ok(Some(id))
}

/// `host [":" port]` as RFC 9110 §7.2 has it, read as bytes, never decoded: RFC 3986's
/// IP-literal (`[2001:db8::1]`, `[v1.x]`) or reg-name (letters, digits, `-._~`, the
/// sub-delimiters `!$&'()*+,;=`, `%` and two hex digits; an IPv4 address is one), never empty
/// (RFC 9110 §4.2.1: an `http` URI has a host), then `:` and at most five digits, if anything.
/// So no user info, no path, no space, no byte outside ASCII.
pub(crate) fn valid_host(value: &[u8]) -> bool {
    let port = match value.first() {
        Some(b'[') => {
            let Some(close) = value.iter().position(|&b| b == b']') else {
                return false;
            };
            if !ip_literal(&value[1..close]) {
                return false;
            }
            &value[close + 1..]
        }
        _ => {
            let colon = value.iter().position(|&b| b == b':').unwrap_or(value.len());
            let (host, port) = value.split_at(colon);
            if !reg_name(host) {
                return false;
            }
            port
        }
    };
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// RFC 3986's reg-name, but never empty.
fn reg_name(host: &[u8]) -> bool {
    let mut rest = host;
    while let Some((&b, tail)) = rest.split_first() {
        rest = match (b, tail) {
            (b'%', [h, l, tail @ ..]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => tail,
            (b'%', _) => return false,
            _ if NAME_BYTES[usize::from(b)] => tail,
            _ => return false,
        };
    }
    !host.is_empty()
}

/// What is inside the brackets of an IP-literal: an IPv6 address, or `v`, hex digits, `.` and
/// more (IPvFuture).
fn ip_literal(inside: &[u8]) -> bool {
    match inside {
        [b'v' | b'V', rest @ ..] => {
            let Some(dot) = rest.iter().position(|&b| b == b'.') else {
                return false;
            };
            let (version, tail) = (&rest[..dot], &rest[dot + 1..]);
            !version.is_empty()
                && version.iter().all(u8::is_ascii_hexdigit)
                && !tail.is_empty()
                && tail
                    .iter()
                    .all(|&b| NAME_BYTES[usize::from(b)] || b == b':')
        }
        _ => std::str::from_utf8(inside).is_ok_and(|text| text.parse::<Ipv6Addr>().is_ok()),
    }
}

/// The bytes of a reg-name but `%` (unreserved and sub-delimiters), as a table (one load a
/// byte).
static NAME_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        b += 1;
    }
    table
};

/// The body's framing (RFC 9112 §6.3): chunked by a final `chunked` coding (refused on
/// HTTP/1.0), else a length, else empty; with both, the coding wins and the connection
/// closes after.
fn body(
    fields: &Fields,
    buf: &[u8],
    version: Version,
) -> Result<(Body, Option<Length>, bool), HeadError> {
    let codings = Codings::of(fields, buf);
    if codings.present && version == Version::Http10 {
        return Err(HeadError::TransferEncodingOn10);
    }
    if let Some(body) = codings.request()? {
        let with_length = fields.named(FieldName::ContentLength).next().is_some();
        return Ok((body, None, with_length));
    }
    let length = framing::content_length(fields, buf, false)?;
    let body = match length {
        Some(Length { value: 0, .. }) | None => Body::Empty,
        Some(length) => Body::Length(length.value),
    };
    Ok((body, length, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        RequestHead::parse(&mut raw.to_vec(), &mut HeadScan::default())
    }

    fn refusal(raw: &str) -> Option<HeadError> {
        parse(raw.as_bytes()).err()
    }

    #[test]
    fn a_browser_request_is_read_in_place() {
        let mut buf = b"GET /app/x?q=1 HTTP/1.1\r\nHost: portal:8080\r\nUser-Agent: Mozilla\r\nCookie: a=1\r\n\r\nnext".to_vec();
        let head = RequestHead::parse(&mut buf, &mut HeadScan::default())
            .unwrap()
            .unwrap();
        assert_eq!(head.len(), buf.len() - 4);
        assert_eq!(head.method(), Method::Get);
        assert_eq!(head.method_bytes(&buf), b"GET");
        assert_eq!(head.target(&buf), b"/app/x?q=1");
        assert_eq!(head.form(), Target::Origin);
        assert_eq!(head.version(), Version::Http11);
        assert_eq!(head.host(&buf), Some(&b"portal:8080"[..]));
        assert_eq!(head.body(), Body::Empty);
        assert!(head.keep_alive());
        assert!(head.clean_line());
        let names: Vec<&[u8]> = head.fields().iter(&buf).map(|(_, f)| f.name).collect();
        assert_eq!(names, [&b"Host"[..], b"User-Agent", b"Cookie"]);
        assert_eq!(
            head.fields().value(&buf, b"user-agent"),
            Some(&b"Mozilla"[..])
        );
    }

    /// Heads and what is wrong with each (`None`: nothing); the test adds the two it builds
    /// (a target too long, too many fields).
    const REFUSALS: &[(&str, Option<HeadError>)] = &[
        ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", None),
        ("GET / HTTP/1.0\r\n\r\n", None),
        ("GET / HTTP/1.1\r\n\r\n", Some(HeadError::NoHost)),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
            Some(HeadError::SeveralHosts),
        ),
        ("GET / HTTP/1.1\r\nHost: \r\n\r\n", Some(HeadError::BadHost)),
        (
            "GET / HTTP/1.1\r\nHost: h x\r\n\r\n",
            Some(HeadError::BadHost),
        ),
        (
            "GET / HTTP/1.1\r\nHost: a/b?c\r\n\r\n",
            Some(HeadError::BadHost),
        ),
        (
            "GET / HTTP/1.1\r\nHost: a, b\r\n\r\n",
            Some(HeadError::BadHost),
        ),
        (
            "GET / HTTP/1.1\r\nHost: user@evil\r\n\r\n",
            Some(HeadError::BadHost),
        ),
        ("GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", None),
        (
            "GET / HTTP/1.1\r\nHost: h:99999x\r\n\r\n",
            Some(HeadError::BadHost),
        ),
        (
            "GET http://u@app/ HTTP/1.1\r\nHost: h\r\n\r\n",
            Some(HeadError::BadTarget),
        ),
        (
            "GET app:80 HTTP/1.1\r\nHost: h\r\n\r\n",
            Some(HeadError::BadTarget),
        ),
        (
            "GET * HTTP/1.1\r\nHost: h\r\n\r\n",
            Some(HeadError::BadTarget),
        ),
        ("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", None),
        ("CONNECT app:443 HTTP/1.1\r\nHost: app:443\r\n\r\n", None),
        (
            "GET ftp://app/ HTTP/1.1\r\nHost: h\r\n\r\n",
            Some(HeadError::BadTarget),
        ),
        (
            "GET / HTTP/2.0\r\nHost: h\r\n\r\n",
            Some(HeadError::VersionNotSupported),
        ),
        (
            "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::HeaderName)),
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::Folded)),
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::HeaderValue)),
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::HeaderValue)),
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::HeaderValue)),
        ),
        (
            "GET /a b HTTP/1.1\r\nHost: h\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::Version)),
        ),
        (
            "G\x01T / HTTP/1.1\r\nHost: h\r\n\r\n",
            Some(HeadError::Malformed(super::super::Syntax::RequestLine)),
        ),
        (
            "GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            Some(HeadError::TransferEncodingOn10),
        ),
        (
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            Some(HeadError::ConflictingLengths),
        ),
    ];

    #[test]
    fn refusals_say_what_is_wrong() {
        let long = format!(
            "GET /{} HTTP/1.1\r\nHost: h\r\n\r\n",
            "a".repeat(MAX_TARGET)
        );
        let many: String = (0..=MAX_FIELDS).map(|i| format!("X-{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n");
        let built = [
            (&long[..], Some(HeadError::TargetTooLong)),
            (&many[..], Some(HeadError::TooManyFields)),
        ];
        for &(raw, expected) in REFUSALS.iter().chain(&built) {
            assert_eq!(refusal(raw), expected, "{raw:?}");
        }
    }

    #[test]
    fn bodies_are_framed_one_way() {
        let cases: &[(&str, Body, bool)] = &[
            ("", Body::Empty, true),
            ("Content-Length: 0\r\n", Body::Empty, true),
            ("Content-Length: 5\r\n", Body::Length(5), true),
            (
                "Content-Length: 5\r\nContent-Length: 5\r\n",
                Body::Length(5),
                true,
            ),
            ("Transfer-Encoding: chunked\r\n", Body::Chunked, true),
            (
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                Body::Chunked,
                false,
            ),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: x\r\n",
                Body::Chunked,
                false,
            ),
        ];
        for (lines, body, keep_alive) in cases {
            let raw = format!("POST / HTTP/1.1\r\nHost: h\r\n{lines}\r\n");
            let head = parse(raw.as_bytes()).unwrap().unwrap();
            assert_eq!(
                (head.body(), head.keep_alive()),
                (*body, *keep_alive),
                "{lines:?}"
            );
        }
    }

    #[test]
    fn versions_and_keep_alive() {
        let cases: &[(&str, Version, bool)] = &[
            ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", Version::Http11, true),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
                Version::Http11,
                false,
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Close\r\n\r\n",
                Version::Http11,
                false,
            ),
            ("GET / HTTP/1.0\r\n\r\n", Version::Http10, false),
            (
                "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
                Version::Http10,
                true,
            ),
            ("GET / HTTP/1.2\r\nHost: h\r\n\r\n", Version::Http11, true),
        ];
        for (raw, version, keep_alive) in cases {
            let head = parse(raw.as_bytes()).unwrap().unwrap();
            assert_eq!(
                (head.version(), head.keep_alive()),
                (*version, *keep_alive),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn absolute_targets_give_their_authority_and_path() {
        let mut buf = b"GET HTTP://app.example:81?q=1 HTTP/1.1\r\nHost: other\r\n\r\n".to_vec();
        let head = RequestHead::parse(&mut buf, &mut HeadScan::default())
            .unwrap()
            .unwrap();
        assert_eq!(head.host(&buf), Some(&b"app.example:81"[..]));
        assert_eq!(head.path(&buf), b"?q=1");
    }

    #[test]
    fn a_missing_host_is_taken_only_where_the_rule_allows_it() {
        let optional = |raw: &[u8]| {
            let mut buf = raw.to_vec();
            RequestHead::parse_with(&mut buf, &mut HeadScan::default(), HostRule::Optional)
        };
        let head = optional(b"GET /q HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(head.version(), Version::Http11);
        assert_eq!(
            parse(b"GET /q HTTP/1.1\r\n\r\n").err(),
            Some(HeadError::NoHost)
        );
        // One that is there is checked all the same.
        let bad = optional(b"GET /q HTTP/1.1\r\nHost: a b\r\n\r\n").err();
        assert_eq!(bad, Some(HeadError::BadHost));
        let twice = optional(b"GET /q HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").err();
        assert_eq!(twice, Some(HeadError::SeveralHosts));
    }

    #[test]
    fn a_head_in_pieces_is_parsed_once_whole() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\n";
        for cut in 1..raw.len() {
            let mut buf = raw[..cut].to_vec();
            let mut scan = HeadScan::default();
            assert!(
                RequestHead::parse(&mut buf, &mut scan).unwrap().is_none(),
                "{cut}"
            );
            buf.extend_from_slice(&raw[cut..]);
            let head = RequestHead::parse(&mut buf, &mut scan).unwrap().unwrap();
            assert_eq!(head.len(), raw.len());
        }
    }

    #[test]
    fn partial_heads_are_bounded() {
        let mut line = b"GET /".to_vec();
        line.resize(MAX_REQUEST_LINE + 1, b'a');
        assert_eq!(parse(&line).err(), Some(HeadError::TargetTooLong));
        let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
        head.resize(MAX_HEAD + 1, b'a');
        assert_eq!(parse(&head).err(), Some(HeadError::HeadTooLarge));
        let mut ok = b"GET / HTTP/1.1\r\nX: ".to_vec();
        ok.resize(MAX_HEAD, b'a');
        assert!(matches!(parse(&ok), Ok(None)));
    }

    #[test]
    fn hosts() {
        let good: &[&[u8]] = &[
            b"a",
            b"portal.example",
            b"portal.example.",
            b"a-b_c~d%41",
            b"a,b",
            b"!$&'()*+;=",
            b"h:",
            b"h:8080",
            b"[::1]",
            b"[fe80::1]:80",
            b"[2001:db8::192.0.2.1]",
            b"[v1.fe80::a+en1]",
            b"10.0.0.1:80",
        ];
        let bad: &[&[u8]] = &[
            b"",
            b":80",
            b"h x",
            b"a/b",
            b"a?b",
            b"a, b",
            b"u@h",
            b"a%4",
            b"a%zz",
            b"a\"b",
            b"a<b",
            b"[192.0.2.1]",
            b"[fe80::1%25en0]",
            b"[v1]",
            b"[::1",
            b"[]",
            b"[::1]x",
            b"h:123456",
            b"h:8a",
            b"\xc3\xa9",
        ];
        for host in good {
            assert!(valid_host(host), "{}", host.escape_ascii());
        }
        for host in bad {
            assert!(!valid_host(host), "{}", host.escape_ascii());
        }
    }
}
