//! The configuration as the broker uses it: [`Config`] and its parts (`[General]`'s settings,
//! each balancer's, the servers, monitoring, TLS keys) and their defaults, the keys of TOTVS
//! files accepted without use, where each effective value came from, and [`Loaded`], what a
//! load yields.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::alerting::{AlertSettings, RestartSettings};
use super::choices::{Language, Monitoring, ProxyVersion, SortMethod};
use super::errors::Notice;
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
    /// `ADMIN_USERS`: the htpasswd file of the users who may act from the status page;
    /// `None`: nobody (the page answers 404).
    pub admin_users: Option<PathBuf>,
    /// `ADMIN_PLAIN_HTTP`: the page offered over plain HTTP to peers off this host too.
    pub admin_plain_http: bool,
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

/// One TCP balancer: a listener and the servers it forwards to.
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

/// Where an effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueOrigin {
    /// Set in its own section, at this line.
    Section(usize),
    /// Inherited from `[General]`, set at this line.
    General(usize),
    /// Not set anywhere: the built-in default.
    Default,
}

/// Origin of every effective value, keyed by (section, key), both upper case.
#[derive(Debug, Clone, Default)]
pub struct Origins(BTreeMap<(String, String), ValueOrigin>);

impl Origins {
    /// Where `key` of `section` came from (`Default` when never recorded).
    pub fn get(&self, section: &str, key: &str) -> ValueOrigin {
        self.0
            .get(&(section.to_string(), key.to_string()))
            .copied()
            .unwrap_or(ValueOrigin::Default)
    }

    pub(super) fn set(&mut self, section: &str, key: &str, origin: ValueOrigin) {
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

/// Keys TOTVS broker files carry that appbroker accepts without using, and what it does
/// instead.
pub const TOTVS_UNUSED: &[(&str, &str)] = &[
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
];

/// `[General]` keys of TOTVS files (an AppServer's, of which the broker is one) that
/// appbroker does not use, as TOTVS writes them. A key of `[General]` that is neither
/// appbroker's nor one of these, and that looks like a typo of one of appbroker's keys
/// (`LANGAUGE`), is an error; these, however close to one (`ConnectionTimeout` to
/// `CONNECT_TIMEOUT`), stay a notice, so a TOTVS file is never refused. `ConsoleLog`,
/// `ConsoleLogDate`, `ConsoleFile` and `ConsoleMaxSize`, TOTVS's too, are appbroker's keys.
pub const TOTVS_GENERAL: &[&str] = &[
    // The AppServer's idle-connection time (TDN, "Broker - Base de Conhecimento"'s reconnect
    // notes: "ConnectionTimeout ... no [General]").
    "ConnectionTimeout",
    // The AppServer's idle-user time, in [GENERAL] (TDN's Logix profile keys page).
    "InactiveTimeout",
    // The AppServer's string size, seen in brokers' files (tests/fixtures/valid).
    "MaxStringSize",
    // The Windows service, in [General] as in balancer sections (TDN's broker pages).
    "SERVICE_NAME",
    "SERVICE_DISPLAY_NAME",
];

impl General {
    /// Every `[General]` setting at its default.
    pub fn defaults() -> General {
        General {
            console_log: true,
            console_file: None,
            console_max_size: 10 * 1024 * 1024,
            console_log_date: true,
            shutdown_grace: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(30),
            language: Language::English,
            workers: 0,
            dns_max_lookups: 32,
            control_socket: None,
            control_group: None,
            state_file: None,
            session_secret: None,
            session_secret_previous: None,
            admin_users: None,
            admin_plain_http: false,
            upgrade_timeout: Duration::from_secs(30),
            watchdog_timeout: Duration::from_secs(10),
            http_head_memory: DEFAULT_HTTP_HEAD_MEMORY,
        }
    }
}

impl BalancerConfig {
    /// A balancer of `kind` with every setting at its default, listening on every IPv4
    /// address at port 0 (`LOCAL_SERVER_PORT` has no default), without servers.
    /// `TCP_USER_TIMEOUT`'s default follows the keepalive keys: see [`Keepalive::dead_after`].
    pub fn defaults(kind: BalancerKind) -> BalancerConfig {
        BalancerConfig {
            kind,
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            servers: Vec::new(),
            // Sessions are what an HTTP balancer spreads (session affinity).
            sort_method: if kind.is_http() {
                SortMethod::Session
            } else {
                SortMethod::Connection
            },
            monitoring: Monitoring::Connection,
            monitor_interval: Duration::from_secs(60),
            quarantine_time: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(5),
            max_attempts: 3,
            max_connections: 10_000,
            // SmartClients on one terminal server (RDS, Citrix) share its address: a limit
            // per address is the operator's choice, knowing that.
            max_connections_per_client: 0,
            proxy: ProxyProtocol {
                accept: false,
                from: Vec::new(),
                timeout: Duration::from_secs(3),
                send: None,
            },
            log_connections: true,
            query: QuerySettings {
                enabled: true,
                allow: Cidr::everyone(),
                max_connections: 64,
                sniff_timeout: Duration::from_millis(200),
            },
            keepalive: Keepalive {
                time: Duration::from_secs(60),
                interval: Duration::from_secs(10),
                count: 6,
                user_timeout: None,
            },
            idle_timeout: None,
            monitor_fall: 1,
            monitor_rise: 1,
            dns_cache_time: Duration::from_secs(30),
            tls: TlsKeys {
                certificate: None,
                key: None,
                passphrase: None,
                method: SslMethod::Any,
                encrypt_upstream: false,
                upstream_verify: true,
                upstream_ca: None,
                upstream_server_name: None,
                plain_on_same_port: false,
            },
            http: HttpSettings::defaults(),
            alerts: AlertSettings::defaults(),
            restarts: RestartSettings::defaults(),
        }
    }
}

impl HttpSettings {
    /// Every HTTP key at its default.
    pub fn defaults() -> HttpSettings {
        HttpSettings {
            forwarded_headers: true,
            upgrade_protocols: vec!["websocket".to_string()],
            pool_max_idle: 32,
            pool_idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            response_timeout: Duration::from_secs(600),
            body_timeout: Duration::from_secs(60),
            timeouts_to_quarantine: 0,
            log_requests: true,
            retry_idempotent: false,
            session_timeout: Duration::from_secs(600),
            max_sessions: 100_000,
            max_sessions_per_client: 64,
            sticky_strict: false,
            trusted_proxies: Vec::new(),
            http2: true,
            http2_max_streams: 100,
            http2_websocket: true,
        }
    }
}
