//! The values the enum-valued keys take (`LANGUAGE`, `SEND_PROXY_PROTOCOL`, `SORT_METHOD`,
//! `MONITORING_TYPE` and its `MONITOR_EXPECT_STATUS`), each parsed from its text and printed
//! back, and the TOTVS values of the last two that are accepted with a notice.

use std::fmt;
use std::str::FromStr;

use super::errors::ValueError;

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
