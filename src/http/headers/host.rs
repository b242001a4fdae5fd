//! A `Host` value, or an absolute-form target's authority, checked as RFC 9112 3.2 asks of a
//! server (400 for an invalid one, as nginx does): RFC 3986's `host [ ":" port ]`, read as
//! bytes, never decoded.

use std::net::Ipv6Addr;

/// Whether `value` is `host[:port]` as RFC 9110 7.2 has it, read as bytes: RFC 3986's
/// IP-literal (`[2001:db8::1]`, `[v1.x]`) or reg-name (letters, digits, `-._~`, the
/// sub-delimiters `!$&'()*+,;=`, `%` and two hex digits; an IPv4 address is one), never
/// empty (RFC 9110 4.2.1: an `http` URI has a host), then `:` and digits, if anything.
pub(super) fn valid_host(value: &[u8]) -> bool {
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
            let colon = value.iter().position(|&b| b == b':');
            let (host, port) = value.split_at(colon.unwrap_or(value.len()));
            if !reg_name(host) {
                return false;
            }
            port
        }
    };
    match port {
        [] => true,
        [b':', digits @ ..] => digits.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// RFC 3986's reg-name, but never empty.
fn reg_name(host: &[u8]) -> bool {
    let mut rest = host;
    while let Some((&b, tail)) = rest.split_first() {
        rest = match (b, tail) {
            (b'%', [h, l, tail @ ..]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => tail,
            (b'%', _) => return false,
            _ if unreserved(b) || sub_delim(b) => tail,
            _ => return false,
        };
    }
    !host.is_empty()
}

/// What is inside the brackets of an IP-literal: an IPv6 address, or `v` hex `.` and more.
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
                    .all(|&b| unreserved(b) || sub_delim(b) || b == b':')
        }
        _ => std::str::from_utf8(inside).is_ok_and(|text| text.parse::<Ipv6Addr>().is_ok()),
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_values_follow_rfc_3986_as_bytes() {
        let valid: &[&[u8]] = &[
            b"h",
            b"portal.example.com",
            b"portal.example.com.",
            b"app-01:8080",
            b"192.0.2.7:80",
            b"a,b",
            b"h_x",
            b"xn--brsil-zra.example",
            b"a%41b",
            b"!$&'()*+;=",
            b"h:",
            b"[::1]",
            b"[::1]:8080",
            b"[2001:db8::192.0.2.1]",
            b"[v1.fe80::a+en1]",
        ];
        for host in valid {
            assert!(valid_host(host), "{}", String::from_utf8_lossy(host));
        }
        let invalid: &[&[u8]] = &[
            b"",
            b":80",
            b"h x",
            b"h\tx",
            b"a/b?c",
            b"a, b",
            b"user@evil",
            b"a%4",
            b"a%zz",
            b"h:8o",
            b"h:80:81",
            b"a\"b",
            b"a<b",
            b"a\\b",
            b"S\xe3o",
            b"caf\xc3\xa9",
            b"[::1",
            b"[::1]x",
            b"[::g]",
            b"[fe80::1%25en0]",
            b"[v1]",
            b"[v.x]",
            b"[192.0.2.1]",
            b"h\x00",
        ];
        for host in invalid {
            assert!(!valid_host(host), "{}", String::from_utf8_lossy(host));
        }
    }
}
