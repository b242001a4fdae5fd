//! Why a head is refused: one enum whose words a page can show the client (every answer the
//! broker makes says what was wrong), and the status each earns.

use super::{MAX_FIELDS, MAX_HEAD, MAX_RESPONSE_FIELDS, MAX_TARGET};

/// Which part of a head httparse found malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// The method or the target holds a byte they may not (a space, a control byte).
    RequestLine,
    /// A response's status line is not `HTTP/1.x NNN reason`.
    StatusLine,
    /// A header name holds a byte it may not, or whitespace comes before its colon.
    HeaderName,
    /// A header line is folded onto the next (obs-fold), which a request may not do.
    Folded,
    /// A header value holds NUL, a bare CR or another control byte.
    HeaderValue,
    /// A line ends with something other than CRLF or LF.
    NewLine,
    /// The version is not `HTTP/` digit `.` digit.
    Version,
}

impl Syntax {
    /// The words for a page.
    fn words(self) -> &'static str {
        match self {
            Syntax::RequestLine => "the method or the target holds a byte they may not",
            Syntax::StatusLine => "the status line is malformed",
            Syntax::HeaderName => {
                "a header name holds a byte it may not, or a space before its colon"
            }
            Syntax::Folded => "a header line is folded onto the next (obsolete line folding)",
            Syntax::HeaderValue => "a header value holds NUL, CR or another control byte",
            Syntax::NewLine => "a line does not end with CRLF",
            Syntax::Version => "the HTTP version is malformed",
        }
    }
}

/// Why a head cannot go on. From a client, [`HeadError::status`] is the answer; from a
/// server, every one of them is a 502 (its words go to the log, not to the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// httparse refused a line.
    #[error("{}", .0.words())]
    Malformed(Syntax),
    /// The request target is longer than [`MAX_TARGET`].
    #[error("the request target is longer than {} KiB", MAX_TARGET / 1024)]
    TargetTooLong,
    /// The head is longer than [`MAX_HEAD`].
    #[error("the head is longer than {} KiB", MAX_HEAD / 1024)]
    HeadTooLarge,
    /// More header lines than a head may have: [`MAX_FIELDS`] in a request,
    /// [`MAX_RESPONSE_FIELDS`] in an answer.
    #[error(
        "the head has too many header lines (at most {MAX_FIELDS} in a request, \
         {MAX_RESPONSE_FIELDS} in an answer)"
    )]
    TooManyFields,
    /// An HTTP version other than 1.x.
    #[error("only HTTP/1.0 and HTTP/1.1 are spoken here")]
    VersionNotSupported,
    /// A `Content-Length` that is not digits only.
    #[error("Content-Length is not a number")]
    BadLength,
    /// Several `Content-Length` values that differ.
    #[error("Content-Length is given twice with different values")]
    ConflictingLengths,
    /// `Transfer-Encoding` in an HTTP/1.0 message (RFC 9112 §6.1: faulty framing).
    #[error("Transfer-Encoding is not allowed in HTTP/1.0")]
    TransferEncodingOn10,
    /// A `Transfer-Encoding` that does not end with one `chunked`.
    #[error("Transfer-Encoding must end with chunked, given once")]
    NotChunked,
    /// A transfer coding other than `chunked` before it (501: not passed on).
    #[error("only the chunked transfer coding is passed on")]
    UnsupportedCoding,
    /// HTTP/1.1 with no `Host`.
    #[error("a Host header is required")]
    NoHost,
    /// More than one `Host`.
    #[error("only one Host header is allowed")]
    SeveralHosts,
    /// A `Host` (or an absolute target's authority) that is no host name or address with an
    /// optional port.
    #[error("the Host header is not a host name with an optional port")]
    BadHost,
    /// A target that is no path, no `http(s)://` address without user info, `*` on another
    /// method than OPTIONS, or an authority on another method than CONNECT.
    #[error("the request target is not a path or an http address")]
    BadTarget,
    /// A response status below 100.
    #[error("the status code is below 100")]
    BadStatus,
    /// 101 Switching Protocols to a request that asked for no upgrade.
    #[error("101 Switching Protocols to a request that asked for no upgrade")]
    UnaskedSwitch,
}

impl HeadError {
    /// The status a client is answered with for a head of its own with this fault.
    pub fn status(self) -> u16 {
        match self {
            HeadError::TargetTooLong => 414,
            HeadError::HeadTooLarge | HeadError::TooManyFields => 431,
            HeadError::VersionNotSupported => 505,
            HeadError::UnsupportedCoding => 501,
            _ => 400,
        }
    }

    /// The refusal for an error httparse reported on `head` (a request's or a response's).
    pub(crate) fn of_httparse(error: httparse::Error, head: &[u8]) -> HeadError {
        let syntax = match error {
            httparse::Error::TooManyHeaders => return HeadError::TooManyFields,
            httparse::Error::HeaderName if folded(head) => Syntax::Folded,
            httparse::Error::HeaderName => Syntax::HeaderName,
            httparse::Error::HeaderValue => Syntax::HeaderValue,
            httparse::Error::NewLine => Syntax::NewLine,
            httparse::Error::Status => Syntax::StatusLine,
            httparse::Error::Token => Syntax::RequestLine,
            httparse::Error::Version => Syntax::Version,
        };
        HeadError::Malformed(syntax)
    }
}

/// Whether a line of `head` begins with a space or a tab: obs-fold, which httparse reports
/// as a bad header name (looked for only once a head is refused).
fn folded(head: &[u8]) -> bool {
    head.windows(2)
        .any(|w| w[0] == b'\n' && (w[1] == b' ' || w[1] == b'\t'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_status_and_words() {
        let cases = [
            (HeadError::Malformed(Syntax::Folded), 400, "folded"),
            (HeadError::TargetTooLong, 414, "16 KiB"),
            (HeadError::HeadTooLarge, 431, "64 KiB"),
            (HeadError::TooManyFields, 431, "at most 100 in a request"),
            (HeadError::VersionNotSupported, 505, "HTTP/1.1"),
            (HeadError::UnsupportedCoding, 501, "chunked"),
            (HeadError::NoHost, 400, "Host header is required"),
        ];
        for (error, status, words) in cases {
            assert_eq!(error.status(), status, "{error:?}");
            assert!(error.to_string().contains(words), "{error}");
        }
    }

    #[test]
    fn a_bad_name_after_a_line_break_and_a_space_is_a_fold() {
        let fold = b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n";
        let space = b"GET / HTTP/1.1\r\nA : b\r\n\r\n";
        assert_eq!(
            HeadError::of_httparse(httparse::Error::HeaderName, fold),
            HeadError::Malformed(Syntax::Folded)
        );
        assert_eq!(
            HeadError::of_httparse(httparse::Error::HeaderName, space),
            HeadError::Malformed(Syntax::HeaderName)
        );
    }
}
