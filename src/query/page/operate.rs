//! ADMIN's pages, for a signed-in user: the page of actions (the summary, then a card per
//! server with its state and a row of actions, each a link to its confirmation), and the
//! confirmation of one action (what will happen, and the button that posts it with the
//! anti-forgery token). No JavaScript: a confirmation is a page of its own. The cards wrap to
//! one column on a phone (390 pixels), and their buttons to as many lines as they need.

use std::fmt::Write;

use super::head::{banner, head};
use super::status::summary;
use super::words::{esc, moment};
use crate::balancer::rules::overrides::Mode;
use crate::balancer::{RestartRefusal, ServerState};
use crate::config::{Language, show_duration};
use crate::query::labels::{OperateLabels, of};
use crate::query::snapshot::{Snapshot, Standing};

/// The path of the page of actions, as its links, forms and redirects write it.
pub const PATH: &str = "/TOTVS_BROKER_QUERY/ADMIN";

/// What the page of actions shows besides the snapshot.
#[derive(Debug)]
pub struct Operating<'a> {
    /// The balancer's state now.
    pub snapshot: &'a Snapshot,
    /// The host name the browser used.
    pub host: &'a str,
    /// The signed-in user.
    pub user: &'a str,
    /// The action just done and its server (the redirect after a POST says it).
    pub done: Option<(&'static str, String)>,
    /// Offered over plain HTTP to the network (`ADMIN_PLAIN_HTTP`): warned of.
    pub plain: bool,
    /// `RESTART_COMMAND` is set: restart is offered.
    pub restarts: bool,
}

/// The stylesheet of the actions, after the pages' own.
const STYLE: &str = "<style>\
.ops{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:10px;margin-bottom:18px}\
.op{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px;min-width:0}\
.op h3{margin:0 0 4px;font-size:15px;overflow-wrap:anywhere}\
.op p{margin:0 0 8px;color:var(--muted)}\
.acts{display:flex;flex-wrap:wrap;gap:6px}\
.acts a,button{display:inline-block;padding:6px 12px;border:1px solid var(--line);border-radius:6px;\
background:#eef2f6;color:var(--ink);text-decoration:none;font:inherit;font-weight:600;cursor:pointer}\
.acts a.danger,button.danger{background:var(--badbg);color:var(--bad);border-color:#f3b8b3}\
.signed{margin:0 0 12px;color:var(--muted)}\
.done{background:var(--goodbg);color:var(--good);border:1px solid #b6dfc2;padding:8px 12px;border-radius:6px;margin-bottom:14px;font-weight:600}\
form label{display:block;margin:8px 0}\
form input[type=number]{font:inherit;padding:6px;width:8em}\
</style>";

/// The page of actions.
pub fn operate(o: &Operating<'_>) -> String {
    let snap = o.snapshot;
    let l = of(snap.language);
    let w = l.operate;
    let mut out = String::with_capacity(16 * 1024 + snap.state.servers.len() * 800);
    let title = format!("appbroker ADMIN [{}]", snap.state.kind.section());
    head(&mut out, l, &title, Some(30));
    out.push_str(STYLE);
    banner(&mut out, l, snap, o.host);
    if o.plain {
        let _ = write!(out, "<div class='banner'>{}</div>", esc(w.plain));
    }
    if let Some((action, server)) = &o.done {
        let _ = write!(
            out,
            "<div class='done'>{} {}: {}</div>",
            w.action(action),
            esc(server),
            w.done
        );
    }
    let _ = write!(
        out,
        "<p class='signed'>{} <b>{}</b>. {}</p>",
        w.signed_in,
        esc(o.user),
        esc(w.this_broker)
    );
    summary(&mut out, l, snap);
    out.push_str("<section class='ops'>");
    for server in &snap.state.servers {
        card(&mut out, w, server, o.restarts);
    }
    out.push_str("</section></main></body></html>");
    out
}

/// A server's card: what it is, how it stands, and its actions.
fn card(out: &mut String, w: &OperateLabels, s: &ServerState, restarts: bool) {
    let held = s.overrides.hold.as_ref().map(|h| h.mode);
    // A draining server's connections are its progress, said once.
    let open = w.count(s.active);
    let state = match (s.state, held) {
        (Standing::Disabled, Some(Mode::Drain)) | (Standing::Draining, _) => {
            w.draining.replace("{open}", &open)
        }
        (Standing::Disabled, _) => format!("{} · {open}", w.disabled),
        (Standing::Quarantined, _) => format!("{} · {open}", w.quarantined),
        (Standing::Available, _) => format!("{} · {open}", w.available),
    };
    let weight = if s.weight == s.file_weight {
        format!("{} {}", w.weight, s.weight)
    } else {
        format!("{} {} ({} {})", w.weight, s.weight, w.file, s.file_weight)
    };
    let _ = write!(
        out,
        "<div class='op'><h3>{} · {}</h3><p>{} · {}</p><div class='acts'>",
        esc(&s.id),
        esc(&s.address),
        esc(&state),
        weight
    );
    let offered = [
        ("disable", held != Some(Mode::Disabled)),
        ("drain", held != Some(Mode::Drain)),
        ("enable", held.is_some()),
        ("weight", true),
        ("release", s.quarantine.is_some()),
        ("restart", restarts),
        ("cut", s.active > 0),
    ];
    for (action, shown) in offered {
        if shown {
            let _ = write!(
                out,
                "<a{} href='{PATH}?action={action}&amp;server={}'>{}</a>",
                danger(action),
                esc(&s.id),
                w.action(action)
            );
        }
    }
    out.push_str("</div></div>");
}

/// The class of an action that cannot be undone (a restart, a cut).
fn danger(action: &str) -> &'static str {
    if matches!(action, "cut" | "restart") {
        " class='danger'"
    } else {
        ""
    }
}

/// What `action` will do to `s`, in words.
fn consequence(w: &OperateLabels, action: &str, s: &ServerState) -> String {
    w.consequence(action)
        .replace("{open}", &w.count(s.active))
        .replace("{weight}", &s.weight.to_string())
        .replace("{file}", &s.file_weight.to_string())
}

/// The confirmation of `action` on `server`: what will happen, and the button.
pub fn confirm(snap: &Snapshot, s: &ServerState, action: &str, token: &str, host: &str) -> String {
    let l = of(snap.language);
    let w = l.operate;
    let mut out = String::with_capacity(12 * 1024);
    let title = format!("appbroker ADMIN: {action} {}", s.address);
    head(&mut out, l, &title, None);
    out.push_str(STYLE);
    banner(&mut out, l, snap, host);
    let _ = write!(
        out,
        "<div class='card'><h2>{} {} · {} [{}]?</h2><p>{}</p><p class='muted'>{}</p>\
         <form method='post' action='{PATH}'>\
         <input type='hidden' name='action' value='{action}'>\
         <input type='hidden' name='server' value='{}'>\
         <input type='hidden' name='token' value='{}'>",
        w.action(action),
        esc(&s.id),
        esc(&s.address),
        snap.state.kind.section(),
        esc(&consequence(w, action, s)),
        w.this_broker_short,
        esc(&s.id),
        esc(token)
    );
    if action == "weight" {
        let _ = write!(
            out,
            "<label>{} <input type='number' name='weight' min='0' max='1000' value='{}'></label>",
            w.weight_field, s.weight
        );
    }
    let _ = write!(
        out,
        "<div class='acts'><button type='submit'{}>{}</button><a href='{PATH}'>{}</a>\
         </div></form></div></main></body></html>",
        danger(action),
        w.action(action),
        w.cancel
    );
    out
}

/// Why the page's restart of a server did not run, in `language`: the cooldown says from when
/// the page can restart it again (ctl's `--force` is no option here).
pub fn restart_refused(language: Language, refusal: &RestartRefusal) -> String {
    let l = of(language);
    let w = l.operate;
    match refusal {
        RestartRefusal::CoolingDown { cooldown, .. } => {
            let at = refusal.cooling_until_wall_ms().unwrap_or_default();
            w.cooling
                .replace("{cooldown}", &show_duration(*cooldown))
                .replace("{at}", &moment(language, at))
        }
        RestartRefusal::Running => w.restarting.to_string(),
        RestartRefusal::NoCommand => w.no_command.to_string(),
        RestartRefusal::Busy(n) => w.busy.replace("{n}", &n.to_string()),
        RestartRefusal::AddressAbsent(why) => l.words(why).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::page::fixtures;

    fn page(language: Language, held: bool) -> (String, String) {
        let mut server = fixtures::server(1234, 1_800_000_000_000, &[], 3);
        if held {
            server.state = Standing::Disabled;
            server.overrides.hold = Some(crate::balancer::rules::overrides::Hold {
                mode: Mode::Drain,
                reason: String::new(),
                by: "web:ana@10.0.0.5".into(),
                since_wall_ms: 0,
            });
        }
        let mut snap = fixtures::snapshot(1_800_000_000_000, vec![server]);
        snap.language = language;
        let operating = Operating {
            snapshot: &snap,
            host: "broker",
            user: "ana<script>",
            done: Some(("disable", "01".into())),
            plain: true,
            restarts: true,
        };
        let confirmation = confirm(&snap, &snap.state.servers[0], "cut", "1.ab", "broker");
        (operate(&operating), confirmation)
    }

    #[test]
    fn the_page_offers_what_each_server_allows_in_the_pages_language() {
        let (en, confirm_en) = page(Language::English, true);
        assert!(en.contains("Signed in as <b>ana&lt;script&gt;</b>"), "{en}");
        assert!(en.contains("draining: 3 connections left"), "{en}");
        assert!(
            en.contains("action=enable") && !en.contains("action=drain&"),
            "{en}"
        );
        assert!(en.contains("ADMIN_PLAIN_HTTP") && en.contains("disable 01: done"));
        assert!(confirm_en.contains("<input type='hidden' name='token' value='1.ab'>"));
        assert!(confirm_en.contains("Its 3 connections are closed now"));
        let (pt, confirm_pt) = page(Language::Portuguese, false);
        assert!(
            pt.contains("Conectado como") && pt.contains("desabilitar 01: feito"),
            "{pt}"
        );
        assert!(
            pt.contains("action=disable") && !pt.contains("action=enable"),
            "{pt}"
        );
        for english in [
            "Signed in",
            "connections",
            "available",
            ">cancel<",
            ">disable<",
        ] {
            assert!(
                !pt.contains(english) && !confirm_pt.contains(english),
                "{english}"
            );
        }
        assert!(confirm_pt.contains("As suas 3 conexões são fechadas agora"));
    }

    #[test]
    fn a_restart_in_cooldown_says_from_when_the_page_can_restart_it_in_its_language() {
        let refusal = RestartRefusal::CoolingDown {
            until: tokio::time::Instant::now() + std::time::Duration::from_secs(300),
            cooldown: std::time::Duration::from_secs(600),
        };
        // The moment the words name, read before and after them (a second may turn between).
        let said = |language| {
            let at = || moment(language, refusal.cooling_until_wall_ms().unwrap());
            let before = at();
            let words = restart_refused(language, &refusal);
            assert!(words.contains(&before) || words.contains(&at()), "{words}");
            words
        };
        let (en, pt) = (said(Language::English), said(Language::Portuguese));
        assert!(
            en.contains("RESTART_COOLDOWN (600s)")
                && en.contains("this page can restart it again from 20"),
            "{en}"
        );
        assert!(
            pt.contains("RESTART_COOLDOWN (600s)")
                && pt.contains("reiniciá-lo de novo a partir de "),
            "{pt}"
        );
        for words in [&en, &pt] {
            assert!(!words.contains("--force"), "the page cannot force: {words}");
        }
        // ctl's own words keep their way to force it.
        assert!(refusal.words().ends_with("(add --force to run it now)"));
        assert_eq!(
            restart_refused(Language::Portuguese, &RestartRefusal::Running),
            "ele está sendo reiniciado agora"
        );
    }
}
