//! The configuration as the broker uses it: [`Config`] and its parts (`[General]`'s settings,
//! each balancer's, the servers, monitoring, TLS keys), the values enum-valued keys take, where
//! each effective value came from, and [`Loaded`], what a load yields.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::alerting::{AlertSettings, RestartSettings};
use super::errors::{Notice, ValueError};
use super::value::{Cidr, Host, ServerId};
use crate::tls::files::Passphrase;
use crate::tls::{ServerSettings, SslMethod, UpstreamSettings};

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
    /// `CONTROL_SOCKET`: the control socket's path; `None` derives it from the file's name,
    /// `0` turns it off (see `admin::paths`).
    pub control_socket: Option<PathBuf>,
    /// `CONTROL_GROUP`: a group that may use the control socket too.
    pub control_group: Option<String>,
    /// `STATE_FILE`: where overrides are kept; `None` derives it, `0` turns it off.
    pub state_file: Option<PathBuf>,
    /// `SESSION_SECRET`: signs the HTTP session cookie; `None`: the secret kept beside the
    /// state file (or one made for this run).
    pub session_secret: Option<Passphrase>,
    /// `SESSION_SECRET_PREVIOUS`: a former secret whose cookies still verify (a rotation).
    pub session_secret_previous: Option<Passphrase>,
    /// `UPGRADE_TIMEOUT`: how long a supervisor gives the new binary's `--check` and
    /// `--handover-version` before it refuses the upgrade and kills them.
    pub upgrade_timeout: Duration,
    /// `WATCHDOG_TIMEOUT`: how long a supervisor waits for a heartbeat from its broker before
    /// it kills and replaces it; zero for never.
    pub watchdog_timeout: Duration,
    /// `HTTP_HEAD_MEMORY`, in bytes: the most every HTTP balancer's request heads still
    /// arriving may hold together; past it the oldest are answered 408.
    pub http_head_memory: usize,
}

/// `HTTP_HEAD_MEMORY`'s default, in bytes: a thousand heads of the largest size (64 KiB)
/// still arriving, or four thousand of a browser's.
pub const DEFAULT_HTTP_HEAD_MEMORY: usize = 64 << 20;

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

impl FromStr for Language {
    type Err = ValueError;

    /// `en`, or `pt-BR` (also `pt_BR` and `pt`), in any case.
    fn from_str(text: &str) -> Result<Self, ValueError> {
        match text.to_ascii_lowercase().as_str() {
            "en" => Ok(Language::English),
            "pt-br" | "pt_br" | "pt" => Ok(Language::Portuguese),
            _ => Err(ValueError::LANGUAGE),
        }
    }
}

/// Which balancer a `[BALANCE_*]` section configures.
///
/// The HTTP balancers are told apart by their section's name (`[BALANCE_HTTP]`,
/// `[BALANCE_HTTP_2]`...), interned once per distinct name for the life of the process, so
/// the kind stays a small `Copy` value that compares, sorts and hashes like the TCP ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BalancerKind {
    /// `[BALANCE_SMART_CLIENT_DESKTOP]`: SmartClient Desktop connections.
    SmartClientDesktop,
    /// `[BALANCE_WEB_SERVICES]`: stateless web-service callers.
    WebServices,
    /// `[BALANCE_HTTP*]` (or the older `[BALANCE_HTML]`): the HTTP broker, by section name in
    /// upper case.
    Http(&'static str),
}

impl BalancerKind {
    /// The section name as TOTVS writes it.
    pub fn section(self) -> &'static str {
        match self {
            BalancerKind::SmartClientDesktop => "BALANCE_SMART_CLIENT_DESKTOP",
            BalancerKind::WebServices => "BALANCE_WEB_SERVICES",
            BalancerKind::Http(name) => name,
        }
    }

    /// The HTTP balancer of section `name` (any case; interned on first use).
    pub fn http(name: &str) -> BalancerKind {
        BalancerKind::Http(intern(&name.to_ascii_uppercase()))
    }

    /// True for an HTTP balancer (`[BALANCE_HTTP*]`), whose port speaks HTTP to clients.
    pub fn is_http(self) -> bool {
        matches!(self, BalancerKind::Http(_))
    }

    pub(super) fn from_section(name: &str) -> Option<Self> {
        match name {
            "BALANCE_SMART_CLIENT_DESKTOP" => Some(BalancerKind::SmartClientDesktop),
            "BALANCE_WEB_SERVICES" => Some(BalancerKind::WebServices),
            "BALANCE_HTML" => Some(BalancerKind::http(name)),
            _ if name.starts_with("BALANCE_HTTP") => Some(BalancerKind::http(name)),
            _ => None,
        }
    }
}

/// `name` as a `&'static str`, the same one for every equal name: each distinct HTTP section
/// name is leaked once (a handful per configuration, never per connection).
fn intern(name: &str) -> &'static str {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
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
    /// `MAX_CONNECTIONS_PER_CLIENT`: simultaneous connections of one client address; more
    /// are closed at once (0: no limit).
    pub max_connections_per_client: u32,
    /// `PROXY_PROTOCOL*` and `SEND_PROXY_PROTOCOL`: the PROXY protocol from a front balancer
    /// and towards the servers.
    pub proxy: ProxyProtocol,
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
    /// `SSL_*`: TLS towards clients and towards the servers.
    pub tls: TlsKeys,
    /// `HTTP_*` and `LOG_REQUESTS`: the HTTP broker's settings (read by `[BALANCE_HTTP*]`
    /// balancers only).
    pub http: HttpSettings,
    /// `ALERT_*`: where this balancer's alerts go.
    pub alerts: AlertSettings,
    /// `RESTART_*`: when a command restarts a server stuck in quarantine.
    pub restarts: RestartSettings,
}

/// A balancer's `SSL_*` keys, as written: TLS towards its clients (`SSL_CERTIFICATE` and
/// `SSL_KEY` both set) and towards its servers (`SSL_ENCRYPT_UPSTREAM=1`). The files are read
/// when the configuration is validated (the doctor) and again when the balancer starts or
/// reloads ([`crate::tls`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsKeys {
    /// `SSL_CERTIFICATE`: the PEM chain, leaf first.
    pub certificate: Option<PathBuf>,
    /// `SSL_KEY`: the PEM private key.
    pub key: Option<PathBuf>,
    /// `SSL_PASSPHRASE`: for an encrypted PKCS#8 key; printed as `(set)` everywhere.
    pub passphrase: Option<Passphrase>,
    /// `SSL_METHOD`: the TLS versions spoken, both ways.
    pub method: SslMethod,
    /// `SSL_ENCRYPT_UPSTREAM`: TLS towards the servers (clients' traffic, TCP and HTTP alike,
    /// and SEND_EXPECT and HTTP checks).
    pub encrypt_upstream: bool,
    /// `SSL_UPSTREAM_VERIFY`: verify the servers' certificates (on unless said otherwise).
    pub upstream_verify: bool,
    /// `SSL_UPSTREAM_CA`: the CAs trusted for the servers, and servers' own certificates,
    /// pinned (default: the system's roots).
    pub upstream_ca: Option<PathBuf>,
    /// `SSL_UPSTREAM_SERVER_NAME`: the name verified (and sent as SNI) instead of each
    /// server's host, for servers addressed by IP.
    pub upstream_server_name: Option<String>,
    /// `SSL_PLAIN_ON_SAME_PORT`: plain clients too on a TLS port, told apart by the first
    /// byte.
    pub plain_on_same_port: bool,
}

impl TlsKeys {
    /// What the listener's TLS is built from; `None` unless both certificate and key are set.
    /// `alpn_http1`: the balancer speaks HTTP (offers ALPN `http/1.1`); `alpn_h2`: HTTP/2 too
    /// (`h2`, preferred).
    pub fn server(&self, alpn_http1: bool, alpn_h2: bool) -> Option<ServerSettings> {
        Some(ServerSettings {
            certificate: self.certificate.clone()?,
            key: self.key.clone()?,
            passphrase: self.passphrase.clone(),
            method: self.method,
            alpn_http1,
            alpn_h2: alpn_http1 && alpn_h2,
        })
    }

    /// What the connections to the servers are built from; `None` without
    /// `SSL_ENCRYPT_UPSTREAM=1`.
    pub fn upstream(&self, alpn_http1: bool) -> Option<UpstreamSettings> {
        self.encrypt_upstream.then(|| UpstreamSettings {
            verify: self.upstream_verify,
            ca: self.upstream_ca.clone(),
            server_name: self.upstream_server_name.clone(),
            method: self.method,
            alpn_http1,
        })
    }
}

/// The PROXY protocol on a balancer: headers read from a front balancer (HAProxy, an AWS NLB,
/// an F5) that name the client, and headers sent to servers that read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyProtocol {
    /// `PROXY_PROTOCOL`: connections from `from` must begin with a header, whose client
    /// address then stands for the connection's peer everywhere.
    pub accept: bool,
    /// `PROXY_PROTOCOL_FROM`: the sources that send headers (front balancers); others are
    /// served as direct clients, and a header from one of them is refused. Empty: every
    /// source must send one.
    pub from: Vec<Cidr>,
    /// `PROXY_PROTOCOL_TIMEOUT`: how long a header may take to arrive whole.
    pub timeout: Duration,
    /// `SEND_PROXY_PROTOCOL`: the header written first on every connection to a server, in
    /// this version (`None`: none).
    pub send: Option<ProxyVersion>,
}

/// A version of the PROXY protocol, as `SEND_PROXY_PROTOCOL` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyVersion {
    /// `1`: a line of text (`PROXY TCP4 ...\r\n`); every PROXY-aware server reads it.
    V1,
    /// `2`: binary, with `LOCAL` for the monitor's checks.
    V2,
}

impl ProxyVersion {
    /// The number `SEND_PROXY_PROTOCOL` writes for it.
    pub fn number(self) -> u8 {
        match self {
            ProxyVersion::V1 => 1,
            ProxyVersion::V2 => 2,
        }
    }
}

/// The settings of an HTTP balancer's engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// `HTTP_FORWARDED_HEADERS`: append `X-Forwarded-For`, set `-Proto`, `-Host` and
    /// `X-Real-IP`.
    pub forwarded_headers: bool,
    /// `HTTP_UPGRADE_PROTOCOLS`: the protocols a request may switch to, as written.
    pub upgrade_protocols: Vec<String>,
    /// `HTTP_POOL_MAX_IDLE`: idle keep-alive connections kept per server and worker thread.
    pub pool_max_idle: u32,
    /// `HTTP_POOL_IDLE_TIMEOUT`: an idle kept-alive connection older than this is closed.
    pub pool_idle_timeout: Duration,
    /// `HTTP_REQUEST_TIMEOUT`: a request's head must arrive within this.
    pub request_timeout: Duration,
    /// `HTTP_RESPONSE_TIMEOUT`: the longest wait for an answer's head once the request was
    /// sent, and the longest silence within the answer's body.
    pub response_timeout: Duration,
    /// `HTTP_BODY_TIMEOUT`: the longest silence within a request's body.
    pub body_timeout: Duration,
    /// `HTTP_TIMEOUTS_TO_QUARANTINE`: requests timed out in a row that quarantine a server
    /// (0: never).
    pub timeouts_to_quarantine: u32,
    /// `LOG_REQUESTS`: one access-log line per request.
    pub log_requests: bool,
    /// `HTTP_RETRY_IDEMPOTENT`: an idempotent request without a body that failed after it was
    /// sent, with no byte of an answer, is tried on the next server.
    pub retry_idempotent: bool,
    /// `SESSION_TIMEOUT`: a session ends after this long without a request.
    pub session_timeout: Duration,
    /// `HTTP_MAX_SESSIONS`: most sessions tracked (the oldest idle forgotten first).
    pub max_sessions: u32,
    /// `HTTP_MAX_SESSIONS_PER_CLIENT`: most sessions of one client tracked and counted at
    /// once (0: no cap), so that one client cannot steer the balance of new sessions.
    pub max_sessions_per_client: u32,
    /// `HTTP_STICKY_STRICT`: 503 rather than move a session to another server.
    pub sticky_strict: bool,
    /// `HTTP_TRUSTED_PROXIES`: the L7 proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<Cidr>,
    /// `HTTP2`: a TLS port offers HTTP/2 (ALPN `h2`) besides HTTP/1.1.
    pub http2: bool,
    /// `HTTP2_MAX_STREAMS`: the streams one HTTP/2 connection may have in hand at once.
    pub http2_max_streams: u32,
    /// `HTTP2_WEBSOCKET`: WebSocket over HTTP/2 (RFC 8441's extended CONNECT) is offered.
    pub http2_websocket: bool,
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
    /// HTTP balancers (their default): fewest live sessions (plus requests in hand) per unit
    /// of weight. A TCP balancer has no sessions and uses CONNECTION.
    Session,
}

impl SortMethod {
    /// The value as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            SortMethod::Connection => "CONNECTION",
            SortMethod::RoundRobin => "ROUND_ROBIN",
            SortMethod::Session => "SESSION",
        }
    }
}

impl FromStr for SortMethod {
    type Err = ValueError;

    /// `CONNECTION`, `ROUND_ROBIN` or `SESSION`, in any case. (The TOTVS methods that stand for
    /// CONNECTION are the configuration's business: [`TOTVS_SORT_METHODS`].)
    fn from_str(text: &str) -> Result<Self, ValueError> {
        match text.to_ascii_uppercase().as_str() {
            "CONNECTION" => Ok(SortMethod::Connection),
            "ROUND_ROBIN" => Ok(SortMethod::RoundRobin),
            "SESSION" => Ok(SortMethod::Session),
            _ => Err(ValueError::SORT_METHOD),
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
    /// A TCP connect (TLS with `SSL_ENCRYPT_UPSTREAM`), then `GET path`; passed when the
    /// status is within `expect`, all within `CONNECT_TIMEOUT`.
    Http {
        /// `MONITOR_PATH`: the path asked, starting with `/`.
        path: String,
        /// `MONITOR_EXPECT_STATUS`: the statuses that pass.
        expect: StatusRange,
    },
    /// No checks; quarantines end only when their time is up.
    Disabled,
}

/// `MONITOR_EXPECT_STATUS`: the statuses that pass, `200-399` or one status `200`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange {
    /// The lowest passing status.
    pub low: u16,
    /// The highest passing status.
    pub high: u16,
}

impl StatusRange {
    /// Whether `status` passes.
    pub fn contains(self, status: u16) -> bool {
        (self.low..=self.high).contains(&status)
    }
}

impl Default for StatusRange {
    /// `200-399`: answered, and not an error.
    fn default() -> StatusRange {
        StatusRange {
            low: 200,
            high: 399,
        }
    }
}

impl fmt::Display for StatusRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}-{}", self.low, self.high)
        }
    }
}

impl FromStr for StatusRange {
    type Err = String;

    fn from_str(s: &str) -> Result<StatusRange, String> {
        let status = |t: &str| match t.trim().parse::<u16>() {
            Ok(n) if (100..=599).contains(&n) => Ok(n),
            _ => Err(format!(
                "{:?} is not an HTTP status (100 to 599); write one status (200) or a range (200-399)",
                t.trim()
            )),
        };
        let (low, high) = match s.split_once('-') {
            Some((low, high)) => (status(low)?, status(high)?),
            None => {
                let one = status(s)?;
                (one, one)
            }
        };
        if low > high {
            return Err(format!(
                "{low}-{high} is empty; write the lower status first"
            ));
        }
        Ok(StatusRange { low, high })
    }
}

impl Monitoring {
    /// The value as written in the file.
    pub fn as_str(&self) -> &'static str {
        match self {
            Monitoring::Connection => "CONNECTION",
            Monitoring::SendExpect { .. } => "SEND_EXPECT",
            Monitoring::Http { .. } => "HTTP",
            Monitoring::Disabled => "DISABLED",
        }
    }
}

impl FromStr for Monitoring {
    type Err = ValueError;

    /// `CONNECTION`, `SEND_EXPECT` (its bytes empty: `MONITOR_SEND` and `MONITOR_EXPECT` fill
    /// them), `HTTP` (`GET /` expecting 200-399 until `MONITOR_PATH` and
    /// `MONITOR_EXPECT_STATUS` say otherwise) or `DISABLED` (also `DISABLE`), in any case. (The TOTVS types that stand for
    /// CONNECTION are the configuration's business: [`TOTVS_MONITORING_TYPES`].)
    fn from_str(text: &str) -> Result<Self, ValueError> {
        match text.to_ascii_uppercase().as_str() {
            "CONNECTION" => Ok(Monitoring::Connection),
            "SEND_EXPECT" => Ok(Monitoring::SendExpect {
                send: Vec::new(),
                expect: Vec::new(),
            }),
            "HTTP" => Ok(Monitoring::Http {
                path: "/".into(),
                expect: StatusRange::default(),
            }),
            "DISABLED" | "DISABLE" => Ok(Monitoring::Disabled),
            _ => Err(ValueError::MONITORING),
        }
    }
}

/// TOTVS sort methods that need figures only a TOTVS AppServer reports about itself:
/// accepted, with a notice, and CONNECTION is used.
pub const TOTVS_SORT_METHODS: &[&str] = &[
    "SERVER_MEMORY",
    "SERVER_USERS",
    "SERVER_THREADS",
    "SERVER_CPU",
];

/// TOTVS monitoring types that log in with SmartClient's undocumented protocol: accepted, with
/// a notice, and CONNECTION is used.
pub const TOTVS_MONITORING_TYPES: &[&str] = &[
    "SMARTCLIENT",
    "SMARTCLIENT_SSL",
    "SMARTCLIENT_ACTIVE",
    "SMARTCLIENT_SSL_ACTIVE",
];

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

    pub(super) fn set(&mut self, section: &str, key: &str, origin: Origin) {
        self.0
            .insert((section.to_string(), key.to_string()), origin);
    }
}

/// A loaded configuration and what the operator should be told about it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The validated configuration.
    pub config: Config,
    /// Notices to log once at start (accepted TOTVS keys, substitutions, ignored sections).
    pub notices: Vec<Notice>,
    /// What the configuration doctor found wrong without stopping the load (a certificate
    /// expired or expiring, not meant for servers, its chain incomplete): logged as warnings
    /// at start and on reload, printed on standard error by `--check`.
    pub warnings: Vec<Notice>,
}
