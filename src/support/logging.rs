//! The log: one line per event, `[date time] LEVEL message key=value...`, the message first so
//! operators can grep it, then the event's fields (client, server), then its spans' (balancer).
//! Written to the console (`ConsoleLog`) and/or a file (`ConsoleFile`) rotated to `<file>.1`
//! past `ConsoleMaxSize`. Colour only on a terminal, never in a file.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::General;
use crate::support::escape;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log file could not be opened.
    #[error(
        "cannot open the log file {} (ConsoleFile): {}",
        path.display(),
        crate::support::os_error::words(error)
    )]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The level or filter is not understood.
    #[error(
        "invalid log level `{0}`: expected error, warn, info, debug or trace (or RUST_LOG directives)"
    )]
    Level(String),
}

/// Installs the process's logger. `level` (from `--log-level`) wins over `RUST_LOG`; the
/// default is `info`. The log file (`ConsoleFile`) is not opened yet: its lines wait in
/// memory until [`Log::open_file`], which the broker calls once its ports are bound, so an
/// instance that cannot start never touches the file of the one running.
pub fn init(general: &General, level: Option<&str>) -> Result<Log, LogError> {
    let filter = match level {
        Some(level) => filter(level)?,
        None => match std::env::var("RUST_LOG") {
            Ok(directives) if !directives.is_empty() => filter(&directives)?,
            _ => EnvFilter::new("info"),
        },
    };
    let date = general.console_log_date;
    let outputs = Arc::new(Outputs {
        console: general.console_log.then(Mutex::default),
        file: general
            .console_file
            .as_ref()
            .map(|path| RotatingFile::new(path, general.console_max_size)),
        date,
    });
    let console = general.console_log.then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(LineFormat { date })
            .with_ansi(io::stdout().is_terminal())
            .with_writer(Sink {
                outputs: Arc::clone(&outputs),
                to: Output::Console,
            })
    });
    let file = general.console_file.is_some().then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(LineFormat { date })
            .with_ansi(false)
            .with_writer(Sink {
                outputs: Arc::clone(&outputs),
                to: Output::File,
            })
    });
    // A second init (tests running several brokers in one process) keeps the first logger.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(console)
        .with(file)
        .try_init();
    Ok(Log { outputs })
}

/// The installed log, to open its file once the broker may write to it.
pub struct Log {
    outputs: Arc<Outputs>,
}

impl Log {
    /// Opens (appending to, or creating with mode 0640) the log file, if one is configured,
    /// and writes the lines logged since start into it.
    pub fn open_file(&self) -> Result<(), LogError> {
        let Some(file) = &self.outputs.file else {
            return Ok(());
        };
        let waited = file.open()?;
        if !waited.is_empty() {
            self.outputs.write(Output::File, &waited);
        }
        Ok(())
    }

    /// True when lines go to standard output (`ConsoleLog=1`).
    pub fn to_console(&self) -> bool {
        self.outputs.console.is_some()
    }
}

/// Writes `text` and a newline to standard error, or nothing when standard error cannot be
/// written: unlike `eprintln!`, it never panics. For the few messages that are no log line
/// (a configuration that cannot be read, a log output that fails).
pub fn to_stderr(text: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.write_all(b"\n");
}

/// What went wrong with one output: whether its last write failed, and the lines lost since.
#[derive(Debug, Default)]
struct Trouble {
    /// The error of the first failed write, while writes fail.
    failing: Option<String>,
    /// Lines lost since.
    dropped: u64,
}

impl Trouble {
    /// A failed write; returns the error's words when it starts an episode (to be said once).
    fn failed(&mut self, error: &io::Error) -> Option<String> {
        self.dropped += 1;
        if self.failing.is_some() {
            return None;
        }
        let words = crate::support::os_error::words(error);
        self.failing = Some(words.clone());
        Some(words)
    }

    /// A write that works again after failing: (lines lost, why).
    fn recovered(&mut self) -> Option<(u64, String)> {
        let why = self.failing.take()?;
        Some((std::mem::take(&mut self.dropped), why))
    }
}

/// Where a line goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Console,
    File,
}

/// The log's outputs, shared by the console and file layers so that when one fails the line
/// saying so goes to the other (or to standard error).
struct Outputs {
    /// Standard output's trouble; `None` when `ConsoleLog=0`.
    console: Option<Mutex<Trouble>>,
    file: Option<RotatingFile>,
    /// `ConsoleLogDate`, for the lines written here.
    date: bool,
}

impl Outputs {
    fn write(&self, to: Output, line: &[u8]) {
        match to {
            Output::Console => self.write_console(line),
            Output::File => {
                if let Some(file) = &self.file
                    && let Some(news) = file.write_line(line)
                {
                    let line = self.line(news.level, &news.message);
                    if news.level == Level::INFO {
                        // The file works again: it says so itself; the console too.
                        self.write_console(line.as_bytes());
                    } else if !self.console_works() {
                        to_stderr(line.trim_end());
                    } else {
                        self.write_console(line.as_bytes());
                    }
                }
            }
        }
    }

    fn console_works(&self) -> bool {
        self.console
            .as_ref()
            .is_some_and(|c| lock(c).failing.is_none())
    }

    fn write_console(&self, line: &[u8]) {
        let Some(trouble) = &self.console else {
            return;
        };
        let mut trouble = lock(trouble);
        let mut out = io::stdout().lock();
        match out.write_all(line).and_then(|()| out.flush()) {
            Ok(()) => {
                if let Some((lost, why)) = trouble.recovered() {
                    let note = self.line(
                        Level::INFO,
                        &format!(
                            "{lost} log lines could not be written to standard output ({why})"
                        ),
                    );
                    let _ = out.write_all(note.as_bytes());
                }
            }
            Err(e) => {
                if let Some(words) = trouble.failed(&e) {
                    drop(out);
                    drop(trouble);
                    let note = format!(
                        "cannot write the log to standard output: {words}; its lines are dropped{}",
                        match &self.file {
                            Some(file) => format!(" (they go on to {})", file.path.display()),
                            None => String::new(),
                        }
                    );
                    let line = self.line(Level::ERROR, &note);
                    if let Some(file) = &self.file {
                        let _ = file.write_line(line.as_bytes());
                    }
                    to_stderr(line.trim_end());
                }
            }
        }
    }

    /// A line in the log's format, for what the outputs say about themselves.
    fn line(&self, level: Level, message: &str) -> String {
        let mut line = String::new();
        if self.date {
            line.push_str(&format!(
                "{} ",
                chrono::Local::now().format("%Y-%m-%d %H:%M:%S%.3f")
            ));
        }
        line.push_str(&format!("{} {message}\n", level_name(level)));
        line
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
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
        let name = level_name(level);
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
        let mut fields = LogFields::default();
        event.record(&mut fields);
        write!(writer, "{}{}", fields.message, fields.rest)?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(formatted) = extensions.get::<FormattedFields<N>>()
                    && !formatted.is_empty()
                {
                    // A span's fields are formatted by tracing's own formatter, before this
                    // one sees them: escaped here, whole.
                    write!(
                        writer,
                        " {}",
                        escape::bounded(formatted.as_str(), escape::FIELD_MAX)
                    )?;
                }
            }
        }
        writeln!(writer)
    }
}

/// The level as a line shows it, five characters wide.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN ",
        Level::INFO => "INFO ",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// Collects an event's message apart from its other fields, each escaped and bounded
/// ([`escape`]): a value from outside (a certificate's subject, a client's target) can
/// neither break the line nor forge one, nor reach a terminal as an escape sequence.
#[derive(Default)]
struct LogFields {
    message: String,
    rest: String,
}

impl Visit for LogFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message
                .push_str(&escape::bounded(value, escape::MESSAGE_MAX));
        } else if value.contains(char::is_whitespace) {
            self.rest
                .push_str(&format!(" {}={}", field.name(), escape::quoted(value)));
        } else {
            let value = escape::bounded(value, escape::FIELD_MAX);
            self.rest.push_str(&format!(" {}={value}", field.name()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        self.record_str(field, &text);
    }
}

/// A log file that is renamed to `<file>.1` (replacing an older one) and started afresh when
/// the next line would take it past its size limit. Until [`RotatingFile::open`] its lines
/// wait in memory.
pub struct RotatingFile {
    path: PathBuf,
    max: u64,
    state: Mutex<FileState>,
}

struct FileState {
    /// `None` before it is opened, after a failed rotation, or when it cannot be written.
    file: Option<File>,
    opened: bool,
    size: u64,
    /// Lines logged before the file was opened, up to [`PENDING_MAX`] bytes.
    pending: Vec<u8>,
    trouble: Trouble,
}

/// Bytes of start-up lines kept until the file is opened: far more than a start logs.
const PENDING_MAX: usize = 1024 * 1024;

/// What the file has to say about itself, for the other outputs.
struct News {
    level: Level,
    message: String,
}

impl RotatingFile {
    /// A file at `path`, rotated past `max` bytes (0: never), not opened yet.
    pub fn new(path: &Path, max: u64) -> Self {
        RotatingFile {
            path: path.to_path_buf(),
            max,
            state: Mutex::new(FileState {
                file: None,
                opened: false,
                size: 0,
                pending: Vec::new(),
                trouble: Trouble::default(),
            }),
        }
    }

    /// Opens the file (appending); returns the lines that waited, to be written now.
    pub fn open(&self) -> Result<Vec<u8>, LogError> {
        let file = append(&self.path).map_err(|error| LogError::File {
            path: self.path.clone(),
            error,
        })?;
        let mut state = lock(&self.state);
        state.size = file.metadata().map(|m| m.len()).unwrap_or(0);
        state.file = Some(file);
        state.opened = true;
        Ok(std::mem::take(&mut state.pending))
    }

    /// Writes one line; returns what the other outputs should be told: that the file cannot
    /// be written (once, when that starts), or that it can again.
    fn write_line(&self, line: &[u8]) -> Option<News> {
        let mut state = lock(&self.state);
        if !state.opened {
            if state.pending.len() + line.len() <= PENDING_MAX {
                state.pending.extend_from_slice(line);
            }
            return None;
        }
        if self.max > 0 && state.size > 0 && state.size + line.len() as u64 > self.max {
            state.file = None;
            let mut rotated = self.path.clone().into_os_string();
            rotated.push(".1");
            match std::fs::rename(&self.path, &rotated).and_then(|()| append(&self.path)) {
                Ok(file) => {
                    state.file = Some(file);
                    state.size = 0;
                }
                Err(e) => return self.failed(&mut state, &e),
            }
        }
        let result = match state.file.as_mut() {
            Some(file) => file.write_all(line),
            None => append(&self.path).and_then(|mut f| {
                f.write_all(line)?;
                state.size = f.metadata().map(|m| m.len()).unwrap_or(0);
                state.file = Some(f);
                Ok(())
            }),
        };
        match result {
            Ok(()) => {
                state.size += line.len() as u64;
                let (lost, why) = state.trouble.recovered()?;
                let message = format!(
                    "the log file {} can be written again; {lost} lines were lost ({why})",
                    self.path.display()
                );
                if let Some(file) = state.file.as_mut() {
                    let _ = file.write_all(format!("{message}\n").as_bytes());
                }
                Some(News {
                    level: Level::INFO,
                    message,
                })
            }
            Err(e) => self.failed(&mut state, &e),
        }
    }

    fn failed(&self, state: &mut FileState, error: &io::Error) -> Option<News> {
        let words = state.trouble.failed(error)?;
        Some(News {
            level: Level::ERROR,
            message: format!(
                "cannot write the log file {}: {words}; its lines are dropped until it can be \
                 written again",
                self.path.display()
            ),
        })
    }
}

/// Opens `path` for appending, creating it readable by its owner and group only: it holds
/// client addresses.
fn append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o640);
    options.open(path)
}

/// Where a layer's lines go: one event's line is collected, then written in a single write.
struct Sink {
    outputs: Arc<Outputs>,
    to: Output,
}

/// One event's line, handed to its output in a single write.
pub struct LineWriter<'a> {
    sink: &'a Sink,
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
            self.sink.outputs.write(self.sink.to, &self.line);
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            sink: self,
            line: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines `emit` logs through [`LineFormat`], without colour or date.
    fn lines_of(emit: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                lock(&self.0).extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let layer = tracing_subscriber::fmt::layer()
            .event_format(LineFormat { date: false })
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(lock(&buffer.0).clone()).expect("UTF-8")
    }

    #[test]
    fn outside_text_cannot_break_a_line_forge_one_or_reach_a_terminal() {
        let subject = "CN=evil\nERROR FAKE LOG LINE level=ERROR\x1b[31m\u{9b}2J";
        let text = lines_of(|| {
            let span = tracing::info_span!("balancer", name = "BALANCE_HTTP\n");
            let _entered = span.enter();
            tracing::warn!(
                server = "10.0.0.5:443",
                subject = subject,
                client = "a\x1bb",
                "server refused: certificate {subject}"
            );
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\x1b') && !text.contains('\u{9b}'), "{text}");
        assert!(
            text.starts_with(
                "WARN  server refused: certificate CN=evil\\nERROR FAKE LOG LINE \
                 level=ERROR\\x1b[31m\\u{9b}2J server=10.0.0.5:443 subject=\"CN=evil\\nERROR"
            ),
            "{text}"
        );
        assert!(text.contains(" client=a\\x1bb"), "{text}");
        assert!(text.contains("BALANCE_HTTP\\n"), "{text}");
    }

    #[test]
    fn a_field_is_bounded_and_the_message_further() {
        let long = "y".repeat(5000);
        let text = lines_of(|| tracing::info!(reply = %long, "said {long}"));
        let (message, field) = text.split_once(" reply=").expect("the field");
        assert_eq!(
            message,
            format!("INFO  {}...[+909 bytes]", &format!("said {long}")[..4096])
        );
        assert_eq!(
            field.trim_end(),
            format!("{}...[+4488 bytes]", "y".repeat(512))
        );
    }

    #[test]
    fn levels_and_directives_are_accepted_and_other_words_refused() {
        for good in [
            "info",
            "DEBUG",
            "warn",
            "off",
            "appbroker=debug",
            "info,hyper=warn",
            "appbroker::net::relay=trace",
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
        let file = RotatingFile::new(&path, 25);
        file.write_line(b"waited for the open\n");
        let waited = file.open().unwrap();
        assert_eq!(waited, b"waited for the open\n");
        file.write_line(&waited);
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

    #[test]
    fn a_file_that_cannot_be_written_says_so_once_and_again_when_it_can() {
        let dir = std::env::temp_dir().join(format!("appbroker-log-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.log");
        let file = RotatingFile::new(&path, 30);
        file.open().unwrap();
        assert!(file.write_line(b"a line of twenty b\n").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
        // The next line needs a rotation, in a directory that is gone.
        let news = file.write_line(b"a line of twenty b\n").expect("told");
        assert_eq!(news.level, Level::ERROR);
        assert!(
            news.message.contains("cannot write the log file"),
            "{}",
            news.message
        );
        assert!(file.write_line(b"lost too\n").is_none(), "said once");
        std::fs::create_dir_all(&dir).unwrap();
        let news = file.write_line(b"back\n").expect("told");
        assert_eq!(news.level, Level::INFO);
        assert!(
            news.message.contains("2 lines were lost"),
            "{}",
            news.message
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("back\n") && text.contains("can be written again"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
