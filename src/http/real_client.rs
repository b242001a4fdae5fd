//! `HTTP_TRUSTED_PROXIES`: the client of a request that came through an L7 proxy the operator
//! trusts, read from its `X-Forwarded-For` as bytes, as nginx's `set_real_ip_from` with
//! `real_ip_recursive on` reads it: from a trusted peer, the chain's last address that is not
//! itself trusted (the one the nearest untrusted hop was told by nobody it can be trusted
//! about); from anyone else the peer, whatever it says.

use std::net::{IpAddr, SocketAddr};

use crate::config::Cidr;
use crate::http::Downstream;
use crate::http::h1::{FieldName, RequestHead};

impl Downstream {
    /// Whether the connection's peer is one of the `trusted` proxies: its connections carry
    /// many clients, so `MAX_CONNECTIONS_PER_CLIENT` counts its requests, each for the client
    /// it names, rather than its connections.
    pub(crate) fn is_trusted_proxy(&self, trusted: &[Cidr]) -> bool {
        trusts(trusted, self.peer.ip())
    }

    /// This request's client as `head` (over `buf`) tells it when the connection's peer is
    /// in `trusted`: the chain's client, and the peer it came through (which
    /// `X-Forwarded-For` is appended with); as it is, and no proxy, otherwise or when the
    /// chain names no client.
    pub(crate) fn behind(
        self,
        trusted: &[Cidr],
        head: &RequestHead,
        buf: &[u8],
    ) -> (Downstream, Option<IpAddr>) {
        if trusted.is_empty() {
            return (self, None);
        }
        let fields = head.fields();
        let lines = fields
            .named(FieldName::XForwardedFor)
            .filter_map(|id| fields.get(buf, id))
            .map(|field| field.value);
        let client = real_client(self.peer.ip(), trusted, lines);
        if client == self.peer.ip() {
            return (self, None);
        }
        let behind = Downstream {
            // The port is the peer's: the chain carries none, and the log wants one.
            peer: SocketAddr::new(client, self.peer.port()),
            ..self
        };
        (behind, Some(self.peer.ip()))
    }
}

/// The client of a request from `peer` whose `X-Forwarded-For` lines are `lines` (each a
/// comma-separated list, in the order received): `peer` unless it is in `trusted`; then the
/// last address of the chain not in `trusted`, or the first when all are. A chain with an
/// entry that is not a bare address (a port, a name, `unknown`, an empty item) was not
/// written by a proxy to be trusted, so the peer is the client; so it is for no chain at all.
/// One pass, no allocation: the last untrusted address is the first one met from the right.
pub(crate) fn real_client<'a>(
    peer: IpAddr,
    trusted: &[Cidr],
    lines: impl Iterator<Item = &'a [u8]>,
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusts(trusted, ip);
    if !is_trusted(peer) {
        return peer;
    }
    let (mut first, mut last_untrusted) = (None, None);
    for line in lines.filter(|line| !line.is_empty()) {
        for item in line.split(|&b| b == b',') {
            let Some(ip) = address(item) else {
                return peer;
            };
            first.get_or_insert(ip);
            if !is_trusted(ip) {
                last_untrusted = Some(ip);
            }
        }
    }
    last_untrusted.or(first).unwrap_or(peer)
}

/// Whether `ip` is in `trusted`.
fn trusts(trusted: &[Cidr], ip: IpAddr) -> bool {
    trusted.iter().any(|cidr| cidr.contains(ip))
}

/// One item of the chain, blanks around it taken off, when it is a bare IPv4 or IPv6 address.
fn address(item: &[u8]) -> Option<IpAddr> {
    let item = item.trim_ascii();
    // The longest IPv6 text (with an IPv4 tail) is 45 bytes: anything longer is no address.
    if item.len() > 45 {
        return None;
    }
    std::str::from_utf8(item).ok()?.parse().ok()
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

    fn client(peer: &str, trusted: &str, lines: &[&str]) -> String {
        assert_eq!(trusted, "10.0.0.0/8");
        let peer: IpAddr = peer.parse().unwrap();
        real_client(peer, &tens(), lines.iter().map(|l| l.as_bytes())).to_string()
    }

    #[test]
    fn the_client_is_the_last_untrusted_address_of_a_trusted_peers_chain() {
        let cases: &[(&str, &str, &[&str], &str)] = &[
            // Not from a trusted peer: whatever it says, the peer.
            ("192.0.2.1", "10.0.0.0/8", &["203.0.113.9"], "192.0.2.1"),
            // From a trusted peer: the chain's last untrusted address.
            ("10.0.0.1", "10.0.0.0/8", &["203.0.113.9"], "203.0.113.9"),
            (
                "10.0.0.1",
                "10.0.0.0/8",
                &["198.51.100.1, 203.0.113.9, 10.0.0.2"],
                "203.0.113.9",
            ),
            // Several lines are one chain, in order.
            (
                "10.0.0.1",
                "10.0.0.0/8",
                &["198.51.100.1", "203.0.113.9 ,10.0.0.2"],
                "203.0.113.9",
            ),
            // Every address trusted: the first.
            (
                "10.0.0.1",
                "10.0.0.0/8",
                &["10.0.0.3, 10.0.0.2"],
                "10.0.0.3",
            ),
            // IPv6, and an IPv4 peer seen as IPv4-mapped.
            (
                "::ffff:10.0.0.1",
                "10.0.0.0/8",
                &["2001:db8::7"],
                "2001:db8::7",
            ),
            // No chain, an empty line: the peer.
            ("10.0.0.1", "10.0.0.0/8", &[], "10.0.0.1"),
            ("10.0.0.1", "10.0.0.0/8", &[""], "10.0.0.1"),
            // Malformed: the peer.
            ("10.0.0.1", "10.0.0.0/8", &["203.0.113.9:443"], "10.0.0.1"),
            (
                "10.0.0.1",
                "10.0.0.0/8",
                &["203.0.113.9,,10.0.0.2"],
                "10.0.0.1",
            ),
            (
                "10.0.0.1",
                "10.0.0.0/8",
                &["unknown, 203.0.113.9"],
                "10.0.0.1",
            ),
            ("10.0.0.1", "10.0.0.0/8", &["[2001:db8::7]"], "10.0.0.1"),
            ("10.0.0.1", "10.0.0.0/8", &["203.0.113.9", "x"], "10.0.0.1"),
        ];
        for (peer, trusted, lines, expected) in cases {
            assert_eq!(
                client(peer, trusted, lines),
                *expected,
                "{peer} trusting {trusted} with {lines:?}"
            );
        }
    }

    #[test]
    fn bytes_that_are_no_text_fall_back_to_the_peer() {
        let trusted = tens();
        let lines: [&[u8]; 2] = [b"\xff\xfe, 203.0.113.9", &[b'1'; 4096]];
        for line in lines {
            let ip = real_client("10.0.0.1".parse().unwrap(), &trusted, [line].into_iter());
            assert_eq!(ip.to_string(), "10.0.0.1");
        }
    }
}
