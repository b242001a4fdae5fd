//! The few system facilities the standard library lacks, kept in one small module so the rest
//! stays portable (a Windows build is expected to be asked for): the open-file limit, keepalive
//! knobs, a connect started in as few calls as the system allows, splice(2) through pipes, and
//! whether reading the terminal would stop the process (the demo's console).

use std::io;

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
/// when keepalive is off, and TCP_USER_TIMEOUT only when there is one: a new socket has the
/// kernel's already.
pub fn set_keepalive(
    stream: &tokio::net::TcpStream,
    keepalive: &crate::config::Keepalive,
) -> io::Result<()> {
    keepalive_on(socket2::SockRef::from(stream), keepalive, false)
}

/// Whether sockets accepted from a listener inherit its TCP_NODELAY, keepalive and
/// TCP_USER_TIMEOUT: they do on Linux (the kernel clones the listener's settings), which
/// saves six system calls per client.
pub const ACCEPTED_INHERIT_OPTIONS: bool = cfg!(target_os = "linux");

/// Sets on a listening socket what its accepted sockets should have where they inherit it:
/// TCP_NODELAY, and keepalive and TCP_USER_TIMEOUT as [`set_keepalive`] does (keepalive
/// turned off when it is off, TCP_USER_TIMEOUT set to the kernel's when there is none, so an
/// earlier setting is not inherited).
pub fn set_listener_options(
    listener: &tokio::net::TcpListener,
    keepalive: &crate::config::Keepalive,
) -> io::Result<()> {
    let socket = socket2::SockRef::from(listener);
    socket.set_tcp_nodelay(true)?;
    if !keepalive.enabled() {
        socket.set_keepalive(false)?;
    }
    keepalive_on(socket, keepalive, true)
}

/// Keepalive when it is on, and TCP_USER_TIMEOUT (Linux) as configured; `None` sets 0, the
/// kernel's default, only when `reset` (a listener may carry an earlier value).
fn keepalive_on(
    socket: socket2::SockRef<'_>,
    keepalive: &crate::config::Keepalive,
    reset: bool,
) -> io::Result<()> {
    if keepalive.enabled() {
        let params = socket2::TcpKeepalive::new()
            .with_time(keepalive.time)
            .with_interval(keepalive.interval);
        #[cfg(not(windows))]
        let params = params.with_retries(keepalive.count);
        socket.set_tcp_keepalive(&params)?;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if keepalive.user_timeout.is_some() || reset {
        socket.set_tcp_user_timeout(keepalive.user_timeout)?;
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = reset;
    Ok(())
}

/// A TCP socket for `address`'s family, non-blocking from its creation (in the one system call
/// where the kernel allows it), with its connect to `address` started: the caller waits for
/// the socket to be reported writable, then reads the outcome as [`READINESS_TELLS_CONNECTED`]
/// says.
pub fn start_connect(address: std::net::SocketAddr) -> io::Result<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    let domain = Domain::for_address(address);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let socket = Socket::new(domain, Type::STREAM.nonblocking(), None)?;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let socket = {
        let socket = Socket::new(domain, Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket
    };
    match socket.connect(&address.into()) {
        Ok(()) => {}
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EINPROGRESS as i32) => {}
        // Windows: WSAEWOULDBLOCK.
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    Ok(socket.into())
}

/// Whether a socket whose connect was started, once the reactor reports it writable with no
/// error and no hang-up, is connected, without asking the kernel for the connect's error
/// (getsockopt SO_ERROR): on Linux a failed connect is reported with EPOLLERR and EPOLLHUP
/// beside EPOLLOUT, and a socket is reported writable only once its connect is over. HAProxy
/// reads a connect's outcome from the poller's flags the same way. Elsewhere the error is asked
/// for every time.
pub const READINESS_TELLS_CONNECTED: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// Whether several sockets may listen on one address with the kernel spreading new
/// connections across them (SO_REUSEPORT, Linux): then each worker thread gets its own.
pub const REUSEPORT_SPREADS: bool = cfg!(target_os = "linux");

/// Lets several of this process's sockets listen on one address (see [`REUSEPORT_SPREADS`]).
pub fn set_reuse_port(socket: &socket2::Socket) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    socket.set_reuse_port(true)?;
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
    Ok(())
}

/// Makes a listener that is about to close for good let no new handshake begin, while those
/// already under way finish into its queue: the caller then serves the queue and closes it,
/// and no client is reset for having connected in the instant between the last accept and
/// the close. Linux: a socket filter that drops a SYN without ACK (the client retries, and
/// finds the port closed: a clean refusal). Elsewhere nothing is done.
///
/// Only for a listener no other process holds (a filter belongs to the socket, not to this
/// descriptor); [`forget_closing_filter`] takes it off one that is handed back later.
pub fn refuse_new_handshakes(listener: &tokio::net::TcpListener) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use socket2::SockFilter;
        // Classic BPF, run on the TCP header: load the flags byte; ACK set: keep; else drop.
        const LOAD_FLAGS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
        const JUMP_IF_SET: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
        const RETURN: u16 = 0x06; // BPF_RET | BPF_K
        const TCP_FLAGS_OFFSET: u32 = 13;
        const ACK: u32 = 0x10;
        let program = [
            SockFilter::new(LOAD_FLAGS, 0, 0, TCP_FLAGS_OFFSET),
            SockFilter::new(JUMP_IF_SET, 0, 1, ACK),
            SockFilter::new(RETURN, 0, 0, u32::MAX),
            SockFilter::new(RETURN, 0, 0, 0),
        ];
        socket2::SockRef::from(listener).attach_filter(&program)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = listener;
        Ok(())
    }
}

/// Takes off a listener any filter [`refuse_new_handshakes`] left on it: a listener handed to
/// this process (by systemd, say) may have been closed for good by an earlier one.
pub fn forget_closing_filter(socket: &socket2::Socket) {
    #[cfg(target_os = "linux")]
    let _ = socket.detach_filter();
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
}

/// Whether a read of standard input now would stop this whole process: standard input is
/// this process's controlling terminal and this process is not in its foreground process
/// group (a shell's `appbroker demo &`, or a job put in the background with Ctrl-Z and `bg`).
/// The terminal answers such a read with SIGTTIN, which stops every thread, and the broker's
/// clients with them. A pipe, a file, or a terminal that is not this process's controlling
/// one never stops it.
#[cfg(unix)]
pub fn input_in_background() -> bool {
    match nix::unistd::tcgetpgrp(io::stdin()) {
        Ok(foreground) => foreground != nix::unistd::getpgrp(),
        // ENOTTY: no terminal, or not the controlling one; no job control applies.
        Err(_) => false,
    }
}

/// No job control without Unix.
#[cfg(not(unix))]
pub fn input_in_background() -> bool {
    false
}

/// Waits until standard input has something to read (or its end), without reading it: a poll
/// draws no SIGTTIN, so the caller can look at [`input_in_background`] before it reads. An
/// interrupted wait (a stop and continue) returns, for the caller to look again.
#[cfg(unix)]
pub fn wait_for_input() -> io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let stdin = io::stdin();
    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::NONE) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Standard input without the standard library's buffer: what [`wait_for_input`] sees waiting
/// is then all there is to read (a line kept in that buffer would wait for the next one).
#[cfg(unix)]
pub fn raw_input() -> io::Result<Box<dyn io::Read + Send>> {
    use std::os::fd::AsFd;
    let fd = io::stdin().as_fd().try_clone_to_owned()?;
    Ok(Box::new(std::fs::File::from(fd)))
}

/// Standard input, as the standard library reads it.
#[cfg(not(unix))]
pub fn raw_input() -> io::Result<Box<dyn io::Read + Send>> {
    Ok(Box::new(io::stdin()))
}

/// Without Unix, the read itself waits.
#[cfg(not(unix))]
pub fn wait_for_input() -> io::Result<()> {
    Ok(())
}

#[cfg(target_os = "linux")]
pub use pipes::{Pipe, PipePool};

/// Zero-copy relaying with splice(2) through pipes (Linux): bytes go from one socket into a
/// pipe and from the pipe into the other socket without being copied to user space.
#[cfg(target_os = "linux")]
mod pipes {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use nix::fcntl::{OFlag, SpliceFFlags, splice};

    /// Most bytes one splice moves, and the pipe size asked for (F_SETPIPE_SZ): the default
    /// 64 KiB pipe moved less through the broker, and a larger one than this less again (the
    /// figures, and how they were made: docs/benchmarks.md, "Figures behind the code").
    const PIPE_CAPACITY: usize = 256 * 1024;

    /// A pipe and the bytes waiting in it.
    #[derive(Debug)]
    pub struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
        /// Bytes spliced in and not yet out.
        pub pending: usize,
    }

    impl Pipe {
        fn new() -> io::Result<Pipe> {
            let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
            let _ = nix::fcntl::fcntl(
                &write,
                nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_CAPACITY as i32),
            );
            Ok(Pipe {
                read,
                write,
                pending: 0,
            })
        }

        /// Moves what `from` has into the pipe, at most `max` bytes and the pipe's capacity (a
        /// body's rest: the bytes after it are the next message's); 0 at end of stream.
        pub fn fill_from_at_most(&mut self, from: impl AsFd, max: usize) -> io::Result<usize> {
            let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
            let n = splice(from, None, &self.write, None, max.min(PIPE_CAPACITY), flags)?;
            self.pending += n;
            Ok(n)
        }

        /// Moves bytes from the pipe into `to`; returns how many.
        pub fn drain_to(&mut self, to: impl AsFd) -> io::Result<usize> {
            let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
            let n = splice(&self.read, None, to, None, self.pending, flags)?;
            self.pending -= n;
            Ok(n)
        }
    }

    /// Pipes are taken from here when a connection starts moving bulk data, and given back
    /// when it ends. Bounded, because each pipe costs two descriptors and 256 KiB of kernel
    /// memory, and a non-root user's pipe memory is limited (`fs.pipe-user-pages-soft`,
    /// 64 MiB by default); connections beyond the bound keep the buffered copy.
    #[derive(Debug)]
    pub struct PipePool {
        free: Mutex<Vec<Pipe>>,
        /// Pipes in existence, in use or free.
        live: AtomicUsize,
        max: usize,
    }

    /// Empty pipes kept for reuse; more are closed, to give their descriptors back.
    const KEEP_FREE: usize = 64;

    impl PipePool {
        /// A pool of at most `max` pipes.
        pub const fn new(max: usize) -> Self {
            PipePool {
                free: Mutex::new(Vec::new()),
                live: AtomicUsize::new(0),
                max,
            }
        }

        /// A pipe, if the bound allows one and the system gives it.
        pub fn take(&self) -> Option<Pipe> {
            if let Some(pipe) = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() {
                return Some(pipe);
            }
            if self.live.fetch_add(1, Relaxed) >= self.max {
                self.live.fetch_sub(1, Relaxed);
                return None;
            }
            match Pipe::new() {
                Ok(pipe) => Some(pipe),
                Err(_) => {
                    // Out of descriptors or pipe memory: the buffered copy will do.
                    self.live.fetch_sub(1, Relaxed);
                    None
                }
            }
        }

        /// Gives a pipe back: kept when empty and few are free, closed otherwise.
        pub fn give(&self, pipe: Pipe) {
            if pipe.pending == 0 {
                let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                if free.len() < KEEP_FREE {
                    free.push(pipe);
                    return;
                }
            }
            self.live.fetch_sub(1, Relaxed);
        }
    }
}
