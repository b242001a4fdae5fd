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

/// An ini with one `[BALANCE_SMART_CLIENT_DESKTOP]` on `@PORT@` over `servers`, plus `extra`
/// lines in the section. Monitoring is disabled unless `extra` sets it, so tests decide when
/// checks happen.
pub fn ini_for(servers: &[&TestServer], extra: &str) -> String {
    let mut text = String::from(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n",
    );
    if !extra.to_ascii_uppercase().contains("MONITORING_TYPE") {
        text.push_str("MONITORING_TYPE=DISABLED\n");
    }
    text.push_str(extra);
    if !extra.is_empty() && !extra.ends_with('\n') {
        text.push('\n');
    }
    for (i, s) in servers.iter().enumerate() {
        text.push_str(&format!("REMOTE_SERVER_{:02}={}\n", i + 1, s.ini()));
    }
    text
}

/// An ini with one `[BALANCE_HTTP]` on `@PORT@` over `servers`, plus `extra` lines in the
/// section. Monitoring is disabled unless `extra` sets it, so tests decide when checks run.
pub fn http_ini(servers: &[SocketAddr], extra: &str) -> String {
    let mut text = String::from(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nQUERY_ALLOW=127.0.0.1\n",
    );
    if !extra.to_ascii_uppercase().contains("MONITORING_TYPE") {
        text.push_str("MONITORING_TYPE=DISABLED\n");
    }
    for line in extra.lines() {
        text.push_str(line);
        text.push('\n');
    }
    for (i, server) in servers.iter().enumerate() {
        text.push_str(&format!(
            "REMOTE_SERVER_{:02}={} {}\n",
            i + 1,
            server.ip(),
            server.port()
        ));
    }
    text
}

/// An ini with one `[BALANCE_HTTP]` on `@PORT@` (monitoring off, queries from loopback),
/// `general` lines in `[General]`, `extra` lines in the section, and `servers` as
/// `(address, weight)` under ids 01, 02...
pub fn weighted_http_ini(general: &str, servers: &[(SocketAddr, u32)], extra: &str) -> String {
    let mut text = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n{general}\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nQUERY_ALLOW=127.0.0.1\nMONITORING_TYPE=DISABLED\n{extra}\n"
    );
    for (i, (addr, weight)) in servers.iter().enumerate() {
        text.push_str(&format!(
            "REMOTE_SERVER_{:02}={} {} {weight}\n",
            i + 1,
            addr.ip(),
            addr.port()
        ));
    }
    text
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
