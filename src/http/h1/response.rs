//! A server's response head, parsed in place leniently (as pingora does: whitespace before a
//! colon and folded lines are taken, and mended before the head goes on), and framed by the
//! request's method and the status (RFC 9112 §6.3): the client sees the status line
//! `HTTP/1.1` and a body delimited one way only.

use std::mem::MaybeUninit;

use super::field::Connection;
use super::framing::{self, Codings, Length};
use super::version;
use super::{
    Body, Fields, HeadError, HeadScan, MAX_HEAD, MAX_RESPONSE_FIELDS, Method, Span, Version,
};

/// What the request sent to the server asked, as the response's framing depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// The request's method (HEAD: no body; CONNECT: a 2xx is a tunnel).
    pub method: Method,
    /// Whether the server was sent an upgrade (`Upgrade` and `Connection: upgrade`).
    pub upgrade: bool,
}

/// What follows a response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// An interim response (100, 102, 103): no body, and the final response comes next on
    /// the same connection. Forwarded to HTTP/1.1 clients (RFC 9110 §15.2).
    Interim,
    /// A final response and its body.
    Body(Body),
    /// 101 to an upgrade, or a 2xx to CONNECT: from the end of the head on, bytes both ways.
    Tunnel,
}

/// A response head: offsets into the buffer it was parsed from, and its framing.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    len: u32,
    status: u16,
    version: Version,
    /// The status line, without its line end.
    line: Span,
    /// Its three digits.
    code: Span,
    /// Its reason phrase, as received (obs-text included).
    reason: Span,
    /// The status line is `HTTP/1.1 NNN reason CRLF`: it can be forwarded as is.
    clean_line: bool,
    fields: Fields,
    framing: Framing,
    length: Option<Length>,
    codings: Codings,
    connection: Connection,
    asked: Asked,
}

/// What httparse gave, as spans.
struct ResponseSpans {
    len: usize,
    status: u16,
    minor: u8,
    fields: Fields,
}

impl ResponseHead {
    /// The response head at the start of `buf`, once it is whole: `Ok(None)` until then (read
    /// more and call again with the same `scan`). A folded line has its line breaks made
    /// spaces in `buf`, and `HTTP/1.2` becomes `HTTP/1.1`. Every error is a 502 to the
    /// client; its words are for the log.
    pub fn parse(
        buf: &mut [u8],
        scan: &mut HeadScan,
        asked: Asked,
    ) -> Result<Option<ResponseHead>, HeadError> {
        let parsed = scan.parse_when_ready(buf, MAX_HEAD, HeadError::HeadTooLarge, |buf| {
            version::parse_mending(buf, httparse_response, version::fix_response)
        })?;
        let Some(parsed) = parsed else {
            return Ok(None);
        };
        parsed.fields.unfold(buf);
        ResponseHead::of(buf, parsed, asked).map(Some)
    }

    fn of(buf: &[u8], parsed: ResponseSpans, asked: Asked) -> Result<ResponseHead, HeadError> {
        if parsed.len > MAX_HEAD {
            return Err(HeadError::HeadTooLarge);
        }
        let version = Version::of_minor(parsed.minor);
        let (line, code, reason, clean_line) = status_line(buf, parsed.minor);
        let codings = Codings::of(&parsed.fields, buf);
        let (framing, length) =
            framing(parsed.status, asked, version, &parsed.fields, buf, codings)?;
        Ok(ResponseHead {
            len: u32::try_from(parsed.len).unwrap_or(u32::MAX),
            status: parsed.status,
            version,
            line,
            code,
            reason,
            clean_line,
            connection: Connection::of(&parsed.fields, buf),
            fields: parsed.fields,
            framing,
            length,
            codings,
            asked,
        })
    }

    /// The head's length: the body (or the next head, after an interim one) begins here.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Never: a head has at least its status line (clippy's pair for [`ResponseHead::len`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The reason phrase as received.
    pub fn reason<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        self.reason.of(buf)
    }

    /// The version the server spoke.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The header lines.
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// What follows the head.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// What the request asked, as given to [`ResponseHead::parse`].
    pub fn asked(&self) -> Asked {
        self.asked
    }

    /// Whether the server keeps the connection: HTTP/1.1 unless it said `close`, HTTP/1.0
    /// only if it said `keep-alive`.
    pub fn server_keeps_alive(&self) -> bool {
        match self.version {
            Version::Http11 => !self.connection.close,
            Version::Http10 => self.connection.keep_alive && !self.connection.close,
        }
    }

    /// Whether this interim response goes to a client of `version`: HTTP/1.0 knows none
    /// (RFC 9110 §15.2: a server must not send it one).
    pub fn forwards_interim_to(&self, version: Version) -> bool {
        self.framing == Framing::Interim && version == Version::Http11
    }

    /// Whether a client of `version` gets the body as its data only, the chunk framing taken
    /// off (HTTP/1.0 knows no chunks, RFC 9112 §6.1): its connection then closes at the end.
    pub fn dechunks_for(&self, version: Version) -> bool {
        self.framing == Framing::Body(Body::Chunked) && version == Version::Http10
    }

    pub(crate) fn line(&self) -> Span {
        self.line
    }

    pub(crate) fn code_span(&self) -> Span {
        self.code
    }

    pub(crate) fn reason_span(&self) -> Span {
        self.reason
    }

    pub(crate) fn clean_line(&self) -> bool {
        self.clean_line
    }

    pub(crate) fn length(&self) -> Option<Length> {
        self.length
    }

    pub(crate) fn codings(&self) -> Codings {
        self.codings
    }

    pub(crate) fn connection(&self) -> Connection {
        self.connection
    }
}

/// One run of httparse over `buf`, lenient as toward a server, with [`MAX_RESPONSE_FIELDS`]
/// slots.
fn httparse_response(buf: &[u8]) -> Result<Option<ResponseSpans>, httparse::Error> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_FIELDS];
    let mut response = httparse::Response::new(&mut []);
    let mut config = httparse::ParserConfig::default();
    config
        .allow_spaces_after_header_name_in_responses(true)
        .allow_obsolete_multiline_headers_in_responses(true);
    let httparse::Status::Complete(len) =
        config.parse_response_with_uninit_headers(&mut response, buf, &mut slots)?
    else {
        return Ok(None);
    };
    let (Some(status), Some(minor)) = (response.code, response.version) else {
        return Err(httparse::Error::Status);
    };
    Ok(Some(ResponseSpans {
        len,
        status,
        minor,
        fields: Fields::of_httparse(buf, response.headers, true),
    }))
}

/// The status line's spans (httparse checked it: `HTTP/1.x`, one space, three digits,
/// then a space and a reason, or the line's end), and whether it can go as it came.
fn status_line(buf: &[u8], minor: u8) -> (Span, Span, Span, bool) {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(0);
    let lf = buf
        .get(start..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        .map_or(buf.len(), |at| start + at);
    let crlf = lf > 0 && buf.get(lf - 1) == Some(&b'\r');
    let end = lf - usize::from(crlf);
    let code = Span::new(start + 9, 3);
    let spaced = buf.get(start + 12) == Some(&b' ');
    let reason = Span::between((start + 13).min(end), end);
    let clean = minor == 1 && crlf && spaced;
    (Span::between(start, end), code, reason, clean)
}

/// The framing of a response to `asked` (RFC 9112 §6.3, in its order): 1xx, then HEAD, 204
/// and 304, then CONNECT's 2xx, then the codings (chunked last: chunked, the length
/// ignored; another coding last: until close), then the length, then until close.
fn framing(
    status: u16,
    asked: Asked,
    version: Version,
    fields: &Fields,
    buf: &[u8],
    codings: Codings,
) -> Result<(Framing, Option<Length>), HeadError> {
    match status {
        0..=99 => return Err(HeadError::BadStatus),
        101 if asked.upgrade => return Ok((Framing::Tunnel, None)),
        101 => return Err(HeadError::UnaskedSwitch),
        100..=199 => return Ok((Framing::Interim, None)),
        204 | 304 => return Ok((Framing::Body(Body::Empty), None)),
        200..=299 if asked.method == Method::Connect => return Ok((Framing::Tunnel, None)),
        _ if asked.method == Method::Head => return Ok((Framing::Body(Body::Empty), None)),
        _ => {}
    }
    if codings.present {
        if version == Version::Http10 {
            return Err(HeadError::TransferEncodingOn10);
        }
        let body = if codings.chunked_last {
            Body::Chunked
        } else {
            Body::UntilClose
        };
        return Ok((Framing::Body(body), None));
    }
    let length = framing::content_length(fields, buf, true)?;
    let body = match length {
        Some(Length { value: 0, .. }) => Body::Empty,
        Some(length) => Body::Length(length.value),
        None => Body::UntilClose,
    };
    Ok((Framing::Body(body), length))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: Asked = Asked {
        method: Method::Get,
        upgrade: false,
    };

    fn parse(raw: &str, asked: Asked) -> Result<ResponseHead, HeadError> {
        let mut buf = raw.as_bytes().to_vec();
        ResponseHead::parse(&mut buf, &mut HeadScan::default(), asked)?
            .ok_or(HeadError::HeadTooLarge)
    }

    fn framing_of(raw: &str, asked: Asked) -> Result<Framing, HeadError> {
        parse(raw, asked).map(|h| h.framing())
    }

    const HEAD: Asked = Asked {
        method: Method::Head,
        upgrade: false,
    };
    const CONNECT: Asked = Asked {
        method: Method::Connect,
        upgrade: false,
    };
    const UPGRADE: Asked = Asked {
        method: Method::Get,
        upgrade: true,
    };

    const fn framed(body: Body) -> Result<Framing, HeadError> {
        Ok(Framing::Body(body))
    }

    /// RFC 9112 §6.3's order, case by case: a response, what its request asked, its framing.
    const RFC_TABLE: &[(&str, Asked, Result<Framing, HeadError>)] = &[
        ("HTTP/1.1 100 Continue\r\n\r\n", GET, Ok(Framing::Interim)),
        (
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n",
            GET,
            Ok(Framing::Interim),
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            UPGRADE,
            Ok(Framing::Tunnel),
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            GET,
            Err(HeadError::UnaskedSwitch),
        ),
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
            GET,
            framed(Body::Empty),
        ),
        (
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            GET,
            framed(Body::Empty),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            HEAD,
            framed(Body::Empty),
        ),
        ("HTTP/1.1 200 OK\r\n\r\n", CONNECT, Ok(Framing::Tunnel)),
        (
            "HTTP/1.1 407 No\r\nContent-Length: 2\r\n\r\n",
            CONNECT,
            framed(Body::Length(2)),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            GET,
            framed(Body::Chunked),
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            GET,
            framed(Body::UntilClose),
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            GET,
            framed(Body::Chunked),
        ),
        (
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            GET,
            Err(HeadError::TransferEncodingOn10),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            GET,
            framed(Body::Length(5)),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
            GET,
            framed(Body::Length(5)),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            GET,
            Err(HeadError::ConflictingLengths),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            GET,
            Err(HeadError::BadLength),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            GET,
            framed(Body::Empty),
        ),
        ("HTTP/1.1 200 OK\r\n\r\n", GET, framed(Body::UntilClose)),
        ("HTTP/1.1 099 Odd\r\n\r\n", GET, Err(HeadError::BadStatus)),
        (
            "HTTP/1.2 200 OK\r\nContent-Length: 1\r\n\r\n",
            GET,
            framed(Body::Length(1)),
        ),
        (
            "HTTP/2.0 200 OK\r\n\r\n",
            GET,
            Err(HeadError::VersionNotSupported),
        ),
    ];

    #[test]
    fn the_rfc_table() {
        for (raw, asked, expected) in RFC_TABLE {
            assert_eq!(framing_of(raw, *asked), *expected, "{raw:?}");
        }
    }

    #[test]
    fn a_lenient_head_is_mended_in_place() {
        let mut buf =
            b"HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nServer : s\r\nContent-Length: 0\r\n\r\n"
                .to_vec();
        let head = ResponseHead::parse(&mut buf, &mut HeadScan::default(), GET)
            .unwrap()
            .unwrap();
        let fields: Vec<(&[u8], &[u8])> = head
            .fields()
            .iter(&buf)
            .map(|(_, f)| (f.name, f.value))
            .collect();
        assert_eq!(
            fields,
            [
                (&b"X-Long"[..], &b"a   b"[..]),
                (b"Server", b"s"),
                (b"Content-Length", b"0")
            ]
        );
        let clean: Vec<bool> = head.fields().raw().iter().map(|f| f.clean).collect();
        assert_eq!(clean, [false, false, true]);
    }

    #[test]
    fn the_status_line_keeps_its_reason_and_says_if_it_is_clean() {
        let cases: &[(&[u8], u16, &[u8], bool)] = &[
            (b"HTTP/1.1 200 OK\r\n\r\n", 200, b"OK", true),
            (b"HTTP/1.1 404 Not Found\r\n\r\n", 404, b"Not Found", true),
            (b"HTTP/1.0 200 OK\r\n\r\n", 200, b"OK", false),
            (b"HTTP/1.1 200\r\n\r\n", 200, b"", false),
            (b"HTTP/1.1 200 \r\n\r\n", 200, b"", true),
            (b"HTTP/1.1 200 N\xe3o\r\n\r\n", 200, b"N\xe3o", true),
            (b"HTTP/1.1 200 OK\n\n", 200, b"OK", false),
            (b"\r\nHTTP/1.1 200 OK\r\n\r\n", 200, b"OK", true),
        ];
        for (raw, status, reason, clean) in cases {
            let mut buf = raw.to_vec();
            let head = ResponseHead::parse(&mut buf, &mut HeadScan::default(), GET)
                .unwrap()
                .unwrap();
            assert_eq!(
                (head.status(), head.reason(&buf), head.clean_line()),
                (*status, *reason, *clean),
                "{}",
                raw.escape_ascii()
            );
        }
    }

    #[test]
    fn keep_alive_interim_and_dechunking_depend_on_versions() {
        let close = parse(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            GET,
        )
        .unwrap();
        assert!(!close.server_keeps_alive());
        let old = parse("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", GET).unwrap();
        assert!(!old.server_keeps_alive());
        let old_kept = parse(
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
            GET,
        )
        .unwrap();
        assert!(old_kept.server_keeps_alive());
        let hints = parse("HTTP/1.1 103 Early Hints\r\n\r\n", GET).unwrap();
        assert!(hints.forwards_interim_to(Version::Http11));
        assert!(!hints.forwards_interim_to(Version::Http10));
        let chunked = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", GET).unwrap();
        assert!(chunked.dechunks_for(Version::Http10));
        assert!(!chunked.dechunks_for(Version::Http11));
    }
}
