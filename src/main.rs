//! The `appbroker` command: parse the command line and hand it to the command it names; [`cli`]
//! does the rest (load the configuration, set up logging, bind, run until a signal says stop).
//!
//! - [`cli`]: the command line's definitions, and a file for each command.
// Nothing here may panic because an output is closed: no print macros.
#![deny(clippy::print_stdout, clippy::print_stderr)]
// Functions short enough to read at once (70 lines: clippy.toml).
#![warn(clippy::too_many_lines)]

mod cli;

use std::process::ExitCode;

use clap::Parser;
use cli::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(unix)]
    if cli.handover_version {
        return cli::unix::handover_version();
    }
    match &cli.command {
        Some(Command::Ctl(args)) => cli::ctl::run(&cli, args),
        Some(Command::Ping { timeout }) => cli::ping::run(&cli, *timeout),
        Some(Command::Upgrade) => cli::platform::upgrade(&cli),
        Some(Command::Demo(args)) => cli::start::run(&cli, Some(args)),
        None => cli::start::run(&cli, None),
    }
}
