//! Descriptors this process was handed at start by whoever started it: the listeners of a
//! supervisor (`--supervise`) or of systemd's socket activation (`LISTEN_FDS`), and the socket
//! a supervised child reports on. Taking a descriptor by its number needs `FromRawFd`, which
//! is `unsafe`: this is the one module of the crate allowed to say so (`unsafe_code` is denied
//! everywhere else, and `.ci/run` fails on any other `unsafe`). Each block checks first that
//! the number names an open socket that nothing in this process owns yet.
//!
//! The one other call the standard library lacks lives here for the same reason: giving the
//! allocator's free memory back to the system ([`give_back_free_memory`]).
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use nix::sys::socket::{SockaddrStorage, getsockname};

/// Descriptors taken so far: a number is owned once, or two owners would close it twice (the
/// second close could hit a descriptor the number was given to since).
static TAKEN: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

/// Why an inherited descriptor cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum InheritError {
    /// Standard input, output and error are not handed over as listeners.
    #[error("descriptor {0} is standard input, output or error, not a handed-over socket")]
    Stdio(RawFd),
    /// Already owned by this process.
    #[error("descriptor {0} was taken already")]
    Taken(RawFd),
    /// Not open, or not a socket.
    #[error("descriptor {fd} is not an open socket ({source})")]
    NotSocket {
        /// The number given.
        fd: RawFd,
        /// What the system said.
        source: io::Error,
    },
}

/// Takes ownership of socket `fd`, inherited open from the process that started this one; it
/// is closed on exec from now on (a child is handed what it needs on purpose).
pub fn take_socket(fd: RawFd) -> Result<OwnedFd, InheritError> {
    if (0..=2).contains(&fd) {
        return Err(InheritError::Stdio(fd));
    }
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    if taken.contains(&fd) {
        return Err(InheritError::Taken(fd));
    }
    // getsockname fails with EBADF on a closed number and ENOTSOCK on a file: only an open
    // socket passes.
    getsockname::<SockaddrStorage>(fd).map_err(|e| InheritError::NotSocket {
        fd,
        source: e.into(),
    })?;
    taken.insert(fd);
    // SAFETY: `fd` is open (getsockname just succeeded on it) and is a socket; no `OwnedFd`,
    // `File` or socket of this process owns it, because nothing in the process opens a
    // descriptor and leaves it unowned, and `TAKEN` (checked and updated under its lock)
    // makes this the one place that takes each inherited number, once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
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

/// Gives the heap's free memory back to the system (glibc's `malloc_trim`): after a wave of
/// clients has gone, the pages their connections used return to the system instead of
/// staying at the wave's peak (glibc gives back only the top of each arena on its own, and a
/// worker thread's arena is rarely free at its top). A few milliseconds for a heap of tens of
/// megabytes, during which the threads' allocations wait on their arena's lock. Nothing on
/// other C libraries.
pub fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and touches only glibc's own heap, under its own
    // locks: it may be called from any thread at any time.
    unsafe {
        nix::libc::malloc_trim(0);
    }
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
