//! The `appserver.ini` files tests write: the placeholders a harness fills in (ports, the
//! broker's directory), a TCP balancer over loopback servers, an HTTP balancer over origins,
//! and the session secret with the cookies it signs.

use std::net::SocketAddr;
use std::path::Path;

use crate::TestServer;

/// `ini` with `@PORT@`, `@PORT2@` and `@DIR@` replaced by `ports` and `dir`.
pub fn fill_placeholders(ini: &str, ports: &[u16], dir: &Path) -> String {
    ini.replace("@PORT@", &ports[0].to_string())
        .replace("@PORT2@", &ports[1].to_string())
        .replace("@DIR@", &dir.display().to_string())
}

/// An `appserver.ini` as tests write it, the one builder of them: `[General]` (a stop within
/// 5 s unless the test says otherwise, and the test's lines), then balancers on the port
/// placeholders a harness fills in (`@PORT@`, `@PORT2@`), each with its lines and servers.
/// Monitoring is off in a balancer unless its lines set it, so tests decide when checks run.
pub struct Ini {
    general: String,
    balancers: String,
}

impl Ini {
    /// `[General]` with `SHUTDOWN_TIMEOUT=5` (unless a line given later sets it).
    pub fn new() -> Ini {
        Ini::empty().general("SHUTDOWN_TIMEOUT=5")
    }

    /// `[General]` with nothing but what the test adds: the broker's own defaults.
    pub fn empty() -> Ini {
        Ini {
            general: String::new(),
            balancers: String::new(),
        }
    }

    /// `lines` added to `[General]`; a key given again replaces the one before.
    pub fn general(mut self, lines: &str) -> Ini {
        for line in lines.lines().filter(|l| !l.trim().is_empty()) {
            let key = line.split('=').next().unwrap_or_default();
            self.general = self
                .general
                .lines()
                .filter(|l| {
                    !l.split('=')
                        .next()
                        .unwrap_or_default()
                        .eq_ignore_ascii_case(key)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            self.general.push_str(line);
            self.general.push('\n');
        }
        self
    }

    /// A balancer `[section]` on 127.0.0.1 and `port` (a placeholder), with `lines`, over
    /// `servers` (`REMOTE_SERVER` values: `host port [weight]`) under ids 01, 02...
    pub fn balancer<S: std::fmt::Display>(
        mut self,
        section: &str,
        port: &str,
        lines: &str,
        servers: impl IntoIterator<Item = S>,
    ) -> Ini {
        let text = &mut self.balancers;
        text.push_str(&format!(
            "[{section}]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT={port}\n"
        ));
        if !lines.to_ascii_uppercase().contains("MONITORING_TYPE") {
            text.push_str("MONITORING_TYPE=DISABLED\n");
        }
        for line in lines.lines() {
            text.push_str(line);
            text.push('\n');
        }
        for (i, server) in servers.into_iter().enumerate() {
            text.push_str(&format!("REMOTE_SERVER_{:02}={server}\n", i + 1));
        }
        self
    }

    /// The file's text.
    pub fn text(self) -> String {
        format!("[General]\n{}{}", self.general, self.balancers)
    }
}

impl Default for Ini {
    fn default() -> Ini {
        Ini::new()
    }
}

/// `addr` as a `REMOTE_SERVER` value: `host port`.
pub fn server_value(addr: SocketAddr) -> String {
    format!("{} {}", addr.ip(), addr.port())
}

/// An ini with one `[BALANCE_SMART_CLIENT_DESKTOP]` on `@PORT@` over `servers`, plus `extra`
/// lines in the section ([`Ini`]).
pub fn ini_for(servers: &[&TestServer], extra: &str) -> String {
    let servers = servers.iter().map(|s| s.ini());
    Ini::new()
        .balancer("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", extra, servers)
        .text()
}

/// An ini with one `[BALANCE_HTTP]` on `@PORT@` over `servers`, queries allowed from
/// loopback, plus `extra` lines in the section ([`Ini`]).
pub fn http_ini(servers: &[SocketAddr], extra: &str) -> String {
    let lines = format!("QUERY_ALLOW=127.0.0.1\n{extra}");
    let servers = servers.iter().map(|&s| server_value(s));
    Ini::new()
        .balancer("BALANCE_HTTP", "@PORT@", &lines, servers)
        .text()
}

/// An ini with one `[BALANCE_HTTP]` on `@PORT@` (queries from loopback), `general` lines in
/// `[General]`, `extra` lines in the section, and `servers` as `(address, weight)` ([`Ini`]).
pub fn weighted_http_ini(general: &str, servers: &[(SocketAddr, u32)], extra: &str) -> String {
    let lines = format!("QUERY_ALLOW=127.0.0.1\n{extra}");
    let servers = servers
        .iter()
        .map(|&(addr, weight)| format!("{} {weight}", server_value(addr)));
    Ini::new()
        .general(general)
        .balancer("BALANCE_HTTP", "@PORT@", &lines, servers)
        .text()
}

/// The `SESSION_SECRET` tests give their HTTP balancers (`[General]`), so that they can make
/// valid session cookies themselves ([`signed_cookie`]).
pub const SESSION_SECRET: &str = "the tests' session secret, 32+ characters";

/// `SESSION_SECRET=...` as an ini line.
pub fn session_secret_line() -> String {
    format!("SESSION_SECRET={SESSION_SECRET}\n")
}

/// A valid `TOTVS_BROKER_SH_001` value for server `id` of `[BALANCE_HTTP]` (the section
/// [`weighted_http_ini`] writes) under [`SESSION_SECRET`], one per `n`: what the broker would
/// have issued.
pub fn signed_cookie(id: &str, n: u64) -> String {
    signed_cookie_with(SESSION_SECRET, id, n)
}

/// A valid `TOTVS_BROKER_SH_001` value for server `id` of `[BALANCE_HTTP]` under `secret`,
/// one per `n`.
pub fn signed_cookie_with(secret: &str, id: &str, n: u64) -> String {
    signed_cookie_for(secret, "BALANCE_HTTP", id, n)
}

/// A valid `TOTVS_BROKER_SH_001` value for server `id` of the balancer `[section]` under
/// `secret`, one per `n`: a cookie is bound to the balancer that issued it.
pub fn signed_cookie_for(secret: &str, section: &str, id: &str, n: u64) -> String {
    let keys = appbroker::http_balancer::sessions::CookieKeys::new(secret.as_bytes(), None, None);
    let id = appbroker::config::ServerId::parse(id).expect("a server id");
    keys.sign(section, id, n.to_be_bytes()).to_string()
}

/// A `TOTVS_BROKER_SH_001` value of the earlier form (bound to no balancer) for server `id`
/// under `secret`, one per `n`: what a broker of an earlier build issued.
pub fn unbound_cookie_with(secret: &str, id: &str, n: u64) -> String {
    let keys = appbroker::http_balancer::sessions::CookieKeys::new(secret.as_bytes(), None, None);
    let id = appbroker::config::ServerId::parse(id).expect("a server id");
    keys.sign_unbound(id, n.to_be_bytes()).to_string()
}
