//! The broker's own commands (`appbroker`, `appbroker demo`): the configuration loaded, then
//! `--check` answered, or the demo's client run, or the log set up and the broker supervised
//! or run; and the exit code its end comes to.

use std::path::Path;
use std::process::ExitCode;

use appbroker::config::{Config, LoadError, Loaded};
use appbroker::demo;
use appbroker::support::logging;
use tracing::{info, warn};

use super::args::{Cli, DemoArgs};
use super::demo::DemoStart;

/// Runs the broker of `--config`, or the demo (`demo`).
pub fn run(cli: &Cli, demo: Option<&DemoArgs>) -> ExitCode {
    let Loaded {
        mut config,
        notices,
        warnings,
    } = match load(cli, demo) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let file = config.source.display().to_string();
    if cli.check {
        return super::config_check::report(&config, &notices, &warnings, &file);
    }
    if let Some(args) = demo {
        if let Some(address) = args.client {
            return super::demo::client(&config, args, address);
        }
        // Every balancer on the asked address, the file's own notwithstanding.
        for balancer in &mut config.balancers {
            balancer.listen.set_ip(args.listen);
        }
        // Ctrl-C stops the demo at once, not after a broker's drain.
        demo::stop_at_once(&mut config.general);
    }
    let log = match logging::init(&config.general, cli.log_level.as_deref()) {
        Ok(log) => log,
        Err(e) => {
            logging::to_stderr(&format!("appbroker: {e}"));
            return ExitCode::from(2);
        }
    };
    info!(
        "appbroker {} starting with {file}",
        env!("CARGO_PKG_VERSION")
    );
    for problem in notices.iter().chain(&warnings) {
        warn!("{}", problem.located(&file));
    }
    #[cfg(unix)]
    if cli.supervise && demo.is_none() {
        return super::unix::supervise(config, &log);
    }
    if std::env::var_os("LISTEN_FDS").is_some() {
        warn!(
            "systemd passed listening sockets (LISTEN_FDS), which only the supervised mode takes: \
             add --supervise to ExecStart; binding the ports as usual"
        );
    }
    let demo = demo.map(|args| DemoStart::new(cli, args));
    ended(super::serve::run(config, demo, &log), &log)
}

/// The configuration: `--config`'s, the built-in example for the demo without one, else
/// `appserver.ini`; or exit 2, having said why.
fn load(cli: &Cli, demo: Option<&DemoArgs>) -> Result<Loaded, ExitCode> {
    let loaded = match (&cli.config, demo) {
        (Some(path), _) => Config::from_path(path),
        (None, Some(_)) => {
            Config::from_text(demo::EXAMPLE, Path::new("appserver.ini.example (built in)"))
        }
        (None, None) => Config::from_path(Path::new("appserver.ini")),
    };
    loaded.map_err(|e| {
        logging::to_stderr(&format!("appbroker: {}", e.report()));
        if let LoadError::Read { source, .. } = &e
            && source.kind() == std::io::ErrorKind::NotFound
        {
            logging::to_stderr(
                "appbroker: name the configuration file with --config PATH (start from \
                 appserver.ini.example), or run `appbroker demo` to see the broker at work \
                 with stand-in servers",
            );
        }
        ExitCode::from(2)
    })
}

/// The exit code of a run that ended with `result`: 0, 2 when the log could not be opened,
/// else 1; the error said on the log, and on standard error when the log is not there.
fn ended(result: anyhow::Result<()>, log: &logging::Log) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            if !log.to_console() {
                // The log file may not be open (or not the place anyone looks at a start).
                logging::to_stderr(&format!("appbroker: {e:#}"));
            }
            match e.downcast_ref::<logging::LogError>() {
                Some(_) => ExitCode::from(2),
                None => ExitCode::from(1),
            }
        }
    }
}
