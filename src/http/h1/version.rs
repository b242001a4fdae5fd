//! The HTTP version where httparse cannot judge it: it knows `HTTP/1.0` and `HTTP/1.1` only,
//! and refuses the rest alike. RFC 9110 §2.5 says a higher minor of a major one implements
//! is read as the highest minor it knows, and §15.6.6 that another major is a 505. So on
//! httparse's version error only (the common path pays nothing), the version is looked at
//! here: `HTTP/1.2` to `HTTP/1.9` have their digit rewritten to `1` in the buffer, and the
//! head is parsed again (it is then forwarded as `HTTP/1.1`, which the broker speaks);
//! `HTTP/2.0` and other majors are [`HeadError::VersionNotSupported`].

use super::{HeadError, Syntax};

/// What became of a version httparse refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fix {
    /// It was a higher 1.x minor, now `1.1` in the buffer: parse again.
    Fixed,
    /// The line is not whole yet: wait for more.
    NotYet,
}

/// A head by `parse` (one run of httparse) over `buf`; when httparse refuses the version
/// only, the version judged by `fix`, mended, and the head parsed again.
pub(crate) fn parse_mending<T>(
    buf: &mut [u8],
    parse: fn(&[u8]) -> Result<Option<T>, httparse::Error>,
    fix: fn(&mut [u8]) -> Result<Fix, HeadError>,
) -> Result<Option<T>, HeadError> {
    match parse(buf) {
        Err(httparse::Error::Version) => match fix(buf)? {
            Fix::NotYet => Ok(None),
            Fix::Fixed => parse(buf).map_err(|e| HeadError::of_httparse(e, buf)),
        },
        result => result.map_err(|e| HeadError::of_httparse(e, buf)),
    }
}

/// A request's version, the last word of its first line.
pub(crate) fn fix_request(buf: &mut [u8]) -> Result<Fix, HeadError> {
    let start = skip_empty_lines(buf);
    let Some(lf) = buf
        .get(start..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
    else {
        return Ok(Fix::NotYet);
    };
    let end = start + lf - usize::from(lf > 0 && buf[start + lf - 1] == b'\r');
    if end < start + 9 || buf[end - 9] != b' ' {
        return Err(HeadError::Malformed(Syntax::Version));
    }
    fix(&mut buf[end - 8..end])
}

/// A response's version, the first word of its first line.
pub(crate) fn fix_response(buf: &mut [u8]) -> Result<Fix, HeadError> {
    let start = skip_empty_lines(buf);
    match buf.get(start + 8) {
        None => Ok(Fix::NotYet),
        Some(b' ') => fix(&mut buf[start..start + 8]),
        Some(_) => Err(HeadError::Malformed(Syntax::Version)),
    }
}

/// The bytes before the start line: the empty lines httparse skips.
fn skip_empty_lines(buf: &[u8]) -> usize {
    buf.iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len())
}

/// `version` (eight bytes) as RFC 9110 reads it: `HTTP/1.x`, x from 2 to 9, becomes
/// `HTTP/1.1`; another major is not supported; anything else is malformed.
fn fix(version: &mut [u8]) -> Result<Fix, HeadError> {
    let &mut [b'H', b'T', b'T', b'P', b'/', major, b'.', ref mut minor] = version else {
        return Err(HeadError::Malformed(Syntax::Version));
    };
    if !major.is_ascii_digit() || !minor.is_ascii_digit() {
        return Err(HeadError::Malformed(Syntax::Version));
    }
    if major != b'1' {
        return Err(HeadError::VersionNotSupported);
    }
    if *minor < b'2' {
        // 1.0 and 1.1 were refused for another reason than the version.
        return Err(HeadError::Malformed(Syntax::Version));
    }
    *minor = b'1';
    Ok(Fix::Fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first line, what becomes of it, the buffer after.
    type Case = (&'static [u8], Result<Fix, HeadError>, &'static [u8]);

    #[test]
    fn a_request_version_is_fixed_refused_or_waited_for() {
        let cases: &[Case] = &[
            (b"GET / HTTP/1.2\r\n", Ok(Fix::Fixed), b"GET / HTTP/1.1\r\n"),
            (
                b"\r\nGET / HTTP/1.9\n",
                Ok(Fix::Fixed),
                b"\r\nGET / HTTP/1.1\n",
            ),
            (
                b"GET / HTTP/2.0\r\n",
                Err(HeadError::VersionNotSupported),
                b"",
            ),
            (
                b"PRI * HTTP/2.0\r\n",
                Err(HeadError::VersionNotSupported),
                b"",
            ),
            (
                b"GET / HTTP/0.9\r\n",
                Err(HeadError::VersionNotSupported),
                b"",
            ),
            (
                b"GET / HTTP/1.10\r\n",
                Err(HeadError::Malformed(Syntax::Version)),
                b"",
            ),
            (
                b"GET / http/1.1\r\n",
                Err(HeadError::Malformed(Syntax::Version)),
                b"",
            ),
            (
                b"GET / HTTP/1.1\r\n",
                Err(HeadError::Malformed(Syntax::Version)),
                b"",
            ),
            (
                b"GET /HTTP/1.2\r\n",
                Err(HeadError::Malformed(Syntax::Version)),
                b"",
            ),
            (
                b"HTTP/1.2\r\n",
                Err(HeadError::Malformed(Syntax::Version)),
                b"",
            ),
            (b"GET / HTTP/1.2", Ok(Fix::NotYet), b"GET / HTTP/1.2"),
        ];
        for (line, result, after) in cases {
            let mut buf = line.to_vec();
            assert_eq!(fix_request(&mut buf), *result, "{}", line.escape_ascii());
            if result.is_ok() {
                assert_eq!(buf, *after);
            }
        }
    }

    #[test]
    fn a_response_version_is_its_first_word() {
        let cases: &[(&[u8], Result<Fix, HeadError>)] = &[
            (b"HTTP/1.2 200 OK\r\n", Ok(Fix::Fixed)),
            (b"HTTP/2.0 200 OK\r\n", Err(HeadError::VersionNotSupported)),
            (b"HTTP/1.2", Ok(Fix::NotYet)),
            (b"HTTP/1.2x200", Err(HeadError::Malformed(Syntax::Version))),
            (
                b"ICY 200 OK\r\n",
                Err(HeadError::Malformed(Syntax::Version)),
            ),
        ];
        for (line, result) in cases {
            let mut buf = line.to_vec();
            assert_eq!(fix_response(&mut buf), *result, "{}", line.escape_ascii());
        }
    }
}
