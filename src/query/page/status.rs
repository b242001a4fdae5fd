//! The STATUS page: the summary line, the server table, the chart and the facts.

use std::fmt::Write;

use super::chart::chart;
use super::head::{banner, head};
use super::table::server_table;
use super::words::{esc, moment, page_link, plural};
use crate::balancer::rules::overrides::Mode;
use crate::config::{Monitoring, show_duration};
use crate::http::Protocol;
use crate::query::labels::{Labels, of};
use crate::query::snapshot::{Snapshot, Standing};

/// A box of the facts' grid, a label over its value (HTML); `class` `big` for a figure that
/// matters most. The server's page has them too.
pub(super) fn fact(out: &mut String, label: &str, value: &str, class: &str) {
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
        let link = page_link(
            snap,
            &format!("/TOTVS_BROKER_QUERY/STATUS?refresh={seconds}"),
        );
        let _ = write!(out, "<a href='{link}'>{seconds}s</a> ");
    }
    let _ = write!(
        out,
        "<a href='{}'>{}</a></footer></main></body></html>",
        page_link(snap, "/TOTVS_BROKER_QUERY/STATUS"),
        l.off
    );
    out
}

/// One line of what matters most: active connections, servers available, and every server
/// that is not: in quarantine, disabled or draining (an operator's changes included, so the
/// counts add up to the servers). `<b>7 conexões ativas</b>` is one text run: peder1981/monitor
/// takes the number from the text before ` ativas` when it mentions `conex`.
pub(super) fn summary(out: &mut String, l: &Labels, snap: &Snapshot) {
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

/// The facts below the chart: the balancer's clients, its rules, an HTTP balancer's requests,
/// who runs it and who asks, and its certificate when it speaks TLS.
fn facts(out: &mut String, l: &Labels, snap: &Snapshot) {
    out.push_str("<section class='facts'>");
    client_facts(out, l, snap);
    rule_facts(out, l, snap);
    if let Some(http) = &snap.http {
        let r = &http.requests;
        fact(out, l.requests, &r.requests.to_string(), "");
        fact(out, l.answers_5xx, &r.classes[4].to_string(), "");
        fact(out, l.upgrades, &r.upgrades.to_string(), "");
        let http2 = format!(
            "{} <small>({} {})</small>",
            r.connections_open[Protocol::H2.index()],
            r.h2_streams_open,
            l.streams
        );
        fact(out, l.http2_now, &http2, "");
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
    certificate_facts(out, l, snap);
    out.push_str("</section>");
}

/// The clients since start, the last one's time, the most at once, and the broker's clock.
fn client_facts(out: &mut String, l: &Labels, snap: &Snapshot) {
    fact(out, l.total, &snap.state.accepted.to_string(), "big");
    let last = if snap.state.last_connection_wall_ms == 0 {
        l.never.to_string()
    } else {
        moment(snap.language, snap.state.last_connection_wall_ms)
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
        &moment(snap.language, snap.started_wall_ms),
        "",
    );
    fact(out, l.now, &moment(snap.language, snap.now_wall_ms), "");
}

/// How the balancer chooses, checks and quarantines its servers.
fn rule_facts(out: &mut String, l: &Labels, snap: &Snapshot) {
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
}

/// The certificate served to clients, on a balancer that speaks TLS: its subject, issuer and
/// expiry (marked once past).
fn certificate_facts(out: &mut String, l: &Labels, snap: &Snapshot) {
    let Some(certificate) = &snap.state.certificate else {
        return;
    };
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
        &moment(snap.language, until),
        class,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::fixtures::{NOW, server, snapshot};
    use super::*;
    use crate::balancer::rules::health::Reason;
    use crate::config::{BalancerKind, Language};
    use crate::query::snapshot::{ServerSessions, ServerState};
    use crate::support::clock::time_of_day as clock;

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
        let hold = |mode| crate::balancer::rules::overrides::Hold {
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
        servers[1].last_check = Some(crate::balancer::rules::health::CheckResult {
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
        servers[5].asked = Some(crate::balancer::rules::health::OperatorAsk {
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
            super::super::server(&snap, &snap.state.servers[1], "localhost"),
            super::super::server(&snap, &snap.state.servers[5], "localhost"),
            super::super::server(&http_snap, &http_snap.state.servers[0], "localhost"),
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
            assert!(active_counts(&super::super::server(&snap, s, "localhost")).is_empty());
        }
    }
}
