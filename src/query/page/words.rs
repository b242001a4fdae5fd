//! How a page writes values for people: text escaped for HTML, byte counts, spans of time,
//! moments, plurals, who put a server in quarantine, and the links to the other pages.

use std::time::Duration;

use crate::balancer::rules::health::Reason;
use crate::config::Language;
use crate::query::labels::Labels;
use crate::query::snapshot::Snapshot;
use crate::support::clock::{local_date, local_date_iso, time_of_day};

/// Escapes text for HTML.
pub(super) fn esc(text: &str) -> String {
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
pub(super) fn bytes(n: u64) -> String {
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
pub(super) fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 if d.as_millis() < 10 => format!("{:.1}ms", d.as_secs_f64() * 1000.0),
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{}s", s),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// A wall-clock instant (ms since the Unix epoch), for a reader of `language`: in English,
/// ISO 8601, the date first (`2026-12-06 18:30:59`: `06/12/2026` reads as June 12 there); in
/// pt-BR the time then the date (`18:30:59 06/12/2026`), as the TOTVS pages write it.
pub(super) fn moment(language: Language, wall_ms: u64) -> String {
    match language {
        Language::English => format!("{} {}", local_date_iso(wall_ms), time_of_day(wall_ms)),
        Language::Portuguese => format!("{} {}", time_of_day(wall_ms), local_date(wall_ms)),
    }
}

/// `path`, a link to another page of the query interface, with the language the reader asked
/// for (`?lang=`) when they did: the next page is in it too. Without an ask the link is the
/// path alone, as the public monitors know the pages.
pub(super) fn page_link(snap: &Snapshot, path: &str) -> String {
    if !snap.language_asked {
        return path.to_string();
    }
    let joint = if path.contains('?') { '&' } else { '?' };
    format!("{path}{joint}lang={}", snap.language.as_str())
}

/// The singular of `words` for one, else the plural.
pub(super) fn plural(n: usize, (one, many): (&'static str, &'static str)) -> &'static str {
    if n == 1 { one } else { many }
}

pub(super) fn reason(l: &Labels, reason: Reason) -> &'static str {
    match reason {
        Reason::Monitor => l.by_monitor,
        Reason::Connect => l.by_connect,
        Reason::Timeout => l.by_timeout,
        Reason::Operator => l.by_operator,
    }
}
