//! What the whole process shares, whatever it serves: its clocks, its log and the manners of
//! the log's lines (once per episode, OS errors in an operator's words), and its shutdown.
//! Everything above the configuration may use these; they import only the configuration
//! (the log's settings).
//!
//! - [`budget`]: a memory budget for work a peer paces (`HTTP_HEAD_MEMORY`), the oldest
//!   claims evicted first.
//! - [`clock`]: time as the broker counts it (monotonic milliseconds for deadlines, the
//!   wall-clock times operators read).
//! - [`logging`]: the log line format, on the console and in a rotated file.
//! - [`escape`]: text from outside made safe for a log line or a command's variable
//!   (control characters written out, the length bounded).
//! - [`throttle`]: log-rate limiting: a repeated fault is told once per episode.
//! - [`os_error`]: what an OS error means to an operator (words, errno name, Windows code, what
//!   it points at).
//! - [`shutdown`]: the shutdown and draining state, and the binary's signal handlers.
//! - [`unsafe_calls`]: the one module allowed `unsafe`: taking an inherited descriptor by
//!   number, and giving the heap's free memory back to the system.

pub mod budget;
pub mod clock;
pub mod escape;
pub mod logging;
pub mod os_error;
pub mod shutdown;
pub mod throttle;
pub mod unsafe_calls;
