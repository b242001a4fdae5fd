//! The `appbroker` command line: clap's definitions, and a file for each command. It stands
//! above the whole library, which it drives through `appbroker::`; nothing in the library
//! knows it. anyhow stays here, in the binary.
//!
//! - [`args`]: the options, commands and their arguments as clap reads them (the `--help`
//!   text).
//! - [`start`]: `appbroker` and `appbroker demo`: load the configuration, then `--check`, the
//!   demo's client, or the log set up and the broker supervised or run.
//! - [`config_check`]: `--check`: the configuration printed back as INI, and the verdict.
//! - [`serve`]: the broker run in this process until it stops: worker threads, runtime, ports,
//!   control socket, signals.
//! - [`demo`]: the demo's client, and the demo run beside the broker.
//! - [`ctl`]: `appbroker ctl`, and where a broker's control socket is.
//! - [`ping`]: `appbroker ping`, for keepalived.
//! - `unix` (Unix): what needs Unix: `--supervise`, `appbroker upgrade`,
//!   `--handover-version`, the control socket, the broker's side under a supervisor.
//! - `elsewhere` (not Unix): the one stand-in for each item of `unix`.

pub mod args;
mod config_check;
pub mod ctl;
mod demo;
pub mod ping;
mod serve;
pub mod start;

#[cfg(not(unix))]
pub mod elsewhere;
#[cfg(unix)]
pub mod unix;

// What needs Unix, under one name for its users: `unix` there, `elsewhere` off it.
#[cfg(not(unix))]
pub use elsewhere as platform;
#[cfg(unix)]
pub use unix as platform;
