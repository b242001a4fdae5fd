//! What the `ALERT_*` and `RESTART_*` keys hold: the events an alert is sent for, where it
//! goes (a webhook, a command, in JSON or one line of text), and when a command restarts an
//! AppServer stuck in quarantine. Parsed here, used by the broker's alerts; a webhook's URL and
//! the commands are secrets (they carry tokens): they print as `(set)`, never as written.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::value::{self, Host};
use crate::tls::files::Passphrase;

/// An event an alert can be sent for, by the name `ALERT_EVENTS` and the receivers know it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlertEvent {
    /// A server was put in quarantine (not when its quarantine is only extended).
    QuarantineEntered,
    /// A server's quarantine ended.
    QuarantineLeft,
    /// No server of a balancer takes new clients.
    NoServersAvailable,
    /// A server of a balancer takes new clients again.
    ServersAvailableAgain,
    /// An operator disabled or drained a server (`ctl disable`, `ctl drain`).
    ServerDisabled,
    /// An operator enabled a server again (`ctl enable`).
    ServerEnabled,
    /// The broker serves.
    BrokerStarted,
    /// The broker drains and stops.
    BrokerStopping,
    /// The supervisor started a broker again after the last one died (sent by the supervisor).
    BrokerRestarted,
    /// `appbroker upgrade` replaced the broker with the new binary's, which serves (sent by the
    /// supervisor, which knows both; neither broker tells of its start or stop then).
    BrokerUpgraded,
    /// The daily check found the certificate served to clients expiring (or expired).
    CertificateExpiring,
    /// `RESTART_COMMAND` ran for an AppServer.
    RestartRan,
    /// Alerts were dropped: their queue was full.
    AlertsDropped,
}

impl AlertEvent {
    /// Every event, in the order documented.
    pub const ALL: [AlertEvent; 13] = [
        AlertEvent::QuarantineEntered,
        AlertEvent::QuarantineLeft,
        AlertEvent::NoServersAvailable,
        AlertEvent::ServersAvailableAgain,
        AlertEvent::ServerDisabled,
        AlertEvent::ServerEnabled,
        AlertEvent::BrokerStarted,
        AlertEvent::BrokerStopping,
        AlertEvent::BrokerRestarted,
        AlertEvent::BrokerUpgraded,
        AlertEvent::CertificateExpiring,
        AlertEvent::RestartRan,
        AlertEvent::AlertsDropped,
    ];

    /// The event's name: `quarantine_entered`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertEvent::QuarantineEntered => "quarantine_entered",
            AlertEvent::QuarantineLeft => "quarantine_left",
            AlertEvent::NoServersAvailable => "no_servers_available",
            AlertEvent::ServersAvailableAgain => "servers_available_again",
            AlertEvent::ServerDisabled => "server_disabled",
            AlertEvent::ServerEnabled => "server_enabled",
            AlertEvent::BrokerStarted => "broker_started",
            AlertEvent::BrokerStopping => "broker_stopping",
            AlertEvent::BrokerRestarted => "broker_restarted",
            AlertEvent::BrokerUpgraded => "broker_upgraded",
            AlertEvent::CertificateExpiring => "certificate_expiring",
            AlertEvent::RestartRan => "restart_ran",
            AlertEvent::AlertsDropped => "alerts_dropped",
        }
    }

    /// The event named `name` (any case).
    pub fn named(name: &str) -> Option<AlertEvent> {
        AlertEvent::ALL
            .into_iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(name))
    }

    /// True for the events of the broker as a whole, which name no balancer.
    pub fn is_broker_wide(self) -> bool {
        matches!(
            self,
            AlertEvent::BrokerStarted
                | AlertEvent::BrokerStopping
                | AlertEvent::BrokerRestarted
                | AlertEvent::BrokerUpgraded
                | AlertEvent::AlertsDropped
        )
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The words `ALERT_EVENTS` accepts (for the property tests and the docs): `all` and each
/// event's name.
pub const ALERT_EVENT_WORDS: &[&str] = &[
    "all",
    "quarantine_entered",
    "quarantine_left",
    "no_servers_available",
    "servers_available_again",
    "server_disabled",
    "server_enabled",
    "broker_started",
    "broker_stopping",
    "broker_restarted",
    "broker_upgraded",
    "certificate_expiring",
    "restart_ran",
    "alerts_dropped",
];

/// `ALERT_EVENTS`: the events alerts are sent for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AlertEvents(u16);

impl AlertEvents {
    /// Every event (the default).
    pub fn all() -> AlertEvents {
        AlertEvents(AlertEvent::ALL.iter().fold(0, |bits, e| bits | e.bit()))
    }

    /// True when alerts are sent for `event`.
    pub fn contains(self, event: AlertEvent) -> bool {
        self.0 & event.bit() != 0
    }

    /// Names separated by commas or blanks (any case), or `all`; empty is `all`.
    pub fn parse(text: &str) -> Result<AlertEvents, String> {
        let mut bits = 0;
        let names = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|n| !n.is_empty());
        let mut any = false;
        for name in names {
            any = true;
            if name.eq_ignore_ascii_case("all") {
                bits |= AlertEvents::all().0;
                continue;
            }
            match AlertEvent::named(name) {
                Some(event) => bits |= event.bit(),
                None => {
                    return Err(format!(
                        "names no event `{}`; expected names separated by commas among: {}",
                        value::show_escaped(name.as_bytes()),
                        ALERT_EVENT_WORDS[1..].join(", ")
                    ));
                }
            }
        }
        Ok(if any {
            AlertEvents(bits)
        } else {
            AlertEvents::all()
        })
    }
}

impl fmt::Display for AlertEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == AlertEvents::all() {
            return f.write_str("all");
        }
        let names: Vec<&str> = AlertEvent::ALL
            .into_iter()
            .filter(|e| self.contains(*e))
            .map(AlertEvent::as_str)
            .collect();
        f.write_str(&names.join(", "))
    }
}

impl fmt::Debug for AlertEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlertEvents({self})")
    }
}

/// `ALERT_WEBHOOK_FORMAT`: what a webhook is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlertFormat {
    /// The event as a JSON object (the default).
    Json,
    /// `{"text": "<one line>"}`: what Slack, Mattermost, Rocket.Chat and Teams' incoming
    /// webhooks take.
    Text,
}

impl AlertFormat {
    /// The value as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertFormat::Json => "json",
            AlertFormat::Text => "text",
        }
    }

    /// `json` or `text`, any case.
    pub fn parse(text: &str) -> Result<AlertFormat, String> {
        match text.to_ascii_lowercase().as_str() {
            "json" => Ok(AlertFormat::Json),
            "text" => Ok(AlertFormat::Text),
            _ => Err("expected json or text".into()),
        }
    }
}

/// `ALERT_WEBHOOK`: an `http://` or `https://` URL. Its path and query often carry a token
/// (Slack's, Teams'), so it prints as `(set: https://host)`: never its path, not in a log, a
/// page or `--check`.
#[derive(Clone, PartialEq, Eq)]
pub struct Webhook {
    /// `https`.
    pub tls: bool,
    /// The host, as written (a name, or an address).
    pub host: Host,
    /// The port (80 or 443 unless written).
    pub port: u16,
    /// The path and query, `/` at least: the secret part.
    target: String,
}

impl Webhook {
    /// Parses `http[s]://host[:port][/path][?query]`; the fragment is dropped (a browser never
    /// sends it either). The error never repeats the URL.
    pub fn parse(text: &str) -> Result<Webhook, String> {
        let lower = text.get(..8).unwrap_or(text).to_ascii_lowercase();
        let (tls, rest) = if lower.starts_with("https://") {
            (true, &text[8..])
        } else if lower.starts_with("http://") {
            (false, &text[7..])
        } else {
            return Err("is not an http:// or https:// URL".into());
        };
        if text.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err("holds blanks or control characters; a URL has none".into());
        }
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, target) = rest.split_at(end);
        if authority.contains('@') {
            return Err(
                "carries credentials before the host (user:password@); put the token in the \
                 path or query, or send through ALERT_COMMAND"
                    .into(),
            );
        }
        let (host, port) = split_port(authority, if tls { 443 } else { 80 })?;
        let target = target.split('#').next().unwrap_or_default();
        let target = match target {
            "" => "/".to_string(),
            t if t.starts_with('?') => format!("/{t}"),
            t => t.to_string(),
        };
        Ok(Webhook {
            tls,
            host,
            port,
            target,
        })
    }

    /// The path and query to request: the secret part, for the one request it is for.
    pub fn expose_target(&self) -> &str {
        &self.target
    }

    /// `https://host` or `http://host:port`, without what may be secret.
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            match &self.host {
                Host::Ip(std::net::IpAddr::V6(ip)) => format!("{scheme}://[{ip}]"),
                host => format!("{scheme}://{host}"),
            }
        } else {
            format!("{scheme}://{}", self.host.with_port(self.port))
        }
    }
}

/// `host[:port]` of a URL: the host and the port (`default` when none is written).
fn split_port(authority: &str, default: u16) -> Result<(Host, u16), String> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or("has an IPv6 host without its closing `]`")?;
        (format!("[{ip}]"), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        None => default,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err("has a port that is no number from 1 to 65535".into()),
        },
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    let host = value::host(&host)
        .map_err(|_| "has a host that is neither an IP address nor a host name".to_string())?;
    Ok((host, port))
}

impl fmt::Display for Webhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(set: {})", self.origin())
    }
}

impl fmt::Debug for Webhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Webhook{self}")
    }
}

/// A balancer's `ALERT_*` keys (its own, else `[General]`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSettings {
    /// `ALERT_WEBHOOK`.
    pub webhook: Option<Webhook>,
    /// `ALERT_WEBHOOK_CA`: the CAs trusted for an `https` webhook (default: the system's).
    pub webhook_ca: Option<PathBuf>,
    /// `ALERT_WEBHOOK_FORMAT`.
    pub format: AlertFormat,
    /// `ALERT_COMMAND`: run with `/bin/sh -c`; a secret (it may carry a token).
    pub command: Option<Passphrase>,
    /// `ALERT_EVENTS`.
    pub events: AlertEvents,
    /// `ALERT_TIMEOUT`: bound on each delivery (one webhook request, one command).
    pub timeout: Duration,
}

impl AlertSettings {
    /// Every `ALERT_*` key at its default: no receiver, every event, 10 s per delivery.
    pub fn defaults() -> AlertSettings {
        AlertSettings {
            webhook: None,
            webhook_ca: None,
            format: AlertFormat::Json,
            command: None,
            events: AlertEvents::all(),
            timeout: Duration::from_secs(10),
        }
    }

    /// True when alerts go anywhere.
    pub fn any(&self) -> bool {
        self.webhook.is_some() || self.command.is_some()
    }
}

/// A balancer's `RESTART_*` keys (its own, else `[General]`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartSettings {
    /// `RESTART_COMMAND`: run with `/bin/sh -c` for a server stuck in a health quarantine; a
    /// secret (it may carry a password).
    pub command: Option<Passphrase>,
    /// `RESTART_AFTER`: how long the quarantine must have lasted.
    pub after: Duration,
    /// `RESTART_COOLDOWN`: the shortest time between two restarts of one AppServer.
    pub cooldown: Duration,
    /// `RESTART_TIMEOUT`: the command is killed after this long.
    pub timeout: Duration,
    /// `RESTART_MAX_PARALLEL`: restarts of this balancer's servers at once.
    pub max_parallel: u32,
    /// `RESTART_ONLY_WITH_ADDRESS`: restarts only while this address is on this host (the
    /// active broker of a pair holds the virtual address).
    pub only_with_address: Option<IpAddr>,
}

impl RestartSettings {
    /// Every `RESTART_*` key at its default: no command; after 2 minutes in quarantine, once
    /// per 10 minutes, killed after 2 minutes, one at a time, wherever the broker runs.
    pub fn defaults() -> RestartSettings {
        RestartSettings {
            command: None,
            after: Duration::from_secs(120),
            cooldown: Duration::from_secs(600),
            timeout: Duration::from_secs(120),
            max_parallel: 1,
            only_with_address: None,
        }
    }
}

/// The command's text, for the one use it is for (`/bin/sh -c`).
pub fn command_text(command: &Passphrase) -> String {
    String::from_utf8_lossy(command.expose()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_parse_and_never_show_their_path() {
        let hook = Webhook::parse("https://hooks.slack.com/services/T0/B0/SECRET").unwrap();
        assert!(hook.tls);
        assert_eq!(hook.port, 443);
        assert_eq!(hook.expose_target(), "/services/T0/B0/SECRET");
        assert_eq!(hook.to_string(), "(set: https://hooks.slack.com)");
        assert!(!format!("{hook:?}").contains("SECRET"));
        let hook = Webhook::parse("HTTP://127.0.0.1:8080?token=x#frag").unwrap();
        assert_eq!((hook.tls, hook.port), (false, 8080));
        assert_eq!(hook.expose_target(), "/?token=x");
        assert_eq!(hook.origin(), "http://127.0.0.1:8080");
        let hook = Webhook::parse("http://[::1]:9/x").unwrap();
        assert_eq!(hook.origin(), "http://[::1]:9");
        for bad in [
            "ftp://x/",
            "https://",
            "https://user:pw@host/",
            "http://host:0/",
            "http://host:99999/",
            "http://ho st/",
            "http://[::1/",
            "http://-bad-/",
        ] {
            let error = Webhook::parse(bad).expect_err(bad);
            assert!(!error.contains(bad), "{error}");
        }
    }

    #[test]
    fn events_parse_by_name_and_print_back() {
        assert_eq!(AlertEvents::parse("").unwrap(), AlertEvents::all());
        assert_eq!(AlertEvents::parse("ALL").unwrap(), AlertEvents::all());
        let some = AlertEvents::parse("quarantine_entered, Restart_Ran  broker_started").unwrap();
        assert!(some.contains(AlertEvent::RestartRan));
        assert!(!some.contains(AlertEvent::QuarantineLeft));
        assert_eq!(
            some.to_string(),
            "quarantine_entered, broker_started, restart_ran"
        );
        assert_eq!(AlertEvents::parse(&some.to_string()).unwrap(), some);
        assert!(AlertEvents::parse("quarantine").is_err());
        for (event, word) in AlertEvent::ALL.iter().zip(&ALERT_EVENT_WORDS[1..]) {
            assert_eq!(event.as_str(), *word);
        }
    }
}
