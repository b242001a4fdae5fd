//! The effective configuration printed back as INI (`appbroker --check`): every key of the
//! [table](super::keys), defaults included, in a form that parses to the same [`Config`]
//! (but its secrets, printed `(set)` in a comment).

use std::fmt::Write;

use super::keys::{self, KeyField};
use super::{BalancerConfig, Config, General, ValueOrigin};

/// One section of the effective configuration.
#[derive(Debug, Clone)]
pub struct EffectiveSection {
    /// The section name as printed (`General`, `BALANCE_SMART_CLIENT_DESKTOP`).
    pub name: String,
    /// Every key with its effective value and where that value came from.
    pub keys: Vec<(String, String, ValueOrigin)>,
}

impl Config {
    /// Every effective setting, section by section: what `--check` prints and the CFG page
    /// shows.
    pub fn effective(&self) -> Vec<EffectiveSection> {
        let mut sections = vec![self.effective_section("General", self.general_settings())];
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
                .partition(|(_, _, origin)| *origin == ValueOrigin::Default);
            for (key, value, _) in set {
                let secret = keys::find(key).is_some_and(|k| k.domain.is_secret());
                if secret && !value.is_empty() {
                    // Never printed; a comment, so that the printout still reads back (without it).
                    let _ = writeln!(out, "; {key}={value} (a secret is never printed)");
                } else {
                    let _ = writeln!(out, "{key}={value}");
                }
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

    /// Every `[General]` key with its effective value as printed: what a reload compares to
    /// say which of them changed.
    pub fn general_settings(&self) -> Vec<(String, String)> {
        keys::general()
            .filter_map(|key| match key.field {
                KeyField::General { get, .. } => Some((key.name.to_string(), get(&self.general)?)),
                KeyField::Balancer { .. } => None,
            })
            .collect()
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

/// `[General] KEY changed` for each secret set before and after, to another value: printed
/// `(set)` both times, a change [`setting_changes`] cannot see, and never shown.
pub fn secret_changes(before: &General, after: &General) -> Vec<String> {
    [
        (
            "SESSION_SECRET",
            &before.session_secret,
            &after.session_secret,
        ),
        (
            "SESSION_SECRET_PREVIOUS",
            &before.session_secret_previous,
            &after.session_secret_previous,
        ),
    ]
    .into_iter()
    .filter(|(_, was, now)| was.is_some() && now.is_some() && was != now)
    .map(|(key, _, _)| format!("[General] {key} changed (not shown)"))
    .collect()
}

/// `<label> KEY changed (not shown)` for each secret of a balancer set before and after, to
/// another value, which its printed form (`(set)`, or the webhook's host alone) cannot tell.
pub fn balancer_secret_changes(
    label: &str,
    before: &BalancerConfig,
    after: &BalancerConfig,
) -> Vec<String> {
    let changed =
        |was: Option<String>, now: Option<String>| was.is_some() && now.is_some() && was != now;
    let expose = |p: &Option<crate::tls::files::Passphrase>| {
        p.as_ref()
            .map(|p| String::from_utf8_lossy(p.expose()).into_owned())
    };
    let webhook = |b: &BalancerConfig| {
        b.alerts
            .webhook
            .as_ref()
            .map(|w| format!("{}{}", w.origin(), w.expose_target()))
    };
    [
        (
            "SSL_PASSPHRASE",
            expose(&before.tls.passphrase),
            expose(&after.tls.passphrase),
        ),
        ("ALERT_WEBHOOK", webhook(before), webhook(after)),
        (
            "ALERT_COMMAND",
            expose(&before.alerts.command),
            expose(&after.alerts.command),
        ),
        (
            "RESTART_COMMAND",
            expose(&before.restarts.command),
            expose(&after.restarts.command),
        ),
    ]
    .into_iter()
    .filter(|(_, was, now)| changed(was.clone(), now.clone()))
    .map(|(key, _, _)| format!("{label} {key} changed (not shown)"))
    .collect()
}

impl BalancerConfig {
    /// Every key of the section but `REMOTE_SERVER_xx`, with its effective value as printed:
    /// what a reload compares to say which settings changed.
    pub fn settings(&self) -> Vec<(String, String)> {
        keys::balancer()
            .filter_map(|key| match key.field {
                KeyField::Balancer { get, .. } => Some((key.name.to_string(), get(self)?)),
                KeyField::General { .. } => None,
            })
            .collect()
    }
}

/// Every key of a balancer section with its effective value, in the table's order, then the
/// servers.
fn balancer_keys(b: &BalancerConfig) -> Vec<(String, String)> {
    let mut keys = b.settings();
    for s in &b.servers {
        keys.push((
            format!("REMOTE_SERVER_{}", s.id),
            format!("{} {} {}", s.host, s.port, s.weight),
        ));
    }
    keys
}
