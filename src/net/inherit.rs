//! Descriptors this process was handed at start by whoever started it: the listeners of a
//! supervisor (`--supervise`) or of systemd's socket activation (`LISTEN_FDS`), and the socket
//! a supervised child reports on. Taking a descriptor by its number is
//! [`unsafe_calls::adopt_socket`]'s (the one module allowed `unsafe`), which checks first that
//! the number names an open socket that nothing in this process owns yet.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use crate::support::unsafe_calls;
pub use crate::support::unsafe_calls::InheritError;

/// Takes ownership of socket `fd`, inherited open from the process that started this one; it
/// is closed on exec from now on (a child is handed what it needs on purpose).
pub fn take_socket(fd: RawFd) -> Result<OwnedFd, InheritError> {
    let owned = unsafe_calls::adopt_socket(fd)?;
    // Ours now: not to leak into whatever this process runs next (a supervisor hands its
    // children their listeners by clearing the flag on purpose).
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| InheritError::NotSocket {
        fd,
        source: e.into(),
    })?;
    Ok(owned)
}

/// Takes listening TCP socket `fd` (a supervisor's or systemd's), nonblocking as the
/// accept loops want it.
pub fn take_listener(fd: RawFd) -> Result<std::net::TcpListener, InheritError> {
    let socket = socket2::Socket::from(take_socket(fd)?);
    let checked = socket.r#type().and_then(|t| {
        if t != socket2::Type::STREAM || !socket.is_listener()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a listening stream socket",
            ));
        }
        socket.set_nonblocking(true)
    });
    crate::net::sys::forget_closing_filter(&socket);
    checked.map_err(|source| InheritError::NotSocket { fd, source })?;
    Ok(socket.into())
}

/// Lets `fd` be inherited by the programs this process runs (clears close-on-exec): how a
/// supervisor hands its listeners to every child it starts, and to itself when it re-executes.
pub fn hand_down(fd: &impl std::os::fd::AsFd) -> io::Result<()> {
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )?;
    Ok(())
}

/// Closes `fd` on exec again, after a [`hand_down`] for an exec that failed: what was meant
/// for the next image of this process must not leak into the children it starts instead.
pub fn keep(fd: &impl std::os::fd::AsFd) -> io::Result<()> {
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn a_listener_is_taken_once_and_serves() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fd = listener.into_raw_fd();
        let taken = take_listener(fd).unwrap();
        assert_eq!(taken.local_addr().unwrap(), addr);
        assert!(matches!(take_listener(fd), Err(InheritError::Taken(_))));
    }

    #[test]
    fn stdio_a_file_and_a_closed_number_are_refused() {
        assert!(matches!(take_socket(1), Err(InheritError::Stdio(1))));
        let file = tempfile::tempfile().unwrap();
        // (The number may have been another test's socket, taken and closed since: refused
        // as taken then, which is refused all the same.)
        let err = take_socket(file.as_raw_fd()).unwrap_err();
        assert!(
            matches!(err, InheritError::NotSocket { .. } | InheritError::Taken(_)),
            "{err}"
        );
        // A number far above anything this test process opens.
        let err = take_socket(1_000_000).unwrap_err();
        assert!(matches!(err, InheritError::NotSocket { .. }), "{err}");
    }

    #[test]
    fn a_connected_socket_is_no_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let err = take_listener(stream.into_raw_fd()).unwrap_err();
        assert!(err.to_string().contains("not a listening"), "{err}");
    }
}
