//! METRICS: the Prometheus text exposition format (version 0.0.4) of one balancer.

use std::fmt::Write;

use super::snapshot::{ServerState, Snapshot, Standing};
use crate::health::Check;

/// One metric family: name, type, help, and a value per sample.
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl IntoIterator<Item = (String, f64)>,
) {
    let _ = writeln!(out, "# HELP appbroker_{name} {help}");
    let _ = writeln!(out, "# TYPE appbroker_{name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "appbroker_{name}{{{labels}}} {value}");
    }
}

/// Escapes a label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A metric family: name (after `appbroker_`), type, help, and how a value is read.
type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> f64);

/// One sample per server.
const PER_SERVER: &[Family<ServerState>] = &[
    (
        "server_active_connections",
        "gauge",
        "Connections counted against the server now.",
        |s| s.active as f64,
    ),
    (
        "server_connections_total",
        "counter",
        "Connections relayed to the server since start.",
        |s| s.total as f64,
    ),
    (
        "server_failed_connects_total",
        "counter",
        "Client connects to the server that failed.",
        |s| s.failed_connects as f64,
    ),
    (
        "server_bytes_to_server_total",
        "counter",
        "Bytes relayed from clients to the server.",
        |s| s.bytes_to_server as f64,
    ),
    (
        "server_bytes_to_client_total",
        "counter",
        "Bytes relayed from the server to clients.",
        |s| s.bytes_to_client as f64,
    ),
    (
        "server_in_quarantine",
        "gauge",
        "1 while the server is in quarantine.",
        |s| f64::from(u8::from(s.quarantine.is_some())),
    ),
    (
        "server_disabled",
        "gauge",
        "1 while an operator holds the server out of the balancing (ctl disable or drain).",
        |s| f64::from(u8::from(s.state == Standing::Disabled)),
    ),
    (
        "server_quarantines_total",
        "counter",
        "Quarantines the server has entered since start.",
        |s| s.quarantines as f64,
    ),
    (
        "server_weight",
        "gauge",
        "Weight in use, an operator's override or the file's (0 drains the server).",
        |s| f64::from(s.weight),
    ),
];

/// One sample per server that has been checked, from its last check.
const PER_CHECK: &[Family<Check>] = &[
    (
        "server_check_duration_seconds",
        "gauge",
        "Duration of the last monitor check.",
        |c| c.duration.as_secs_f64(),
    ),
    (
        "server_check_up",
        "gauge",
        "1 when the last monitor check passed.",
        |c| f64::from(u8::from(c.error.is_none())),
    ),
];

/// One sample for the balancer.
const PER_BALANCER: &[Family<Snapshot>] = &[
    (
        "balancer_accepted_clients_total",
        "counter",
        "Clients forwarded since start.",
        |s| s.state.accepted as f64,
    ),
    (
        "balancer_rejected_clients_total",
        "counter",
        "Clients refused because MAX_CONNECTIONS was reached.",
        |s| s.state.rejected as f64,
    ),
    (
        "balancer_unserved_clients_total",
        "counter",
        "Clients closed because no server could be reached.",
        |s| s.state.unserved as f64,
    ),
    (
        "balancer_active_clients",
        "gauge",
        "Client connections open now.",
        |s| s.state.active as f64,
    ),
    (
        "balancer_max_connections",
        "gauge",
        "MAX_CONNECTIONS.",
        |s| f64::from(s.state.max_connections),
    ),
    (
        "balancer_draining",
        "gauge",
        "1 while shutting down (PING answers 503).",
        |s| f64::from(u8::from(s.draining)),
    ),
    (
        "start_time_seconds",
        "gauge",
        "When the broker started, seconds since the Unix epoch.",
        |s| s.started_wall_ms as f64 / 1000.0,
    ),
];

/// The exposition text of `snap`.
pub fn render(snap: &Snapshot) -> String {
    let mut out = String::with_capacity(4096 + snap.state.servers.len() * 1200);
    let balancer = format!("balancer=\"{}\"", snap.state.kind.section());
    let labels = |s: &ServerState| {
        format!(
            "{balancer},id=\"{}\",server=\"{}\"",
            label(&s.id),
            label(&s.address)
        )
    };
    for (name, kind, help, value) in PER_SERVER {
        let samples = snap.state.servers.iter().map(|s| (labels(s), value(s)));
        family(&mut out, name, kind, help, samples);
    }
    for (name, kind, help, value) in PER_CHECK {
        let samples = snap
            .state
            .servers
            .iter()
            .filter_map(|s| Some((labels(s), value(s.last_check.as_ref()?))));
        family(&mut out, name, kind, help, samples);
    }
    for (name, kind, help, value) in PER_BALANCER {
        family(
            &mut out,
            name,
            kind,
            help,
            [(balancer.clone(), value(snap))],
        );
    }
    tls(&mut out, snap, &balancer);
    out
}

/// The TLS families, on a balancer that speaks TLS: seconds until its certificate expires
/// (alert on a threshold), and failed handshakes with clients by cause.
fn tls(out: &mut String, snap: &Snapshot, balancer: &str) {
    let Some(certificate) = &snap.state.certificate else {
        return;
    };
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_millis(snap.now_wall_ms);
    family(
        out,
        "tls_certificate_expiry_seconds",
        "gauge",
        "Seconds until the certificate served to clients expires (negative: expired).",
        [(
            format!(
                "{balancer},path=\"{}\",subject=\"{}\"",
                label(&certificate.path.display().to_string()),
                label(&certificate.subject)
            ),
            certificate.seconds_until_expiry(now) as f64,
        )],
    );
    family(
        out,
        "tls_handshake_failures_total",
        "counter",
        "TLS handshakes with clients that failed, by cause.",
        snap.state
            .handshake_failures
            .iter()
            .map(|(cause, n)| (format!("{balancer},cause=\"{cause}\""), *n as f64)),
    );
}
