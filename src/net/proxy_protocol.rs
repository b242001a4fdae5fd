//! The PROXY protocol (HAProxy's, versions 1 and 2), as pure functions over bytes: a header
//! read from the first bytes of a connection ([`parse`]), and one written for a server
//! ([`write()`], and [`preface`], what a connection to a server begins with). A front
//! balancer (HAProxy's `send-proxy`, an AWS NLB, an F5, nginx's
//! `proxy_protocol on`) puts the header before the client's bytes so the broker behind it
//! learns who the client is; the broker does the same towards servers that read it.
//!
//! The specification: <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>.
//! Version 1 is a line of text, `PROXY TCP4 <src> <dst> <srcport> <dstport>\r\n`, at most 107
//! bytes; version 2 is binary: a 12-byte signature, a version and command byte (`LOCAL` for
//! the front balancer's own connections, `PROXY` for a client's), a family byte, a length, the
//! addresses, then TLVs (extensions: skipped here, within [`V2_MAX_LENGTH`]).
//!
//! Nothing here reads a socket: the listener layer (`net::handshake`) peeks the connection's
//! bytes, asks [`parse`] whether they hold a whole header yet, and reads exactly the header's
//! length, so the client's own bytes stay in the socket for whatever serves it (TLS included).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::ProxyVersion;

/// The longest version 1 header, its `\r\n` included (the specification's bound: a TCP6 line
/// with the longest addresses and ports).
pub const V1_MAX: usize = 107;

/// The signature that begins every version 2 header: chosen by the specification to be no
/// valid start of any common protocol (it holds a NUL and `QUIT\n`).
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The fixed part of a version 2 header: the signature, version and command, family, length.
pub const V2_FIXED: usize = 16;

/// The longest version 2 address block and TLVs accepted after the fixed part. The format
/// allows 65,535; real senders write a few dozen (AWS's VPC endpoint id, Azure's link id,
/// HAProxy's TLS details are a few hundred at most), and a UNIX address block alone takes 216.
/// Bounded so a header is read into a small buffer and a sender cannot make the broker hold
/// 64 KiB per connection before it knows anything.
pub const V2_MAX_LENGTH: usize = 1024;

/// The most bytes a header can take: what a reader must be ready to hold.
pub const MAX_HEADER: usize = V2_FIXED + V2_MAX_LENGTH;

/// What a header says about the connection it begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A client's connection, relayed by the sender: who the client is (`source`) and where it
    /// connected (`destination`, the sender's own address as the client saw it).
    Proxied {
        /// The client's address and port.
        source: SocketAddr,
        /// The address and port the client connected to.
        destination: SocketAddr,
    },
    /// A relayed connection whose addresses the sender does not tell (version 1 `UNKNOWN`;
    /// version 2 `PROXY` over a UNIX socket or an unspecified family): the specification says
    /// to use the connection's own endpoints.
    Unknown,
    /// Version 2 `LOCAL`: the sender's own connection, no client's (a health check).
    Local,
}

impl Header {
    /// The header a connection to a server carries for a client: the client (`source`) and
    /// where it connected (`destination`) when both are known; else `Unknown` (`PROXY
    /// UNKNOWN`, or version 2's family UNSPEC): a client the broker cannot name is named to no
    /// server.
    pub fn for_client(source: Option<SocketAddr>, destination: Option<SocketAddr>) -> Header {
        match (source, destination) {
            (Some(source), Some(destination)) => Header::Proxied {
                source,
                destination,
            },
            _ => Header::Unknown,
        }
    }
}

/// What a new connection to a server begins with under `SEND_PROXY_PROTOCOL` (`send`): the
/// header `header` makes, in that version; nothing without (and `header` is not asked, so a
/// connection that sends none looks up no address). The one builder of the TCP clients', the
/// HTTP requests' and the monitor's checks' headers.
pub fn preface(send: Option<ProxyVersion>, header: impl FnOnce() -> Header) -> Vec<u8> {
    send.map(|version| write(version, &header()))
        .unwrap_or_default()
}

/// What the bytes so far amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyParsed {
    /// A whole header, `length` bytes long; the client's own bytes follow it.
    Complete {
        /// What it says.
        header: Header,
        /// How many bytes it takes.
        length: usize,
    },
    /// The start of a header: more bytes are needed.
    Partial,
}

/// Why the first bytes of a connection are no valid header, in words an operator reads in
/// the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The connection begins with other bytes: a client that connected directly, or a front
    /// balancer that sends no header.
    #[error("it began with other bytes than a PROXY protocol header (`{0}`)")]
    Missing(String),
    /// A version 1 line that does not end within [`V1_MAX`] bytes.
    #[error("its PROXY protocol v1 line is longer than {V1_MAX} bytes")]
    V1TooLong,
    /// A version 1 line that is not what the specification writes.
    #[error("its PROXY protocol v1 line is malformed: {0}")]
    V1Malformed(&'static str),
    /// A version 2 header of another version than 2.
    #[error("its PROXY protocol v2 header says version {0}, not 2")]
    V2Version(u8),
    /// A version 2 command neither `LOCAL` nor `PROXY`.
    #[error("its PROXY protocol v2 header has command {0}, neither LOCAL (0) nor PROXY (1)")]
    V2Command(u8),
    /// A version 2 length past [`V2_MAX_LENGTH`].
    #[error(
        "its PROXY protocol v2 header announces {0} bytes of addresses and extensions, more \
         than the {V2_MAX_LENGTH} accepted"
    )]
    V2TooLong(usize),
    /// A version 2 length too short for the addresses of the family it names.
    #[error(
        "its PROXY protocol v2 header announces {length} bytes, fewer than the {need} its \
         address family takes"
    )]
    V2Short {
        /// The length the header announces.
        length: usize,
        /// The bytes its family's addresses take.
        need: usize,
    },
}

impl HeaderError {
    /// A short name of the cause, for METRICS' labels.
    pub fn label(&self) -> &'static str {
        match self {
            HeaderError::Missing(_) => "missing",
            HeaderError::V1TooLong | HeaderError::V2TooLong(_) => "too_long",
            HeaderError::V1Malformed(_)
            | HeaderError::V2Version(_)
            | HeaderError::V2Command(_)
            | HeaderError::V2Short { .. } => "malformed",
        }
    }
}

/// Reads a header from the first bytes of a connection: [`ProxyParsed::Partial`] while they are
/// still the start of one, [`ProxyParsed::Complete`] with its length once it is whole, an error as
/// soon as they cannot be one. Never reads past a header's end, nor more than [`MAX_HEADER`]
/// bytes; any input, however long or short, gets an answer.
pub fn parse(bytes: &[u8]) -> Result<ProxyParsed, HeaderError> {
    const V1_START: &[u8] = b"PROXY ";
    if is_prefix(bytes, V1_START) {
        return if bytes.len() < V1_START.len() {
            Ok(ProxyParsed::Partial)
        } else {
            parse_v1(bytes)
        };
    }
    if is_prefix(bytes, &V2_SIGNATURE) {
        return if bytes.len() < V2_FIXED {
            Ok(ProxyParsed::Partial)
        } else {
            parse_v2(bytes)
        };
    }
    Err(HeaderError::Missing(shown(bytes)))
}

/// True when a connection's first bytes begin a header (a version 1 `PROXY ` or the version
/// 2 signature, whole): for a source that may not send one, whose header is refused.
pub fn begins_header(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PROXY ") || bytes.starts_with(&V2_SIGNATURE)
}

/// True when `bytes` and `start` agree as far as both go.
fn is_prefix(bytes: &[u8], start: &[u8]) -> bool {
    let n = bytes.len().min(start.len());
    bytes[..n] == start[..n]
}

/// The first bytes of a connection as a log line shows them: at most 16, escaped.
fn shown(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(16)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect()
}

/// A version 1 header, `bytes` starting with `PROXY `.
fn parse_v1(bytes: &[u8]) -> Result<ProxyParsed, HeaderError> {
    let window = &bytes[..bytes.len().min(V1_MAX)];
    let Some(end) = window.iter().position(|&b| b == b'\n') else {
        return if bytes.len() >= V1_MAX {
            Err(HeaderError::V1TooLong)
        } else {
            Ok(ProxyParsed::Partial)
        };
    };
    if end == 0 || window[end - 1] != b'\r' {
        return Err(HeaderError::V1Malformed(
            "its line does not end with \\r\\n",
        ));
    }
    let line = &window[6..end - 1];
    // UNKNOWN's rest, up to the line's end, is to be ignored, whatever it holds.
    let header = if line == b"UNKNOWN" || line.starts_with(b"UNKNOWN ") {
        Header::Unknown
    } else {
        let text = std::str::from_utf8(line)
            .map_err(|_| HeaderError::V1Malformed("it holds bytes that are not text"))?;
        v1_fields(text)?
    };
    Ok(ProxyParsed::Complete {
        header,
        length: end + 1,
    })
}

/// The fields of a version 1 line after `PROXY ` (but `UNKNOWN`): the protocol, two addresses
/// of its family and two ports, one space apart.
fn v1_fields(line: &str) -> Result<Header, HeaderError> {
    let mut fields = line.split(' ');
    let protocol = fields.next().unwrap_or_default();
    let v6 = match protocol {
        "TCP4" => false,
        "TCP6" => true,
        _ => {
            return Err(HeaderError::V1Malformed(
                "its protocol is not TCP4, TCP6 or UNKNOWN",
            ));
        }
    };
    let mut next = || {
        fields.next().ok_or(HeaderError::V1Malformed(
            "it has fewer than four addresses and ports",
        ))
    };
    let (source, destination) = (address(next()?, v6)?, address(next()?, v6)?);
    let (source_port, destination_port) = (port(next()?)?, port(next()?)?);
    if fields.next().is_some() {
        return Err(HeaderError::V1Malformed(
            "it has more than four addresses and ports",
        ));
    }
    Ok(Header::Proxied {
        source: SocketAddr::new(source, source_port),
        destination: SocketAddr::new(destination, destination_port),
    })
}

/// An address of a version 1 line, of the family its protocol names.
fn address(text: &str, v6: bool) -> Result<IpAddr, HeaderError> {
    let parsed = if v6 {
        text.parse::<Ipv6Addr>().map(IpAddr::V6).ok()
    } else {
        text.parse::<Ipv4Addr>().map(IpAddr::V4).ok()
    };
    parsed.ok_or(HeaderError::V1Malformed(
        "an address is not one of the family its protocol names",
    ))
}

/// A port of a version 1 line: 0 to 65535 in decimal digits.
fn port(text: &str) -> Result<u16, HeaderError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HeaderError::V1Malformed(
            "a port is not a number from 0 to 65535",
        ));
    }
    text.parse()
        .map_err(|_| HeaderError::V1Malformed("a port is not a number from 0 to 65535"))
}

/// A version 2 header, `bytes` holding at least its fixed part.
fn parse_v2(bytes: &[u8]) -> Result<ProxyParsed, HeaderError> {
    let (version, command) = (bytes[12] >> 4, bytes[12] & 0x0f);
    if version != 2 {
        return Err(HeaderError::V2Version(version));
    }
    if command > 1 {
        return Err(HeaderError::V2Command(command));
    }
    let family = bytes[13];
    let length = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    if length > V2_MAX_LENGTH {
        return Err(HeaderError::V2TooLong(length));
    }
    // TCP over IPv4, TCP over IPv6: the addresses this broker can use. The specification lets
    // a receiver take any other family (UDP, UNIX sockets, unspecified) with the connection's
    // own endpoints, as HAProxy does.
    let need = match family {
        0x11 => 12,
        0x21 => 36,
        _ => 0,
    };
    if command == 1 && length < need {
        return Err(HeaderError::V2Short { length, need });
    }
    let total = V2_FIXED + length;
    let Some(block) = bytes.get(V2_FIXED..total) else {
        return Ok(ProxyParsed::Partial);
    };
    let header = match (command, family) {
        (0, _) => Header::Local,
        (_, 0x11) => {
            let ip =
                |at: usize| IpAddr::from([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            Header::Proxied {
                source: SocketAddr::new(ip(0), be16(block, 8)),
                destination: SocketAddr::new(ip(4), be16(block, 10)),
            }
        }
        (_, 0x21) => {
            let ip = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&block[at..at + 16]);
                IpAddr::from(octets)
            };
            Header::Proxied {
                source: SocketAddr::new(ip(0), be16(block, 32)),
                destination: SocketAddr::new(ip(16), be16(block, 34)),
            }
        }
        _ => Header::Unknown,
    };
    Ok(ProxyParsed::Complete {
        header,
        length: total,
    })
}

/// The big-endian 16-bit number at `at` of `block` (which the caller knows holds it).
fn be16(block: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([block[at], block[at + 1]])
}

/// The header that tells a server about a connection, in `version`. Addresses of two
/// families (a client over IPv4 on an IPv6 listener) are written as IPv6, IPv4 ones mapped,
/// as HAProxy does; an IPv4-mapped pair is written as IPv4. Version 1 has no `LOCAL`: a
/// check's header is `PROXY UNKNOWN\r\n` there, as the specification says.
pub fn write(version: ProxyVersion, header: &Header) -> Vec<u8> {
    match version {
        ProxyVersion::V1 => write_v1(header).into_bytes(),
        ProxyVersion::V2 => write_v2(header),
    }
}

/// `source` and `destination` in one family: both IPv4 when both can be, else both IPv6.
fn one_family(source: SocketAddr, destination: SocketAddr) -> (SocketAddr, SocketAddr) {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (source, destination) = (canonical(source), canonical(destination));
    if source.is_ipv4() == destination.is_ipv4() {
        return (source, destination);
    }
    let v6 = |a: SocketAddr| match a.ip() {
        IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    };
    (v6(source), v6(destination))
}

/// A version 1 header.
fn write_v1(header: &Header) -> String {
    match *header {
        Header::Proxied {
            source,
            destination,
        } => {
            let (source, destination) = one_family(source, destination);
            let protocol = if source.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {protocol} {} {} {} {}\r\n",
                source.ip(),
                destination.ip(),
                source.port(),
                destination.port()
            )
        }
        Header::Unknown | Header::Local => "PROXY UNKNOWN\r\n".to_string(),
    }
}

/// A version 2 header, without TLVs.
fn write_v2(header: &Header) -> Vec<u8> {
    let mut out = Vec::with_capacity(V2_FIXED + 36);
    out.extend_from_slice(&V2_SIGNATURE);
    let Header::Proxied {
        source,
        destination,
    } = *header
    else {
        // LOCAL (a check), or PROXY of an unspecified family; no addresses.
        let command = if *header == Header::Local { 0x20 } else { 0x21 };
        out.extend_from_slice(&[command, 0x00, 0, 0]);
        return out;
    };
    let (source, destination) = one_family(source, destination);
    let (family, length) = if source.is_ipv4() {
        (0x11, 12u16)
    } else {
        (0x21, 36)
    };
    out.extend_from_slice(&[0x21, family]);
    out.extend_from_slice(&length.to_be_bytes());
    for address in [source, destination] {
        match address.ip() {
            IpAddr::V4(ip) => out.extend_from_slice(&ip.octets()),
            IpAddr::V6(ip) => out.extend_from_slice(&ip.octets()),
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("an address")
    }

    fn proxied(source: &str, destination: &str) -> Header {
        Header::Proxied {
            source: addr(source),
            destination: addr(destination),
        }
    }

    /// A version 2 header: version and command byte, family byte, then `block` as its
    /// addresses and TLVs (its length written as `block`'s).
    fn v2(command: u8, family: u8, block: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.extend_from_slice(&[command, family]);
        out.extend_from_slice(&(block.len() as u16).to_be_bytes());
        out.extend_from_slice(block);
        out
    }

    #[test]
    fn version_1_lines_give_their_addresses_and_length() {
        let cases: &[(&[u8], Header, usize)] = &[
            (
                b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\nGET / HTTP/1.1\r\n",
                proxied("192.0.2.7:56324", "198.51.100.1:443"),
                45,
            ),
            (
                b"PROXY TCP6 2001:db8::7 2001:db8::1 65535 0\r\n",
                proxied("[2001:db8::7]:65535", "[2001:db8::1]:0"),
                44,
            ),
            (b"PROXY UNKNOWN\r\n\x16\x03\x01", Header::Unknown, 15),
            (
                b"PROXY UNKNOWN ffff:f::1 ffff:f::2 65535 65535\r\nx",
                Header::Unknown,
                47,
            ),
        ];
        for (bytes, header, length) in cases {
            assert_eq!(
                parse(bytes),
                Ok(ProxyParsed::Complete {
                    header: *header,
                    length: *length
                }),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn malformed_version_1_lines_are_refused_with_what_is_wrong() {
        let cases: &[(&[u8], &str)] = &[
            (b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\n", "\\r\\n"),
            (b"PROXY TCP5 192.0.2.7 198.51.100.1 1 2\r\n", "protocol"),
            (b"PROXY TCP4 2001:db8::7 198.51.100.1 1 2\r\n", "family"),
            (b"PROXY TCP6 192.0.2.7 2001:db8::1 1 2\r\n", "family"),
            (b"PROXY TCP4 192.0.2.7 198.51.100.1 65536 2\r\n", "port"),
            (b"PROXY TCP4 192.0.2.7 198.51.100.1 -1 2\r\n", "port"),
            (b"PROXY TCP4 192.0.2.7 198.51.100.1 1\r\n", "fewer"),
            (b"PROXY TCP4 192.0.2.7  198.51.100.1 1 2\r\n", "family"),
            (b"PROXY TCP4 192.0.2.7 198.51.100.1 1 2 3\r\n", "more"),
            (b"PROXY TCP4 192.0.2.\xff 198.51.100.1 1 2\r\n", "text"),
            (b"PROXY \r\n", "protocol"),
        ];
        for (bytes, words) in cases {
            let error = parse(bytes).expect_err("malformed");
            assert!(
                matches!(error, HeaderError::V1Malformed(_)),
                "{error:?} for {}",
                String::from_utf8_lossy(bytes)
            );
            assert!(error.to_string().contains(words), "{error} for {words}");
            assert_eq!(error.label(), "malformed");
        }
    }

    #[test]
    fn a_version_1_line_ends_within_107_bytes() {
        let mut long = b"PROXY UNKNOWN ".to_vec();
        long.resize(V1_MAX - 1, b'x');
        assert_eq!(parse(&long), Ok(ProxyParsed::Partial));
        long.extend_from_slice(b"\r");
        assert_eq!(parse(&long), Err(HeaderError::V1TooLong));
        // 107 bytes with its \r\n: the longest there is.
        long.truncate(V1_MAX - 2);
        long.extend_from_slice(b"\r\n");
        assert_eq!(
            parse(&long),
            Ok(ProxyParsed::Complete {
                header: Header::Unknown,
                length: V1_MAX
            })
        );
    }

    #[test]
    fn version_2_headers_give_their_addresses_and_skip_their_extensions() {
        let mut v4 = vec![192, 0, 2, 7, 198, 51, 100, 1];
        v4.extend_from_slice(&56324u16.to_be_bytes());
        v4.extend_from_slice(&443u16.to_be_bytes());
        let mut v4_tlvs = v4.clone();
        // An AWS VPC endpoint TLV (0xEA) and a NOOP (0x04): skipped.
        v4_tlvs.extend_from_slice(&[0xEA, 0, 5, 1, b'v', b'p', b'c', b'e', 0x04, 0, 2, 0, 0]);
        let mut v6 = Vec::new();
        v6.extend_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0xdc, 0x04, 0x01, 0xbb]);
        let unix = vec![b'/'; 216];
        let cases: Vec<(Vec<u8>, Header)> = vec![
            (
                v2(0x21, 0x11, &v4),
                proxied("192.0.2.7:56324", "198.51.100.1:443"),
            ),
            (
                v2(0x21, 0x11, &v4_tlvs),
                proxied("192.0.2.7:56324", "198.51.100.1:443"),
            ),
            (
                v2(0x21, 0x21, &v6),
                proxied("[2001:db8::7]:56324", "[2001:db8::1]:443"),
            ),
            (v2(0x20, 0x00, &[]), Header::Local),
            // LOCAL with addresses (HAProxy's checks may send them): ignored.
            (v2(0x20, 0x11, &v4), Header::Local),
            (v2(0x21, 0x31, &unix), Header::Unknown),
            (v2(0x21, 0x00, &[]), Header::Unknown),
            // UDP over IPv4: no TCP client's address; the connection's own endpoints.
            (v2(0x21, 0x12, &v4), Header::Unknown),
        ];
        for (bytes, header) in cases {
            let length = bytes.len();
            let mut followed = bytes.clone();
            followed.extend_from_slice(b"\x16\x03\x01 the client's own bytes");
            assert_eq!(
                parse(&followed),
                Ok(ProxyParsed::Complete { header, length }),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn broken_version_2_headers_are_refused_from_their_fixed_part() {
        let cases: Vec<(Vec<u8>, HeaderError)> = vec![
            (v2(0x11, 0x11, &[0; 12]), HeaderError::V2Version(1)),
            (v2(0x22, 0x11, &[0; 12]), HeaderError::V2Command(2)),
            (
                v2(0x21, 0x11, &[0; 11]),
                HeaderError::V2Short {
                    length: 11,
                    need: 12,
                },
            ),
            (
                v2(0x21, 0x21, &[0; 12]),
                HeaderError::V2Short {
                    length: 12,
                    need: 36,
                },
            ),
            (
                v2(0x21, 0x11, &[0; V2_MAX_LENGTH + 1]),
                HeaderError::V2TooLong(V2_MAX_LENGTH + 1),
            ),
        ];
        for (bytes, error) in cases {
            // The sixteen bytes of the fixed part say it: no wait for the rest.
            assert_eq!(parse(&bytes[..V2_FIXED]), Err(error.clone()));
            assert_eq!(parse(&bytes), Err(error));
        }
        let mut lying = v2(0x21, 0x11, &[0; 12]);
        lying[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(
            parse(&lying),
            Err(HeaderError::V2TooLong(usize::from(u16::MAX)))
        );
    }

    #[test]
    fn other_first_bytes_are_no_header_and_are_told_at_once() {
        for bytes in [
            &b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n"[..],
            b"\x16\x03\x01\x02\x00",
            b"PROXX",
            b"\r\n\r\n\0\r\nQUIX",
            b"proxy TCP4",
        ] {
            let error = parse(bytes).expect_err("no header");
            assert!(matches!(error, HeaderError::Missing(_)), "{error:?}");
            assert_eq!(error.label(), "missing");
            assert!(!begins_header(bytes));
        }
        assert!(
            parse(b"GET / HTTP/1.1\r\n")
                .expect_err("no header")
                .to_string()
                .contains("`GET / HTTP/1.1\\r\\n`")
        );
        for partial in [
            &b""[..],
            b"P",
            b"PROXY",
            b"PROXY TCP4 1.2",
            b"\r\n\r\n\0\r\nQUI",
        ] {
            assert_eq!(parse(partial), Ok(ProxyParsed::Partial), "{partial:?}");
        }
        assert!(begins_header(b"PROXY TCP4"));
        assert!(begins_header(&V2_SIGNATURE));
    }

    #[test]
    fn the_writer_writes_what_haproxy_writes() {
        let header = proxied("192.0.2.7:56324", "198.51.100.1:443");
        assert_eq!(
            write(ProxyVersion::V1, &header),
            b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n"
        );
        assert_eq!(
            write(ProxyVersion::V1, &Header::Local),
            b"PROXY UNKNOWN\r\n"
        );
        assert_eq!(
            write(ProxyVersion::V1, &Header::Unknown),
            b"PROXY UNKNOWN\r\n"
        );
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend_from_slice(&[0x21, 0x11, 0, 12, 192, 0, 2, 7, 198, 51, 100, 1]);
        expected.extend_from_slice(&[0xdc, 0x04, 0x01, 0xbb]);
        assert_eq!(write(ProxyVersion::V2, &header), expected);
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(write(ProxyVersion::V2, &Header::Local), local);
        // An IPv4 client of an IPv6 listener: both written as IPv6.
        let mixed = proxied("192.0.2.7:1", "[2001:db8::1]:2");
        assert_eq!(
            write(ProxyVersion::V1, &mixed),
            b"PROXY TCP6 ::ffff:192.0.2.7 2001:db8::1 1 2\r\n"
        );
        // An IPv4-mapped pair (a `::` listener's IPv4 client): written as IPv4.
        let mapped = proxied("[::ffff:192.0.2.7]:1", "[::ffff:198.51.100.1]:2");
        assert_eq!(
            write(ProxyVersion::V1, &mapped),
            b"PROXY TCP4 192.0.2.7 198.51.100.1 1 2\r\n"
        );
    }

    fn socket_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
        ]
    }

    fn header() -> impl Strategy<Value = Header> {
        prop_oneof![
            Just(Header::Local),
            Just(Header::Unknown),
            (socket_addr(), socket_addr()).prop_map(|(source, destination)| Header::Proxied {
                source,
                destination
            }),
        ]
    }

    fn version() -> impl Strategy<Value = ProxyVersion> {
        prop_oneof![Just(ProxyVersion::V1), Just(ProxyVersion::V2)]
    }

    /// What a header reads back as once written in `version`: addresses in one family (see
    /// [`write`]), and version 1's check as UNKNOWN.
    fn as_written(version: ProxyVersion, header: Header) -> Header {
        match header {
            Header::Proxied {
                source,
                destination,
            } => {
                let (source, destination) = one_family(source, destination);
                Header::Proxied {
                    source,
                    destination,
                }
            }
            Header::Local if version == ProxyVersion::V1 => Header::Unknown,
            other => other,
        }
    }

    /// Checks what [`parse`] promises of any input: no panic; a complete header no longer
    /// than the input nor than [`MAX_HEADER`]; and an answer other than `Partial` once
    /// [`MAX_HEADER`] bytes are in hand, so a reader with that much room never waits forever.
    fn holds_its_promises(bytes: &[u8]) -> Result<(), TestCaseError> {
        match parse(bytes) {
            Ok(ProxyParsed::Complete { length, .. }) => {
                prop_assert!(length <= bytes.len() && length <= MAX_HEADER);
            }
            Ok(ProxyParsed::Partial) => prop_assert!(bytes.len() < MAX_HEADER),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        Ok(())
    }

    proptest! {
        // A fixed number of cases, so the time is bounded: under 20 s in all in a debug build
        // on two shared cores (`cargo test --lib proxy_protocol`), within the minute the
        // property tests are given.
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        #[test]
        fn what_the_writer_writes_the_parser_reads_back(
            version in version(),
            header in header(),
            after in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let written = write(version, &header);
            let mut bytes = written.clone();
            bytes.extend_from_slice(&after);
            prop_assert_eq!(
                parse(&bytes),
                Ok(ProxyParsed::Complete {
                    header: as_written(version, header),
                    length: written.len(),
                })
            );
            // Every truncation is the start of a header: wait for more, never a wrong answer.
            for cut in 0..written.len() {
                prop_assert_eq!(parse(&written[..cut]), Ok(ProxyParsed::Partial));
            }
        }

        #[test]
        fn any_bytes_get_an_answer(bytes in prop::collection::vec(any::<u8>(), 0..2 * MAX_HEADER)) {
            holds_its_promises(&bytes)?;
        }

        #[test]
        fn lying_and_oversized_version_2_lengths_get_an_answer(
            command in any::<u8>(),
            family in any::<u8>(),
            length in any::<u16>(),
            rest in prop::collection::vec(any::<u8>(), 0..2 * MAX_HEADER),
        ) {
            let mut bytes = V2_SIGNATURE.to_vec();
            bytes.extend_from_slice(&[command, family]);
            bytes.extend_from_slice(&length.to_be_bytes());
            bytes.extend_from_slice(&rest);
            holds_its_promises(&bytes)?;
            if let Ok(ProxyParsed::Complete { length: read, .. }) = parse(&bytes) {
                prop_assert_eq!(read, V2_FIXED + usize::from(length));
            }
            // The version and command are checked first: a lying length is what is wrong
            // only with both valid.
            if command >> 4 == 2 && command & 0x0f <= 1 && usize::from(length) > V2_MAX_LENGTH {
                prop_assert_eq!(parse(&bytes), Err(HeaderError::V2TooLong(usize::from(length))));
            }
        }

        #[test]
        fn version_1_lines_of_any_text_get_an_answer(
            line in "PROXY [ -~]{0,120}(\r\n)?",
            rest in prop::collection::vec(any::<u8>(), 0..32),
        ) {
            let mut bytes = line.into_bytes();
            bytes.extend_from_slice(&rest);
            holds_its_promises(&bytes)?;
        }
    }
}
