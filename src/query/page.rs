//! The HTML pages: STATUS (facts, a chart of the last hour, the server table), CFG and the
//! detail of one server. Plain HTML and CSS with an inline SVG chart: no external assets, no
//! JavaScript, so the page works on an operator's locked-down machine.
//!
//! The server table keeps the contracts of the TOTVS page that monitors parse: a `Servers (N)`
//! heading, every data cell a `<td>`, the first cell a link to
//! `/TOTVS_BROKER_QUERY/ServerStatus/host:port`, the third the quarantine cell (`-` or the
//! local time the quarantine ends). Columns of our own come after those three.

use std::fmt::Write;
use std::time::Duration;

use super::labels::{Labels, of};
use super::snapshot::{ServerSnapshot, Snapshot, State};
use crate::config::{BalancerKind, Config, Monitoring, Origin, show_duration};

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

pub use crate::clock::{local_date as date, time_of_day as clock};

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

const STYLE: &str = "
:root { --ink:#1d2733; --muted:#66727f; --line:#dde3ea; --bg:#f5f7fa; --card:#fff; --accent:#1f6feb;
        --bad:#b42318; --badbg:#fde8e8; --warn:#8a6100; --warnbg:#fff6d6; --good:#1a7f37; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif; color:var(--ink); background:var(--bg); }
header { background:#16202b; color:#fff; padding:14px 24px; display:flex; flex-wrap:wrap; align-items:baseline; gap:8px 24px; }
header h1 { margin:0; font-size:20px; font-weight:600; }
header h1 small { font-weight:400; color:#b8c4d0; font-size:15px; margin-left:6px; }
header nav a { color:#cfe0ff; margin-right:14px; text-decoration:none; }
header nav a:hover { text-decoration:underline; }
main { padding:18px 24px 32px; max-width:1400px; }
.banner { background:var(--warnbg); color:var(--warn); border:1px solid #f0d68a; padding:8px 12px; border-radius:6px; margin-bottom:14px; font-weight:600; }
.facts { display:grid; grid-template-columns:repeat(auto-fill,minmax(220px,1fr)); gap:10px; margin-bottom:18px; }
.fact { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
.fact .label { display:block; color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.03em; }
.fact .value { font-size:16px; font-weight:600; word-break:break-word; }
.fact.big .value { font-size:26px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; margin-bottom:18px; }
h2 { font-size:16px; margin:0 0 10px; }
table { border-collapse:collapse; width:100%; background:var(--card); }
th, td { border:1px solid var(--line); padding:5px 8px; text-align:left; vertical-align:top; }
th { background:#eef2f6; font-weight:600; font-size:13px; white-space:nowrap; }
td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr:nth-child(even) td { background:#fafbfc; }
tr.inQuarantine td { background:var(--badbg); }
tr.inQuarantine td:first-child { box-shadow: inset 4px 0 0 var(--bad); }
tr.isDisabled td { background:var(--warnbg); }
.state-available { color:var(--good); font-weight:600; }
.state-quarantined { color:var(--bad); font-weight:700; }
.state-draining { color:var(--warn); font-weight:600; }
small, .muted { color:var(--muted); }
a { color:var(--accent); }
.chart svg { width:100%; height:auto; display:block; }
.legend { display:flex; flex-wrap:wrap; gap:4px 14px; margin-top:6px; font-size:12px; }
.legend span::before { content:''; display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:5px; background:var(--c); }
footer { color:var(--muted); font-size:12px; margin-top:14px; }
";

/// Colours of the chart's lines, distinct on white.
const PALETTE: [&str; 10] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#0f7b8a", "#bf3989", "#57606a",
    "#fb8500", "#2da44e",
];

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
        "<title>{}</title><style>{STYLE}</style></head><body>",
        esc(title)
    );
}

fn kind_words(l: &Labels, kind: BalancerKind) -> &'static str {
    match kind {
        BalancerKind::SmartClientDesktop => l.for_smartclient,
        BalancerKind::WebServices => l.for_web_services,
    }
}

fn banner(out: &mut String, l: &Labels, snap: &Snapshot, host: &str) {
    let _ = write!(
        out,
        "<header><h1>appbroker <small>[{}] {} {} {}</small></h1><nav>\
         <a href='/TOTVS_BROKER_QUERY/STATUS'>STATUS</a><a href='/TOTVS_BROKER_QUERY/CFG'>CFG</a>\
         <a href='/TOTVS_BROKER_QUERY/JSON'>JSON</a><a href='/TOTVS_BROKER_QUERY/METRICS'>METRICS</a>\
         <a href='/TOTVS_BROKER_QUERY/PING'>PING</a>",
        snap.kind.section(),
        kind_words(l, snap.kind),
        l.on,
        snap.listen
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
    let mut out = String::with_capacity(16 * 1024 + snap.servers.len() * 600);
    let title = format!("appbroker [{}] {}", snap.kind.section(), snap.listen);
    head(&mut out, l, &title, refresh);
    banner(&mut out, l, snap, host);

    out.push_str("<section class='facts'>");
    let active = if snap.language == crate::config::Language::Portuguese {
        format!("{} {}", snap.active, l.active_now)
    } else {
        snap.active.to_string()
    };
    fact(&mut out, l.active, &active, "big");
    fact(&mut out, l.total, &snap.accepted.to_string(), "big");
    let last = if snap.last_connection_wall_ms == 0 {
        l.never.to_string()
    } else {
        format!(
            "{} {}",
            clock(snap.last_connection_wall_ms),
            date(snap.last_connection_wall_ms)
        )
    };
    fact(&mut out, l.last_connection, &last, "");
    fact(
        &mut out,
        l.max_simultaneous,
        &format!(
            "{} <small>({} {})</small>",
            snap.max_connections, l.peak, snap.peak
        ),
        "",
    );
    fact(
        &mut out,
        l.started,
        &format!(
            "{} {}",
            clock(snap.started_wall_ms),
            date(snap.started_wall_ms)
        ),
        "",
    );
    fact(
        &mut out,
        l.now,
        &format!("{} {}", clock(snap.now_wall_ms), date(snap.now_wall_ms)),
        "",
    );
    fact(&mut out, l.policy, snap.sort_method.as_str(), "");
    let monitor = match snap.monitoring {
        Monitoring::Disabled => snap.monitoring.as_str().to_string(),
        _ => format!(
            "{} {} {}",
            snap.monitoring.as_str(),
            l.every,
            show_duration(snap.monitor_interval)
        ),
    };
    fact(&mut out, l.monitor, &monitor, "");
    fact(
        &mut out,
        l.quarantine_time,
        &show_duration(snap.quarantine_time),
        "",
    );
    fact(&mut out, l.refused, &snap.rejected.to_string(), "");
    fact(&mut out, l.unserved, &snap.unserved.to_string(), "");
    fact(
        &mut out,
        l.version,
        &format!("appbroker {}", env!("CARGO_PKG_VERSION")),
        "",
    );
    fact(
        &mut out,
        l.instance,
        &format!("{} <small>pid {}</small>", snap.instance, snap.pid),
        "",
    );
    fact(&mut out, l.queried_by, &esc(&snap.peer.to_string()), "");
    out.push_str("</section>");

    chart(&mut out, l, snap);
    server_table(&mut out, l, snap);

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

fn server_table(out: &mut String, l: &Labels, snap: &Snapshot) {
    let _ = write!(
        out,
        "<div class='card'><h2>{} ({})</h2><table class='servers'><tr><th>{}</th><th>{}</th><th>{}</th>\
         <th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
        l.servers,
        snap.servers.len(),
        l.server,
        l.connections,
        l.quarantine,
        l.id,
        l.weight,
        l.state,
        l.total_short,
        l.failed_connects,
        l.bytes_in,
        l.bytes_out,
        l.last_check
    );
    for s in &snap.servers {
        let class = match s.state {
            State::Quarantined => " class='inQuarantine'",
            State::Draining => " class='isDisabled'",
            State::Available => "",
        };
        let quarantine = match s.quarantine {
            Some((_, until)) => clock(until),
            None => "-".to_string(),
        };
        let address = esc(&s.address);
        let _ = write!(
            out,
            "<tr{class}><td><a href=\"/TOTVS_BROKER_QUERY/ServerStatus/{address}\">{address}</a></td>\
             <td class='num'>{}</td><td>{quarantine}</td><td>{}</td><td class='num'>{}</td><td>{}</td>\
             <td class='num'>{}</td><td class='num'>{}</td><td class='num' title='{} bytes'>{}</td>\
             <td class='num' title='{} bytes'>{}</td><td>{}</td></tr>",
            s.active,
            esc(&s.id),
            s.weight,
            state_cell(l, s),
            s.total,
            s.failed_connects,
            s.bytes_to_server,
            bytes(s.bytes_to_server),
            s.bytes_to_client,
            bytes(s.bytes_to_client),
            check_cell(l, s, &snap.monitoring),
        );
    }
    out.push_str("</table></div>");
}

fn state_cell(l: &Labels, s: &ServerSnapshot) -> String {
    match s.state {
        State::Available => {
            let mut cell = format!("<span class='state-available'>{}</span>", l.available);
            if let Some(error) = &s.last_error {
                let _ = write!(cell, "<br><small>{}: {}</small>", l.error, esc(error));
            }
            cell
        }
        State::Draining => format!("<span class='state-draining'>{}</span>", l.draining_server),
        State::Quarantined => {
            let reason = s.reason.map_or("", |r| r.as_str());
            format!(
                "<span class='state-quarantined'>{}</span> <small>({reason}: {})</small>",
                l.quarantined,
                esc(s.last_error.as_deref().unwrap_or("-"))
            )
        }
    }
}

fn check_cell(l: &Labels, s: &ServerSnapshot, monitoring: &Monitoring) -> String {
    match (&s.last_check, monitoring) {
        (_, Monitoring::Disabled) => format!("<span class='muted'>{}</span>", monitoring.as_str()),
        (None, _) => format!("<span class='muted'>{}</span>", l.never),
        (Some(check), _) => match &check.error {
            None => format!(
                "OK <small>{} · {}</small>",
                span(check.duration),
                clock(check.at_wall_ms)
            ),
            Some(error) => format!(
                "<span class='state-quarantined'>{}</span> <small>{} · {} · {}</small>",
                l.failed,
                esc(error),
                span(check.duration),
                clock(check.at_wall_ms)
            ),
        },
    }
}

/// The inline SVG chart: active connections per server, each minute of the last hour.
fn chart(out: &mut String, l: &Labels, snap: &Snapshot) {
    const W: f64 = 1200.0;
    const H: f64 = 180.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 20.0;
    const TOP: f64 = 8.0;
    // The window is the last hour, or the time since the first sample when the broker is
    // younger (at least a minute), so a new broker's chart is not a stroke at the right edge.
    let now = snap.now_wall_ms as f64;
    let oldest = snap
        .servers
        .iter()
        .filter_map(|s| s.samples.first().map(|&(t, _)| t))
        .min()
        .map_or(now, |t| t as f64);
    let window_ms = (now - oldest).clamp(60_000.0, 3_600_000.0);
    let series: Vec<Vec<(u64, u64)>> = snap
        .servers
        .iter()
        .map(|s| {
            let mut points = s.samples.clone();
            points.push((snap.now_wall_ms, s.active));
            points
        })
        .collect();
    let max = series
        .iter()
        .flatten()
        .map(|&(_, v)| v)
        .max()
        .unwrap_or(0)
        .max(1);
    let x =
        |t: u64| LEFT + (W - LEFT - 4.0) * (1.0 - ((now - t as f64) / window_ms).clamp(0.0, 1.0));
    let y = |v: u64| TOP + (H - TOP - BOTTOM) * (1.0 - v as f64 / max as f64);
    let _ = write!(
        out,
        "<div class='card chart'><h2>{}</h2><svg id='connections-chart' viewBox='0 0 {W} {H}' role='img' \
         aria-label='{}' xmlns='http://www.w3.org/2000/svg'>",
        l.chart, l.chart
    );
    for frac in [0.0, 0.5, 1.0] {
        let value = (max as f64 * frac).round() as u64;
        let yy = y(value);
        let _ = write!(
            out,
            "<line x1='{LEFT}' x2='{}' y1='{yy:.1}' y2='{yy:.1}' stroke='#e3e8ee'/>\
             <text x='{}' y='{:.1}' font-size='11' text-anchor='end' fill='#66727f'>{value}</text>",
            W - 4.0,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    let ago = |ms: f64| {
        if ms >= 120_000.0 {
            format!("-{} min", (ms / 60_000.0).round())
        } else {
            format!("-{} s", (ms / 1000.0).round())
        }
    };
    let ticks = [
        (ago(window_ms), now - window_ms),
        (ago(window_ms / 2.0), now - window_ms / 2.0),
        ("now".to_string(), now),
    ];
    for (label, t) in ticks {
        let xx = x(t.max(0.0) as u64);
        let anchor = if label == "now" { "end" } else { "middle" };
        let _ = write!(
            out,
            "<text x='{xx:.1}' y='{}' font-size='11' text-anchor='{anchor}' fill='#66727f'>{label}</text>",
            H - 4.0
        );
    }
    for (i, points) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = points
            .iter()
            .filter(|(t, _)| now - (*t as f64) <= window_ms)
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        let _ = write!(
            out,
            "<polyline class='series' fill='none' stroke='{colour}' stroke-width='2' points='{}'/>",
            path.join(" ")
        );
        if let Some(last) = path.last() {
            let (cx, cy) = last.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(out, "<circle cx='{cx}' cy='{cy}' r='3' fill='{colour}'/>");
        }
    }
    out.push_str("</svg><div class='legend'>");
    for (i, s) in snap.servers.iter().enumerate() {
        let _ = write!(
            out,
            "<span style='--c:{}'>{} {}</span>",
            PALETTE[i % PALETTE.len()],
            esc(&s.id),
            esc(&s.address)
        );
    }
    out.push_str("</div></div>");
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

/// The detail of one server: its figures and its recent quarantines.
pub fn server(snap: &Snapshot, s: &ServerSnapshot, host: &str) -> String {
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
        &check_cell(l, s, &snap.monitoring),
        "",
    );
    out.push_str("</section></div>");
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
                e.reason.as_str(),
                esc(&e.error),
                esc(e.released.as_deref().unwrap_or("-"))
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
