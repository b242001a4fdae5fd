//! A server that is the broker itself. A `REMOTE_SERVER` whose address is one of the broker's
//! own listening addresses sends each client back into the broker, which forwards it to
//! itself again, and so on until every descriptor is used. `--check` and a reload refuse the
//! ones visible in the file (an address on a balancer's own port); every connect refuses the
//! rest (a name that resolves to one, a machine address on a wildcard listener's port).
//!
//! Known limit: a destination that reaches the broker only through address translation (a
//! router's public address forwarded back to this machine) cannot be told from here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// True when connecting to `destination` reaches the listener bound to `listen`. A wildcard
/// listener (`0.0.0.0`, or `::`, which appbroker binds for IPv4 too) is reached through any
/// address of the machine (`is_local`) and any loopback address; a connect to `0.0.0.0` or
/// `::` reaches the machine itself.
pub fn reaches(
    destination: SocketAddr,
    listen: SocketAddr,
    is_local: impl Fn(IpAddr) -> bool,
) -> bool {
    if destination.port() != listen.port() {
        return false;
    }
    let to = match destination.ip().to_canonical() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let listen = listen.ip().to_canonical();
    if !listen.is_unspecified() {
        return to == listen;
    }
    let family = listen.is_ipv6() || to.is_ipv4();
    family && (to.is_loopback() || is_local(to))
}

/// The addresses of this machine's interfaces, read again when older than [`FRESH`].
#[derive(Debug, Default)]
pub struct LocalAddresses {
    read: Mutex<Option<(Instant, Vec<IpAddr>)>>,
}

/// How long a reading of the interfaces' addresses is trusted: addresses change rarely, and
/// reading them costs a netlink round trip.
const FRESH: Duration = Duration::from_secs(5);

impl LocalAddresses {
    /// True when `ip` is an address of this machine (loopback included).
    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_loopback() || ip.is_unspecified() {
            return true;
        }
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let stale = read.as_ref().is_none_or(|(at, _)| at.elapsed() > FRESH);
        if stale {
            *read = Some((Instant::now(), interface_addresses()));
        }
        read.as_ref().is_some_and(|(_, ips)| ips.contains(&ip))
    }
}

/// The addresses of this machine's interfaces; empty where they cannot be listed.
pub fn interface_addresses() -> Vec<IpAddr> {
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "freebsd"
    ))]
    {
        let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
            return Vec::new();
        };
        interfaces
            .filter_map(|i| i.address)
            .filter_map(|a| {
                if let Some(v4) = a.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                }
            })
            .collect()
    }
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "freebsd"
    )))]
    {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn which_destinations_reach_which_listeners() {
        // This machine: 10.0.0.5 and fd00::5 besides loopback.
        let local = |ip: IpAddr| {
            ip == "10.0.0.5".parse::<IpAddr>().unwrap()
                || ip == "fd00::5".parse::<IpAddr>().unwrap()
        };
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1:5000", true),
            ("127.0.0.1:5000", "127.0.0.1:5001", false),
            ("127.0.0.2:5000", "127.0.0.1:5000", false),
            ("0.0.0.0:5000", "127.0.0.1:5000", true),
            ("127.9.9.9:5000", "0.0.0.0:5000", true),
            ("10.0.0.5:5000", "0.0.0.0:5000", true),
            ("10.0.0.6:5000", "0.0.0.0:5000", false),
            ("10.0.0.5:5000", "10.0.0.5:5000", true),
            ("10.0.0.5:5000", "127.0.0.1:5000", false),
            ("[::1]:5000", "0.0.0.0:5000", false),
            ("[::1]:5000", "[::]:5000", true),
            ("127.0.0.1:5000", "[::]:5000", true),
            ("10.0.0.5:5000", "[::]:5000", true),
            ("[fd00::5]:5000", "[::]:5000", true),
            ("[::ffff:127.0.0.1]:5000", "127.0.0.1:5000", true),
            ("[::]:5000", "[::1]:5000", true),
            ("192.0.2.7:5000", "[::]:5000", false),
        ];
        for (destination, listen, expected) in cases {
            assert_eq!(
                reaches(addr(destination), addr(listen), local),
                expected,
                "{destination} -> {listen}"
            );
        }
    }

    #[test]
    fn loopback_is_always_local() {
        let local = LocalAddresses::default();
        assert!(local.contains("127.0.0.1".parse().unwrap()));
        assert!(local.contains("::1".parse().unwrap()));
        assert!(!local.contains("192.0.2.200".parse().unwrap()));
    }
}
