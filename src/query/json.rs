//! The JSON answer: a superset of the TOTVS HTTP broker's 24.3.1.9 schema (same field names
//! and types, so existing monitors parse it unchanged), plus appbroker's own fields in
//! snake_case. Figures a TOTVS AppServer reports about itself (users, threads, memory, cpu,
//! pid, uptime) cannot be known here: they carry the neutral values documented in
//! docs/operations.md (0, or "-" for strings), never invented ones.

use serde::Serialize;

use super::snapshot::{HttpFigures, ServerSessions, ServerState, Snapshot, Standing};
use crate::balancer::rules::health::OperatorAsk;
use crate::balancer::rules::overrides::Mode;
use crate::config::SortMethod;
use crate::http::Protocol;
use crate::support::clock::{local_date as date, time_of_day as clock};

/// The whole answer: the TOTVS fields, then appbroker's own.
#[derive(Serialize)]
#[allow(non_snake_case)]
struct Status<'a> {
    // The TOTVS fields.
    serviceDescription: String,
    brokerType: &'static str,
    apiVersion: &'static str,
    fullVersion: String,
    version: &'static str,
    useSSL: u8,
    instanceId: &'a str,
    balanceMethod: u8,
    date: String,
    time: String,
    startedDate: String,
    startedTime: String,
    totalConnectionsHistory: u64,
    totalSessionsHistory: u64,
    lastConnectionDate: String,
    lastConnectionTime: String,
    ID: String,
    servers: Vec<ServerEntry<'a>>,
    total: Total,
    // appbroker's own.
    balancer: &'static str,
    listen: String,
    sort_method: &'static str,
    monitoring_type: &'static str,
    monitor_interval_ms: u64,
    quarantine_time_ms: u64,
    max_connections: u32,
    active_connections: u64,
    peak_connections: u64,
    rejected_connections: u64,
    unserved_connections: u64,
    max_connections_per_client: u32,
    client_limited_connections: u64,
    clients_counted: usize,
    proxy_refused_connections: u64,
    draining: bool,
    started_epoch_ms: u64,
    now_epoch_ms: u64,
    queried_by: String,
    /// An HTTP balancer's requests; absent on a TCP balancer.
    #[serde(skip_serializing_if = "Option::is_none")]
    http: Option<Http>,
}

/// An HTTP balancer's figures since start.
#[derive(Serialize)]
struct Http {
    requests: u64,
    responses_1xx: u64,
    responses_2xx: u64,
    responses_3xx: u64,
    responses_4xx: u64,
    responses_5xx: u64,
    no_server: u64,
    server_failed: u64,
    server_timeout: u64,
    refused: u64,
    client_body_timeout: u64,
    retried_stale_connection: u64,
    retried_next_server: u64,
    upgrades: u64,
    /// Client connections open now over HTTP/1.1 and over HTTP/2.
    http1_connections: u64,
    http2_connections: u64,
    /// Requests finished since start over HTTP/2 (the others came over HTTP/1.1).
    http2_requests: u64,
    /// HTTP/2 streams in hand now.
    http2_streams: u64,
    request_duration_sum_ms: f64,
    /// Live sessions now.
    sessions: u64,
    /// Most live sessions at once.
    sessions_peak: u64,
    /// Sessions moved to another server since start (their server in quarantine or removed).
    sessions_moved: u64,
}

#[derive(Serialize)]
struct Total {
    connections: u64,
    sessions: u64,
    users: u64,
}

/// One server of the answer's `servers` list.
#[derive(Serialize)]
struct ServerEntry<'a> {
    // The TOTVS fields.
    server: &'a str,
    connections: u64,
    sessions: u64,
    connections_max: String,
    sessions_max: String,
    quarantine_entry_time: String,
    quarantine: String,
    standby: u64,
    inquarantine: bool,
    disabled: bool,
    disabled_entry_time: String,
    disabled_reasons: String,
    users: u64,
    threads: u64,
    memory: u64,
    cpu: u64,
    uptime: &'static str,
    pid: u64,
    // appbroker's own.
    id: &'a str,
    weight: u32,
    state: &'static str,
    reason: Option<&'static str>,
    last_error: Option<&'a str>,
    last_error_epoch_ms: Option<u64>,
    last_error_current: bool,
    quarantine_asked: Option<&'a OperatorAsk>,
    quarantine_start_epoch_ms: Option<u64>,
    quarantine_end_epoch_ms: Option<u64>,
    quarantines: u64,
    total_connections: u64,
    failed_connects: u64,
    bytes_to_server: u64,
    bytes_to_client: u64,
    last_check: Option<LastCheck<'a>>,
    last_restart: Option<LastRestart<'a>>,
}

/// The last run of `RESTART_COMMAND` for a server.
#[derive(Serialize)]
struct LastRestart<'a> {
    epoch_ms: u64,
    exit: Option<i32>,
    outcome: &'a str,
    output: &'a str,
    why: &'a str,
}

/// A server's last monitor check.
#[derive(Serialize)]
struct LastCheck<'a> {
    ok: bool,
    epoch_ms: u64,
    duration_ms: f64,
    error: Option<&'a str>,
}

/// The JSON text of `snap`.
pub fn render(snap: &Snapshot) -> String {
    let sessions = |address: &str| {
        snap.http
            .as_ref()
            .map(|h| h.sessions_of(address))
            .unwrap_or_default()
    };
    let servers: Vec<ServerEntry<'_>> = snap
        .state
        .servers
        .iter()
        .map(|s| server(s, sessions(&s.address)))
        .collect();
    let live_sessions = snap.http.as_ref().map_or(0, |h| h.sessions.live);
    let status = Status {
        serviceDescription: service_description(snap),
        brokerType: snap.state.kind.section(),
        apiVersion: "1.1",
        fullVersion: format!("appbroker {}", env!("CARGO_PKG_VERSION")),
        version: env!("CARGO_PKG_VERSION"),
        useSSL: 0,
        instanceId: &snap.instance,
        balanceMethod: balance_method(snap.state.sort_method),
        date: date(snap.now_wall_ms),
        time: clock(snap.now_wall_ms),
        startedDate: date(snap.started_wall_ms),
        startedTime: clock(snap.started_wall_ms),
        totalConnectionsHistory: snap.state.accepted,
        totalSessionsHistory: snap.http.as_ref().map_or(0, |h| h.sessions.total),
        lastConnectionDate: when(snap.state.last_connection_wall_ms, date),
        lastConnectionTime: when(snap.state.last_connection_wall_ms, clock),
        ID: snap.pid.to_string(),
        total: Total {
            connections: snap.state.servers.iter().map(|s| s.active).sum(),
            sessions: live_sessions,
            users: 0,
        },
        servers,
        balancer: snap.state.kind.section(),
        listen: snap.state.listen.to_string(),
        sort_method: snap.state.sort_method.as_str(),
        monitoring_type: snap.state.monitoring.as_str(),
        monitor_interval_ms: snap.state.monitor_interval.as_millis() as u64,
        quarantine_time_ms: snap.state.quarantine_time.as_millis() as u64,
        max_connections: snap.state.max_connections,
        active_connections: snap.state.active,
        peak_connections: snap.state.peak,
        rejected_connections: snap.state.rejected,
        unserved_connections: snap.state.unserved,
        max_connections_per_client: snap.state.max_connections_per_client,
        client_limited_connections: snap.state.client_limited,
        clients_counted: snap.state.clients_counted,
        proxy_refused_connections: snap.state.proxy_refusals.iter().map(|(_, n)| n).sum(),
        draining: snap.draining,
        started_epoch_ms: snap.started_wall_ms,
        now_epoch_ms: snap.now_wall_ms,
        queried_by: snap.peer.to_string(),
        http: snap.http.as_ref().map(http),
    };
    serde_json::to_string_pretty(&status).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// `appbroker TCP broker [BALANCE_SMART_CLIENT_DESKTOP]`.
fn service_description(snap: &Snapshot) -> String {
    format!(
        "appbroker {} broker [{}]",
        if snap.state.kind.is_http() {
            "HTTP"
        } else {
            "TCP"
        },
        snap.state.kind.section()
    )
}

/// The TOTVS broker's number for the policy.
fn balance_method(sort_method: SortMethod) -> u8 {
    match sort_method {
        SortMethod::Connection => 1,
        SortMethod::RoundRobin => 2,
        // What the TOTVS HTTP broker reports (captures/peder1981-monitor...).
        SortMethod::Session => 4,
    }
}

/// An HTTP balancer's figures as the answer gives them.
fn http(h: &HttpFigures) -> Http {
    let r = &h.requests;
    let [c1, c2, c3, c4, c5] = r.classes;
    Http {
        requests: r.requests,
        responses_1xx: c1,
        responses_2xx: c2,
        responses_3xx: c3,
        responses_4xx: c4,
        responses_5xx: c5,
        no_server: r.no_server,
        server_failed: r.server_failed,
        server_timeout: r.server_timeout,
        refused: r.refused,
        client_body_timeout: r.client_body_timeout,
        retried_stale_connection: r.retried_stale,
        retried_next_server: r.retried_next,
        upgrades: r.upgrades,
        http1_connections: r.connections_open[Protocol::Http1.index()],
        http2_connections: r.connections_open[Protocol::H2.index()],
        http2_requests: r.by_protocol[Protocol::H2.index()],
        http2_streams: r.h2_streams_open,
        request_duration_sum_ms: r.duration_sum.as_secs_f64() * 1000.0,
        sessions: h.sessions.live,
        sessions_peak: h.sessions.peak,
        sessions_moved: h.sessions.moved,
    }
}

fn when(wall_ms: u64, format: fn(u64) -> String) -> String {
    if wall_ms == 0 {
        "-".into()
    } else {
        format(wall_ms)
    }
}

/// Why a server takes no new clients: the operator's hold (mode, who, reason), weight 0.
fn disabled_reasons(s: &ServerState) -> String {
    let mut reasons = Vec::new();
    if let Some(h) = &s.overrides.hold {
        let mut r = format!("{} by {}", h.mode.as_str(), h.by);
        if !h.reason.is_empty() {
            r.push_str(&format!(": {}", h.reason));
        }
        reasons.push(r);
    }
    if s.weight == 0 {
        reasons.push("weight 0".to_string());
    }
    reasons.join("; ")
}

fn server(s: &ServerState, sessions: ServerSessions) -> ServerEntry<'_> {
    ServerEntry {
        server: &s.address,
        connections: s.active,
        sessions: sessions.live,
        connections_max: s.peak.to_string(),
        sessions_max: sessions.peak.to_string(),
        quarantine_entry_time: s
            .quarantine
            .map_or_else(|| "-".into(), |(since, _)| clock(since)),
        quarantine: s
            .quarantine
            .map_or_else(|| "-".into(), |(_, until)| clock(until)),
        standby: 0,
        inquarantine: s.quarantine.is_some(),
        disabled: s.weight == 0 || s.state == Standing::Disabled,
        disabled_entry_time: s
            .overrides
            .hold
            .as_ref()
            .map_or_else(|| "-".into(), |h| clock(h.since_wall_ms)),
        disabled_reasons: disabled_reasons(s),
        users: 0,
        threads: 0,
        memory: 0,
        cpu: 0,
        uptime: "-",
        pid: 0,
        id: &s.id,
        weight: s.weight,
        state: match s.state {
            Standing::Available => "available",
            Standing::Quarantined => "quarantined",
            Standing::Draining => "draining",
            Standing::Disabled => match &s.overrides.hold {
                Some(h) if h.mode == Mode::Drain => "drain",
                _ => "disabled",
            },
        },
        reason: s.reason.map(|r| r.as_str()),
        last_error: s.last_error.as_deref(),
        last_error_epoch_ms: s.last_error.as_ref().map(|_| s.last_error_wall_ms),
        last_error_current: s.error_current,
        quarantine_asked: s.asked.as_ref(),
        quarantine_start_epoch_ms: s.quarantine.map(|(since, _)| since),
        quarantine_end_epoch_ms: s.quarantine.map(|(_, until)| until),
        quarantines: s.quarantines,
        total_connections: s.total,
        failed_connects: s.failed_connects,
        bytes_to_server: s.bytes_to_server,
        bytes_to_client: s.bytes_to_client,
        last_check: s.last_check.as_ref().map(|c| LastCheck {
            ok: c.error.is_none(),
            epoch_ms: c.at_wall_ms,
            duration_ms: c.duration.as_secs_f64() * 1000.0,
            error: c.error.as_deref(),
        }),
        last_restart: s.restarted.as_ref().map(|r| LastRestart {
            epoch_ms: r.at_wall_ms,
            exit: r.exit,
            outcome: &r.outcome,
            output: &r.output,
            why: &r.why,
        }),
    }
}
