//! What the runner measures: the metrics `--metrics` names (and its groups `tcp`, `tls`,
//! `http`), the targets `--only` names (the paths each metric is measured through), and which
//! configuration each metric's proxies are started with.

use anyhow::{Result, anyhow};

use crate::h2::H2Load;
use crate::http::HttpLoad;
use crate::tls::{KeyKind, TlsVersion};

/// The paths compared, in the order they run in each round.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Target {
    Direct,
    Appbroker,
    Haproxy,
    Nginx,
}

impl Target {
    pub const ALL: [Target; 4] = [
        Target::Direct,
        Target::Appbroker,
        Target::Haproxy,
        Target::Nginx,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Appbroker => "appbroker",
            Target::Haproxy => "haproxy",
            Target::Nginx => "nginx",
        }
    }

    /// The name in the table.
    pub fn title(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Appbroker => "appbroker",
            Target::Haproxy => "HAProxy",
            Target::Nginx => "nginx",
        }
    }
}

/// One measurement of a round, through every target in turn.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Metric {
    Bulk1,
    Bulk4,
    TcpRr,
    TcpCrr,
    Rr64,
    Crr,
    Memory,
    /// TLS handshakes (full, then resumed) with one certificate, in one protocol version.
    TlsHandshakes(TlsVersion, KeyKind),
    /// One TLS 1.3 stream each way (ECDSA certificate).
    TlsBulk,
    Http(HttpLoad),
    /// Idle keep-alive HTTP clients.
    HttpMemory,
    /// h2load over TLS, 64 streams a connection.
    H2(H2Load),
    /// Idle HTTP/2 clients over TLS.
    H2Memory,
}

/// Every metric, in the order a round runs them and the table shows them.
pub const METRICS: [Metric; 19] = [
    Metric::Bulk1,
    Metric::Bulk4,
    Metric::TcpRr,
    Metric::TcpCrr,
    Metric::Rr64,
    Metric::Crr,
    Metric::Memory,
    Metric::TlsHandshakes(TlsVersion::Tls13, KeyKind::Ecdsa),
    Metric::TlsHandshakes(TlsVersion::Tls13, KeyKind::Rsa),
    Metric::TlsHandshakes(TlsVersion::Tls12, KeyKind::Ecdsa),
    Metric::TlsHandshakes(TlsVersion::Tls12, KeyKind::Rsa),
    Metric::TlsBulk,
    Metric::Http(HttpLoad::KeepAlive),
    Metric::Http(HttpLoad::Close),
    Metric::Http(HttpLoad::NewSession),
    Metric::HttpMemory,
    Metric::H2(H2Load::One),
    Metric::H2(H2Load::Sixteen),
    Metric::H2Memory,
];

impl Metric {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Bulk1 => "bulk1",
            Metric::Bulk4 => "bulk4",
            Metric::TcpRr => "tcp_rr",
            Metric::TcpCrr => "tcp_crr",
            Metric::Rr64 => "rr64",
            Metric::Crr => "crr",
            Metric::Memory => "memory",
            Metric::TlsHandshakes(v, k) => match (v, k) {
                (TlsVersion::Tls13, KeyKind::Ecdsa) => "tls13_ecdsa",
                (TlsVersion::Tls13, KeyKind::Rsa) => "tls13_rsa",
                (TlsVersion::Tls12, KeyKind::Ecdsa) => "tls12_ecdsa",
                (TlsVersion::Tls12, KeyKind::Rsa) => "tls12_rsa",
            },
            Metric::TlsBulk => "tls_bulk",
            Metric::Http(load) => load.name(),
            Metric::HttpMemory => "http_memory",
            Metric::H2(load) => load.name(),
            Metric::H2Memory => "h2_memory",
        }
    }

    pub fn family(self) -> Family {
        match self {
            Metric::TlsHandshakes(..) | Metric::TlsBulk => Family::Tls,
            Metric::Http(_) | Metric::HttpMemory => Family::Http,
            Metric::H2(_) | Metric::H2Memory => Family::H2,
            _ => Family::Tcp,
        }
    }

    /// Measurements that start their own proxy, one target at a time.
    pub fn holds_connections(self) -> bool {
        matches!(self, Metric::Memory | Metric::HttpMemory | Metric::H2Memory)
    }

    /// The certificate a TLS metric's listeners serve.
    pub fn key(self) -> KeyKind {
        match self {
            Metric::TlsHandshakes(_, k) => k,
            _ => KeyKind::Ecdsa,
        }
    }
}

/// `--metrics`: names and the groups `tcp`, `tls` and `http`, in table order.
pub fn parse_metrics(list: &str) -> Result<Vec<Metric>> {
    let mut metrics = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let group: Vec<Metric> = match name {
            "tcp" => METRICS
                .into_iter()
                .filter(|m| m.family() == Family::Tcp)
                .collect(),
            "tls" => METRICS
                .into_iter()
                .filter(|m| m.family() == Family::Tls)
                .collect(),
            "http" => METRICS
                .into_iter()
                .filter(|m| m.family() == Family::Http)
                .collect(),
            "h2" => METRICS
                .into_iter()
                .filter(|m| m.family() == Family::H2)
                .collect(),
            _ => vec![
                METRICS
                    .into_iter()
                    .find(|m| m.name() == name)
                    .ok_or_else(|| anyhow!("--metrics: unknown metric {name:?}"))?,
            ],
        };
        for m in group {
            if !metrics.contains(&m) {
                metrics.push(m);
            }
        }
    }
    metrics.sort_by_key(|m| METRICS.iter().position(|x| x == m));
    Ok(metrics)
}

/// The kind of listener a metric's proxies are configured with: each has its own templates in
/// benches/.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Family {
    Tcp,
    Tls,
    Http,
    /// HTTP/2 over TLS towards the clients, HTTP/1.1 to the origin.
    H2,
}

impl Family {
    pub const ALL: [Family; 4] = [Family::Tcp, Family::Tls, Family::Http, Family::H2];

    pub fn title(self) -> &'static str {
        match self {
            Family::Tcp => "TCP",
            Family::Tls => "TLS",
            Family::Http => "HTTP",
            Family::H2 => "HTTP/2",
        }
    }

    /// The template in benches/ a target is configured from.
    pub fn template(self, target: Target) -> &'static str {
        match (self, target) {
            (_, Target::Direct) => "",
            (Family::Tcp, Target::Appbroker) => "appbroker.ini",
            (Family::Tcp, Target::Haproxy) => "haproxy.cfg",
            (Family::Tcp, Target::Nginx) => "nginx.conf",
            (Family::Tls, Target::Appbroker) => "appbroker-tls.ini",
            (Family::Tls, Target::Haproxy) => "haproxy-tls.cfg",
            (Family::Tls, Target::Nginx) => "nginx-tls.conf",
            (Family::Http, Target::Appbroker) => "appbroker-http.ini",
            (Family::Http, Target::Haproxy) => "haproxy-http.cfg",
            (Family::Http, Target::Nginx) => "nginx-http.conf",
            (Family::H2, Target::Appbroker) => "appbroker-h2.ini",
            (Family::H2, Target::Haproxy) => "haproxy-h2.cfg",
            (Family::H2, Target::Nginx) => "nginx-h2.conf",
        }
    }
}

/// What a proxy is started for: its family's templates, the server it forwards to (TCP and
/// TLS; the HTTP templates name the two origin servers themselves) and, for TLS, the
/// certificate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Setup {
    pub family: Family,
    pub backend: u16,
    pub key: KeyKind,
}
