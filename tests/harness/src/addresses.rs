//! Addresses of this host a test may use beyond 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

/// TEST-NET-1's address given to `lo` on a host with no other: a packet to it never leaves
/// the host.
const ADDED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

/// An address to connect from to be a peer off loopback while staying on this machine: an
/// IPv4 address of one of this host's interfaces other than loopback; on a host that has
/// none (a container with loopback alone), 192.0.2.2 added to `lo` (as root: `ip addr add`).
/// `None` when neither can be had.
pub fn off_loopback_address() -> Option<IpAddr> {
    if let Some(ip) = interface_address() {
        return Some(IpAddr::V4(ip));
    }
    // Its status is not read: "File exists" (another test added it first) is as good, and
    // whether the address is there now is what the lookup below says.
    Command::new("ip")
        .args(["addr", "add", &format!("{ADDED}/32"), "dev", "lo"])
        .output()
        .ok()?;
    interface_address().map(IpAddr::V4)
}

/// The first IPv4 address of an interface that is not loopback's.
fn interface_address() -> Option<Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter_map(|interface| Some(interface.address?.as_sockaddr_in()?.ip()))
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
}
