//! METRICS: the Prometheus text exposition format (version 0.0.4) of one balancer.

use std::fmt::Write;

use super::snapshot::{Snapshot, Standing};

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

/// The exposition text of `snap`.
pub fn render(snap: &Snapshot) -> String {
    let mut out = String::with_capacity(4096 + snap.state.servers.len() * 1200);
    let balancer = format!("balancer=\"{}\"", snap.state.kind.section());
    let per_server = |f: &dyn Fn(&super::snapshot::ServerState) -> f64| -> Vec<(String, f64)> {
        snap.state
            .servers
            .iter()
            .map(|s| {
                (
                    format!(
                        "{balancer},id=\"{}\",server=\"{}\"",
                        label(&s.id),
                        label(&s.address)
                    ),
                    f(s),
                )
            })
            .collect()
    };
    family(
        &mut out,
        "server_active_connections",
        "gauge",
        "Connections counted against the server now.",
        per_server(&|s| s.active as f64),
    );
    family(
        &mut out,
        "server_connections_total",
        "counter",
        "Connections relayed to the server since start.",
        per_server(&|s| s.total as f64),
    );
    family(
        &mut out,
        "server_failed_connects_total",
        "counter",
        "Client connects to the server that failed.",
        per_server(&|s| s.failed_connects as f64),
    );
    family(
        &mut out,
        "server_bytes_to_server_total",
        "counter",
        "Bytes relayed from clients to the server.",
        per_server(&|s| s.bytes_to_server as f64),
    );
    family(
        &mut out,
        "server_bytes_to_client_total",
        "counter",
        "Bytes relayed from the server to clients.",
        per_server(&|s| s.bytes_to_client as f64),
    );
    family(
        &mut out,
        "server_in_quarantine",
        "gauge",
        "1 while the server is in quarantine.",
        per_server(&|s| f64::from(u8::from(s.state == Standing::Quarantined))),
    );
    family(
        &mut out,
        "server_quarantines_total",
        "counter",
        "Quarantines the server has entered since start.",
        per_server(&|s| s.quarantines as f64),
    );
    family(
        &mut out,
        "server_weight",
        "gauge",
        "Configured weight (0 drains the server).",
        per_server(&|s| f64::from(s.weight)),
    );
    let checked: Vec<_> = snap
        .state
        .servers
        .iter()
        .filter(|s| s.last_check.is_some())
        .collect();
    let check = |f: &dyn Fn(&crate::health::Check) -> f64| -> Vec<(String, f64)> {
        checked
            .iter()
            .filter_map(|s| {
                let c = s.last_check.as_ref()?;
                Some((
                    format!(
                        "{balancer},id=\"{}\",server=\"{}\"",
                        label(&s.id),
                        label(&s.address)
                    ),
                    f(c),
                ))
            })
            .collect()
    };
    family(
        &mut out,
        "server_check_duration_seconds",
        "gauge",
        "Duration of the last monitor check.",
        check(&|c| c.duration.as_secs_f64()),
    );
    family(
        &mut out,
        "server_check_up",
        "gauge",
        "1 when the last monitor check passed.",
        check(&|c| f64::from(u8::from(c.error.is_none()))),
    );
    let one = |v: u64| vec![(balancer.clone(), v as f64)];
    family(
        &mut out,
        "balancer_accepted_clients_total",
        "counter",
        "Clients forwarded since start.",
        one(snap.state.accepted),
    );
    family(
        &mut out,
        "balancer_rejected_clients_total",
        "counter",
        "Clients refused because MAX_CONNECTIONS was reached.",
        one(snap.state.rejected),
    );
    family(
        &mut out,
        "balancer_unserved_clients_total",
        "counter",
        "Clients closed because no server could be reached.",
        one(snap.state.unserved),
    );
    family(
        &mut out,
        "balancer_active_clients",
        "gauge",
        "Client connections open now.",
        one(snap.state.active),
    );
    family(
        &mut out,
        "balancer_max_connections",
        "gauge",
        "MAX_CONNECTIONS.",
        one(u64::from(snap.state.max_connections)),
    );
    family(
        &mut out,
        "balancer_draining",
        "gauge",
        "1 while shutting down (PING answers 503).",
        one(u64::from(snap.draining)),
    );
    family(
        &mut out,
        "start_time_seconds",
        "gauge",
        "When the broker started, seconds since the Unix epoch.",
        vec![(balancer.clone(), snap.started_wall_ms as f64 / 1000.0)],
    );
    out
}
