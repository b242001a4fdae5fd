//! The HTML pages: STATUS (the server table, a chart of the last hour, the facts), CFG and the
//! detail of one server. Plain HTML and CSS with inline SVG charts: no external assets, no
//! JavaScript, so the page works on an operator's locked-down machine, and on a phone: the
//! table comes first and fits a 390-pixel screen.
//!
//! The pages keep the contracts of the TOTVS page that public monitors parse
//! (tests/monitors.rs runs their parsers on them): the heading carries `TOTVS Broker para
//! SmartClient` (`TOTVS Broker para HTTP` on an HTTP balancer) whatever the language
//! (peder1981/monitor recognises the page by it, and reads each layout by it); the
//! version text is followed by `<br>`; the server table follows a `Servers (N)` heading, every
//! row opens with a plain `<tr>`, every data cell is a `<td>`, and the first three are plain
//! `<td>`s: a link to `/TOTVS_BROKER_QUERY/ServerStatus/host:port`, the connections, and the
//! quarantine cell (`-` or the local time the quarantine ends). On an HTTP balancer the
//! TOTVS HTTP broker's layout: server, sessions, connections, the quarantine's start (`-`
//! when none), its reasons. Columns of our own, and the state classes (`inQuarantine`,
//! `isDisabled`), come after those. Each layout is a list of columns ([`Layout`]) from which
//! the header, the cells and the stylesheet's rules for them (under a class on `<table>`, as
//! the cells carry no attributes) are all made.

use std::fmt::Write;
use std::time::Duration;

use super::labels::{Labels, of};
use super::snapshot::{ServerSessions, ServerState, Snapshot, Standing};
use crate::balancer::health::Reason;
use crate::balancer::overrides::Mode;
use crate::config::{BalancerKind, Config, Monitoring, Origin, show_duration};
use crate::process::clock::{local_date as date, time_of_day as clock};

/// Escapes text for HTML.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `12.3 MiB`, for people; the exact count goes in a tooltip.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `3m 20s`, `2h 05m`, `450ms`, `0.3ms`.
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 if d.as_millis() < 10 => format!("{:.1}ms", d.as_secs_f64() * 1000.0),
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{}s", s),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The text public monitors recognise a TOTVS broker's page by; never translated.
fn marker(kind: BalancerKind) -> &'static str {
    match kind {
        // Both are TCP balancers, which the TOTVS SmartClient broker is.
        BalancerKind::SmartClientDesktop | BalancerKind::WebServices => {
            "TOTVS Broker para SmartClient"
        }
        BalancerKind::Http(_) => "TOTVS Broker para HTTP",
    }
}

/// The stylesheet but the server table's columns ([`stylesheet`] adds them). At 700 px wide
/// and below (a phone; a tablet in portrait keeps the desktop layout) the table shows the
/// server, its figures that matter and its state, and the narrow chart takes the wide one's
/// place.
const STYLE: &str = "
:root { --ink:#1d2733; --muted:#5f6b78; --line:#dde3ea; --bg:#f5f7fa; --card:#fff; --accent:#1f6feb;
        --bad:#b42318; --badbg:#fdecec; --warn:#7a5600; --warnbg:#fff6d6; --good:#1a7f37; --goodbg:#e8f5ec; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif; color:var(--ink); background:var(--bg); }
header { background:#16202b; color:#fff; padding:12px 24px; display:flex; flex-wrap:wrap; align-items:center; justify-content:space-between; gap:6px 24px; }
header h1 { margin:0; font-size:20px; font-weight:600; }
header .meta { color:#b8c4d0; font-size:13px; }
header nav { display:flex; flex-wrap:wrap; gap:4px 14px; }
header nav a { color:#cfe0ff; text-decoration:none; }
header nav a:hover { text-decoration:underline; }
main { padding:16px 24px 28px; max-width:1400px; }
.banner { background:var(--warnbg); color:var(--warn); border:1px solid #f0d68a; padding:8px 12px; border-radius:6px; margin-bottom:14px; font-weight:600; }
.summary { margin:0 0 14px; font-size:16px; }
.summary b { font-size:22px; }
.summary .bad { color:var(--bad); font-weight:600; }
.summary .held { color:var(--warn); font-weight:600; }
.facts { display:grid; grid-template-columns:repeat(auto-fill,minmax(220px,1fr)); gap:10px; margin-bottom:18px; }
.fact { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:8px 12px; min-width:0; }
.fact .label { display:block; color:var(--muted); font-size:12px; }
.fact .value { font-size:15px; font-weight:600; overflow-wrap:anywhere; }
.fact.big .value { font-size:24px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; margin-bottom:18px; min-width:0; }
h2 { font-size:16px; margin:0 0 10px; }
h2 small { font-weight:400; }
table { border-collapse:collapse; width:100%; background:var(--card); }
th, td { border:1px solid var(--line); padding:5px 8px; text-align:left; vertical-align:top; }
th { background:#eef2f6; font-weight:600; font-size:13px; }
td { overflow-wrap:break-word; }
.scroll { overflow-x:auto; }
td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr:nth-child(even) > td { background:#fafbfc; }
tr:has(> td.inQuarantine) > td { background:var(--badbg); }
tr:has(> td.inQuarantine) > td:first-child { box-shadow: inset 4px 0 0 var(--bad); }
tr:has(> td.isDisabled) > td { background:var(--warnbg); }
table.servers.http .why { display:none; }
.badge { display:inline-block; padding:0 7px; border-radius:6px; font-weight:600; font-size:13px; white-space:nowrap; }
.badge.ok { color:var(--good); background:var(--goodbg); }
.badge.bad { color:#fff; background:var(--bad); }
.badge.warn { color:var(--warn); background:var(--warnbg); border:1px solid #f0d68a; }
.failed { color:var(--bad); font-weight:600; }
.line { white-space:nowrap; }
small, .muted { color:var(--muted); }
a { color:var(--accent); }
.chart > svg { width:100%; height:auto; display:block; }
.chart > svg.narrow { display:none; }
.legend { display:flex; flex-wrap:wrap; gap:4px 16px; margin-top:6px; font-size:12px; }
.legend span { white-space:nowrap; }
.legend svg { vertical-align:middle; margin-right:5px; }
footer { color:var(--muted); font-size:12px; margin-top:14px; }
@media (max-width: 700px) {
  header { padding:10px 12px; }
  header h1 { font-size:18px; }
  main { padding:10px 8px 20px; }
  .card { padding:10px 8px; }
  .facts { grid-template-columns:repeat(2,minmax(0,1fr)); gap:6px; }
  .fact.big .value { font-size:20px; }
  th, td { padding:4px 5px; }
  .badge { white-space:normal; }
  table.servers .why { display:none; }
  .chart > svg.wide { display:none; }
  .chart > svg.narrow { display:block; }
}
";

fn head(out: &mut String, l: &Labels, title: &str, refresh: Option<u32>) {
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang='{}'><head><meta charset='utf-8'>\
         <meta name='viewport' content='width=device-width, initial-scale=1'>\
         <meta http-equiv='cache-control' content='no-cache'>",
        l.lang
    );
    if let Some(seconds) = refresh {
        let _ = write!(out, "<meta http-equiv='refresh' content='{seconds}'>");
    }
    let _ = write!(
        out,
        "<title>{}</title><style>{}</style></head><body>",
        esc(title),
        stylesheet()
    );
}

/// [`STYLE`] and the server table's column rules of both layouts, made once.
fn stylesheet() -> &'static str {
    static SHEET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHEET.get_or_init(|| {
        let mut sheet = STYLE.to_string();
        for layout in [&TCP_LAYOUT, &HTTP_LAYOUT] {
            sheet.push_str(&layout.rules());
        }
        sheet
    })
}

/// The header every page shares: the TOTVS marker, the balancer and the version, the links.
fn banner(out: &mut String, l: &Labels, snap: &Snapshot, host: &str) {
    // `Versão: ...<br>`: peder1981/monitor reads the version from `Vers` to the next `<br>`.
    let _ = write!(
        out,
        "<header><div><h1 lang='pt-BR'>{}</h1><div class='meta'>[{}] {} {} · {}: appbroker {}<br></div></div>\
         <nav><a href='/TOTVS_BROKER_QUERY/STATUS'>STATUS</a><a href='/TOTVS_BROKER_QUERY/CFG'>CFG</a>\
         <a href='/TOTVS_BROKER_QUERY/JSON'>JSON</a><a href='/TOTVS_BROKER_QUERY/METRICS'>METRICS</a>\
         <a href='/TOTVS_BROKER_QUERY/PING'>PING</a>",
        marker(snap.state.kind),
        snap.state.kind.section(),
        l.on,
        snap.state.listen,
        l.version,
        env!("CARGO_PKG_VERSION"),
    );
    for (kind, listen) in &snap.others {
        let target = if listen.ip().is_unspecified() {
            host.to_string()
        } else {
            listen.ip().to_string()
        };
        let target = if target.contains(':') && !target.starts_with('[') {
            format!("[{target}]")
        } else {
            target
        };
        let _ = write!(
            out,
            "<a href='http://{}:{}/TOTVS_BROKER_QUERY/STATUS' title='{}'>[{}]</a>",
            esc(&target),
            listen.port(),
            l.other_balancers,
            kind.section()
        );
    }
    out.push_str("</nav></header><main>");
    if snap.draining {
        let _ = write!(out, "<div class='banner'>{}</div>", l.draining);
    }
    if snap.state.upstream_warning.is_some() {
        let _ = write!(
            out,
            "<div class='banner'>{}</div>",
            esc(l.upstream_unverified)
        );
    }
}

fn fact(out: &mut String, label: &str, value: &str, class: &str) {
    let _ = write!(
        out,
        "<div class='fact {class}'><span class='label'>{}</span><span class='value'>{value}</span></div>",
        esc(label)
    );
}

/// The STATUS page. `host` is the host name the browser used (for links to the other
/// balancers); `refresh` adds an automatic reload every so many seconds.
pub fn status(snap: &Snapshot, host: &str, refresh: Option<u32>) -> String {
    let l = of(snap.language);
    let mut out = String::with_capacity(24 * 1024 + snap.state.servers.len() * 1200);
    let title = format!(
        "appbroker [{}] {}",
        snap.state.kind.section(),
        snap.state.listen
    );
    head(&mut out, l, &title, refresh);
    banner(&mut out, l, snap, host);
    summary(&mut out, l, snap);
    server_table(&mut out, l, snap);
    chart(&mut out, l, snap);
    facts(&mut out, l, snap);
    let _ = write!(out, "<footer>{}: STATUS · {}: ", l.option, l.refresh);
    for seconds in [5, 30] {
        let _ = write!(
            out,
            "<a href='/TOTVS_BROKER_QUERY/STATUS?refresh={seconds}'>{seconds}s</a> "
        );
    }
    let _ = write!(
        out,
        "<a href='/TOTVS_BROKER_QUERY/STATUS'>{}</a></footer></main></body></html>",
        l.off
    );
    out
}

/// One line of what matters most: active connections, servers available, and every server
/// that is not: in quarantine, disabled or draining (an operator's changes included, so the
/// counts add up to the servers). `<b>7 conexões ativas</b>` is one text run: peder1981/monitor
/// takes the number from the text before ` ativas` when it mentions `conex`.
fn summary(out: &mut String, l: &Labels, snap: &Snapshot) {
    let servers = &snap.state.servers;
    let count = |standing: Standing, mode: Option<Mode>| {
        servers
            .iter()
            .filter(|s| s.state == standing)
            .filter(|s| mode.is_none() || s.overrides.hold.as_ref().map(|h| h.mode) == mode)
            .count()
    };
    let available = count(Standing::Available, None);
    let quarantined = count(Standing::Quarantined, None);
    let drained = count(Standing::Disabled, Some(Mode::Drain));
    let disabled = count(Standing::Disabled, None) - drained;
    let draining = count(Standing::Draining, None) + drained;
    let connections = if snap.state.active == 1 {
        l.active_connection
    } else {
        l.active_connections
    };
    out.push_str("<p class='summary'>");
    if snap.state.kind.is_http() {
        // `N sessões ativas`: peder1981/monitor reads the sessions from the text before
        // ` ativas` when it mentions `sess`.
        let (live, moved) = snap
            .http
            .as_ref()
            .map_or((0, 0), |h| (h.sessions.live, h.sessions.moved));
        let _ = write!(out, "<b>{live} {}</b> · ", l.active_sessions);
        if moved > 0 {
            let words = if moved == 1 {
                l.session_moved
            } else {
                l.sessions_moved
            };
            let _ = write!(out, "{moved} {words} · ");
        }
    }
    let _ = write!(
        out,
        "<b>{} {connections}</b> · {available} {} {} {}",
        snap.state.active,
        l.of,
        servers.len(),
        plural(servers.len(), l.servers_available)
    );
    if quarantined > 0 {
        let _ = write!(
            out,
            " · <span class='bad'>{quarantined} {}</span>",
            l.in_quarantine
        );
    }
    for (n, words) in [(disabled, l.disabled_count), (draining, l.draining_count)] {
        if n > 0 {
            let _ = write!(out, " · <span class='held'>{n} {}</span>", plural(n, words));
        }
    }
    out.push_str("</p>");
}

/// The singular of `words` for one, else the plural.
fn plural(n: usize, (one, many): (&'static str, &'static str)) -> &'static str {
    if n == 1 { one } else { many }
}

fn facts(out: &mut String, l: &Labels, snap: &Snapshot) {
    out.push_str("<section class='facts'>");
    fact(out, l.total, &snap.state.accepted.to_string(), "big");
    let last = if snap.state.last_connection_wall_ms == 0 {
        l.never.to_string()
    } else {
        format!(
            "{} {}",
            clock(snap.state.last_connection_wall_ms),
            date(snap.state.last_connection_wall_ms)
        )
    };
    fact(out, l.last_connection, &last, "");
    fact(
        out,
        l.max_simultaneous,
        &format!(
            "{} <small>({} {})</small>",
            snap.state.max_connections, l.peak, snap.state.peak
        ),
        "",
    );
    fact(
        out,
        l.started,
        &format!(
            "{} {}",
            clock(snap.started_wall_ms),
            date(snap.started_wall_ms)
        ),
        "",
    );
    fact(
        out,
        l.now,
        &format!("{} {}", clock(snap.now_wall_ms), date(snap.now_wall_ms)),
        "",
    );
    fact(out, l.policy, snap.state.sort_method.as_str(), "");
    let monitor = match snap.state.monitoring {
        Monitoring::Disabled => snap.state.monitoring.as_str().to_string(),
        _ => format!(
            "{} {} {}",
            snap.state.monitoring.as_str(),
            l.every,
            show_duration(snap.state.monitor_interval)
        ),
    };
    fact(out, l.monitor, &monitor, "");
    fact(
        out,
        l.quarantine_time,
        &show_duration(snap.state.quarantine_time),
        "",
    );
    if let Some(http) = &snap.http {
        let r = &http.requests;
        fact(out, l.requests, &r.requests.to_string(), "");
        fact(out, l.answers_5xx, &r.classes[4].to_string(), "");
        fact(out, l.upgrades, &r.upgrades.to_string(), "");
    }
    fact(out, l.refused, &snap.state.rejected.to_string(), "");
    fact(out, l.unserved, &snap.state.unserved.to_string(), "");
    fact(
        out,
        l.instance,
        &format!("{} <small>pid {}</small>", snap.instance, snap.pid),
        "",
    );
    fact(out, l.queried_by, &esc(&snap.peer.to_string()), "");
    if let Some(certificate) = &snap.state.certificate {
        fact(out, l.certificate, &esc(&certificate.subject), "");
        fact(out, l.certificate_issuer, &esc(&certificate.issuer), "");
        let until = certificate
            .not_after
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let class = if until <= snap.now_wall_ms { "bad" } else { "" };
        fact(
            out,
            l.certificate_expires,
            &format!("{} {}", clock(until), date(until)),
            class,
        );
    }
    out.push_str("</section>");
}

/// What a column of the server table holds, which is how the stylesheet draws it, wherever
/// the layout puts it: figures right-aligned on one line, words left-aligned and wrapping.
/// The cells stay plain `<td>`s (monitors split rows on the literal `<td>`): the rules name
/// the columns by position within the table's layout class ([`Layout::rules`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// The server's link, or a short name (its id): one line.
    Name,
    /// A count or an amount of bytes: right-aligned, one line, digits of one width.
    Figure,
    /// A time of day, or `-`: one line.
    Time,
    /// A word or two (who found a failure): they wrap.
    Cause,
    /// A state and its cause: they wrap, in room for a badge.
    Words,
    /// A check's result, duration and time: in room for a passing one on one line.
    Check,
}

impl Holds {
    /// Where its header and cells align.
    fn align(self) -> &'static str {
        match self {
            Holds::Figure => "right",
            _ => "left",
        }
    }

    /// The rest of its cells' rule (not its header's: `Bytes from clients` may wrap over
    /// `0 B`).
    fn cells(self) -> &'static str {
        match self {
            Holds::Name => "white-space:nowrap;",
            Holds::Figure | Holds::Time => "font-variant-numeric:tabular-nums; white-space:nowrap;",
            Holds::Cause | Holds::Words | Holds::Check => "",
        }
    }

    /// The width it is given before the table shares out the rest, on a desktop (a phone
    /// shows few columns, and has no room to give).
    fn room(self) -> Option<&'static str> {
        match self {
            Holds::Words => Some("9em"),
            Holds::Check => Some("12em"),
            _ => None,
        }
    }
}

/// What a row's cells are made from.
struct Row<'a> {
    l: &'a Labels,
    snap: &'a Snapshot,
    s: &'a ServerState,
}

/// One column of the server table: its header, what it holds, whether a phone shows it, and
/// its cell's content (what goes between `<td>` and `</td>`).
struct Column {
    header: fn(&Labels) -> &'static str,
    holds: Holds,
    on_phone: bool,
    /// Its cell carries the TOTVS page's state class (`inQuarantine`, `isDisabled`): the
    /// state column only.
    state_class: bool,
    cell: fn(&Row<'_>) -> String,
}

/// A layout of the server table: its class on `<table>`, and the TOTVS page's columns that
/// monitors read by position, which [`OWN_COLUMNS`] follow.
struct Layout {
    class: &'static str,
    totvs: &'static [Column],
}

impl Layout {
    /// Every column, in order.
    fn columns(&self) -> impl Iterator<Item = &'static Column> {
        self.totvs.iter().chain(OWN_COLUMNS)
    }

    /// The stylesheet's rules for this layout's columns: each drawn by what it holds, and on
    /// a phone only those it shows.
    fn rules(&self) -> String {
        let mut rules = String::new();
        let (mut room, mut hidden) = (Vec::new(), Vec::new());
        for (i, column) in self.columns().enumerate() {
            let (class, n, holds) = (self.class, i + 1, column.holds);
            let nth = format!("table.servers.{class} :is(th, td):nth-child({n})");
            let _ = writeln!(rules, "{nth} {{ text-align:{}; }}", holds.align());
            if !holds.cells().is_empty() {
                let _ = writeln!(
                    rules,
                    "table.servers.{class} td:nth-child({n}) {{ {} }}",
                    holds.cells()
                );
            }
            if let Some(width) = holds.room() {
                room.push(format!("{nth} {{ min-width:{width}; }}"));
            }
            if !column.on_phone {
                hidden.push(nth);
            }
        }
        let _ = writeln!(rules, "@media (min-width: 701px) {{ {} }}", room.join(" "));
        let _ = writeln!(
            rules,
            "@media (max-width: 700px) {{ {} {{ display:none; }} }}",
            hidden.join(", ")
        );
        rules
    }
}

/// A column a phone leaves out, its cell without a class: most of them.
const fn column(
    header: fn(&Labels) -> &'static str,
    holds: Holds,
    cell: fn(&Row<'_>) -> String,
) -> Column {
    Column {
        header,
        holds,
        on_phone: false,
        state_class: false,
        cell,
    }
}

const SERVER: Column = Column {
    on_phone: true,
    ..column(
        |l| l.server,
        Holds::Name,
        |r| {
            let address = esc(&r.s.address);
            format!("<a href=\"/TOTVS_BROKER_QUERY/ServerStatus/{address}\">{address}</a>")
        },
    )
};
const CONNECTIONS: Column = Column {
    on_phone: true,
    ..HTTP_CONNECTIONS
};
/// An HTTP balancer's connections: left out on a phone, where its sessions (the TOTVS HTTP
/// broker's figure) and the state take the room.
const HTTP_CONNECTIONS: Column =
    column(|l| l.connections, Holds::Figure, |r| r.s.active.to_string());
/// The TOTVS SmartClient broker's third cell: `-`, or when the quarantine ends.
const QUARANTINE_END: Column = column(
    |l| l.quarantine,
    Holds::Time,
    |r| {
        r.s.quarantine
            .map_or_else(|| "-".into(), |(_, until)| clock(until))
    },
);
const SESSIONS: Column = Column {
    on_phone: true,
    ..column(
        |l| l.sessions,
        Holds::Figure,
        |r| {
            let sessions = r.snap.http.as_ref().map(|h| h.sessions_of(&r.s.address));
            sessions.map_or(0, |s| s.live).to_string()
        },
    )
};
/// The TOTVS HTTP broker's fourth cell: `-`, or when the quarantine started.
const QUARANTINE_START: Column = column(
    |l| l.quarantine_since,
    Holds::Time,
    |r| {
        r.s.quarantine
            .map_or_else(|| "-".into(), |(since, _)| clock(since))
    },
);
const REASONS: Column = column(
    |l| l.reasons,
    Holds::Cause,
    |r| match (r.s.quarantine, r.s.reason) {
        (Some(_), Some(why)) => reason(r.l, why).to_string(),
        _ => "-".into(),
    },
);
const STATE: Column = Column {
    on_phone: true,
    state_class: true,
    ..column(|l| l.state, Holds::Words, |r| state_cell(r.l, r.s))
};
const ID: Column = column(|l| l.id, Holds::Name, |r| esc(&r.s.id));
const WEIGHT: Column = column(|l| l.weight, Holds::Figure, |r| weight_cell(r.l, r.s));
const TOTAL: Column = column(|l| l.total_short, Holds::Figure, |r| r.s.total.to_string());
const FAILED_CONNECTS: Column = column(
    |l| l.failed_connects,
    Holds::Figure,
    |r| r.s.failed_connects.to_string(),
);
const BYTES_IN: Column = column(
    |l| l.bytes_in,
    Holds::Figure,
    |r| exact_bytes(r.s.bytes_to_server),
);
const BYTES_OUT: Column = column(
    |l| l.bytes_out,
    Holds::Figure,
    |r| exact_bytes(r.s.bytes_to_client),
);
const LAST_CHECK: Column = column(
    |l| l.last_check,
    Holds::Check,
    |r| check_cell(r.l, r.s, &r.snap.state.monitoring),
);

/// A TCP balancer's table: the TOTVS SmartClient broker's first three columns (server,
/// connections, the quarantine's end), then appbroker's own.
const TCP_LAYOUT: Layout = Layout {
    class: "tcp",
    totvs: &[SERVER, CONNECTIONS, QUARANTINE_END],
};

/// An HTTP balancer's table: the TOTVS HTTP broker's first five columns (server, sessions,
/// connections, the quarantine's start, its reasons), then appbroker's own.
const HTTP_LAYOUT: Layout = Layout {
    class: "http",
    totvs: &[
        SERVER,
        SESSIONS,
        HTTP_CONNECTIONS,
        QUARANTINE_START,
        REASONS,
    ],
};

/// The columns of appbroker's own, after the TOTVS page's in either layout.
const OWN_COLUMNS: &[Column] = &[
    STATE,
    ID,
    WEIGHT,
    TOTAL,
    FAILED_CONNECTS,
    BYTES_IN,
    BYTES_OUT,
    LAST_CHECK,
];

/// `12.3 MiB`, the exact count in its tooltip.
fn exact_bytes(n: u64) -> String {
    format!("<span title='{n} bytes'>{}</span>", bytes(n))
}

/// The weight in use, and when an operator set it, the file's below it (`ctl show`'s
/// `weight set (file: 2)`), short enough to keep the column narrow.
fn weight_cell(l: &Labels, s: &ServerState) -> String {
    match s.overrides.weight {
        Some(_) => format!(
            "{}<br><small class='override' title='{}'>{}: {}</small>",
            s.weight, l.weight_set, l.weight_file, s.file_weight
        ),
        None => s.weight.to_string(),
    }
}

fn server_table(out: &mut String, l: &Labels, snap: &Snapshot) {
    let layout = if snap.state.kind.is_http() {
        &HTTP_LAYOUT
    } else {
        &TCP_LAYOUT
    };
    let _ = write!(
        out,
        "<div class='card'><h2>Servers ({})</h2><div class='scroll'><table class='servers {}'><tr>",
        snap.state.servers.len(),
        layout.class
    );
    for column in layout.columns() {
        let _ = write!(out, "<th>{}</th>", (column.header)(l));
    }
    out.push_str("</tr>");
    for s in &snap.state.servers {
        // Plain `<td>`s but the state's: peder1981's monitor before its 35a8f98 splits the
        // row on the literal `<td>` (alignment: the stylesheet, by the table's class).
        let class = match s.state {
            Standing::Quarantined => " class='inQuarantine'",
            Standing::Draining | Standing::Disabled => " class='isDisabled'",
            Standing::Available => "",
        };
        let row = Row { l, snap, s };
        out.push_str("<tr>");
        for column in layout.columns() {
            let class = if column.state_class { class } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", (column.cell)(&row));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table></div></div>");
}

fn reason(l: &Labels, reason: Reason) -> &'static str {
    match reason {
        Reason::Monitor => l.by_monitor,
        Reason::Connect => l.by_connect,
        Reason::Timeout => l.by_timeout,
        Reason::Operator => l.by_operator,
    }
}

fn state_cell(l: &Labels, s: &ServerState) -> String {
    match s.state {
        Standing::Available => {
            let mut cell = format!("<span class='badge ok'>{}</span>", l.available);
            // Only an error that still stands: one the server has proved itself past is
            // history (its ServerStatus page keeps it), not what a reader should act on.
            if let Some((at, words)) = current_error(l, s) {
                let _ = write!(
                    cell,
                    "<br><small>{} {} {at}: {words}</small>",
                    l.error, l.at
                );
            }
            cell
        }
        Standing::Draining => format!("<span class='badge warn'>{}</span>", l.draining_server),
        Standing::Disabled => {
            // An operator's hold: disabled or draining, by whom and why.
            let Some(hold) = &s.overrides.hold else {
                return format!("<span class='badge warn'>{}</span>", l.disabled_count.0);
            };
            let badge = match hold.mode {
                Mode::Drain => l.draining_count.0,
                Mode::Disabled => l.disabled_count.0,
            };
            let reason = match hold.reason.as_str() {
                "" => String::new(),
                reason => format!(": {}", esc(reason)),
            };
            format!(
                "<span class='badge warn'>{badge}</span><br><small>{} {}{reason}</small>",
                l.by,
                esc(&hold.by)
            )
        }
        Standing::Quarantined => {
            // The end time again: on a phone the quarantine column is hidden.
            let until = s
                .quarantine
                .map(|(_, until)| format!("{} {}", l.until, clock(until)))
                .unwrap_or_default();
            format!(
                "<span class='badge bad'>{}</span><br><small>{until} · {}</small>",
                l.quarantined,
                quarantine_cause(l, s)
            )
        }
    }
}

/// Why a server is in quarantine, for its state cell: an operator's who and why (never an
/// old error: the server may be healthy), or who found the failure, when, and the error.
fn quarantine_cause(l: &Labels, s: &ServerState) -> String {
    if let Some(asked) = &s.asked {
        return esc(&l.words(&asked.words()));
    }
    if s.forced || s.reason == Some(Reason::Operator) {
        return l.by_operator.to_string();
    }
    // Who found it is left out on a phone, to keep the row low, and on an HTTP balancer's
    // page, whose Reasons column says it. When is the quarantine's: its end here, its start
    // in the HTTP layout's column.
    let who = s.reason.map_or("", |r| reason(l, r));
    match current_error(l, s) {
        Some((_, words)) => format!("<span class='why'>{who}: </span>{words}"),
        None => who.to_string(),
    }
}

/// The server's last error while it stands: when it came and its words, for a page.
fn current_error(l: &Labels, s: &ServerState) -> Option<(String, String)> {
    let words = s.last_error.as_deref().filter(|_| s.error_current)?;
    Some((clock(s.last_error_wall_ms), esc(&l.words(words))))
}

fn check_cell(l: &Labels, s: &ServerState, monitoring: &Monitoring) -> String {
    match (&s.last_check, monitoring) {
        (_, Monitoring::Disabled) => format!("<span class='muted'>{}</span>", monitoring.as_str()),
        (None, _) => format!("<span class='muted'>{}</span>", l.never),
        (Some(check), _) => match &check.error {
            None => format!(
                "<span class='line'>OK <small>{} · {}</small></span>",
                span(check.duration),
                clock(check.at_wall_ms)
            ),
            // Its result and when on one line, as a passing one's; why below.
            Some(error) => format!(
                "<span class='line'><span class='failed'>{}</span> <small>{} · {}</small></span>\
                 <br><small>{}</small>",
                l.failed,
                span(check.duration),
                clock(check.at_wall_ms),
                esc(&l.words(error))
            ),
        },
    }
}

/// The geometry of one rendering of the chart, in SVG units.
struct Frame {
    /// The SVG's class, which the stylesheet shows on wide or narrow screens.
    class: &'static str,
    width: f64,
    height: f64,
    /// Room for the y labels.
    left: f64,
    right: f64,
    top: f64,
    /// Room for the x labels.
    bottom: f64,
    font: f64,
    /// At most this many labels on the time axis, `now` included.
    x_labels: u64,
}

/// A desktop's chart: wide and low.
const WIDE: Frame = Frame {
    class: "wide",
    width: 1200.0,
    height: 200.0,
    left: 40.0,
    right: 24.0,
    top: 10.0,
    bottom: 22.0,
    font: 12.0,
    x_labels: 7,
};

/// A phone's chart: its units shrink less on a narrow screen, so its text stays readable.
const NARROW: Frame = Frame {
    class: "narrow",
    width: 400.0,
    height: 220.0,
    left: 30.0,
    right: 16.0,
    top: 10.0,
    bottom: 22.0,
    font: 13.0,
    x_labels: 4,
};

/// Colours of the chart's lines, distinct on white.
const PALETTE: [&str; 10] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#0f7b8a", "#bf3989", "#57606a",
    "#fb8500", "#2da44e",
];

/// How series `i` is drawn: colour, width, dashes. Lines of the same values lie on each
/// other; drawn widest first, each narrower one leaves the wider ones' edges showing, and
/// series of the same width differ in their dashes.
fn line_style(i: usize) -> (&'static str, f64, &'static str) {
    const WIDTHS: [f64; 3] = [7.0, 4.0, 1.5];
    const DASHES: [&str; 4] = ["none", "10 5", "2 4", "12 4 3 4"];
    (
        PALETTE[i % PALETTE.len()],
        WIDTHS[i % WIDTHS.len()],
        DASHES[(i / WIDTHS.len()) % DASHES.len()],
    )
}

/// The y axis: a round step (1, 2 or 5 times a power of ten) that divides the scale into at
/// most five parts, and the top of the scale, a multiple of it at or above `max`.
fn y_scale(max: u64) -> (u64, u64) {
    let max = max.max(1);
    let mut magnitude = 1u64;
    loop {
        for step in [
            magnitude,
            magnitude.saturating_mul(2),
            magnitude.saturating_mul(5),
        ] {
            if max.div_ceil(step) <= 5 {
                return (step, step.saturating_mul(max.div_ceil(step)));
            }
        }
        magnitude = magnitude.saturating_mul(10);
    }
}

/// Minutes between the time axis's labels: the first of these that keeps to `labels`.
fn x_step(window_minutes: u64, labels: u64) -> u64 {
    [1, 2, 5, 10, 15, 20, 30, 60]
        .into_iter()
        .find(|step| window_minutes / step < labels)
        .unwrap_or(60)
}

/// The chart: each server's active connections at each minute's sample over the last hour
/// (or since the first sample, when younger), ending with the count now. Between samples
/// nothing is known; the line holds each sample's value until the next, and a dot marks every
/// sample, so a connection opened a second ago shows as a step at the right edge, not a
/// slope over the minute before.
fn chart(out: &mut String, l: &Labels, snap: &Snapshot) {
    let _ = write!(
        out,
        "<div class='card chart'><h2>{} <small>· {}</small></h2>",
        l.chart, l.chart_note
    );
    for frame in [&WIDE, &NARROW] {
        chart_svg(out, l, snap, frame);
    }
    out.push_str("<div class='legend'>");
    for (i, s) in snap.state.servers.iter().enumerate() {
        let (colour, width, dash) = line_style(i);
        let _ = write!(
            out,
            "<span><svg width='30' height='12' aria-hidden='true'><line x1='1' y1='6' x2='29' y2='6' \
             stroke='{colour}' stroke-width='{}' stroke-dasharray='{dash}'/></svg>{} {}</span>",
            width.min(5.0),
            esc(&s.id),
            esc(&s.address)
        );
    }
    out.push_str("</div></div>");
}

/// A point of a series: (time, value, whether it is a sample or the count now; false for the
/// value held at the left edge).
type Point = (u64, u64, bool);

/// Where a chart's values go in its frame.
struct Plot<'a> {
    f: &'a Frame,
    now: u64,
    /// The left edge (wall ms) and the window's width (ms).
    start: u64,
    window: u64,
    /// The window in minutes, and the minutes between the time axis's labels.
    minutes: u64,
    every: u64,
    /// The value axis's step and top.
    step: u64,
    top: u64,
}

impl Plot<'_> {
    fn width(&self) -> f64 {
        self.f.width - self.f.left - self.f.right
    }

    fn x(&self, t: u64) -> f64 {
        self.f.left + self.width() * (t.saturating_sub(self.start) as f64 / self.window as f64)
    }

    fn y(&self, v: u64) -> f64 {
        let height = self.f.height - self.f.top - self.f.bottom;
        self.f.top + height * (1.0 - v as f64 / self.top as f64)
    }

    /// The value axis's lines and labels, then the time axis's.
    fn grid(&self, out: &mut String, l: &Labels) {
        let f = self.f;
        for value in (0..=self.top).step_by(self.step as usize) {
            let yy = self.y(value);
            let _ = write!(
                out,
                "<line x1='{}' x2='{}' y1='{yy:.1}' y2='{yy:.1}' stroke='#e3e8ee'/>\
                 <text class='y' x='{}' y='{:.1}' text-anchor='end'>{value}</text>",
                f.left,
                f.width - f.right,
                f.left - 6.0,
                yy + f.font / 3.0
            );
        }
        let ticks: Vec<u64> = (0..=self.minutes).step_by(self.every as usize).collect();
        for ago in ticks.into_iter().rev() {
            let xx = self.x(self.now - ago * 60_000);
            let (label, anchor) = match ago {
                0 => (l.chart_now.to_string(), "end"),
                _ if ago == self.minutes => (format!("-{ago} min"), "start"),
                _ => (format!("-{ago} min"), "middle"),
            };
            let _ = write!(
                out,
                "<line x1='{xx:.1}' x2='{xx:.1}' y1='{}' y2='{}' stroke='#eef1f4'/>\
                 <text class='x' x='{xx:.1}' y='{}' text-anchor='{anchor}'>{label}</text>",
                f.top,
                f.height - f.bottom,
                f.height - 5.0
            );
        }
    }

    /// Series `i` (the server at `address`): its line, and a dot on each sample.
    fn series(&self, out: &mut String, i: usize, address: &str, points: &[Point]) {
        let (colour, width, dash) = line_style(i);
        let mut path = String::new();
        for (n, &(t, v, _)) in points.iter().enumerate() {
            if n == 0 {
                let _ = write!(path, "M{:.1},{:.1}", self.x(t), self.y(v));
            } else {
                // Held until this sample, then the step to its value.
                let _ = write!(path, " H{:.1} V{:.1}", self.x(t), self.y(v));
            }
        }
        let _ = write!(
            out,
            "<path class='series' data-server='{}' d='{path}' fill='none' stroke='{colour}' \
             stroke-width='{width}' stroke-dasharray='{dash}' stroke-linejoin='round'/>",
            esc(address)
        );
        // A dot on each sample and on now (not on the value held at the left edge), small
        // enough that an hour of minutes stays a row of dots on a phone.
        let radius = (self.width() / self.minutes as f64 / 4.0).clamp(1.2, 2.5);
        for &(t, v, _) in points.iter().filter(|&&(_, _, sample)| sample) {
            let _ = write!(
                out,
                "<circle class='sample' cx='{:.1}' cy='{:.1}' r='{radius}' fill='{colour}' stroke='#fff' stroke-width='1'/>",
                self.x(t),
                self.y(v)
            );
        }
    }
}

/// Each server's points from `start` to `now`: the value held at the left edge (when a sample
/// came before it), the samples in the window, and the count now.
fn series_between(snap: &Snapshot, start: u64, now: u64) -> Vec<Vec<Point>> {
    snap.state
        .servers
        .iter()
        .map(|s| {
            let before = s.samples.iter().rev().find(|&&(t, _)| t < start);
            let mut points: Vec<Point> = before
                .map(|&(_, v)| (start, v, false))
                .into_iter()
                .collect();
            points.extend(
                s.samples
                    .iter()
                    .filter(|&&(t, _)| t >= start && t <= now)
                    .map(|&(t, v)| (t, v, true)),
            );
            points.push((now, s.active, true));
            points
        })
        .collect()
}

fn chart_svg(out: &mut String, l: &Labels, snap: &Snapshot, f: &Frame) {
    let now = snap.now_wall_ms;
    let oldest = snap
        .state
        .servers
        .iter()
        .filter_map(|s| s.samples.first().map(|&(t, _)| t))
        .min()
        .unwrap_or(now);
    // Whole minutes, one at least, an hour at most, rounded up to the labels' step (each
    // step divides 60) so the left edge is labelled too.
    let age = now.saturating_sub(oldest).div_ceil(60_000).clamp(1, 60);
    let every = x_step(age, f.x_labels);
    let minutes = age.div_ceil(every) * every;
    let window = minutes * 60_000;
    let start = now - window.min(now);
    let series = series_between(snap, start, now);
    let max = series
        .iter()
        .flatten()
        .map(|&(_, v, _)| v)
        .max()
        .unwrap_or(0);
    let (step, top) = y_scale(max);
    let plot = Plot {
        f,
        now,
        start,
        window,
        minutes,
        every,
        step,
        top,
    };
    let _ = write!(
        out,
        "<svg class='{}' viewBox='0 0 {} {}' role='img' aria-label='{}' xmlns='http://www.w3.org/2000/svg' \
         font-size='{}' fill='#5f6b78'>",
        f.class, f.width, f.height, l.chart, f.font
    );
    plot.grid(out, l);
    // Widest first: narrower lines on top leave the wider ones' edges showing.
    let mut order: Vec<usize> = (0..series.len()).collect();
    order.sort_by(|&a, &b| line_style(b).1.total_cmp(&line_style(a).1));
    for i in order {
        plot.series(out, i, &snap.state.servers[i].address, &series[i]);
    }
    out.push_str("</svg>");
}

/// The CFG page: every key of the effective configuration, defaults marked.
pub fn config(snap: &Snapshot, config: &Config, host: &str) -> String {
    let l = of(snap.language);
    let mut out = String::with_capacity(16 * 1024);
    head(
        &mut out,
        l,
        &format!("appbroker CFG {}", config.source.display()),
        None,
    );
    banner(&mut out, l, snap, host);
    let _ = write!(
        out,
        "<div class='card'><h2>{} <small>{}</small></h2></div>",
        l.configuration,
        esc(&config.source.display().to_string())
    );
    for section in config.effective() {
        let _ = write!(
            out,
            "<div class='card'><h2>[{}]</h2><table><tr><th>{}</th><th>{}</th><th>{}</th></tr>",
            esc(&section.name),
            l.key,
            l.value,
            l.origin
        );
        for (key, value, origin) in &section.keys {
            let (class, from) = match origin {
                Origin::Section(line) => ("", format!("{} {line}", l.line)),
                Origin::General(line) => ("", format!("[General] {} {line}", l.line)),
                Origin::Default => (" class='muted'", l.default.to_string()),
            };
            let _ = write!(
                out,
                "<tr{class}><td>{}</td><td>{}</td><td>{from}</td></tr>",
                esc(key),
                esc(value)
            );
        }
        out.push_str("</table></div>");
    }
    out.push_str("</main></body></html>");
    out
}

/// An HTTP server's live sessions: how many, the most at once, and how long each has been
/// idle (longest first; 0 s while a WebSocket of it is open).
fn session_ages(out: &mut String, l: &Labels, sessions: &ServerSessions) {
    let _ = write!(
        out,
        "<div class='card'><h2>{} ({}, {} {})</h2>",
        l.sessions, sessions.live, l.max, sessions.peak
    );
    if sessions.ages.is_empty() {
        let _ = write!(out, "<p class='muted'>{}</p>", l.none);
    } else {
        out.push_str("<p class='ages'>");
        let ages: Vec<String> = sessions.ages.iter().map(|a| span(*a)).collect();
        out.push_str(&ages.join(" · "));
        if (sessions.ages.len() as u64) < sessions.live {
            let _ = write!(
                out,
                " · … {} {}",
                sessions.live - sessions.ages.len() as u64,
                l.more
            );
        }
        out.push_str("</p>");
    }
    out.push_str("</div>");
}

/// The detail of one server: its figures and its recent quarantines.
pub fn server(snap: &Snapshot, s: &ServerState, host: &str) -> String {
    let l = of(snap.language);
    let mut out = String::with_capacity(8 * 1024);
    head(&mut out, l, &format!("appbroker {}", s.address), None);
    banner(&mut out, l, snap, host);
    let _ = write!(
        out,
        "<div class='card'><h2>{} {} (REMOTE_SERVER_{})</h2>",
        l.server,
        esc(&s.address),
        esc(&s.id)
    );
    out.push_str("<section class='facts'>");
    fact(&mut out, l.state, &state_cell(l, s), "");
    if let Some((since, until)) = s.quarantine {
        fact(
            &mut out,
            l.quarantine,
            &format!("{} – {}", clock(since), clock(until)),
            "",
        );
    }
    fact(&mut out, l.connections, &s.active.to_string(), "big");
    fact(&mut out, l.total_short, &s.total.to_string(), "big");
    fact(&mut out, l.weight, &s.weight.to_string(), "");
    fact(
        &mut out,
        l.failed_connects,
        &s.failed_connects.to_string(),
        "",
    );
    fact(&mut out, l.bytes_in, &bytes(s.bytes_to_server), "");
    fact(&mut out, l.bytes_out, &bytes(s.bytes_to_client), "");
    fact(
        &mut out,
        l.last_check,
        &check_cell(l, s, &snap.state.monitoring),
        "",
    );
    out.push_str("</section></div>");
    if let Some(http) = &snap.http {
        session_ages(&mut out, l, &http.sessions_of(&s.address));
    }
    let _ = write!(
        out,
        "<div class='card'><h2>{} ({})</h2>",
        l.history, s.quarantines
    );
    if s.history.is_empty() {
        let _ = write!(out, "<p class='muted'>{}</p>", l.none);
    } else {
        let _ = write!(
            out,
            "<table><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
            l.start, l.end, l.duration, l.reason, l.error, l.released
        );
        for e in s.history.iter().rev() {
            let end = e.end_wall_ms.unwrap_or(snap.now_wall_ms);
            let _ = write!(
                out,
                "<tr><td>{} {}</td><td>{}</td><td class='num'>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                clock(e.start_wall_ms),
                date(e.start_wall_ms),
                e.end_wall_ms.map_or_else(|| l.ongoing.to_string(), clock),
                span(Duration::from_millis(end.saturating_sub(e.start_wall_ms))),
                reason(l, e.reason),
                esc(&l.words(&e.error)),
                esc(&l.words(e.released.map_or("-", |r| r.as_str())))
            );
        }
        out.push_str("</table>");
    }
    let _ = write!(
        out,
        "</div><p><a href='/TOTVS_BROKER_QUERY/STATUS'>{}</a></p></main></body></html>",
        l.back
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::BalancerState;
    use crate::config::{Language, SortMethod};

    /// A server with `samples`, one a minute, `minutes_ago` apart from `now`, and `active` now.
    fn server(port: u16, now: u64, samples: &[(u64, u64)], active: u64) -> ServerState {
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
        }
    }

    fn snapshot(now: u64, servers: Vec<ServerState>) -> Snapshot {
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
            },
            language: Language::English,
            started_wall_ms: now - 3_600_000,
            now_wall_ms: now,
            pid: 1,
            instance: "[1-1]".into(),
            peer: "127.0.0.1:1".parse().expect("address"),
            draining: false,
            others: Vec::new(),
            http: None,
        }
    }

    const NOW: u64 = 1_800_000_000_000;

    /// The chart of `class` (`wide` or `narrow`) as rendered.
    fn chart_of(snap: &Snapshot, class: &str) -> String {
        let mut out = String::new();
        chart(&mut out, of(snap.language), snap);
        let start = out
            .find(&format!("<svg class='{class}'"))
            .expect("the chart");
        out[start..start + out[start..].find("</svg>").expect("its end")].to_string()
    }

    /// The values of attribute `name` on every `<tag` of `svg` with `class`.
    fn attributes(svg: &str, tag_class: &str, name: &str) -> Vec<String> {
        svg.split(tag_class)
            .skip(1)
            .map(|rest| {
                let at = rest.find(&format!(" {name}='")).expect("the attribute") + name.len() + 3;
                rest[at..at + rest[at..].find('\'').expect("quoted")].to_string()
            })
            .collect()
    }

    /// The texts of the axis labels of `class` (`x` or `y`).
    fn labels(svg: &str, class: &str) -> Vec<String> {
        svg.split(&format!("<text class='{class}'"))
            .skip(1)
            .map(|rest| {
                let text = &rest[rest.find('>').expect("tag end") + 1..];
                text[..text.find('<').expect("text end")].to_string()
            })
            .collect()
    }

    /// A path of `M x,y H x V y ...` commands as its corners.
    fn corners(d: &str) -> Vec<(f64, f64)> {
        let mut corners = Vec::new();
        let (mut x, mut y) = (0.0, 0.0);
        for command in d.split_whitespace() {
            let (letter, rest) = command.split_at(1);
            match letter {
                "M" => {
                    let (a, b) = rest.split_once(',').expect("x,y");
                    (x, y) = (a.parse().expect("x"), b.parse().expect("y"));
                }
                "H" => x = rest.parse().expect("x"),
                "V" => y = rest.parse().expect("y"),
                other => panic!("{other}: only moves, horizontal and vertical lines"),
            }
            corners.push((x, y));
        }
        corners
    }

    #[test]
    fn y_ticks_are_round_and_cover_the_largest_count() {
        for (max, ticks) in [
            (0, vec![0, 1]),
            (1, vec![0, 1]),
            (3, vec![0, 1, 2, 3]),
            (5, vec![0, 1, 2, 3, 4, 5]),
            (6, vec![0, 2, 4, 6]),
            (7, vec![0, 2, 4, 6, 8]),
            (13, vec![0, 5, 10, 15]),
            (40, vec![0, 10, 20, 30, 40]),
            (99, vec![0, 20, 40, 60, 80, 100]),
            (1234, vec![0, 500, 1000, 1500]),
        ] {
            let snap = snapshot(NOW, vec![server(1, NOW, &[(3, 0)], max)]);
            let wanted: Vec<String> = ticks.iter().map(u64::to_string).collect();
            for class in ["wide", "narrow"] {
                assert_eq!(labels(&chart_of(&snap, class), "y"), wanted, "max {max}");
            }
        }
        // No count can overflow the scale.
        assert_eq!(y_scale(u64::MAX - 1).1, u64::MAX);
    }

    #[test]
    fn the_time_axis_is_labelled_in_whole_minutes() {
        for (age, wide, narrow) in [
            (60, "-60 -50 -40 -30 -20 -10 now", "-60 -40 -20 now"),
            (30, "-30 -25 -20 -15 -10 -5 now", "-30 -20 -10 now"),
            (5, "-5 -4 -3 -2 -1 now", "-6 -4 -2 now"),
            (1, "-1 now", "-1 now"),
        ] {
            // Sampled `age` minutes ago and one second later (a young broker).
            let samples = [(age, 1)];
            let mut s = server(1, NOW, &samples, 1);
            s.samples[0].0 += 1_000;
            let snap = snapshot(NOW, vec![s]);
            for (class, wanted) in [("wide", wide), ("narrow", narrow)] {
                let got: Vec<String> = labels(&chart_of(&snap, class), "x")
                    .into_iter()
                    .map(|l| l.replace(" min", ""))
                    .collect();
                let wanted: Vec<&str> = wanted.split(' ').collect();
                assert_eq!(got, wanted, "{class} chart of a broker {age} minutes old");
            }
        }
        let snap = snapshot(NOW, vec![server(1, NOW, &[(61, 1), (60, 1)], 1)]);
        let x = labels(&chart_of(&snap, "wide"), "x");
        assert_eq!(
            x.first().map(String::as_str),
            Some("-60 min"),
            "an hour at most"
        );
    }

    #[test]
    fn lines_step_at_the_sample_times_with_a_dot_on_each() {
        // Sampled 0 three and two minutes ago, 4 a minute ago; 5 now.
        let snap = snapshot(NOW, vec![server(1, NOW, &[(3, 0), (2, 0), (1, 4)], 5)]);
        let svg = chart_of(&snap, "wide");
        let d = &attributes(&svg, "<path class='series'", "d")[0];
        let corners = corners(d);
        let xs: Vec<f64> = corners.iter().map(|c| c.0).collect();
        let x = |minutes_ago: f64| {
            WIDE.left + (WIDE.width - WIDE.left - WIDE.right) * (1.0 - minutes_ago / 3.0)
        };
        // Every segment horizontal or vertical: a value holds until the next sample.
        for pair in corners.windows(2) {
            assert!(
                pair[0].0 == pair[1].0 || pair[0].1 == pair[1].1,
                "a slope in {d}"
            );
        }
        // The rise to 4 is at the sample a minute ago, the one to 5 now: not before.
        let rises: Vec<f64> = corners
            .windows(2)
            .filter(|p| p[1].1 < p[0].1)
            .map(|p| p[1].0)
            .collect();
        assert_eq!(rises.len(), 2, "{d}");
        assert!((rises[0] - x(1.0)).abs() < 0.2, "{rises:?} {xs:?}");
        assert!((rises[1] - x(0.0)).abs() < 0.2, "{rises:?}");
        // A dot on each of the three samples and on now.
        let dots = attributes(&svg, "<circle class='sample'", "cx");
        assert_eq!(dots.len(), 4, "{svg}");
    }

    #[test]
    fn lines_of_the_same_counts_stay_distinguishable() {
        let samples = [(10, 2), (9, 2), (8, 3)];
        let servers: Vec<ServerState> = (0..14)
            .map(|i| server(6000 + i, NOW, &samples, 3))
            .collect();
        let snap = snapshot(NOW, servers);
        let svg = chart_of(&snap, "wide");
        let tag = "<path class='series'";
        let styles: Vec<(String, String, String)> = attributes(&svg, tag, "stroke")
            .into_iter()
            .zip(attributes(&svg, tag, "stroke-width"))
            .zip(attributes(&svg, tag, "stroke-dasharray"))
            .map(|((c, w), d)| (c, w, d))
            .collect();
        assert_eq!(styles.len(), 14);
        let mut distinct = styles.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 14, "two servers drawn alike: {styles:?}");
        // Drawn widest first, so a narrower line on top leaves the wider one showing.
        let widths: Vec<f64> = styles
            .iter()
            .map(|s| s.1.parse().expect("a width"))
            .collect();
        assert!(widths.windows(2).all(|w| w[0] >= w[1]), "{widths:?}");
        // Each server's legend shows its line's colour and dashes.
        let mut legend = String::new();
        chart(&mut legend, of(Language::English), &snap);
        for i in 0..14 {
            let (colour, _, dash) = line_style(i);
            let entry = format!("stroke='{colour}' stroke-width=");
            let at = legend
                .find(&format!(
                    "{} 10.0.0.1:{}",
                    snap.state.servers[i].id,
                    6000 + i
                ))
                .expect("in the legend");
            let swatch = &legend[..at];
            let swatch = &swatch[swatch.rfind("<svg").expect("a swatch")..];
            assert!(
                swatch.contains(&entry) && swatch.contains(&format!("stroke-dasharray='{dash}'")),
                "{swatch}"
            );
        }
    }

    #[test]
    fn a_server_added_a_minute_ago_is_a_line_from_then() {
        // One sample: the one its creation records (balancer::Server::new).
        let old = server(1, NOW, &[(40, 1), (39, 1)], 1);
        let new = server(2, NOW, &[(1, 0)], 2);
        let snap = snapshot(NOW, vec![old, new]);
        let svg = chart_of(&snap, "wide");
        let paths = attributes(&svg, "<path class='series'", "d");
        let corners = corners(&paths[1]);
        assert!(corners.len() >= 3, "more than a dot: {paths:?}");
        let span = corners.last().expect("corners").0 - corners[0].0;
        let minute = (WIDE.width - WIDE.left - WIDE.right) / 40.0;
        assert!(
            (span - minute).abs() < 0.5,
            "from a minute ago to now: {span} vs {minute}"
        );
    }

    /// What a reader sees of `page`: the text outside tags, the stylesheet left out.
    fn visible(page: &str) -> String {
        let style_end = page.find("</style>").expect("a stylesheet");
        let mut text = String::new();
        let mut in_tag = false;
        for c in page[style_end..].chars() {
            match c {
                '<' => in_tag = true,
                '>' => {
                    in_tag = false;
                    text.push(' ');
                }
                c if !in_tag => text.push(c),
                _ => {}
            }
        }
        text
    }

    /// A page's servers in every standing: 01 available with a weight an operator set and an
    /// error it has proved itself past; 02 quarantined by the monitor; 03 disabled by an
    /// operator; 04 drained by one; 05 of weight 0; 06 in an operator's quarantine.
    fn every_standing() -> Vec<ServerState> {
        let mut servers: Vec<ServerState> = (1..=6).map(|i| server(i, NOW, &[(2, 0)], 0)).collect();
        let hold = |mode| crate::balancer::overrides::Hold {
            mode,
            reason: "AppServer upgrade".into(),
            by: "uid 0".into(),
            since_wall_ms: NOW - 60_000,
        };
        let failed = |s: &mut ServerState, current| {
            s.last_error = Some("connection refused".into());
            s.last_error_wall_ms = NOW - 30_000;
            s.error_current = current;
        };
        servers[0].overrides.weight = Some(3);
        (servers[0].weight, servers[0].file_weight) = (3, 2);
        failed(&mut servers[0], false);
        servers[1].state = Standing::Quarantined;
        servers[1].quarantine = Some((NOW - 30_000, NOW + 90_000));
        servers[1].reason = Some(Reason::Monitor);
        failed(&mut servers[1], true);
        servers[1].last_check = Some(crate::balancer::health::Check {
            at_wall_ms: NOW,
            duration: Duration::from_millis(2),
            error: Some("timed out after 1s".into()),
        });
        servers[2].state = Standing::Disabled;
        servers[2].overrides.hold = Some(hold(Mode::Disabled));
        servers[3].state = Standing::Disabled;
        servers[3].overrides.hold = Some(hold(Mode::Drain));
        servers[4].state = Standing::Draining;
        servers[4].weight = 0;
        servers[5].state = Standing::Quarantined;
        servers[5].quarantine = Some((NOW - 10_000, NOW + 590_000));
        servers[5].reason = Some(Reason::Operator);
        servers[5].forced = true;
        servers[5].asked = Some(crate::balancer::health::Asked {
            by: "uid 0".into(),
            reason: "AppServer restart".into(),
        });
        // Its last error is from before, and still stands: the operator's words are shown.
        failed(&mut servers[5], true);
        servers
    }

    /// `snap` as an HTTP balancer's.
    fn http(mut snap: Snapshot) -> Snapshot {
        snap.state.kind = BalancerKind::Http("BALANCE_HTTP");
        snap.http = Some(Default::default());
        snap
    }

    /// The state cell of server `i` (0-based) on `page`.
    fn state_of(page: &str, i: usize) -> String {
        let row = page
            .split("<tr>")
            .filter(|r| r.contains("ServerStatus/"))
            .nth(i)
            .expect("the row");
        let start = row.find("<td class='").expect("the state cell");
        row[start..start + row[start..].find("</td>").expect("its end")].to_string()
    }

    #[test]
    fn an_error_is_shown_only_while_it_stands_and_with_when_it_came() {
        let mut snap = snapshot(NOW, every_standing());
        snap.state.servers[2] = server(3, NOW, &[(2, 0)], 0);
        let page = status(&snap, "localhost", None);
        let healthy = page.split("<tr>").nth(2).expect("01's row");
        assert!(
            !healthy.contains("connection refused") && !healthy.contains("Error"),
            "proved itself since: {healthy}"
        );
        snap.state.servers[0].error_current = true;
        let page = status(&snap, "localhost", None);
        let at = clock(NOW - 30_000);
        let healthy = page.split("<tr>").nth(2).expect("01's row");
        assert!(
            healthy.contains(&format!("Error at {at}: connection refused")),
            "still standing, with its time: {healthy}"
        );
        // In quarantine: the end, who found it (not on a phone) and the error.
        assert_eq!(
            state_of(&page, 1),
            format!(
                "<td class='inQuarantine'><span class='badge bad'>quarantined</span><br><small>\
                 until {} · <span class='why'>monitor: </span>connection refused</small>",
                clock(NOW + 90_000)
            )
        );
    }

    #[test]
    fn an_operators_quarantine_says_who_and_why_instead_of_an_error() {
        for (language, words) in [
            (Language::English, "asked by uid 0: AppServer restart"),
            (Language::Portuguese, "pedida por uid 0: AppServer restart"),
        ] {
            let mut snap = snapshot(NOW, every_standing());
            snap.language = language;
            for snap in [snap.clone(), http(snap)] {
                let page = status(&snap, "localhost", None);
                let cell = state_of(&page, 5);
                // Outside the `.why` a phone hides: a phone shows it too.
                assert!(
                    cell.ends_with(&format!(" · {words}</small>")),
                    "{language:?}: {cell}"
                );
                assert!(
                    !cell.contains("refused") && !cell.contains("recusada"),
                    "{cell}"
                );
            }
        }
    }

    #[test]
    fn the_summary_counts_every_server_that_takes_no_clients_and_weights_set_are_marked() {
        for (language, said, weight) in [
            (
                Language::English,
                "0 active connections</b> · 1 of 6 servers available · \
                 <span class='bad'>2 in quarantine</span> · <span class='held'>1 disabled</span> · \
                 <span class='held'>2 draining</span></p>",
                "<td>3<br><small class='override' title='set by an operator'>file: 2</small></td>",
            ),
            (
                Language::Portuguese,
                "0 conexões ativas</b> · 1 de 6 servidores disponíveis · \
                 <span class='bad'>2 em quarentena</span> · <span class='held'>1 desabilitado</span> · \
                 <span class='held'>2 drenando</span></p>",
                "<td>3<br><small class='override' title='definido por um operador'>arquivo: 2</small></td>",
            ),
        ] {
            let mut snap = snapshot(NOW, every_standing());
            snap.language = language;
            let page = status(&snap, "localhost", None);
            assert!(page.contains(said), "{language:?}: {page}");
            assert!(page.contains(weight), "{language:?}: {page}");
            // The badges say the same as the summary.
            assert!(state_of(&page, 2).contains(&format!(">{}<", of(language).disabled_count.0)));
            assert!(state_of(&page, 3).contains(&format!(">{}<", of(language).draining_count.0)));
        }
        let one = snapshot(NOW, vec![server(1, NOW, &[(2, 0)], 1)]);
        let page = status(&one, "localhost", None);
        assert!(
            page.contains("1 active connection</b> · 1 of 1 server available</p>"),
            "{page}"
        );
    }

    /// English words that must not be on a pt-BR page (whole words, case-sensitive), once the
    /// texts kept verbatim from the TOTVS page are taken out.
    const ENGLISH: &[&str] = &[
        "server",
        "servers",
        "Servers",
        "client",
        "clients",
        "connection",
        "connections",
        "available",
        "quarantined",
        "quarantine",
        "disabled",
        "draining",
        "drained",
        "set",
        "file",
        "by",
        "at",
        "of",
        "until",
        "asked",
        "now",
        "failed",
        "refused",
        "more",
        "max",
        "Error",
        "Last",
        "check",
        "weight",
        "sessions",
        "moved",
        "timed",
        "out",
        "after",
        "monitor check",
        "none",
        "never",
        "ongoing",
        "Back",
    ];

    /// The texts of the TOTVS page that monitors find the page by: kept verbatim.
    const TOTVS_VERBATIM: &[&str] = &["Consulta efetuada pelo client", "Servers (", "Server"];

    #[test]
    fn portuguese_pages_are_in_one_language() {
        let mut snap = snapshot(NOW, every_standing());
        snap.language = Language::Portuguese;
        let mut http_snap = http(snap.clone());
        if let Some(h) = &mut http_snap.http {
            h.sessions.moved = 2;
            h.sessions.servers = vec![(
                "10.0.0.1:1".into(),
                ServerSessions {
                    live: 201,
                    peak: 250,
                    ages: vec![Duration::from_secs(5); crate::query::snapshot::SESSION_AGES_SHOWN],
                },
            )];
        }
        let pages = [
            status(&snap, "localhost", None),
            status(&http_snap, "localhost", None),
            super::server(&snap, &snap.state.servers[1], "localhost"),
            super::server(&snap, &snap.state.servers[5], "localhost"),
            super::server(&http_snap, &http_snap.state.servers[0], "localhost"),
        ];
        for page in &pages {
            let mut text = visible(page);
            for kept in TOTVS_VERBATIM {
                text = text.replace(kept, " ");
            }
            let words: Vec<&str> = text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            for english in ENGLISH.iter().filter(|e| !e.contains(' ')) {
                assert!(
                    !words.contains(english),
                    "{english:?} on a pt-BR page:\n{text}"
                );
            }
            assert!(!text.contains("monitor check"), "{text}");
        }
        let text = visible(&pages[0]);
        for portuguese in [
            "conexão recusada",
            "tempo esgotado após 1s",
            " agora ",
            "0 conexões ativas",
            "em quarentena",
            "servidores disponíveis",
            "pedida por uid 0",
        ] {
            assert!(text.contains(portuguese), "{portuguese:?} missing:\n{text}");
        }
        // Said once: the summary, not a label above the same words.
        assert_eq!(text.matches("conexões ativas").count(), 1, "{text}");
        // The one text exempt from the language: what monitors recognise the page by.
        assert!(text.contains("TOTVS Broker para SmartClient"));
        assert!(visible(&pages[1]).contains("TOTVS Broker para HTTP"));
    }

    /// peder1981/monitor's `MonExtrairAtivas`: the counts it reads from the text before each
    /// ` ativas` that mentions `sess` or `conex`, in page order (tests/monitors.rs has the
    /// whole port).
    fn active_counts(page: &str) -> Vec<(&'static str, String)> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = page[from..].find(" ativas").map(|i| i + from) {
            let piece = &page[page[..at].rfind('>').map_or(0, |i| i + 1)..at];
            if piece.contains("sess") {
                found.push(("sessions", piece.to_string()));
            } else if piece.contains("conex") {
                found.push(("connections", piece.to_string()));
            }
            from = at + " ativas".len();
        }
        found
    }

    #[test]
    fn only_the_summary_says_ativas_after_sess_or_conex() {
        let mut snap = snapshot(NOW, every_standing());
        snap.language = Language::Portuguese;
        snap.state.active = 7;
        let tcp = status(&snap, "localhost", None);
        assert_eq!(
            active_counts(&tcp),
            [("connections", "7 conexões".to_string())]
        );
        let mut snap = http(snap);
        if let Some(h) = &mut snap.http {
            h.sessions.live = 3;
        }
        let page = status(&snap, "localhost", None);
        assert_eq!(
            active_counts(&page),
            [
                ("sessions", "3 sessões".to_string()),
                ("connections", "7 conexões".to_string())
            ]
        );
        for s in &snap.state.servers {
            assert!(active_counts(&super::server(&snap, s, "localhost")).is_empty());
        }
    }

    #[test]
    fn each_layout_draws_its_columns_by_what_they_hold() {
        for layout in [&TCP_LAYOUT, &HTTP_LAYOUT] {
            let rules = layout.rules();
            let l = of(Language::English);
            for (i, column) in layout.columns().enumerate() {
                let nth = format!(
                    "table.servers.{} :is(th, td):nth-child({})",
                    layout.class,
                    i + 1
                );
                let align = format!("{nth} {{ text-align:{}; }}", column.holds.align());
                assert!(rules.contains(&align), "{}: {rules}", (column.header)(l));
            }
            // A phone: the server, a figure, the state; nothing else.
            let phone: Vec<&str> = layout
                .columns()
                .filter(|c| c.on_phone)
                .map(|c| (c.header)(l))
                .collect();
            let figure = if layout.class == "http" {
                "Sessions"
            } else {
                "Connections"
            };
            assert_eq!(phone, ["Server", figure, "State"], "{}", layout.class);
        }
        // The monitors' cells come first, in the TOTVS pages' order.
        let headers = |layout: &Layout| -> Vec<&str> {
            let l = of(Language::English);
            layout.columns().map(|c| (c.header)(l)).collect()
        };
        assert_eq!(
            headers(&TCP_LAYOUT)[..3],
            ["Server", "Connections", "Quarantine"]
        );
        assert_eq!(
            headers(&HTTP_LAYOUT)[..5],
            [
                "Server",
                "Sessions",
                "Connections",
                "Quarantine since",
                "Reasons"
            ]
        );
    }
}
