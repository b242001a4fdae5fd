//! One server's page (ServerStatus): its state and figures, on an HTTP balancer its sessions,
//! and its recent quarantines.

use std::fmt::Write;
use std::time::Duration;

use super::head::{banner, head};
use super::status::fact;
use super::table::{check_cell, state_cell};
use super::words::{bytes, esc, moment, page_link, reason, span};
use crate::query::labels::{Labels, of};
use crate::query::snapshot::{ServerSessions, ServerState, Snapshot};
use crate::support::clock::time_of_day as clock;

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
    figures(&mut out, l, snap, s);
    if let Some(http) = &snap.http {
        session_ages(&mut out, l, &http.sessions_of(&s.address));
    }
    history(&mut out, l, snap, s);
    let _ = write!(
        out,
        "</div><p><a href='{}'>{}</a></p></main></body></html>",
        page_link(snap, "/TOTVS_BROKER_QUERY/STATUS"),
        l.back
    );
    out
}

/// The server's card: its state, its quarantine's times, its figures and its last check.
fn figures(out: &mut String, l: &Labels, snap: &Snapshot, s: &ServerState) {
    let _ = write!(
        out,
        "<div class='card'><h2>{} {} (REMOTE_SERVER_{})</h2>",
        l.server,
        esc(&s.address),
        esc(&s.id)
    );
    out.push_str("<section class='facts'>");
    fact(out, l.state, &state_cell(l, s), "");
    if let Some((since, until)) = s.quarantine {
        fact(
            out,
            l.quarantine,
            &format!("{} – {}", clock(since), clock(until)),
            "",
        );
    }
    fact(out, l.connections, &s.active.to_string(), "big");
    fact(out, l.total_short, &s.total.to_string(), "big");
    fact(out, l.weight, &s.weight.to_string(), "");
    fact(out, l.failed_connects, &s.failed_connects.to_string(), "");
    fact(out, l.bytes_in, &bytes(s.bytes_to_server), "");
    fact(out, l.bytes_out, &bytes(s.bytes_to_client), "");
    fact(
        out,
        l.last_check,
        &check_cell(l, s, &snap.state.monitoring),
        "",
    );
    out.push_str("</section></div>");
}

/// The server's recent quarantines, latest first, in a card the page closes.
fn history(out: &mut String, l: &Labels, snap: &Snapshot, s: &ServerState) {
    let _ = write!(
        out,
        "<div class='card'><h2>{} ({})</h2>",
        l.history, s.quarantines
    );
    if s.history.is_empty() {
        let _ = write!(out, "<p class='muted'>{}</p>", l.none);
        return;
    }
    let _ = write!(
        out,
        "<table><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
        l.start, l.end, l.duration, l.reason, l.error, l.released
    );
    for e in s.history.iter().rev() {
        let end = e.end_wall_ms.unwrap_or(snap.now_wall_ms);
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class='num'>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            moment(snap.language, e.start_wall_ms),
            e.end_wall_ms.map_or_else(|| l.ongoing.to_string(), clock),
            span(Duration::from_millis(end.saturating_sub(e.start_wall_ms))),
            reason(l, e.reason),
            esc(&l.words(&e.error)),
            esc(&l.words(e.released.map_or("-", |r| r.as_str())))
        );
    }
    out.push_str("</table>");
}
