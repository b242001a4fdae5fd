//! An alert as its receivers get it, pure: the JSON object (the schema docs/operations.md
//! shows), the one line of the `text` format in `LANGUAGE`, and the environment of a command.

use serde_json::{Map, Value, json};

use crate::balancer::alert_queue::Alert;
use crate::config::{AlertEvent, Language};
use crate::support::clock::{rfc3339, time_of_day};

/// The alert as a JSON object: `event`, `at`, `broker`, `balancer` always; the others where
/// they apply.
pub fn json(alert: &Alert, broker: &str) -> Value {
    let mut object = Map::new();
    object.insert("event".into(), json!(alert.event.as_str()));
    object.insert("at".into(), json!(rfc3339(alert.at_wall_ms)));
    object.insert("broker".into(), json!(broker));
    object.insert(
        "balancer".into(),
        json!(alert.balancer.map_or("", |b| b.section())),
    );
    if let Some(server) = &alert.server {
        object.insert("server".into(), json!(server.address));
        object.insert("id".into(), json!(server.id));
    }
    let mut optional = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            object.insert(key.into(), value);
        }
    };
    optional("reason", alert.reason.as_ref().map(|r| json!(r)));
    optional("until", alert.until_wall_ms.map(|ms| json!(rfc3339(ms))));
    optional("who", alert.who.as_ref().map(|w| json!(w)));
    optional("available", alert.available.map(|n| json!(n)));
    optional("total", alert.total.map(|n| json!(n)));
    optional("exit", alert.exit.map(|code| json!(code)));
    optional("output", alert.output.as_ref().map(|o| json!(o)));
    optional("dropped", alert.dropped.map(|n| json!(n)));
    if let Some(upgrade) = &alert.upgrade {
        optional(
            "from_version",
            upgrade.from_version.as_ref().map(|v| json!(v)),
        );
        optional("to_version", Some(json!(upgrade.to_version)));
        optional("from_pid", Some(json!(upgrade.from_pid)));
        optional("to_pid", Some(json!(upgrade.to_pid)));
        optional("handover_ms", Some(json!(upgrade.handover_ms)));
    }
    Value::Object(object)
}

/// The body of the `text` format: `{"text": "<one line>"}`.
pub fn text_body(alert: &Alert, broker: &str, language: Language) -> Value {
    json!({ "text": line(alert, broker, language) })
}

/// The alert in one line of `language`, for people: `appbroker@host: [BALANCE_X] server
/// 10.0.0.5:1234 (01) in quarantine until 18:04:05 (monitor: connection refused)`.
pub fn line(alert: &Alert, broker: &str, language: Language) -> String {
    let pt = language == Language::Portuguese;
    let server = alert
        .server
        .as_ref()
        .map(|s| format!("{} ({})", s.address, s.id))
        .unwrap_or_default();
    let reason = alert
        .reason
        .as_ref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let who = alert.who.as_deref().unwrap_or("-");
    let until = alert.until_wall_ms.map(time_of_day).unwrap_or_default();
    let counts = format!(
        "{} {} {}",
        alert.available.unwrap_or(0),
        if pt { "de" } else { "of" },
        alert.total.unwrap_or(0)
    );
    let what = match (alert.event, pt) {
        (AlertEvent::QuarantineEntered, false) => {
            format!("server {server} in quarantine until {until}{reason}")
        }
        (AlertEvent::QuarantineEntered, true) => {
            format!("servidor {server} em quarentena até {until}{reason}")
        }
        (AlertEvent::QuarantineLeft, false) => format!("server {server} out of quarantine{reason}"),
        (AlertEvent::QuarantineLeft, true) => {
            format!("servidor {server} fora da quarentena{reason}")
        }
        (AlertEvent::NoServersAvailable, false) => format!("no server available ({counts})"),
        (AlertEvent::NoServersAvailable, true) => format!("nenhum servidor disponível ({counts})"),
        (AlertEvent::ServersAvailableAgain, false) => {
            format!("servers available again ({counts})")
        }
        (AlertEvent::ServersAvailableAgain, true) => {
            format!("servidores disponíveis novamente ({counts})")
        }
        (AlertEvent::ServerDisabled, false) => format!("server {server} held by {who}{reason}"),
        (AlertEvent::ServerDisabled, true) => {
            format!("servidor {server} retirado por {who}{reason}")
        }
        (AlertEvent::ServerEnabled, false) => format!("server {server} enabled by {who}"),
        (AlertEvent::ServerEnabled, true) => format!("servidor {server} habilitado por {who}"),
        (AlertEvent::BrokerStarted, false) => "broker started".into(),
        (AlertEvent::BrokerStarted, true) => "broker iniciado".into(),
        (AlertEvent::BrokerStopping, false) => "broker stopping".into(),
        (AlertEvent::BrokerStopping, true) => "broker parando".into(),
        (AlertEvent::BrokerRestarted, false) => format!("broker restarted{reason}"),
        (AlertEvent::BrokerRestarted, true) => format!("broker reiniciado{reason}"),
        (AlertEvent::BrokerUpgraded, pt) => upgraded(alert, pt),
        (AlertEvent::CertificateExpiring, false) => format!("certificate expiring{reason}"),
        (AlertEvent::CertificateExpiring, true) => format!("certificado expirando{reason}"),
        (AlertEvent::RestartRan, false) => format!("RESTART_COMMAND ran for {server}{reason}"),
        (AlertEvent::RestartRan, true) => {
            format!("RESTART_COMMAND executado para {server}{reason}")
        }
        (AlertEvent::AlertsDropped, pt) => dropped(alert, pt),
    };
    let balancer = alert
        .balancer
        .map(|b| format!("[{}] ", b.section()))
        .unwrap_or_default();
    // One line: a reason or an output with a line break must not break it.
    format!("appbroker@{broker}: {balancer}{what}").replace(['\n', '\r'], " ")
}

/// `240 alerts dropped: a receiver was too slow`, or in pt-BR.
fn dropped(alert: &Alert, pt: bool) -> String {
    let dropped = alert.dropped.unwrap_or(0);
    match pt {
        false => format!("{dropped} alerts dropped: a receiver was too slow"),
        true => format!("{dropped} alertas descartados: um destino estava lento demais"),
    }
}

/// `broker upgraded from 0.1.0 (pid 4242) to 0.2.0 (pid 4300) in 812 ms`, or in pt-BR.
fn upgraded(alert: &Alert, pt: bool) -> String {
    let (upgraded, from, to, within, earlier) = match pt {
        false => ("broker upgraded", "from", "to", "in", "an earlier version"),
        true => (
            "broker atualizado",
            "de",
            "para",
            "em",
            "uma versão anterior",
        ),
    };
    let Some(u) = &alert.upgrade else {
        return upgraded.into();
    };
    let old = u.from_version.as_deref().unwrap_or(earlier);
    format!(
        "{upgraded} {from} {old} (pid {}) {to} {} (pid {}) {within} {} ms",
        u.from_pid, u.to_version, u.to_pid, u.handover_ms
    )
}

/// The environment of a command run for the alert: `APPBROKER_EVENT`, `APPBROKER_BALANCER`,
/// and each field that applies as `APPBROKER_<FIELD>` (the server's as
/// `APPBROKER_SERVER`, `_ID`, `_HOST` and `_PORT`).
pub fn environment(alert: &Alert, broker: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("APPBROKER_EVENT".into(), alert.event.as_str().into()),
        ("APPBROKER_AT".into(), rfc3339(alert.at_wall_ms)),
        ("APPBROKER_BROKER".into(), broker.into()),
        (
            "APPBROKER_BALANCER".into(),
            alert.balancer.map_or("", |b| b.section()).into(),
        ),
    ];
    if let Some(server) = &alert.server {
        env.push(("APPBROKER_SERVER".into(), server.address.clone()));
        env.push(("APPBROKER_SERVER_ID".into(), server.id.clone()));
        env.push(("APPBROKER_SERVER_HOST".into(), server.host.clone()));
        env.push(("APPBROKER_SERVER_PORT".into(), server.port.to_string()));
    }
    let fields = [
        ("APPBROKER_REASON", alert.reason.clone()),
        ("APPBROKER_UNTIL", alert.until_wall_ms.map(rfc3339)),
        ("APPBROKER_WHO", alert.who.clone()),
        (
            "APPBROKER_AVAILABLE",
            alert.available.map(|n| n.to_string()),
        ),
        ("APPBROKER_TOTAL", alert.total.map(|n| n.to_string())),
        ("APPBROKER_EXIT", alert.exit.map(|n| n.to_string())),
        ("APPBROKER_DROPPED", alert.dropped.map(|n| n.to_string())),
    ];
    let upgrade = alert.upgrade.as_ref();
    let fields = fields.into_iter().chain([
        (
            "APPBROKER_FROM_VERSION",
            upgrade.and_then(|u| u.from_version.clone()),
        ),
        (
            "APPBROKER_TO_VERSION",
            upgrade.map(|u| u.to_version.clone()),
        ),
        (
            "APPBROKER_FROM_PID",
            upgrade.map(|u| u.from_pid.to_string()),
        ),
        ("APPBROKER_TO_PID", upgrade.map(|u| u.to_pid.to_string())),
        (
            "APPBROKER_HANDOVER_MS",
            upgrade.map(|u| u.handover_ms.to_string()),
        ),
    ]);
    for (name, value) in fields {
        if let Some(value) = value {
            env.push((name.into(), value));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::alert_queue::{AlertServer, Upgraded};
    use crate::config::BalancerKind;

    fn entered() -> Alert {
        Alert {
            until_wall_ms: Some(1_800_000_120_000),
            ..Alert::new(AlertEvent::QuarantineEntered)
                .on(BalancerKind::SmartClientDesktop)
                .about(AlertServer {
                    id: "01".into(),
                    host: "10.0.0.5".into(),
                    port: 1234,
                    address: "10.0.0.5:1234".into(),
                })
                .because("monitor: connection refused")
        }
    }

    #[test]
    fn the_json_has_the_fields_that_apply_and_no_others() {
        let value = json(&entered(), "srv1");
        let object = value.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        let mut expected = vec![
            "event", "at", "broker", "balancer", "server", "id", "reason", "until",
        ];
        expected.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(object["event"], "quarantine_entered");
        assert_eq!(object["balancer"], "BALANCE_SMART_CLIENT_DESKTOP");
        let at = object["at"].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(at).is_ok(),
            "RFC 3339 with an offset: {at}"
        );
        let started = json(&Alert::new(AlertEvent::BrokerStarted), "srv1");
        assert_eq!(started["balancer"], "");
        assert!(started.get("server").is_none());
    }

    #[test]
    fn the_line_is_one_line_in_the_language_asked() {
        let mut alert = entered();
        alert.reason = Some("monitor: refused\nsecond line".into());
        let en = line(&alert, "srv1", Language::English);
        assert!(en.starts_with("appbroker@srv1: [BALANCE_SMART_CLIENT_DESKTOP] server 10.0.0.5:1234 (01) in quarantine until"), "{en}");
        assert!(!en.contains('\n'));
        let pt = line(&alert, "srv1", Language::Portuguese);
        assert!(pt.contains("em quarentena"), "{pt}");
        for event in AlertEvent::ALL {
            assert!(!line(&Alert::new(event), "h", Language::English).is_empty());
        }
    }

    #[test]
    fn an_upgrade_tells_both_brokers_in_each_form() {
        let alert = Alert {
            upgrade: Some(Upgraded {
                from_version: Some("0.1.0".into()),
                to_version: "0.2.0".into(),
                from_pid: 4242,
                to_pid: 4300,
                handover_ms: 812,
            }),
            ..Alert::new(AlertEvent::BrokerUpgraded)
        };
        let value = json(&alert, "srv1");
        assert_eq!(value["event"], "broker_upgraded");
        assert_eq!(value["balancer"], "");
        assert_eq!(value["from_version"], "0.1.0");
        assert_eq!(value["to_version"], "0.2.0");
        assert_eq!(value["from_pid"], 4242);
        assert_eq!(value["to_pid"], 4300);
        assert_eq!(value["handover_ms"], 812);
        assert_eq!(
            line(&alert, "srv1", Language::English),
            "appbroker@srv1: broker upgraded from 0.1.0 (pid 4242) to 0.2.0 (pid 4300) in 812 ms"
        );
        assert_eq!(
            line(&alert, "srv1", Language::Portuguese),
            "appbroker@srv1: broker atualizado de 0.1.0 (pid 4242) para 0.2.0 (pid 4300) em 812 ms"
        );
        let env = environment(&alert, "srv1");
        let get = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("APPBROKER_FROM_VERSION"), Some("0.1.0"));
        assert_eq!(get("APPBROKER_TO_PID"), Some("4300"));
        assert_eq!(get("APPBROKER_HANDOVER_MS"), Some("812"));
        // Only an upgrade has them.
        assert!(json(&entered(), "srv1").get("from_pid").is_none());
    }

    #[test]
    fn the_environment_names_the_server_four_ways() {
        let env = environment(&entered(), "srv1");
        let get = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("APPBROKER_EVENT"), Some("quarantine_entered"));
        assert_eq!(get("APPBROKER_SERVER"), Some("10.0.0.5:1234"));
        assert_eq!(get("APPBROKER_SERVER_ID"), Some("01"));
        assert_eq!(get("APPBROKER_SERVER_HOST"), Some("10.0.0.5"));
        assert_eq!(get("APPBROKER_SERVER_PORT"), Some("1234"));
        assert_eq!(get("APPBROKER_REASON"), Some("monitor: connection refused"));
        assert_eq!(get("APPBROKER_WHO"), None);
    }
}
