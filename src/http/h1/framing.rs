//! `Content-Length` and `Transfer-Encoding` read as RFC 9112 §6 says, the smuggling pitfalls
//! the anchors list closed: a length is digits only (Rust's `u64::from_str` takes a `+`),
//! repeated with one value it is folded and with two refused; the codings are a token list
//! across every line, matched whole and case-insensitively, never by suffix.

use super::field::FieldName;
use super::{FieldId, Fields, HeadError};

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body (a request without framing; HEAD, 204 and 304 responses).
    Empty,
    /// So many bytes.
    Length(u64),
    /// Chunks, to the last one.
    Chunked,
    /// Until the server closes (a response without framing): its connection is not reused.
    UntilClose,
}

/// The `Content-Length` of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Length {
    pub(crate) value: u64,
    /// The line forwarded; the others, repeating it, are not.
    pub(crate) first: FieldId,
    /// The first line is not the bare number (a list `3, 3`): it is written anew.
    pub(crate) rewrite: bool,
}

/// The length the `Content-Length` lines of `fields` give, if any. `lists`: a line may be a
/// list of one value repeated (`3, 3`), as a server's may (RFC 9110 §8.6; hyper's client
/// takes it); a request's must be one number, as hyper's server requires.
pub(crate) fn content_length(
    fields: &Fields,
    buf: &[u8],
    lists: bool,
) -> Result<Option<Length>, HeadError> {
    let mut length: Option<Length> = None;
    for id in fields.named(FieldName::ContentLength) {
        let value = fields.get(buf, id).map_or(&b""[..], |f| f.value);
        let (n, listed) = line_length(value, lists)?;
        match length {
            None => {
                length = Some(Length {
                    value: n,
                    first: id,
                    rewrite: listed,
                })
            }
            Some(known) if known.value != n => return Err(HeadError::ConflictingLengths),
            Some(_) => {}
        }
    }
    Ok(length)
}

/// One `Content-Length` line's value, and whether it was a list.
fn line_length(value: &[u8], lists: bool) -> Result<(u64, bool), HeadError> {
    if !lists {
        return digits(value)
            .map(|n| (n, false))
            .ok_or(HeadError::BadLength);
    }
    // The usual value, a bare number, is no list: no walk of its elements.
    if let Some(n) = digits(value) {
        return Ok((n, false));
    }
    let mut found: Option<u64> = None;
    for element in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        let n = digits(element).ok_or(HeadError::BadLength)?;
        if found.is_some_and(|f| f != n) {
            return Err(HeadError::ConflictingLengths);
        }
        found = Some(n);
    }
    let n = found.ok_or(HeadError::BadLength)?;
    Ok((n, value.contains(&b',')))
}

/// A number of one or more ASCII digits, nothing else, that fits a u64.
pub(crate) fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// What the `Transfer-Encoding` lines of a head say, every line's list read as one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Codings {
    /// There is a `Transfer-Encoding` line.
    pub(crate) present: bool,
    /// The last coding is `chunked`.
    pub(crate) chunked_last: bool,
    /// How many codings in all.
    pub(crate) count: usize,
    /// How many of them are `chunked`.
    pub(crate) chunked: usize,
}

impl Codings {
    /// The codings of `fields`.
    pub(crate) fn of(fields: &Fields, buf: &[u8]) -> Codings {
        let mut codings = Codings::default();
        for id in fields.named(FieldName::TransferEncoding) {
            codings.present = true;
            let value = fields.get(buf, id).map_or(&b""[..], |f| f.value);
            for coding in super::field::list(value) {
                let chunked = coding.eq_ignore_ascii_case(b"chunked");
                codings.count += 1;
                codings.chunked += usize::from(chunked);
                codings.chunked_last = chunked;
            }
        }
        codings
    }

    /// Whether the codings are `chunked` only (once or, from a lax server, more): the
    /// broker's own `Transfer-Encoding: chunked` replaces the lines.
    pub(crate) fn only_chunked(self) -> bool {
        self.count > 0 && self.count == self.chunked
    }

    /// A request's body as its codings frame it, or `None` when it has none (RFC 9112 §6.3,
    /// points 3 and 4): a list that does not end with `chunked` is a 400, a coding before it
    /// (`gzip, chunked`, or `chunked` said twice) a 501, as the hyper-based engine answered.
    pub(crate) fn request(self) -> Result<Option<Body>, HeadError> {
        if !self.present {
            return Ok(None);
        }
        if !self.chunked_last {
            return Err(HeadError::NotChunked);
        }
        if self.count > 1 {
            return Err(HeadError::UnsupportedCoding);
        }
        Ok(Some(Body::Chunked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields `lines` are, and their buffer.
    fn fields(lines: &str) -> (Fields, Vec<u8>) {
        let buf = format!("{lines}\r\n").into_bytes();
        let mut slots = [httparse::EMPTY_HEADER; 8];
        let parsed = httparse::parse_headers(&buf, &mut slots)
            .unwrap()
            .unwrap()
            .1;
        (Fields::of_httparse(&buf, parsed, false), buf.clone())
    }

    #[test]
    fn digits_only() {
        let cases: &[(&[u8], Option<u64>)] = &[
            (b"0", Some(0)),
            (b"0042", Some(42)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"18446744073709551616", None),
            (b"+3", None),
            (b"-3", None),
            (b"3.0", None),
            (b"0x10", None),
            (b"3 4", None),
            (b"", None),
            (b"\xd9\xa3", None),
        ];
        for (value, n) in cases {
            assert_eq!(digits(value), *n, "{}", value.escape_ascii());
        }
    }

    /// Lines, whether lists are taken, the length and whether it is written anew.
    type Case = (&'static str, bool, Result<Option<(u64, bool)>, HeadError>);

    #[test]
    fn lengths_fold_when_equal_and_lists_only_from_servers() {
        let one = Some((3, false));
        let cases: &[Case] = &[
            ("", false, Ok(None)),
            ("Content-Length: 3\r\n", false, Ok(one)),
            ("Content-Length: 3\r\ncontent-length: 3\r\n", false, Ok(one)),
            (
                "Content-Length: 3\r\nContent-Length: 4\r\n",
                false,
                Err(HeadError::ConflictingLengths),
            ),
            ("Content-Length: 3, 3\r\n", false, Err(HeadError::BadLength)),
            ("Content-Length: 3, 3\r\n", true, Ok(Some((3, true)))),
            (
                "Content-Length: 3, 4\r\n",
                true,
                Err(HeadError::ConflictingLengths),
            ),
            ("Content-Length: 3,\r\n", true, Err(HeadError::BadLength)),
            ("Content-Length: +3\r\n", false, Err(HeadError::BadLength)),
        ];
        for (lines, lists, expected) in cases {
            let (fields, buf) = fields(lines);
            let found =
                content_length(&fields, &buf, *lists).map(|l| l.map(|l| (l.value, l.rewrite)));
            assert_eq!(found, *expected, "{lines:?}");
        }
    }

    #[test]
    fn a_request_is_chunked_by_one_final_chunked_only_said_once() {
        let cases: &[(&str, Result<Option<Body>, HeadError>)] = &[
            ("", Ok(None)),
            ("Transfer-Encoding: chunked\r\n", Ok(Some(Body::Chunked))),
            ("Transfer-Encoding: Chunked \r\n", Ok(Some(Body::Chunked))),
            ("Transfer-Encoding: chunked,\r\n", Ok(Some(Body::Chunked))),
            (
                "Transfer-Encoding: gzip, chunked\r\n",
                Err(HeadError::UnsupportedCoding),
            ),
            (
                "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                Err(HeadError::UnsupportedCoding),
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
                Err(HeadError::NotChunked),
            ),
            (
                "Transfer-Encoding: chunked, chunked\r\n",
                Err(HeadError::UnsupportedCoding),
            ),
            (
                "Transfer-Encoding: xchunked\r\n",
                Err(HeadError::NotChunked),
            ),
            (
                "Transfer-Encoding: chunked;q=1\r\n",
                Err(HeadError::NotChunked),
            ),
            ("Transfer-Encoding: \r\n", Err(HeadError::NotChunked)),
            (
                "Transfer-Encoding: identity\r\n",
                Err(HeadError::NotChunked),
            ),
        ];
        for (lines, expected) in cases {
            let (fields, buf) = fields(lines);
            assert_eq!(Codings::of(&fields, &buf).request(), *expected, "{lines:?}");
        }
    }
}
