//! `RESTART_ONLY_WITH_ADDRESS`: whether an address is on one of this host's interfaces now.
//! Read from the interfaces (getifaddrs) rather than by binding it: keepalived setups often
//! set `ip_nonlocal_bind`, where a bind succeeds for an address the host does not hold.

use std::net::IpAddr;

/// True when `address` is assigned to an interface of this host now; `Err` (in words) when
/// the interfaces cannot be read.
pub fn is_on_this_host(address: IpAddr) -> Result<bool, String> {
    #[cfg(unix)]
    {
        let interfaces = nix::ifaddrs::getifaddrs()
            .map_err(|e| format!("cannot read this host's interfaces: {}", e.desc()))?;
        Ok(interfaces
            .filter_map(|i| i.address)
            .filter_map(|a| {
                a.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            })
            .any(|ip| ip == address))
    }
    #[cfg(not(unix))]
    {
        let _ = address;
        Err("RESTART_ONLY_WITH_ADDRESS needs a Unix system".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_here_and_a_documentation_address_is_not() {
        assert_eq!(is_on_this_host("127.0.0.1".parse().unwrap()), Ok(true));
        assert_eq!(is_on_this_host("192.0.2.77".parse().unwrap()), Ok(false));
    }
}
