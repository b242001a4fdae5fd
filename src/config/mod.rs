//! `appserver.ini` to a validated [`Config`]: typed ports, durations and addresses, TOTVS keys
//! accepted with notices, and every error naming file, line, section and key.
//!
//! Reading goes in three steps: [`ini::scan`] turns text into sections and entries with line
//! numbers, [`Config::from_text`] validates them into typed values (collecting every error
//! rather than stopping at the first), and [`Config::to_ini`] prints the effective
//! configuration back, which parses to the same [`Config`].

mod ini;
mod render;
mod value;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ini::{Entry, Section};
pub use render::{EffectiveSection, setting_changes};
pub use value::{Cidr, Host, ServerId, show_duration, show_escaped};

/// The whole configuration of one broker process.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from, for messages and the status pages.
    pub source: PathBuf,
    /// Process-wide settings from `[General]`.
    pub general: General,
    /// One entry per `[BALANCE_*]` section, in file order.
    pub balancers: Vec<BalancerConfig>,
    /// Where each effective value came from, so printouts can mark defaults.
    pub origins: Origins,
}

impl Config {
    /// True when both hold the same settings, wherever each value came from.
    pub fn same_settings(&self, other: &Config) -> bool {
        self.general == other.general && self.balancers == other.balancers
    }
}

/// Process-wide settings (`[General]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct General {
    /// `ConsoleLog`: write the log to standard output.
    pub console_log: bool,
    /// `ConsoleFile`: also write the log to this file.
    pub console_file: Option<PathBuf>,
    /// `ConsoleMaxSize`: rotate the log file to `<file>.1` past this many bytes (0: never).
    pub console_max_size: u64,
    /// `ConsoleLogDate`: start each log line with the local date and time.
    pub console_log_date: bool,
    /// `SHUTDOWN_GRACE`: after SIGTERM, keep serving this long while PING reports draining.
    pub shutdown_grace: Duration,
    /// `SHUTDOWN_TIMEOUT`: after the listeners close, how long connections may take to finish.
    pub shutdown_timeout: Duration,
    /// `LANGUAGE`: labels of the status pages.
    pub language: Language,
    /// `WORKERS`: threads serving connections; 0 for one per CPU.
    pub workers: u32,
    /// `DNS_MAX_LOOKUPS`: name lookups in flight at once in the process.
    pub dns_max_lookups: u32,
}

/// `LANGUAGE`: the language of the status pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `en`
    English,
    /// `pt-BR`, with the TOTVS page's labels.
    Portuguese,
}

impl Language {
    /// The value as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::English => "en",
            Language::Portuguese => "pt-BR",
        }
    }
}

/// Which TCP broker a `[BALANCE_*]` section configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BalancerKind {
    /// `[BALANCE_SMART_CLIENT_DESKTOP]`: SmartClient Desktop connections.
    SmartClientDesktop,
    /// `[BALANCE_WEB_SERVICES]`: stateless web-service callers.
    WebServices,
}

impl BalancerKind {
    /// The section name as TOTVS writes it.
    pub fn section(self) -> &'static str {
        match self {
            BalancerKind::SmartClientDesktop => "BALANCE_SMART_CLIENT_DESKTOP",
            BalancerKind::WebServices => "BALANCE_WEB_SERVICES",
        }
    }

    fn from_section(name: &str) -> Option<Self> {
        match name {
            "BALANCE_SMART_CLIENT_DESKTOP" => Some(BalancerKind::SmartClientDesktop),
            "BALANCE_WEB_SERVICES" => Some(BalancerKind::WebServices),
            _ => None,
        }
    }
}

impl fmt::Display for BalancerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.section())
    }
}

/// One TCP balancer: a listener and the pool of servers it forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerConfig {
    /// Which section this is.
    pub kind: BalancerKind,
    /// `LOCAL_SERVER_ADDRESS` and `LOCAL_SERVER_PORT`.
    pub listen: SocketAddr,
    /// `REMOTE_SERVER_xx`, in file order (the order ties are broken in).
    pub servers: Vec<ServerConfig>,
    /// `SORT_METHOD`.
    pub sort_method: SortMethod,
    /// `MONITORING_TYPE`.
    pub monitoring: Monitoring,
    /// `MONITOR_INTERVAL`: time between monitor rounds.
    pub monitor_interval: Duration,
    /// `QUARANTINE_TIME`: how long a failed server gets no new clients.
    pub quarantine_time: Duration,
    /// `CONNECT_TIMEOUT`: bound on each TCP connect, by clients and by the monitor.
    pub connect_timeout: Duration,
    /// `MAX_ATTEMPTS`: servers tried for one client before it is closed.
    pub max_attempts: u32,
    /// `MAX_CONNECTIONS`: simultaneous clients; more are accepted and closed at once.
    pub max_connections: u32,
    /// `LOG_CONNECTIONS`: one info line per finished connection.
    pub log_connections: bool,
    /// `QUERY_*`: the `/TOTVS_BROKER_QUERY` interface on this balancer's port.
    pub query: QuerySettings,
    /// `KEEPALIVE_*`: TCP keepalive on client and server sockets.
    pub keepalive: Keepalive,
    /// `IDLE_TIMEOUT`: close a connection with no bytes either way for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// `MONITOR_FALL`: consecutive failed checks that put a server in quarantine.
    pub monitor_fall: u32,
    /// `MONITOR_RISE`: consecutive passed checks that release a quarantined server.
    pub monitor_rise: u32,
    /// `DNS_CACHE_TIME`: how long a server name's addresses are used before it is looked up
    /// again (zero: at every connect).
    pub dns_cache_time: Duration,
}

/// TCP keepalive, so a vanished peer is noticed in minutes rather than the kernel's two hours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// `KEEPALIVE_TIME`: idle time before the first probe; zero turns keepalive off.
    pub time: Duration,
    /// `KEEPALIVE_INTERVAL`: time between unanswered probes.
    pub interval: Duration,
    /// `KEEPALIVE_COUNT`: unanswered probes before the connection is dropped.
    pub count: u32,
    /// `TCP_USER_TIMEOUT` (Linux): how long sent data may stay unacknowledged, or a peer keep
    /// its receive window shut, before the connection is dropped; `None` leaves the kernel's
    /// default (about 15 minutes of retransmissions, no limit on a shut window).
    pub user_timeout: Option<Duration>,
}

impl Keepalive {
    /// True unless `KEEPALIVE_TIME=0`.
    pub fn enabled(&self) -> bool {
        !self.time.is_zero()
    }

    /// How long a dead peer goes unnoticed at most: time + interval x count. Also the default
    /// of TCP_USER_TIMEOUT, so unacknowledged data does not wait the kernel's 15 minutes either.
    pub fn dead_after(&self) -> Duration {
        self.time + self.interval * self.count
    }
}

/// How the balancer's port answers `/TOTVS_BROKER_QUERY` requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuerySettings {
    /// `QUERY_ENABLED`: answer queries; when off, such connections are proxied like any other.
    pub enabled: bool,
    /// `QUERY_ALLOW`: who may query; by default everyone (the TOTVS behaviour).
    pub allow: Vec<Cidr>,
    /// `QUERY_MAX_CONNECTIONS`: query connections at once, apart from `MAX_CONNECTIONS`.
    pub max_connections: u32,
    /// `QUERY_SNIFF_TIMEOUT`: how long a client that has sent nothing is waited for before it
    /// is taken for a server-first protocol client (its server's bytes are held that long).
    pub sniff_timeout: Duration,
}

/// One `REMOTE_SERVER_xx = host port [weight]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The two-character id after `REMOTE_SERVER_`.
    pub id: ServerId,
    /// Address or name, resolved at each connect.
    pub host: Host,
    /// TCP port.
    pub port: u16,
    /// Share of new clients; 0 drains the server.
    pub weight: u32,
}

impl ServerConfig {
    /// `host:port` with the host as configured (IPv6 in brackets), as the status page shows it.
    pub fn address(&self) -> String {
        self.host.with_port(self.port)
    }
}

/// `SORT_METHOD`: how the next server is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortMethod {
    /// Fewest active connections per unit of weight.
    Connection,
    /// Smooth weighted round robin, as nginx does it.
    RoundRobin,
}

impl SortMethod {
    /// The value as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            SortMethod::Connection => "CONNECTION",
            SortMethod::RoundRobin => "ROUND_ROBIN",
        }
    }
}

/// `MONITORING_TYPE`: how the monitor checks each server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Monitoring {
    /// A TCP connect to every server each round.
    Connection,
    /// A TCP connect, then `send` written and a reply starting with `expect` awaited, all
    /// within `CONNECT_TIMEOUT`: sees an application that accepts but hangs.
    SendExpect {
        /// `MONITOR_SEND`: bytes to write (may be empty: wait for a banner).
        send: Vec<u8>,
        /// `MONITOR_EXPECT`: the reply must start with these bytes.
        expect: Vec<u8>,
    },
    /// No checks; quarantines end only when their time is up.
    Disabled,
}

impl Monitoring {
    /// The value as written in the file.
    pub fn as_str(&self) -> &'static str {
        match self {
            Monitoring::Connection => "CONNECTION",
            Monitoring::SendExpect { .. } => "SEND_EXPECT",
            Monitoring::Disabled => "DISABLED",
        }
    }
}

/// Where an effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Set in its own section, at this line.
    Section(usize),
    /// Inherited from `[General]`, set at this line.
    General(usize),
    /// Not set anywhere: the built-in default.
    Default,
}

/// Origin of every effective value, keyed by (section, key), both upper case.
#[derive(Debug, Clone, Default)]
pub struct Origins(BTreeMap<(String, String), Origin>);

impl Origins {
    /// Where `key` of `section` came from (`Default` when never recorded).
    pub fn get(&self, section: &str, key: &str) -> Origin {
        self.0
            .get(&(section.to_string(), key.to_string()))
            .copied()
            .unwrap_or(Origin::Default)
    }

    fn set(&mut self, section: &str, key: &str, origin: Origin) {
        self.0
            .insert((section.to_string(), key.to_string()), origin);
    }
}

/// A configuration error, naming where it is and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line, when the error belongs to one.
    pub line: Option<usize>,
    /// The section as written.
    pub section: Option<String>,
    /// The key as written.
    pub key: Option<String>,
    /// What is wrong and what is expected.
    pub message: String,
}

/// Something accepted but worth telling the operator (a TOTVS key appbroker does not use, ...).
pub type Notice = ConfigError;

impl ConfigError {
    fn new(line: usize, section: &str, key: Option<&str>, message: impl Into<String>) -> Self {
        ConfigError {
            line: Some(line),
            section: Some(section.to_string()),
            key: key.map(str::to_string),
            message: message.into(),
        }
    }

    /// Formats the error with the file name first, as `file:line: [SECTION] KEY: message`.
    pub fn located(&self, file: &str) -> String {
        let mut out = file.to_string();
        if let Some(line) = self.line {
            out.push_str(&format!(":{line}"));
        }
        out.push_str(": ");
        if let Some(section) = &self.section {
            out.push_str(&format!("[{section}] "));
        }
        if let Some(key) = &self.key {
            out.push_str(&format!("{key}: "));
        }
        out.push_str(&self.message);
        out
    }
}

/// The largest configuration file read: a real `appserver.ini` is a few KiB, and a path that
/// names something else (a log, a disk image) must not fill the broker's memory.
pub const MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// Errors printed at most; the rest are counted. A file that is not an ini at all gives an
/// error per line, and a million lines of them help no one.
pub const MAX_ERRORS_SHOWN: usize = 100;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read at all.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path names something other than a regular file (a FIFO, a device, a directory).
    #[error(
        "cannot read {}: it is {what}, not a regular file; give the path of the appserver.ini \
         itself (a symbolic link to one is fine)",
        path.display()
    )]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is, in words (`a FIFO (named pipe)`).
        what: &'static str,
    },
    /// The file is larger than [`MAX_FILE_SIZE`].
    #[error(
        "cannot read {}: it is {} bytes, more than the {} MiB a configuration file may have; is \
         it the right file?",
        path.display(),
        size,
        MAX_FILE_SIZE / (1024 * 1024)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes (at least what was read).
        size: u64,
    },
    /// The file was read and holds errors.
    #[error("{} in {}", plural(*total, "error"), path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The first [`MAX_ERRORS_SHOWN`] errors, in line order.
        errors: Vec<ConfigError>,
        /// How many errors there are in all.
        total: usize,
    },
}

impl LoadError {
    /// Every message, one per line, each starting with the file name: the first
    /// [`MAX_ERRORS_SHOWN`] of a file with errors, then how many more there are.
    pub fn report(&self) -> String {
        match self {
            LoadError::Invalid {
                path,
                errors,
                total,
            } => {
                let file = path.display().to_string();
                let mut out = format!("{self}:");
                for error in errors {
                    out.push_str("\n  ");
                    out.push_str(&error.located(&file));
                }
                let more = total.saturating_sub(errors.len());
                if more > 0 {
                    let noun = if more == 1 { "error" } else { "errors" };
                    out.push_str(&format!(
                        "\n  ... and {more} more {noun} (the first {MAX_ERRORS_SHOWN} are shown; \
                         is it an appserver.ini?)"
                    ));
                }
                out
            }
            _ => self.to_string(),
        }
    }
}

/// A loaded configuration and what the operator should be told about it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The validated configuration.
    pub config: Config,
    /// Notices to log once at start (accepted TOTVS keys, substitutions, ignored sections).
    pub notices: Vec<Notice>,
}

/// `n thing` or `n things`.
pub fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("{n} {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// Keys of a balancer section (besides `REMOTE_SERVER_xx`); all but `LOCAL_SERVER_*` may stand
/// in `[General]` as the default for every balancer.
const BALANCER_KEYS: &[&str] = &[
    "LOCAL_SERVER_PORT",
    "LOCAL_SERVER_ADDRESS",
    "SORT_METHOD",
    "MONITORING_TYPE",
    "MONITOR_INTERVAL",
    "QUARANTINE_TIME",
    "CONNECT_TIMEOUT",
    "MAX_ATTEMPTS",
    "MAX_CONNECTIONS",
    "LOG_CONNECTIONS",
    "QUERY_ENABLED",
    "QUERY_ALLOW",
    "QUERY_MAX_CONNECTIONS",
    "QUERY_SNIFF_TIMEOUT",
    "KEEPALIVE_TIME",
    "KEEPALIVE_INTERVAL",
    "KEEPALIVE_COUNT",
    "TCP_USER_TIMEOUT",
    "IDLE_TIMEOUT",
    "MONITOR_SEND",
    "MONITOR_EXPECT",
    "MONITOR_FALL",
    "MONITOR_RISE",
    "DNS_CACHE_TIME",
];

/// `[General]` keys of appbroker's own.
const GENERAL_KEYS: &[&str] = &[
    "CONSOLELOG",
    "CONSOLEFILE",
    "CONSOLEMAXSIZE",
    "CONSOLELOGDATE",
    "SHUTDOWN_GRACE",
    "SHUTDOWN_TIMEOUT",
    "LANGUAGE",
    "WORKERS",
    "DNS_MAX_LOOKUPS",
];

/// Keys TOTVS broker files carry that appbroker accepts without using, and what it does instead.
const TOTVS_UNUSED_KEYS: &[(&str, &str)] = &[
    (
        "SERVICE_NAME",
        "run appbroker as a systemd service instead (docs/operations.md)",
    ),
    (
        "SERVICE_DISPLAY_NAME",
        "run appbroker as a systemd service instead (docs/operations.md)",
    ),
    (
        "STANDBY_TIME",
        "a client's server connection ends when the client's does (no SmartClient standby)",
    ),
    (
        "SESSION_TIMEOUT",
        "it belongs to the HTTP broker, which appbroker does not run yet",
    ),
    (
        "PROTHEUS_MONITOR_EMBEDDED",
        "TOTVS Monitor connects to the AppServers directly",
    ),
    (
        "PROTHEUS_MONITOR_ADDRESS",
        "TOTVS Monitor connects to the AppServers directly",
    ),
    (
        "PROTHEUS_MONITOR_PORT",
        "TOTVS Monitor connects to the AppServers directly",
    ),
    (
        "SSL_ENCRYPT_UPSTREAM",
        "bytes are relayed as they are; TLS between client and server passes through",
    ),
];

/// Unknown keys named in one notice at most; the rest are counted.
const MAX_NAMED: usize = 20;

const DEFAULT_LISTEN_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
const MAX_SERVERS: usize = 36 * 36;

/// The longest keepalive time or interval Linux accepts (`MAX_TCP_KEEPIDLE`).
const KEEPALIVE_MAX: Duration = Duration::from_secs(32_767);

impl Config {
    /// Reads and validates a file (UTF-8, or Windows-1252 when it is not valid UTF-8): a
    /// regular file (or a symbolic link to one) of at most [`MAX_FILE_SIZE`]. The read
    /// blocks (a file on a hung network share would block it for long), so a running
    /// broker calls this off its control thread.
    pub fn from_path(path: &Path) -> Result<Loaded, LoadError> {
        Config::from_text(&decode(&read_file(path)?), path)
    }

    /// Validates configuration text; `path` is only used to name the file in messages.
    pub fn from_text(text: &str, path: &Path) -> Result<Loaded, LoadError> {
        let scanned = ini::scan(text, MAX_ERRORS_SHOWN);
        let sections = scanned.sections;
        let mut v = Validator::default();
        v.errors.uncounted(scanned.more_errors);
        let error_of = |e: ini::SyntaxError| ConfigError {
            line: Some(e.line),
            section: e.section,
            key: None,
            message: e.message,
        };
        for e in scanned.errors {
            v.errors.push(error_of(e));
        }
        if let Some(e) = scanned.truncated {
            v.errors.pin(error_of(e));
        }

        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut general: Option<&Section> = None;
        let mut balancer_sections = Vec::new();
        let mut ignored = Vec::new();
        for section in &sections {
            if let Some(first) = seen.insert(section.name.clone(), section.line) {
                v.errors.push(ConfigError::new(
                    section.line,
                    &section.written,
                    None,
                    format!(
                        "the section appears twice (first at line {first}); merge them into one"
                    ),
                ));
                continue;
            }
            match section.name.as_str() {
                "GENERAL" => general = Some(section),
                "BALANCE_HTTP" | "BALANCE_HTML" => v.errors.push(ConfigError::new(
                    section.line,
                    &section.written,
                    None,
                    "the HTTP broker (session affinity by cookie) is not available in appbroker yet; \
                     balance HTTP traffic as plain TCP with [BALANCE_WEB_SERVICES], or remove the section",
                )),
                name => match BalancerKind::from_section(name) {
                    Some(kind) => balancer_sections.push((kind, section)),
                    None if name.starts_with("BALANCE_") => {
                        let hint = suggest(name, &["BALANCE_SMART_CLIENT_DESKTOP", "BALANCE_WEB_SERVICES"])
                            .map(|s| format!("did you mean [{s}]?"))
                            .unwrap_or_else(|| {
                                "expected [BALANCE_SMART_CLIENT_DESKTOP] or [BALANCE_WEB_SERVICES]".into()
                            });
                        v.errors.push(ConfigError::new(
                            section.line,
                            &section.written,
                            None,
                            format!("unknown balancer section; {hint}"),
                        ));
                    }
                    None => ignored.push(format!("[{}]", section.written)),
                },
            }
        }
        if !ignored.is_empty() {
            v.notices.push(ConfigError {
                line: None,
                section: None,
                key: None,
                message: format!(
                    "ignoring sections appbroker does not use: {}",
                    ignored.join(", ")
                ),
            });
        }

        let general_config = v.general(general);
        let mut balancers = Vec::new();
        for (kind, section) in &balancer_sections {
            if let Some(balancer) = v.balancer(*kind, section, general) {
                balancers.push(balancer);
            }
        }
        if balancer_sections.is_empty() {
            v.errors.push(ConfigError {
                line: None,
                section: None,
                key: None,
                message: "no balancer section; add [BALANCE_SMART_CLIENT_DESKTOP] or \
                          [BALANCE_WEB_SERVICES] with LOCAL_SERVER_PORT and REMOTE_SERVER_01"
                    .into(),
            });
        }
        for (i, a) in balancers.iter().enumerate() {
            for b in &balancers[..i] {
                if a.listen.port() == b.listen.port()
                    && (a.listen.ip() == b.listen.ip()
                        || a.listen.ip().is_unspecified()
                        || b.listen.ip().is_unspecified())
                {
                    // The line of the clashing LOCAL_SERVER_PORT (it was parsed, so it is there).
                    let line = balancer_sections
                        .iter()
                        .find(|(k, _)| *k == a.kind)
                        .and_then(|(_, s)| s.entries.iter().find(|e| e.key == "LOCAL_SERVER_PORT"))
                        .map_or(0, |e| e.line);
                    v.errors.push(ConfigError::new(
                        line,
                        a.kind.section(),
                        Some("LOCAL_SERVER_PORT"),
                        format!(
                            "{} is also the port of {}; each balancer needs its own port",
                            a.listen, b.kind
                        ),
                    ));
                }
            }
        }

        v.self_loops(&balancers);

        if !v.errors.is_empty() {
            let (errors, total) = v.errors.into_first();
            return Err(LoadError::Invalid {
                path: path.to_path_buf(),
                errors,
                total,
            });
        }
        Ok(Loaded {
            config: Config {
                source: path.to_path_buf(),
                general: general_config,
                balancers,
                origins: v.origins,
            },
            notices: v.notices,
        })
    }
}

/// The bytes of the configuration file, refusing what is not a regular file or too large.
fn read_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    use std::io::Read;
    let failed = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening a FIFO waits for a writer, for ever: open it without waiting, then look at
    // what it is. (Regular files ignore the flag.)
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut options,
        nix::fcntl::OFlag::O_NONBLOCK.bits(),
    );
    let file = options.open(path).map_err(failed)?;
    let metadata = file.metadata().map_err(failed)?;
    if !metadata.is_file() {
        return Err(LoadError::NotAFile {
            path: path.to_path_buf(),
            what: file_kind(&metadata.file_type()),
        });
    }
    let too_large = |size| LoadError::TooLarge {
        path: path.to_path_buf(),
        size,
    };
    if metadata.len() > MAX_FILE_SIZE {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_FILE_SIZE {
        return Err(too_large(bytes.len() as u64)); // it grew while being read
    }
    Ok(bytes)
}

/// What a path that is no regular file is, in words.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// UTF-8 when it is valid, else Windows-1252 (Brazilian files carry Portuguese comments in it).
fn decode(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => encoding_rs::WINDOWS_1252.decode(bytes).0.into_owned(),
    }
}

/// The errors found so far: the [`MAX_ERRORS_SHOWN`] first by line are kept, the others only
/// counted, so a file of millions of bad lines costs neither memory nor time per error.
#[derive(Debug, Default)]
struct Errors {
    kept: Vec<ConfigError>,
    total: usize,
    /// Once more than enough were kept: the line of the last one worth keeping.
    last_kept_line: Option<usize>,
    /// Shown whatever its line (the file was not read to its end).
    pinned: Option<ConfigError>,
}

fn line_order(e: &ConfigError) -> usize {
    e.line.unwrap_or(usize::MAX)
}

impl Errors {
    fn push(&mut self, error: ConfigError) {
        self.total += 1;
        if !self.worth_keeping(error.line) {
            return;
        }
        self.kept.push(error);
        if self.kept.len() >= 2 * MAX_ERRORS_SHOWN {
            self.compact();
        }
    }

    /// An error shown after the first ones, whatever its line.
    fn pin(&mut self, error: ConfigError) {
        self.total += 1;
        self.pinned = Some(error);
    }

    /// Counts errors not worth a message (they come after the first ones shown).
    fn uncounted(&mut self, n: usize) {
        self.total += n;
    }

    /// False when an error at `line` would not be among those shown: the caller may skip
    /// composing its message.
    fn worth_keeping(&self, line: Option<usize>) -> bool {
        self.last_kept_line
            .is_none_or(|last| line.unwrap_or(usize::MAX) <= last)
    }

    fn compact(&mut self) {
        self.kept.sort_by_key(line_order);
        let before = self.kept.len();
        self.kept.dedup();
        self.total -= before - self.kept.len();
        self.kept.truncate(MAX_ERRORS_SHOWN);
        if self.kept.len() == MAX_ERRORS_SHOWN {
            self.last_kept_line = self.kept.last().map(line_order);
        }
    }

    fn len(&self) -> usize {
        self.total
    }

    fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The first errors in line order, and how many there are in all.
    fn into_first(mut self) -> (Vec<ConfigError>, usize) {
        self.compact();
        self.kept.extend(self.pinned);
        (self.kept, self.total)
    }
}

#[derive(Default)]
struct Validator {
    errors: Errors,
    notices: Vec<Notice>,
    origins: Origins,
}

/// One section's lookups, with `[General]` as the fallback for balancer keys.
struct Lookup<'a> {
    section: &'a Section,
    general: Option<&'a Section>,
}

impl Lookup<'_> {
    fn find(&self, key: &str) -> Option<(&Entry, Origin)> {
        if let Some(e) = self.section.entries.iter().find(|e| e.key == key) {
            return Some((e, Origin::Section(e.line)));
        }
        let general = self.general?;
        general
            .entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| (e, Origin::General(e.line)))
    }
}

impl Validator {
    /// Parses one setting: from its section, else `[General]`, else `default`. A bad value is
    /// recorded as an error (at the line it is on) and the default is returned so validation
    /// can go on and report everything at once.
    fn setting<T>(
        &mut self,
        lookup: &Lookup<'_>,
        key: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> T {
        let section = lookup.section.name.as_str();
        match lookup.find(key) {
            None => {
                self.origins.set(section, key, Origin::Default);
                default
            }
            Some((entry, origin)) => {
                self.origins.set(section, key, origin);
                match parse(&entry.value) {
                    Ok(value) => value,
                    Err(message) => {
                        let where_ = match origin {
                            Origin::General(_) => "General",
                            _ => &lookup.section.written,
                        };
                        self.errors.push(ConfigError::new(
                            entry.line,
                            where_,
                            Some(&entry.written),
                            format!("`{}` {message}", entry.value),
                        ));
                        default
                    }
                }
            }
        }
    }

    /// Servers whose address is one of the broker's own listening addresses: each client
    /// sent there would come back into the broker, in a loop (crate::self_loop). Only
    /// addresses are checked here; a name that resolves to one is refused at connect time.
    fn self_loops(&mut self, balancers: &[BalancerConfig]) {
        let mut machine: Option<Vec<IpAddr>> = None;
        for b in balancers {
            for server in &b.servers {
                let Host::Ip(ip) = server.host else {
                    continue;
                };
                let destination = SocketAddr::new(ip, server.port);
                for listener in balancers {
                    if listener.listen.port() != server.port {
                        continue;
                    }
                    let machine = machine.get_or_insert_with(crate::self_loop::interface_addresses);
                    if !crate::self_loop::reaches(destination, listener.listen, |ip| {
                        machine.contains(&ip)
                    }) {
                        continue;
                    }
                    let key = format!("REMOTE_SERVER_{}", server.id);
                    let line = match self.origins.get(b.kind.section(), &key) {
                        Origin::Section(line) | Origin::General(line) => line,
                        Origin::Default => 0,
                    };
                    self.errors.push(ConfigError::new(
                        line,
                        b.kind.section(),
                        Some(&key),
                        format!(
                            "`{} {}` is this broker's own address: {} listens on {}, so every \
                             client sent there would come back into the broker, in a loop; give \
                             the address of an application server",
                            server.host, server.port, listener.kind, listener.listen
                        ),
                    ));
                    break;
                }
            }
        }
    }

    fn duplicates(&mut self, section: &Section) {
        let mut first: BTreeMap<String, usize> = BTreeMap::new();
        for entry in &section.entries {
            let key = match value::server_id_of_key(&entry.key) {
                Some(Ok(id)) => format!("REMOTE_SERVER_{id}"),
                _ => entry.key.clone(),
            };
            if let Some(line) = first.insert(key, entry.line) {
                if !self.errors.worth_keeping(Some(entry.line)) {
                    self.errors.uncounted(1);
                    continue;
                }
                self.errors.push(ConfigError::new(
                    entry.line,
                    &section.written,
                    Some(&entry.written),
                    format!("given twice (first at line {line}); keep one"),
                ));
            }
        }
    }

    fn general(&mut self, section: Option<&Section>) -> General {
        let defaults = General {
            console_log: true,
            console_file: None,
            console_max_size: 10 * 1024 * 1024,
            console_log_date: true,
            shutdown_grace: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(30),
            language: Language::English,
            workers: 0,
            dns_max_lookups: 32,
        };
        let Some(section) = section else {
            return defaults;
        };
        self.duplicates(section);
        let mut unused = Vec::new();
        let mut more_unused = 0;
        for entry in &section.entries {
            let known = GENERAL_KEYS.contains(&entry.key.as_str())
                || (BALANCER_KEYS.contains(&entry.key.as_str())
                    && !entry.key.starts_with("LOCAL_SERVER_"));
            if !known && unused.len() == MAX_NAMED {
                more_unused += 1;
            } else if !known {
                let mut name = entry.written.clone();
                let all: Vec<&str> = GENERAL_KEYS.iter().chain(BALANCER_KEYS).copied().collect();
                if let Some(s) = suggest(&entry.key, &all) {
                    name.push_str(&format!(" (did you mean {s}?)"));
                }
                unused.push(name);
            }
        }
        if !unused.is_empty() {
            self.notices.push(ConfigError {
                line: Some(section.line),
                section: Some(section.written.clone()),
                key: None,
                message: format!(
                    "ignoring keys appbroker does not use: {}{}",
                    unused.join(", "),
                    if more_unused > 0 {
                        format!(" and {more_unused} more")
                    } else {
                        String::new()
                    }
                ),
            });
        }
        let lookup = Lookup {
            section,
            general: None,
        };
        let general = General {
            console_log: self.setting(&lookup, "CONSOLELOG", defaults.console_log, value::flag),
            console_file: self.setting(&lookup, "CONSOLEFILE", None, |s| {
                Ok((!s.is_empty()).then(|| PathBuf::from(s)))
            }),
            console_max_size: self.setting(
                &lookup,
                "CONSOLEMAXSIZE",
                defaults.console_max_size,
                |s| value::integer(s, 0, u64::MAX, "a size in bytes (0: never rotate)"),
            ),
            console_log_date: self.setting(&lookup, "CONSOLELOGDATE", true, value::flag),
            shutdown_grace: self.setting(&lookup, "SHUTDOWN_GRACE", defaults.shutdown_grace, |s| {
                value::duration(s, Duration::ZERO)
            }),
            shutdown_timeout: self.setting(
                &lookup,
                "SHUTDOWN_TIMEOUT",
                defaults.shutdown_timeout,
                |s| value::duration(s, Duration::ZERO),
            ),
            workers: self.setting(&lookup, "WORKERS", 0, |s| {
                value::integer(s, 0, 256, "a number of threads from 0 (one per CPU) to 256")
                    .map(|n| n as u32)
            }),
            dns_max_lookups: self.setting(
                &lookup,
                "DNS_MAX_LOOKUPS",
                defaults.dns_max_lookups,
                |s| {
                    value::integer(s, 1, 4096, "a number of name lookups from 1 to 4096")
                        .map(|n| n as u32)
                },
            ),
            language: self.setting(&lookup, "LANGUAGE", defaults.language, |s| {
                match s.to_ascii_lowercase().as_str() {
                    "en" => Ok(Language::English),
                    "pt-br" | "pt_br" | "pt" => Ok(Language::Portuguese),
                    _ => Err("expected en or pt-BR".into()),
                }
            }),
        };
        if !general.console_log && general.console_file.is_none() {
            self.notices.push(ConfigError::new(
                section.line,
                &section.written,
                Some("ConsoleLog"),
                "is 0 and there is no ConsoleFile: the broker will log nothing",
            ));
        }
        general
    }

    fn balancer(
        &mut self,
        kind: BalancerKind,
        section: &Section,
        general: Option<&Section>,
    ) -> Option<BalancerConfig> {
        let errors_before = self.errors.len();
        self.duplicates(section);
        let name = section.written.as_str();

        let mut servers = Vec::new();
        let mut unused = Vec::new();
        for entry in &section.entries {
            match value::server_id_of_key(&entry.key) {
                Some(Ok(id)) => match value::server(&entry.value) {
                    Ok((host, port, weight)) => {
                        let key = format!("REMOTE_SERVER_{id}");
                        self.origins
                            .set(&section.name, &key, Origin::Section(entry.line));
                        servers.push((
                            ServerConfig {
                                id,
                                host,
                                port,
                                weight,
                            },
                            entry.line,
                        ));
                    }
                    Err(message) => self.errors.push(ConfigError::new(
                        entry.line,
                        name,
                        Some(&entry.written),
                        format!("`{}` {message}", entry.value),
                    )),
                },
                Some(Err(message)) => self.errors.push(ConfigError::new(
                    entry.line,
                    name,
                    Some(&entry.written),
                    message,
                )),
                None if BALANCER_KEYS.contains(&entry.key.as_str()) => {}
                None => {
                    match TOTVS_UNUSED_KEYS.iter().find(|(k, _)| *k == entry.key) {
                        Some((_, instead)) => unused.push(format!("{} ({instead})", entry.written)),
                        None if !self.errors.worth_keeping(Some(entry.line)) => {
                            self.errors.uncounted(1);
                        }
                        None => {
                            let known: Vec<&str> = BALANCER_KEYS
                                .iter()
                                .chain(TOTVS_UNUSED_KEYS.iter().map(|(k, _)| k))
                                .copied()
                                .chain(["REMOTE_SERVER_01"])
                                .collect();
                            let hint = match suggest(&entry.key, &known) {
                            Some(s) => format!("unknown key; did you mean {s}?"),
                            None => "unknown key; docs/configuration.md lists the keys of a balancer \
                                     section"
                                .to_string(),
                        };
                            self.errors.push(ConfigError::new(
                                entry.line,
                                name,
                                Some(&entry.written),
                                hint,
                            ));
                        }
                    }
                }
            }
        }
        if !unused.is_empty() {
            self.notices.push(ConfigError {
                line: Some(section.line),
                section: Some(name.to_string()),
                key: None,
                message: format!(
                    "accepting TOTVS keys appbroker does not use: {}",
                    unused.join("; ")
                ),
            });
        }

        let server_rejected = section
            .rejected
            .iter()
            .any(|key| value::server_id_of_key(key).is_some());
        if servers.is_empty() && self.errors.len() == errors_before && !server_rejected {
            self.errors.push(ConfigError::new(
                section.line,
                name,
                None,
                "no servers; add at least one `REMOTE_SERVER_01 = <host> <port> [<weight>]`",
            ));
        }
        if servers.len() > MAX_SERVERS {
            self.errors.push(ConfigError::new(
                section.line,
                name,
                None,
                format!("{} servers; at most {MAX_SERVERS} ids exist", servers.len()),
            ));
        }
        let mut by_address: BTreeMap<String, (ServerId, usize)> = BTreeMap::new();
        for (server, line) in &servers {
            if let Some((other, other_line)) =
                by_address.insert(server.address().to_ascii_lowercase(), (server.id, *line))
            {
                self.notices.push(ConfigError::new(
                    *line,
                    name,
                    Some(&format!("REMOTE_SERVER_{}", server.id)),
                    format!(
                        "{} is also REMOTE_SERVER_{other} (line {other_line}); each id is its own \
                         entry with its own connections and counters",
                        server.address()
                    ),
                ));
            }
        }

        let own = Lookup {
            section,
            general: None,
        };
        let inherited = Lookup { section, general };
        let port = match own.find("LOCAL_SERVER_PORT") {
            // Its line was rejected, and said why: it is not missing.
            None if section.rejected.iter().any(|k| k == "LOCAL_SERVER_PORT") => None,
            None => {
                self.errors.push(ConfigError::new(
                    section.line,
                    name,
                    Some("LOCAL_SERVER_PORT"),
                    "missing; it is required: the TCP port clients connect to (1-65535)",
                ));
                None
            }
            Some(_) => Some(self.setting(&own, "LOCAL_SERVER_PORT", 0, |s| {
                value::integer(s, 1, 65535, "a port number from 1 to 65535").map(|p| p as u16)
            })),
        };
        let address = self.setting(
            &own,
            "LOCAL_SERVER_ADDRESS",
            DEFAULT_LISTEN_ADDRESS,
            value::ip,
        );

        let sort_method =
            self.setting(
                &inherited,
                "SORT_METHOD",
                SortMethod::Connection,
                |s| match s.to_ascii_uppercase().as_str() {
                    "CONNECTION" => Ok(SortMethod::Connection),
                    "ROUND_ROBIN" => Ok(SortMethod::RoundRobin),
                    "SESSION" | "SERVER_MEMORY" | "SERVER_USERS" | "SERVER_THREADS"
                    | "SERVER_CPU" => Ok(SortMethod::Connection),
                    _ => Err("is not a sort method; expected CONNECTION or ROUND_ROBIN".into()),
                },
            );
        if let Some((entry, _)) = inherited.find("SORT_METHOD") {
            let upper = entry.value.to_ascii_uppercase();
            if [
                "SESSION",
                "SERVER_MEMORY",
                "SERVER_USERS",
                "SERVER_THREADS",
                "SERVER_CPU",
            ]
            .contains(&upper.as_str())
            {
                self.notices.push(ConfigError::new(
                    entry.line,
                    name,
                    Some("SORT_METHOD"),
                    format!(
                        "{upper} needs figures only a TOTVS AppServer reports; CONNECTION (fewest \
                         connections per weight) is used instead"
                    ),
                ));
            }
        }
        let monitoring =
            self.setting(
                &inherited,
                "MONITORING_TYPE",
                Monitoring::Connection,
                |s| match s.to_ascii_uppercase().as_str() {
                    "CONNECTION" => Ok(Monitoring::Connection),
                    "SEND_EXPECT" => Ok(Monitoring::SendExpect {
                        send: Vec::new(),
                        expect: Vec::new(),
                    }),
                    "DISABLED" | "DISABLE" => Ok(Monitoring::Disabled),
                    "SMARTCLIENT"
                    | "SMARTCLIENT_SSL"
                    | "SMARTCLIENT_ACTIVE"
                    | "SMARTCLIENT_SSL_ACTIVE" => Ok(Monitoring::Connection),
                    _ => Err(
                        "is not a monitoring type; expected CONNECTION, SEND_EXPECT or DISABLED"
                            .into(),
                    ),
                },
            );
        let send = self.setting(&inherited, "MONITOR_SEND", Vec::new(), value::escaped);
        let expect = self.setting(&inherited, "MONITOR_EXPECT", Vec::new(), value::escaped);
        let monitoring = match monitoring {
            Monitoring::SendExpect { .. } => {
                if expect.is_empty() {
                    let line = inherited
                        .find("MONITORING_TYPE")
                        .map_or(section.line, |(e, _)| e.line);
                    self.errors.push(ConfigError::new(
                        line,
                        name,
                        Some("MONITOR_EXPECT"),
                        "is required with MONITORING_TYPE=SEND_EXPECT: the bytes the reply must start \
                         with (escapes \\r \\n \\t \\\\ \\xNN)",
                    ));
                }
                Monitoring::SendExpect { send, expect }
            }
            other => {
                for key in ["MONITOR_SEND", "MONITOR_EXPECT"] {
                    if let Some((entry, _)) = inherited.find(key) {
                        self.notices.push(ConfigError::new(
                            entry.line,
                            name,
                            Some(key),
                            "is ignored: it is used with MONITORING_TYPE=SEND_EXPECT only",
                        ));
                    }
                }
                other
            }
        };
        if let Some((entry, _)) = inherited.find("MONITORING_TYPE") {
            let upper = entry.value.to_ascii_uppercase();
            if upper.starts_with("SMARTCLIENT") {
                self.notices.push(ConfigError::new(
                    entry.line,
                    name,
                    Some("MONITORING_TYPE"),
                    format!(
                        "{upper} logs in with SmartClient's undocumented protocol; CONNECTION (a \
                         TCP connect to each server) is used instead"
                    ),
                ));
            }
        }
        let monitor_interval = self.setting(
            &inherited,
            "MONITOR_INTERVAL",
            Duration::from_secs(60),
            |s| value::duration(s, Duration::from_millis(100)),
        );
        let quarantine_time = self.setting(
            &inherited,
            "QUARANTINE_TIME",
            Duration::from_secs(120),
            |s| value::duration(s, Duration::from_millis(100)),
        );
        let connect_timeout =
            self.setting(&inherited, "CONNECT_TIMEOUT", Duration::from_secs(5), |s| {
                value::duration(s, Duration::from_millis(10))
            });
        let max_attempts = self.setting(&inherited, "MAX_ATTEMPTS", 3, |s| {
            value::integer(
                s,
                1,
                MAX_SERVERS as u64,
                "a count of servers from 1 to 1296",
            )
            .map(|n| n as u32)
        });
        let max_connections = self.setting(&inherited, "MAX_CONNECTIONS", 10_000, |s| {
            value::integer(s, 1, 1_000_000, "a number of connections from 1 to 1000000")
                .map(|n| n as u32)
        });
        let log_connections = self.setting(&inherited, "LOG_CONNECTIONS", true, value::flag);
        let keepalive = Keepalive {
            time: self.setting(&inherited, "KEEPALIVE_TIME", Duration::from_secs(60), |s| {
                value::duration_within(s, Duration::ZERO, KEEPALIVE_MAX).and_then(|d| {
                    if d.is_zero() || d >= Duration::from_secs(1) {
                        Ok(d)
                    } else {
                        Err("expected 0 (off) or a duration from 1s to 32767s".into())
                    }
                })
            }),
            interval: self.setting(
                &inherited,
                "KEEPALIVE_INTERVAL",
                Duration::from_secs(10),
                |s| value::duration_within(s, Duration::from_secs(1), KEEPALIVE_MAX),
            ),
            count: self.setting(&inherited, "KEEPALIVE_COUNT", 6, |s| {
                value::integer(s, 1, 127, "a count of probes from 1 to 127").map(|n| n as u32)
            }),
            user_timeout: None,
        };
        // By default it matches the keepalive arithmetic, within the one-day bound of every
        // duration (and is off with keepalive off).
        let matching = keepalive
            .enabled()
            .then(|| keepalive.dead_after().min(Duration::from_secs(24 * 3600)));
        let keepalive = Keepalive {
            user_timeout: self.setting(&inherited, "TCP_USER_TIMEOUT", matching, |s| {
                value::duration(s, Duration::ZERO).map(|d| (!d.is_zero()).then_some(d))
            }),
            ..keepalive
        };
        let idle_timeout = self.setting(&inherited, "IDLE_TIMEOUT", None, |s| {
            value::duration(s, Duration::ZERO).map(|d| (!d.is_zero()).then_some(d))
        });
        let monitor_fall = self.setting(&inherited, "MONITOR_FALL", 1, |s| {
            value::integer(s, 1, 100, "a count of checks from 1 to 100").map(|n| n as u32)
        });
        let monitor_rise = self.setting(&inherited, "MONITOR_RISE", 1, |s| {
            value::integer(s, 1, 100, "a count of checks from 1 to 100").map(|n| n as u32)
        });
        let dns_cache_time =
            self.setting(&inherited, "DNS_CACHE_TIME", Duration::from_secs(30), |s| {
                value::duration(s, Duration::ZERO)
            });
        let query = QuerySettings {
            enabled: self.setting(&inherited, "QUERY_ENABLED", true, value::flag),
            allow: self.setting(&inherited, "QUERY_ALLOW", Cidr::everyone(), value::cidrs),
            max_connections: self.setting(&inherited, "QUERY_MAX_CONNECTIONS", 64, |s| {
                value::integer(
                    s,
                    1,
                    10_000,
                    "a number of query connections from 1 to 10000",
                )
                .map(|n| n as u32)
            }),
            sniff_timeout: self.setting(
                &inherited,
                "QUERY_SNIFF_TIMEOUT",
                Duration::from_millis(200),
                |s| value::duration_within(s, Duration::from_millis(10), Duration::from_secs(5)),
            ),
        };
        // Answering everyone is the TOTVS behaviour; say so once unless the file chose it.
        if query.enabled && inherited.find("QUERY_ALLOW").is_none() {
            self.notices.push(ConfigError::new(
                section.line,
                name,
                Some("QUERY_ALLOW"),
                "is not set: anyone who reaches this port can read the server addresses at \
                 /TOTVS_BROKER_QUERY; set QUERY_ALLOW (addresses or CIDRs) to restrict it",
            ));
        }

        if self.errors.len() > errors_before {
            return None;
        }
        Some(BalancerConfig {
            kind,
            listen: SocketAddr::new(address, port?),
            servers: servers.into_iter().map(|(s, _)| s).collect(),
            sort_method,
            monitoring,
            monitor_interval,
            quarantine_time,
            connect_timeout,
            max_attempts,
            max_connections,
            log_connections,
            query,
            keepalive,
            idle_timeout,
            monitor_fall,
            monitor_rise,
            dns_cache_time,
        })
    }
}

/// The known name closest to `name`, when it is close enough to be a typo.
fn suggest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (value::edit_distance(name, k), *k))
        .filter(|(d, k)| *d <= (k.len() / 4).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests;
