//! The few system facilities the standard library lacks, kept in one small module so the rest
//! stays portable (a Windows build is expected to be asked for): errno names and the open-file
//! limit.

use std::io;

/// The errno name of an OS error (`ECONNREFUSED`), when it has one.
#[cfg(unix)]
pub fn errno_name(error: &io::Error) -> Option<&'static str> {
    let errno = nix::errno::Errno::from_raw(error.raw_os_error()?);
    KNOWN.iter().find(|(e, _)| *e == errno).map(|(_, n)| *n)
}

/// Windows has no errno names; its codes are printed instead.
#[cfg(not(unix))]
pub fn errno_name(_error: &io::Error) -> Option<&'static str> {
    None
}

/// The errors worth a name in an operator's log line.
#[cfg(unix)]
const KNOWN: &[(nix::errno::Errno, &str)] = {
    use nix::errno::Errno::*;
    &[
        (ECONNREFUSED, "ECONNREFUSED"),
        (ETIMEDOUT, "ETIMEDOUT"),
        (ENETDOWN, "ENETDOWN"),
        (ENETUNREACH, "ENETUNREACH"),
        (EHOSTUNREACH, "EHOSTUNREACH"),
        (EHOSTDOWN, "EHOSTDOWN"),
        (ECONNRESET, "ECONNRESET"),
        (ECONNABORTED, "ECONNABORTED"),
        (EPIPE, "EPIPE"),
        (EADDRINUSE, "EADDRINUSE"),
        (EADDRNOTAVAIL, "EADDRNOTAVAIL"),
        (EACCES, "EACCES"),
        (EPERM, "EPERM"),
        (EMFILE, "EMFILE"),
        (ENFILE, "ENFILE"),
        (ENOBUFS, "ENOBUFS"),
        (ENOMEM, "ENOMEM"),
        (EINVAL, "EINVAL"),
    ]
};

/// Raises the soft open-file limit to the hard limit, so the broker can hold as many
/// connections as the operator allowed (each proxied client takes two descriptors).
/// Returns the limit now in force.
pub fn raise_open_file_limit() -> io::Result<u64> {
    #[cfg(unix)]
    {
        let (soft, hard) = rlimit::Resource::NOFILE.get()?;
        if soft < hard {
            rlimit::Resource::NOFILE.set(hard, hard)?;
        }
        Ok(hard)
    }
    #[cfg(not(unix))]
    {
        Ok(u64::MAX)
    }
}

/// Sets TCP keepalive (and, on Linux, TCP_USER_TIMEOUT to match) on a connected socket, so a
/// vanished peer is noticed after `keepalive.dead_after()` rather than hours. Nothing is set
/// when keepalive is off.
pub fn set_keepalive(
    stream: &tokio::net::TcpStream,
    keepalive: &crate::config::Keepalive,
) -> io::Result<()> {
    if !keepalive.enabled() {
        return Ok(());
    }
    let socket = socket2::SockRef::from(stream);
    let params = socket2::TcpKeepalive::new()
        .with_time(keepalive.time)
        .with_interval(keepalive.interval);
    #[cfg(not(windows))]
    let params = params.with_retries(keepalive.count);
    socket.set_tcp_keepalive(&params)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    socket.set_tcp_user_timeout(Some(keepalive.dead_after()))?;
    Ok(())
}
