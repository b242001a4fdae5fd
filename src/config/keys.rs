//! Every configuration key in one table: its name, where it may stand, the values it takes
//! (which is also its parser), where its value goes and how it is printed back, and a line
//! saying what it is for. The validator reads keys through this table, `--check` and the CFG
//! page print through it, a reload compares through it, and the property tests draw their
//! values from it; docs/configuration.md lists exactly its keys (a test checks).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::alerting::{ALERT_EVENT_WORDS, AlertEvents, AlertFormat, Webhook};
use super::value::{self, Cidr, show_duration, show_escaped};
use super::{
    BalancerConfig, General, Language, Monitoring, ProxyVersion, SortMethod, StatusRange,
    TOTVS_MONITORING_TYPES, TOTVS_SORT_METHODS,
};
use crate::tls::SslMethod;
use crate::tls::files::Passphrase;

/// Where a key may stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stands {
    /// In `[General]` only: a setting of the whole process.
    General,
    /// In a balancer section, or in `[General]` as the default of every balancer.
    Balancer,
    /// In a balancer section only (its own listening address).
    OwnSection,
}

/// The values a key takes. [`Domain::parse`] is the key's parser; the property tests draw
/// valid values from the same description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// `0` or `1`.
    Flag,
    /// An integer from `min` to `max`; `what` completes "expected ...".
    Integer {
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
        /// The expected value in words.
        what: &'static str,
    },
    /// A duration from `min` to `max`: seconds, or a number with `ms`, `s` or `m`.
    Duration {
        /// Shortest accepted.
        min: Duration,
        /// Longest accepted.
        max: Duration,
    },
    /// `0` (off), or a duration from `min` to `max`.
    DurationOrOff {
        /// Shortest accepted besides 0.
        min: Duration,
        /// Longest accepted.
        max: Duration,
    },
    /// An IP address of this machine (IPv6 with or without brackets).
    ListenIp,
    /// Addresses or CIDRs, separated by commas or blanks.
    Cidrs,
    /// Addresses or CIDRs, as [`Domain::Cidrs`], or empty for none.
    CidrsOrNone,
    /// HTTP protocol names (`websocket`, `h2c`, a name with `/version`), separated by commas
    /// or blanks; empty for none.
    Protocols,
    /// Bytes with escapes `\r`, `\n`, `\t`, `\\`, `\xNN`.
    Escaped,
    /// A file path; empty for none.
    Path,
    /// A name (of a group, say): letters, digits, `_`, `-` and `.`; empty for none.
    Name,
    /// A [`SortMethod`], or a TOTVS one that stands for CONNECTION.
    SortMethod,
    /// A [`Monitoring`] type, or a TOTVS one that stands for CONNECTION.
    Monitoring,
    /// A [`Language`].
    Language,
    /// Any text; empty for none.
    Text,
    /// A secret (`SSL_PASSPHRASE`, `SESSION_SECRET`): any text of at least `min` characters,
    /// empty for none, printed as `(set)`; never repeated in an error.
    Secret {
        /// Fewest characters accepted (0: any).
        min: usize,
    },
    /// An [`SslMethod`], as TOTVS writes it.
    SslMethod,
    /// An HTTP request path: `/` and what follows, without blanks.
    HttpPath,
    /// A [`StatusRange`]: `200` or `200-399`.
    StatusRange,
    /// An `http://` or `https://` URL ([`Webhook`]), empty for none; a secret: printed as
    /// `(set: https://host)`, never repeated in an error.
    Webhook,
    /// An [`AlertFormat`]: `json` or `text`.
    AlertFormat,
    /// [`AlertEvents`]: event names separated by commas or blanks, or `all`.
    AlertEvents,
    /// An IP address, empty for none.
    OptionalIp,
}

impl Domain {
    /// The words a word-valued domain accepts (any case), the documented ones first; empty for
    /// the others.
    pub fn words(self) -> &'static [&'static str] {
        match self {
            Domain::Flag => &["0", "1"],
            Domain::SortMethod => &[
                "CONNECTION",
                "ROUND_ROBIN",
                "SESSION",
                "SERVER_MEMORY",
                "SERVER_USERS",
                "SERVER_THREADS",
                "SERVER_CPU",
            ],
            Domain::Monitoring => &[
                "CONNECTION",
                "SEND_EXPECT",
                "HTTP",
                "DISABLED",
                "DISABLE",
                "SMARTCLIENT",
                "SMARTCLIENT_SSL",
                "SMARTCLIENT_ACTIVE",
                "SMARTCLIENT_SSL_ACTIVE",
            ],
            Domain::Language => &["en", "pt-BR", "pt_BR", "pt"],
            Domain::SslMethod => &["SSL/TLS", "TLSv1.2", "TLSv1.3", "SSLv3", "TLSv1", "TLSv1.1"],
            Domain::AlertFormat => &["json", "text"],
            Domain::AlertEvents => ALERT_EVENT_WORDS,
            _ => &[],
        }
    }

    /// True for a domain whose values are secrets: never printed (but as `(set)`), never
    /// repeated in an error.
    pub fn is_secret(self) -> bool {
        matches!(self, Domain::Secret { .. } | Domain::Webhook)
    }
}

/// A parsed value, on its way to its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// From [`Domain::Flag`].
    Flag(bool),
    /// From [`Domain::Integer`].
    Integer(u64),
    /// From [`Domain::Duration`] and [`Domain::DurationOrOff`] (0: off).
    Duration(Duration),
    /// From [`Domain::ListenIp`].
    Ip(IpAddr),
    /// From [`Domain::Cidrs`].
    Cidrs(Vec<Cidr>),
    /// From [`Domain::Protocols`].
    Protocols(Vec<String>),
    /// From [`Domain::Escaped`].
    Bytes(Vec<u8>),
    /// From [`Domain::Path`].
    Path(Option<PathBuf>),
    /// From [`Domain::Name`].
    Name(Option<String>),
    /// From [`Domain::SortMethod`].
    SortMethod(SortMethod),
    /// From [`Domain::Monitoring`].
    Monitoring(Monitoring),
    /// From [`Domain::Language`].
    Language(Language),
    /// From [`Domain::Text`].
    Text(Option<String>),
    /// From [`Domain::Secret`].
    Secret(Option<Passphrase>),
    /// From [`Domain::SslMethod`].
    SslMethod(SslMethod),
    /// From [`Domain::HttpPath`].
    HttpPath(String),
    /// From [`Domain::StatusRange`].
    StatusRange(StatusRange),
    /// From [`Domain::Webhook`].
    Webhook(Option<Webhook>),
    /// From [`Domain::AlertFormat`].
    AlertFormat(AlertFormat),
    /// From [`Domain::AlertEvents`].
    AlertEvents(AlertEvents),
    /// From [`Domain::OptionalIp`].
    OptionalIp(Option<IpAddr>),
}

/// The longest duration any key accepts: a day.
pub const DAY: Duration = value::MAX_DURATION;

/// The longest keepalive time or interval Linux accepts (`MAX_TCP_KEEPIDLE`).
pub const KEEPALIVE_MAX: Duration = Duration::from_secs(32_767);

/// Most servers a balancer can have: the two-character ids there are.
pub const MAX_SERVERS: u64 = 36 * 36;

impl Domain {
    /// Parses `text`; the error completes the sentence "`text` ...".
    pub fn parse(self, text: &str) -> Result<Value, String> {
        Ok(match self {
            Domain::Flag => Value::Flag(value::flag(text)?),
            Domain::Integer { min, max, what } => {
                Value::Integer(value::integer(text, min, max, what)?)
            }
            Domain::Duration { min, max } => {
                Value::Duration(value::duration_within(text, min, max)?)
            }
            Domain::DurationOrOff { min, max } => {
                let d = value::duration_within(text, Duration::ZERO, max)?;
                if !d.is_zero() && d < min {
                    return Err(format!(
                        "expected 0 (off) or a duration from {} to {}",
                        show_duration(min),
                        show_duration(max)
                    ));
                }
                Value::Duration(d)
            }
            Domain::ListenIp => Value::Ip(value::ip(text)?),
            Domain::Cidrs => Value::Cidrs(value::cidrs(text)?),
            Domain::CidrsOrNone if text.is_empty() => Value::Cidrs(Vec::new()),
            Domain::CidrsOrNone => Value::Cidrs(value::cidrs(text)?),
            Domain::Protocols => Value::Protocols(value::protocols(text)?),
            Domain::Escaped => Value::Bytes(value::escaped(text)?),
            Domain::Path => Value::Path((!text.is_empty()).then(|| PathBuf::from(text))),
            Domain::Name => Value::Name(value::name(text)?),
            Domain::SortMethod => Value::SortMethod(match text.parse() {
                Ok(method) => method,
                // Figures only a TOTVS AppServer reports: CONNECTION stands in (with a notice).
                Err(_) if TOTVS_SORT_METHODS.contains(&text.to_ascii_uppercase().as_str()) => {
                    SortMethod::Connection
                }
                Err(e) => return Err(e.to_string()),
            }),
            Domain::Monitoring => Value::Monitoring(match text.parse() {
                Ok(monitoring) => monitoring,
                // SmartClient's own protocol: a TCP connect stands in (with a notice).
                Err(_) if TOTVS_MONITORING_TYPES.contains(&text.to_ascii_uppercase().as_str()) => {
                    Monitoring::Connection
                }
                Err(e) => return Err(e.to_string()),
            }),
            Domain::Language => Value::Language(text.parse().map_err(|e| format!("{e}"))?),
            Domain::Text => Value::Text((!text.is_empty()).then(|| text.to_string())),
            Domain::Secret { min } => {
                let length = text.chars().count();
                if length > 0 && length < min {
                    return Err(format!(
                        "is {length} characters long; a secret needs at least {min} (make one \
                         with `openssl rand -base64 32`)"
                    ));
                }
                Value::Secret((!text.is_empty()).then(|| Passphrase::new(text)))
            }
            Domain::SslMethod => Value::SslMethod(text.parse().map_err(|e| format!("{e}"))?),
            Domain::HttpPath => {
                if !text.starts_with('/') || text.bytes().any(|b| b <= b' ' || b == 0x7f) {
                    return Err(
                        "is not a request path; expected one starting with / and without \
                         blanks, e.g. /health"
                            .into(),
                    );
                }
                Value::HttpPath(text.to_string())
            }
            Domain::StatusRange => Value::StatusRange(text.parse()?),
            Domain::Webhook | Domain::AlertFormat | Domain::AlertEvents | Domain::OptionalIp => {
                return self.parse_alerting(text);
            }
        })
    }

    /// [`Domain::parse`] for the domains of the `ALERT_*` and `RESTART_*` keys.
    fn parse_alerting(self, text: &str) -> Result<Value, String> {
        Ok(match self {
            Domain::Webhook if text.is_empty() => Value::Webhook(None),
            Domain::Webhook => Value::Webhook(Some(Webhook::parse(text)?)),
            Domain::AlertFormat => Value::AlertFormat(AlertFormat::parse(text)?),
            Domain::AlertEvents => Value::AlertEvents(AlertEvents::parse(text)?),
            Domain::OptionalIp if text.is_empty() => Value::OptionalIp(None),
            Domain::OptionalIp => Value::OptionalIp(Some(value::ip(text).map_err(|_| {
                "is not an IP address; expected one such as 10.0.0.100 or fd00::100 (empty: none)"
                    .to_string()
            })?)),
            _ => return Err("is not a value of this key".into()),
        })
    }
}

/// Where a key's value goes, and how it is printed back (`None`: not printed, as for a
/// key that does not apply).
#[derive(Debug, Clone, Copy)]
pub enum KeyField {
    /// A field of [`General`].
    General {
        /// Stores a value of the key's domain.
        set: fn(&mut General, Value),
        /// The value as printed.
        get: fn(&General) -> Option<String>,
    },
    /// A field of [`BalancerConfig`].
    Balancer {
        /// Stores a value of the key's domain.
        set: fn(&mut BalancerConfig, Value),
        /// The value as printed.
        get: fn(&BalancerConfig) -> Option<String>,
    },
}

/// One configuration key.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The name in upper case, as matched (names are case-insensitive) and printed.
    pub name: &'static str,
    /// Where it may stand.
    pub stands: Stands,
    /// The values it takes.
    pub domain: Domain,
    /// Where its value goes.
    pub field: KeyField,
    /// What it is for, in one line.
    pub doc: &'static str,
}

impl Key {
    /// Parses `text` and stores it in `general`; the error completes "`text` ...".
    pub fn set_general(&self, general: &mut General, text: &str) -> Result<(), String> {
        let value = self.domain.parse(text)?;
        if let KeyField::General { set, .. } = self.field {
            set(general, value);
        }
        Ok(())
    }

    /// Parses `text` and stores it in `balancer`; the error completes "`text` ...".
    pub fn set_balancer(&self, balancer: &mut BalancerConfig, text: &str) -> Result<(), String> {
        let value = self.domain.parse(text)?;
        if let KeyField::Balancer { set, .. } = self.field {
            set(balancer, value);
        }
        Ok(())
    }
}

/// The keys of `[General]`, in printing order.
pub fn general() -> impl Iterator<Item = &'static Key> {
    KEYS.iter().filter(|k| k.stands == Stands::General)
}

/// The keys of a balancer section (but `REMOTE_SERVER_<id>`), in printing order.
pub fn balancer() -> impl Iterator<Item = &'static Key> {
    KEYS.iter().filter(|k| k.stands != Stands::General)
}

/// The key called `name` (upper case).
pub fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// A path as printed: empty for none.
fn shown_path(path: Option<&PathBuf>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

/// A flag as printed.
fn flag(value: &bool) -> Option<String> {
    Some(if *value { "1" } else { "0" }.to_string())
}

/// A duration as printed.
fn duration(d: &Duration) -> Option<String> {
    Some(show_duration(*d))
}

/// An optional path as printed (empty: none).
fn path(p: &Option<PathBuf>) -> Option<String> {
    Some(
        p.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    )
}

/// A secret as printed: `(set)`, or empty for none; never its value.
fn shown_secret(secret: &Option<Passphrase>) -> Option<String> {
    Some(secret.as_ref().map(ToString::to_string).unwrap_or_default())
}

/// The fewest characters of `SESSION_SECRET`: 32 characters of `openssl rand -base64 32` (the
/// documented way to make one) carry 192 bits, past any guessing.
pub const SESSION_SECRET_MIN: usize = 32;

/// A number as printed.
fn number(n: &impl ToString) -> Option<String> {
    Some(n.to_string())
}

/// An HTTP balancer's setting as printed: `None` (not printed) for a TCP balancer, which has
/// no use for it.
fn on_http<T>(b: &BalancerConfig, value: T, show: impl Fn(&T) -> Option<String>) -> Option<String> {
    if b.kind.is_http() { show(&value) } else { None }
}

/// The field at `$path` of `HttpSettings` (`b.http`): set from the key's value and printed
/// by `$show` for an HTTP balancer only.
macro_rules! http_field {
    ($field:ident = $variant:ident $(as $ty:ty)?, $show:expr) => {
        KeyField::Balancer {
            set: |b, v| {
                if let Value::$variant(x) = v {
                    b.http.$field = x $(as $ty)?;
                }
            },
            get: |b| on_http(b, b.http.$field, $show),
        }
    };
}

/// Addresses or CIDRs as printed: separated by `, `, empty for none.
fn cidr_list(list: &[Cidr]) -> Option<String> {
    let list: Vec<String> = list.iter().map(Cidr::to_string).collect();
    Some(list.join(", "))
}

/// A duration from `min` to a day.
const fn upto_a_day(min: Duration) -> Domain {
    Domain::Duration { min, max: DAY }
}

/// The field at `$path` of `General` or `BalancerConfig` (`$target`): set from the key's
/// value (of variant `$variant`, converted `as $ty` for a narrower count) and printed by
/// `$show`. A value of another variant leaves the field at its default, which
/// `every_key_round_trips_through_its_field` below would catch.
macro_rules! field {
    ($target:ident . $($path:ident).+ = $variant:ident $(as $ty:ty)?, $show:expr) => {
        KeyField::$target {
            set: |c, v| {
                if let Value::$variant(x) = v {
                    c.$($path).+ = x $(as $ty)?;
                }
            },
            get: |c| ($show)(&c.$($path).+),
        }
    };
}

/// The value of variant `$variant`, when `$value` is one.
macro_rules! take {
    ($value:expr, $variant:ident) => {
        match $value {
            Value::$variant(v) => Some(v),
            _ => None,
        }
    };
}

/// Every key but `REMOTE_SERVER_<id>`: `[General]`'s first, then a balancer's, each in the
/// order `--check` prints them.
pub static KEYS: &[Key] = &[
    Key {
        name: "CONSOLELOG",
        stands: Stands::General,
        domain: Domain::Flag,
        field: field!(General.console_log = Flag, flag),
        doc: "write the log to standard output",
    },
    Key {
        name: "CONSOLEFILE",
        stands: Stands::General,
        domain: Domain::Path,
        field: KeyField::General {
            set: |g, v| g.console_file = take!(v, Path).flatten(),
            get: |g| {
                Some(
                    g.console_file
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                )
            },
        },
        doc: "also write the log to this file (empty: no file)",
    },
    Key {
        name: "CONSOLEMAXSIZE",
        stands: Stands::General,
        domain: Domain::Integer {
            min: 0,
            max: u64::MAX,
            what: "a size in bytes (0: never rotate)",
        },
        field: field!(General.console_max_size = Integer, number),
        doc: "rotate the log file to <file>.1 past this many bytes (0: never)",
    },
    Key {
        name: "CONSOLELOGDATE",
        stands: Stands::General,
        domain: Domain::Flag,
        field: field!(General.console_log_date = Flag, flag),
        doc: "begin each log line with the local date and time",
    },
    Key {
        name: "SHUTDOWN_GRACE",
        stands: Stands::General,
        domain: upto_a_day(Duration::ZERO),
        field: field!(General.shutdown_grace = Duration, duration),
        doc: "after SIGTERM, keep serving this long while PING and READY answer 503",
    },
    Key {
        name: "SHUTDOWN_TIMEOUT",
        stands: Stands::General,
        domain: upto_a_day(Duration::ZERO),
        field: field!(General.shutdown_timeout = Duration, duration),
        doc: "once the listeners are closed, how long connections may take to finish",
    },
    Key {
        name: "LANGUAGE",
        stands: Stands::General,
        domain: Domain::Language,
        field: field!(General.language = Language, |l: &Language| Some(
            l.as_str().into()
        )),
        doc: "the language of the /TOTVS_BROKER_QUERY pages for every reader (unset: each \
              browser's Accept-Language), of the broker's own HTTP pages and of text alerts",
    },
    Key {
        name: "WORKERS",
        stands: Stands::General,
        domain: Domain::Integer {
            min: 0,
            max: 256,
            what: "a number of threads from 0 (one per CPU) to 256",
        },
        field: field!(General.workers = Integer as u32, number),
        doc: "threads serving connections (0: one per CPU); read at start only",
    },
    Key {
        name: "DNS_MAX_LOOKUPS",
        stands: Stands::General,
        domain: Domain::Integer {
            min: 1,
            max: 4096,
            what: "a number of name lookups from 1 to 4096",
        },
        field: field!(General.dns_max_lookups = Integer as u32, number),
        doc: "name lookups in flight at once in the whole process",
    },
    Key {
        name: "HTTP_HEAD_MEMORY",
        stands: Stands::General,
        domain: Domain::Integer {
            min: 1,
            max: 65536,
            what: "a number of MiB from 1 to 65536",
        },
        field: KeyField::General {
            set: |g, v| {
                if let Some(mib) = take!(v, Integer) {
                    g.http_head_memory = usize::try_from(mib).unwrap_or(usize::MAX) << 20;
                }
            },
            get: |g| Some((g.http_head_memory >> 20).to_string()),
        },
        doc: "MiB that every HTTP balancer's request heads still arriving may hold together; past it the oldest are answered 408",
    },
    Key {
        name: "CONTROL_SOCKET",
        stands: Stands::General,
        domain: Domain::Path,
        field: KeyField::General {
            set: |g, v| g.control_socket = take!(v, Path).flatten(),
            get: |g| Some(shown_path(g.control_socket.as_ref())),
        },
        doc: "the control socket of `appbroker ctl` (empty: derived from the file's name; 0: none); read at start only",
    },
    Key {
        name: "CONTROL_GROUP",
        stands: Stands::General,
        domain: Domain::Name,
        field: KeyField::General {
            set: |g, v| g.control_group = take!(v, Name).flatten(),
            get: |g| Some(g.control_group.clone().unwrap_or_default()),
        },
        doc: "a group whose members may use the control socket too (mode 0660), and the supervisor's socket of `appbroker upgrade`; read at start only",
    },
    Key {
        name: "STATE_FILE",
        stands: Stands::General,
        domain: Domain::Path,
        field: KeyField::General {
            set: |g, v| g.state_file = take!(v, Path).flatten(),
            get: |g| Some(shown_path(g.state_file.as_ref())),
        },
        doc: "where operators' overrides are kept over restarts (empty: derived from the file's name; 0: none); read at start only",
    },
    Key {
        name: "SESSION_SECRET",
        stands: Stands::General,
        domain: Domain::Secret {
            min: SESSION_SECRET_MIN,
        },
        field: field!(General.session_secret = Secret, shown_secret),
        doc: "signs the HTTP session cookie; the same on both brokers of a pair (empty: generated and kept in <state>.secret); shown as (set)",
    },
    Key {
        name: "SESSION_SECRET_PREVIOUS",
        stands: Stands::General,
        domain: Domain::Secret {
            min: SESSION_SECRET_MIN,
        },
        field: field!(General.session_secret_previous = Secret, shown_secret),
        doc: "a former SESSION_SECRET whose cookies still count, for a rotation that moves no session; shown as (set)",
    },
    Key {
        name: "ADMIN_USERS",
        stands: Stands::General,
        domain: Domain::Path,
        field: KeyField::General {
            set: |g, v| g.admin_users = take!(v, Path).flatten(),
            get: |g| Some(shown_path(g.admin_users.as_ref())),
        },
        doc: "an htpasswd file of bcrypt entries (`htpasswd -B -c FILE user`) whose users may act on servers from /TOTVS_BROKER_QUERY/ADMIN (empty: no one; the page answers 404); read again on reload",
    },
    Key {
        name: "ADMIN_PLAIN_HTTP",
        stands: Stands::General,
        domain: Domain::Flag,
        field: field!(General.admin_plain_http = Flag, flag),
        doc: "offer /TOTVS_BROKER_QUERY/ADMIN over plain HTTP to clients off this host too (passwords then cross the network in the clear; a warning at start and on the page); without it, plain HTTP only to a loopback peer, else TLS",
    },
    Key {
        name: "UPGRADE_TIMEOUT",
        stands: Stands::General,
        domain: upto_a_day(Duration::from_secs(1)),
        field: field!(General.upgrade_timeout = Duration, duration),
        doc: "under --supervise, how long `appbroker upgrade` gives the new binary's checks before it refuses; read at each upgrade",
    },
    Key {
        name: "WATCHDOG_TIMEOUT",
        stands: Stands::General,
        domain: Domain::DurationOrOff {
            min: Duration::from_secs(1),
            max: DAY,
        },
        field: field!(General.watchdog_timeout = Duration, duration),
        doc: "under --supervise, a broker that sends no heartbeat this long is killed and replaced (0: never)",
    },
    Key {
        name: "LOCAL_SERVER_ADDRESS",
        stands: Stands::OwnSection,
        domain: Domain::ListenIp,
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(ip) = take!(v, Ip) {
                    b.listen.set_ip(ip);
                }
            },
            get: |b| Some(b.listen.ip().to_string()),
        },
        doc: "the address clients connect to (0.0.0.0: every IPv4 address; ::: every address)",
    },
    Key {
        name: "LOCAL_SERVER_PORT",
        stands: Stands::OwnSection,
        domain: Domain::Integer {
            min: 1,
            max: 65535,
            what: "a port number from 1 to 65535",
        },
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(port) = take!(v, Integer) {
                    b.listen.set_port(port as u16);
                }
            },
            get: |b| Some(b.listen.port().to_string()),
        },
        doc: "the TCP port clients connect to (required)",
    },
    Key {
        name: "SORT_METHOD",
        stands: Stands::Balancer,
        domain: Domain::SortMethod,
        field: field!(Balancer.sort_method = SortMethod, |m: &SortMethod| Some(
            m.as_str().into()
        )),
        doc: "how the next server is chosen: CONNECTION, ROUND_ROBIN or SESSION (HTTP: the default)",
    },
    Key {
        name: "MONITORING_TYPE",
        stands: Stands::Balancer,
        domain: Domain::Monitoring,
        field: field!(Balancer.monitoring = Monitoring, |m: &Monitoring| Some(
            m.as_str().into()
        )),
        doc: "how the monitor checks each server: CONNECTION, SEND_EXPECT or DISABLED",
    },
    Key {
        name: "MONITOR_INTERVAL",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(100)),
        field: field!(Balancer.monitor_interval = Duration, duration),
        doc: "time between monitor rounds",
    },
    Key {
        name: "QUARANTINE_TIME",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(100)),
        field: field!(Balancer.quarantine_time = Duration, duration),
        doc: "how long a server that failed gets no new clients",
    },
    Key {
        name: "CONNECT_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(10)),
        field: field!(Balancer.connect_timeout = Duration, duration),
        doc: "bound on each connect to a server, by a client or the monitor",
    },
    Key {
        name: "MAX_ATTEMPTS",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: MAX_SERVERS,
            what: "a count of servers from 1 to 1296",
        },
        field: field!(Balancer.max_attempts = Integer as u32, number),
        doc: "servers tried for one client before it is closed",
    },
    Key {
        name: "MAX_CONNECTIONS",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 1_000_000,
            what: "a number of connections from 1 to 1000000",
        },
        field: field!(Balancer.max_connections = Integer as u32, number),
        doc: "clients at once; more are accepted and closed at once",
    },
    Key {
        name: "MAX_CONNECTIONS_PER_CLIENT",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 0,
            max: 1_000_000,
            what: "a number of connections from 0 (no limit) to 1000000",
        },
        field: field!(Balancer.max_connections_per_client = Integer as u32, number),
        doc: "connections at once from one client address (the PROXY protocol's when there is one; behind HTTP_TRUSTED_PROXIES, requests in hand and open WebSockets per X-Forwarded-For client); more are refused, on HTTP with a 503 (0: no limit)",
    },
    Key {
        name: "LOG_CONNECTIONS",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: field!(Balancer.log_connections = Flag, flag),
        doc: "one line when a connection ends",
    },
    Key {
        name: "QUERY_ENABLED",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: field!(Balancer.query.enabled = Flag, flag),
        doc: "answer /TOTVS_BROKER_QUERY on this port",
    },
    Key {
        name: "QUERY_ALLOW",
        stands: Stands::Balancer,
        domain: Domain::Cidrs,
        field: field!(Balancer.query.allow = Cidrs, cidr_list),
        doc: "addresses or CIDRs allowed to query; others get 403",
    },
    Key {
        name: "QUERY_MAX_CONNECTIONS",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 10_000,
            what: "a number of query connections from 1 to 10000",
        },
        field: field!(Balancer.query.max_connections = Integer as u32, number),
        doc: "query connections at once, apart from MAX_CONNECTIONS",
    },
    Key {
        name: "QUERY_SNIFF_TIMEOUT",
        stands: Stands::Balancer,
        domain: Domain::Duration {
            min: Duration::from_millis(10),
            max: Duration::from_secs(5),
        },
        field: field!(Balancer.query.sniff_timeout = Duration, duration),
        doc: "how long a client's first bytes are waited for to tell a query from a client",
    },
    Key {
        name: "PROXY_PROTOCOL",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: field!(Balancer.proxy.accept = Flag, flag),
        doc: "connections from PROXY_PROTOCOL_FROM begin with a PROXY protocol header (v1 or v2) naming the client, who then stands for the peer everywhere",
    },
    Key {
        name: "PROXY_PROTOCOL_FROM",
        stands: Stands::Balancer,
        domain: Domain::CidrsOrNone,
        field: field!(Balancer.proxy.from = Cidrs, cidr_list),
        doc: "addresses or CIDRs of the front balancers that send the header; others are served directly, and a header from them refused (empty: every source sends one)",
    },
    Key {
        name: "PROXY_PROTOCOL_TIMEOUT",
        stands: Stands::Balancer,
        domain: Domain::Duration {
            min: Duration::from_millis(100),
            max: Duration::from_secs(60),
        },
        field: field!(Balancer.proxy.timeout = Duration, duration),
        doc: "how long a PROXY protocol header may take to arrive whole; a connection without one by then is closed",
    },
    Key {
        name: "SEND_PROXY_PROTOCOL",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 0,
            max: 2,
            what: "0 (none), 1 (the PROXY protocol's text version) or 2 (its binary version)",
        },
        field: KeyField::Balancer {
            set: |b, v| {
                b.proxy.send = match take!(v, Integer) {
                    Some(1) => Some(ProxyVersion::V1),
                    Some(2) => Some(ProxyVersion::V2),
                    _ => None,
                };
            },
            get: |b| number(&b.proxy.send.map_or(0, ProxyVersion::number)),
        },
        doc: "write a PROXY protocol header (1: text, 2: binary) first on every connection to a server, for servers that read it; the monitor's checks send PROXY UNKNOWN (1) or LOCAL (2) (0: none)",
    },
    Key {
        name: "KEEPALIVE_TIME",
        stands: Stands::Balancer,
        domain: Domain::DurationOrOff {
            min: Duration::from_secs(1),
            max: KEEPALIVE_MAX,
        },
        field: field!(Balancer.keepalive.time = Duration, duration),
        doc: "TCP keepalive: idle time before the first probe (0: keepalive off)",
    },
    Key {
        name: "KEEPALIVE_INTERVAL",
        stands: Stands::Balancer,
        domain: Domain::Duration {
            min: Duration::from_secs(1),
            max: KEEPALIVE_MAX,
        },
        field: field!(Balancer.keepalive.interval = Duration, duration),
        doc: "TCP keepalive: time between unanswered probes",
    },
    Key {
        name: "KEEPALIVE_COUNT",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 127,
            what: "a count of probes from 1 to 127",
        },
        field: field!(Balancer.keepalive.count = Integer as u32, number),
        doc: "TCP keepalive: unanswered probes before the connection is dropped",
    },
    Key {
        name: "TCP_USER_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::ZERO),
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(d) = take!(v, Duration) {
                    b.keepalive.user_timeout = (!d.is_zero()).then_some(d);
                }
            },
            get: |b| duration(&b.keepalive.user_timeout.unwrap_or_default()),
        },
        doc: "how long sent data may stay unacknowledged (default: keepalive's TIME + INTERVAL x COUNT; 0: the kernel's)",
    },
    Key {
        name: "IDLE_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::ZERO),
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(d) = take!(v, Duration) {
                    b.idle_timeout = (!d.is_zero()).then_some(d);
                }
            },
            get: |b| duration(&b.idle_timeout.unwrap_or_default()),
        },
        doc: "close a connection with no bytes either way for this long (0: never)",
    },
    Key {
        name: "MONITOR_FALL",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 100,
            what: "a count of checks from 1 to 100",
        },
        field: field!(Balancer.monitor_fall = Integer as u32, number),
        doc: "failed checks in a row that put a server in quarantine",
    },
    Key {
        name: "MONITOR_RISE",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 100,
            what: "a count of checks from 1 to 100",
        },
        field: field!(Balancer.monitor_rise = Integer as u32, number),
        doc: "passed checks in a row that release a quarantined server",
    },
    Key {
        name: "DNS_CACHE_TIME",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::ZERO),
        field: field!(Balancer.dns_cache_time = Duration, duration),
        doc: "how long a server name's addresses are used before it is looked up again",
    },
    Key {
        name: "SSL_CERTIFICATE",
        stands: Stands::Balancer,
        domain: Domain::Path,
        field: field!(Balancer.tls.certificate = Path, path),
        doc: "with SSL_KEY: TLS towards clients with this PEM certificate chain, leaf first",
    },
    Key {
        name: "SSL_KEY",
        stands: Stands::Balancer,
        domain: Domain::Path,
        field: field!(Balancer.tls.key = Path, path),
        doc: "the certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1)",
    },
    Key {
        name: "SSL_PASSPHRASE",
        stands: Stands::Balancer,
        domain: Domain::Secret { min: 0 },
        field: field!(Balancer.tls.passphrase = Secret, shown_secret),
        doc: "decrypts an encrypted PKCS#8 SSL_KEY; never printed, shown as (set)",
    },
    Key {
        name: "SSL_METHOD",
        stands: Stands::Balancer,
        domain: Domain::SslMethod,
        field: field!(Balancer.tls.method = SslMethod, |m: &SslMethod| Some(
            m.as_str().into()
        )),
        doc: "TLS versions: SSL/TLS (1.2 and 1.3), TLSv1.2 or TLSv1.3; older ones mean 1.2 and 1.3",
    },
    Key {
        name: "SSL_PLAIN_ON_SAME_PORT",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: field!(Balancer.tls.plain_on_same_port = Flag, flag),
        doc: "a TLS port accepts plain clients too, told apart by their first byte",
    },
    Key {
        name: "SSL_ENCRYPT_UPSTREAM",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: field!(Balancer.tls.encrypt_upstream = Flag, flag),
        doc: "TLS towards the servers, for clients' traffic (TCP and HTTP) and SEND_EXPECT and HTTP checks",
    },
    Key {
        name: "SSL_UPSTREAM_VERIFY",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: field!(Balancer.tls.upstream_verify = Flag, flag),
        doc: "verify the servers' certificates (0: encrypted but not authenticated)",
    },
    Key {
        name: "SSL_UPSTREAM_CA",
        stands: Stands::Balancer,
        domain: Domain::Path,
        field: field!(Balancer.tls.upstream_ca = Path, path),
        doc: "PEM file of the CAs trusted for the servers and of servers' own certificates, pinned (empty: the system's roots)",
    },
    Key {
        name: "SSL_UPSTREAM_SERVER_NAME",
        stands: Stands::Balancer,
        domain: Domain::Text,
        field: field!(Balancer.tls.upstream_server_name = Text, |n: &Option<
            String,
        >| Some(
            n.clone().unwrap_or_default()
        )),
        doc: "the name the servers' certificates must hold, when they are given by address",
    },
    // Set after MONITORING_TYPE, which they complete; printed only with SEND_EXPECT.
    Key {
        name: "MONITOR_SEND",
        stands: Stands::Balancer,
        domain: Domain::Escaped,
        field: KeyField::Balancer {
            set: |b, v| {
                if let (Monitoring::SendExpect { send, .. }, Some(bytes)) =
                    (&mut b.monitoring, take!(v, Bytes))
                {
                    *send = bytes;
                }
            },
            get: |b| match &b.monitoring {
                Monitoring::SendExpect { send, .. } => Some(show_escaped(send)),
                _ => None,
            },
        },
        doc: "with SEND_EXPECT: the bytes written after connecting (may be empty)",
    },
    Key {
        name: "MONITOR_EXPECT",
        stands: Stands::Balancer,
        domain: Domain::Escaped,
        field: KeyField::Balancer {
            set: |b, v| {
                if let (Monitoring::SendExpect { expect, .. }, Some(bytes)) =
                    (&mut b.monitoring, take!(v, Bytes))
                {
                    *expect = bytes;
                }
            },
            get: |b| match &b.monitoring {
                Monitoring::SendExpect { expect, .. } => Some(show_escaped(expect)),
                _ => None,
            },
        },
        doc: "with SEND_EXPECT: the bytes the reply must start with (required)",
    },
    Key {
        name: "MONITOR_PATH",
        stands: Stands::Balancer,
        domain: Domain::HttpPath,
        field: KeyField::Balancer {
            set: |b, v| {
                if let (Monitoring::Http { path, .. }, Some(text)) =
                    (&mut b.monitoring, take!(v, HttpPath))
                {
                    *path = text;
                }
            },
            get: |b| match &b.monitoring {
                Monitoring::Http { path, .. } => Some(path.clone()),
                _ => None,
            },
        },
        doc: "with HTTP: the path the monitor asks for (default /)",
    },
    Key {
        name: "MONITOR_EXPECT_STATUS",
        stands: Stands::Balancer,
        domain: Domain::StatusRange,
        field: KeyField::Balancer {
            set: |b, v| {
                if let (Monitoring::Http { expect, .. }, Some(range)) =
                    (&mut b.monitoring, take!(v, StatusRange))
                {
                    *expect = range;
                }
            },
            get: |b| match &b.monitoring {
                Monitoring::Http { expect, .. } => Some(expect.to_string()),
                _ => None,
            },
        },
        doc: "with HTTP: the statuses that pass, one (200) or a range (default 200-399)",
    },
    // The HTTP broker's keys: printed for [BALANCE_HTTP*] sections only.
    Key {
        name: "HTTP_FORWARDED_HEADERS",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: http_field!(forwarded_headers = Flag, flag),
        doc: "HTTP: append X-Forwarded-For, set X-Forwarded-Proto, X-Forwarded-Host and X-Real-IP on requests",
    },
    Key {
        name: "HTTP_TRUSTED_PROXIES",
        stands: Stands::Balancer,
        domain: Domain::CidrsOrNone,
        field: KeyField::Balancer {
            set: |b, v| {
                if let Value::Cidrs(list) = v {
                    b.http.trusted_proxies = list;
                }
            },
            get: |b| on_http(b, &b.http.trusted_proxies, |list| cidr_list(list)),
        },
        doc: "HTTP: addresses or CIDRs of L7 proxies in front; from them X-Forwarded-For names the client (walked from the right: its first address not listed; junk met first: unknown, never the proxy), for X-Real-IP, QUERY_ALLOW, the log and MAX_CONNECTIONS_PER_CLIENT (empty: none)",
    },
    Key {
        name: "HTTP_UPGRADE_PROTOCOLS",
        stands: Stands::Balancer,
        domain: Domain::Protocols,
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(protocols) = take!(v, Protocols) {
                    b.http.upgrade_protocols = protocols;
                }
            },
            get: |b| on_http(b, &b.http.upgrade_protocols, |p| Some(p.join(", "))),
        },
        doc: "HTTP: the protocols a request may switch to (Upgrade); others go on as plain HTTP",
    },
    Key {
        name: "HTTP_POOL_MAX_IDLE",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 0,
            max: 10_000,
            what: "a number of connections from 0 (no pooling) to 10000",
        },
        field: http_field!(pool_max_idle = Integer as u32, number),
        doc: "HTTP: idle keep-alive connections kept per server and worker thread (0: a new one per request)",
    },
    Key {
        name: "HTTP_POOL_IDLE_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(100)),
        field: http_field!(pool_idle_timeout = Duration, duration),
        doc: "HTTP: an idle kept-alive connection to a server is closed after this long",
    },
    Key {
        name: "HTTP_REQUEST_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(100)),
        field: http_field!(request_timeout = Duration, duration),
        doc: "HTTP: a request's head must arrive within this (slow clients are closed)",
    },
    Key {
        name: "HTTP_RESPONSE_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(100)),
        field: http_field!(response_timeout = Duration, duration),
        doc: "HTTP: the longest wait for a server's answer once the request is sent, and the longest silence within its body (504 before the head, the connection cut after)",
    },
    Key {
        name: "HTTP_BODY_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_millis(100)),
        field: http_field!(body_timeout = Duration, duration),
        doc: "HTTP: the longest silence within a client's request body (408 before any answer, else the connection is closed)",
    },
    Key {
        name: "HTTP_TIMEOUTS_TO_QUARANTINE",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 0,
            max: 1000,
            what: "a number of requests from 0 (never) to 1000",
        },
        field: http_field!(timeouts_to_quarantine = Integer as u32, number),
        doc: "HTTP: a server whose requests time out (HTTP_RESPONSE_TIMEOUT) this many times in a row is quarantined (0: never)",
    },
    Key {
        name: "LOG_REQUESTS",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: http_field!(log_requests = Flag, flag),
        doc: "HTTP: one access-log line per request (a WebSocket's when it ends, with its bytes)",
    },
    Key {
        name: "HTTP_RETRY_IDEMPOTENT",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: http_field!(retry_idempotent = Flag, flag),
        doc: "HTTP: retry on the next server an idempotent request that failed before any answer",
    },
    Key {
        name: "SESSION_TIMEOUT",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_secs(1)),
        field: http_field!(session_timeout = Duration, duration),
        doc: "HTTP: a session ends after this long without a request (not while a WebSocket of it is open)",
    },
    Key {
        name: "HTTP_MAX_SESSIONS",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 0,
            max: 10_000_000,
            what: "a number of sessions from 0 (none tracked) to 10000000",
        },
        field: http_field!(max_sessions = Integer as u32, number),
        doc: "HTTP: most sessions tracked; the oldest idle are forgotten first (they keep their server)",
    },
    Key {
        name: "HTTP_MAX_SESSIONS_PER_CLIENT",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 0,
            max: 10_000_000,
            what: "a number of sessions from 0 (no cap) to 10000000",
        },
        field: http_field!(max_sessions_per_client = Integer as u32, number),
        doc: "HTTP: most sessions of one client (the PROXY protocol's, or HTTP_TRUSTED_PROXIES' walk) tracked and counted at once; its others keep their server but count for nothing, so one client cannot steer new sessions (0: no cap; raise it where many users share one address)",
    },
    Key {
        name: "HTTP_STICKY_STRICT",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: http_field!(sticky_strict = Flag, flag),
        doc: "HTTP: answer 503 rather than move a session whose server is in quarantine or removed",
    },
    Key {
        name: "HTTP2",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: http_field!(http2 = Flag, flag),
        doc: "HTTP over TLS: offer HTTP/2 (ALPN h2) besides HTTP/1.1 (0: HTTP/1.1 only; new connections after a reload)",
    },
    Key {
        name: "HTTP2_MAX_STREAMS",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 1000,
            what: "a number of streams from 1 to 1000",
        },
        field: http_field!(http2_max_streams = Integer as u32, number),
        doc: "HTTP/2: requests one connection may have in hand at once (SETTINGS_MAX_CONCURRENT_STREAMS)",
    },
    Key {
        name: "HTTP2_WEBSOCKET",
        stands: Stands::Balancer,
        domain: Domain::Flag,
        field: http_field!(http2_websocket = Flag, flag),
        doc: "HTTP/2: offer WebSocket over HTTP/2 (RFC 8441), relayed to the server as an HTTP/1.1 upgrade (0: browsers open it on an HTTP/1.1 connection)",
    },
    // Alerts and restarts: a balancer's own, else [General]'s for every balancer.
    Key {
        name: "ALERT_WEBHOOK",
        stands: Stands::Balancer,
        domain: Domain::Webhook,
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(hook) = take!(v, Webhook) {
                    b.alerts.webhook = hook;
                }
            },
            get: |b| {
                Some(
                    b.alerts
                        .webhook
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                )
            },
        },
        doc: "an http:// or https:// URL each alert is POSTed to (empty: none); a secret, shown as (set: https://host)",
    },
    Key {
        name: "ALERT_WEBHOOK_CA",
        stands: Stands::Balancer,
        domain: Domain::Path,
        field: field!(Balancer.alerts.webhook_ca = Path, path),
        doc: "PEM file of the CAs trusted for an https ALERT_WEBHOOK (empty: the system's roots)",
    },
    Key {
        name: "ALERT_WEBHOOK_FORMAT",
        stands: Stands::Balancer,
        domain: Domain::AlertFormat,
        field: field!(
            Balancer.alerts.format = AlertFormat,
            |f: &AlertFormat| Some(f.as_str().into())
        ),
        doc: "json (the event object) or text ({\"text\": \"one line\"}: Slack, Mattermost, Rocket.Chat, Teams)",
    },
    Key {
        name: "ALERT_COMMAND",
        stands: Stands::Balancer,
        domain: Domain::Secret { min: 0 },
        field: field!(Balancer.alerts.command = Secret, shown_secret),
        doc: "a command run with /bin/sh -c for each alert, the event's JSON on its standard input (empty: none); shown as (set)",
    },
    Key {
        name: "ALERT_EVENTS",
        stands: Stands::Balancer,
        domain: Domain::AlertEvents,
        field: field!(
            Balancer.alerts.events = AlertEvents,
            |e: &AlertEvents| Some(e.to_string())
        ),
        doc: "the events alerts are sent for, separated by commas (default all)",
    },
    Key {
        name: "ALERT_TIMEOUT",
        stands: Stands::Balancer,
        domain: Domain::Duration {
            min: Duration::from_secs(1),
            max: Duration::from_secs(300),
        },
        field: field!(Balancer.alerts.timeout = Duration, duration),
        doc: "bound on each delivery of an alert (one webhook request, one command)",
    },
    Key {
        name: "RESTART_COMMAND",
        stands: Stands::Balancer,
        domain: Domain::Secret { min: 0 },
        field: field!(Balancer.restarts.command = Secret, shown_secret),
        doc: "a command run with /bin/sh -c for a server in a health quarantine for RESTART_AFTER (empty: none); shown as (set)",
    },
    Key {
        name: "RESTART_AFTER",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_secs(1)),
        field: field!(Balancer.restarts.after = Duration, duration),
        doc: "how long a server stays in a health quarantine before RESTART_COMMAND runs",
    },
    Key {
        name: "RESTART_COOLDOWN",
        stands: Stands::Balancer,
        domain: upto_a_day(Duration::from_secs(1)),
        field: field!(Balancer.restarts.cooldown = Duration, duration),
        doc: "the shortest time between two restarts of one AppServer (its host and id, in any balancer)",
    },
    Key {
        name: "RESTART_TIMEOUT",
        stands: Stands::Balancer,
        domain: Domain::Duration {
            min: Duration::from_secs(1),
            max: Duration::from_secs(1800),
        },
        field: field!(Balancer.restarts.timeout = Duration, duration),
        doc: "RESTART_COMMAND is killed after this long",
    },
    Key {
        name: "RESTART_MAX_PARALLEL",
        stands: Stands::Balancer,
        domain: Domain::Integer {
            min: 1,
            max: 64,
            what: "a number of restarts from 1 to 64",
        },
        field: field!(Balancer.restarts.max_parallel = Integer as u32, number),
        doc: "restarts of this balancer's servers running at once",
    },
    Key {
        name: "RESTART_ONLY_WITH_ADDRESS",
        stands: Stands::Balancer,
        domain: Domain::OptionalIp,
        field: KeyField::Balancer {
            set: |b, v| {
                if let Some(ip) = take!(v, OptionalIp) {
                    b.restarts.only_with_address = ip;
                }
            },
            get: |b| {
                Some(
                    b.restarts
                        .only_with_address
                        .map(|ip| ip.to_string())
                        .unwrap_or_default(),
                )
            },
        },
        doc: "restart only while this address (a pair's virtual address) is on this host (empty: always)",
    },
];

/// The keys whose values are shell commands: a `;` in them separates commands, where in any
/// other value it is a mistaken comment (refused).
pub const SHELL_COMMANDS: &[&str] = &["ALERT_COMMAND", "RESTART_COMMAND"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BalancerKind;

    /// A value of `domain` as the file would give it, and the value it parses to.
    fn sample(domain: Domain) -> &'static str {
        match domain {
            Domain::Flag => "0",
            Domain::Integer { max, .. } if max == u64::MAX => "12345",
            Domain::Integer { min, max, .. } => match min {
                _ if max < 7 => "1",
                0 => "7",
                _ => "2",
            },
            Domain::Duration { max, .. } if max < Duration::from_secs(10) => "1500ms",
            Domain::Duration { .. } | Domain::DurationOrOff { .. } => "7s",
            Domain::ListenIp => "10.0.0.7",
            Domain::Cidrs | Domain::CidrsOrNone => "10.0.0.0/8, ::1/128",
            Domain::Protocols => "websocket h2c/1",
            Domain::Escaped => r"PING\r\n",
            Domain::Path => "/var/log/broker.log",
            Domain::Name => "appbroker",
            Domain::SortMethod => "ROUND_ROBIN",
            Domain::Monitoring => "DISABLED",
            Domain::Language => "pt-BR",
            Domain::Text => "appserver.example.com",
            Domain::Secret { .. } => "a secret of 32 characters or more",
            Domain::SslMethod => "TLSv1.3",
            Domain::HttpPath => "/health?full=1",
            Domain::StatusRange => "204-299",
            Domain::Webhook => "https://hooks.example.com/services/T0/B0/token",
            Domain::AlertFormat => "text",
            Domain::AlertEvents => "quarantine_entered, restart_ran",
            Domain::OptionalIp => "10.0.0.100",
        }
    }

    #[test]
    fn every_key_round_trips_through_its_field() {
        for key in KEYS {
            let text = sample(key.domain);
            let printed = match key.field {
                KeyField::General { get, .. } => {
                    let mut general = General::defaults();
                    key.set_general(&mut general, text).expect("a valid sample");
                    get(&general)
                }
                KeyField::Balancer { get, .. } => {
                    let mut b = BalancerConfig::defaults(BalancerKind::http("BALANCE_HTTP"));
                    if key.name.starts_with("MONITOR_") && key.domain == Domain::Escaped {
                        b.monitoring = Monitoring::SendExpect {
                            send: Vec::new(),
                            expect: Vec::new(),
                        };
                    }
                    if key.name.starts_with("MONITOR_")
                        && matches!(key.domain, Domain::HttpPath | Domain::StatusRange)
                    {
                        b.monitoring = "HTTP".parse().expect("a monitoring type");
                    }
                    key.set_balancer(&mut b, text).expect("a valid sample");
                    get(&b)
                }
            };
            let printed = printed.unwrap_or_else(|| panic!("{} is printed", key.name));
            if key.domain == Domain::Webhook {
                assert_eq!(printed, "(set: https://hooks.example.com)", "{}", key.name);
            } else if key.domain.is_secret() {
                // Never printed: the round trip is `(set)`.
                assert_eq!(printed, "(set)", "{}", key.name);
            } else {
                assert_eq!(
                    key.domain.parse(&printed),
                    key.domain.parse(text),
                    "{}: `{text}` printed as `{printed}`",
                    key.name
                );
            }
            assert!(
                matches!(key.field, KeyField::General { .. }) == (key.stands == Stands::General),
                "{}: a [General] key sets General",
                key.name
            );
        }
    }

    #[test]
    fn every_word_of_a_domain_is_accepted_in_any_case() {
        let domains = [
            Domain::Flag,
            Domain::SortMethod,
            Domain::Monitoring,
            Domain::Language,
            Domain::SslMethod,
        ];
        for domain in domains {
            assert!(!domain.words().is_empty());
            for word in domain.words() {
                assert!(domain.parse(word).is_ok(), "{word}");
                if domain != Domain::Flag {
                    assert!(domain.parse(&word.to_ascii_lowercase()).is_ok(), "{word}");
                }
            }
        }
        assert!(Domain::SortMethod.parse("FEWEST").is_err());
    }

    #[test]
    fn a_session_secret_shorter_than_32_characters_is_refused_without_being_repeated() {
        let key = find("SESSION_SECRET").expect("the key");
        let mut general = General::defaults();
        let error = key
            .set_general(&mut general, "short-secret")
            .expect_err("too short");
        assert!(error.contains("12 characters long"), "{error}");
        assert!(!error.contains("short-secret"), "{error}");
        key.set_general(&mut general, "").expect("empty: none");
        assert_eq!(general.session_secret, None);
        let long = "x".repeat(32);
        key.set_general(&mut general, &long).expect("32 characters");
        assert_eq!(general.session_secret, Some(Passphrase::new(long)));
    }

    #[test]
    fn names_are_upper_case_and_unique() {
        for (i, key) in KEYS.iter().enumerate() {
            assert_eq!(key.name, key.name.to_ascii_uppercase());
            assert!(
                KEYS[..i].iter().all(|k| k.name != key.name),
                "{} twice",
                key.name
            );
        }
    }
}
