//! `appbroker --check`: the configuration validated and printed back as INI, defaults
//! included, without binding or resolving anything; the users file of the page of actions
//! (`ADMIN_USERS`) read, as its format is checked nowhere else before a sign-in.

use std::io::Write;
use std::process::ExitCode;

use appbroker::config::{self, Config};
use appbroker::support::logging;

/// `--check`: the notices and warnings on standard error, the effective configuration on
/// standard output, and the verdict.
pub fn report(
    config: &Config,
    notices: &[config::ConfigError],
    warnings: &[config::ConfigError],
    file: &str,
) -> ExitCode {
    for notice in notices {
        logging::to_stderr(&format!("notice: {}", notice.located(file)));
    }
    for warning in warnings {
        logging::to_stderr(&format!("warning: {}", warning.located(file)));
    }
    // A closed standard output loses the printout, not the verdict (the exit code).
    let _ = std::io::stdout().write_all(config.to_ini().as_bytes());
    // The users of the page of actions: a file of another format than bcrypt's is refused
    // here, with the command that makes a good one, rather than found at the first sign-in.
    if let Err(e) = appbroker::query::operate::check(&config.general) {
        logging::to_stderr(&format!("error: {e}"));
        return ExitCode::FAILURE;
    }
    // On standard error, so standard output stays the INI above.
    let servers: usize = config.balancers.iter().map(|b| b.servers.len()).sum();
    logging::to_stderr(&format!(
        "configuration OK: {file} ({}, {})",
        config::plural(config.balancers.len(), "balancer"),
        config::plural(servers, "server")
    ));
    ExitCode::SUCCESS
}
