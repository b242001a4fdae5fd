//! The calls of the crate the compiler cannot check, each behind a safe function that holds
//! its precondition itself: taking a descriptor inherited by number (`FromRawFd`), and
//! giving the heap's free memory back to the system (glibc's `malloc_trim`). This is the one
//! module of the crate allowed `unsafe` (`unsafe_code` is denied everywhere else, and
//! `.ci/run` fails on any other `unsafe`): named for what it holds, so a search for `unsafe`
//! finds every block in one short file, each with its reason beside it.
#![allow(unsafe_code)]

#[cfg(unix)]
use std::collections::BTreeSet;
#[cfg(unix)]
use std::io;
#[cfg(unix)]
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
#[cfg(unix)]
use std::sync::Mutex;

#[cfg(unix)]
use nix::sys::socket::{SockaddrStorage, getsockname};

/// Descriptors taken so far: a number is owned once, or two owners would close it twice (the
/// second close could hit a descriptor the number was given to since).
#[cfg(unix)]
static TAKEN: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

/// Why an inherited descriptor cannot be taken.
#[cfg(unix)]
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

/// Owns socket `fd`, inherited open from the process that started this one, once it is
/// checked to name an open socket that nothing in this process owns yet.
/// [`crate::net::inherit::take_socket`] is its one caller.
#[cfg(unix)]
pub fn adopt_socket(fd: RawFd) -> Result<OwnedFd, InheritError> {
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
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
