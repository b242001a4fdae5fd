//! One balancer section: its `REMOTE_SERVER_<id>` entries, its settings through the table of
//! keys (its own, else `[General]`'s), and the rules that tie settings together: a port is
//! required, SEND_EXPECT needs MONITOR_EXPECT, TOTVS values are substituted with a notice, and
//! TCP_USER_TIMEOUT follows keepalive unless given.

use std::collections::BTreeMap;

use super::super::TOTVS_UNUSED;
use super::super::keys::{self, DAY, MAX_SERVERS, Stands};
use super::super::{
    BalancerConfig, BalancerKind, ConfigError, Monitoring, ServerConfig, ServerId, SortMethod,
    TOTVS_MONITORING_TYPES, TOTVS_SORT_METHODS,
};
use super::{ReadBalancer, Section, SectionLookup, Validator, ValueOrigin, suggest, value};

/// A server entry and the line it is on.
type ServerLine = (ServerConfig, usize);

impl Validator {
    /// Reads one balancer section, recording its errors.
    pub(super) fn balancer(
        &mut self,
        kind: BalancerKind,
        section: &Section,
        general: Option<&Section>,
    ) -> ReadBalancer {
        let errors_before = self.errors.len();
        self.duplicates(section);
        let servers = self.entries(section);
        self.servers(section, &servers, errors_before);
        let mut balancer = BalancerConfig::defaults(kind);
        let listen_read = self.settings(section, general, &mut balancer);
        self.rules(section, general, &mut balancer);
        if self.errors.len() == errors_before {
            self.tls(&SectionLookup { section, general }, &balancer);
        }
        balancer.servers = servers.into_iter().map(|(s, _)| s).collect();
        ReadBalancer {
            config: balancer,
            valid: self.errors.len() == errors_before && listen_read,
            listen_read,
        }
    }

    /// The section's entries but its settings: the servers (returned), and keys that are none
    /// of appbroker's (an error with the nearest key, or, for the TOTVS keys appbroker
    /// accepts without using, one notice).
    fn entries(&mut self, section: &Section) -> Vec<ServerLine> {
        let name = section.written.as_str();
        let mut servers = Vec::new();
        let mut unused = Vec::new();
        for entry in &section.entries {
            let located =
                |message: String| ConfigError::new(entry.line, name, Some(&entry.written), message);
            match value::server_id_of_key(&entry.key) {
                Some(Ok(id)) => match value::server(&entry.value) {
                    Ok((host, port, weight)) => {
                        let key = format!("REMOTE_SERVER_{id}");
                        self.origins
                            .set(&section.name, &key, ValueOrigin::Section(entry.line));
                        let server = ServerConfig {
                            id,
                            host,
                            port,
                            weight,
                        };
                        servers.push((server, entry.line));
                    }
                    Err(message) => self
                        .errors
                        .push(located(format!("`{}` {message}", entry.value))),
                },
                Some(Err(message)) => self.errors.push(located(message)),
                None if keys::find(&entry.key).is_some_and(|k| k.stands != Stands::General) => {}
                None => match TOTVS_UNUSED.iter().find(|(k, _)| *k == entry.key) {
                    Some((_, instead)) => unused.push(format!("{} ({instead})", entry.written)),
                    None if !self.errors.worth_keeping(Some(entry.line)) => {
                        self.errors.uncounted(1);
                    }
                    None => self.errors.push(located(unknown_key(&entry.key))),
                },
            }
        }
        if !unused.is_empty() {
            let message = format!(
                "accepting TOTVS keys appbroker does not use: {}",
                unused.join("; ")
            );
            self.section_notice(section, message);
        }
        servers
    }

    /// Rules on the servers as a whole: at least one, at most one per id, and a notice for
    /// an address given under two ids.
    fn servers(&mut self, section: &Section, servers: &[ServerLine], errors_before: usize) {
        let name = section.written.as_str();
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
        if servers.len() as u64 > MAX_SERVERS {
            self.errors.push(ConfigError::new(
                section.line,
                name,
                None,
                format!("{} servers; at most {MAX_SERVERS} ids exist", servers.len()),
            ));
        }
        let mut by_address: BTreeMap<String, (ServerId, usize)> = BTreeMap::new();
        for (server, line) in servers {
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
    }

    /// Every key of the table into `balancer`: from the section, else (where the key may
    /// stand there) from `[General]`. Returns whether the listening address was read:
    /// `LOCAL_SERVER_PORT` given (a missing one is an error, unless its line was rejected and
    /// said why already), it and `LOCAL_SERVER_ADDRESS` valid.
    fn settings(
        &mut self,
        section: &Section,
        general: Option<&Section>,
        balancer: &mut BalancerConfig,
    ) -> bool {
        let mut has_port = false;
        let mut listen_bad = false;
        for key in keys::balancer() {
            let lookup = SectionLookup {
                section,
                general: general.filter(|_| key.stands == Stands::Balancer),
            };
            let errors_before = self.errors.len();
            let found = self
                .read(&lookup, key, |text| key.set_balancer(balancer, text))
                .is_some();
            if key.name == "LOCAL_SERVER_PORT" {
                has_port = found;
            }
            if key.name.starts_with("LOCAL_SERVER_") && self.errors.len() > errors_before {
                listen_bad = true;
            }
        }
        let rejected = section.rejected.iter().any(|k| k == "LOCAL_SERVER_PORT");
        if !has_port && !rejected {
            self.errors.push(ConfigError::new(
                section.line,
                &section.written,
                Some("LOCAL_SERVER_PORT"),
                "missing; it is required: the TCP port clients connect to (1-65535)",
            ));
        }
        has_port && !listen_bad
    }

    /// The rules that tie settings together, and the notices about what was substituted.
    fn rules(&mut self, section: &Section, general: Option<&Section>, b: &mut BalancerConfig) {
        let name = section.written.as_str();
        let inherited = SectionLookup { section, general };
        self.sort_method(section, &inherited, b);
        self.monitoring_keys(section, &inherited, b);
        self.http_only_keys(section, b);
        self.proxy_keys(section, &inherited, b);
        self.monitoring_type(section, &inherited);
        self.timings(section, &inherited, b);
        self.webhook_ca(section, &inherited, b);
        // Answering everyone is the TOTVS behaviour; say so once unless the file chose it.
        if b.query.enabled && inherited.find("QUERY_ALLOW").is_none() {
            self.notices.push(ConfigError::new(
                section.line,
                name,
                Some("QUERY_ALLOW"),
                "is not set: anyone who reaches this port can read the server addresses at \
                 /TOTVS_BROKER_QUERY; set QUERY_ALLOW (addresses or CIDRs) to restrict it",
            ));
        }
    }

    /// The keys that complete a monitoring type: `MONITOR_EXPECT` required with SEND_EXPECT,
    /// and a notice for each given with another type, which does not use it.
    fn monitoring_keys(
        &mut self,
        section: &Section,
        inherited: &SectionLookup<'_>,
        b: &BalancerConfig,
    ) {
        let name = section.written.as_str();
        if let Monitoring::SendExpect { expect, .. } = &b.monitoring
            && expect.is_empty()
        {
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
        // The keys that complete a monitoring type, unused with another.
        let completing = [
            (
                ["MONITOR_SEND", "MONITOR_EXPECT"],
                "SEND_EXPECT",
                matches!(b.monitoring, Monitoring::SendExpect { .. }),
            ),
            (
                ["MONITOR_PATH", "MONITOR_EXPECT_STATUS"],
                "HTTP",
                matches!(b.monitoring, Monitoring::Http { .. }),
            ),
        ];
        for (keys, kind, used) in completing {
            for key in keys.into_iter().filter(|_| !used) {
                if let Some((entry, _)) = inherited.find(key) {
                    let message =
                        format!("is ignored: it is used with MONITORING_TYPE={kind} only");
                    self.notices
                        .push(ConfigError::new(entry.line, name, Some(key), message));
                }
            }
        }
    }

    /// On a TCP balancer, the HTTP balancers' keys: kept at their defaults, and a notice for
    /// each the section gives.
    fn http_only_keys(&mut self, section: &Section, b: &mut BalancerConfig) {
        if b.kind.is_http() {
            return;
        }
        // Unused here, and not printed: kept at their defaults, so the printed
        // configuration reads back the same.
        b.http = BalancerConfig::defaults(b.kind).http;
        for key in keys::balancer().filter(|k| is_http_key(k.name)) {
            if let Some(entry) = section.entries.iter().find(|e| e.key == key.name) {
                self.notices.push(ConfigError::new(
                    entry.line,
                    &section.written,
                    Some(key.name),
                    "is ignored: it is used by HTTP balancers ([BALANCE_HTTP...]) only",
                ));
            }
        }
    }

    /// The PROXY protocol's keys and `MAX_CONNECTIONS_PER_CLIENT`: a notice for the keys that
    /// complete `PROXY_PROTOCOL=1` given in a section without it, and for a header required
    /// of every source.
    fn proxy_keys(
        &mut self,
        section: &Section,
        inherited: &SectionLookup<'_>,
        b: &mut BalancerConfig,
    ) {
        let name = section.written.as_str();
        let own = |key: &str| section.entries.iter().find(|e| e.key == key);
        if !b.proxy.accept {
            for key in ["PROXY_PROTOCOL_FROM", "PROXY_PROTOCOL_TIMEOUT"] {
                if let Some(entry) = own(key) {
                    self.notices.push(ConfigError::new(
                        entry.line,
                        name,
                        Some(key),
                        "is ignored: it is used with PROXY_PROTOCOL=1 only",
                    ));
                }
            }
        } else if b.proxy.from.is_empty() {
            let line = inherited
                .find("PROXY_PROTOCOL")
                .map_or(section.line, |(e, _)| e.line);
            self.notices.push(ConfigError::new(
                line,
                name,
                Some("PROXY_PROTOCOL"),
                "is 1 and PROXY_PROTOCOL_FROM is empty: every connection must begin with a \
                 PROXY protocol header, so no client, monitor or `appbroker ping` reaches this \
                 port directly; name the front balancers in PROXY_PROTOCOL_FROM to serve the \
                 others",
            ));
        }
    }

    /// `MONITORING_TYPE`'s notice: a TOTVS type that stands for CONNECTION.
    fn monitoring_type(&mut self, section: &Section, inherited: &SectionLookup<'_>) {
        if let Some((entry, _)) = inherited.find("MONITORING_TYPE") {
            let upper = entry.value.to_ascii_uppercase();
            if TOTVS_MONITORING_TYPES.contains(&upper.as_str()) {
                self.notices.push(ConfigError::new(
                    entry.line,
                    &section.written,
                    Some("MONITORING_TYPE"),
                    format!(
                        "{upper} logs in with SmartClient's undocumented protocol; CONNECTION (a \
                         TCP connect to each server) is used instead"
                    ),
                ));
            }
        }
    }

    /// `TCP_USER_TIMEOUT`'s default, then the timings that contradict each other.
    fn timings(
        &mut self,
        section: &Section,
        inherited: &SectionLookup<'_>,
        b: &mut BalancerConfig,
    ) {
        // By default TCP_USER_TIMEOUT matches the keepalive arithmetic, within the one-day
        // bound of every duration (and is off with keepalive off).
        if inherited.find("TCP_USER_TIMEOUT").is_none() {
            let keepalive = &mut b.keepalive;
            keepalive.user_timeout = keepalive.enabled().then(|| keepalive.dead_after().min(DAY));
        }
        // Timings that contradict each other: a warning each, on the key's line if the file
        // sets it.
        for (key, message) in super::timing::contradictions(b) {
            let line = inherited.find(key).map_or(section.line, |(e, _)| e.line);
            self.notices
                .push(ConfigError::new(line, &section.written, Some(key), message));
        }
    }

    /// `ALERT_WEBHOOK_CA`: read now when an `https` webhook uses it (an error at its line when
    /// it holds no certificate), a notice when nothing uses it.
    fn webhook_ca(&mut self, section: &Section, inherited: &SectionLookup<'_>, b: &BalancerConfig) {
        const KEY: &str = "ALERT_WEBHOOK_CA";
        let (Some(path), Some((entry, _))) = (&b.alerts.webhook_ca, inherited.find(KEY)) else {
            return;
        };
        let located =
            |message: String| ConfigError::new(entry.line, &section.written, Some(KEY), message);
        if !b.alerts.webhook.as_ref().is_some_and(|w| w.tls) {
            self.notices.push(located(
                "is ignored: it is used with an https:// ALERT_WEBHOOK only".into(),
            ));
            return;
        }
        let read = crate::tls::files::read(KEY, path)
            .and_then(|pem| crate::tls::files::certificates(KEY, path, &pem));
        if let Err(finding) = read {
            self.errors.push(located(finding.to_string()));
        }
    }

    /// `SORT_METHOD`'s notices: a TOTVS method that stands for CONNECTION, SESSION on a TCP
    /// balancer (which then uses CONNECTION).
    fn sort_method(
        &mut self,
        section: &Section,
        inherited: &SectionLookup<'_>,
        b: &mut BalancerConfig,
    ) {
        let name = section.written.as_str();
        let notice = |entry: &super::IniEntry, key: &str, message: String| {
            ConfigError::new(entry.line, name, Some(key), message)
        };
        if let Some((entry, _)) = inherited.find("SORT_METHOD") {
            let upper = entry.value.to_ascii_uppercase();
            if TOTVS_SORT_METHODS.contains(&upper.as_str()) {
                self.notices.push(notice(
                    entry,
                    "SORT_METHOD",
                    format!(
                        "{upper} needs figures only a TOTVS AppServer reports; CONNECTION (fewest \
                         connections per weight) is used instead"
                    ),
                ));
            }
        }
        if !b.kind.is_http() && b.sort_method == SortMethod::Session {
            // A TCP client has no cookie: its sessions are its connections.
            b.sort_method = SortMethod::Connection;
            if let Some((entry, _)) = inherited.find("SORT_METHOD") {
                self.notices.push(notice(
                    entry,
                    "SORT_METHOD",
                    "SESSION balances HTTP sessions; a TCP balancer's sessions are its \
                     connections, so CONNECTION (fewest connections per weight) is used"
                        .into(),
                ));
            }
        }
    }
}

/// True for the keys only an HTTP balancer reads.
fn is_http_key(name: &str) -> bool {
    name.starts_with("HTTP_")
        || name.starts_with("HTTP2")
        || name == "LOG_REQUESTS"
        || name == "SESSION_TIMEOUT"
}

/// The error for a key a balancer section has no use for: a key of `[General]`'s own, or
/// the nearest known key.
fn unknown_key(key: &str) -> String {
    const GENERAL_ONLY: &str = "belongs in [General]: it is a setting of the whole process, \
                                not of one balancer";
    if keys::find(key).is_some_and(|k| k.stands == Stands::General) {
        return format!("{GENERAL_ONLY}; move it there");
    }
    let known: Vec<&str> = keys::KEYS
        .iter()
        .map(|k| k.name)
        .chain(TOTVS_UNUSED.iter().map(|(k, _)| *k))
        .chain(["REMOTE_SERVER_01"])
        .collect();
    match suggest(key, &known) {
        Some(s) if keys::find(s).is_some_and(|k| k.stands == Stands::General) => {
            format!("unknown key; did you mean {s}? It {GENERAL_ONLY}")
        }
        Some(s) => format!("unknown key; did you mean {s}?"),
        None => "unknown key; docs/configuration.md lists the keys of a balancer section".into(),
    }
}
