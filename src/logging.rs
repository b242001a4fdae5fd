//! The log: one line per event, `[date time] LEVEL message key=value...`, the message first so
//! operators can grep it, then the event's fields (client, server), then its spans' (balancer).
//! Written to the console (`ConsoleLog`) and/or a file (`ConsoleFile`) rotated to `<file>.1`
//! past `ConsoleMaxSize`. Colour only on a terminal, never in a file.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::General;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log file could not be opened.
    #[error("cannot open the log file {} (ConsoleFile): {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The level or filter is not understood.
    #[error(
        "invalid log level `{0}`: expected error, warn, info, debug or trace (or RUST_LOG directives)"
    )]
    Level(String),
}

/// Installs the process's logger. `level` (from `--log-level`) wins over `RUST_LOG`; the
/// default is `info`.
pub fn init(general: &General, level: Option<&str>) -> Result<(), LogError> {
    let filter = match level {
        Some(level) => filter(level)?,
        None => match std::env::var("RUST_LOG") {
            Ok(directives) if !directives.is_empty() => filter(&directives)?,
            _ => EnvFilter::new("info"),
        },
    };
    let date = general.console_log_date;
    let console = general.console_log.then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(LineFormat { date })
            .with_ansi(io::stdout().is_terminal())
            .with_writer(io::stdout)
    });
    let file = match &general.console_file {
        None => None,
        Some(path) => Some(
            tracing_subscriber::fmt::layer()
                .event_format(LineFormat { date })
                .with_ansi(false)
                .with_writer(RotatingFile::open(path, general.console_max_size)?),
        ),
    };
    // A second init (tests running several brokers in one process) keeps the first logger.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(console)
        .with(file)
        .try_init();
    Ok(())
}

/// True when the logging keys of `[General]` differ: the logger is set up once, at start.
pub fn settings_differ(a: &General, b: &General) -> bool {
    (
        a.console_log,
        &a.console_file,
        a.console_max_size,
        a.console_log_date,
    ) != (
        b.console_log,
        &b.console_file,
        b.console_max_size,
        b.console_log_date,
    )
}

/// A level (`info`) or `RUST_LOG` directives (`appbroker=debug,hyper=warn`). A bare word that
/// is no level is refused: EnvFilter would take it for a module name and silence everything.
fn filter(directives: &str) -> Result<EnvFilter, LogError> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let refused = || LogError::Level(directives.to_string());
    for directive in directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let bare = !directive.contains(['=', ':', '[']);
        if bare && !LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
            return Err(refused());
        }
    }
    EnvFilter::try_new(directives).map_err(|_| refused())
}

/// The line format: message first.
struct LineFormat {
    /// `ConsoleLogDate`: begin with the local date and time.
    date: bool,
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.date {
            write!(
                writer,
                "{} ",
                chrono::Local::now().format("%Y-%m-%d %H:%M:%S%.3f")
            )?;
        }
        let level = *event.metadata().level();
        let name = match level {
            Level::ERROR => "ERROR",
            Level::WARN => "WARN ",
            Level::INFO => "INFO ",
            Level::DEBUG => "DEBUG",
            Level::TRACE => "TRACE",
        };
        if writer.has_ansi_escapes() {
            let colour = match level {
                Level::ERROR => "31",
                Level::WARN => "33",
                Level::INFO => "32",
                _ => "34",
            };
            write!(writer, "\x1b[{colour}m{name}\x1b[0m ")?;
        } else {
            write!(writer, "{name} ")?;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        write!(writer, "{}{}", fields.message, fields.rest)?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(formatted) = extensions.get::<FormattedFields<N>>()
                    && !formatted.is_empty()
                {
                    write!(writer, " {formatted}")?;
                }
            }
        }
        writeln!(writer)
    }
}

/// Collects an event's message apart from its other fields.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else if value.contains(char::is_whitespace) {
            self.rest.push_str(&format!(" {}={value:?}", field.name()));
        } else {
            self.rest.push_str(&format!(" {}={value}", field.name()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message.push_str(&format!("{value:?}"));
        } else {
            let text = format!("{value:?}");
            self.record_str(field, &text);
        }
    }
}

/// A log file that is renamed to `<file>.1` (replacing an older one) and started afresh when
/// the next line would take it past its size limit.
pub struct RotatingFile {
    path: PathBuf,
    max: u64,
    state: Mutex<FileState>,
}

struct FileState {
    file: Option<File>,
    size: u64,
    /// A write error was already reported on standard error (once is enough).
    reported: bool,
}

impl RotatingFile {
    /// Opens (appending to) `path`; `max` bytes before rotation, 0 for never.
    pub fn open(path: &Path, max: u64) -> Result<Self, LogError> {
        let file = append(path).map_err(|source| LogError::File {
            path: path.to_path_buf(),
            source,
        })?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(RotatingFile {
            path: path.to_path_buf(),
            max,
            state: Mutex::new(FileState {
                file: Some(file),
                size,
                reported: false,
            }),
        })
    }

    fn write_line(&self, line: &[u8]) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.max > 0 && state.size > 0 && state.size + line.len() as u64 > self.max {
            state.file = None;
            let mut rotated = self.path.clone().into_os_string();
            rotated.push(".1");
            let result = std::fs::rename(&self.path, &rotated).and_then(|()| append(&self.path));
            match result {
                Ok(file) => {
                    state.file = Some(file);
                    state.size = 0;
                }
                Err(e) => report(&mut state, &self.path, &e),
            }
        }
        let result = match state.file.as_mut() {
            Some(file) => file.write_all(line),
            None => append(&self.path).and_then(|mut f| {
                f.write_all(line)?;
                state.file = Some(f);
                Ok(())
            }),
        };
        match result {
            Ok(()) => state.size += line.len() as u64,
            Err(e) => report(&mut state, &self.path, &e),
        }
    }
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn report(state: &mut FileState, path: &Path, error: &io::Error) {
    if !state.reported {
        state.reported = true;
        eprintln!(
            "appbroker: cannot write the log file {}: {error}",
            path.display()
        );
    }
}

/// One event's line, handed to the file in a single write.
pub struct LineWriter<'a> {
    file: &'a RotatingFile,
    line: Vec<u8>,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter<'_> {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.file.write_line(&self.line);
        }
    }
}

impl<'a> MakeWriter<'a> for RotatingFile {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            file: self,
            line: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives_are_accepted_and_other_words_refused() {
        for good in [
            "info",
            "DEBUG",
            "warn",
            "off",
            "appbroker=debug",
            "info,hyper=warn",
            "appbroker::relay=trace",
        ] {
            assert!(filter(good).is_ok(), "{good}");
        }
        for bad in ["verbose", "warning", "info,loud", ""] {
            if !bad.is_empty() {
                assert!(filter(bad).is_err(), "{bad}");
            }
        }
    }

    #[test]
    fn the_file_is_rotated_past_its_size() {
        let dir = std::env::temp_dir().join(format!("appbroker-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.log");
        let _ = std::fs::remove_file(&path);
        let file = RotatingFile::open(&path, 25).unwrap();
        file.write_line(b"first line, 20 bytes\n");
        file.write_line(b"second line\n");
        file.write_line(b"third\n");
        assert_eq!(
            std::fs::read_to_string(dir.join("broker.log.1")).unwrap(),
            "first line, 20 bytes\n"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "second line\nthird\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
