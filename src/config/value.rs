//! Parsers for single values (flags, counts, durations, addresses, `REMOTE_SERVER_xx`) and their
//! canonical printed forms. Each parser's error completes the sentence "`value` ...".

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// The two-character id of `REMOTE_SERVER_xx`: letters or digits, stored in upper case so `aa`
/// and `AA` are the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerId([u8; 2]);

impl ServerId {
    /// Parses exactly two ASCII letters or digits.
    pub fn parse(text: &str) -> Option<ServerId> {
        match text.as_bytes() {
            [a, b] if a.is_ascii_alphanumeric() && b.is_ascii_alphanumeric() => {
                Some(ServerId([a.to_ascii_uppercase(), b.to_ascii_uppercase()]))
            }
            _ => None,
        }
    }

    /// The id as text (always two upper-case characters).
    pub fn as_str(&self) -> &str {
        // Both bytes are ASCII alphanumerics by construction.
        std::str::from_utf8(&self.0).unwrap_or("??")
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A server's host: an IP address, or a name resolved at each connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An IPv4 or IPv6 address: connects go straight to it.
    Ip(IpAddr),
    /// A host name, as written; every address it resolves to is tried in turn.
    Name(String),
}

impl Host {
    /// `host:port`, with an IPv6 address in brackets.
    pub fn with_port(&self, port: u16) -> String {
        match self {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            Host::Ip(ip) => format!("{ip}:{port}"),
            Host::Name(name) => format!("{name}:{port}"),
        }
    }

    /// `host:port` as the server knows itself, for an HTTP `Host` header: as
    /// [`Host::with_port`], an absolute name without its final dot. Servers match `Host`
    /// against the names they serve, which they write without it (TLS leaves it out of the
    /// name it sends too, RFC 6066 §3).
    pub fn authority(&self, port: u16) -> String {
        match self {
            Host::Name(name) => {
                format!("{}:{port}", name.strip_suffix('.').unwrap_or(name))
            }
            ip => ip.with_port(port),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Name(name) => f.write_str(name),
        }
    }
}

/// For a key `REMOTE_SERVER_<id>`: `Some(Ok(id))`, or `Some(Err)` when the id is malformed;
/// `None` for any other key.
pub fn server_id_of_key(key: &str) -> Option<Result<ServerId, String>> {
    let id = key.strip_prefix("REMOTE_SERVER_")?;
    Some(ServerId::parse(id).ok_or_else(|| {
        format!(
            "the id `{id}` must be exactly two letters or digits (01..99, then AA, 0A, X9, ...: \
             1296 ids in all)"
        )
    }))
}

/// `<host> <port> [<weight>]`.
pub fn server(text: &str) -> Result<(Host, u16, u32), String> {
    const FORM: &str = "expected `<host> <port> [<weight>]`, e.g. `10.0.0.5 1234` or `app1 1234 2`";
    let words: Vec<&str> = text.split_whitespace().collect();
    let (host, port, weight) = match words.as_slice() {
        [host, port] => (*host, *port, None),
        [host, port, weight] => (*host, *port, Some(*weight)),
        _ => return Err(FORM.into()),
    };
    let host = self::host(host)?;
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(format!(
                "has port `{port}`; expected a port number from 1 to 65535"
            ));
        }
    };
    let weight = match weight {
        None => 1,
        Some(w) => match w.parse::<u32>() {
            Ok(w) if w <= 1000 => w,
            _ => {
                return Err(format!(
                    "has weight `{w}`; expected a weight from 0 to 1000 (0 drains the server)"
                ));
            }
        },
    };
    Ok((host, port, weight))
}

/// A server's host: an IP address (IPv6 with or without brackets) or a host name.
pub(super) fn host(text: &str) -> Result<Host, String> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(Host::Ip(ip));
    }
    // One final dot makes the name absolute (`app1.example.`: no search domain appended); it
    // is kept as written, for the resolver.
    let relative = text.strip_suffix('.').unwrap_or(text);
    let labels: Vec<&str> = relative.split('.').collect();
    let well_formed = !relative.is_empty()
        && relative.len() <= 253
        && labels.iter().all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !well_formed {
        return Err(format!(
            "has host `{text}`; expected an IPv4 or IPv6 address or a host name (labels of \
             letters, digits, `-` and `_`, separated by `.`, and a final `.` allowed), \
             separated from the port by a space"
        ));
    }
    // A last label that is a number makes resolvers read the whole as an IPv4 address in
    // one of inet_aton's forms (`2130706433`, `0x7f.1` are 127.0.0.1), or fail on one out of
    // range (`256.1.1.1`): no host name ends so (RFC 1123, the URL standard).
    let last = labels.last().copied().unwrap_or_default();
    let hex = last
        .strip_prefix("0x")
        .or_else(|| last.strip_prefix("0X"))
        .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()));
    if hex || last.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "has host `{text}`; it is neither an IP address nor a host name (a name cannot end \
             in a number); write an IPv4 address as four numbers from 0 to 255, e.g. 10.0.0.5"
        ));
    }
    if labels
        .iter()
        .any(|l| l.starts_with('-') || l.ends_with('-'))
    {
        return Err(format!(
            "has host `{text}`; a label of a host name cannot start or end with `-`"
        ));
    }
    Ok(Host::Name(text.to_string()))
}

/// `0` or `1`.
pub fn flag(text: &str) -> Result<bool, String> {
    match text {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("expected 0 or 1".into()),
    }
}

/// A name such as a group's (empty: none): up to 32 letters, digits, `_`, `-` or `.`, not
/// starting with `-`.
pub fn name(text: &str) -> Result<Option<String>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    let fits = text.len() <= 32
        && !text.starts_with('-')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if fits {
        Ok(Some(text.to_string()))
    } else {
        Err("is not a name; expected up to 32 letters, digits, `_`, `-` or `.`".into())
    }
}

/// An integer within `min..=max`; `what` describes the expected value.
pub fn integer(text: &str, min: u64, max: u64, what: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected {what}")),
    }
}

/// An IP address to listen on (IPv6 with or without brackets).
pub fn ip(text: &str) -> Result<IpAddr, String> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse()
        .map_err(|_| "expected an IP address of this machine, e.g. 0.0.0.0, 10.0.0.2 or ::".into())
}

/// Longest duration any setting accepts: a day.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A duration from `min` to `max`: a plain integer is seconds; `ms`, `s` and `m` suffixes are
/// accepted.
pub fn duration_within(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let lower = text.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(digits_end);
    let per_unit_ms: u64 = match unit.trim() {
        "" | "s" => 1000,
        "ms" => 1,
        "m" => 60_000,
        _ => u64::MAX,
    };
    let parsed = digits
        .parse::<u64>()
        .ok()
        .filter(|_| per_unit_ms != u64::MAX)
        .and_then(|n| n.checked_mul(per_unit_ms))
        .map(Duration::from_millis);
    match parsed {
        Some(d) if d >= min && d <= max => Ok(d),
        _ => Err(format!(
            "expected a duration from {} to {}: seconds, or a number with ms, s or m (`500ms`, \
             `30s`, `2m`)",
            show_duration(min),
            if max == MAX_DURATION {
                "86400s (a day)".to_string()
            } else {
                show_duration(max)
            }
        )),
    }
}

/// The canonical form `duration_within` reads back: whole seconds as `Ns`, anything else as `Nms`.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// HTTP protocol names, separated by commas or blanks (`websocket h2c`), for
/// `HTTP_UPGRADE_PROTOCOLS`: each a token, or a token, `/` and a token (`websocket/13`), as
/// RFC 9110 7.8 writes a protocol. Empty: none.
pub fn protocols(text: &str) -> Result<Vec<String>, String> {
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    let mut list = Vec::new();
    for item in text.split([',', ' ', '\t']).filter(|i| !i.is_empty()) {
        let mut parts = item.split('/');
        let valid = parts.next().is_some_and(token)
            && parts.next().is_none_or(token)
            && parts.next().is_none();
        if !valid {
            return Err(format!(
                "has `{item}`; expected protocol names like websocket or h2c, separated by \
                 commas or blanks (empty: none)"
            ));
        }
        list.push(item.to_string());
    }
    Ok(list)
}

/// An address or a network (`10.0.0.0/8`, `::1`), for `QUERY_ALLOW`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network address (host bits cleared).
    pub network: IpAddr,
    /// Prefix length: 32 or 128 for a single address.
    pub prefix: u8,
}

impl Cidr {
    /// Everyone: `0.0.0.0/0` and `::/0`, the default of `QUERY_ALLOW`.
    pub fn everyone() -> Vec<Cidr> {
        vec![
            Cidr {
                network: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                prefix: 0,
            },
            Cidr {
                network: IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                prefix: 0,
            },
        ]
    }

    /// True when `ip` is in the network. IPv4 clients seen as IPv4-mapped IPv6 (`::ffff:a.b.c.d`,
    /// on a `::` listener) match IPv4 entries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask(u128::from(u32::from(ip)), self.prefix, 32) == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask(u128::from(ip), self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }
}

/// `bits` (a `width`-bit address) with all but the first `prefix` bits cleared.
fn mask(bits: u128, prefix: u8, width: u8) -> u128 {
    let host_bits = u32::from(width.saturating_sub(prefix));
    if host_bits >= 128 {
        0
    } else {
        bits & !((1u128 << host_bits) - 1)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.network.is_ipv4() { 32 } else { 128 };
        if self.prefix == full {
            write!(f, "{}", self.network)
        } else {
            write!(f, "{}/{}", self.network, self.prefix)
        }
    }
}

/// A list of addresses or CIDRs, separated by commas or blanks.
pub fn cidrs(text: &str) -> Result<Vec<Cidr>, String> {
    let mut list = Vec::new();
    for item in text.split([',', ' ', '\t']).filter(|i| !i.is_empty()) {
        let (address, prefix) = match item.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (item, None),
        };
        let Ok(network) = address.parse::<IpAddr>() else {
            return Err(format!(
                "has `{item}`; expected addresses or CIDRs like 10.0.0.0/8, 192.168.1.7, ::1"
            ));
        };
        let full: u8 = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix.map(str::parse::<u8>) {
            None => full,
            Some(Ok(p)) if p <= full => p,
            Some(_) => {
                return Err(format!(
                    "has `{item}`; the prefix length must be 0 to {full}"
                ));
            }
        };
        let bits = match network {
            IpAddr::V4(ip) => u128::from(u32::from(ip)),
            IpAddr::V6(ip) => u128::from(ip),
        };
        let masked = mask(bits, prefix, full);
        let network = match network {
            IpAddr::V4(_) => IpAddr::V4((masked as u32).into()),
            IpAddr::V6(_) => IpAddr::V6(masked.into()),
        };
        list.push(Cidr { network, prefix });
    }
    if list.is_empty() {
        return Err("expected addresses or CIDRs like 10.0.0.0/8, 192.168.1.7, ::1".into());
    }
    Ok(list)
}

/// Bytes written with escapes: `\r`, `\n`, `\t`, `\\` and `\xNN` (exactly two hex digits),
/// so any byte can be given (`MONITOR_SEND`, `MONITOR_EXPECT`).
pub fn escaped(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'r') => out.push(b'\r'),
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let digit = |d: Option<u8>| d.and_then(|d| (d as char).to_digit(16));
                match (digit(bytes.next()), digit(bytes.next())) {
                    (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                    _ => {
                        return Err(
                            r"has a `\x` escape without exactly two hex digits (e.g. \x0D)".into(),
                        );
                    }
                }
            }
            _ => return Err(r"has an unknown escape; expected \r, \n, \t, \\ or \xNN".into()),
        }
    }
    Ok(out)
}

/// The escaped form [`escaped`] reads back; `;` and blanks at either end are escaped too, as
/// a value cannot hold them there.
pub fn show_escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        let edge = i == 0 || i + 1 == bytes.len();
        match b {
            b'\r' => out.push_str(r"\r"),
            b'\n' => out.push_str(r"\n"),
            b'\t' => out.push_str(r"\t"),
            b'\\' => out.push_str(r"\\"),
            b' ' if edge => out.push_str(r"\x20"),
            b';' => out.push_str(r"\x3B"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!(r"\x{b:02X}")),
        }
    }
    out
}

/// For "did you mean" suggestions: the Levenshtein distance of `a` and `b` when it is at most
/// `max`; `None` when it is more, found as soon as every way is longer (a file may hold
/// 100,000 unknown keys, each compared with the known ones).
pub fn edit_distance_within(a: &str, b: &str, max: usize) -> Option<usize> {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = Vec::with_capacity(b.len() + 1);
    for (i, ca) in a.chars().enumerate() {
        current.clear();
        current.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        if current.iter().all(|&d| d > max) {
            return None;
        }
        std::mem::swap(&mut previous, &mut current);
    }
    Some(previous[b.len()]).filter(|&d| d <= max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A duration from `min` to a day.
    fn duration(text: &str, min: Duration) -> Result<Duration, String> {
        duration_within(text, min, MAX_DURATION)
    }

    #[test]
    fn durations() {
        let min = Duration::from_millis(10);
        for (text, ms) in [
            ("60", 60_000),
            ("500ms", 500),
            ("2m", 120_000),
            ("30s", 30_000),
            ("5 S", 5000),
        ] {
            assert_eq!(duration(text, min), Ok(Duration::from_millis(ms)), "{text}");
        }
        for text in [
            "",
            "ms",
            "-1",
            "1h",
            "1.5",
            "5ms",
            "25h",
            "99999999999999999999",
        ] {
            assert!(duration(text, min).is_err(), "{text} should be rejected");
        }
        for ms in [10, 500, 1000, 61_500, 120_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(duration(&show_duration(d), min), Ok(d));
        }
    }

    #[test]
    fn protocol_lists() {
        let cases: &[(&str, &[&str])] = &[
            ("websocket", &["websocket"]),
            ("WebSocket, h2c", &["WebSocket", "h2c"]),
            ("websocket/13\th2c ,,", &["websocket/13", "h2c"]),
            ("", &[]),
            (" , ", &[]),
        ];
        for (text, list) in cases {
            assert_eq!(
                protocols(text),
                Ok(list.iter().map(|p| p.to_string()).collect())
            );
        }
        for bad in ["web socket/", "a/b/c", "/13", "ws;q=1", "caf\u{e9}", "h2c/"] {
            assert!(protocols(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn servers() {
        assert_eq!(
            server("10.0.0.1 1234"),
            Ok((Host::Ip("10.0.0.1".parse().unwrap()), 1234, 1))
        );
        assert_eq!(
            server("app-1.example  80\t7"),
            Ok((Host::Name("app-1.example".into()), 80, 7))
        );
        assert_eq!(
            server("::1 80 0"),
            Ok((Host::Ip("::1".parse().unwrap()), 80, 0))
        );
        assert_eq!(
            server("[::1] 80"),
            Ok((Host::Ip("::1".parse().unwrap()), 80, 1))
        );
        for name in [
            "3com.example",
            "app_1",
            "x-1.0a",
            "APPSRV03",
            "a.b-c.d1x",
            "app1.example.",
            "localhost.",
        ] {
            assert_eq!(
                server(&format!("{name} 1")),
                Ok((Host::Name(name.into()), 1, 1))
            );
        }
        for bad in [
            "",
            "host",
            "host 0",
            "host 65536",
            "host 1 1001",
            "host 1 2 3",
            "a,b 1",
            "h:1 2",
            "2130706433 1",
            "0x7f.1 1",
            "0X7F 1",
            "256.1.1.1 1",
            "1.2.3 1",
            "-bad-.example 1",
            "app-.example 1",
            "a..b 1",
            "app.example.. 1",
            ". 1",
            "10.0.0.1. 1",
            "app.-x. 1",
        ] {
            assert!(server(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn ids() {
        assert_eq!(ServerId::parse("aa"), ServerId::parse("AA"));
        assert_eq!(
            ServerId::parse("0a").map(|i| i.to_string()),
            Some("0A".into())
        );
        assert!(ServerId::parse("1").is_none());
        assert!(ServerId::parse("100").is_none());
        assert!(ServerId::parse("a_").is_none());
        assert!(matches!(server_id_of_key("REMOTE_SERVER_X9"), Some(Ok(_))));
        assert!(matches!(
            server_id_of_key("REMOTE_SERVER_100"),
            Some(Err(_))
        ));
        assert!(server_id_of_key("REMOTE_SERVERS").is_none());
    }

    #[test]
    fn cidr_lists() {
        let list = cidrs("10.0.0.0/8, 192.168.1.7 ::1,2001:db8::/32").unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(list[0].contains(ip("10.200.3.4")));
        assert!(!list[0].contains(ip("11.0.0.1")));
        assert!(list[1].contains(ip("192.168.1.7")) && !list[1].contains(ip("192.168.1.8")));
        assert!(
            list[1].contains(ip("::ffff:192.168.1.7")),
            "IPv4-mapped peers match IPv4 rules"
        );
        assert!(list[2].contains(ip("::1")));
        assert!(list[3].contains(ip("2001:db8:1::5")) && !list[3].contains(ip("2001:db9::1")));
        assert_eq!(cidrs("10.1.2.3/8").unwrap()[0].to_string(), "10.0.0.0/8");
        assert!(cidrs("0.0.0.0/0").unwrap()[0].contains(ip("8.8.8.8")));
        for bad in ["", "10.0.0.0/33", "example.com", "10.0.0.0/x", "::1/129"] {
            assert!(cidrs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn escapes() {
        assert_eq!(escaped(r"PING\r\n").unwrap(), b"PING\r\n");
        assert_eq!(
            escaped(r"\x00\xFF\t\\").unwrap(),
            vec![0, 255, b'\t', b'\\']
        );
        for bad in [r"\q", r"\x4", r"\xZZ", "end\\"] {
            assert!(escaped(bad).is_err(), "{bad}");
        }
        for bytes in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b" a;b ",
            b"\x00\x7f\x80\xff",
        ] {
            assert_eq!(escaped(&show_escaped(bytes)).unwrap(), bytes);
        }
    }

    #[test]
    fn distance() {
        let distance = |a, b| edit_distance_within(a, b, usize::MAX - 1).unwrap();
        assert_eq!(distance("SORT_METOD", "SORT_METHOD"), 1);
        assert_eq!(distance("", "ABC"), 3);
        assert_eq!(distance("KITTEN", "SITTING"), 3);
        assert_eq!(edit_distance_within("KITTEN", "SITTING", 3), Some(3));
        assert_eq!(edit_distance_within("KITTEN", "SITTING", 2), None);
        assert_eq!(edit_distance_within("LANGAUGE", "LANGUAGE", 2), Some(2));
        assert_eq!(edit_distance_within("X", "CONNECT_TIMEOUT", 3), None);
    }
}
