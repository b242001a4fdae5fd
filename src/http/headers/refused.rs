//! What was wrong with a request head hyper refused before the engine saw it, told from the
//! bytes of that head as far as they came: the same checks as hyper's parser (httparse, then
//! its `Content-Length` and `Transfer-Encoding` rules), in its order, so the page the client
//! gets in place of hyper's empty answer (`head_errors`) says why.

use super::{MAX_HEAD, MAX_HEADERS, Refusal, list};

/// What was wrong with a head hyper refused, as far as its bytes tell.
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
    /// More than [`MAX_HEADERS`] header lines (431).
    TooManyHeaders,
    /// A head larger than [`MAX_HEAD`] (431).
    TooLarge,
    /// Something the bytes at hand do not show (400).
    Malformed,
}

/// What hyper's own answer with `status` (to a head it could not parse) was about, told from
/// `head`, the bytes of that head as far as they came: `None` for a status hyper does not
/// answer a head with. The bytes refine hyper's status, never change it: a fault they show
/// that hyper would have answered otherwise gives way to the status's general one.
pub(crate) fn hyper_refusal(status: u16, head: &[u8]) -> Option<Refusal> {
    let fault = head_fault(head);
    Some(match status {
        414 => Refusal::TargetTooLong,
        431 if fault == HeadFault::TooManyHeaders => Refusal::Head(fault),
        431 => Refusal::Head(HeadFault::TooLarge),
        400 if !matches!(fault, HeadFault::TooManyHeaders | HeadFault::TooLarge) => {
            Refusal::Head(fault)
        }
        400 => Refusal::Head(HeadFault::Malformed),
        _ => return None,
    })
}

/// What is wrong with the request head at the start of `bytes`, checked as hyper's parser
/// (httparse, then its `Content-Length` and `Transfer-Encoding` rules) would, in its order.
fn head_fault(bytes: &[u8]) -> HeadFault {
    if bytes.is_empty() {
        return HeadFault::Malformed;
    }
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    if end.map_or(bytes.len(), |end| end + 4) > MAX_HEAD {
        return HeadFault::TooLarge;
    }
    let head = &bytes[..end.unwrap_or(bytes.len())];
    let mut lines: Vec<&[u8]> = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .collect();
    if end.is_none() && lines.len() > 1 {
        // The head did not come whole: its last line may be cut short.
        lines.pop();
    }
    let Some(http10) = lines.first().and_then(|line| request_line(line)) else {
        return HeadFault::RequestLine;
    };
    let mut fields = Vec::new();
    for line in &lines[1..] {
        if fields.len() == MAX_HEADERS {
            return HeadFault::TooManyHeaders;
        }
        if matches!(line.first(), Some(b' ' | b'\t')) {
            return HeadFault::Folded;
        }
        let Some(field) = header_line(line) else {
            return HeadFault::HeaderLine;
        };
        fields.push(field);
    }
    let named = |name: &[u8]| -> Vec<&[u8]> {
        fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .collect()
    };
    let codings = named(b"transfer-encoding");
    if !codings.is_empty() {
        let last = codings.iter().rev().flat_map(|v| list(v).last()).next();
        if http10 || !last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")) {
            return HeadFault::TransferEncoding;
        }
    } else if !one_length(&named(b"content-length")) {
        return HeadFault::ContentLength;
    }
    HeadFault::Malformed
}

/// Whether `line` is `METHOD target HTTP/1.x`; `Some(true)` for HTTP/1.0.
fn request_line(line: &[u8]) -> Option<bool> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let target_ok = !target.is_empty() && target.iter().all(|&b| b > b' ' && b != 0x7f);
    if !token(method) || !target_ok {
        return None;
    }
    match version {
        b"HTTP/1.0" => Some(true),
        b"HTTP/1.1" => Some(false),
        _ => None,
    }
}

/// A header line's name and trimmed value, when it is `name: value` with a token for a name
/// and no control character but tab in the value.
fn header_line(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = line.iter().position(|&b| b == b':')?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let value_ok = value
        .iter()
        .all(|&b| b == b'\t' || (b >= b' ' && b != 0x7f));
    (token(name) && value_ok).then(|| (name, value.trim_ascii()))
}

/// RFC 9110's token: one or more of letters, digits and ``!#$%&'*+-.^_`|~``.
fn token(bytes: &[u8]) -> bool {
    !bytes.is_empty()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
}

/// Whether `Content-Length` lines (none, or each a list) say one length, in digits only, as
/// hyper requires.
fn one_length(values: &[&[u8]]) -> bool {
    let mut lengths = values
        .iter()
        .flat_map(|v| v.split(|&b| b == b',').map(<[u8]>::trim_ascii));
    let Some(first) = lengths.next() else {
        return true;
    };
    let number = |l: &[u8]| !l.is_empty() && l.len() <= 19 && l.iter().all(u8::is_ascii_digit);
    number(first) && lengths.all(|l| number(l) && l == first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head of `fields` (lines after the request line), ended.
    fn head(line: &str, fields: &str) -> String {
        format!("{line}\r\nHost: h\r\n{fields}\r\n")
    }

    #[test]
    fn hypers_own_answers_are_told_apart_by_the_heads_bytes() {
        use HeadFault::*;
        let f = Refusal::Head;
        let (get, post, old) = ("GET / HTTP/1.1", "POST / HTTP/1.1", "POST / HTTP/1.0");
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let cases: Vec<(u16, String, Refusal)> = vec![
            (400, head(get, "Content-Length: x\r\n"), f(ContentLength)),
            (
                400,
                head(post, "Content-Length: 5, 40\r\n"),
                f(ContentLength),
            ),
            (400, head(post, "Content-Length: +5\r\n"), f(ContentLength)),
            (
                400,
                head(post, "Content-Length: 5\r\ncontent-length: 6\r\n"),
                f(ContentLength),
            ),
            (400, head(get, "X-A: a\r\n b\r\n"), f(Folded)),
            (400, head(get, "X-A:\r\n\tb\r\n"), f(Folded)),
            (
                400,
                head(get, "Transfer-Encoding : chunked\r\n"),
                f(HeaderLine),
            ),
            (400, head(get, "No colon\r\n"), f(HeaderLine)),
            (400, head(get, "X-A: a\x01b\r\n"), f(HeaderLine)),
            (
                400,
                head(old, "Transfer-Encoding: chunked\r\n"),
                f(TransferEncoding),
            ),
            (
                400,
                head(post, "Transfer-Encoding: chunked, identity\r\n"),
                f(TransferEncoding),
            ),
            (400, head("GET / HTTP/1.1 x", ""), f(RequestLine)),
            (400, head("GET  / HTTP/1.1", ""), f(RequestLine)),
            (400, head("G@T / HTTP/1.1", ""), f(RequestLine)),
            (400, head("GET / HTTP/2.0", ""), f(RequestLine)),
            (400, "\u{16}\u{3}\u{1}\u{2}\0\u{1}".into(), f(RequestLine)),
            // Nothing the bytes show (a head read before, of which only the tail is at hand):
            // hyper's status says it.
            (400, head(get, ""), f(Malformed)),
            (400, String::new(), f(Malformed)),
            (400, head(get, &many), f(Malformed)),
            (431, head(get, &many), f(TooManyHeaders)),
            // Cut short: its last line may be too, and is left out.
            (431, head(get, &many)[..900].into(), f(TooLarge)),
            (
                431,
                format!("{get}\r\nCookie: {}", "c".repeat(MAX_HEAD)),
                f(TooLarge),
            ),
            (431, format!("{get}\r\nHost: h\r\n"), f(TooLarge)),
            (414, "GET /aaaa".into(), Refusal::TargetTooLong),
        ];
        for (status, bytes, expected) in cases {
            let shown = &bytes[..bytes.len().min(80)];
            assert_eq!(
                hyper_refusal(status, bytes.as_bytes()),
                Some(expected),
                "{status} {shown:?}"
            );
            assert_eq!(expected.status().as_u16(), status);
        }
        assert_eq!(hyper_refusal(500, head(get, "").as_bytes()), None);
    }
}
