//! `HTTP_TRUSTED_PROXIES`: the client of a request that came through an L7 proxy the operator
//! trusts, read from its `X-Forwarded-For` as bytes, walked from the right as nginx's
//! `set_real_ip_from` with `real_ip_recursive on` walks it: from a trusted peer, a trusted
//! address is a proxy (go on), the first untrusted address is the client, and an item that is
//! no address met before it makes the client unknown, never the proxy; from anyone else the
//! peer, whatever it says.

use std::net::{IpAddr, SocketAddr};

use crate::config::Cidr;
use crate::http::h1::{FieldName, RequestHead};
use crate::http::{ClientAddr, Downstream};

/// What a trusted proxy's `X-Forwarded-For` says of its request's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chain {
    /// The connection's peer is the client: it is not trusted, or it is a trusted proxy that
    /// sent no chain (its own request: a health check).
    Peer,
    /// The client at this address.
    Client(IpAddr),
    /// An item that is no usable address came before any untrusted one: whoever the client
    /// is, the chain does not say.
    Unknown,
}

impl Downstream {
    /// Whether the connection's peer is one of the `trusted` proxies: its connections carry
    /// many clients, so `MAX_CONNECTIONS_PER_CLIENT` counts its requests, each for the client
    /// it names, rather than its connections.
    pub(crate) fn is_trusted_proxy(&self, trusted: &[Cidr]) -> bool {
        self.peer.ip().is_some_and(|ip| trusts(trusted, ip))
    }

    /// This request's client as `head` (over `buf`) tells it when the connection's peer is
    /// in `trusted`: the chain's client (perhaps unknown), and the peer it came through
    /// (which `X-Forwarded-For` is appended with); as it is, and no proxy, otherwise or when
    /// the chain names the peer itself.
    pub(crate) fn behind(
        self,
        trusted: &[Cidr],
        head: &RequestHead,
        buf: &[u8],
    ) -> (Downstream, Option<IpAddr>) {
        let Some(peer) = self.peer.known().filter(|_| !trusted.is_empty()) else {
            return (self, None);
        };
        let fields = head.fields();
        let lines = fields
            .named(FieldName::XForwardedFor)
            .filter_map(|id| fields.get(buf, id))
            .map(|field| field.value);
        let client = match real_client(peer.ip(), trusted, lines) {
            Chain::Peer => return (self, None),
            Chain::Client(ip) if ip == peer.ip() => return (self, None),
            // The port is the peer's: the chain carries none, and the log wants one.
            Chain::Client(ip) => ClientAddr::Known(SocketAddr::new(ip, peer.port())),
            Chain::Unknown => ClientAddr::Unknown,
        };
        let behind = Downstream {
            peer: client,
            ..self
        };
        (behind, Some(peer.ip()))
    }
}

/// The client of a request from `peer` whose `X-Forwarded-For` lines are `lines` (each a
/// comma-separated list, in the order received): `peer` unless it is in `trusted`. Then the
/// chain, all its lines one list, is walked from the right: a trusted address is a proxy
/// (on to the next), an untrusted one is the client, an item that is no usable address (a
/// port, a name, `unknown`, an empty item or line, the unspecified address) makes the client
/// unknown. A chain of trusted addresses only names its first; no chain, the peer.
///
/// One pass from the left, no allocation: the walk from the right ends at the last item
/// that is untrusted or unusable, so that item, kept as the pass goes, decides.
pub(crate) fn real_client<'a>(
    peer: IpAddr,
    trusted: &[Cidr],
    lines: impl Iterator<Item = &'a [u8]>,
) -> Chain {
    if !trusts(trusted, peer) {
        return Chain::Peer;
    }
    let (mut first, mut decisive) = (None, None);
    for item in lines.flat_map(|line| line.split(|&b| b == b',')) {
        match address(item) {
            Some(ip) if trusts(trusted, ip) => {
                first.get_or_insert(ip);
            }
            Some(ip) => decisive = Some(Chain::Client(ip)),
            None => decisive = Some(Chain::Unknown),
        }
    }
    decisive.or(first.map(Chain::Client)).unwrap_or(Chain::Peer)
}

/// Whether `ip` is in `trusted`.
fn trusts(trusted: &[Cidr], ip: IpAddr) -> bool {
    trusted.iter().any(|cidr| cidr.contains(ip))
}

/// One item of the chain, blanks around it taken off, when it is a bare IPv4 or IPv6 address
/// a client can have: the unspecified address (`0.0.0.0`, `::`) is none, and stands for the
/// unknown clients' one count.
fn address(item: &[u8]) -> Option<IpAddr> {
    let item = item.trim_ascii();
    // The longest IPv6 text (with an IPv4 tail) is 45 bytes: anything longer is no address.
    if item.len() > 45 {
        return None;
    }
    let ip: IpAddr = std::str::from_utf8(item).ok()?.parse().ok()?;
    (!ip.to_canonical().is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `10.0.0.0/8`, the proxies the cases trust.
    fn tens() -> Vec<Cidr> {
        vec![Cidr {
            network: "10.0.0.0".parse().unwrap(),
            prefix: 8,
        }]
    }

    /// The client of a request from `peer` with `lines`, trusting `10.0.0.0/8`: an address,
    /// `peer` for the peer itself, `unknown`.
    fn client(peer: &str, lines: &[&str]) -> String {
        let peer: IpAddr = peer.parse().unwrap();
        match real_client(peer, &tens(), lines.iter().map(|l| l.as_bytes())) {
            Chain::Peer => "peer".to_string(),
            Chain::Client(ip) => ip.to_string(),
            Chain::Unknown => "unknown".to_string(),
        }
    }

    #[test]
    fn the_chain_is_walked_from_the_right_to_its_first_untrusted_address() {
        let cases: &[(&str, &[&str], &str)] = &[
            // Not from a trusted peer: whatever it says, the peer.
            ("192.0.2.1", &["203.0.113.9"], "peer"),
            ("192.0.2.1", &["unknown"], "peer"),
            // From a trusted peer: the first untrusted address from the right.
            ("10.0.0.1", &["203.0.113.9"], "203.0.113.9"),
            (
                "10.0.0.1",
                &["198.51.100.1, 203.0.113.9, 10.0.0.2"],
                "203.0.113.9",
            ),
            // Several lines are one chain, in order.
            (
                "10.0.0.1",
                &["198.51.100.1", "203.0.113.9 ,10.0.0.2"],
                "203.0.113.9",
            ),
            // Every address trusted: the first.
            ("10.0.0.1", &["10.0.0.3, 10.0.0.2"], "10.0.0.3"),
            // IPv6, and an IPv4 peer seen as IPv4-mapped.
            ("::ffff:10.0.0.1", &["2001:db8::7"], "2001:db8::7"),
            // No chain: the trusted peer's own request.
            ("10.0.0.1", &[], "peer"),
            // What lies left of the client is never read: junk there changes nothing.
            ("10.0.0.1", &["unknown, 203.0.113.9"], "203.0.113.9"),
            ("10.0.0.1", &["x, , 203.0.113.9, 10.0.0.2"], "203.0.113.9"),
        ];
        for (peer, lines, expected) in cases {
            assert_eq!(client(peer, lines), *expected, "{peer} with {lines:?}");
        }
    }

    #[test]
    fn an_unusable_item_met_before_any_untrusted_address_makes_the_client_unknown() {
        // What was read before as "the proxy is the client" is the client unknown now: a
        // request can never make its client the trusted proxy.
        let cases: &[&[&str]] = &[
            &["203.0.113.9, unknown"],
            &["203.0.113.9:443"],
            &["203.0.113.9,,10.0.0.2"],
            &["203.0.113.9,"],
            &["[2001:db8::7]"],
            &["203.0.113.9", "x"],
            &["203.0.113.9", ""],
            &[""],
            &["0.0.0.0"],
            &["::, 10.0.0.2"],
            &["unknown, 10.0.0.2"],
        ];
        for lines in cases {
            assert_eq!(client("10.0.0.1", lines), "unknown", "{lines:?}");
        }
    }

    #[test]
    fn bytes_that_are_no_text_make_the_client_unknown() {
        let trusted = tens();
        let lines: [&[u8]; 3] = [b"203.0.113.9, \xff\xfe", &[b'1'; 4096], b"\0"];
        for line in lines {
            let chain = real_client("10.0.0.1".parse().unwrap(), &trusted, [line].into_iter());
            assert_eq!(chain, Chain::Unknown, "{}", line.escape_ascii());
        }
    }
}
