//! Snapshots for the pages' unit tests: servers with a minute's samples, a TCP balancer's
//! state around them.

use std::time::Duration;

use crate::balancer::BalancerState;
use crate::config::{BalancerKind, Language, Monitoring, SortMethod};
use crate::query::snapshot::{ServerState, Snapshot, Standing};

/// A server with `samples`, one a minute, `minutes_ago` apart from `now`, and `active` now.
pub(super) fn server(port: u16, now: u64, samples: &[(u64, u64)], active: u64) -> ServerState {
    ServerState {
        id: format!("{:02}", port % 100),
        address: format!("10.0.0.1:{port}"),
        weight: 1,
        file_weight: 1,
        overrides: Default::default(),
        forced: false,
        state: Standing::Available,
        active,
        sessions: 0,
        peak: 0,
        total: 0,
        failed_connects: 0,
        bytes_to_server: 0,
        bytes_to_client: 0,
        quarantine: None,
        reason: None,
        last_error: None,
        last_error_wall_ms: 0,
        error_current: false,
        asked: None,
        quarantines: 0,
        last_check: None,
        history: Vec::new(),
        samples: samples
            .iter()
            .map(|&(minutes_ago, v)| (now - minutes_ago * 60_000, v))
            .collect(),
        restarted: None,
    }
}

pub(super) fn snapshot(now: u64, servers: Vec<ServerState>) -> Snapshot {
    Snapshot {
        state: BalancerState {
            kind: BalancerKind::SmartClientDesktop,
            listen: "0.0.0.0:5000".parse().expect("address"),
            active: servers.iter().map(|s| s.active).sum(),
            accepted: 0,
            rejected: 0,
            unserved: 0,
            peak: 0,
            last_connection_wall_ms: 0,
            max_connections: 10_000,
            sort_method: SortMethod::Connection,
            monitoring: Monitoring::Connection,
            monitor_interval: Duration::from_secs(60),
            quarantine_time: Duration::from_secs(120),
            servers,
            certificate: None,
            upstream_warning: None,
            handshake_failures: Vec::new(),
            proxy_protocol: false,
            proxy_refusals: Vec::new(),
            max_connections_per_client: 0,
            client_limited: 0,
            clients_counted: 0,
        },
        language: Language::English,
        language_asked: false,
        started_wall_ms: now - 3_600_000,
        now_wall_ms: now,
        pid: 1,
        instance: "[1-1]".into(),
        peer: "127.0.0.1:1".parse().expect("address"),
        draining: false,
        others: Vec::new(),
        http: None,
        alerts: Vec::new(),
        restarts: Vec::new(),
    }
}

/// The wall clock the tests' snapshots are taken at.
pub(super) const NOW: u64 = 1_800_000_000_000;
