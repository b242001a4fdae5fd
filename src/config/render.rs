//! The effective configuration printed back as INI (`appbroker --check`): every key, defaults
//! included, in a form that parses to the same [`Config`].

use std::fmt::Write;

use super::value::show_duration;
use super::{BalancerConfig, Config, Origin};

impl Config {
    /// Every effective setting as `appserver.ini` text. Keys not set in the file are listed
    /// after a `; defaults` comment in each section.
    pub fn to_ini(&self) -> String {
        let mut out = format!(
            "; Effective configuration of {}, as appbroker {} reads it.\n",
            self.source.display(),
            env!("CARGO_PKG_VERSION")
        );
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
        ]
        .map(|(k, v)| (k.to_string(), v));
        self.section(&mut out, "General", &general);
        for b in &self.balancers {
            self.section(&mut out, b.kind.section(), &balancer_keys(b));
        }
        out
    }

    /// Writes one section: keys with a value from the file first, then the defaults.
    fn section(&self, out: &mut String, name: &str, keys: &[(String, String)]) {
        let upper = name.to_ascii_uppercase();
        let _ = writeln!(out, "\n[{name}]");
        let is_default = |key: &str| {
            !key.starts_with("REMOTE_SERVER_") && self.origins.get(&upper, key) == Origin::Default
        };
        for (key, value) in keys.iter().filter(|(k, _)| !is_default(k)) {
            let _ = writeln!(out, "{key}={value}");
        }
        let defaults: Vec<_> = keys.iter().filter(|(k, _)| is_default(k)).collect();
        if !defaults.is_empty() {
            out.push_str("; defaults (not set in the file):\n");
            for (key, value) in defaults {
                let _ = writeln!(out, "{key}={value}");
            }
        }
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
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
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
