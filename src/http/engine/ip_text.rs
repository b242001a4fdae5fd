//! A client's address as the `X-Forwarded-For` line the engine adds says it, written once
//! per connection into a few bytes on the stack, and by hand for IPv4: it goes into every
//! request forwarded.

use std::io::Write as _;
use std::net::IpAddr;

/// A client's address as `X-Forwarded-For` says it (an IPv4 client on a dual-stack socket as
/// plain IPv4), written once per connection, on the stack.
pub(super) struct IpText {
    bytes: [u8; IP_TEXT_MAX],
    len: u8,
}

/// The longest text of an IP address: an IPv6 address with an IPv4 tail.
const IP_TEXT_MAX: usize = 45;

impl IpText {
    pub(super) fn of(ip: IpAddr) -> IpText {
        let ip = ip.to_canonical();
        let mut text = IpText::none();
        match ip {
            // Written by hand: it is written for every request, and `core::fmt` costs some
            // ten times as much (docs/benchmarks.md).
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    text.push_decimal(octet);
                }
            }
            // RFC 5952's shortest form, as `Display` writes it.
            IpAddr::V6(_) => {
                let mut room = &mut text.bytes[..];
                if write!(room, "{ip}").is_ok() {
                    text.len = (IP_TEXT_MAX - room.len()) as u8;
                }
            }
        }
        text
    }

    /// Appends `byte` (room for the longest address is always left).
    fn push(&mut self, byte: u8) {
        self.bytes[usize::from(self.len)] = byte;
        self.len += 1;
    }

    /// Appends `n` in decimal, without leading zeros.
    fn push_decimal(&mut self, n: u8) {
        if n >= 100 {
            self.push(b'0' + n / 100);
        }
        if n >= 10 {
            self.push(b'0' + n / 10 % 10);
        }
        self.push(b'0' + n % 10);
    }

    /// No address (a connection's peer always has one; an unknown client has none).
    pub(super) fn none() -> IpText {
        IpText {
            bytes: [0; IP_TEXT_MAX],
            len: 0,
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_written_as_display_writes_it() {
        let ips = [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.255",
            "192.168.0.9",
            "::ffff:203.0.113.7",
            "2001:db8::1",
            "::1",
            "::",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
        ];
        for ip in ips {
            let ip: IpAddr = ip.parse().unwrap();
            let shown = ip.to_canonical().to_string();
            assert_eq!(IpText::of(ip).as_bytes(), shown.as_bytes(), "{ip}");
        }
    }
}
