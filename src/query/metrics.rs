//! METRICS: the Prometheus text exposition format (version 0.0.4) of one balancer.

use std::fmt::Write;

use super::snapshot::{HttpFigures, ServerState, Snapshot, Standing};
use crate::balancer::rules::health::CheckResult;
use crate::http::stats::{DURATION_BUCKETS, Figures};
use crate::http::{PoolFigures, Protocol};

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
const PER_CHECK: &[Family<CheckResult>] = &[
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
        "balancer_max_connections_per_client",
        "gauge",
        "MAX_CONNECTIONS_PER_CLIENT (0: no limit).",
        |s| f64::from(s.state.max_connections_per_client),
    ),
    (
        "balancer_client_limit_refused_total",
        "counter",
        "Connections refused because their client had MAX_CONNECTIONS_PER_CLIENT open.",
        |s| s.state.client_limited as f64,
    ),
    (
        "balancer_clients_counted",
        "gauge",
        "Client addresses with connections counted against MAX_CONNECTIONS_PER_CLIENT now.",
        |s| s.state.clients_counted as f64,
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
    alert_families(&mut out, snap, &balancer);
    if snap.state.proxy_protocol {
        family(
            &mut out,
            "proxy_protocol_refused_total",
            "counter",
            "Connections closed at the PROXY protocol step, by cause: no valid header from a \
             front balancer, or a header from another source (not_allowed).",
            snap.state
                .proxy_refusals
                .iter()
                .map(|(cause, n)| (format!("{balancer},cause=\"{cause}\""), *n as f64)),
        );
    }
    if let Some(http) = &snap.http {
        http_families(&mut out, &balancer, http);
        session_families(&mut out, &balancer, http);
    }
    out
}

/// The alerts (this balancer's, and the broker's own with `balancer=""`) by event and
/// outcome, and the restarts of this balancer's servers by outcome.
fn alert_families(out: &mut String, snap: &Snapshot, balancer: &str) {
    family(
        out,
        "alerts_total",
        "counter",
        "Alerts by event and outcome (delivered or failed at a receiver, or dropped).",
        snap.alerts.iter().map(|(b, event, outcome, n)| {
            (
                format!(
                    "balancer=\"{}\",event=\"{event}\",outcome=\"{outcome}\"",
                    label(b)
                ),
                *n as f64,
            )
        }),
    );
    family(
        out,
        "restarts_total",
        "counter",
        "Runs of RESTART_COMMAND by outcome (ok, failed, timeout), and restarts held back \
         (skipped).",
        snap.restarts
            .iter()
            .map(|(outcome, n)| (format!("{balancer},outcome=\"{outcome}\""), *n as f64)),
    );
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

/// One sample per server of an HTTP balancer, from its pool of kept-alive connections.
const PER_POOL: &[Family<PoolFigures>] = &[
    (
        "http_pool_idle_connections",
        "gauge",
        "Kept-alive connections to the server waiting for a request now.",
        |p| p.idle as f64,
    ),
    (
        "http_pool_open_connections",
        "gauge",
        "Connections to the server open now (idle, busy or upgraded).",
        |p| p.open as f64,
    ),
    (
        "http_pool_opened_connections_total",
        "counter",
        "Connections to the server opened since start.",
        |p| p.opened as f64,
    ),
    (
        "http_pool_reused_total",
        "counter",
        "Requests sent on a kept-alive connection taken from the pool.",
        |p| p.reused as f64,
    ),
];

/// An HTTP balancer's session families: live per server, since start, moved.
fn session_families(out: &mut String, balancer: &str, http: &HttpFigures) {
    let s = &http.sessions;
    family(
        out,
        "http_sessions",
        "gauge",
        "Live HTTP sessions (TOTVS_BROKER_SH_001 cookies brought back) per server.",
        s.servers.iter().map(|(server, f)| {
            (
                format!("{balancer},server=\"{}\"", label(server)),
                f.live as f64,
            )
        }),
    );
    family(
        out,
        "http_sessions_total",
        "counter",
        "HTTP sessions since start.",
        [(balancer.to_string(), s.total as f64)],
    );
    family(
        out,
        "http_sessions_moved_total",
        "counter",
        "HTTP sessions moved to another server (theirs in quarantine or removed) since start.",
        [(balancer.to_string(), s.moved as f64)],
    );
}

/// An HTTP balancer's families: answers by status class, the request duration histogram,
/// failures and retries by kind, upgrades, and each server's pool.
fn http_families(out: &mut String, balancer: &str, http: &HttpFigures) {
    let r = &http.requests;
    let classes = ["1xx", "2xx", "3xx", "4xx", "5xx"]
        .iter()
        .zip(r.classes)
        .map(|(class, n)| (format!("{balancer},class=\"{class}\""), n as f64));
    family(
        out,
        "http_responses_total",
        "counter",
        "Answers sent to clients, by status class (the servers' and the broker's own).",
        classes,
    );
    duration_histogram(out, balancer, r);
    failure_families(out, balancer, r);
    protocol_families(out, balancer, r);
    for (name, kind, help, value) in PER_POOL {
        let samples = http.pools.iter().map(|(server, pool)| {
            (
                format!("{balancer},server=\"{}\"", label(server)),
                value(pool),
            )
        });
        family(out, name, kind, help, samples);
    }
}

/// The request duration histogram: a bucket per bound of [`DURATION_BUCKETS`], `+Inf`, the sum
/// and the count.
fn duration_histogram(out: &mut String, balancer: &str, r: &Figures) {
    let name = "appbroker_http_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} From a request's head received to its answer's last byte sent."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (bound, count) in DURATION_BUCKETS.iter().zip(&r.buckets) {
        let le = bound.as_secs_f64();
        let _ = writeln!(out, "{name}_bucket{{{balancer},le=\"{le}\"}} {count}");
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{{balancer},le=\"+Inf\"}} {}",
        r.buckets.last().copied().unwrap_or(r.requests)
    );
    let _ = writeln!(
        out,
        "{name}_sum{{{balancer}}} {}",
        r.duration_sum.as_secs_f64()
    );
    let _ = writeln!(out, "{name}_count{{{balancer}}} {}", r.requests);
}

/// The requests the broker answered itself or cut, and those it sent again, by kind; the
/// upgrades; the body bytes spliced.
fn failure_families(out: &mut String, balancer: &str, r: &Figures) {
    let failures = [
        ("no_server", r.no_server),
        ("server_failed", r.server_failed),
        ("server_timeout", r.server_timeout),
        ("refused", r.refused),
        ("client_body_timeout", r.client_body_timeout),
    ];
    family(
        out,
        "http_failures_total",
        "counter",
        "Requests the broker answered itself or cut: no_server 503, server_failed 502, \
         server_timeout 504 or an answer cut midway, refused 4xx, client_body_timeout 408 or a \
         connection closed midway.",
        failures
            .iter()
            .map(|(kind, n)| (format!("{balancer},kind=\"{kind}\""), *n as f64)),
    );
    let retries = [
        ("stale_connection", r.retried_stale),
        ("next_server", r.retried_next),
    ];
    family(
        out,
        "http_retries_total",
        "counter",
        "Requests sent again: on a fresh connection after a kept-alive one was found closed, \
         or to the next server (HTTP_RETRY_IDEMPOTENT).",
        retries
            .iter()
            .map(|(kind, n)| (format!("{balancer},kind=\"{kind}\""), *n as f64)),
    );
    family(
        out,
        "http_upgrades_total",
        "counter",
        "Connections upgraded (WebSocket) since start.",
        [(balancer.to_string(), r.upgrades as f64)],
    );
    family(
        out,
        "http_spliced_bytes_total",
        "counter",
        "Body bytes moved by splice(2) between plain sockets, not through the broker's buffers.",
        [(balancer.to_string(), r.spliced as f64)],
    );
}

/// Connections and requests by the HTTP version clients spoke (`http/1.1`, `h2`): families of
/// their own, so no existing family gains a label its rules and dashboards do not expect; and
/// HTTP/2's streams, its clients' resets and the connections ended for them.
fn protocol_families(out: &mut String, balancer: &str, r: &Figures) {
    let by_protocol = |values: [u64; 2]| {
        Protocol::ALL.into_iter().map(move |protocol| {
            let label = format!("{balancer},protocol=\"{}\"", protocol.name());
            (label, values[protocol.index()] as f64)
        })
    };
    family(
        out,
        "http_protocol_connections_total",
        "counter",
        "Client connections since start, by HTTP version (http/1.1, h2: ALPN's names).",
        by_protocol(r.connections),
    );
    family(
        out,
        "http_protocol_connections_open",
        "gauge",
        "Client connections open now, by HTTP version.",
        by_protocol(r.connections_open),
    );
    family(
        out,
        "http_protocol_requests_total",
        "counter",
        "Requests finished, by the HTTP version the client spoke.",
        by_protocol(r.by_protocol),
    );
    let h2 = [
        (
            "http2_streams_total",
            "counter",
            "HTTP/2 streams (requests) since start.",
            r.h2_streams,
        ),
        (
            "http2_streams_open",
            "gauge",
            "HTTP/2 streams in hand now.",
            r.h2_streams_open,
        ),
        (
            "http2_client_resets_total",
            "counter",
            "HTTP/2 streams their client reset (RST_STREAM) before their answer was whole.",
            r.h2_resets,
        ),
        (
            "http2_calmed_connections_total",
            "counter",
            "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for resetting more than \
             1000 streams within 10 s (the rapid reset attack).",
            r.h2_calmed,
        ),
    ];
    for (name, kind, help, value) in h2 {
        family(
            out,
            name,
            kind,
            help,
            [(balancer.to_string(), value as f64)],
        );
    }
}
