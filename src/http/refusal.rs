//! Why the broker answers a request itself rather than forward it, in the words its page
//! gives ([`pages::refused`](super::pages::refused)): the core's reason for a head it cannot
//! take ([`HeadError`]) told more precisely where the request line's bytes show more, and
//! the methods the broker does not pass on.

use hyper::StatusCode;

use super::h1::{HeadError, Syntax};

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
    /// The request target is longer than the core's limit ([`MAX_TARGET`]).
    ///
    /// [`MAX_TARGET`]: super::h1::MAX_TARGET
    TargetTooLong,
    /// An HTTP version of another major than 1 (505).
    Version,
    /// The request's body could not be read: a malformed chunk, or it broke off.
    Body,
    /// A request other than a query on a front balancer's own connection (a PROXY protocol v2
    /// `LOCAL` header: its health check), which is never forwarded (403).
    FrontCheck,
    /// A head that is not HTTP/1.1, by what is wrong with it.
    Head(HeadFault),
}

/// What is wrong with a head that is not HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadFault {
    /// The request line is not `METHOD target HTTP/1.x`.
    RequestLine,
    /// A header line continued on the next (obs-fold, which RFC 9112 5.2 lets a proxy refuse).
    Folded,
    /// A header line that is not `name: value`: a blank before the colon, no colon, a
    /// character a header may not hold.
    HeaderLine,
    /// A `Content-Length` that is not one number (a sign, a list of two, two lines that
    /// differ).
    ContentLength,
    /// `Transfer-Encoding` in HTTP/1.0, or one whose last coding is not `chunked`.
    TransferEncoding,
    /// More than [`MAX_FIELDS`](super::h1::MAX_FIELDS) header lines (431).
    TooManyHeaders,
    /// A head larger than [`MAX_HEAD`](super::h1::MAX_HEAD) (431).
    TooLarge,
    /// Something else (400).
    Malformed,
}

impl Refusal {
    /// The status the client is answered with.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Refusal::Connect | Refusal::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            Refusal::Trace => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::FrontCheck => StatusCode::FORBIDDEN,
            Refusal::TargetTooLong => StatusCode::URI_TOO_LONG,
            Refusal::Version => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
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

    /// The refusal of a head the core refused with `error`; `head` is its bytes as they
    /// came, which tell a target's fault more precisely than the core's one word for it.
    pub(crate) fn of_head(error: HeadError, head: &[u8]) -> Refusal {
        match error {
            HeadError::Malformed(Syntax::Folded) => Refusal::Head(HeadFault::Folded),
            HeadError::Malformed(Syntax::HeaderName | Syntax::HeaderValue) => {
                Refusal::Head(HeadFault::HeaderLine)
            }
            HeadError::Malformed(Syntax::RequestLine | Syntax::Version) => {
                Refusal::Head(HeadFault::RequestLine)
            }
            HeadError::Malformed(Syntax::NewLine) if !request_line(head) => {
                Refusal::Head(HeadFault::RequestLine)
            }
            HeadError::Malformed(Syntax::NewLine) => Refusal::Head(HeadFault::HeaderLine),
            HeadError::Malformed(Syntax::StatusLine) => Refusal::Head(HeadFault::Malformed),
            HeadError::TargetTooLong => Refusal::TargetTooLong,
            HeadError::HeadTooLarge => Refusal::Head(HeadFault::TooLarge),
            HeadError::TooManyFields => Refusal::Head(HeadFault::TooManyHeaders),
            HeadError::VersionNotSupported => Refusal::Version,
            HeadError::BadLength | HeadError::ConflictingLengths => {
                Refusal::Head(HeadFault::ContentLength)
            }
            HeadError::TransferEncodingOn10 | HeadError::NotChunked => {
                Refusal::Head(HeadFault::TransferEncoding)
            }
            HeadError::UnsupportedCoding => Refusal::TransferCoding,
            HeadError::NoHost => Refusal::NoHost,
            HeadError::SeveralHosts => Refusal::ManyHosts,
            HeadError::BadHost => Refusal::BadHost,
            HeadError::BadTarget => target_fault(head),
            HeadError::BadStatus | HeadError::UnaskedSwitch => Refusal::Head(HeadFault::Malformed),
        }
    }
}

/// Whether the first line of `head` is three words, the last a version (`METHOD target
/// HTTP/1.1`): a line end where it has none is in a header line.
fn request_line(head: &[u8]) -> bool {
    let line = first_line(head);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let words: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    matches!(words[..], [method, target, version]
        if !method.is_empty() && !target.is_empty() && version.starts_with(b"HTTP/"))
}

/// The first line of `head` that is not empty (empty lines before a request are skipped).
fn first_line(head: &[u8]) -> &[u8] {
    head.split(|&b| b == b'\n')
        .find(|line| !line.is_empty() && *line != b"\r")
        .unwrap_or_default()
}

/// What is wrong with a target the core found no form for, from the request line: an
/// address with a user name, a bare `host:port`, or neither (another scheme than http(s), a
/// `*` for another method than OPTIONS).
fn target_fault(head: &[u8]) -> Refusal {
    let target = first_line(head)
        .split(|&b| b == b' ')
        .nth(1)
        .unwrap_or_default();
    if let Some(scheme_end) = target.windows(3).position(|w| w == b"://") {
        let authority = target[scheme_end + 3..]
            .split(|&b| b == b'/' || b == b'?')
            .next()
            .unwrap_or_default();
        if authority.contains(&b'@') {
            return Refusal::UserInfo;
        }
        // A scheme other than http(s).
        return Refusal::Head(HeadFault::RequestLine);
    }
    match target.first() {
        Some(b'/' | b'*') | None => Refusal::Head(HeadFault::RequestLine),
        Some(_) => Refusal::AuthorityForm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_targets_fault_is_told_from_the_request_line() {
        let cases: &[(&[u8], Refusal)] = &[
            (b"GET http://user@evil/x HTTP/1.1\r\n", Refusal::UserInfo),
            (b"GET h:443 HTTP/1.1\r\n", Refusal::AuthorityForm),
            (b"OPTIONS h:443 HTTP/1.1\r\n", Refusal::AuthorityForm),
            (
                b"GET ftp://app/ HTTP/1.1\r\n",
                Refusal::Head(HeadFault::RequestLine),
            ),
            (b"GET * HTTP/1.1\r\n", Refusal::Head(HeadFault::RequestLine)),
        ];
        for (line, refusal) in cases {
            assert_eq!(
                Refusal::of_head(HeadError::BadTarget, line),
                *refusal,
                "{}",
                line.escape_ascii()
            );
        }
        let newline = HeadError::Malformed(Syntax::NewLine);
        assert_eq!(
            Refusal::of_head(newline, b"GET / HTTP/1.1 extra\r\nHost: h\r\n\r\n"),
            Refusal::Head(HeadFault::RequestLine)
        );
        assert_eq!(
            Refusal::of_head(newline, b"GET / HTTP/1.1\r\nHost: h\rx\r\n\r\n"),
            Refusal::Head(HeadFault::HeaderLine)
        );
        assert_eq!(
            Refusal::of_head(HeadError::VersionNotSupported, b"").status(),
            StatusCode::HTTP_VERSION_NOT_SUPPORTED
        );
    }
}
