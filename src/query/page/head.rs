//! What every page opens with: the `<head>` with its stylesheet (`page.css` and the server
//! table's column rules), then the header: the TOTVS marker, the balancer, the version and the
//! links to the other pages and balancers.

use std::fmt::Write;

use super::table::{HTTP_LAYOUT, TCP_LAYOUT};
use super::words::{esc, page_link};
use crate::config::BalancerKind;
use crate::query::labels::Labels;
use crate::query::snapshot::Snapshot;

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

/// The stylesheet but the server table's columns ([`stylesheet`] adds them): `page.css`, after
/// a newline as it has always begun (the pages stay the same to the byte). At 700 px wide and
/// below (a phone; a tablet in portrait keeps the desktop layout) the table shows the server,
/// its figures that matter and its state, and the narrow chart takes the wide one's place.
const STYLE: &str = concat!("\n", include_str!("page.css"));

/// The pages' own icon, inline (a line fanning out to three: a balancer): a page that
/// declares none makes the browser ask the port for `/favicon.ico`, which the broker does not
/// answer itself (on an HTTP balancer it is the application's), so it went to a server and
/// counted in its Total. An SVG as a `data:` URL asks nothing of anyone.
const ICON: &str = concat!(
    "data:image/svg+xml,%3Csvg xmlns=%22http://www.w3.org/2000/svg%22 viewBox=%220 0 16 16%22%3E",
    "%3Crect width=%2216%22 height=%2216%22 rx=%223%22 fill=%22%2316202b%22/%3E",
    "%3Cpath d=%22M2.5 8H7M7 8l6.5-4.5M7 8h6.5M7 8l6.5 4.5%22 stroke=%22%23cfe0ff%22 ",
    "stroke-width=%221.7%22 stroke-linecap=%22round%22 fill=%22none%22/%3E%3C/svg%3E"
);

/// The page's opening: its `<head>` (language, title, icon, the stylesheet, a reload every
/// `refresh` seconds when asked) and the `<body>` tag.
pub(super) fn head(out: &mut String, l: &Labels, title: &str, refresh: Option<u32>) {
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang='{}'><head><meta charset='utf-8'>\
         <meta name='viewport' content='width=device-width, initial-scale=1'>\
         <meta http-equiv='cache-control' content='no-cache'><link rel='icon' href='{ICON}'>",
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
pub(super) fn banner(out: &mut String, l: &Labels, snap: &Snapshot, host: &str) {
    // `Versão: ...<br>`: peder1981/monitor reads the version from `Vers` to the next `<br>`.
    let _ = write!(
        out,
        "<header><div><h1 lang='pt-BR'>{}</h1><div class='meta'>[{}] {} {} · {}: appbroker {}<br></div></div>\
         <nav><a href='{}'>STATUS</a><a href='{}'>CFG</a>\
         <a href='/TOTVS_BROKER_QUERY/JSON'>JSON</a><a href='/TOTVS_BROKER_QUERY/METRICS'>METRICS</a>\
         <a href='/TOTVS_BROKER_QUERY/PING'>PING</a>",
        marker(snap.state.kind),
        snap.state.kind.section(),
        l.on,
        snap.state.listen,
        l.version,
        env!("CARGO_PKG_VERSION"),
        page_link(snap, "/TOTVS_BROKER_QUERY/STATUS"),
        page_link(snap, "/TOTVS_BROKER_QUERY/CFG"),
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
            "<a href='http://{}:{}{}' title='{}'>[{}]</a>",
            esc(&target),
            listen.port(),
            page_link(snap, "/TOTVS_BROKER_QUERY/STATUS"),
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
