//! The effective configuration printed back as INI (`appbroker --check`): every key, defaults
//! included, in a form that parses to the same [`Config`].

use std::fmt::Write;

use super::value::{show_duration, show_escaped};
use super::{BalancerConfig, Config, Monitoring, Origin};

/// One section of the effective configuration.
#[derive(Debug, Clone)]
pub struct EffectiveSection {
    /// The section name as printed (`General`, `BALANCE_SMART_CLIENT_DESKTOP`).
    pub name: String,
    /// Every key with its effective value and where that value came from.
    pub keys: Vec<(String, String, Origin)>,
}

impl Config {
    /// Every effective setting, section by section: what `--check` prints and the CFG page
    /// shows.
    pub fn effective(&self) -> Vec<EffectiveSection> {
        let g = &self.general;
        let general = [
            ("CONSOLELOG", flag(g.console_log)),
            (
                "CONSOLEFILE",
                g.console_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            ("CONSOLEMAXSIZE", g.console_max_size.to_string()),
            ("CONSOLELOGDATE", flag(g.console_log_date)),
            ("SHUTDOWN_GRACE", show_duration(g.shutdown_grace)),
            ("SHUTDOWN_TIMEOUT", show_duration(g.shutdown_timeout)),
            ("LANGUAGE", g.language.as_str().to_string()),
            ("WORKERS", g.workers.to_string()),
            ("DNS_MAX_LOOKUPS", g.dns_max_lookups.to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v));
        let mut sections = vec![self.effective_section("General", general.into())];
        for b in &self.balancers {
            sections.push(self.effective_section(b.kind.section(), balancer_keys(b)));
        }
        sections
    }

    fn effective_section(&self, name: &str, keys: Vec<(String, String)>) -> EffectiveSection {
        let upper = name.to_ascii_uppercase();
        let keys = keys
            .into_iter()
            .map(|(key, value)| {
                let origin = self.origins.get(&upper, &key);
                (key, value, origin)
            })
            .collect();
        EffectiveSection {
            name: name.to_string(),
            keys,
        }
    }

    /// Every effective setting as `appserver.ini` text. Keys not set in the file are listed
    /// after a `; defaults` comment in each section.
    pub fn to_ini(&self) -> String {
        let mut out = format!(
            "; Effective configuration of {}, as appbroker {} reads it.\n",
            self.source.display(),
            env!("CARGO_PKG_VERSION")
        );
        for section in self.effective() {
            let _ = writeln!(out, "\n[{}]", section.name);
            let (defaults, set): (Vec<_>, Vec<_>) = section
                .keys
                .iter()
                .partition(|(_, _, origin)| *origin == Origin::Default);
            for (key, value, _) in set {
                let _ = writeln!(out, "{key}={value}");
            }
            if !defaults.is_empty() {
                out.push_str("; defaults (not set in the file):\n");
                for (key, value, _) in defaults {
                    let _ = writeln!(out, "{key}={value}");
                }
            }
        }
        out
    }
}

impl Config {
    /// Every `[General]` key with its effective value as printed: what a reload compares to
    /// say which of them changed.
    pub fn general_settings(&self) -> Vec<(String, String)> {
        self.effective()
            .into_iter()
            .next()
            .map(|general| general.keys.into_iter().map(|(k, v, _)| (k, v)).collect())
            .unwrap_or_default()
    }
}

/// The settings that differ between `before` and `after`, one `<label> KEY old -> new` each
/// (`<label> KEY value` for a key `before` lacks), for the reload's summary line.
pub fn setting_changes(
    label: &str,
    before: &[(String, String)],
    after: &[(String, String)],
) -> Vec<String> {
    let shown = |value: &str| {
        if value.is_empty() {
            "(empty)".to_string()
        } else {
            value.to_string()
        }
    };
    after
        .iter()
        .filter_map(|(key, value)| match before.iter().find(|(k, _)| k == key) {
            Some((_, was)) if was == value => None,
            Some((_, was)) => Some(format!("{label} {key} {} -> {}", shown(was), shown(value))),
            None => Some(format!("{label} {key} {}", shown(value))),
        })
        .collect()
}

impl BalancerConfig {
    /// Every key of the section but `REMOTE_SERVER_xx`, with its effective value as printed:
    /// what a reload compares to say which settings changed.
    pub fn settings(&self) -> Vec<(String, String)> {
        balancer_keys(self)
            .into_iter()
            .filter(|(key, _)| !key.starts_with("REMOTE_SERVER_"))
            .collect()
    }
}

/// Every key of a balancer section with its effective value, in documentation order.
fn balancer_keys(b: &BalancerConfig) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = [
        ("LOCAL_SERVER_ADDRESS", b.listen.ip().to_string()),
        ("LOCAL_SERVER_PORT", b.listen.port().to_string()),
        ("SORT_METHOD", b.sort_method.as_str().into()),
        ("MONITORING_TYPE", b.monitoring.as_str().into()),
        ("MONITOR_INTERVAL", show_duration(b.monitor_interval)),
        ("QUARANTINE_TIME", show_duration(b.quarantine_time)),
        ("CONNECT_TIMEOUT", show_duration(b.connect_timeout)),
        ("MAX_ATTEMPTS", b.max_attempts.to_string()),
        ("MAX_CONNECTIONS", b.max_connections.to_string()),
        ("LOG_CONNECTIONS", flag(b.log_connections)),
        ("QUERY_ENABLED", flag(b.query.enabled)),
        (
            "QUERY_ALLOW",
            b.query
                .allow
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("QUERY_MAX_CONNECTIONS", b.query.max_connections.to_string()),
        ("QUERY_SNIFF_TIMEOUT", show_duration(b.query.sniff_timeout)),
        ("KEEPALIVE_TIME", show_duration(b.keepalive.time)),
        ("KEEPALIVE_INTERVAL", show_duration(b.keepalive.interval)),
        ("KEEPALIVE_COUNT", b.keepalive.count.to_string()),
        (
            "TCP_USER_TIMEOUT",
            show_duration(b.keepalive.user_timeout.unwrap_or_default()),
        ),
        (
            "IDLE_TIMEOUT",
            show_duration(b.idle_timeout.unwrap_or_default()),
        ),
        ("MONITOR_FALL", b.monitor_fall.to_string()),
        ("MONITOR_RISE", b.monitor_rise.to_string()),
        ("DNS_CACHE_TIME", show_duration(b.dns_cache_time)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Monitoring::SendExpect { send, expect } = &b.monitoring {
        keys.push(("MONITOR_SEND".into(), show_escaped(send)));
        keys.push(("MONITOR_EXPECT".into(), show_escaped(expect)));
    }
    for s in &b.servers {
        keys.push((
            format!("REMOTE_SERVER_{}", s.id),
            format!("{} {} {}", s.host, s.port, s.weight),
        ));
    }
    keys
}

fn flag(value: bool) -> String {
    if value { "1" } else { "0" }.to_string()
}
